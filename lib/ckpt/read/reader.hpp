// SPDX-License-Identifier: Apache-2.0
// Opening and loading checkpoints, refusing every bad one before a byte of it is used.
//
// CheckpointReader::open reads and validates the manifest (schema_version, world_size,
// safe paths, sane numbers), then checks that every shard it lists exists, is a regular file
// (not a symlink) and has the recorded size. Loading a shard reads it once, in chunks, and
// checks each chunk's XXH3 as it arrives (Verify::fast, the default) or also the SHA-256 of
// the whole file (Verify::full); it then checks the shard's own safetensors header against
// the manifest's tensor index. Nothing is returned half-verified.
//
// Every read of a shard, by any path (load_shard, read_tensor, read_tensor_range,
// stream_shard, verify, load_into, ShardRangeReader, MappedShard, slice loads, reshard), first
// checks the shard's header against the manifest index (check_shard_header,
// format/shard_check.hpp), at every verify level, Verify::none included: what ckpt reads from a
// shard is what any safetensors reader sees in that file, or an Errc::malformed_shard.
#pragma once

#include "ckpt/core/export.hpp"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/format/shard_check.hpp"
#include "ckpt/fs/file_system.hpp"

CKPT_API_BEGIN
namespace ckpt {

enum class Verify {
  none,  ///< sizes and the shard headers only (against the manifest index)
  fast,  ///< XXH3 of every chunk read (default)
  full,  ///< fast, plus SHA-256 and XXH3 of the whole file
};

/// Parses "none" / "fast" / "full".
std::optional<Verify> parse_verify(std::string_view s) noexcept;
/// "none" / "fast" / "full": the inverse of parse_verify.
std::string_view verify_name(Verify mode) noexcept;

/// A tensor of a loaded shard; `data` points into the shard's buffer.
using LoadedTensor = TensorView;

/// One rank's shard, verified and parsed. Owns the bytes its tensors point to.
class LoadedShard {
 public:
  int rank = 0;
  ShardRecord record;                          ///< the manifest's entry of its (first) file, with the rank's metadata
  std::map<std::string, std::string> header_metadata;  ///< safetensors __metadata__
  std::vector<LoadedTensor> tensors;           ///< in file order

  /// The tensor called `name`; Errc::not_found (naming the shard file) if absent.
  const LoadedTensor& tensor(std::string_view name) const;
  /// The bytes of the shard's files, back to back in part order (one file: its bytes).
  std::span<const std::byte> file_bytes() const noexcept { return buffer_.span(size_); }
  /// The shard file it was read from (several: the first).
  const std::string& path() const noexcept { return path_; }

 private:
  friend class CheckpointReader;
  AlignedBuffer buffer_;
  std::uint64_t size_ = 0;
  std::string path_;
};

/// Called with (bytes done, bytes total) while verifying; may be empty.
using ProgressFn = std::function<void(std::uint64_t, std::uint64_t)>;
/// Receives a shard's bytes chunk by chunk: (offset in the file, the chunk).
using ChunkSink = std::function<void(std::uint64_t, std::span<const std::byte>)>;

/// An opened checkpoint. Copyable and movable (copies share the decoded manifest, which
/// nothing modifies), not assignable.
class CheckpointReader {
 public:
  /// Opens the checkpoint in `dir` (a step-N directory). With `expected_world_size`, a
  /// different world_size is Errc::world_size_mismatch naming both sizes. Throws
  /// Errc::not_found (no manifest), the manifest's decode errors, Errc::missing_shard,
  /// Errc::unsafe_path (`dir` itself, the manifest or a shard is a symlink, or a shard is not
  /// a regular file), Errc::size_mismatch. The manifest is decoded within the limits of
  /// format/manifest_limits.hpp, reading it in 1 MiB pieces, and once per process: readers
  /// of the same manifest file (same file system, path, device, inode, size and mtime) share
  /// one decoded Manifest, and threads opening it at once wait for the one decode.
  /// Thread-safe.
  ///
  /// A checkpoint across node roots (Manifest::nodes) opened through one node's directory
  /// DIR/node-n/step-N finds each shard in its own node's DIR/node-k/step-N (open_nodes).
  static CheckpointReader open(FileSystem& fs, const std::string& dir, std::optional<int> expected_world_size = {});
  /// A checkpoint across node roots: node_dirs[n] is node n's checkpoint directory
  /// (ROOT_n/step-N). The manifest is read_node_manifest's (the copy most nodes hold; a node
  /// lost or a copy damaged on some nodes does not matter); then every shard is checked in
  /// its node's directory as open() checks them.
  static CheckpointReader open_nodes(FileSystem& fs, std::span<const std::string> node_dirs, std::optional<int> expected_world_size = {});

