// SPDX-License-Identifier: Apache-2.0
// Loading a checkpoint straight into memory the caller already owns: the model's parameters,
// the optimizer's shards. CheckpointReader::load_shard allocates a fresh buffer per shard
// and reads through the page cache, so every page of it is touched for the first time during
// the load; load_into reads with O_DIRECT through io_uring (a queue of reads in flight per
// file; buffered where the file system refuses O_DIRECT, at open or at a read, as many FUSE
// file systems do) into a few reused, pre-faulted bounce buffers, or straight into a target
// when the target's memory is 4096-aligned where a whole read lands, and copies each piece
// out while it is still in cache, hashing it on the way (one pass over the bytes).
//
// What it reads: first each file's own safetensors header (its 8-byte length and JSON, a few
// KiB, once per file per reader: CheckpointReader::check_shard_header), which must agree
// with the manifest's tensor index on every tensor's name, dtype, shape and byte range, at
// every verify level; then, with Verify::none and Verify::fast, only the chunks (manifest
// chunk_size) that cover the requested bytes; with Verify::full the whole file, since its
// SHA-256 and XXH3 cover the whole file. So what lands in a target is what any safetensors
// reader of the file sees as that tensor.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ckpt/core/dtype.hpp"
#include "ckpt/read/reader.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// One tensor (or an element range of one) of a rank's shard, and where its bytes go.
struct LoadTarget {
  std::string name;                      ///< the tensor's name in the manifest index
  std::span<std::byte> out;              ///< the caller's memory; written only as described below
  DType dtype = DType::U8;               ///< must equal the manifest's dtype
  std::vector<std::uint64_t> shape;      ///< must equal the manifest's shape (the whole tensor's)
  std::uint64_t first = 0;               ///< first element to load (with `count`)
  std::optional<std::uint64_t> count;    ///< elements to load; nullopt: the whole tensor (first = 0)
};

/// A LoadTarget for the whole tensor `name` into `out`, its dtype inferred from the element
/// type (dtype_of) and its shape {out.size()} unless `shape` is given: `ckpt::load_target("w",
/// weights)` for a std::vector<float>. The load checks both against the manifest, as for any
/// LoadTarget.
template <class T>
LoadTarget load_target(std::string name, std::span<T> out, std::vector<std::uint64_t> shape = {}) {
  static_assert(!std::is_const_v<T>, "ckpt::load_target: the memory loaded into must be writable");
  if (shape.empty()) shape = {out.size()};
  LoadTarget t;
  t.name = std::move(name);
  t.out = std::as_writable_bytes(out);
  t.dtype = dtype_of<T>();
  t.shape = std::move(shape);
  return t;
}
/// The same for a std::vector (not std::vector<bool>).
template <class T>
LoadTarget load_target(std::string name, std::vector<T>& out, std::vector<std::uint64_t> shape = {}) {
  static_assert(!std::is_same_v<T, bool>, "ckpt::load_target: std::vector<bool> holds no array of bool");
  return load_target(std::move(name), std::span<T>(out), std::move(shape));
}

enum class LoadEngine {
  automatic,  ///< io_uring where the kernel (and seccomp) allow it, else pread
  io_uring,   ///< io_uring; if it cannot be set up, pread (LoadReport::fallback says why)
  pread,      ///< synchronous pread(2), one read at a time (the fallback, forced)
};

struct LoadOptions {
  LoadEngine engine = LoadEngine::automatic;
  bool direct = true;                ///< O_DIRECT where the file system accepts it
  int queue_depth = 8;               ///< reads in flight per file (io_uring)
  std::uint64_t io_size = 1u << 20;  ///< bytes per read (a multiple of 4096; cut at chunk ends)
  /// Threads reading at once (0: the cores): a file each, and with Verify::none or fast, when
  /// there are fewer files than threads, a file's needed chunks split into contiguous parts of
  /// at least 16 MiB, each read, checked and copied out by its own thread. With Verify::full a
  /// file is one part (its SHA-256 needs its bytes in order).
  int threads = 0;
};

/// What a load did.
struct LoadReport {
  std::string engine;               ///< "io_uring", "pread" or "file_system" (a FileSystem that is not the POSIX one)
  bool direct = false;              ///< every file was read with O_DIRECT
  std::string fallback;             ///< why io_uring or O_DIRECT was not used (empty when both were, or not asked for)
  std::uint64_t files = 0;          ///< shard files read
  std::uint64_t parts = 0;          ///< parts read by a thread each (files, or more: LoadOptions::threads)
  std::uint64_t bytes_read = 0;     ///< bytes read from the files (a file read again buffered: the second pass)
  std::uint64_t chunks_read = 0;    ///< manifest chunks read (each checked unless Verify::none)
  std::uint64_t reads_direct = 0;   ///< reads that landed in a target without a bounce buffer
};

/// The targets of one rank, for the multi-rank load.
struct RankLoad {
  int rank = 0;
  std::span<const LoadTarget> targets;
};

