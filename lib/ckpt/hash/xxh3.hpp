// SPDX-License-Identifier: Apache-2.0
// XXH3-64, the fast checksum of ckpt: per chunk and per file. The kernel is picked at run
// time: an AVX2 build of header-only xxHash where the CPU has AVX2 (several times faster than
// the SSE2-only system library), the portable SSE2 build elsewhere.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

CKPT_API_BEGIN
namespace ckpt {

/// One-shot XXH3-64 (seed 0) of a buffer. Thread-safe.
std::uint64_t xxh3_64(const void* data, std::size_t size) noexcept;
inline std::uint64_t xxh3_64(std::span<const std::byte> data) noexcept {
  return xxh3_64(data.data(), data.size());
}

/// Name of the kernel in use ("avx2" or "sse2"), for logs and benchmarks.
std::string_view xxh3_kernel_name() noexcept;

/// Streaming XXH3-64: update() in any pieces gives the same digest as one xxh3_64() call.
/// Not thread-safe; one object per stream. Copyable (copies the running state).
class Xxh3 {
 public:
  Xxh3() noexcept;
  void reset() noexcept;
  void update(const void* data, std::size_t size) noexcept;
  void update(std::span<const std::byte> data) noexcept { update(data.data(), data.size()); }
  /// Digest of everything fed so far; the stream may continue afterwards.
  std::uint64_t digest() const noexcept;

 private:
  alignas(64) unsigned char state_[640];
};

/// 16 lower-case hex digits, most significant first (the manifest's spelling of an XXH3).
std::string xxh3_hex(std::uint64_t v);
/// Inverse of xxh3_hex; false when `hex` is not exactly 16 hex digits.
bool parse_xxh3_hex(std::string_view hex, std::uint64_t& out) noexcept;

}  // namespace ckpt
CKPT_API_END