  const Manifest& manifest() const noexcept { return manifest_; }
  const std::string& dir() const noexcept { return dir_; }
  /// The manifest file it was opened from (DIR/manifest.json; for a checkpoint across node
  /// roots, the node directory's copy that was read): what errors about the checkpoint as a
  /// whole name, so that of several roots, tiers or copies the user can tell which.
  std::string manifest_path() const;
  /// The path of shard file `file` (a record of manifest()).
  std::string file_path(const ShardRecord& file) const;
  /// The path of rank's one shard file; Errc::invalid_argument if its shard is several files
  /// (Manifest::shard).
  std::string shard_path(int rank) const;

  /// Reads every shard and checks its checksums (none: sizes and headers only).
  /// Throws Errc::checksum_mismatch naming the file, the chunk and both values.
  void verify(Verify mode, const ProgressFn& progress = {}) const;

  /// Reads, verifies and parses rank's shard (all of its files) into a buffer of its own. (load_into,
  /// read/load_into.hpp, reads a shard or some of its tensors into memory the caller owns.)
  LoadedShard load_shard(int rank, Verify mode = Verify::fast) const;

  /// Reads one tensor without reading the rest of its shard: only the chunks covering its
  /// byte range, each checked against its XXH3 unless mode is Verify::none (Verify::full
  /// is treated as fast here: the SHA-256 covers whole files only). `rank` may be any holder
  /// of a replicated tensor: it is read from the lowest holder's shard, where it is stored
  /// (Manifest::find_held_tensor).
  std::vector<std::byte> read_tensor(std::string_view name, int rank, Verify mode = Verify::fast) const;

  /// Elements [first, first + count) of one tensor, reading only the chunks that cover them,
  /// each checked as read_tensor does. A range past the tensor's end is invalid_argument;
  /// an unknown tensor Errc::not_found; a replicated tensor is found for any holder, as by
  /// read_tensor. (ShardRangeReader, range_reader.hpp, reads many
  /// ranges of one shard into the caller's buffers.)
  std::vector<std::byte> read_tensor_range(std::string_view name, int rank, std::uint64_t first, std::uint64_t count,
                                           Verify mode = Verify::fast) const;

  /// Streams shard file `file` (a record of manifest()) to `sink` one manifest chunk at a
  /// time, in file order, each chunk
  /// checked (per mode, as verify() does) before the sink sees it; with Verify::full the
  /// whole-file SHA-256 and XXH3 are checked after the last chunk, so a caller copying the
  /// bytes must discard its copy when this throws. Memory: one chunk.
  void stream_file(const ShardRecord& file, Verify mode, const ChunkSink& sink) const;
  /// stream_file of rank's one shard file (Errc::invalid_argument if it has several).
  void stream_shard(int rank, Verify mode, const ChunkSink& sink) const;

  /// Checks one shard (each of its files) as verify() checks them all: its checksums (per
  /// mode) and its header against the manifest index. With Verify::none only the header
  /// bytes are read.
  void verify_shard(int rank, Verify mode, const ProgressFn& progress = {}) const;
  /// verify_shard of one shard file (a record of manifest()).
  void verify_file(const ShardRecord& file, Verify mode, const ProgressFn& progress = {}) const;

  /// The header check every read path makes before it uses a byte of rank's shard: the
  /// shard's 8-byte length and JSON header, read on their own (a few KiB), parsed with the
  /// limits of parse_shard_prefix and parse_shard_header, and every tensor's name, dtype,
  /// shape and byte range compared with the manifest index (check_shard_head,
  /// format/shard_check.hpp). Throws Errc::invalid_argument for a rank out of range,
  /// Errc::missing_shard, Errc::unsafe_path, Errc::size_mismatch (the file is not the
  /// manifest's size), Errc::malformed_shard naming the shard file and the first
  /// disagreement; with Verify::fast or full a refused header's chunks are checked first, so
  /// a header damaged without a reseal is the Errc::checksum_mismatch verify() reports.
  /// Once per file per reader: a header that passed is not read again by this reader or its
  /// copies (a failure is not remembered: the next call checks again). Thread-safe. A shard
  /// of several files has each file's header checked, in part order.
  void check_shard_header(int rank, Verify mode = Verify::fast) const;
  /// check_shard_header of one shard file (a record of manifest()).
  void check_file_header(const ShardRecord& file, Verify mode = Verify::fast) const;

