// SPDX-License-Identifier: Apache-2.0
// Memory-mapped lazy tensors: one rank's shard opened read-only and mapped, its tensors handed
// out as zero-copy views, each chunk's XXH3 checked the first time a view covering it is
// taken (the way safetensors' safe_open works, with the checksums it lacks).
//
//   MappedShard shard(reader, rank, Verify::fast);   // open, mmap, size and header checks
//   TensorView w = shard.tensor("model.wte");        // checks the chunks covering it, once
//   use(w.data);                                     // bytes of the file, no copy
//
// Verification modes:
//   Verify::none  no checksum; a view is the mapped bytes as they are.
//   Verify::fast  the first view covering a chunk hashes that chunk and compares it with the
//                 manifest's chunk_xxh3; later views of it cost nothing. A chunk that failed
//                 keeps failing (Errc::checksum_mismatch naming the file and the chunk, every
//                 time), and views of other chunks still work.
//   Verify::full  at construction, the whole file: every chunk's XXH3, then the file's
//                 SHA-256 and XXH3 (CheckpointReader::stream_shard's check); views check
//                 nothing more.
// A view's place (dtype, shape, byte range) comes from the manifest's tensor index, which the
// constructor checks against the shard's own safetensors header at every verify level
// (CheckpointReader::check_shard_header: the header's bytes alone are read, once per rank per
// reader), so a view is what any safetensors reader of the file sees, or the constructor
// throws Errc::malformed_shard naming the file and the first disagreement.
//
// Which file systems: the mapping needs a real file, so only a checkpoint read through
// posix_file_system() itself is mapped. Through any other FileSystem (the in-memory one of
// ckpt::testing, a fault-injecting or timing wrapper around the POSIX one) the shard falls back
// to reading: each chunk is read with ReadableFile::read_at, into a buffer of the file's size
// allocated untouched (pages are committed only as chunks land), the first time a view
// covers it, then checked as above. The contract is the same (views stay valid, what a chunk
// costs is paid once); is_mapped() says which it is. Reading through the FileSystem keeps what
// a wrapper does (a failed read, a counted byte) on this path too.
//
// Opening (POSIX): open(2) with O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK (a symlink is
// Errc::unsafe_path; O_NONBLOCK so that a FIFO put in a shard's place cannot block the open),
// fstat: anything but a regular file is Errc::unsafe_path, a file gone Errc::missing_shard; mmap(PROT_READ, MAP_SHARED) of the
// manifest's size, then fstat again: a size other than the manifest's is Errc::size_mismatch
// naming the file, expected and actual. The descriptor is closed; the mapping holds the file.
// Then the header check, which reads the header through the FileSystem (pread), not the
// mapping. No MAP_POPULATE: nothing else is read until a view (or Verify::full) touches it.
// With a verify mode the mapping is madvise(MADV_RANDOM) and each chunk gets MADV_WILLNEED
// just before it is hashed, so the kernel reads the chunks that are checked and not their
// neighbours.
//
// Truncation under a live mapping. If another process truncates a shard file while it is
// mapped, an access to a page past the new end raises SIGBUS, which kills the process: Linux
// offers no way for a library to turn it into an error (a SIGBUS handler is process-wide and
// cannot resume the access). What ckpt does to keep that from happening: the size is checked
// after the mapping is made, so a file already short is refused with a typed error; ckpt
// never modifies a committed checkpoint (saves write new step directories, and commit renames
// them into place); rotation and `ckpt prune` only remove files, and a removed file's mapping
// stays valid until it is unmapped (the inode lives while mapped). A checkpoint that other
// programs may truncate or rewrite in place should be read with CheckpointReader::load_shard
// or read_tensor instead, which read with pread(2) and report a short file as
// Errc::size_mismatch. A file modified in place (not truncated) changes the mapped bytes:
// a chunk already verified is not verified again.
//
// Thread-safety: every const member is safe to call from any number of threads at once. The
// first thread to need a chunk verifies (or, in the fallback, reads and verifies) it; threads
// that need the same chunk meanwhile wait for it (an atomic state per chunk: unchecked,
// checking, good, bad); a failed read leaves the chunk unchecked so the next view retries it.
// Views stay valid until the MappedShard is destroyed (moving it keeps them valid).
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/read/reader.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// What a MappedShard has verified and read so far, for tools and for the tests that check
/// that a view touches only the chunks covering it.
struct MappedShardStats {
  std::uint64_t chunks_checked = 0;  ///< chunk XXH3s computed (Verify::fast: each chunk at most once)
  std::uint64_t bytes_checked = 0;   ///< bytes hashed (XXH3 of chunks, or the whole file for full)
  std::uint64_t bytes_read = 0;      ///< bytes read through ReadableFile::read_at (the fallback)
};

class MappedShard {
 public:
  /// Opens rank's shard of `checkpoint` (see the file comment for what each step checks).
  /// Throws Errc::invalid_argument for a rank outside 0..world_size-1 (naming the checkpoint
  /// directory), Errc::unsafe_path (a symlink, not a regular file), Errc::missing_shard
  /// (the file is gone), Errc::size_mismatch, Errc::io_error (open, fstat, mmap failing);
  /// Errc::malformed_shard (the shard's header disagrees with the manifest index, or would be
  /// refused by any reader: CheckpointReader::check_shard_header); with Verify::full also
  /// Errc::checksum_mismatch. Blocks: Verify::full reads the whole file; otherwise only the
  /// header (unless this reader checked it already). The checkpoint may be destroyed
  /// afterwards (what is needed of its manifest is copied); its file system must outlive a
  /// fallback shard.
  /// A rank whose shard is several files is Errc::invalid_argument: map each file.
  MappedShard(const CheckpointReader& checkpoint, int rank, Verify mode = Verify::fast);
  /// The same for shard file `file` (a record of checkpoint.manifest()): any file of a shard
  /// of several, its tensors the index entries of that file.
  MappedShard(const CheckpointReader& checkpoint, const ShardRecord& file, Verify mode = Verify::fast);
  ~MappedShard();
  MappedShard(MappedShard&&) noexcept;
  MappedShard& operator=(MappedShard&&) noexcept;
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  int rank() const noexcept;
  Verify mode() const noexcept;
  /// The shard file's path.
  const std::string& path() const noexcept;
  /// The file's size (the manifest's).
  std::uint64_t size() const noexcept;
  /// True if the file is mapped; false for the read fallback (another FileSystem).
  bool is_mapped() const noexcept;

  /// The rank's tensor index entries, in the manifest's order. Reads nothing.
  const std::vector<TensorRecord>& tensors() const noexcept;
  /// The entry of tensor `name`, or nullptr. Reads nothing.
  const TensorRecord* find(std::string_view name) const noexcept;

  /// A zero-copy view of tensor `name`: its dtype, shape and bytes. Verifies the chunks
  /// covering it first, per mode (blocks while it reads and hashes them, or while another
  /// thread does). Throws Errc::not_found naming the shard file, whose expected value lists
  /// the rank's tensors (the first 20, and how many more); Errc::checksum_mismatch naming
  /// the file and the first bad chunk; the fallback's read errors.
  TensorView tensor(std::string_view name) const;

  /// A zero-copy view of the file's bytes [offset, offset + length), verified as tensor()
  /// verifies. A range past the end of the file is Errc::invalid_argument.
  std::span<const std::byte> bytes(std::uint64_t offset, std::uint64_t length) const;

  /// Counters since the shard was opened. Never blocks.
  MappedShardStats stats() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace ckpt
CKPT_API_END
