// SPDX-License-Identifier: Apache-2.0
// Shared by the fuzz targets that build a checkpoint from their input: rewrites the size and
// checksums a manifest records for a file (a shard, a redundancy block) to match the file's
// bytes, so that the fuzzer gets past the checksums to the structural checks behind them.
#pragma once

#include <boost/json.hpp>
#include <cstdint>
#include <optional>
#include <span>

#include "ckpt/hash/file_digest.hpp"

namespace ckpt::fuzz {

/// The manifest's chunk_size if it is one the loader accepts (a power of two, 4096..2^30).
inline std::optional<std::uint64_t> chunk_size_of(const boost::json::object& manifest) {
  const auto* cs = manifest.if_contains("chunk_size");
  if (!cs || !cs->is_int64()) return std::nullopt;
  const std::int64_t chunk = cs->get_int64();
  if (chunk < 4096 || chunk > (1 << 30) || (chunk & (chunk - 1)) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(chunk);
}

/// Sets `entry`'s size, sha256, xxh3 and chunk_xxh3 to those of `bytes`.
inline void reseal_entry(boost::json::object& entry, std::span<const std::byte> bytes, std::uint64_t chunk) {
  FileHasher h(chunk);
  h.update(bytes);
  const FileDigest d = h.finish();
  entry["size"] = d.size;
  entry["sha256"] = d.sha256;
  entry["xxh3"] = xxh3_hex(d.xxh3);
  boost::json::array chunks;
  for (auto c : d.chunk_xxh3) chunks.emplace_back(xxh3_hex(c));
  entry["chunk_xxh3"] = std::move(chunks);
}

}  // namespace ckpt::fuzz