  /// The file system the checkpoint is read through.
  FileSystem& file_system() const noexcept { return *fs_; }

 private:
  CheckpointReader(FileSystem& fs, std::string dir, std::shared_ptr<const Manifest> m, std::vector<std::string> shard_dirs = {})
      : fs_(&fs),
        dir_(std::move(dir)),
        shard_dirs_(std::move(shard_dirs)),
        manifest_owner_(std::move(m)),
        manifest_(*manifest_owner_),
        header_ok_(new std::atomic<bool>[manifest_.shards.size()]()) {}
  static CheckpointReader checked(FileSystem& fs, std::string dir, std::shared_ptr<const Manifest> manifest,
                                  std::vector<std::string> node_dirs, std::optional<int> expected_world_size);
  void read_verified(const ShardRecord& file, Verify mode, std::span<std::byte> out, const ProgressFn& progress,
                     std::uint64_t done_before, std::uint64_t total, const ChunkSink& sink = {}) const;
  // check_shard_header's read and check, uncached.
  CheckedShardHeader read_shard_header(const ShardRecord& file, Verify mode) const;
  std::atomic<bool>& header_ok(const ShardRecord& file) const;
  void verify_one(const ShardRecord& file, Verify mode, AlignedBuffer& scratch, const ProgressFn& progress, std::uint64_t done,
                  std::uint64_t total) const;

