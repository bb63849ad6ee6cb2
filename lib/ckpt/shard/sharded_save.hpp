// SPDX-License-Identifier: Apache-2.0
// What save() does with the sharding descriptions of the tensors it is handed (TensorView::
// sharding): checks each against its rank and tensor, leaves a replicated tensor out of every
// holder's shard but the lowest's, and records the descriptions in the manifest's tensor
// index. Used by save_checkpoint_sync and the Checkpointer alike.
#pragma once

#include "ckpt/core/export.hpp"

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/format/safetensors.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// The tensors rank `rank` of `world` writes: `tensors` without the replicated ones whose
/// lowest holder is another rank. Throws Errc::invalid_argument naming the tensor for a
/// description that cannot be right whatever the other ranks save: a slice whose lengths are
/// not the tensor's shape, whose offsets, lengths and global shape differ in dimensions, or
/// that lies outside the global shape; a replicated tensor whose holders do not include
/// `rank` or name a rank outside 0..world-1. (The tiling of a global tensor by the slices
/// of all ranks is checked when the manifest is committed: Errc::malformed_manifest.)
std::vector<TensorView> tensors_to_write(int rank, int world, std::span<const TensorView> tensors);

/// The descriptions of `tensors` by name (only those that carry one).
using ShardingByName = std::vector<std::pair<std::string, TensorSharding>>;
ShardingByName sharding_by_name(std::span<const TensorView> tensors);

/// Sets the sharding of each index entry in `records` from `by_name`.
void attach_sharding(std::vector<TensorRecord>& records, const ShardingByName& by_name);

}  // namespace ckpt
CKPT_API_END
