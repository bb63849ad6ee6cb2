// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <new>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/train/data.hpp"
#include "ckpt/train/gpt.hpp"

using namespace ckpt;
using namespace ckpt::train;

// Counts every global operator new in this test executable, so a test can assert that the
// training hot path does not allocate.
namespace {
std::atomic<std::size_t> g_allocations{0};
}  // namespace
// noinline: once inlined, GCC 12 pairs a new-expression with the free() inside and warns
// (-Wmismatched-new-delete) although new and delete are replaced together.
[[gnu::noinline]] void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
// Every other form too: one left to the runtime (std::stable_sort's nothrow temporary
// buffer, say) would be allocated by the sanitizer's operator new and freed by the free()
// above, which ASan reports as an alloc-dealloc mismatch.
[[gnu::noinline]] void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
[[gnu::noinline]] void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
[[gnu::noinline]] void* operator new[](std::size_t n) { return ::operator new(n); }
[[gnu::noinline]] void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return ::operator new(n, t); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

// The small config of the gradient checks: big enough to exercise every code path (several
// heads, two blocks, several sequences), small enough that a double-precision reference
// forward per perturbed entry is cheap. batch*seq == vocab so tokens can cover every wte row.
GptConfig small_config() {
  return GptConfig{.vocab = 16, .seq = 8, .dim = 16, .heads = 4, .layers = 2, .batch = 2};
}

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double uniform(std::uint64_t& s) { return static_cast<double>(splitmix(s) >> 11) * 0x1.0p-53; }

// Parameters away from init (LayerNorm weights != 1, biases != 0, weights large enough that
// attention is far from uniform), so no gradient term hides behind a special value.
std::vector<float> random_params(const GptConfig& cfg, std::uint64_t seed) {
  std::vector<float> p(num_params(cfg));
  std::uint64_t s = seed;
  for (const ParamTensor& t : param_layout(cfg)) {
    const bool ln_weight = t.name.ends_with("ln1.w") || t.name.ends_with("ln2.w") ||
                           t.name == "lnf.w";
    for (std::size_t i = 0; i < t.numel; ++i) {
      const double u = 2.0 * uniform(s) - 1.0;  // uniform in [-1, 1)
      p[t.offset + i] = static_cast<float>(ln_weight ? 1.0 + 0.2 * u : 0.5 * u);
    }
  }
  return p;
}

struct Batch {
  std::vector<std::int32_t> tokens, targets;
};

// Tokens are a permutation of the vocabulary when batch*seq == vocab (every wte row is used).
Batch random_batch(const GptConfig& cfg, std::uint64_t seed) {
  const std::size_t n = static_cast<std::size_t>(cfg.batch) * cfg.seq;
  Batch b{std::vector<std::int32_t>(n), std::vector<std::int32_t>(n)};
  std::uint64_t s = seed;
  for (std::size_t i = 0; i < n; ++i) {
    b.tokens[i] = static_cast<std::int32_t>(i % cfg.vocab);
    b.targets[i] = static_cast<std::int32_t>(splitmix(s) % cfg.vocab);
  }
  for (std::size_t i = n; i > 1; --i) std::swap(b.tokens[i - 1], b.tokens[splitmix(s) % i]);
  return b;
}

std::vector<float> grads_of(const GptConfig& cfg, const std::vector<float>& params,
                            const Batch& b, float loss_scale = 1.0f) {
  GptWorkspace ws(cfg);
  std::vector<float> g(params.size(), 0.0f);
  gpt_forward(cfg, params, b.tokens, b.targets, ws);
  gpt_backward(cfg, params, b.tokens, b.targets, ws, g, loss_scale);
  return g;
}

// ---------------------------------------------------------------------------------------------
// An independent reference: the same model written out naively from the tensor names and the
// documented semantics, in double precision. It shares no code with gpt.cpp, so it checks the
// forward (causal mask, head split, GELU, LayerNorm, layout) and, through finite differences,
// the backward.

