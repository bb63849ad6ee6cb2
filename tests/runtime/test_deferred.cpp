// SPDX-License-Identifier: Apache-2.0
// Staging::deferred: save() returns before the copy, wait_staged() is the fence, and the
// checkpoint holds the tensors as they were at save() when the caller keeps its promise.
// Snapshot isolation in both modes; the debug check catches a broken promise.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "runtime/runtime_fixture.hpp"

using namespace ckpt;
using namespace ckpt::testing;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kN = 50000;

// The master tensor of `rank` in the checkpoint of `step` under `root`, as floats.
std::vector<float> saved_master(const std::string& root, std::uint64_t step, int rank) {
  const auto reader = CheckpointReader::open(posix_file_system(), join_path(root, checkpoint_dir_name(step)));
  const auto bytes = reader.read_tensor("master", rank, Verify::full);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// Blocks the checkpointer's only work-pool thread (hash_threads = 1) in the fsync of rank 0's
// shard of `step`, so that nothing else the pool runs (a deferred copy) can start until
// `faulty.hold_syncs(false)`.
SaveHandle occupy_pool(Checkpointer& c, FaultInjectionFileSystem& faulty, test::RankState& s0, std::uint64_t step, int world) {
  faulty.hold_syncs(true);
  SaveHandle h = c.save(0, step, s0.views(), test::info_for(0, world, kN, step), Staging::copy);
  while (faulty.held_syncs() == 0) std::this_thread::sleep_for(1ms);
  return h;
}

}  // namespace

TEST_CASE("a modification after save() returns (copy, overlapped) or after wait_staged() (deferred) never reaches the checkpoint") {
  for (const Staging mode : {Staging::copy, Staging::deferred, Staging::overlapped}) {
    CAPTURE(static_cast<int>(mode));
    test::TempDir dir;
    const std::string root = (dir / "r").string();
    Checkpointer c({.root = root, .world_size = 1, .staging = mode});
    test::RankState s(0, kN);
    s.set(0, 7);
    const std::vector<float> at_save = s.master;
    SaveHandle h = c.save(0, 1, s.views(), test::info_for(0, 1, kN, 1));
    h.wait_staged();  // at once for a copy-before-return save
    CHECK(h.staged());
    s.set(0, 8);  // the caller's next optimizer step
    const SaveResult r = h.wait();
    CHECK(r.deferred == (mode == Staging::deferred));
    CHECK(saved_master(root, 1, 0) == at_save);
    CHECK(s.master != at_save);
  }
}

TEST_CASE("a deferred save() returns before its copy is made, the copy runs on ckpt's threads and the save commits") {
  test::TempDir dir;
  FaultInjectionFileSystem faulty(posix_file_system());
  const std::string root = (dir / "r").string();
  const int world = 2;
  Checkpointer c({.root = root, .world_size = world, .hash_threads = 1, .fs = &faulty});
  std::vector<test::RankState> s{test::RankState(0, kN), test::RankState(1, kN)};
  SaveHandle h0 = occupy_pool(c, faulty, s[0], 1, world);
  SaveHandle h1 = c.save(1, 1, s[1].views(), test::info_for(1, world, kN, 1), Staging::deferred);
  // The only thread that could copy is blocked in rank 0's fsync: the copy has not run.
  CHECK_FALSE(h1.staged());
  CHECK_FALSE(h1.ready());
  const std::vector<float> at_save = s[1].master;
  faulty.hold_syncs(false);
  h1.wait_staged();
  CHECK(h1.staged());
  s[1].set(1, 99);
  CHECK(h0.wait().step == 1);
  const SaveResult r1 = h1.wait();
  CHECK(r1.deferred);
  CHECK(r1.stage.count() > 0);
  CHECK(read_latest(posix_file_system(), root) == checkpoint_dir_name(1));
  CHECK(saved_master(root, 1, 1) == at_save);
}

TEST_CASE("check_deferred_staging: a tensor modified before its deferred copy fails the save, and the previous checkpoint stays") {
  test::TempDir dir;
  FaultInjectionFileSystem faulty(posix_file_system());
  const std::string root = (dir / "r").string();
  const int world = 2;
  Checkpointer c({.root = root, .world_size = world, .hash_threads = 1, .fs = &faulty, .check_deferred_staging = true});
  std::vector<test::RankState> s{test::RankState(0, kN), test::RankState(1, kN)};
  test::run_ranks(world, [&](int r) {
    c.save(r, 1, s[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, 1), Staging::deferred).wait();
  });
  c.wait_all();

  SaveHandle h0 = occupy_pool(c, faulty, s[0], 2, world);
  SaveHandle h1 = c.save(1, 2, s[1].views(), test::info_for(1, world, kN, 2), Staging::deferred);
  REQUIRE_FALSE(h1.staged());
  s[1].master[123] += 1.0f;  // the broken promise: modified before the fence
  faulty.hold_syncs(false);
  const std::string what = "tensor 'master' of rank 1 (step 2) was modified between save() and the end of its deferred copy";
  try {
    h1.wait_staged();
    FAIL("the modification went unnoticed");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.detail().find(what) == 0);
    CHECK(e.expected().find(" (at save())") != std::string::npos);
    CHECK(e.actual().find(" (copied)") != std::string::npos);
    CHECK(e.expected() != e.actual());
  }
  for (SaveHandle* h : {&h0, &h1}) {
    try {
      h->wait();
      FAIL("the save committed");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_argument);
      CHECK(e.detail().find(what) == 0);
    }
  }
  c.wait_all();
  CHECK(read_latest(posix_file_system(), root) == checkpoint_dir_name(1));
  CHECK(test::temporaries(root).empty());
  CheckpointReader::open(posix_file_system(), join_path(root, checkpoint_dir_name(1))).verify(Verify::full);
  CHECK_FALSE(c.staged(1).has_value());  // the staging buffer holds nothing committed
}

TEST_CASE("wait_staged on an empty handle is invalid_argument, on a skipped save it returns at once") {
  SaveHandle empty;
  CHECK_THROWS_AS(empty.wait_staged(), Error);
  CHECK_FALSE(empty.staged());
  test::TempDir dir;
  FaultInjectionFileSystem faulty(posix_file_system());
  Checkpointer c({.root = (dir / "r").string(), .world_size = 1, .when_busy = BusyPolicy::skip, .fs = &faulty});
  test::RankState s(0, kN);
  faulty.hold_syncs(true);
  SaveHandle first = c.save(0, 1, s.views(), test::info_for(0, 1, kN, 1), Staging::deferred);
  while (faulty.held_syncs() == 0) std::this_thread::sleep_for(1ms);
  SaveHandle skipped = c.save(0, 2, s.views(), test::info_for(0, 1, kN, 2), Staging::deferred);
  CHECK(skipped.skipped());
  skipped.wait_staged();
  CHECK(skipped.staged());
  faulty.hold_syncs(false);
  first.wait();
}
