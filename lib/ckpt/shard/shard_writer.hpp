// SPDX-License-Identifier: Apache-2.0
// The one shard writer. Every path that puts a shard file on disk goes through it: the
// asynchronous checkpointer (runtime/), the synchronous save (ops/save.hpp), resharding and
// consolidation (ops/reshard.hpp) and the copy between tiers (store/tiers.hpp). It owns the steps
// every shard file takes, in this order:
//
//   open    create the file (O_EXCL, O_NOFOLLOW; O_DIRECT on request) and reserve its size
//           (fallocate), so later writes allocate no blocks;
//   bytes   the file's bytes, in file order, each hashed exactly once as it goes out
//           (XXH3 per chunk and of the file, SHA-256 of the file): never a read-back pass;
//   finish  check that every byte arrived, cut O_DIRECT padding (ftruncate), fsync, close,
//           and report the shard's manifest record and tensor index.
//
// The bytes arrive in one of two ways. Streaming: write() takes pieces of any length and
// writes and hashes them itself (synchronous callers). Image: the caller holds the whole
// file image in memory (header, data, padding to the block size) and moves it to file()
// itself, e.g. through io_uring with several writes in flight, while another thread calls
// hash() over the same bytes; mark_written() then records how far the file was written.
//
// Every call blocks on the file system and throws its ckpt::Error. On any failure the
// partial file stays where it is: write into a temporary directory (begin_checkpoint) and
// remove it on failure (abort_checkpoint), as the commit protocol does. Not thread-safe,
// except that in image mode hash() and the caller's writes to file() may run concurrently.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/fs/file_system.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// The metadata every ckpt writer puts in a shard's safetensors header: ckpt.rank,
/// ckpt.world_size and ckpt.step (docs/format.md).
std::map<std::string, std::string> shard_header_metadata(int rank, int world_size, std::uint64_t step);

/// Manifest tensor index entries for a planned shard of `rank`.
std::vector<TensorRecord> tensor_records(const ShardHeader& header, int rank);

struct ShardWriterOptions {
  std::uint64_t chunk_size = kDefaultChunkSize;  ///< length of the per-chunk XXH3 (> 0)
  bool sha256 = true;   ///< false: no SHA-256 (the report's sha256 stays empty), for files that are not shards
  bool direct = false;  ///< try O_DIRECT (image mode: the caller writes 4096-aligned pieces)
};

class ShardWriter {
 public:
  /// Streaming: plans the shard header from `tensors` (plan_shard_specs: the same plan the
  /// loader checks), creates `dir`/`file_name` and writes the header; write() then takes the
  /// data section (header().tensors, back to back).
  static ShardWriter stream(FileSystem& fs, const std::string& dir, std::string file_name, std::span<const TensorSpec> tensors,
                            std::map<std::string, std::string> header_metadata, ShardWriterOptions options = {});
  /// Image: creates `dir`/`file_name` for the shard `header` describes; the caller moves the
  /// file image (encode_shard_header(header) followed by the data section) itself.
  static ShardWriter image(FileSystem& fs, const std::string& dir, std::string file_name, ShardHeader header,
                           ShardWriterOptions options = {});
  /// Copy: creates `dir`/`file_name` for an existing shard file of `size` bytes whose bytes
  /// (header included) arrive through write() in file order, e.g. from another tier.
  static ShardWriter copy(FileSystem& fs, const std::string& dir, std::string file_name, std::uint64_t size,
                          ShardWriterOptions options = {});

  ShardWriter(ShardWriter&&) noexcept;
  ShardWriter& operator=(ShardWriter&&) noexcept;
  ~ShardWriter();  ///< closes the file if finish() was not reached (the error already reported)

  const ShardHeader& header() const noexcept { return header_; }
  const std::string& path() const noexcept { return path_; }
  /// Bytes of the file: header().file_size(), or the size given to copy().
  std::uint64_t size() const noexcept { return size_; }
  /// Bytes still expected by write() (streaming: of the data section; copy: of the file).
  std::uint64_t remaining() const noexcept { return size_ - hashed_; }

  /// Streaming and copy: appends the next bytes, hashing them. More than remaining() is
  /// invalid_argument and writes nothing.
  void write(std::span<const std::byte> bytes);
  /// Streaming: appends `count` zero bytes (padding of a flat tensor) through a small buffer.
  void write_zeros(std::uint64_t count);

  /// Image mode: the open file, for the caller's own writes.
  WritableFile& file() noexcept { return *file_; }
  /// Image mode: hashes the next bytes of the file (in file order), without writing them.
  void hash(std::span<const std::byte> bytes);
  /// Image mode, the same split across two threads (FileHasher's split): every byte of the
  /// file, in file order, through hash_checksums() (the XXH3s) and through hash_sha256(); the
  /// two may run at once, on different threads. Not mixed with hash().
  void hash_checksums(std::span<const std::byte> bytes);
  void hash_sha256(std::span<const std::byte> bytes);
  /// Image mode: the caller wrote the file up to `end` (at least size(); more when O_DIRECT
  /// padding was written, which finish() cuts off).
  void mark_written(std::uint64_t end) noexcept { written_end_ = end; }

  /// Completes the file: invalid_argument unless every byte was hashed and written; cuts the
  /// padding, fsyncs and closes. Returns the shard record (path, size, checksums; rank is
  /// `rank`, the caller fills the flat range and metadata) and the tensor index.
  ShardReport finish(int rank);

 private:
  ShardWriter(FileSystem& fs, const std::string& dir, std::string file_name, ShardHeader header, std::uint64_t size,
              ShardWriterOptions options);
  void put(std::span<const std::byte> bytes);

  ShardHeader header_;
  std::string file_name_, path_;
  std::uint64_t size_ = 0;
  std::unique_ptr<WritableFile> file_;
  std::unique_ptr<FileHasher> hasher_;
  std::uint64_t chunk_size_ = kDefaultChunkSize;
  std::uint64_t hashed_ = 0;       ///< file bytes hashed so far (by the XXH3s, when split)
  std::uint64_t hashed_sha_ = 0;   ///< split: file bytes SHA-256 took so far
  bool split_ = false;
  std::uint64_t written_end_ = 0;  ///< file bytes written so far (image mode: as the caller says)
  bool finished_ = false;
};

}  // namespace ckpt
CKPT_API_END