struct RefModel {
  const GptConfig& cfg;
  std::map<std::string, std::size_t> offset;

  explicit RefModel(const GptConfig& c) : cfg(c) {
    for (const ParamTensor& t : param_layout(c)) offset[t.name] = t.offset;
  }

  double loss(const std::vector<double>& p, const Batch& batch) const {
    const int B = cfg.batch, T = cfg.seq, C = cfg.dim, NH = cfg.heads, V = cfg.vocab;
    const int hs = C / NH;
    auto W = [&](const std::string& name) { return p.data() + offset.at(name); };
    using Vec = std::vector<double>;
    auto layernorm = [&](const Vec& x, const double* w, const double* b) {
      double m = 0, v = 0;
      for (double e : x) m += e;
      m /= C;
      for (double e : x) v += (e - m) * (e - m);
      v /= C;
      Vec y(C);
      for (int i = 0; i < C; ++i) y[i] = (x[i] - m) / std::sqrt(v + 1e-5) * w[i] + b[i];
      return y;
    };
    auto linear = [&](const Vec& x, const double* w, const double* b, int out) {
      const int in = static_cast<int>(x.size());
      Vec y(out);
      for (int o = 0; o < out; ++o) {
        double acc = b ? b[o] : 0.0;
        for (int i = 0; i < in; ++i) acc += w[o * in + i] * x[i];
        y[o] = acc;
      }
      return y;
    };
    auto gelu = [](double x) {
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
    };

    double total = 0.0;
    for (int b = 0; b < B; ++b) {
      std::vector<Vec> x(T, Vec(C));
      for (int t = 0; t < T; ++t) {
        const int tok = batch.tokens[b * T + t];
        for (int i = 0; i < C; ++i) x[t][i] = W("wte")[tok * C + i] + W("wpe")[t * C + i];
      }
      for (int l = 0; l < cfg.layers; ++l) {
        std::string h = std::to_string(l);
        h.insert(h.begin(), 'h');
        h += '.';
        std::vector<Vec> qkv(T);
        for (int t = 0; t < T; ++t) {
          qkv[t] = linear(layernorm(x[t], W(h + "ln1.w"), W(h + "ln1.b")), W(h + "attn.qkv.w"),
                          W(h + "attn.qkv.b"), 3 * C);
        }
        for (int t = 0; t < T; ++t) {
          Vec y(C, 0.0);
          for (int head = 0; head < NH; ++head) {
            Vec score(t + 1);
            double mx = -1e300;
            for (int t2 = 0; t2 <= t; ++t2) {  // causal: only positions up to t
              double dot = 0;
              for (int i = 0; i < hs; ++i) dot += qkv[t][head * hs + i] * qkv[t2][C + head * hs + i];
              score[t2] = dot / std::sqrt(static_cast<double>(hs));
              mx = std::max(mx, score[t2]);
            }
            double z = 0;
            for (double& s : score) z += (s = std::exp(s - mx));
            for (int t2 = 0; t2 <= t; ++t2) {
              for (int i = 0; i < hs; ++i) {
                y[head * hs + i] += score[t2] / z * qkv[t2][2 * C + head * hs + i];
              }
            }
          }
          const Vec proj = linear(y, W(h + "attn.proj.w"), W(h + "attn.proj.b"), C);
          for (int i = 0; i < C; ++i) x[t][i] += proj[i];  // x[t] no longer read by later t
        }
        // Attention read x only through qkv, computed before the loop, so updating x in place
        // above is safe.
        for (int t = 0; t < T; ++t) {
          Vec f = linear(layernorm(x[t], W(h + "ln2.w"), W(h + "ln2.b")), W(h + "mlp.fc.w"),
                         W(h + "mlp.fc.b"), 4 * C);
          for (double& e : f) e = gelu(e);
          const Vec proj = linear(f, W(h + "mlp.proj.w"), W(h + "mlp.proj.b"), C);
          for (int i = 0; i < C; ++i) x[t][i] += proj[i];
        }
      }
      for (int t = 0; t < T; ++t) {
        const Vec logits =
            linear(layernorm(x[t], W("lnf.w"), W("lnf.b")), W("lm_head.w"), nullptr, V);
        const double mx = *std::max_element(logits.begin(), logits.end());
        double z = 0;
        for (double e : logits) z += std::exp(e - mx);
        total += mx + std::log(z) - logits[batch.targets[b * T + t]];
      }
    }
    return total / (B * T);
  }
};

