// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/train/data.hpp"

using namespace ckpt;
using namespace ckpt::train;

namespace {

struct Batch {
  std::vector<std::int32_t> tokens, targets;
  bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& loader) {
  const std::size_t n = static_cast<std::size_t>(loader.batch()) * loader.seq();
  Batch b{std::vector<std::int32_t>(n), std::vector<std::int32_t>(n)};
  loader.next_batch(b.tokens, b.targets);
  return b;
}

// Row `row` of a [batch, seq] batch, tokens and targets.
Batch row_of(const Batch& b, int seq, int row) {
  const auto first = static_cast<std::ptrdiff_t>(row) * seq;
  return Batch{{b.tokens.begin() + first, b.tokens.begin() + first + seq},
               {b.targets.begin() + first, b.targets.begin() + first + seq}};
}

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

TEST_CASE("make_corpus is deterministic per seed and differs across seeds") {
  const auto a = make_corpus(1, 10000);
  const auto b = make_corpus(1, 10000);
  const auto c = make_corpus(2, 10000);
  CHECK(a.size() == 10000);
  CHECK(a == b);
  std::size_t differing = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differing += a[i] != c[i];
  CHECK(differing > a.size() / 2);
  CHECK(make_corpus(1, 0).empty());
}

TEST_CASE("a longer corpus extends a shorter one with the same seed") {
  const auto short_corpus = make_corpus(9, 1000, 32);
  const auto long_corpus = make_corpus(9, 5000, 32);
  CHECK(std::equal(short_corpus.begin(), short_corpus.end(), long_corpus.begin()));
}

TEST_CASE("make_corpus tokens lie below vocab and every token occurs") {
  for (int vocab : {1, 2, 7, 64, 1000}) {
    CAPTURE(vocab);
    const auto corpus = make_corpus(3, 200000, vocab);
    CHECK(std::all_of(corpus.begin(), corpus.end(),
                      [&](std::int32_t t) { return t >= 0 && t < vocab; }));
    CHECK(std::set<std::int32_t>(corpus.begin(), corpus.end()).size() ==
          static_cast<std::size_t>(vocab));
  }
  check_invalid([] { make_corpus(1, 10, 0); });
  check_invalid([] { make_corpus(1, 10, (1 << 20) + 1); });
}

TEST_CASE("the corpus has learnable structure: conditional entropy far below ln(vocab)") {
  const int V = 64;
  const auto corpus = make_corpus(5, 200000, V);
  std::vector<double> pair(V * V, 0.0), first(V, 0.0), unigram(V, 0.0);
  for (std::size_t i = 0; i + 1 < corpus.size(); ++i) {
    pair[corpus[i] * V + corpus[i + 1]] += 1;
    first[corpus[i]] += 1;
    unigram[corpus[i]] += 1;
  }
  const double n = static_cast<double>(corpus.size() - 1);
  double h_next = 0.0, h_unigram = 0.0;  // H(next | current), H(token), in nats
  for (int a = 0; a < V; ++a) {
    if (unigram[a] > 0) h_unigram -= unigram[a] / n * std::log(unigram[a] / n);
    for (int b = 0; b < V; ++b) {
      const double c = pair[a * V + b];
      if (c > 0) h_next -= c / n * std::log(c / first[a]);
    }
  }
  MESSAGE("H(token) = " << h_unigram << " nats, H(next | current) = " << h_next
          << " nats, ln(64) = " << std::log(64.0));
  CHECK(h_unigram > 0.9 * std::log(64.0));  // tokens are spread over the vocabulary...
  CHECK(h_next < 0.4 * std::log(64.0));     // ...but the next one is highly predictable
}

TEST_CASE("loader rows are corpus windows with targets shifted by one") {
  const auto corpus = make_corpus(1, 1000);
  DataLoader loader(corpus, 8, 3, 0, 1);
  for (int step = 0; step < 4; ++step) {
    const Batch b = next(loader);
    for (int row = 0; row < 3; ++row) {
      const std::uint64_t g = static_cast<std::uint64_t>(step) * 3 + row;
      const std::size_t s = loader.sample_start(g);
      CHECK(s == g * 8);  // back to back, far from the wrap-around
      for (int t = 0; t < 8; ++t) {
        CHECK(b.tokens[row * 8 + t] == corpus[s + t]);
        CHECK(b.targets[row * 8 + t] == corpus[s + t + 1]);
      }
    }
  }
  CHECK(loader.position() == 12);
}

TEST_CASE("sample windows wrap around the corpus and never run past its end") {
  const auto corpus = make_corpus(1, 41);  // 41 - 8 = 33 window starts, 0..32
  DataLoader loader(corpus, 8, 5, 0, 1);
  CHECK(loader.sample_start(4) == 32);
  CHECK(loader.sample_start(5) == 40 % 33);
  for (std::uint64_t g = 0; g < 1000; ++g) CHECK(loader.sample_start(g) + 8 + 1 <= corpus.size());
  CHECK(loader.sample_start(UINT64_MAX) < 33);
  for (int step = 0; step < 20; ++step) (void)next(loader);  // no out-of-bounds under ASan
}

TEST_CASE("the union over ranks of one step is the single-rank batch of batch times world") {
  const auto corpus = make_corpus(2, 5000);
  const int seq = 16, batch = 2;
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    DataLoader single(corpus, seq, batch * world, 0, 1);
    std::vector<DataLoader> ranks;
    for (int r = 0; r < world; ++r) ranks.emplace_back(corpus, seq, batch, r, world);
    for (int step = 0; step < 5; ++step) {
      const Batch big = next(single);
      for (int r = 0; r < world; ++r) {
        const Batch mine = next(ranks[r]);
        for (int b = 0; b < batch; ++b) {
          // Interleaved: global row j of the step is rank j % world's row j / world.
          CHECK(row_of(mine, seq, b) == row_of(big, seq, b * world + r));
        }
        CHECK(ranks[r].position() == single.position());
      }
    }
  }
}

