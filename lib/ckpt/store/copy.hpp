// SPDX-License-Identifier: Apache-2.0
// The one copy of a checkpoint between stores: every shard of a committed step streamed from
// the source store (CheckpointStore::shard) into a step target of the destination
// (StepTarget::write_shard), each piece checked against the source manifest on the way
// (each chunk's XXH3; with Verify::full also each file's SHA-256, in file order, as the
// pieces arrive: one read of the source, never a second pass), then the destination's own
// commit with the source's manifest bytes (renames and `latest`; an object store's tier
// manifest and `latest`). The durable tier's replication (runtime/tiering.hpp), a resume's
// restore from an object store (store/tiers.hpp), commit_to_object_store and
// restore_from_object_store (store/object/object_commit.hpp) and the demo's scratch copies are
// this copy between different stores.
//
// A checkpoint across node roots arrives in a node set of the same layout as it is (its
// redundancy blocks copied and checked the same way), anywhere else as one of one root: its
// shards, without the node layout and the redundancy blocks (the destination is the
// redundancy there). A copy that fails aborts the destination's step (nothing of it is
// committed; what an object store
// uploaded is a leftover its collection removes) and never writes to the source.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <string>
#include <string_view>

#include "ckpt/read/reader.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/store/store.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// Reads `dir`/tier.json. Errc::not_found if there is none (a checkpoint written directly,
/// not copied), Errc::malformed_manifest naming the field if it does not parse.
CopyRecord read_copy_record(FileSystem& fs, const std::string& dir);

struct CopyOptions {
  /// What is checked while the bytes stream: none, each chunk's XXH3 against the source
  /// manifest (fast), or also each file's SHA-256 (full).
  Verify verify = Verify::fast;
  /// The destination's begin (a step at or before its `latest`: a resumed run, a restore).
  BeginOptions begin{};
  /// Shards copied at once, each by a thread of its own: 1..64, and at most what the
  /// destination takes (StepTarget::shards_at_once).
  int parallel_shards = 1;
  /// Bytes per piece read from the source and written (rounded up to whole chunks), where
  /// the destination writes from pieces (PieceSize).
  std::uint64_t piece_bytes = 16ull << 20;
  /// Where the destination keeps files (StepTarget::file_system), the copy record
  /// (store/tiers.hpp's tier.json) is written into the step, naming this source root.
  bool copy_record = true;
};

struct CopyReport {
  std::uint64_t step = 0;
  std::uint64_t bytes = 0;            ///< shard bytes copied
  std::uint64_t chunks_verified = 0;  ///< chunks whose XXH3 was checked (0 with Verify::none)
  bool sha256_verified = false;       ///< every file's SHA-256 checked (Verify::full)
  std::string committed;              ///< the committed checkpoint as errors name it (StepTarget::commit)
  std::string copied_at;              ///< UTC, RFC 3339, when the data was durable
};

/// Copies the committed `step` of `source` into `destination` (begun by the caller: a
/// StoreWriter::begin's target, or an object store's commit target) and commits it there.
/// Throws the source's errors (not_found, Errc::checksum_mismatch naming the source file and
/// the chunk, size_mismatch), the destination's (io_error, no_space, busy, conflict), or
/// invalid_argument for bad options; on any failure the target is aborted.
CopyReport copy_into(CheckpointStore& source, std::uint64_t step, StepTarget& destination, const CopyOptions& options = {});

/// copy_into a step `destination` begins (options.begin): the copy between two stores.
/// Errc::invalid_argument when the destination holds a committed `step` or, unless
/// options.begin allows it, its `latest` names `step` or a later one.
CopyReport copy_checkpoint(CheckpointStore& source, std::uint64_t step, StoreWriter& destination, const CopyOptions& options = {});

}  // namespace ckpt
CKPT_API_END
