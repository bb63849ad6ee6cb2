// SPDX-License-Identifier: Apache-2.0
// The flat layout of a ZeRO checkpoint (docs/resharding.md): which tensors are partitioned
// across ranks as one flat space, how many of its elements are real, each rank's slice of it
// at any world size, and the model tensors' places in it. Read from the manifest's
// training fields; no I/O. Used by slice loads, reshard and consolidate, and the trainer.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/dist/communicator.hpp"
#include "ckpt/format/manifest.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// What part of a checkpoint is partitioned across ranks.
struct FlatLayout {
  std::vector<std::string> tensors;  ///< flat tensors, sliced by param_shard_offset/numel
  std::uint64_t num_params = 0;      ///< real elements; [num_params, padded) is zero padding
};

/// The layout a checkpoint records: training.flat_tensors (an array of names) and
/// training.num_params (default: param_numel). Errc::invalid_argument if the checkpoint does
/// not record its flat tensors (it cannot be resharded without being told them);
/// Errc::malformed_manifest if the fields have the wrong types or num_params > param_numel.
/// Errors name `file` (the manifest's path).
FlatLayout flat_layout(const Manifest& manifest, std::string_view file = kManifestName);

/// `num_params` rounded up to a multiple of `world` (ZeRO's padding). invalid_argument for
/// world < 1 or an overflow.
std::uint64_t padded_numel(std::uint64_t num_params, int world);

/// Rank's slice of the flat space at world size `world`:
/// dist::shard_range(padded_numel(num_params, world), world, rank).
dist::ShardRange flat_slice(std::uint64_t num_params, int world, int rank);

/// One model tensor's place in the flat space (training.param_layout).
struct ParamSlice {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::uint64_t offset = 0, numel = 0;
};

/// training.param_layout, validated (names unique and usable as safetensors names, numel =
/// product(shape), offset + numel <= layout.num_params): Errc::malformed_manifest otherwise.
/// A checkpoint without one yields a single 1-D tensor named `fallback_name` covering
/// [0, num_params).
std::vector<ParamSlice> param_layout(const Manifest& manifest, const FlatLayout& layout, std::string_view fallback_name,
                                    std::string_view file = kManifestName);

}  // namespace ckpt
CKPT_API_END
