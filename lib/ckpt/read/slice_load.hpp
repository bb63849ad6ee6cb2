// SPDX-License-Identifier: Apache-2.0
// Load-time planning for any layout: a checkpoint's tensors seen as the job's global tensors
// (docs/format.md, "Sharded tensors"), and loading any box of any of them, at any world size
// and split, into memory the caller owns.
//
// A box of a row-major tensor is a set of contiguous runs in each source slice it overlaps;
// plan_slice_reads lists exactly those runs (the minimal byte ranges), and load_slices hands
// them to load_into (load_into.hpp) as element ranges, so they are read through its verified
// chunks (only the chunks covering them, each checked against its XXH3) straight into the
// caller's buffers.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/core/dtype.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/read/reader.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// One global tensor of a checkpoint and the stored tensors it is made of.
struct GlobalTensor {
  enum class Origin : std::uint8_t {
    sliced,      ///< entries with a slice description naming it
    replicated,  ///< one replicated entry (the lowest holder's copy)
    single,      ///< an entry without description whose name no other rank uses
    flat,        ///< a schema 1 flat ZeRO tensor (training.flat_tensors): 1-D slices of [param_numel]
  };
  struct Piece {
    const TensorRecord* record = nullptr;  ///< the stored tensor (its rank, dtype, shape, bytes)
    std::vector<std::uint64_t> offsets;    ///< where it lies in the global tensor (lengths: record->shape)
  };
  std::string name;
  DType dtype = DType::U8;
  std::vector<std::uint64_t> shape;
  Origin origin = Origin::single;
  std::vector<Piece> pieces;  ///< tiling `shape` exactly (checked)

  /// The dimensions along which the pieces are cut (some piece does not span the whole
  /// dimension), ascending; empty for a tensor stored whole.
  std::vector<std::size_t> split_dims() const;
};

/// The global tensors of `manifest`, sorted by name: the global tensor of every slice
/// description; every replicated tensor under its name; every tensor without description
/// whose name appears on one rank only (unless a sliced global tensor has that name); and
/// flat tensors without slice descriptions as 1-D slices of [param_numel] at the shards'
/// param_shard_offset: those training.flat_tensors names (schema 1 trainer checkpoints), or,
/// without training.flat_tensors, every tensor of one name on all of several ranks that is
/// 1-D with its rank's param_shard_numel elements, if their ranges tile [0, param_numel)
/// (the README's synchronous save and the training-loop example). Left out: rank-local tensors, and undescribed tensors of one name on
/// several ranks (per-rank state). Throws Errc::malformed_manifest naming `file` if a schema 1
/// flat tensor's shards do not tile [0, param_numel) or training.flat_tensors is malformed.
std::vector<GlobalTensor> global_tensors(const Manifest& manifest, std::string_view file = kManifestName);

/// A box of a global tensor, and the memory it goes to (row-major, product(lengths) elements
/// of `dtype`). Empty offsets and lengths: the whole tensor. A `dtype` other than the stored
/// one is refused unless `convert` is set; then both must be float types (F16, BF16, F32,
/// F64) and the elements are converted as convert_floats (core/dtype.hpp) says.
struct SliceTarget {
  std::string global;
  DType dtype = DType::U8;
  std::vector<std::uint64_t> offsets, lengths;
  std::span<std::byte> out;
  bool convert = false;  ///< allow a float dtype other than the stored one
};

/// One contiguous run: elements [source_first, source_first + count) of stored tensor
/// `record` go to elements [out_first, out_first + count) of target `target`.
struct SliceRun {
  std::size_t target = 0;
  const TensorRecord* record = nullptr;
  std::uint64_t source_first = 0, count = 0, out_first = 0;
};

/// The runs that fill `targets` from `globals` (global_tensors of the checkpoint), in the
/// order of the targets, then of the pieces. Refuses, before anything is read, with errors
/// naming `file`: an unknown global tensor (Errc::not_found); another dtype than the
/// checkpoint's (Errc::invalid_argument, expected the stored dtype) unless the target asks to
/// convert, and then a dtype that is not a float type on either side (invalid_argument); offsets
/// and lengths of another number of dimensions, or a box outside the global shape
/// (Errc::invalid_argument, naming the tensor, its shape and the box); an `out` of another
/// size than the box (Errc::size_mismatch, in bytes). Reads nothing.
std::vector<SliceRun> plan_slice_reads(std::span<const GlobalTensor> globals, std::span<const SliceTarget> targets,
                                       std::string_view file = kManifestName);

/// Fills every target from the checkpoint: plans (plan_slice_reads, its errors), then reads
/// the runs with load_into (all ranks' files at once, options.threads of them in parallel),
/// so that only the chunks covering the runs are read (all of each file with Verify::full)
/// and each is checked as load_into says; the buffers after a failure are as load_into
/// describes. A converting target is read into a temporary of the box's stored size, then
/// converted into `out` (so it costs that memory and one pass more). Blocks; thread-safe as load_into (targets must not overlap).
LoadReport load_slices(const CheckpointReader& checkpoint, std::span<const SliceTarget> targets, Verify mode,
                       const LoadOptions& options = {});
/// The same with the checkpoint's global_tensors() already at hand (many small loads).
LoadReport load_slices(const CheckpointReader& checkpoint, std::span<const GlobalTensor> globals, std::span<const SliceTarget> targets,
                       Verify mode, const LoadOptions& options = {});

/// A box: offsets and lengths per dimension.
struct SliceBox64 {
  std::vector<std::uint64_t> offsets, lengths;
};
/// Elements [first, first + count) of a row-major tensor of `shape` as boxes, in order (at
/// most 2 per dimension, plus one): what streaming a global tensor piece by piece reads.
std::vector<SliceBox64> boxes_of_range(std::span<const std::uint64_t> shape, std::uint64_t first, std::uint64_t count);

}  // namespace ckpt
CKPT_API_END
