// SPDX-License-Identifier: Apache-2.0
// The loop's shared decisions: a wall-clock save cadence decided by rank 0's clock.
#include <doctest/doctest.h>

#include <chrono>
#include <vector>

#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/train/loop.hpp"

using namespace ckpt;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

// Each rank runs `steps` step boundaries with its own injected clock (`clock(rank, step)`);
// returns the steps each rank saved at.
template <class ClockFn>
std::vector<std::vector<std::uint64_t>> saved_steps(int world, std::uint64_t steps, double every, ClockFn clock) {
  std::vector<std::vector<std::uint64_t>> saved(static_cast<std::size_t>(world));
  dist::run_ranks(world, [&](dist::Communicator& comm) {
    auto cadence = SaveCadence::every_seconds(every, clock(comm.rank(), 0));
    for (std::uint64_t s = 1; s <= steps; ++s)
      if (train::save_due(cadence, comm, s, clock(comm.rank(), s))) saved[static_cast<std::size_t>(comm.rank())].push_back(s);
  });
  return saved;
}

}  // namespace

TEST_CASE("a time cadence saves the steps rank 0's clock says are due, on every rank, whatever the other clocks say") {
  const Clock::time_point t0{};
  // Rank 0: 1 s per step, a save every 3 s (steps 3, 6, 9). Rank 1's clock runs 10x faster
  // (due every step on its own), rank 2's stands still (never due on its own).
  const auto saved = saved_steps(3, 10, 3.0, [&](int rank, std::uint64_t step) {
    const auto secs = std::chrono::seconds(static_cast<long>(step));
    return rank == 0 ? t0 + secs : rank == 1 ? t0 + 10 * secs : t0;
  });
  const std::vector<std::uint64_t> expect = {3, 6, 9};
  for (const auto& s : saved) CHECK(s == expect);
}

TEST_CASE("a time cadence counts from its injected start and from each save it decided") {
  const Clock::time_point t0 = Clock::now();
  auto c = SaveCadence::every_seconds(2.0, t0);
  CHECK_FALSE(c.due(1, t0 + 1999ms));
  CHECK(c.due(2, t0 + 2000ms));
  CHECK_FALSE(c.due(3, t0 + 3500ms));  // 1.5 s since the save at 2 s
  CHECK(c.due(4, t0 + 4100ms));
}

TEST_CASE("a step cadence through save_due saves the same steps on every rank") {
  std::vector<std::vector<std::uint64_t>> saved(2);
  dist::run_ranks(2, [&](dist::Communicator& comm) {
    auto c = SaveCadence::every_steps(4);
    for (std::uint64_t s = 1; s <= 9; ++s)
      if (train::save_due(c, comm, s)) saved[static_cast<std::size_t>(comm.rank())].push_back(s);
  });
  for (const auto& s : saved) CHECK(s == std::vector<std::uint64_t>{4, 8});
}
