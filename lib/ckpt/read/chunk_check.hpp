// SPDX-License-Identifier: Apache-2.0
// Not installed: the one check of a shard chunk against the XXH3 its manifest records, the one
// error that names a bad chunk, and the one loop that reads a file's chunks in order and checks
// each: shared by every reader of chunks (the reader, the range reader, load_into, the mapped
// shard, a node set's health check, the copy between stores), so all name a bad chunk the same
// way. The readers that read chunks out of order or in parallel (load_into's pipeline, the
// mapped shard's parallel check, a copy's streamed pieces) check each through check_chunk_xxh3
// or throw_chunk_mismatch.
#pragma once

#include "ckpt/core/export.hpp"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/hash/xxh3.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

/// Errc::checksum_mismatch naming `path` and "xxh3 of chunk K of N (bytes B-E)", expected and
/// actual as 16 hex digits.
[[noreturn]] inline void throw_chunk_mismatch(const std::string& path, std::uint64_t k, std::uint64_t n, std::uint64_t begin,
                                              std::uint64_t len, std::uint64_t expected, std::uint64_t actual) {
  throw Error(Errc::checksum_mismatch, path,
              "xxh3 of chunk " + std::to_string(k) + " of " + std::to_string(n) + " (bytes " + std::to_string(begin) + "-" +
                  std::to_string(begin + len) + ")",
              xxh3_hex(expected), xxh3_hex(actual));
}

/// The XXH3 of chunk k of a file of chunks of `chunk_size` bytes, whose bytes are `bytes`,
/// against chunk_xxh3[k]; throws throw_chunk_mismatch's error when they differ.
inline void check_chunk_xxh3(const std::string& path, const std::vector<std::uint64_t>& chunk_xxh3, std::uint64_t k,
                             std::uint64_t chunk_size, std::span<const std::byte> bytes) {
  const std::uint64_t h = xxh3_64(bytes.data(), bytes.size());
  if (h != chunk_xxh3[k]) throw_chunk_mismatch(path, k, chunk_xxh3.size(), k * chunk_size, bytes.size(), chunk_xxh3[k], h);
}

/// Reads chunks [k0, k1) of a file (`size` bytes at `path`, in chunks of `chunk_size`, whose
/// XXH3s are `chunk_xxh3`; read_at(offset, span) reads it) in order: chunk k into into(k,
/// length) (a span of that length), checked against chunk_xxh3[k] when `verify`
/// (check_chunk_xxh3's error), then handed to each(k, offset, bytes).
template <class ReadAt, class Into, class Each>
void read_verified_chunks(ReadAt&& read_at, const std::string& path, const std::vector<std::uint64_t>& chunk_xxh3, std::uint64_t chunk_size,
                          std::uint64_t size, std::uint64_t k0, std::uint64_t k1, bool verify, Into&& into, Each&& each) {
  for (std::uint64_t k = k0; k < k1; ++k) {
    const std::uint64_t begin = k * chunk_size, len = std::min(chunk_size, size - begin);
    const std::span<std::byte> piece = into(k, len);
    read_at(begin, piece);
    if (verify) check_chunk_xxh3(path, chunk_xxh3, k, chunk_size, piece);
    each(k, begin, std::span<const std::byte>(piece));
  }
}

}  // namespace ckpt::detail
CKPT_API_END