  FileSystem* fs_;
  std::string dir_;
  std::vector<std::string> shard_dirs_;  // per rank, for a checkpoint across node roots; empty: dir_
  // The decoded manifest, shared with the other readers of the same file (open()'s cache);
  // manifest_ names what manifest_owner_ keeps alive (a copy or move keeps both).
  std::shared_ptr<const Manifest> manifest_owner_;
  const Manifest& manifest_;
  // Per file (by its index in manifest_.shards): its header passed the check
  // (check_file_header), shared by the copies.
  std::shared_ptr<std::atomic<bool>[]> header_ok_;
};

/// The manifest of the checkpoint in `dir` alone, without checking its shards (a checkpoint
/// across node roots whose shards may be lost): read and decoded as CheckpointReader::open
/// does (within the limits, once per process for the same file, a symlinked `dir` refused).
/// Throws Errc::not_found (no manifest) and the manifest's decode errors. Thread-safe.
std::shared_ptr<const Manifest> read_checkpoint_manifest(FileSystem& fs, const std::string& dir);
/// read_checkpoint_manifest on the POSIX file system.
inline std::shared_ptr<const Manifest> read_checkpoint_manifest(const std::string& dir) {
  return read_checkpoint_manifest(posix_file_system(), dir);
}


/// The manifest of a checkpoint across node roots, and what each node's copy holds.
struct NodeManifest {
  std::shared_ptr<const Manifest> manifest;  ///< decoded from `bytes`
  std::string bytes;                         ///< manifest.json as most nodes' copies hold it (with_bytes)
  std::size_t node = 0;                      ///< the first node whose copy holds `bytes`
  /// Per node: nullopt when its copy holds `bytes`, else why not (missing, unreadable, not a
  /// checkpoint across these nodes, other bytes), as the typed error.
  std::vector<std::optional<Error>> problems;
};

/// The one lookup of the manifest of a checkpoint across node roots: node_dirs[n] is node n's
/// directory of it (ROOT_n/step-N). Every node's copy is read; the manifest is the bytes most
/// copies hold among those that decode (as read_checkpoint_manifest decodes them) and describe
/// a checkpoint across node_dirs.size() nodes (a tie: the lowest node's). A lost node, or a
/// copy missing, emptied or edited on some nodes, does not matter while one good copy is left.
/// When no copy qualifies: with every copy there, the first one's error (a malformed or
/// hostile manifest); with some missing, Errc::not_found naming every copy. Copies are
/// compared by the XXH3 of their bytes, kept per process by file identity (as the decoded
/// manifest is), so the ranks of a process opening one node set read each copy once between
/// them; `bytes` is filled only `with_bytes` (a repair's). Thread-safe.
NodeManifest read_node_manifest(FileSystem& fs, std::span<const std::string> node_dirs, bool with_bytes = false);

/// Options for opening the live checkpoint of a root.
struct OpenLatestOptions {
  std::optional<int> expected_world_size;
  /// If `latest` is missing, unreadable or names a checkpoint that fails to open or verify,
  /// try the other complete checkpoints newest first instead of throwing.
  bool fallback = false;
  /// Verification applied while choosing (only with fallback; loads verify again).
  Verify verify = Verify::fast;
};

struct OpenedCheckpoint {
  CheckpointReader reader;
  std::string name;        ///< e.g. "step-0000000010"
  bool fell_back = false;  ///< true if `latest` was not used
  std::string note;        ///< why it fell back (the error of the checkpoint `latest` named)
};

/// open_latest(fs, root, options), which opens the live checkpoint of a root of any kind, is
/// store/store.hpp's (CheckpointStore::open_latest).


/// How many times open_latest reads `latest` when the checkpoint it named is rotated away
/// before it could be opened.
inline constexpr int kOpenLatestAttempts = 5;

/// Whether checkpoint `name` (step-N) of the plain root `root` was removed by rotation: its
/// directory is gone and `latest` names a newer step. A reader of a root that a job saves to
/// and rotates (ckpt verify, inspect, get, diff; open_latest) asks this when a read of the
/// checkpoint failed, to tell a checkpoint rotated away under it, which is no damage, from a
/// damaged one: a checkpoint deleted while `latest` still names it, or a `latest` naming a
/// missing step, is not "rotated away". Reads only `latest` and the directory's entry;
/// never throws (an unreadable root or `latest`: false).
bool rotated_away(FileSystem& fs, const std::string& root, const std::string& name) noexcept;

/// Opens ROOT/step-N.
CheckpointReader open_step(FileSystem& fs, const std::string& root, std::uint64_t step,
                           std::optional<int> expected_world_size = {});
/// open_step on the POSIX file system.
inline CheckpointReader open_step(const std::string& root, std::uint64_t step, std::optional<int> expected_world_size = {}) {
  return open_step(posix_file_system(), root, step, expected_world_size);
}

/// The name the directory root's ROOT/latest holds, or nullopt if there is none. (A node
/// set's is read_latest_nodes; any root's: open_store(root)->latest().)
std::optional<std::string> read_latest(FileSystem& fs, const std::string& root);
/// read_latest on the POSIX file system.
inline std::optional<std::string> read_latest(const std::string& root) { return read_latest(posix_file_system(), root); }


enum class CheckpointState {
  complete,     ///< every file there and checked
  in_progress,  ///< a save's temporary (or a crashed save's, which the next writer removes)
  corrupt,      ///< does not open or fails its checks (and nothing can rebuild it)
  degraded,     ///< a node set's checkpoint with files missing or damaged that its redundancy rebuilds
};
std::string_view checkpoint_state_name(CheckpointState s) noexcept;

struct CheckpointInfo {
  std::string name;
  std::optional<std::uint64_t> step;
  CheckpointState state = CheckpointState::complete;
  std::uint64_t bytes = 0;  ///< sum of shard sizes (complete) or of files present
  int world_size = 0;
  bool is_latest = false;
  std::string error;  ///< why it is corrupt
};

/// Every checkpoint directory and temporary under the directory root `root`, in name (= step)
/// order (any root's: open_store(root)->list()). With a
/// verify mode other than none, complete checkpoints are read and checked. A symlink with a
/// checkpoint's name is listed as corrupt (Errc::unsafe_path, as open() refuses it). Safe to
/// call while a save commits and rotates in the same root: an entry that is renamed or
/// removed while it is being read is left out, never reported as corrupt.
std::vector<CheckpointInfo> list_checkpoints(FileSystem& fs, const std::string& root, Verify verify = Verify::none);
/// list_checkpoints on the POSIX file system.
inline std::vector<CheckpointInfo> list_checkpoints(const std::string& root, Verify verify = Verify::none) {
  return list_checkpoints(posix_file_system(), root, verify);
}


}  // namespace ckpt
CKPT_API_END