/// Reads the targets of rank's shard of `checkpoint` into the targets' memory. A target may
/// name a replicated tensor `rank` holds but does not store (Manifest::find_held_tensor): it
/// is read from the lowest holder's shard, where the tensor is stored, and the checks and
/// reads below then concern that shard.
///
/// Checks first, before any byte is read or any target written: rank in range
/// (Errc::invalid_argument); every target's tensor exists on that rank (Errc::not_found naming
/// the shard file and the tensor); its dtype and shape equal the manifest's
/// (Errc::invalid_argument naming the shard file, the tensor, expected and actual); the element
/// range lies within the tensor (Errc::invalid_argument); out.size() is exactly the bytes of
/// the range (Errc::size_mismatch, expected and actual in bytes). Then the shard's header is
/// checked against the manifest index (CheckpointReader::check_shard_header), at every verify
/// level, Verify::none included: its size (Errc::size_mismatch), its length and JSON as any
/// safetensors reader would accept them, and every tensor's name, dtype, shape and byte range
/// (Errc::malformed_shard naming the shard file and the first disagreement, the manifest's
/// value as expected and the header's as actual; with Verify::fast and full a header damaged
/// without its checksums recomputed is the Errc::checksum_mismatch of its chunk). Then the
/// shard file is opened for the load and its size checked again (a file that ends early while
/// being read is Errc::size_mismatch naming the byte where it ended).
///
/// Verification: Verify::fast checks each chunk's XXH3 as it lands (Errc::checksum_mismatch
/// naming the shard file, the chunk and both values); Verify::full also the SHA-256 and XXH3 of
/// the whole file (every chunk is read); Verify::none checks sizes and the header only.
///
/// The buffers, on success: every target holds its bytes of the checkpoint. On a throw
/// (nothing half-verified is left without the error saying so):
///  - any error of the checks above, the header's included: every target is untouched (no
///    byte of any target has been written; with several ranks, every rank's header is checked
///    before any tensor data is read, and of several refused the first in `ranks` is thrown).
///  - Verify::none and fast: every byte of a target holds either its previous value (its
///    chunk was not reached), or the checkpoint's bytes from a chunk that was read whole and
///    (fast) passed its XXH3, or zero: the bytes of the chunks that were being read when the
///    load stopped (the failing chunk among them) are zeroed before the throw. A failing
///    chunk k's error says "targets covering chunks k.. were zeroed".
///  - Verify::full: a file's bytes are verified only once its SHA-256 is known, at its end,
///    so every target of a file whose load started but did not pass all its checks is zeroed
///    in full before the throw (the error of a SHA-256 mismatch says so); targets of files
///    that passed hold the checkpoint's bytes, targets of files not started are untouched.
/// No read is in flight into any target or bounce buffer when the call returns or throws.
///
/// Engine: O_DIRECT reads through io_uring on the POSIX file system (posix_file_system());
/// pread where io_uring cannot be set up (seccomp, an old kernel: logged once, through
/// log_line, and in LoadReport::fallback); the FileSystem's own read_at for any other
/// FileSystem (in-memory, fault-injecting wrappers). Buffered reads where options.direct is
/// false, and where the file system refuses O_DIRECT:
///  - at open (EINVAL: tmpfs before Linux 6.6): the file is opened buffered;
///  - at a read, having taken the open (EINVAL: FUSE file systems such as s3fs, gcsfuse,
///    JuiceFS, blobfuse), or by a direct read that ends short of the file's end off a
///    4096-byte boundary (the rest could not be read direct): the reads in flight are
///    drained, the targets' unverified bytes zeroed as after a failure, and the file is
///    reopened buffered (the same file: device and inode must match, else Errc::io_error)
///    and read again from its start, once: its hashes start over (no byte is hashed twice)
///    and every target of the file is written again. A refusal after that is an error.
/// Either way one log_line per such file (per part of it, for a file read in parts: each part
/// falls back on its own, reading its own chunks again) names it and says why,
/// LoadReport::direct is false and LoadReport::fallback starts "buffered reads: " and says
/// why; the targets end up with the same verified bytes as a direct load.
/// LoadReport::bytes_read counts the pass that delivered the bytes.
///
/// Blocks until done, on the calling thread (and, where LoadOptions::threads splits the file
/// into parts, as many threads as parts less one, started and joined inside the call; the
/// failing part's error is thrown once every part has stopped). Thread-safe: any number of
/// loads may run at once, from one CheckpointReader too, as long as their targets do not
/// overlap; a target must not be read or written by anyone else until the call returns.
LoadReport load_into(const CheckpointReader& checkpoint, int rank, std::span<const LoadTarget> targets, Verify mode,
                     const LoadOptions& options = {});

/// load_into for several ranks' shards at once, each file (or part of a file: LoadOptions::
/// threads) read (and, with Verify::full, SHA-256-hashed) by its own thread, options.threads
/// at a time: the way to load a whole
/// checkpoint, or a reshard's ranges of other ranks' shards. Every target of every rank is
/// checked, and then every rank's shard header (those threads too), before any target is
/// written. The first error of the loads stops the other files at their next read
/// and is rethrown once every thread has stopped; the buffers are as load_into describes, per
/// file. Blocks; thread-safe as load_into.
LoadReport load_into(const CheckpointReader& checkpoint, std::span<const RankLoad> ranks, Verify mode, const LoadOptions& options = {});

}  // namespace ckpt
CKPT_API_END
