// SPDX-License-Identifier: Apache-2.0
// The simulated training job's state and its per-step compute.
#include <algorithm>
#include <boost/json.hpp>
#include <cstring>

#include "bench.hpp"
#include "ckpt/format/sharding.hpp"

namespace bench {

namespace json = boost::json;
using ckpt::DType;

namespace {

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

TensorSpec spec(std::string name, DType t, std::vector<std::uint64_t> shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return {std::move(name), t, std::move(shape), n * ckpt::dtype_size(t), std::nullopt};
}

// Rank r's part of a global tensor made of `ranks` equal parts along the first dimension.
TensorSpec part(std::string name, DType t, std::vector<std::uint64_t> shape, int r, int ranks) {
  TensorSpec s = spec(name, t, shape);
  std::vector<std::uint64_t> global = shape, offsets(shape.size(), 0);
  global[0] *= static_cast<std::uint64_t>(ranks);
  offsets[0] = shape[0] * static_cast<std::uint64_t>(r);
  s.sharding = ckpt::slice_of(std::move(name), std::move(global), std::move(offsets), std::move(shape));
  return s;
}

}  // namespace

std::vector<std::vector<TensorSpec>> make_layout(std::uint64_t total, int ranks) {
  const std::uint64_t per_rank = total / static_cast<std::uint64_t>(ranks);
  // Many small tensors (layer norms, biases: ~4% of the bytes), two scalars-ish entries (step,
  // RNG state), then a ZeRO-1 shard: bf16 parameters (2 bytes per parameter) and the fp32
  // master weights and Adam moments (4 + 4 + 4 bytes), as a few large 2-D matrices.
  constexpr int kLayers = 32;
  constexpr std::uint64_t kCols = 1024;
  const std::uint64_t small_each = std::max<std::uint64_t>(64, per_rank / 25 / (3 * kLayers) / 4);  // fp32 elements
  std::vector<std::vector<TensorSpec>> out(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& v = out[static_cast<std::size_t>(r)];
    std::uint64_t used = 0;
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      // Sizes vary a little from layer to layer, as real ones do.
      const std::uint64_t d = small_each + static_cast<std::uint64_t>((l * 7) % 5) * 16;
      v.push_back(part(p + "input_norm.weight", DType::F32, {d}, r, ranks));
      v.push_back(part(p + "post_norm.weight", DType::F32, {d}, r, ranks));
      v.push_back(part(p + "mlp.bias", DType::BF16, {d}, r, ranks));
    }
    v.push_back(spec("optimizer.step", DType::I64, {1}));
    v.push_back(spec("rng.state", DType::U8, {5056}));
    v[v.size() - 2].sharding = v.back().sharding = ckpt::rank_local();
    for (const auto& t : v) used += t.bytes;
    const std::uint64_t rest = per_rank > used ? per_rank - used : 0;
    // rest = 14 units: 4 bf16 matrices of 0.5 unit each (2 units), 3 fp32 matrices of 4 units.
    const std::uint64_t unit = rest / 14;
    const std::uint64_t bf16_rows = std::max<std::uint64_t>(1, unit / 2 / (kCols * 2));
    for (int j = 0; j < 4; ++j)
      v.push_back(part("model.blocks." + std::to_string(j) + ".weight", DType::BF16, {bf16_rows, kCols}, r, ranks));
    const std::uint64_t f32_rows = std::max<std::uint64_t>(1, unit * 4 / (kCols * 4));
    v.push_back(part("optimizer.master", DType::F32, {f32_rows, kCols}, r, ranks));
    v.push_back(part("optimizer.exp_avg", DType::F32, {f32_rows, kCols}, r, ranks));
    v.push_back(part("optimizer.exp_avg_sq", DType::F32, {f32_rows, kCols}, r, ranks));
  }
  return out;
}

json::array layout_to_json(const std::vector<std::vector<TensorSpec>>& layout) {
  json::array ranks;
  for (const auto& rank : layout) {
    json::array ts;
    for (const auto& t : rank) {
      json::array shape;
      for (auto d : t.shape) shape.push_back(d);
      ts.push_back(json::object{{"name", t.name}, {"dtype", std::string(ckpt::dtype_name(t.dtype))}, {"shape", shape}, {"bytes", t.bytes}});
    }
    ranks.push_back(std::move(ts));
  }
  return ranks;
}

RankState::RankState(const std::vector<TensorSpec>& specs, std::uint64_t seed) {
  std::uint64_t off = 0;
  for (const auto& t : specs) {
    offsets_.push_back(off);
    off += (t.bytes + 63) / 64 * 64;
    bytes_ += t.bytes;
  }
  buf_ = ckpt::AlignedBuffer(static_cast<std::size_t>(std::max<std::uint64_t>(off, 1)));
  auto* words = reinterpret_cast<std::uint64_t*>(buf_.data());
  for (std::size_t i = 0; i < buf_.capacity() / 8; ++i) words[i] = splitmix(seed);
  for (std::size_t i = 0; i < specs.size(); ++i)
    views_.push_back({specs[i].name, specs[i].dtype, specs[i].shape,
                      std::span<const std::byte>(buf_.data() + offsets_[i], static_cast<std::size_t>(specs[i].bytes)), specs[i].sharding});
}

void RankState::mutate(std::uint64_t step) {
  for (std::size_t i = 0; i < views_.size(); ++i) {
    if (views_[i].name == "optimizer.step") std::memcpy(buf_.data() + offsets_[i], &step, sizeof step);
    if (views_[i].name == "rng.state") {
      std::uint64_t s = step;
      const std::uint64_t w = splitmix(s);
      std::memcpy(buf_.data() + offsets_[i], &w, sizeof w);
    }
  }
}

Compute::Compute(double mb) {
  const auto n = static_cast<std::size_t>(std::max(1.0, mb * 1024 * 1024 / 2 / sizeof(float)));
  x_.resize(n);
  y_.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    x_[i] = static_cast<float>(i % 1000) * 0.001f;
    y_[i] = 1.0f;
  }
}

double Compute::run(int passes) {
  const std::size_t n = y_.size();
  float* y = y_.data();
  const float* x = x_.data();
  for (int p = 0; p < passes; ++p)
    for (std::size_t i = 0; i < n; ++i) y[i] = 0.999f * y[i] + 0.001f * x[i];
  return static_cast<double>(y[0]) + static_cast<double>(y[n / 2]) + static_cast<double>(y[n - 1]);
}

}  // namespace bench