template <class F>
void check_invalid(F&& f) {
  try {
    f();
    FAIL("expected ckpt::Error(invalid_argument)");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
  }
}

}  // namespace

TEST_CASE("param_layout tiles the flat buffer in order without holes or overlaps") {
  for (const GptConfig& cfg : {GptConfig{}, small_config(), GptConfig{.layers = 3}}) {
    const auto layout = param_layout(cfg);
    REQUIRE(layout.size() == 2 + 12 * static_cast<std::size_t>(cfg.layers) + 3);
    std::size_t next = 0;
    std::set<std::string> names;
    for (const ParamTensor& t : layout) {
      CHECK(t.offset == next);
      std::size_t numel = 1;
      for (std::int64_t d : t.shape) numel *= static_cast<std::size_t>(d);
      CHECK(t.numel == numel);
      CHECK(t.numel > 0);
      CHECK(names.insert(t.name).second);
      next = t.offset + t.numel;
    }
    CHECK(next == num_params(cfg));
    CHECK(layout.front().name == "wte");
    CHECK(layout.back().name == "lm_head.w");
  }
  const auto layout = param_layout(GptConfig{});
  std::vector<std::string> names;
  for (const auto& t : layout) names.push_back(t.name);
  const std::vector<std::string> expected = {
      "wte", "wpe",
      "h0.ln1.w", "h0.ln1.b", "h0.attn.qkv.w", "h0.attn.qkv.b", "h0.attn.proj.w", "h0.attn.proj.b",
      "h0.ln2.w", "h0.ln2.b", "h0.mlp.fc.w", "h0.mlp.fc.b", "h0.mlp.proj.w", "h0.mlp.proj.b",
      "h1.ln1.w", "h1.ln1.b", "h1.attn.qkv.w", "h1.attn.qkv.b", "h1.attn.proj.w", "h1.attn.proj.b",
      "h1.ln2.w", "h1.ln2.b", "h1.mlp.fc.w", "h1.mlp.fc.b", "h1.mlp.proj.w", "h1.mlp.proj.b",
      "lnf.w", "lnf.b", "lm_head.w"};
  CHECK(names == expected);
  CHECK(layout[4].shape == std::vector<std::int64_t>{96, 32});   // h0.attn.qkv.w [3C, C]
  CHECK(layout[12].shape == std::vector<std::int64_t>{32, 128});  // h0.mlp.proj.w [C, 4C]
}

TEST_CASE("default config has 30080 parameters") {
  const GptConfig cfg;
  const std::size_t V = 64, T = 16, C = 32, L = 2;
  const std::size_t per_block = 12 * C * C + 13 * C;
  const std::size_t expected = V * C + T * C + L * per_block + 2 * C + V * C;
  MESSAGE("default GptConfig (vocab 64, seq 16, dim 32, heads 4, layers 2): " << num_params(cfg)
          << " parameters, " << 12 * num_params(cfg) << " bytes of fp32 master + Adam m, v");
  CHECK(num_params(cfg) == expected);
  CHECK(num_params(cfg) == 30080);
}

