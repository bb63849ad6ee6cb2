// Not installed: the one check of a shard chunk against the XXH3 its manifest records, and the
// one error that names a bad chunk, shared by every reader of chunks (the reader, the range
// reader, load_into, the mapped shard, a node set's health check), so all name it the same way.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/hash/xxh3.hpp"

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

}  // namespace ckpt::detail
