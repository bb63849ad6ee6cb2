// SPDX-License-Identifier: Apache-2.0
// Private: the one error for a tensor a rank does not hold, shared by the mapped shard and
// the object-store tensor read, so a missing tensor reads the same wherever it was looked up.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "ckpt/core/error.hpp"
#include "ckpt/format/manifest.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

/// Errc::not_found naming `path` (the shard), whose expected value lists the rank's tensors
/// (`all`: the first 20, and how many more) and whose actual value is the name asked for.
[[noreturn]] inline void throw_no_tensor(const std::string& path, int rank, std::span<const TensorRecord> all, std::string_view name) {
  constexpr std::size_t kNamesInError = 20;
  std::string names;
  for (std::size_t i = 0; i < all.size() && i < kNamesInError; ++i) names += (i ? ", " : "") + all[i].name;
  if (all.size() > kNamesInError) names += " and " + std::to_string(all.size() - kNamesInError) + " more";
  throw Error(Errc::not_found, path, "no tensor '" + std::string(name) + "' on rank " + std::to_string(rank),
              all.empty() ? std::string("a tensor (rank " + std::to_string(rank) + " has none)")
                          : "one of the " + std::to_string(all.size()) + " tensors of rank " + std::to_string(rank) + ": " + names,
              "'" + std::string(name) + "'");
}

}  // namespace ckpt::detail
CKPT_API_END