TEST_CASE("init_params is deterministic per seed and differs across seeds") {
  const GptConfig cfg;
  std::vector<float> a(num_params(cfg)), b(a.size()), c(a.size());
  init_params(cfg, 7, a);
  init_params(cfg, 7, b);
  init_params(cfg, 8, c);
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  std::size_t random_entries = 0, differing = 0;
  for (const ParamTensor& t : param_layout(cfg)) {
    if (t.name.ends_with(".b") || t.name.ends_with("ln1.w") || t.name.ends_with("ln2.w") ||
        t.name == "lnf.w") {
      continue;  // constants by design
    }
    for (std::size_t i = t.offset; i < t.offset + t.numel; ++i) {
      ++random_entries;
      differing += a[i] != c[i];
    }
  }
  CHECK(differing == random_entries);
}

TEST_CASE("init_params uses GPT-2 scales: 0.02 normals, scaled residual projections, LN 1, biases 0") {
  const GptConfig cfg;
  std::vector<float> p(num_params(cfg));
  init_params(cfg, 1, p);
  for (const ParamTensor& t : param_layout(cfg)) {
    CAPTURE(t.name);
    const float* x = p.data() + t.offset;
    if (t.name.ends_with(".b")) {
      CHECK(std::all_of(x, x + t.numel, [](float v) { return v == 0.0f; }));
    } else if (t.name.ends_with("ln1.w") || t.name.ends_with("ln2.w") || t.name == "lnf.w") {
      CHECK(std::all_of(x, x + t.numel, [](float v) { return v == 1.0f; }));
    } else {
      double sum = 0, sq = 0;
      for (std::size_t i = 0; i < t.numel; ++i) {
        sum += x[i];
        sq += static_cast<double>(x[i]) * x[i];
      }
      const double mean = sum / t.numel, sd = std::sqrt(sq / t.numel - mean * mean);
      const bool residual = t.name.ends_with("attn.proj.w") || t.name.ends_with("mlp.proj.w");
      const double want = residual ? 0.02 / std::sqrt(2.0 * cfg.layers) : 0.02;
      // >= 512 samples per tensor: the sample sd is within ~3% of the true one (1 sigma).
      CHECK(sd == doctest::Approx(want).epsilon(0.15));
      CHECK(std::abs(mean) < 0.2 * want);
    }
  }
}

TEST_CASE("forward matches an independent double-precision reference") {
  const GptConfig cfg = small_config();
  const RefModel ref(cfg);
  for (std::uint64_t seed : {1u, 2u, 3u}) {
    const auto params = random_params(cfg, seed);
    const Batch batch = random_batch(cfg, seed + 100);
    GptWorkspace ws(cfg);
    const float loss = gpt_forward(cfg, params, batch.tokens, batch.targets, ws);
    const double want = ref.loss(std::vector<double>(params.begin(), params.end()), batch);
    CAPTURE(seed);
    // fp32 through two blocks: a few ulps per op, ~1e-6 relative in practice.
    CHECK(static_cast<double>(loss) == doctest::Approx(want).epsilon(1e-5));
  }
}

