// SPDX-License-Identifier: Apache-2.0
// Preemption: signals become one decision at one step, on every rank.
#include <doctest/doctest.h>

#include <atomic>
#include <csignal>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/runtime/preemption.hpp"
#include "support/test_support.hpp"

using namespace ckpt;

namespace {

std::atomic<int> g_custom{0};
extern "C" void custom_handler(int) { g_custom.fetch_add(1); }

// Runs `steps` step boundaries on `world` rank threads; rank `who` raises `sig` (`times`
// times) just before boundary `at`. Returns each rank's first stopping step (-1: none) and
// decision there.
struct RankSeen {
  int step = -1;
  PreemptionDecision decision;
};
std::vector<RankSeen> run_boundaries(const Preemption& p, int world, int who, int at, int sig, int times, int steps = 8) {
  std::vector<RankSeen> seen(static_cast<std::size_t>(world));
  dist::run_ranks(world, [&](dist::Communicator& comm) {
    for (int s = 0; s < steps; ++s) {
      if (comm.rank() == who && s == at)
        for (int i = 0; i < times; ++i) std::raise(sig);
      const auto d = p.agree(comm);
      auto& mine = seen[static_cast<std::size_t>(comm.rank())];
      if (d.stop && mine.step < 0) mine = {s, d};
    }
  });
  return seen;
}

// Every rank stopped at `step` with the same decision.
void check_every_rank(const std::vector<RankSeen>& seen, int step, bool hurry, int sig) {
  for (const auto& r : seen) {
    CHECK(r.step == step);
    CHECK(r.decision.stop);
    CHECK(r.decision.hurry == hurry);
    CHECK(r.decision.signal == sig);
  }
}

}  // namespace

TEST_CASE("a signal one rank sees stops every rank at the same step boundary") {
  Preemption p;
  check_every_rank(run_boundaries(p, 4, 2, 3, SIGTERM, 1), 3, false, SIGTERM);
  CHECK(p.count() == 1);
  CHECK(p.first_signal() == SIGTERM);
}

TEST_CASE("without a signal no rank stops") {
  Preemption p;
  for (const auto& r : run_boundaries(p, 3, 0, 100, SIGTERM, 0)) CHECK(r.step == -1);
  CHECK(p.count() == 0);
}

TEST_CASE("a second signal asks every rank to hurry") {
  Preemption p;
  check_every_rank(run_boundaries(p, 2, 1, 5, SIGUSR1, 2), 5, true, SIGUSR1);
  CHECK(signal_name(SIGUSR1) == "SIGUSR1");
}

TEST_CASE("a configured signal list handles those signals only and names the one that asked") {
  Preemption p({SIGUSR2});
  CHECK(p.signals() == std::vector<int>{SIGUSR2});
  const auto seen = run_boundaries(p, 2, 0, 1, SIGUSR2, 1);
  CHECK(seen[1].step == 1);
  CHECK(seen[1].decision.signal == SIGUSR2);
}

TEST_CASE("the previous handlers come back when the Preemption goes") {
  struct sigaction sa {}, old {};
  sa.sa_handler = custom_handler;
  sigemptyset(&sa.sa_mask);
  REQUIRE(::sigaction(SIGUSR1, &sa, &old) == 0);
  g_custom = 0;
  {
    Preemption p;
    std::raise(SIGUSR1);
    CHECK(p.count() == 1);
    CHECK(g_custom == 0);
  }
  std::raise(SIGUSR1);
  CHECK(g_custom == 1);
  ::sigaction(SIGUSR1, &old, nullptr);
}

TEST_CASE("a second Preemption in the process, an uncatchable signal or a repeated one is refused") {
  {
    Preemption p;
    CHECK(test::error_of([] { Preemption again; }).code() == Errc::invalid_argument);
  }
  const auto kill = test::error_of([] { Preemption p({SIGTERM, SIGKILL}); });
  CHECK(kill.code() == Errc::invalid_argument);
  CHECK(kill.actual() == "SIGKILL");
  CHECK(test::error_of([] { Preemption p({SIGINT, SIGINT}); }).actual() == "SIGINT twice");
  CHECK(test::error_of([] { Preemption p(std::vector<int>{}); }).code() == Errc::invalid_argument);
  Preemption after;  // the refused ones left nothing installed
  CHECK(after.count() == 0);
}
