// SPDX-License-Identifier: Apache-2.0
// The store kinds open_store() chooses among (store/store.hpp), each in its own file.
#pragma once

#include "ckpt/core/export.hpp"

#include <memory>
#include <string>

#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/store/store.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

/// store/local/directory.cpp: ROOT/latest, ROOT/step-N (store/local/commit.hpp).
std::unique_ptr<CheckpointStore> make_directory_store(std::string root, FileSystem& fs);
/// store/nodes/node_set.cpp: DIR/node-0 .. node-(nodes-1) (store/nodes/node_commit.hpp); `layout` for writing.
std::unique_ptr<CheckpointStore> make_node_set_store(std::string dir, FileSystem& fs, int nodes, std::optional<NodeLayout> layout);
/// store/object/object.cpp: s3://bucket/prefix (store/object/object_commit.hpp); `owned` is the client when
/// the store made it (else null, and `client` is the caller's); `run` its writer's identity.
std::unique_ptr<CheckpointStore> make_object_store(std::string root, ObjectStore& client, std::unique_ptr<ObjectStore> owned, std::string run,
                                                   const ObjectLeaseOptions& lease = {});

/// store/memory/memory.cpp: mem://NAME, a directory or node set (options.nodes) in shared memory.
std::unique_ptr<CheckpointStore> make_memory_store(std::string root, const StoreOptions& options);

/// One commit attempt on an object store without a writer lease (commit_to_object_store's:
/// the options' run, holder and fence stand for it): what it uploaded and whether it moved
/// `latest`.
class ObjectCommitTarget : public StepTarget {
 public:
  virtual const std::string& run_id() const noexcept = 0;
  virtual const std::string& data_prefix() const noexcept = 0;
  virtual bool latest_moved() const noexcept = 0;
};
std::unique_ptr<ObjectCommitTarget> make_object_target(ObjectStore& client, std::uint64_t step, ObjectCommitOptions options);
/// The client of an object store made by make_object_store; null for a store of another kind.
ObjectStore* object_client(CheckpointStore& store) noexcept;

/// The steps of checkpoint directory names ("step-0000000010"), in the same order; names
/// that are not checkpoint directories are skipped.
std::vector<std::uint64_t> steps_of(const std::vector<std::string>& names);

/// `keep` over checkpoint directory names, as store/local/commit.hpp's rotation takes it.
std::function<bool(const std::string&)> keep_by_name(const KeepStep& keep);

/// A file store's StepTarget::write_shard: DIR/NAME created (buffered), written from `source`
/// in pieces of up to 16 MiB, each passed to `check` first, fsynced and closed; a failure
/// removes the file and rethrows.
void write_file_copy(FileSystem& fs, const std::string& dir, const std::string& name, const ReadableFile& source, const PieceCheck& check,
                     PieceSize pieces);

/// Errc::invalid_argument: `what` ("commit", "rotation", ...) asked of a participant writer.
[[noreturn]] void refuse_participant(const std::string& root, const char* what);

/// The StoredCheckpoint of a committed step with manifest `m` (name, step, world size, the
/// shards' bytes; complete), for describe().
StoredCheckpoint described(std::uint64_t step, std::shared_ptr<const Manifest> m, bool is_latest);

/// Errc::not_found naming `where`: step `step` is not committed there.
[[noreturn]] void throw_not_committed(const std::string& where, std::uint64_t step);

}  // namespace ckpt::detail
CKPT_API_END
