// SPDX-License-Identifier: Apache-2.0
// The commit of a checkpoint on an object store, which has no rename and no directory fsync:
// what it offers instead is objects that appear whole, a create that fails if the key exists
// (If-None-Match: *) and a replace that fails unless the object is the one read before
// (If-Match). From those, in this order (docs/commit-protocol.md, "On an object store"):
//
//   ROOT/step-0000000010/<run>/rank-*.safetensors   1. the shards, each streamed from the local
//                                                      committed checkpoint (each chunk's XXH3
//                                                      checked on the way), under a prefix no
//                                                      other writer and no other attempt uses
//   ROOT/step-0000000010/<run>/manifest.json         2. the local manifest, byte for byte
//   ROOT/step-0000000010/manifest.json               3. the tier's manifest, last, created with
//                                                      If-None-Match: *: the checkpoint exists
//                                                      exactly when this object does; it names
//                                                      the run whose data it commits and the
//                                                      SHA-256 of that run's manifest.json
//   ROOT/latest                                      4. "step-0000000010\nrun R\nholder H\n",
//                                                      moved forward only, by compare-and-swap
//                                                      (If-Match on the ETag read before;
//                                                      If-None-Match when there is none yet)
//
// A crash (or failure) before 3 leaves data no tier manifest names: invisible to readers, a
// leftover that collect_object_leftovers() removes once it is older than a grace period. A second writer racing for the same step loses at 3 with
// Errc::conflict and its data stays uncommitted. A crash between 3 and 4 leaves a complete
// checkpoint that `latest` does not name yet; the next commit of a later step moves `latest`
// past it. `latest` never names a step whose tier manifest does not exist, and never goes
// backwards.
//
// The tier manifest and `latest` record the run that committed (its run identity,
// store/run_identity.hpp) and `latest` also the writer that moved it (its lease holder id,
// store/object/object_lease.hpp): a writer whose lease was taken over finds another holder's `latest`
// when its swap meets a 412, and stops (Errc::busy). Stores written before run identities
// have neither, and read as before.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/objstore/object_store.hpp"
#include "ckpt/read/reader.hpp"

