// SPDX-License-Identifier: Apache-2.0
// The Checkpointer holds its root's writer lock for its whole life: a second writer, in this
// process or another, is refused at once and removes nothing; and a save would never move
// `latest` back unless the run says it resumed from an older checkpoint.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/root_lock.hpp"
#include "runtime/runtime_fixture.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kN = 3000;

// Every entry of `root` but the lock file, sorted (the lock's record changes with its holder).
std::vector<std::string> entries(const fs::path& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root))
    if (e.path().filename() != kLockName) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Every checkpoint directory of `root` verifies in full; returns how many there are.
std::size_t verify_all(const fs::path& root, int world) {
  const auto dirs = test::step_dirs(root);
  for (const auto& d : dirs) CheckpointReader::open(posix_file_system(), (root / d).string(), world).verify(Verify::full);
  return dirs.size();
}

void check_busy(const Error& e, const std::string& root, long pid) {
  CHECK(e.code() == Errc::busy);
  CHECK(e.file() == root);
  CHECK(e.actual().starts_with("pid " + std::to_string(pid) + " "));
  CHECK(std::string(e.what()).find(root) != std::string::npos);
}

}  // namespace

TEST_CASE("a second Checkpointer on a root in use is refused with busy naming the root and pid, and removes nothing") {
  for (auto b : test::backends()) {
    CAPTURE(test::backend_label(b));
    test::TempDir dir;
    const std::string root = dir.path().string();
    FaultInjectionFileSystem slow(posix_file_system());
    std::vector<test::RankState> states{test::RankState(0, kN)};
    Checkpointer first({.root = root, .world_size = 1, .keep_last = 0, .backend = b, .fs = &slow});
    first.save_sync(0, 1, states[0].views(), test::info_for(0, 1, kN, 1));
    // Step 2 stuck in fsync: its temporary directory holds a partial shard.
    slow.hold_syncs(true);
    states[0].set(0, 2);
    auto second_save = first.save(0, 2, states[0].views(), test::info_for(0, 1, kN, 2));
    while (slow.held_syncs() == 0) std::this_thread::sleep_for(1ms);
    const auto before = entries(dir.path());
    REQUIRE(test::temporaries(dir.path()).size() == 1);
    for (WriterBackend other : {WriterBackend::posix, b}) {
      check_busy(test::error_of([&] { Checkpointer again({.root = root, .world_size = 1, .backend = other}); }), root, ::getpid());
      CHECK(entries(dir.path()) == before);  // the first's temporary and checkpoint intact
    }
    // The synchronous save and crash cleanup are refused alike.
    test::RankState other(0, kN);
    SaveRequest req;
    req.step = 3;
    req.ranks.push_back({other.views(), 0, kN, {}});
    check_busy(test::error_of([&] { save_checkpoint_sync(posix_file_system(), root, req); }), root, ::getpid());
    CHECK(entries(dir.path()) == before);
    slow.hold_syncs(false);
    CHECK(second_save.wait().step == 2);
    CHECK(read_latest(posix_file_system(), root) == "step-0000000002");
    CHECK(verify_all(dir.path(), 1) == 2);
  }
}

TEST_CASE("the lock is released when the Checkpointer is destroyed: a new one on the root then saves") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  std::vector<test::RankState> states{test::RankState(0, kN)};
  {
    Checkpointer first({.root = root, .world_size = 1});
    first.save_sync(0, 1, states[0].views(), test::info_for(0, 1, kN, 1));
  }
  Checkpointer next({.root = root, .world_size = 1});
  CHECK(next.save_sync(0, 2, states[0].views(), test::info_for(0, 1, kN, 2)).step == 2);
  CHECK(read_lock_holder(posix_file_system(), join_path(root, kLockName))->pid == ::getpid());
  CHECK(verify_all(dir.path(), 1) == 2);
}