TEST_CASE("backward matches central finite differences for every parameter tensor") {
  // Reference: central differences of the double-precision reference loss at the same
  // (fp32-representable) parameters, step h = 1e-4. Truncation error is O(h^2 * f''') ~ 1e-8
  // and rounding error ~1e-16 / h = 1e-12, so the reference is exact far below the tolerance
  // and the check measures only the error of the fp32 analytic gradient. That error is fp32
  // rounding accumulated through the network, ~1e-6 of the tensor's gradient scale, so each
  // sampled entry must satisfy |analytic - fd| <= 1e-3 * |fd| + 1e-4 * scale, where scale is the
  // largest |fd| sampled in that tensor (an absolute floor relative to the tensor, so entries
  // that are near zero by cancellation do not demand an impossible relative precision). A
  // wrong term in any backward kernel shows up as an O(1) relative error, far above this.
  const GptConfig cfg = small_config();
  const RefModel ref(cfg);
  const auto params = random_params(cfg, 11);
  const Batch batch = random_batch(cfg, 12);
  const auto grads = grads_of(cfg, params, batch);
  std::vector<double> p64(params.begin(), params.end());
  const double h = 1e-4;

  std::uint64_t pick = 99;
  double worst = 0.0;
  for (const ParamTensor& t : param_layout(cfg)) {
    CAPTURE(t.name);
    // Up to 16 entries: the first, the last, and random ones in between.
    std::set<std::size_t> entries = {0, t.numel - 1};
    while (entries.size() < std::min<std::size_t>(16, t.numel)) entries.insert(splitmix(pick) % t.numel);
    std::vector<std::pair<double, double>> pairs;  // (analytic, fd)
    double scale = 0.0;
    for (std::size_t e : entries) {
      const std::size_t i = t.offset + e;
      const double saved = p64[i];
      p64[i] = saved + h;
      const double up = ref.loss(p64, batch);
      p64[i] = saved - h;
      const double down = ref.loss(p64, batch);
      p64[i] = saved;
      const double fd = (up - down) / (2 * h);
      pairs.emplace_back(grads[i], fd);
      scale = std::max(scale, std::abs(fd));
    }
    CHECK(scale > 1e-4);  // the sample really exercises this tensor's gradient
    for (const auto& [analytic, fd] : pairs) {
      CAPTURE(analytic);
      CAPTURE(fd);
      const double err = std::abs(analytic - fd);
      CHECK(err <= 1e-3 * std::abs(fd) + 1e-4 * scale);
      worst = std::max(worst, err / (std::abs(fd) + scale));
    }
  }
  MESSAGE("worst finite-difference error relative to |fd| + tensor scale: " << worst);
}

TEST_CASE("backward accumulates: twice gives exactly twice once, and adds to existing grads") {
  const GptConfig cfg = small_config();
  const auto params = random_params(cfg, 5);
  const Batch batch = random_batch(cfg, 6);
  const auto once = grads_of(cfg, params, batch);

  GptWorkspace ws(cfg);
  std::vector<float> twice(params.size(), 0.0f);
  gpt_forward(cfg, params, batch.tokens, batch.targets, ws);
  gpt_backward(cfg, params, batch.tokens, batch.targets, ws, twice);
  gpt_backward(cfg, params, batch.tokens, batch.targets, ws, twice);
  for (std::size_t i = 0; i < once.size(); ++i) REQUIRE(twice[i] == 2.0f * once[i]);

  // On top of arbitrary contents: each call's contribution arrives with a single rounding.
  std::vector<float> existing = random_params(cfg, 77);
  const std::vector<float> before = existing;
  gpt_backward(cfg, params, batch.tokens, batch.targets, ws, existing);
  for (std::size_t i = 0; i < once.size(); ++i) REQUIRE(existing[i] == before[i] + once[i]);
}

TEST_CASE("loss_scale multiplies the gradient") {
  const GptConfig cfg = small_config();
  const auto params = random_params(cfg, 5);
  const Batch batch = random_batch(cfg, 6);
  const auto base = grads_of(cfg, params, batch);
  // Backward is linear in the loss gradient and a power-of-two factor commutes with every
  // fp32 rounding, so this scale is exact.
  const auto pow2 = grads_of(cfg, params, batch, 1024.0f);
  for (std::size_t i = 0; i < base.size(); ++i) REQUIRE(pow2[i] == 1024.0f * base[i]);
  const auto three = grads_of(cfg, params, batch, 3.0f);
  float scale = 0.0f;
  for (float g : base) scale = std::max(scale, std::abs(g));
  for (std::size_t i = 0; i < base.size(); ++i) {
    REQUIRE(std::abs(three[i] - 3.0f * base[i]) <= 1e-5f * (std::abs(3.0f * base[i]) + scale));
  }
}