TEST_CASE("set_position reproduces the same subsequent batches") {
  const auto corpus = make_corpus(3, 3000);
  DataLoader original(corpus, 16, 4, 1, 4);
  for (int i = 0; i < 7; ++i) (void)next(original);
  const std::uint64_t saved = original.position();
  CHECK(saved == 7u * 4 * 4);
  std::vector<Batch> expected;
  for (int i = 0; i < 10; ++i) expected.push_back(next(original));

  DataLoader resumed(corpus, 16, 4, 1, 4);
  (void)next(resumed);  // a different state, overwritten below
  resumed.set_position(saved);
  for (int i = 0; i < 10; ++i) CHECK(next(resumed) == expected[i]);
  CHECK(resumed.position() == original.position());
}

TEST_CASE("a saved position resumes at another world size with the same global batch") {
  const auto corpus = make_corpus(4, 3000);
  const int seq = 8;
  DataLoader single(corpus, seq, 8, 0, 1);  // the global batch of 8, unsplit
  for (int i = 0; i < 3; ++i) (void)next(single);
  std::vector<DataLoader> four;  // written at world 4, batch 2
  for (int r = 0; r < 4; ++r) four.emplace_back(corpus, seq, 2, r, 4);
  for (auto& l : four) {
    for (int i = 0; i < 3; ++i) (void)next(l);
  }
  const std::uint64_t saved = four[0].position();
  REQUIRE(saved == single.position());

  const Batch big = next(single);
  for (int r = 0; r < 2; ++r) {  // resumed at world 2, batch 4
    DataLoader two(corpus, seq, 4, r, 2);
    two.set_position(saved);
    const Batch mine = next(two);
    for (int b = 0; b < 4; ++b) CHECK(row_of(mine, seq, b) == row_of(big, seq, b * 2 + r));
  }
}

TEST_CASE("the loader rejects unusable arguments") {
  const auto corpus = make_corpus(1, 100);
  check_invalid([&] { DataLoader(corpus, 0, 1, 0, 1); });
  check_invalid([&] { DataLoader(corpus, 8, 0, 0, 1); });
  check_invalid([&] { DataLoader(corpus, 8, 1, 0, 0); });
  check_invalid([&] { DataLoader(corpus, 8, 1, 4, 4); });
  check_invalid([&] { DataLoader(corpus, 8, 1, -1, 4); });
  check_invalid([&] { DataLoader(std::span(corpus).first(8), 8, 1, 0, 1); });
  CHECK_NOTHROW(DataLoader(std::span(corpus).first(9), 8, 1, 0, 1));

  DataLoader loader(corpus, 8, 2, 0, 1);
  std::vector<std::int32_t> right(16), wrong(15);
  check_invalid([&] { loader.next_batch(wrong, right); });
  check_invalid([&] { loader.next_batch(right, wrong); });
  CHECK(loader.position() == 0);  // a rejected call consumes nothing
}
