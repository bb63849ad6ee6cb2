// SPDX-License-Identifier: Apache-2.0
// Tensor-parallel attention heads (gpt's TensorParallel hook) against the single-rank model,
// over real communicators split from a thread group.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/train/gpt.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::train;

namespace {

GptConfig tp_config() {
  return GptConfig{.vocab = 16, .seq = 8, .dim = 16, .heads = 4, .layers = 2, .batch = 2};
}

// Parameters away from init (weights large enough that attention is far from uniform), from
// a fixed LCG so the test does not depend on init_params.
std::vector<float> spread_params(const GptConfig& cfg) {
  std::vector<float> p(num_params(cfg));
  std::uint64_t s = 42;
  for (float& x : p) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-53 - 0.5);
  }
  return p;
}

struct Batch {
  std::vector<std::int32_t> tokens, targets;
};

Batch fixed_batch(const GptConfig& cfg) {
  Batch b;
  for (int i = 0; i < cfg.batch * cfg.seq; ++i) {
    b.tokens.push_back((i * 7 + 3) % cfg.vocab);
    b.targets.push_back((i * 5 + 1) % cfg.vocab);
  }
  return b;
}

struct Result {
  float loss = 0;
  std::vector<float> grads;
};

Result single_rank(const GptConfig& cfg, const std::vector<float>& params, const Batch& b) {
  GptWorkspace ws(cfg);
  Result r;
  r.loss = gpt_forward(cfg, params, b.tokens, b.targets, ws);
  r.grads.assign(params.size(), 0.0f);
  gpt_backward(cfg, params, b.tokens, b.targets, ws, r.grads);
  return r;
}

// Every rank of a world of `tp` ranks runs the same batch with its share of the heads.
std::vector<Result> tensor_parallel(const GptConfig& cfg, int tp, const std::vector<float>& params,
                                    const Batch& b) {
  std::vector<Result> out(static_cast<std::size_t>(tp));
  dist::run_ranks(tp, [&](dist::Communicator& world) {
    const auto group = world.split(0, world.rank());
    const TensorParallel hook{group->rank(), group->size(),
                              [&](std::span<float> s) { group->all_reduce(s, dist::ReduceOp::sum); }};
    GptWorkspace ws(cfg, tp);
    Result& r = out[static_cast<std::size_t>(world.rank())];
    r.loss = gpt_forward(cfg, params, b.tokens, b.targets, ws, hook);
    r.grads.assign(params.size(), 0.0f);
    gpt_backward(cfg, params, b.tokens, b.targets, ws, r.grads, 1.0f, hook);
  });
  return out;
}

}  // namespace

TEST_CASE("tensor-parallel heads match the single-rank loss and gradients within float noise") {
  // Not bitwise: the attention output and the gradient of its input are sums of per-rank
  // partial sums, added in another order than the single rank's one running sum (and the
  // projection bias joins at another point). The differences are a few fp32 ulps of values
  // of order 1, so 1e-5 relative to the largest gradient is a wide margin that a missing or
  // doubled head (an error of order 1) could never meet.
  const GptConfig cfg = tp_config();
  const auto params = spread_params(cfg);
  const Batch b = fixed_batch(cfg);
  const Result ref = single_rank(cfg, params, b);
  double gmax = 0;
  for (float g : ref.grads) gmax = std::max(gmax, std::abs(double(g)));
  REQUIRE(gmax > 0.01);
  for (int tp : {2, 4}) {
    CAPTURE(tp);
    const auto ranks = tensor_parallel(cfg, tp, params, b);
    CHECK(std::abs(ranks[0].loss - ref.loss) <= 1e-5 * ref.loss);
    double max_diff = 0;
    for (std::size_t i = 0; i < ref.grads.size(); ++i)
      max_diff = std::max(max_diff, std::abs(double(ranks[0].grads[i]) - ref.grads[i]));
    MESSAGE("tp " << tp << ": loss " << ranks[0].loss << " vs " << ref.loss
                  << ", max |grad difference| " << max_diff << " of max |grad| " << gmax);
    CHECK(max_diff <= 1e-5 * gmax);
    // Every rank of the group ends with the same bits: ZeRO may then average them.
    for (const Result& r : ranks) {
      CHECK(r.loss == ranks[0].loss);
      CHECK(r.grads == ranks[0].grads);
    }
  }
}

TEST_CASE("tensor parallelism divides the attention activations by the group size") {
  const GptConfig cfg = tp_config();
  const std::size_t B = 2, T = 8, C = 16, NH = 4, L = 2;
  // qkv (3C), attention output (C) and the two [NH, T, T] score tensors, in activations and
  // in their gradients.
  const std::size_t attention_floats = 2 * L * (B * T * 4 * C + 2 * B * NH * T * T);
  const std::size_t whole = GptWorkspace(cfg).bytes();
  CHECK(whole - GptWorkspace(cfg, 2).bytes() == attention_floats / 2 * sizeof(float));
  CHECK(whole - GptWorkspace(cfg, 4).bytes() == attention_floats * 3 / 4 * sizeof(float));
}

TEST_CASE("tensor-parallel arguments are checked before anything is computed") {
  const GptConfig cfg = tp_config();
  const auto params = spread_params(cfg);
  const Batch b = fixed_batch(cfg);
  CHECK(test::expect_error([&] { GptWorkspace ws(cfg, 3); }).code() == Errc::invalid_argument);  // 3 does not divide 4 heads
  CHECK(test::expect_error([&] { GptWorkspace ws(cfg, 0); }).code() == Errc::invalid_argument);
  GptWorkspace ws(cfg, 2);
  const auto sum = [](std::span<float>) {};
  CHECK(test::expect_error([&] { gpt_forward(cfg, params, b.tokens, b.targets, ws); }).code() == Errc::invalid_argument);  // size 1 on a size-2 workspace
  CHECK(test::expect_error([&] { gpt_forward(cfg, params, b.tokens, b.targets, ws, {2, 2, sum}); }).code() == Errc::invalid_argument);
  CHECK(test::expect_error([&] { gpt_forward(cfg, params, b.tokens, b.targets, ws, {0, 2, {}}); }).code() == Errc::invalid_argument);
  // A forward as rank 0 then a backward as rank 1 would mix two ranks' heads.
  gpt_forward(cfg, params, b.tokens, b.targets, ws, {0, 2, sum});
  std::vector<float> grads(params.size(), 0.0f);
  const Error e = test::expect_error([&] { gpt_backward(cfg, params, b.tokens, b.targets, ws, grads, 1.0f, {1, 2, sum}); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "0");
  CHECK(e.actual() == "1");
  CHECK(std::all_of(grads.begin(), grads.end(), [](float g) { return g == 0.0f; }));
}