TEST_CASE("forward and backward are bitwise deterministic, also with a reused workspace") {
  const GptConfig cfg;
  std::vector<float> params(num_params(cfg));
  init_params(cfg, 3, params);
  const auto corpus = make_corpus(4, 4096, cfg.vocab);
  DataLoader loader(corpus, cfg.seq, cfg.batch, 0, 1);
  Batch first{std::vector<std::int32_t>(cfg.batch * cfg.seq), std::vector<std::int32_t>(cfg.batch * cfg.seq)};
  Batch other = first;
  loader.next_batch(first.tokens, first.targets);
  loader.next_batch(other.tokens, other.targets);

  auto run = [&](GptWorkspace& ws, const Batch& b, std::vector<float>& g) {
    std::fill(g.begin(), g.end(), 0.0f);
    const float loss = gpt_forward(cfg, params, b.tokens, b.targets, ws);
    gpt_backward(cfg, params, b.tokens, b.targets, ws, g);
    return loss;
  };
  GptWorkspace ws1(cfg), ws2(cfg);
  std::vector<float> g1(params.size()), g2(params.size()), g3(params.size()), scratch(params.size());
  const float l1 = run(ws1, first, g1);
  const float l2 = run(ws2, first, g2);
  run(ws1, other, scratch);  // leaves other activations behind in ws1
  const float l3 = run(ws1, first, g3);
  CHECK(std::memcmp(&l1, &l2, sizeof l1) == 0);
  CHECK(std::memcmp(&l1, &l3, sizeof l1) == 0);
  CHECK(std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(g1.data(), g3.data(), g1.size() * sizeof(float)) == 0);
}

TEST_CASE("invalid configs throw invalid_argument") {
  const std::vector<GptConfig> bad = {
      GptConfig{.vocab = 0},       GptConfig{.seq = -1},          GptConfig{.dim = 0},
      GptConfig{.heads = 0},       GptConfig{.layers = 0},        GptConfig{.batch = 0},
      GptConfig{.heads = 5},       GptConfig{.dim = 30, .heads = 4},
      GptConfig{.vocab = (1 << 20) + 1}, GptConfig{.seq = (1 << 12) + 1},
      GptConfig{.dim = 1 << 15, .heads = 1}, GptConfig{.layers = 1000},
      GptConfig{.batch = 1 << 30}};
  for (const GptConfig& cfg : bad) {
    CAPTURE(cfg.vocab);
    CAPTURE(cfg.seq);
    CAPTURE(cfg.dim);
    CAPTURE(cfg.heads);
    CAPTURE(cfg.layers);
    CAPTURE(cfg.batch);
    check_invalid([&] { cfg.validate(); });
    check_invalid([&] { (void)num_params(cfg); });
    check_invalid([&] { (void)param_layout(cfg); });
    check_invalid([&] { GptWorkspace ws(cfg); });
  }
  CHECK_NOTHROW(GptConfig{}.validate());
  CHECK_NOTHROW(GptConfig{.dim = 1, .heads = 1, .layers = 1}.validate());
}

TEST_CASE("out-of-range tokens and wrongly sized spans throw invalid_argument") {
  const GptConfig cfg = small_config();
  const auto params = random_params(cfg, 1);
  const Batch good = random_batch(cfg, 2);
  GptWorkspace ws(cfg);
  std::vector<float> grads(params.size());

  for (std::int32_t bad_token : {-1, cfg.vocab, 1 << 30}) {
    Batch b = good;
    b.tokens[3] = bad_token;
    check_invalid([&] { gpt_forward(cfg, params, b.tokens, b.targets, ws); });
    b = good;
    b.targets[cfg.batch * cfg.seq - 1] = bad_token;
    check_invalid([&] { gpt_forward(cfg, params, b.tokens, b.targets, ws); });
  }
  const std::span<const float> short_params(params.data(), params.size() - 1);
  check_invalid([&] { gpt_forward(cfg, short_params, good.tokens, good.targets, ws); });
  const std::span<const std::int32_t> short_tokens(good.tokens.data(), good.tokens.size() - 1);
  check_invalid([&] { gpt_forward(cfg, params, short_tokens, good.targets, ws); });
  check_invalid([&] { gpt_forward(cfg, params, good.tokens, short_tokens, ws); });

  gpt_forward(cfg, params, good.tokens, good.targets, ws);
  std::vector<float> short_grads(params.size() - 1);
  check_invalid([&] { gpt_backward(cfg, params, good.tokens, good.targets, ws, short_grads); });
  check_invalid([&] { gpt_backward(cfg, short_params, good.tokens, good.targets, ws, grads); });

  std::vector<float> wrong_size_init(params.size() + 1);
  check_invalid([&] { init_params(cfg, 1, wrong_size_init); });
}

