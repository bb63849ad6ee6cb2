// SPDX-License-Identifier: Apache-2.0
#include "ckpt/read/slice_load.hpp"

#include <algorithm>
#include <map>
#include <functional>
#include <set>

#include "ckpt/core/error.hpp"
#include "ckpt/read/flat_layout.hpp"

namespace ckpt {

std::vector<std::size_t> GlobalTensor::split_dims() const {
  std::vector<std::size_t> out;
  for (std::size_t d = 0; d < shape.size(); ++d)
    for (const Piece& p : pieces)
      if (p.record->shape[d] != shape[d]) {
        out.push_back(d);
        break;
      }
  return out;
}

std::vector<GlobalTensor> global_tensors(const Manifest& m, std::string_view file) {
  std::map<std::string, GlobalTensor> out;
  std::map<std::string_view, int> plain_ranks;  // undescribed names: on how many ranks
  for (const auto& t : m.tensors)
    if (!t.sharding) ++plain_ranks[t.name];
  // Flat ZeRO tensors without descriptions: the flat space's ranges, as 1-D slices. Those
  // training.flat_tensors names, and any undescribed tensor of one name on every rank (of
  // several) that is 1-D with its rank's param_shard_numel elements (what a save that fills
  // param_shard_offset / numel, as the README's does, means), if the ranges tile the space.
  std::set<std::string> flat;
  if (m.training.contains("flat_tensors")) {
    const FlatLayout layout = flat_layout(m, file);
    for (const auto& n : layout.tensors) {
      bool described = false;
      for (const auto& t : m.tensors) described = described || (t.name == n && t.sharding);
      if (!described) flat.insert(n);
    }
  } else if (m.world_size > 1 && m.param_numel > 0) {
    std::map<std::string_view, std::vector<const TensorRecord*>> same;
    for (const auto& t : m.tensors)
      if (!t.sharding && plain_ranks[t.name] == m.world_size) same[t.name].push_back(&t);
    for (const auto& [name, ts] : same) {
      std::vector<SliceBox> boxes;
      std::vector<std::vector<std::uint64_t>> offs;
      offs.reserve(ts.size());
      bool fits = true;
      for (const TensorRecord* t : ts) {
        const ShardRecord& s = m.rank_record(t->rank);
        fits = fits && t->dtype == ts.front()->dtype && t->shape == std::vector<std::uint64_t>{s.param_shard_numel};
        offs.push_back({s.param_shard_offset});
      }
      if (!fits) continue;
      for (std::size_t i = 0; i < ts.size(); ++i) boxes.push_back({ts[i]->rank, offs[i], ts[i]->shape});
      const std::vector<std::uint64_t> space{m.param_numel};
      if (!tiling_problem(space, boxes)) flat.insert(std::string(name));
    }
  }
  for (const auto& t : m.tensors) {
    if (t.sharding && t.sharding->kind == TensorSharding::Kind::slice) {
      GlobalTensor& g = out[t.sharding->global];
      g.name = t.sharding->global;
      g.dtype = t.dtype;
      g.shape = t.sharding->global_shape;
      g.origin = GlobalTensor::Origin::sliced;
      g.pieces.push_back({&t, t.sharding->offsets});
    } else if (!t.sharding && flat.count(t.name)) {
      GlobalTensor& g = out[t.name];
      g.name = t.name;
      g.dtype = t.dtype;
      g.shape = {m.param_numel};
      g.origin = GlobalTensor::Origin::flat;
      const ShardRecord& s = m.rank_record(t.rank);
      if (t.shape != std::vector<std::uint64_t>{s.param_shard_numel} || (!g.pieces.empty() && g.pieces.front().record->dtype != t.dtype))
        throw Error(Errc::malformed_manifest, std::string(file), "flat tensor '" + t.name + "' of rank " + std::to_string(t.rank),
                    "1-D of param_shard_numel " + std::to_string(s.param_shard_numel) + " elements, one dtype on every rank",
                    format_index(t.shape) + " " + std::string(dtype_name(t.dtype)));
      g.pieces.push_back({&t, {s.param_shard_offset}});
    }
  }
  // The flat tensors' tiling is not part of the schema 1 manifest checks: checked here.
  for (const auto& n : flat) {
    const auto it = out.find(n);
    if (it == out.end()) continue;
    std::vector<SliceBox> boxes;
    for (const auto& p : it->second.pieces) boxes.push_back({p.record->rank, p.offsets, p.record->shape});
    if (auto problem = tiling_problem(it->second.shape, boxes))
      throw Error(Errc::malformed_manifest, std::string(file), "slices of flat tensor '" + n + "' (param_shard_offset, param_shard_numel)",
                  "slices that tile [" + std::to_string(m.param_numel) + "] exactly", *problem);
  }
  for (const auto& t : m.tensors) {
    const bool rep = t.sharding && t.sharding->kind == TensorSharding::Kind::replicated;
    const bool single = !t.sharding && !flat.count(t.name) && plain_ranks[t.name] == 1;
    if ((!rep && !single) || out.count(t.name)) continue;
    GlobalTensor& g = out[t.name];
    g.name = t.name;
    g.dtype = t.dtype;
    g.shape = t.shape;
    g.origin = rep ? GlobalTensor::Origin::replicated : GlobalTensor::Origin::single;
    g.pieces.push_back({&t, std::vector<std::uint64_t>(t.shape.size(), 0)});
  }
  std::vector<GlobalTensor> v;
  v.reserve(out.size());
  for (auto& [name, g] : out) v.push_back(std::move(g));
  return v;
}

namespace {
std::vector<std::uint64_t> strides_of(std::span<const std::uint64_t> shape) {
  std::vector<std::uint64_t> s(shape.size(), 1);
  for (std::size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}
}  // namespace

std::vector<SliceRun> plan_slice_reads(std::span<const GlobalTensor> globals, std::span<const SliceTarget> targets, std::string_view file) {
  std::vector<SliceRun> runs;
  for (std::size_t ti = 0; ti < targets.size(); ++ti) {
    const SliceTarget& tg = targets[ti];
    const auto git = std::lower_bound(globals.begin(), globals.end(), tg.global,
                                      [](const GlobalTensor& g, const std::string& n) { return g.name < n; });
    if (git == globals.end() || git->name != tg.global)
      throw Error(Errc::not_found, std::string(file), "no global tensor '" + tg.global + "' in the checkpoint");
    const GlobalTensor& g = *git;
    const std::string what = "target of global tensor '" + g.name + "'";
    if (tg.dtype != g.dtype && !tg.convert)
      throw Error(Errc::invalid_argument, std::string(file), "dtype of the " + what + " (no conversion on load unless asked)",
                  std::string(dtype_name(g.dtype)), std::string(dtype_name(tg.dtype)));
    if (tg.dtype != g.dtype && (!dtype_is_float(tg.dtype) || !dtype_is_float(g.dtype)))
      throw Error(Errc::invalid_argument, std::string(file), "dtype conversion of the " + what + " (float types only)",
                  "F16, BF16, F32 or F64 on both sides", std::string(dtype_name(g.dtype)) + " to " + std::string(dtype_name(tg.dtype)));
    const std::size_t nd = g.shape.size();
    const bool whole = tg.offsets.empty() && tg.lengths.empty();
    const std::vector<std::uint64_t> to = whole ? std::vector<std::uint64_t>(nd, 0) : tg.offsets;
    const std::vector<std::uint64_t> tl = whole ? g.shape : tg.lengths;
    if (to.size() != nd || tl.size() != nd)
      throw Error(Errc::invalid_argument, std::string(file), "dimensions of the " + what + " " + format_index(g.shape),
                  std::to_string(nd) + " offsets and lengths", std::to_string(to.size()) + " offsets, " + std::to_string(tl.size()) + " lengths");
    std::uint64_t numel = 1;
    for (std::size_t d = 0; d < nd; ++d) {
      std::uint64_t end;
      if (__builtin_add_overflow(to[d], tl[d], &end) || end > g.shape[d])
        throw Error(Errc::invalid_argument, std::string(file), "box of the " + what, "within its shape " + format_index(g.shape),
                    "offsets " + format_index(to) + ", lengths " + format_index(tl));
      numel *= tl[d];
    }
    check_size(numel * dtype_size(tg.dtype), tg.out.size(), "size of the " + what, std::string(file));
    if (numel == 0) continue;
    const auto tstride = strides_of(tl);
    for (const GlobalTensor::Piece& p : g.pieces) {
      const auto& so = p.offsets;
      const auto& sl = p.record->shape;
      std::vector<std::uint64_t> lo(nd), hi(nd);
      bool empty = false;
      for (std::size_t d = 0; d < nd; ++d) {
        lo[d] = std::max(so[d], to[d]);
        hi[d] = std::min(so[d] + sl[d], to[d] + tl[d]);
        if (lo[d] >= hi[d]) empty = true;
      }
      if (empty) continue;
      // Dimensions after k are whole in the source and the target: a run spans them and
      // dimension k's overlap.
      std::size_t k = nd == 0 ? 0 : nd - 1;
      const auto full = [&](std::size_t d) { return lo[d] == so[d] && hi[d] == so[d] + sl[d] && lo[d] == to[d] && hi[d] == to[d] + tl[d]; };
      while (k > 0 && full(k)) --k;
      const auto sstride = strides_of(sl);
      std::uint64_t run = 1;
      for (std::size_t d = k; d < nd; ++d) run *= hi[d] - lo[d];
      std::vector<std::uint64_t> at = lo;
      for (;;) {
        std::uint64_t s = 0, o = 0;
        for (std::size_t d = 0; d < nd; ++d) {
          s += (at[d] - so[d]) * sstride[d];
          o += (at[d] - to[d]) * tstride[d];
        }
        if (!runs.empty() && runs.back().target == ti && runs.back().record == p.record &&
            runs.back().source_first + runs.back().count == s && runs.back().out_first + runs.back().count == o)
          runs.back().count += run;
        else
          runs.push_back({ti, p.record, s, run, o});
        std::size_t d = k;
        while (d > 0 && ++at[d - 1] == hi[d - 1]) {
          at[d - 1] = lo[d - 1];
          --d;
        }
        if (d == 0) break;
      }
    }
  }
  return runs;
}

std::vector<SliceBox64> boxes_of_range(std::span<const std::uint64_t> shape, std::uint64_t first, std::uint64_t count) {
  std::vector<SliceBox64> out;
  const std::size_t nd = shape.size();
  if (count == 0) return out;
  if (nd == 0) {
    out.push_back({});
    return out;
  }
  std::vector<std::uint64_t> inner(nd, 1);  // elements of one index of dimension d
  for (std::size_t d = nd - 1; d > 0; --d) inner[d - 1] = inner[d] * shape[d];
  // Elements [first, first + count) of the sub-tensor at `base` (dimensions before d fixed).
  const auto emit = [&](std::vector<std::uint64_t> base, std::size_t d, std::uint64_t lo, std::uint64_t n) {
    SliceBox64 b;
    b.offsets = std::move(base);
    b.lengths.assign(b.offsets.size(), 1);
    b.offsets.push_back(lo);
    b.lengths.push_back(n);
    for (std::size_t e = d + 1; e < nd; ++e) {
      b.offsets.push_back(0);
      b.lengths.push_back(shape[e]);
    }
    out.push_back(std::move(b));
  };
  const std::function<void(std::vector<std::uint64_t>, std::size_t, std::uint64_t, std::uint64_t)> rec =
      [&](std::vector<std::uint64_t> base, std::size_t d, std::uint64_t f, std::uint64_t n) {
        if (n == 0) return;
        const std::uint64_t in = inner[d];
        if (f % in != 0) {  // the partial index at the start
          const std::uint64_t take = std::min(n, in - f % in);
          auto b = base;
          b.push_back(f / in);
          rec(std::move(b), d + 1, f % in, take);
          f += take;
          n -= take;
        }
        if (n / in > 0) {  // whole indices of dimension d
          emit(base, d, f / in, n / in);
          f += n / in * in;
          n -= n / in * in;
        }
        if (n > 0) {  // the partial index at the end
          base.push_back(f / in);
          rec(std::move(base), d + 1, 0, n);
        }
      };
  rec({}, 0, first, count);
  return out;
}

LoadReport load_slices(const CheckpointReader& checkpoint, std::span<const SliceTarget> targets, Verify mode, const LoadOptions& options) {
  const std::string file = checkpoint.manifest_path();
  return load_slices(checkpoint, global_tensors(checkpoint.manifest(), file), targets, mode, options);
}

LoadReport load_slices(const CheckpointReader& checkpoint, std::span<const GlobalTensor> globals, std::span<const SliceTarget> targets,
                       Verify mode, const LoadOptions& options) {
  const std::string file = checkpoint.manifest_path();
  const auto runs = plan_slice_reads(globals, targets, file);
  // A converting target is read in its stored dtype into a temporary, converted after.
  std::vector<std::vector<std::byte>> staged(targets.size());
  std::vector<DType> stored(targets.size(), DType::U8);
  for (const SliceRun& r : runs) stored[r.target] = r.record->dtype;
  for (std::size_t i = 0; i < targets.size(); ++i)
    if (targets[i].dtype != stored[i] && !targets[i].out.empty())
      staged[i].resize(targets[i].out.size() / dtype_size(targets[i].dtype) * dtype_size(stored[i]));
  std::map<int, std::vector<LoadTarget>> by_rank;
  for (const SliceRun& r : runs) {
    const std::uint64_t es = dtype_size(r.record->dtype);
    const std::span<std::byte> out = staged[r.target].empty() ? targets[r.target].out : std::span<std::byte>(staged[r.target]);
    by_rank[r.record->rank].push_back({r.record->name, out.subspan(static_cast<std::size_t>(r.out_first * es), static_cast<std::size_t>(r.count * es)),
                                       r.record->dtype, r.record->shape, r.source_first, r.count});
  }
  std::vector<RankLoad> loads;
  for (const auto& [rank, t] : by_rank) loads.push_back({rank, t});
  if (loads.empty()) return {};
  LoadReport report = load_into(checkpoint, loads, mode, options);
  for (std::size_t i = 0; i < targets.size(); ++i)
    if (!staged[i].empty()) convert_floats(stored[i], staged[i], targets[i].dtype, targets[i].out);
  return report;
}

}  // namespace ckpt
