// SPDX-License-Identifier: Apache-2.0
#include "ckpt/shard/sharded_save.hpp"

#include <algorithm>

#include "ckpt/core/error.hpp"

namespace ckpt {

namespace {
void check_description(int rank, int world, const TensorView& t) {
  const TensorSharding& s = *t.sharding;
  const auto fail = [&](const std::string& what, const std::string& expected, const std::string& actual) {
    throw Error(Errc::invalid_argument, {}, "tensor '" + t.name + "' of rank " + std::to_string(rank) + ": " + what, expected, actual);
  };
  switch (s.kind) {
    case TensorSharding::Kind::slice:
      if (s.global.empty() || s.global == "__metadata__") fail("slice global name", "non-empty, not __metadata__", "'" + s.global + "'");
      if (s.offsets.size() != s.global_shape.size() || s.lengths.size() != s.global_shape.size())
        fail("slice dimensions", std::to_string(s.global_shape.size()) + " offsets and lengths",
             std::to_string(s.offsets.size()) + " offsets, " + std::to_string(s.lengths.size()) + " lengths");
      if (s.lengths != t.shape) fail("slice lengths", "the tensor's shape " + format_index(t.shape), format_index(s.lengths));
      for (std::size_t d = 0; d < s.global_shape.size(); ++d) {
        std::uint64_t end;
        if (__builtin_add_overflow(s.offsets[d], s.lengths[d], &end) || end > s.global_shape[d])
          fail("slice", "offsets + lengths within the global shape " + format_index(s.global_shape),
               "offsets " + format_index(s.offsets) + ", lengths " + format_index(s.lengths));
      }
      break;
    case TensorSharding::Kind::replicated:
      if (s.holders.empty() || !std::is_sorted(s.holders.begin(), s.holders.end()) ||
          std::adjacent_find(s.holders.begin(), s.holders.end()) != s.holders.end())
        fail("replicated holders", "ascending ranks, each once (ckpt::replicated builds them)", std::to_string(s.holders.size()) + " ranks");
      if (s.holders.front() < 0 || s.holders.back() >= world)
        fail("replicated holders", "ranks 0.." + std::to_string(world - 1), std::to_string(s.holders.front()) + ".." + std::to_string(s.holders.back()));
      if (!std::binary_search(s.holders.begin(), s.holders.end(), rank)) fail("replicated holders", "include the saving rank", "they do not");
      break;
    case TensorSharding::Kind::rank_local: break;
  }
}
}  // namespace

std::vector<TensorView> tensors_to_write(int rank, int world, std::span<const TensorView> tensors) {
  std::vector<TensorView> out;
  out.reserve(tensors.size());
  for (const TensorView& t : tensors) {
    if (t.sharding) {
      check_description(rank, world, t);
      if (t.sharding->kind == TensorSharding::Kind::replicated && t.sharding->holders.front() != rank) continue;
    }
    out.push_back(t);
  }
  return out;
}

ShardingByName sharding_by_name(std::span<const TensorView> tensors) {
  ShardingByName out;
  for (const TensorView& t : tensors)
    if (t.sharding) out.emplace_back(t.name, *t.sharding);
  return out;
}

void attach_sharding(std::vector<TensorRecord>& records, const ShardingByName& by_name) {
  for (const auto& [name, s] : by_name)
    for (auto& r : records)
      if (r.name == name) r.sharding = s;
}

}  // namespace ckpt