TEST_CASE("backward refuses a workspace without a matching preceding forward") {
  const GptConfig cfg = small_config();
  const auto params = random_params(cfg, 1);
  const Batch batch = random_batch(cfg, 2);
  std::vector<float> grads(params.size());

  GptWorkspace fresh(cfg);
  check_invalid([&] { gpt_backward(cfg, params, batch.tokens, batch.targets, fresh, grads); });

  GptWorkspace ws(cfg);
  gpt_forward(cfg, params, batch.tokens, batch.targets, ws);
  Batch other = batch;
  other.targets[0] = (other.targets[0] + 1) % cfg.vocab;
  check_invalid([&] { gpt_backward(cfg, params, other.tokens, other.targets, ws, grads); });

  CHECK(std::all_of(grads.begin(), grads.end(), [](float g) { return g == 0.0f; }));

  GptConfig bigger = cfg;
  bigger.batch = 3;
  GptWorkspace other_ws(bigger);
  check_invalid([&] { gpt_forward(cfg, params, batch.tokens, batch.targets, other_ws); });
}

TEST_CASE("a forward rejected for bad input leaves the workspace as it was") {
  const GptConfig cfg = small_config();
  const auto params = random_params(cfg, 1);
  const Batch batch = random_batch(cfg, 2);
  const auto want = grads_of(cfg, params, batch);

  GptWorkspace ws(cfg);
  gpt_forward(cfg, params, batch.tokens, batch.targets, ws);
  Batch bad = batch;
  bad.tokens[0] = -1;
  check_invalid([&] { gpt_forward(cfg, params, bad.tokens, bad.targets, ws); });
  std::vector<float> grads(params.size());
  gpt_backward(cfg, params, batch.tokens, batch.targets, ws, grads);
  CHECK(std::memcmp(grads.data(), want.data(), grads.size() * sizeof(float)) == 0);
}

TEST_CASE("plain SGD on the corpus lowers the loss of a held-out batch") {
  // A test of the model and its gradient, not of an optimizer: 30 steps of p -= 0.1 * g.
  const GptConfig cfg;
  std::vector<float> params(num_params(cfg)), grads(params.size());
  init_params(cfg, 1, params);
  const auto corpus = make_corpus(42, 1 << 15, cfg.vocab);
  const std::size_t n = static_cast<std::size_t>(cfg.batch) * cfg.seq;
  std::vector<std::int32_t> tokens(n), targets(n), eval_tokens(n), eval_targets(n);
  DataLoader eval_loader(corpus, cfg.seq, cfg.batch, 0, 1);
  eval_loader.set_position(1000);  // windows the training steps below never visit
  eval_loader.next_batch(eval_tokens, eval_targets);

  GptWorkspace ws(cfg);
  const float before = gpt_forward(cfg, params, eval_tokens, eval_targets, ws);
  DataLoader loader(corpus, cfg.seq, cfg.batch, 0, 1);
  for (int step = 0; step < 30; ++step) {
    loader.next_batch(tokens, targets);
    gpt_forward(cfg, params, tokens, targets, ws);
    std::fill(grads.begin(), grads.end(), 0.0f);
    gpt_backward(cfg, params, tokens, targets, ws, grads);
    for (std::size_t i = 0; i < params.size(); ++i) params[i] -= 0.1f * grads[i];
  }
  const float after = gpt_forward(cfg, params, eval_tokens, eval_targets, ws);
  MESSAGE("held-out loss before " << before << ", after 30 SGD steps " << after);
  CHECK(before == doctest::Approx(std::log(64.0)).epsilon(0.02));  // near-uniform at init
  CHECK(after < before - 0.1f);
}

