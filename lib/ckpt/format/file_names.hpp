// SPDX-License-Identifier: Apache-2.0
// The names inside a checkpoint directory that the format fixes (docs/format.md): the step
// directory and each rank's shard file.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

CKPT_API_BEGIN
namespace ckpt {

inline constexpr std::uint64_t kMaxStep = 9'999'999'999ull;

/// "step-0000000010". Throws invalid_argument for step > kMaxStep.
std::string checkpoint_dir_name(std::uint64_t step);
/// Inverse of checkpoint_dir_name; nullopt for any other name.
std::optional<std::uint64_t> parse_checkpoint_dir_name(std::string_view name) noexcept;
/// "rank-00001-of-00004.safetensors".
std::string shard_file_name(int rank, int world_size);
/// The name of file `part` (0..parts-1) of rank's shard: shard_file_name(rank, world_size) for
/// a shard of one file, else "rank-00001-of-00004.part-00002-of-00003.safetensors".
std::string shard_file_name(int rank, int world_size, int part, int parts);

}  // namespace ckpt
CKPT_API_END
