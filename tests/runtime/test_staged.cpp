// SPDX-License-Identifier: Apache-2.0
// Checkpointer::staged(): the last committed save of a rank, read back from its staging
// buffer (what an in-memory rollback restores).
#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "runtime/runtime_fixture.hpp"

using namespace ckpt;
using namespace ckpt::testing;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kN = 3000;

// The snapshot holds exactly `state`'s tensors, with their names, types, shapes and bytes.
void check_snapshot(const StagedSnapshot& snap, const test::RankState& state) {
  const auto views = state.views();
  REQUIRE(snap.tensors.size() == views.size());
  for (const auto& v : views) {
    CAPTURE(v.name);
    const auto it = std::find_if(snap.tensors.begin(), snap.tensors.end(), [&](const TensorView& t) { return t.name == v.name; });
    REQUIRE(it != snap.tensors.end());
    CHECK(it->dtype == v.dtype);
    CHECK(it->shape == v.shape);
    REQUIRE(it->data.size() == v.data.size());
    if (!v.data.empty()) CHECK(std::memcmp(it->data.data(), v.data.data(), v.data.size()) == 0);
  }
}

}  // namespace

TEST_CASE("staged gives every rank its last committed save, byte-equal, with its SaveInfo") {
  test::TempDir dir;
  const int world = 2;
  Checkpointer ckpt({.root = dir.path().string(), .world_size = world});
  CHECK_FALSE(ckpt.staged(0).has_value());  // nothing saved yet
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  test::run_ranks(world, [&](int r) {
    auto& st = states[static_cast<std::size_t>(r)];
    st.set(r, 7);
    ckpt.save(r, 7, st.views(), test::info_for(r, world, kN, 7)).wait();
    const auto saved = st;  // what was saved
    st.set(r, 8);           // training goes on: the live state moves past the snapshot
    const auto snap = ckpt.staged(r);
    REQUIRE(snap.has_value());
    CHECK(snap->step == 7);
    check_snapshot(*snap, saved);
    CHECK(snap->info.metadata == test::info_for(r, world, kN, 7).metadata);
    CHECK(snap->info.param_shard_offset == static_cast<std::uint64_t>(r) * kN);
  });
}

TEST_CASE("staged is empty while the next save is in flight and holds it once committed") {
  test::TempDir dir;
  FaultInjectionFileSystem slow(posix_file_system());
  test::RankState state(0, kN);
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 1, .fs = &slow});
  ckpt.save(0, 1, state.views(), test::info_for(0, 1, kN, 1)).wait();
  REQUIRE(ckpt.staged(0).has_value());
  slow.hold_syncs(true);
  state.set(0, 2);
  auto h = ckpt.save(0, 2, state.views(), test::info_for(0, 1, kN, 2));
  while (slow.held_syncs() == 0) std::this_thread::sleep_for(1ms);  // step 2 is staged, not committed
  // Step 1's bytes were overwritten by step 2's staging, and step 2 is not committed.
  CHECK_FALSE(ckpt.staged(0).has_value());
  slow.hold_syncs(false);
  h.wait();
  const auto snap = ckpt.staged(0);
  REQUIRE(snap.has_value());
  CHECK(snap->step == 2);
  check_snapshot(*snap, state);
}

TEST_CASE("staged is empty after a failed save: its staging overwrote the last committed one") {
  test::TempDir dir;
  FaultInjectionFileSystem faulty(posix_file_system());
  test::RankState state(0, kN);
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 1, .fs = &faulty});
  ckpt.save(0, 1, state.views(), test::info_for(0, 1, kN, 1)).wait();
  faulty.fail_nth(FaultInjectionFileSystem::Op::sync, 0, EIO);
  try {
    ckpt.save(0, 2, state.views(), test::info_for(0, 1, kN, 2)).wait();
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::io_error);
  }
  CHECK_FALSE(ckpt.staged(0).has_value());
}

TEST_CASE("staged refuses a rank outside the world with invalid_argument") {
  test::TempDir dir;
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 2});
  for (int bad : {-1, 2}) {
    try {
      (void)ckpt.staged(bad);
      FAIL("no throw");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_argument);
      CHECK(e.expected() == "0..1");
      CHECK(e.actual() == std::to_string(bad));
    }
  }
}
