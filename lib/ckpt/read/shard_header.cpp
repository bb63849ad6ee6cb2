// SPDX-License-Identifier: Apache-2.0
#include "ckpt/read/shard_header.hpp"

#include <algorithm>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/read/chunk_check.hpp"

namespace ckpt::detail {

namespace {

// The chunks covering the bytes a header claims (its 8-byte length and, where that length is
// within the limits, the N bytes after it), each checked against its XXH3.
void check_head_chunks(const Manifest& m, const ShardRecord& rec, const ReadAt& read_at, const std::string& file) {
  if (rec.size == 0 || m.chunk_size == 0) return;
  std::uint64_t extent = std::min<std::uint64_t>(8, rec.size);
  if (rec.size >= 8) {
    std::byte prefix[8];
    read_at(0, prefix);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(prefix[i]);
    if (n <= kMaxHeaderBytes && n <= rec.size - 8) extent = 8 + n;
  }
  const std::uint64_t chunks = std::min<std::uint64_t>(chunk_count(extent, m.chunk_size), rec.chunk_xxh3.size());
  std::vector<std::byte> chunk;
  read_verified_chunks(
      read_at, file, rec.chunk_xxh3, m.chunk_size, rec.size, 0, chunks, true,
      [&](std::uint64_t, std::uint64_t len) {
        chunk.resize(static_cast<std::size_t>(len));
        return std::span<std::byte>(chunk);
      },
      [](std::uint64_t, std::uint64_t, std::span<const std::byte>) {});
}

}  // namespace

CheckedShardHeader read_checked_shard_header(const Manifest& m, const ShardRecord& rec, const ReadAt& read_at, const std::string& file, Verify mode) {
  try {
    const std::vector<std::byte> head = read_shard_head(read_at, rec.size, file);
    return check_shard_head(m, rec, head, file);
  } catch (const Error& e) {
    if (e.code() != Errc::malformed_shard || mode == Verify::none) throw;
    check_head_chunks(m, rec, read_at, file);
    throw;
  }
}

}  // namespace ckpt::detail
