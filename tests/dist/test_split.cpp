// SPDX-License-Identifier: Apache-2.0
// Communicator::split on the thread backend: membership and order, concurrent collectives in
// sibling groups, and how failures cross between a group and the groups split from it.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/communicator.hpp"
#include "ckpt/dist/thread_comm.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::dist;

namespace {

struct SubInfo {
  int rank = -1, size = -1;
};

// Splits a world of `world` ranks with color_key(rank) and returns each parent rank's place in
// its new group, after checking the new group works (a barrier).
std::vector<SubInfo> split_places(int world, const std::function<std::pair<int, int>(int)>& color_key) {
  std::vector<SubInfo> out(static_cast<std::size_t>(world));
  run_ranks(world, [&](Communicator& c) {
    const auto [color, key] = color_key(c.rank());
    const auto sub = c.split(color, key);
    sub->barrier();
    out[static_cast<std::size_t>(c.rank())] = {sub->rank(), sub->size()};
  });
  return out;
}

// The ckpt::Error each thread ended with (nullopt: clean return).
std::vector<std::optional<Error>> run_on_threads(std::vector<std::unique_ptr<Communicator>>& comms,
                                                 const std::function<void(Communicator&)>& fn) {
  std::vector<std::optional<Error>> seen(comms.size());
  std::vector<std::thread> ts;
  for (std::size_t r = 0; r < comms.size(); ++r) {
    ts.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (const Error& e) {
        seen[r] = e;
      }
    });
  }
  for (auto& t : ts) t.join();
  return seen;
}

}  // namespace

TEST_CASE("split into pairs gives every pair its own ranks and its own sums") {
  std::vector<float> sums(4);
  run_ranks(4, [&](Communicator& c) {
    const auto pair = c.split(c.rank() / 2, c.rank() % 2);
    CHECK(pair->size() == 2);
    CHECK(pair->rank() == c.rank() % 2);
    float v = static_cast<float>(c.rank() + 1);
    pair->all_reduce(std::span(&v, 1));
    sums[static_cast<std::size_t>(c.rank())] = v;
  });
  CHECK(sums == std::vector<float>{3, 3, 7, 7});  // 1+2 and 3+4, never across pairs
}

TEST_CASE("split by parity orders members by their rank in the parent") {
  const auto places = split_places(7, [](int r) { return std::pair{r % 2, 0}; });
  for (int r = 0; r < 7; ++r) {
    CAPTURE(r);
    CHECK(places[static_cast<std::size_t>(r)].rank == r / 2);
    CHECK(places[static_cast<std::size_t>(r)].size == (r % 2 == 0 ? 4 : 3));
  }
}

TEST_CASE("split keys reorder ranks and ties keep the parent order") {
  // Keys 10, 0, 10, 0: color members sorted by (key, rank) are 1, 3, 0, 2.
  const auto places = split_places(4, [](int r) { return std::pair{0, r % 2 == 0 ? 10 : 0}; });
  CHECK(places[1].rank == 0);
  CHECK(places[3].rank == 1);
  CHECK(places[0].rank == 2);
  CHECK(places[2].rank == 3);
  // Negative keys order before positive ones.
  const auto reversed = split_places(3, [](int r) { return std::pair{5, -r}; });
  for (int r = 0; r < 3; ++r) CHECK(reversed[static_cast<std::size_t>(r)].rank == 2 - r);
}

TEST_CASE("sibling groups run different collectives at the same time") {
  // Even ranks all-reduce 1000 floats while odd ranks all-gather bytes and broadcast, many
  // times: neither group's rendezvous may pair with the other's.
  std::vector<int> ok(6, 0);
  run_ranks(6, [&](Communicator& c) {
    const auto sub = c.split(c.rank() % 2, c.rank());
    for (int i = 0; i < 200; ++i) {
      if (c.rank() % 2 == 0) {
        std::vector<float> v(1000, static_cast<float>(c.rank()));
        sub->all_reduce(std::span(v));
        if (v.front() != 0 + 2 + 4 || v.back() != 0 + 2 + 4) return;
      } else {
        const int mine = c.rank() * 100 + i;
        const auto all = sub->all_gather_bytes(std::as_bytes(std::span(&mine, 1)));
        for (int q = 0; q < 3; ++q) {
          int got = 0;
          std::memcpy(&got, all[static_cast<std::size_t>(q)].data(), sizeof got);
          if (got != (2 * q + 1) * 100 + i) return;
        }
        std::vector<double> b(37, static_cast<double>(sub->rank()));
        sub->broadcast(std::span(b), 2);
        if (b[0] != 2.0) return;
      }
    }
    ok[static_cast<std::size_t>(c.rank())] = 1;
  });
  CHECK(ok == std::vector<int>(6, 1));
}

