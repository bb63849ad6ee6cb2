// SPDX-License-Identifier: Apache-2.0
// Private: the two builds of the xxHash kernels (SSE2 baseline and AVX2) behind one table.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <cstdint>

CKPT_API_BEGIN
namespace ckpt::detail {

struct Xxh3Kernels {
  const char* name;
  std::size_t state_size;
  void (*reset)(void* state);
  void (*update)(void* state, const void* data, std::size_t size);
  std::uint64_t (*digest)(const void* state);
  std::uint64_t (*oneshot)(const void* data, std::size_t size);
};

const Xxh3Kernels& xxh3_kernels_sse2() noexcept;
const Xxh3Kernels& xxh3_kernels_avx2() noexcept;

}  // namespace ckpt::detail
CKPT_API_END
