// Shard files streamed piece by piece, so that a tool can rewrite a checkpoint of any size
// through a buffer of fixed size:
//
// - ShardStreamWriter writes a shard (safetensors layout, docs/format.md) whose header is
//   planned from tensor specs alone, then takes the data section in pieces of any length,
//   hashing each piece (XXH3 per chunk and of the file, SHA-256) as it goes to the file, so
//   the checksums never need a second read.
// - ShardRangeReader reads arbitrary byte ranges of one shard of an open checkpoint and checks
//   the XXH3 of every chunk it touches, keeping the last partly used chunk so that sequential
//   reads do not read (or hash) a chunk twice.
//
// Both keep at most one chunk (the checkpoint's chunk_size) of their own memory: what else
// they use is the caller's buffer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/core/dtype.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/io/commit.hpp"
#include "ckpt/io/file_system.hpp"
#include "ckpt/io/reader.hpp"

namespace ckpt {

// TensorSpec and plan_shard_specs (the header plan without the bytes) are in
// ckpt/format/safetensors.hpp.

/// Writes one shard file whose data arrives in pieces. Not thread-safe: one writer per file.
///
/// The constructor creates the file (O_EXCL), reserves its size and writes the header; write()
/// then takes the data section in file order (header().tensors, back to back) in pieces of any
/// size; finish() checks that exactly data_size bytes arrived, fsyncs and closes the file and
/// returns its manifest record and index. Every call blocks on the file system and throws its
/// ckpt::Error. On any failure the partial file stays where it is: write into a temporary
/// directory (begin_checkpoint) and remove it on failure (abort_checkpoint), as the commit
/// protocol does.
class ShardStreamWriter {
 public:
  /// `file_name` inside `dir`; `chunk_size` > 0 is the length of the per-chunk checksums.
  /// `with_sha256 = false` skips the SHA-256 (the record's sha256 stays empty): for files that
  /// are not checkpoint shards.
  ShardStreamWriter(FileSystem& fs, const std::string& dir, std::string file_name, std::span<const TensorSpec> tensors,
                    std::map<std::string, std::string> header_metadata, std::uint64_t chunk_size = kDefaultChunkSize,
                    bool with_sha256 = true);
  ~ShardStreamWriter();
  ShardStreamWriter(const ShardStreamWriter&) = delete;
  ShardStreamWriter& operator=(const ShardStreamWriter&) = delete;

  const ShardHeader& header() const noexcept { return header_; }
  const std::string& path() const noexcept { return path_; }
  /// Bytes of the data section still expected.
  std::uint64_t remaining() const noexcept { return header_.data_size - written_; }

  /// Appends the next bytes of the data section. More bytes than remaining() is
  /// invalid_argument (and nothing of `bytes` is written).
  void write(std::span<const std::byte> bytes);
  /// Appends `count` zero bytes (padding of a flat tensor), through a small fixed buffer.
  void write_zeros(std::uint64_t count);
  /// Completes the file: invalid_argument if remaining() != 0, else fsync and close. Returns
  /// the path, size and checksums (record.rank is `rank`; the caller fills the rest) and the
  /// tensor index with absolute byte ranges for `rank`.
  WrittenShard finish(int rank);

 private:
  void put(std::span<const std::byte> bytes);

  ShardHeader header_;
  std::string file_name_, path_;
  std::unique_ptr<WritableFile> file_;
  FileHasher hasher_;
  std::uint64_t chunk_size_;
  std::uint64_t offset_ = 0;   ///< file offset of the next byte
  std::uint64_t written_ = 0;  ///< data bytes written
  bool finished_ = false;
};

/// Reads byte ranges of rank's shard of an open checkpoint, verified chunk by chunk.
///
/// With Verify::fast or full, every chunk that a read touches is read whole and its XXH3
/// checked against the manifest before any of its bytes is returned (Errc::checksum_mismatch
/// naming the file, the chunk and both values); full is treated as fast, since SHA-256 covers
/// whole files only (CheckpointReader::verify_shard checks those). With Verify::none only the
/// requested bytes are read. Chunks that lie wholly inside the destination are read straight
/// into it; a chunk only partly needed is kept, so the next sequential read reuses it.
/// Blocks on the file system; not thread-safe (one reader per thread); the CheckpointReader
/// must outlive it.
class ShardRangeReader {
 public:
  /// Opens the shard file and checks its size against the manifest (Errc::size_mismatch).
  ShardRangeReader(const CheckpointReader& checkpoint, int rank, Verify mode = Verify::fast);

  int rank() const noexcept { return rank_; }
  /// Fills `out` with the file's bytes [offset, offset + out.size()). A range past the end
  /// of the file is invalid_argument.
  void read(std::uint64_t offset, std::span<std::byte> out);
  /// Bytes read from the file so far (whole chunks when verifying).
  std::uint64_t bytes_read() const noexcept { return bytes_read_; }

 private:
  void check_chunk(std::uint64_t k, std::span<const std::byte> bytes) const;

  const ShardRecord* record_;
  std::string path_;
  int rank_;
  Verify mode_;
  std::uint64_t chunk_size_;
  std::unique_ptr<ReadableFile> file_;
  std::vector<std::byte> chunk_;
  std::optional<std::uint64_t> cached_;  ///< index of the chunk in chunk_
  std::uint64_t bytes_read_ = 0;
};

}  // namespace ckpt