TEST_CASE("a second process saving to the root of a running one is refused, and the first's checkpoints all verify") {
  test::TempDir dir;
  const std::string root = (dir / "root").string();
  int ready[2], stop[2];
  REQUIRE(::pipe(ready) == 0);
  REQUIRE(::pipe2(stop, O_NONBLOCK) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The running job: saves every step until told to stop (at most 500 steps).
    ::close(ready[0]);
    ::close(stop[1]);
    int rc = 0;
    try {
      std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
      Checkpointer job({.root = root, .world_size = 2, .keep_last = 3});
      char c = 'r';
      for (std::uint64_t step = 1; step <= 500 && ::read(stop[0], &c, 1) != 1; ++step) {
        test::run_ranks(2, [&](int r) {
          states[static_cast<std::size_t>(r)].set(r, step);
          job.save(r, step, states[static_cast<std::size_t>(r)].views(), test::info_for(r, 2, kN, step)).wait();
        });
        if (step == 1 && ::write(ready[1], &c, 1) != 1) rc = 4;
      }
    } catch (...) {
      rc = 3;
    }
    ::_exit(rc);
  }
  ::close(ready[1]);
  ::close(stop[0]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);  // the job has committed step 1 and saves on
  // Another job started on the same root by mistake, again and again while the first saves.
  std::vector<test::RankState> mine{test::RankState(0, kN), test::RankState(1, kN)};
  for (int attempt = 0; attempt < 20; ++attempt) {
    check_busy(test::error_of([&] { Checkpointer second({.root = root, .world_size = 2}); }), root, child);
    std::this_thread::sleep_for(5ms);
  }
  // It never got to write; the first job goes on.
  const auto latest_then = read_latest(posix_file_system(), root);
  REQUIRE(latest_then);
  std::this_thread::sleep_for(50ms);
  REQUIRE(::write(stop[1], "s", 1) == 1);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // Every checkpoint the job left verifies, latest names the newest, nothing temporary is left.
  const auto dirs = test::step_dirs(root);
  CHECK(verify_all(root, 2) == dirs.size());
  CHECK(dirs.size() <= 3);
  REQUIRE_FALSE(dirs.empty());
  CHECK(read_latest(posix_file_system(), root) == dirs.back());
  CHECK(*parse_checkpoint_dir_name(dirs.back()) >= *parse_checkpoint_dir_name(*latest_then));
  CHECK(test::temporaries(root).empty());
  ::close(ready[0]);
  ::close(stop[1]);
}

TEST_CASE("a Checkpointer refuses a step older than latest naming both steps, and opted in saves it and logs") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  std::vector<test::RankState> states{test::RankState(0, kN)};
  {
    Checkpointer ckpt({.root = root, .world_size = 1, .keep_last = 1});
    for (std::uint64_t step : {4, 8}) {
      states[0].set(0, step);
      ckpt.save_sync(0, step, states[0].views(), test::info_for(0, 1, kN, step));
    }
  }
  // The run resumes from step 4 (step 8 was found corrupt, say, and step 4 came from
  // elsewhere); step 4 itself was rotated away, so its next save is step 6.
  CHECK(test::step_dirs(dir.path()) == std::vector<std::string>{"step-0000000008"});
  states[0].set(0, 6);
  {
    Checkpointer ckpt({.root = root, .world_size = 1});
    const Error e = test::error_of([&] { ckpt.save_sync(0, 6, states[0].views(), test::info_for(0, 1, kN, 6)); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.detail().find("saving step 6 would move latest back from step 8") != std::string::npos);
    CHECK(e.detail().find("allow_older_than_latest") != std::string::npos);
    CHECK(e.expected() == "a step after 8");
    CHECK(e.actual() == "step 6");
    CHECK(test::temporaries(dir.path()).empty());
    CHECK(read_latest(posix_file_system(), root) == "step-0000000008");
    // The next step after latest saves as always.
    CHECK(ckpt.save_sync(0, 9, states[0].views(), test::info_for(0, 1, kN, 9)).step == 9);
  }
  test::LogCapture log;
  Checkpointer ckpt({.root = root, .world_size = 1, .keep_last = 0, .allow_older_than_latest = true});
  CHECK(ckpt.save_sync(0, 6, states[0].views(), test::info_for(0, 1, kN, 6)).dir == join_path(root, "step-0000000006"));
  CHECK(log.matching({"saving step 6", "step 9 that latest names", "latest moves back to step-0000000006"}).size() == 1);
  CHECK(read_latest(posix_file_system(), root) == "step-0000000006");
  CHECK(verify_all(dir.path(), 1) == 3);
}