CKPT_API_BEGIN
namespace ckpt {

inline constexpr std::string_view kObjectManifestName = "manifest.json";

struct ObjectCommitOptions {
  /// The writer's identity in the data prefix: 1..64 of [A-Za-z0-9_-]. Empty: a random one
  /// (16 hex digits), so that no two attempts share a prefix.
  std::string run_id;
  /// How the shards go up. part_size is rounded up to a multiple of the manifest's chunk size,
  /// so each part's chunks are checked whole.
  UploadOptions upload;
  /// Check each chunk's XXH3 against the local manifest while reading it (true), or not.
  bool verify_chunks = true;
  /// Move `latest` after the tier manifest is created.
  bool move_latest = true;
  /// The run identity recorded in the tier manifest and `latest` (store/run_identity.hpp). Empty:
  /// none (as a store written before run identities).
  std::string run;
  /// The writer recorded in `latest` (the holder id of its writer lease). Empty: none, and
  /// move_object_latest then does not check who moved `latest` before it.
  std::string holder;
  /// Called before any byte is uploaded, before the tier manifest is created and before
  /// `latest` is moved; what it throws stops the commit there (the writer lease's check: a
  /// writer whose lease lapsed or was taken over commits nothing). Empty: nothing.
  std::function<void()> fence;
};

struct ObjectCommitReport {
  std::uint64_t step = 0;
  std::string run_id;
  std::string data_prefix;          ///< "step-0000000010/<run>/"
  std::uint64_t bytes = 0;          ///< shard bytes uploaded
  std::uint64_t chunks_verified = 0;
  bool latest_moved = false;        ///< false: `latest` already named this step or a later one
};

/// The tier manifest (step-N/manifest.json on the store).
struct ObjectManifest {
  std::uint64_t step = 0;
  std::string run_id;            ///< the commit attempt's writer id: its data prefix is step-N/<run_id>/
  std::string run;               ///< the run identity that committed it ("" if the store predates them)
  std::string data_prefix;       ///< relative to the store's root
  std::string manifest_sha256;   ///< of data_prefix + "manifest.json"
  std::uint64_t manifest_size = 0;
  std::uint64_t bytes = 0;       ///< shard bytes
  std::string committed_at;      ///< UTC, RFC 3339
};

/// Uploads the committed local checkpoint `local_root`/step-`step` to `store` and commits it
/// there as the file comment describes. Blocks until done. Throws the local checkpoint's
/// errors (not_found, checksum_mismatch naming the local file and chunk, ...),
/// Errc::invalid_argument for bad options or a checkpoint across node roots (not supported
/// yet), the store's errors, and Errc::conflict (naming the tier manifest's key) if another
/// writer committed this step first. On any failure before step 3 nothing is committed: the
/// data uploaded stays as an uncommitted leftover (each failed multipart upload is aborted).
/// `latest` is never moved backwards. Thread-safe for different steps.
ObjectCommitReport commit_to_object_store(FileSystem& local_fs, const std::string& local_root, std::uint64_t step,
                                          ObjectStore& store, const ObjectCommitOptions& options = {});

/// Steps 2-4 of the commit, for shards already uploaded under step-N/`run_id`/ (shard_bytes of
/// them): the checkpoint's `manifest` bytes there, the tier manifest (If-None-Match: the
/// commit; Errc::conflict when another writer committed the step first), then `latest` moved
/// forward when options.move_latest (returns whether it moved). options.fence runs before each
/// write; options.run and holder are recorded; the rest of options is unused.
bool commit_object_step(ObjectStore& store, std::uint64_t step, const std::string& run_id, std::span<const std::byte> manifest,
                        std::uint64_t shard_bytes, const ObjectCommitOptions& options);

/// The step `latest` names, its ETag, and who moved it there, or nullopt if there is no
/// `latest`. Errc::malformed_manifest naming it if its content is not "step-N\n" followed by
/// optional "run R\n" and "holder H\n" lines (unknown "key value" lines are ignored).
/// Errc::invalid_argument naming the bucket if the root's bucket does not exist.
struct ObjectLatest {
  std::uint64_t step = 0;
  std::string etag;
  std::string run;     ///< the run identity that moved it ("" if not recorded)
  std::string holder;  ///< the writer (lease holder id) that moved it ("" if not recorded)
};
std::optional<ObjectLatest> read_object_latest(ObjectStore& store);

/// Moves `latest` to `step` by compare-and-swap, recording `run` and `holder` (each may be
/// empty), unless it names `step` or a later step already (then returns false, having written
/// nothing). A concurrent mover makes the swap fail with Errc::conflict; this re-reads and
/// tries again (at most 16 times, then throws that conflict), unless the `latest` it re-reads
/// was moved by another holder than `holder` (both non-empty): then another writer is
/// committing to this prefix (this writer's lease was taken over) and it throws Errc::busy
/// naming both. Errc::not_found if step-`step`/manifest.json does not exist: `latest` never
/// names an uncommitted step.
bool move_object_latest(ObjectStore& store, std::uint64_t step, const std::string& run = {}, const std::string& holder = {});

/// Reads and checks step-`step`/manifest.json. Errc::not_found if the step is not committed;
/// Errc::malformed_manifest naming the key for content that is not a tier manifest of that
/// step (or whose data prefix is not step-N/<run>/).
ObjectManifest read_object_manifest(ObjectStore& store, std::uint64_t step);

/// The committed steps (those with a tier manifest), ascending, read through listings of at
/// most 1000 keys per page.
std::vector<std::uint64_t> list_object_checkpoints(ObjectStore& store);

/// Removes the committed step-`step`: its tier manifest first (from then on the step does not
/// exist for any reader), then every object under step-N/. Errc::invalid_argument if `latest`
/// names the step; Errc::not_found if it is not committed. A crash midway leaves objects no
/// tier manifest commits: leftovers.
void remove_object_checkpoint(ObjectStore& store, std::uint64_t step);

/// Keeps the newest `keep_last` (>= 1) committed steps, and always the one `latest` names;
/// removes the others, oldest first, with remove_object_checkpoint. Returns the steps removed.
std::vector<std::uint64_t> rotate_object_checkpoints(ObjectStore& store, int keep_last);

struct LeftoverReport {
  std::vector<std::string> removed;    ///< keys of uncommitted objects removed
  std::vector<std::string> aborted;    ///< keys of multipart uploads aborted
  std::uint64_t kept_young = 0;        ///< leftovers younger than the grace period (or undated), kept
};

/// Collects what failed or killed commits left: every object under step-N/<run>/ that no tier
/// manifest commits (there is none for step N, or it names another run), and every multipart
/// upload under step-*/, but only those the server dates more than `grace` before `now`. The
/// grace period must exceed the longest commit (plus the clock skew between this host and the
/// server): a commit still uploading when its data is collected would create a tier manifest
/// naming missing objects. Hours, not seconds, outside tests. Returns what was done.
LeftoverReport collect_object_leftovers(ObjectStore& store, std::chrono::seconds grace,
                                        std::chrono::system_clock::time_point now = std::chrono::system_clock::now());

/// A committed step's manifests, read and checked: the tier manifest, and the checkpoint's
/// manifest whose SHA-256 it records, decoded with the loader's checks.
struct ObjectCheckpoint {
  ObjectManifest tier;
  Manifest manifest;
  std::string manifest_bytes;  ///< the checkpoint manifest object as stored (its SHA-256 is tier.manifest_sha256)
};
/// Reads step-`step`'s tier manifest and the checkpoint manifest it names, checks that one's
/// size and SHA-256 against the tier manifest (Errc::size_mismatch, Errc::checksum_mismatch
/// naming the object), decodes it (its errors) and checks its step. Errc::not_found if the step
/// is not committed.
ObjectCheckpoint open_object_checkpoint(ObjectStore& store, std::uint64_t step);

/// Reads every shard of the committed step-`step` in ranged GETs of `read_size` bytes (rounded
/// to whole chunks; shards `parallel_shards` at once) and checks it as CheckpointReader::verify
/// checks a local one: sizes and each shard's header against the manifest index
/// (CheckpointReader::check_shard_header's check, Errc::malformed_shard naming the object)
/// always; each chunk's XXH3 with Verify::fast; also each whole file's XXH3 and SHA-256 with
/// Verify::full. Nothing is written. `progress` (may be empty) is called with (bytes done,
/// bytes total), from the reading threads, serialised. Throws what open_object_checkpoint
/// throws, Errc::checksum_mismatch naming the object (and chunk), and the store's errors.
/// Returns the checkpoint's manifests.
ObjectCheckpoint verify_object_checkpoint(ObjectStore& store, std::uint64_t step, Verify mode,
                                          const ProgressFn& progress = {}, std::uint64_t read_size = 16ull << 20,
                                          int parallel_shards = 4);

/// One tensor of a committed step, as read_object_tensor() read it.
struct ObjectTensor {
  TensorRecord record;               ///< its index entry: rank, dtype, shape, byte range in the shard
  std::string object;                ///< the shard object, as errors name it (store.name_of)
  std::uint64_t shard_size = 0;      ///< the shard's size (the manifest's)
  std::vector<std::byte> data;       ///< the tensor's bytes
  std::uint64_t chunks_checked = 0;  ///< chunk XXH3s computed
  std::uint64_t bytes_checked = 0;   ///< bytes hashed: the tensor's chunks, plus the whole shard with Verify::full
};

/// Reads tensor `name` of `rank` from the committed checkpoint `ck` (open_object_checkpoint's)
/// in ranged GETs of only the checksum chunks that cover it, at most `read_size` bytes each
/// (rounded up to whole chunks). Verify::fast: each chunk's XXH3 is checked before any of its
/// bytes is used; Verify::full: first the whole shard as verify_object_checkpoint checks it
/// (every chunk, then the object's XXH3 and SHA-256), then the tensor's chunks as with fast;
/// Verify::none: only the tensor's bytes are read, unchecked. At every level the shard's header
/// is read first (ranged GETs of its few KiB) and checked against the manifest index as
/// CheckpointReader::check_shard_header checks a file's: Errc::malformed_shard naming the
/// object and the first disagreement (with fast or full, a header damaged without its
/// checksums recomputed is the checksum_mismatch of its chunk). Throws Errc::invalid_argument for
/// a rank outside 0..world_size-1 (naming the checkpoint manifest object), Errc::not_found
/// naming the shard object for a tensor the rank does not hold (its expected value lists the
/// rank's tensors, as MappedShard::tensor's does), Errc::size_mismatch if the object's size is
/// not the manifest's, Errc::checksum_mismatch naming the object and the chunk (or "xxh3" /
/// "sha256 of the whole object"), and the store's errors. Blocks; writes nothing.
ObjectTensor read_object_tensor(ObjectStore& store, const ObjectCheckpoint& ck, int rank, std::string_view name, Verify mode,
                                std::uint64_t read_size = 16ull << 20);

struct RestoreOptions {
  /// Bytes per ranged GET, rounded up to a multiple of the manifest's chunk size.
  std::uint64_t read_size = 16ull << 20;
  /// Shards fetched at once (each streams its own shard in order): 1..64.
  int parallel_shards = 4;
  /// none: the whole-file XXH3 only; fast: also each chunk's XXH3 as it arrives, before it is
  /// written; full: also the whole-file SHA-256. Errc::checksum_mismatch names the object.
  Verify verify = Verify::fast;
  BeginOptions begin;
};

struct RestoreReport {
  std::uint64_t step = 0;
  std::string run_id;               ///< whose data the tier manifest committed
  std::uint64_t bytes = 0;
  std::uint64_t chunks_verified = 0;
  std::string dir;                  ///< the restored checkpoint directory (local_root/step-N)
};

/// Rehydrates the local tier: fetches the committed step-`step` from `store` into `local_root`
/// with the local commit protocol (store/local/commit.hpp: under the root's writer lock, into a
/// temporary directory, committed with `latest` moved per options.begin), so the result opens
/// and resumes as a checkpoint written there. The tier manifest is read first, the
/// checkpoint's manifest is checked against the SHA-256 it records and decoded with the
/// loader's checks, every shard is streamed in ranged GETs and checked (options.verify) before
/// a byte is written, and each file's XXH3 (and SHA-256 with Verify::full) is compared with the
/// manifest's before the commit. Throws the store's errors (not_found: no such committed step),
/// Errc::checksum_mismatch naming the object (and chunk), Errc::malformed_manifest, the local
/// file system's errors, Errc::busy (another writer holds the local root). On any failure the
/// temporary is removed and the local root is as it was.
RestoreReport restore_from_object_store(ObjectStore& store, std::uint64_t step, FileSystem& local_fs,
                                        const std::string& local_root, const RestoreOptions& options = {});

}  // namespace ckpt
CKPT_API_END
