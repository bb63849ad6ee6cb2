// SPDX-License-Identifier: Apache-2.0
#include "ckpt/format/sharding.hpp"

#include <algorithm>

#include "ckpt/core/error.hpp"

namespace ckpt {

SplitRange split_range(std::uint64_t n, int part, int parts) {
  if (parts < 1) throw Error(Errc::invalid_argument, {}, "split: number of parts", "at least 1", std::to_string(parts));
  if (part < 0 || part >= parts)
    throw Error(Errc::invalid_argument, {}, "split: part", "0.." + std::to_string(parts - 1), std::to_string(part));
  const auto p = static_cast<std::uint64_t>(part), k = static_cast<std::uint64_t>(parts);
  const std::uint64_t base = n / k, extra = n % k;
  return {p * base + std::min(p, extra), base + (p < extra ? 1 : 0)};
}

TensorSharding slice_of(std::string global, std::vector<std::uint64_t> global_shape, std::vector<std::uint64_t> offsets,
                        std::vector<std::uint64_t> lengths) {
  TensorSharding s;
  s.kind = TensorSharding::Kind::slice;
  s.global = std::move(global);
  s.global_shape = std::move(global_shape);
  s.offsets = std::move(offsets);
  s.lengths = std::move(lengths);
  return s;
}

TensorSharding row_slice(std::string global, std::uint64_t rows, std::uint64_t cols, int part, int parts) {
  const SplitRange r = split_range(rows, part, parts);
  return slice_of(std::move(global), {rows, cols}, {r.first, 0}, {r.count, cols});
}

TensorSharding column_slice(std::string global, std::uint64_t rows, std::uint64_t cols, int part, int parts) {
  const SplitRange c = split_range(cols, part, parts);
  return slice_of(std::move(global), {rows, cols}, {0, c.first}, {rows, c.count});
}

TensorSharding replicated(std::vector<int> holders) {
  if (holders.empty()) throw Error(Errc::invalid_argument, {}, "replicated: holders", "at least one rank", "none");
  std::sort(holders.begin(), holders.end());
  holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
  if (holders.front() < 0) throw Error(Errc::invalid_argument, {}, "replicated: holder rank", "non-negative", std::to_string(holders.front()));
  TensorSharding s;
  s.kind = TensorSharding::Kind::replicated;
  s.holders = std::move(holders);
  return s;
}

TensorSharding rank_local() {
  TensorSharding s;
  s.kind = TensorSharding::Kind::rank_local;
  return s;
}

std::string format_index(std::span<const std::uint64_t> index) {
  std::string out = "[";
  for (std::size_t i = 0; i < index.size(); ++i) out += (i ? ", " : "") + std::to_string(index[i]);
  return out + "]";
}

std::uint64_t max_tiling_cells(std::size_t slices) noexcept { return (1ull << 20) + 16ull * slices; }

std::optional<std::string> tiling_problem(std::span<const std::uint64_t> global_shape, std::span<const SliceBox> boxes) {
  const std::size_t nd = global_shape.size();
  const auto rank_of = [](const SliceBox& b) { return "rank " + std::to_string(b.rank); };
  for (const SliceBox& b : boxes) {
    if (b.offsets.size() != nd || b.lengths.size() != nd)
      return "the slice of " + rank_of(b) + " has " + std::to_string(b.offsets.size()) + " offsets and " +
             std::to_string(b.lengths.size()) + " lengths for " + std::to_string(nd) + " dimensions";
    for (std::size_t d = 0; d < nd; ++d) {
      std::uint64_t end;
      if (__builtin_add_overflow(b.offsets[d], b.lengths[d], &end) || end > global_shape[d])
        return "the slice of " + rank_of(b) + " (offsets " + format_index(b.offsets) + ", lengths " + format_index(b.lengths) +
               ") lies outside the global shape in dimension " + std::to_string(d);
    }
  }
  // An empty global tensor: nothing to cover, every (necessarily empty) slice fits.
  for (auto g : global_shape)
    if (g == 0) return std::nullopt;
  // The grid of every slice's cut points: each box is a union of whole cells.
  std::vector<std::vector<std::uint64_t>> cuts(nd);
  std::uint64_t cells = 1;
  for (std::size_t d = 0; d < nd; ++d) {
    auto& c = cuts[d];
    c = {0, global_shape[d]};
    for (const SliceBox& b : boxes)
      if (b.lengths[d] > 0) {
        c.push_back(b.offsets[d]);
        c.push_back(b.offsets[d] + b.lengths[d]);
      }
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
    if (__builtin_mul_overflow(cells, c.size() - 1, &cells) || cells > max_tiling_cells(boxes.size()))
      return "the slices cut the tensor into more than " + std::to_string(max_tiling_cells(boxes.size())) +
             " pieces (too fragmented to check)";
  }
  std::vector<std::int64_t> owner(static_cast<std::size_t>(cells), -1);  // index into boxes
  std::vector<std::size_t> lo(nd), hi(nd), at(nd);
  const auto cell_index = [&](std::span<const std::size_t> idx) {
    std::uint64_t k = 0;
    for (std::size_t d = 0; d < nd; ++d) k = k * (cuts[d].size() - 1) + idx[d];
    return static_cast<std::size_t>(k);
  };
  const auto corner = [&](std::span<const std::size_t> idx) {
    std::vector<std::uint64_t> e(nd);
    for (std::size_t d = 0; d < nd; ++d) e[d] = cuts[d][idx[d]];
    return format_index(e);
  };
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    const SliceBox& b = boxes[i];
    bool empty = false;
    for (std::size_t d = 0; d < nd; ++d) {
      if (b.lengths[d] == 0) empty = true;
      lo[d] = static_cast<std::size_t>(std::lower_bound(cuts[d].begin(), cuts[d].end(), b.offsets[d]) - cuts[d].begin());
      hi[d] = static_cast<std::size_t>(std::lower_bound(cuts[d].begin(), cuts[d].end(), b.offsets[d] + b.lengths[d]) - cuts[d].begin());
    }
    if (empty) continue;
    at = lo;
    // Every cell of the box once (an odometer over its cell ranges); a cell met twice is an
    // overlap, so the work stops after at most `cells` cells in all.
    for (;;) {
      auto& o = owner[cell_index(at)];
      if (o >= 0)
        return "the slices of " + rank_of(boxes[static_cast<std::size_t>(o)]) + " and " + rank_of(b) + " overlap at element " +
               corner(at);
      o = static_cast<std::int64_t>(i);
      std::size_t d = nd;
      while (d > 0 && ++at[d - 1] == hi[d - 1]) {
        at[d - 1] = lo[d - 1];
        --d;
      }
      if (d == 0) break;
    }
  }
  const auto gap = std::find(owner.begin(), owner.end(), -1);
  if (gap != owner.end()) {
    auto k = static_cast<std::uint64_t>(gap - owner.begin());
    for (std::size_t d = nd; d-- > 0;) {
      at[d] = static_cast<std::size_t>(k % (cuts[d].size() - 1));
      k /= cuts[d].size() - 1;
    }
    std::string ranks;
    for (std::size_t i = 0; i < boxes.size() && i < 8; ++i) ranks += (i ? ", " : "") + std::to_string(boxes[i].rank);
    if (boxes.size() > 8) ranks += ", ...";
    return "no slice covers element " + corner(at) + " (slices from ranks " + (ranks.empty() ? "none" : ranks) + ")";
  }
  return std::nullopt;
}

}  // namespace ckpt
