// SPDX-License-Identifier: Apache-2.0
// Element-wise reduction kernel shared by the backends' all_reduce and reduce_scatter.
// Private to the dist module.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <cstdint>
#include <span>

#include "ckpt/core/dtype.hpp"
#include "ckpt/dist/communicator.hpp"

CKPT_API_BEGIN
namespace ckpt::dist::detail {

/// dst[i] = fold over k of inputs[k][first + i] for i in [0, n) (indices in elements of `t`),
/// starting from inputs[0] and adding inputs[1], inputs[2], ... in that order, in the
/// accumulation type ReduceOp documents; mean then divides by inputs.size(). The fixed order is
/// what makes results independent of thread timing.
///
/// Works block by block (reads every input's block before writing it), so `dst` may be exactly
/// inputs[k] + first for one k; any other overlap is undefined. Buffers need no alignment.
/// Preconditions (checked by the caller, not here): inputs is not empty, check_reducible(t, op)
/// passed, and every input holds [first, first + n).
void reduce_range(std::span<const std::byte* const> inputs, std::uint64_t first,
                  std::uint64_t n, std::byte* dst, DType t, ReduceOp op) noexcept;

}  // namespace ckpt::dist::detail
CKPT_API_END