TEST_CASE("a split group can be split again") {
  std::vector<int> ranks(8, -1);
  run_ranks(8, [&](Communicator& c) {
    const auto half = c.split(c.rank() / 4, c.rank());
    const auto quarter = half->split(half->rank() / 2, -half->rank());
    int v = 1;
    quarter->all_reduce(std::span(&v, 1));
    CHECK(v == 2);
    ranks[static_cast<std::size_t>(c.rank())] = quarter->rank();
  });
  CHECK(ranks == std::vector<int>{1, 0, 1, 0, 1, 0, 1, 0});
}

TEST_CASE("a negative split color is invalid_argument before communicating") {
  auto comms = make_thread_group(1);
  const Error e = test::expect_error([&] { comms[0]->split(-1, 0); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == ">= 0");
  CHECK(e.actual() == "-1");
  // Nothing was entered: the group still works.
  const auto sub = comms[0]->split(0, 0);
  CHECK(sub->size() == 1);
  CHECK(sub->rank() == 0);
}

TEST_CASE("split against another collective on a peer is comm_error on every rank") {
  auto comms = make_thread_group(2);
  const auto seen = run_on_threads(comms, [](Communicator& c) {
    if (c.rank() == 0) c.split(0, 0);
    else c.barrier();
  });
  for (const auto& e : seen) {
    REQUIRE(e.has_value());
    CHECK(e->code() == Errc::comm_error);
    CHECK(e->expected() == "split");
    CHECK(e->actual() == "barrier");
  }
}

TEST_CASE("aborting the parent wakes a rank blocked in a sub-group collective") {
  // Rank 3 never joins its pair's barrier; it aborts the parent instead. Rank 2 is either
  // blocked in the barrier (and woken) or enters after the abort: Errc::aborted either way.
  auto comms = make_thread_group(4);
  const auto seen = run_on_threads(comms, [&](Communicator& c) {
    const auto pair = c.split(c.rank() / 2, 0);
    if (c.rank() == 3) c.abort("operator stop");
    else if (c.rank() == 2) pair->barrier();
  });
  REQUIRE(seen[2].has_value());
  CHECK(seen[2]->code() == Errc::aborted);
  CHECK(seen[2]->detail() == "barrier: group aborted: operator stop");
  CHECK_FALSE(seen[0].has_value());
  CHECK_FALSE(seen[3].has_value());
}

TEST_CASE("aborting a split group leaves its parent working") {
  auto comms = make_thread_group(2);
  const auto seen = run_on_threads(comms, [](Communicator& c) {
    const auto sub = c.split(0, 0);
    if (c.rank() == 0) sub->abort("sub only");
    c.barrier();  // the parent: both ranks pass
    const Error e = test::expect_error([&] { sub->barrier(); });
    CHECK(e.code() == Errc::aborted);
    CHECK(e.detail() == "barrier: group aborted: sub only");
    int v = 1;
    c.all_reduce(std::span(&v, 1));
    CHECK(v == 2);
  });
  for (const auto& e : seen) CHECK_FALSE(e.has_value());
}

TEST_CASE("a split communicator outlives its parent") {
  auto comms = make_thread_group(3);
  std::vector<std::unique_ptr<Communicator>> subs(3);
  run_on_threads(comms, [&](Communicator& c) { subs[static_cast<std::size_t>(c.rank())] = c.split(0, 0); });
  comms.clear();
  std::vector<int> sums(3);
  const auto seen = run_on_threads(subs, [&](Communicator& c) {
    int v = c.rank() + 1;
    c.all_reduce(std::span(&v, 1));
    sums[static_cast<std::size_t>(c.rank())] = v;
  });
  for (const auto& e : seen) CHECK_FALSE(e.has_value());
  CHECK(sums == std::vector<int>{6, 6, 6});
}

TEST_CASE("a rank returning from run_ranks fails only the sub-groups it belongs to") {
  // Rank 0 returns; its pair partner (rank 1) gets comm_error in the pair, while the other
  // pair goes on all-reducing undisturbed.
  std::optional<Error> partner;
  std::atomic<int> other_pair_steps{0};
  run_ranks(4, [&](Communicator& c) {
    const auto pair = c.split(c.rank() / 2, 0);
    if (c.rank() == 0) return;
    if (c.rank() == 1) {
      try {
        pair->barrier();
      } catch (const Error& e) {
        partner = e;
      }
      return;
    }
    for (int i = 0; i < 100; ++i) {
      float v = 1;
      pair->all_reduce(std::span(&v, 1));
      if (v == 2) ++other_pair_steps;
    }
  });
  REQUIRE(partner.has_value());
  CHECK(partner->code() == Errc::comm_error);
  CHECK(partner->detail() ==
        "barrier: rank 0 returned from its rank function and will never join this collective");
  CHECK(other_pair_steps.load() == 200);
}
