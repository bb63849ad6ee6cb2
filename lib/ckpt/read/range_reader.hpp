// SPDX-License-Identifier: Apache-2.0
// Byte ranges of one shard of an open checkpoint, verified chunk by chunk, so that a tool can
// read a checkpoint of any size through a buffer of fixed size (resharding, consolidation,
// load-time resharding). It keeps at most one chunk (the checkpoint's chunk_size) of its own
// memory: what else it uses is the caller's buffer.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/read/reader.hpp"

CKPT_API_BEGIN
namespace ckpt {

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
  /// Opens the shard file, checks its size against the manifest (Errc::size_mismatch) and its
  /// header against the manifest index (CheckpointReader::check_shard_header, at every verify
  /// level: Errc::malformed_shard naming the file and the first disagreement).
  ShardRangeReader(const CheckpointReader& checkpoint, int rank, Verify mode = Verify::fast);
  /// The same for shard file `file` (a record of checkpoint.manifest(), which must outlive
  /// the reader): any file of a shard of several.
  ShardRangeReader(const CheckpointReader& checkpoint, const ShardRecord& file, Verify mode = Verify::fast);

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
CKPT_API_END