TEST_CASE("forward and backward do not allocate once the workspace exists") {
  const GptConfig cfg;
  std::vector<float> params(num_params(cfg)), grads(params.size());
  init_params(cfg, 1, params);
  const auto corpus = make_corpus(1, 4096, cfg.vocab);
  const std::size_t n = static_cast<std::size_t>(cfg.batch) * cfg.seq;
  std::vector<std::int32_t> tokens(n), targets(n);
  DataLoader loader(corpus, cfg.seq, cfg.batch, 0, 1);
  const std::size_t before_workspace = g_allocations.load();
  GptWorkspace ws(cfg);
  REQUIRE(g_allocations.load() > before_workspace);  // the counter does see allocations
  const std::size_t before = g_allocations.load();
  for (int step = 0; step < 3; ++step) {
    loader.next_batch(tokens, targets);
    gpt_forward(cfg, params, tokens, targets, ws);
    gpt_backward(cfg, params, tokens, targets, ws, grads);
  }
  const std::size_t allocations = g_allocations.load() - before;
  CHECK(allocations == 0);
}

TEST_CASE("the accumulated gradient of k micro-batches equals the gradient of one batch of k times the size") {
  // Not bitwise: the big batch sums each parameter's gradient over all k*b*seq positions in
  // one fp32 running sum and scales dlogits by 1/(k*b*seq), while accumulation sums each
  // micro-batch on its own, scales by (1/k) * 1/(b*seq) and adds the k partial sums: the
  // same real number, other fp32 roundings. The difference is a few ulps of the largest terms
  // summed, hence the tolerance: 1e-5 relative to the element plus 1e-6 of the tensor-wide
  // scale (fp32 epsilon is 1.2e-7).
  const int k = 4, b = 2;
  GptConfig micro = small_config();
  micro.batch = b;
  GptConfig big = micro;
  big.batch = k * b;
  const auto params = random_params(big, 11);
  const Batch whole = random_batch(big, 12);
  GptWorkspace ws_big(big);
  std::vector<float> g_big(params.size(), 0.0f);
  const float loss_big = gpt_forward(big, params, whole.tokens, whole.targets, ws_big);
  gpt_backward(big, params, whole.tokens, whole.targets, ws_big, g_big);

  GptWorkspace ws(micro);
  std::vector<float> g_acc(params.size(), 0.0f);
  const std::size_t rows = static_cast<std::size_t>(b * micro.seq);
  float loss_acc = 0.0f;
  for (int i = 0; i < k; ++i) {
    const std::span<const std::int32_t> tok(whole.tokens.data() + i * rows, rows), tgt(whole.targets.data() + i * rows, rows);
    loss_acc += gpt_forward(micro, params, tok, tgt, ws);
    gpt_backward(micro, params, tok, tgt, ws, g_acc, 1.0f / k);
  }
  loss_acc /= k;
  CHECK(std::abs(loss_acc - loss_big) <= 1e-6f * loss_big);
  float scale = 0.0f;
  for (float g : g_big) scale = std::max(scale, std::abs(g));
  double worst = 0;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < g_big.size(); ++i) {
    const float err = std::abs(g_acc[i] - g_big[i]);
    differing += err != 0.0f;
    worst = std::max(worst, static_cast<double>(err) / (std::abs(g_big[i]) + scale));
    REQUIRE(err <= 1e-5f * std::abs(g_big[i]) + 1e-6f * scale);
  }
  MESSAGE("accumulated vs big batch: " << differing << " of " << g_big.size() << " elements differ, worst relative " << worst);
}
