// SPDX-License-Identifier: Apache-2.0
// Sharded-tensor metadata (schema_version 2, docs/format.md "Sharded tensors"): what a saved
// tensor is with respect to the whole job. A tensor may be
//   - a slice of a global tensor: the global name and shape, and the offsets and lengths of
//     the n-dimensional box the tensor holds (row-major, like every tensor);
//   - replicated: identical on the ranks that hold it, so written once, by the lowest of
//     them, the manifest listing the holders;
//   - rank-local: meaningful only for the rank that saved it (an RNG state);
// or say nothing (schema 1's only kind): a tensor of its rank.
//
// The conveniences build the common descriptions; check_tiling says whether a set of slices
// covers its global tensor exactly, in time and memory proportional to the slices (a grid of
// the slices' cut points, capped: see kMaxTilingCells).
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

CKPT_API_BEGIN
namespace ckpt {

struct TensorSharding {
  enum class Kind : std::uint8_t { slice, replicated, rank_local };
  Kind kind = Kind::slice;
  // Kind::slice: the global tensor and the box of it this tensor holds; lengths equal the
  // tensor's own shape, offsets[d] + lengths[d] <= global_shape[d].
  std::string global;
  std::vector<std::uint64_t> global_shape, offsets, lengths;
  // Kind::replicated: the ranks holding it, ascending, each once; the lowest writes it.
  std::vector<int> holders;

  bool operator==(const TensorSharding&) const = default;
};

/// The split rule of the conveniences (numpy.array_split's): `n` items over `parts` parts,
/// the first n % parts parts one item longer. Part p is [first, first + count). Throws
/// Errc::invalid_argument for parts < 1 or part outside 0..parts-1.
struct SplitRange {
  std::uint64_t first = 0, count = 0;
};
SplitRange split_range(std::uint64_t n, int part, int parts);

/// This tensor is rows split_range(rows, part, parts) of the global [rows, cols] tensor
/// `global` (so its own shape is [count, cols]). invalid_argument as split_range.
TensorSharding row_slice(std::string global, std::uint64_t rows, std::uint64_t cols, int part, int parts);
/// This tensor is columns split_range(cols, part, parts) of the global [rows, cols] tensor
/// (its own shape [rows, count]).
TensorSharding column_slice(std::string global, std::uint64_t rows, std::uint64_t cols, int part, int parts);
/// Any box of a global tensor (no checks here: save and the manifest check it).
TensorSharding slice_of(std::string global, std::vector<std::uint64_t> global_shape, std::vector<std::uint64_t> offsets,
                        std::vector<std::uint64_t> lengths);
/// Identical on `holders` (any order, duplicates removed; invalid_argument if empty or a
/// rank is negative). Only the lowest holder's copy is written.
TensorSharding replicated(std::vector<int> holders);
/// Meaningful only for the rank that saves it.
TensorSharding rank_local();

/// One slice of a global tensor, for check_tiling.
struct SliceBox {
  int rank = 0;
  std::span<const std::uint64_t> offsets, lengths;
};

/// Most grid cells check_tiling examines: 2^20 plus 16 per slice (a grid of P x Q slices has
/// P x Q cells; only slices whose cuts do not line up make more).
std::uint64_t max_tiling_cells(std::size_t slices) noexcept;

/// Why `boxes` do not tile a tensor of `global_shape` exactly, or nullopt if they do: a box
/// with the wrong number of dimensions or outside the shape, two boxes overlapping, an
/// element no box covers, or a tiling too fragmented to check (more than max_tiling_cells).
/// The text names the ranks concerned and the element, e.g. "the slices of ranks 1 and 2
/// overlap at element [2, 0]". Empty boxes (a length 0) cover nothing and are allowed.
std::optional<std::string> tiling_problem(std::span<const std::uint64_t> global_shape, std::span<const SliceBox> boxes);

/// "[2, 0]"
std::string format_index(std::span<const std::uint64_t> index);

}  // namespace ckpt
CKPT_API_END
