// SPDX-License-Identifier: Apache-2.0
#include "ckpt/train/data.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "ckpt/core/error.hpp"

#include "ckpt/core/random.hpp"

namespace ckpt::train {

namespace {


// Uniform in [0, n) by rejection, so the corpus has no modulo bias and depends on nothing but
// the splitmix64 stream.
std::uint64_t uniform_below(std::uint64_t& state, std::uint64_t n) {
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  for (;;) {
    const std::uint64_t x = splitmix64(state);
    if (x < limit) return x % n;
  }
}

constexpr int kSuccessors = 4;
// Successor k is taken when a draw in [0, 20) is below kCumulative[k]: 10/20, 5/20, 3/20, 2/20.
constexpr std::array<std::uint64_t, kSuccessors> kCumulative = {10, 15, 18, 20};

}  // namespace

std::vector<std::int32_t> make_corpus(std::uint64_t seed, std::size_t total_tokens, int vocab) {
  if (vocab < 1 || vocab > (1 << 20)) {
    throw_invalid("make_corpus: vocab = " + std::to_string(vocab) + " is outside [1, 2^20]");
  }
  const auto V = static_cast<std::size_t>(vocab);
  std::uint64_t state = seed;

  // A random cyclic order of all tokens (Fisher-Yates) gives each token its likeliest successor.
  std::vector<std::int32_t> order(V);
  for (std::size_t i = 0; i < V; ++i) order[i] = static_cast<std::int32_t>(i);
  for (std::size_t i = V; i > 1; --i) std::swap(order[i - 1], order[uniform_below(state, i)]);
  std::vector<std::int32_t> successors(V * kSuccessors);
  for (std::size_t i = 0; i < V; ++i) {
    const auto tok = static_cast<std::size_t>(order[i]);
    successors[tok * kSuccessors] = order[(i + 1) % V];
  }
  for (std::size_t tok = 0; tok < V; ++tok) {
    for (int k = 1; k < kSuccessors; ++k) {
      successors[tok * kSuccessors + k] = static_cast<std::int32_t>(uniform_below(state, V));
    }
  }

  std::vector<std::int32_t> corpus(total_tokens);
  if (total_tokens == 0) return corpus;
  auto tok = static_cast<std::int32_t>(uniform_below(state, V));
  for (std::size_t i = 0; i < total_tokens; ++i) {
    corpus[i] = tok;
    const std::uint64_t draw = uniform_below(state, kCumulative.back());
    const auto k = static_cast<std::size_t>(
        std::upper_bound(kCumulative.begin(), kCumulative.end(), draw) - kCumulative.begin());
    tok = successors[static_cast<std::size_t>(tok) * kSuccessors + k];
  }
  return corpus;
}

DataLoader::DataLoader(std::span<const std::int32_t> corpus, int seq, int batch, int rank,
                       int world)
    : corpus_(corpus), seq_(seq), batch_(batch), rank_(rank), world_(world) {
  if (seq <= 0 || batch <= 0 || world <= 0) {
    throw_invalid("DataLoader: seq, batch and world must be > 0, got seq = " +
                  std::to_string(seq) + ", batch = " + std::to_string(batch) +
                  ", world = " + std::to_string(world));
  }
  check_rank(rank, world, "DataLoader: rank");
  if (corpus.size() < static_cast<std::size_t>(seq) + 1) {
    throw_invalid("DataLoader: corpus of " + std::to_string(corpus.size()) +
                  " tokens is shorter than seq + 1 = " + std::to_string(seq + 1));
  }
}

std::size_t DataLoader::sample_start(std::uint64_t global_sample) const noexcept {
  const std::uint64_t windows = corpus_.size() - static_cast<std::size_t>(seq_);
  // (g mod n) * seq can exceed 64 bits for a huge corpus; reduce seq too and multiply in
  // 128 bits so the rule holds for every g.
  __extension__ typedef unsigned __int128 u128;
  const u128 product = static_cast<u128>(global_sample % windows) *
                       static_cast<u128>(static_cast<std::uint64_t>(seq_) % windows);
  return static_cast<std::size_t>(product % windows);
}

void DataLoader::next_batch(std::span<std::int32_t> tokens, std::span<std::int32_t> targets) {
  const auto T = static_cast<std::size_t>(seq_), B = static_cast<std::size_t>(batch_);
  if (tokens.size() != B * T || targets.size() != B * T) {
    throw_invalid("DataLoader::next_batch: tokens/targets have " +
                  std::to_string(tokens.size()) + "/" + std::to_string(targets.size()) +
                  " elements, expected batch * seq = " + std::to_string(B * T));
  }
  const auto W = static_cast<std::uint64_t>(world_), r = static_cast<std::uint64_t>(rank_);
  for (std::size_t b = 0; b < B; ++b) {
    const std::size_t s = sample_start(position_ + b * W + r);
    std::copy_n(corpus_.begin() + static_cast<std::ptrdiff_t>(s), T, tokens.begin() + b * T);
    std::copy_n(corpus_.begin() + static_cast<std::ptrdiff_t>(s + 1), T, targets.begin() + b * T);
  }
  position_ += B * W;
}

}  // namespace ckpt::train
