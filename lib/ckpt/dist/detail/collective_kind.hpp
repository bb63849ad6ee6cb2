// SPDX-License-Identifier: Apache-2.0
// The collectives a backend tells apart when it checks that every rank entered the same one,
// and their names as the comm_error texts give them (the same text from every backend).
// Private to the dist module.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <string_view>

CKPT_API_BEGIN
namespace ckpt::dist::detail {

enum class CollectiveKind : std::uint8_t { broadcast, all_reduce, reduce_scatter, all_gather, barrier, all_gather_bytes, split };

inline std::string_view kind_name(CollectiveKind k) noexcept {
  switch (k) {
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::barrier: return "barrier";
    case CollectiveKind::all_gather_bytes: return "all_gather_bytes";
    case CollectiveKind::split: return "split";
  }
  return "collective";
}

}  // namespace ckpt::dist::detail
CKPT_API_END
