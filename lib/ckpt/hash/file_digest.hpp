// SPDX-License-Identifier: Apache-2.0
// The checksums ckpt records for every shard file, computed in one streaming pass while the
// bytes go to (or come from) the disk: XXH3 of the whole file, XXH3 of every fixed-size chunk
// (so a corrupt byte is located and a partial read can be verified), and SHA-256 of the file.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/hash/sha256.hpp"
#include "ckpt/hash/xxh3.hpp"

CKPT_API_BEGIN
namespace ckpt {

struct FileDigest {
  std::uint64_t size = 0;                 ///< bytes hashed
  std::uint64_t chunk_size = 0;           ///< chunk length of chunk_xxh3 (last chunk may be shorter)
  std::uint64_t xxh3 = 0;                 ///< XXH3-64 of the whole file
  std::vector<std::uint64_t> chunk_xxh3;  ///< XXH3-64 of each chunk, ceil(size / chunk_size) entries
  std::string sha256;                     ///< hex SHA-256 of the whole file (empty if not computed)
};

/// Number of chunks a file of `size` bytes has (0 for an empty file).
constexpr std::uint64_t chunk_count(std::uint64_t size, std::uint64_t chunk_size) noexcept {
  return chunk_size == 0 ? 0 : size / chunk_size + (size % chunk_size != 0);
}

/// Streams bytes in pieces of any length and produces a FileDigest, in one pass: each piece
/// of at most kFusedPiece bytes is fed to all three digests while it is in cache. A file's
/// SHA-256 and whole-file XXH3 are sequential (one thread per file); files hash in parallel
/// on as many threads as their writers give them. Not thread-safe, but for the split below.
///
/// Split: update_checksums() (the two XXH3s) and update_sha256() each take every byte of the
/// file in order, and may run at once on two threads, so that one file's hashing takes two
/// cores (SHA-256 alone then bounds it). Call finish() once both are done; do not mix them
/// with update() on one hasher.
class FileHasher {
 public:
  /// Bytes fed to every digest before the next piece: small enough to stay in L2.
  static constexpr std::uint64_t kFusedPiece = 128u << 10;
  /// chunk_size > 0 (invalid_argument otherwise). SHA-256 is skipped when with_sha256 is false.
  explicit FileHasher(std::uint64_t chunk_size, bool with_sha256 = true);
  void update(std::span<const std::byte> data);
  void update_checksums(std::span<const std::byte> data);
  void update_sha256(std::span<const std::byte> data);
  /// invalid_argument if the split halves were fed different byte counts.
  FileDigest finish();

 private:
  void feed(std::span<const std::byte> data, bool with_sha256);

  std::uint64_t chunk_size_;
  std::uint64_t size_ = 0;      // bytes the XXH3s took
  std::uint64_t sha_size_ = 0;  // bytes SHA-256 took (update_sha256 only)
  bool split_ = false;
  Xxh3 whole_, chunk_;
  std::optional<Sha256> sha_;
  std::vector<std::uint64_t> chunks_;
};

}  // namespace ckpt
CKPT_API_END
