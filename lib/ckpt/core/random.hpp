// SPDX-License-Identifier: Apache-2.0
// splitmix64: the one small, fully specified generator ckpt uses where it needs
// reproducible pseudo-random numbers (initialisation, synthetic data, seeding xoshiro).
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>

CKPT_API_BEGIN
namespace ckpt {

/// Advances `state` and returns the next value of the splitmix64 sequence.
constexpr std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace ckpt
CKPT_API_END
