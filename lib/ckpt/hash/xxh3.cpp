// SPDX-License-Identifier: Apache-2.0
#include "ckpt/hash/xxh3.hpp"

#include <cstring>

#include "ckpt/hash/detail/xxh3_kernels.hpp"

namespace ckpt {

namespace {
const detail::Xxh3Kernels& kernels() noexcept {
  static const detail::Xxh3Kernels& k =
      __builtin_cpu_supports("avx2") ? detail::xxh3_kernels_avx2() : detail::xxh3_kernels_sse2();
  return k;
}
}  // namespace

std::uint64_t xxh3_64(const void* data, std::size_t size) noexcept { return kernels().oneshot(data, size); }
std::string_view xxh3_kernel_name() noexcept { return kernels().name; }

Xxh3::Xxh3() noexcept {
  // The state buffer is sized for xxHash 0.8's XXH3_state_t (576 bytes, 64-byte aligned).
  if (kernels().state_size > sizeof(state_)) __builtin_trap();
  reset();
}
void Xxh3::reset() noexcept { kernels().reset(state_); }
void Xxh3::update(const void* data, std::size_t size) noexcept {
  if (size != 0) kernels().update(state_, data, size);
}
std::uint64_t Xxh3::digest() const noexcept { return kernels().digest(state_); }

std::string xxh3_hex(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xf];
  return s;
}

bool parse_xxh3_hex(std::string_view hex, std::uint64_t& out) noexcept {
  if (hex.size() != 16) return false;
  std::uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return false;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  out = v;
  return true;
}

}  // namespace ckpt
