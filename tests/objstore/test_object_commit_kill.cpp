// A process committing checkpoints to the real RGW is SIGKILLed at seeded instants; after
// each kill the store must show only whole checkpoints (every committed step restores and
// verifies in full), `latest` must name one of them, and the next commit must work.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <set>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/io/object_commit.hpp"
#include "ckpt/io/save.hpp"
#include "io/io_fixture.hpp"
#include "objstore/rgw_fixture.hpp"

using namespace ckpt;

TEST_CASE("a process SIGKILLed at any instant of commits to the object store leaves only whole checkpoints and latest on one") {
  const int kills = 24;
  test::TempDir local;
  const std::string root = (local / "root").string();
  for (int s = 1; s <= kills + 1; ++s) {
    test::Fixture fx(3, static_cast<std::uint64_t>(s));
    save_checkpoint_sync(posix_file_system(), root, fx.request);
  }
  const S3Options options = test::rgw_options(test::unique_prefix("kill"));
  auto store = make_s3_object_store(options);

  // A child process that commits `step` with a store of its own (no connection is shared
  // with the parent); exits 0 when done, 3 on an error.
  auto spawn = [&](std::uint64_t step) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        auto mine = make_s3_object_store(options);
        commit_to_object_store(posix_file_system(), root, step, *mine);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    return child;
  };
  // How long a child takes for one whole commit here, to spread the kills over it.
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  ::waitpid(spawn(1), &status, 0);
  REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  const auto one = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);

  std::mt19937_64 rng(19);
  std::set<std::uint64_t> verified;
  int killed_mid = 0, uncommitted = 0, landed_late = 0, before_latest = 0, complete = 0;  // what each kill left
  for (std::uint64_t step = 2; step <= static_cast<std::uint64_t>(kills + 1); ++step) {
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<std::int64_t>(0, one.count() * 3 / 4)(rng));
    const pid_t child = spawn(step);
    std::this_thread::sleep_for(delay);
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    if (WIFSIGNALED(status)) ++killed_mid;
    INFO("step " << step << " killed after " << delay.count() << " us");

    // Only whole checkpoints: every committed step restores and verifies in full (each one
    // once: a committed step's objects are never written again).
    const auto steps = list_object_checkpoints(*store);
    for (const auto s : steps) {
      if (!verified.insert(s).second) continue;
      test::TempDir into;
      CHECK_NOTHROW(restore_from_object_store(*store, s, posix_file_system(), (into / "r").string(), {.verify = Verify::full}));
    }
    // latest names one of them, and the newest one committed before this round at least.
    const auto latest = read_object_latest(*store);
    REQUIRE(latest);
    CHECK(std::find(steps.begin(), steps.end(), latest->step) != steps.end());
    CHECK(latest->step >= step - 1);
    // The next round may find this step committed (the kill came late): commit it if not.
    if (std::find(steps.begin(), steps.end(), step) == steps.end()) {
      ++uncommitted;
      try {
        commit_to_object_store(posix_file_system(), root, step, *store);
      } catch (const Error& e) {
        // The killed child's create was on its way and the server completed it after the
        // listing above (a request outlives its sender): the step is committed, by the child.
        REQUIRE(e.code() == Errc::conflict);
        ++landed_late;
        move_object_latest(*store, step);
      }
    } else if (latest->step < step) {
      ++before_latest;
      CHECK(move_object_latest(*store, step));  // the kill fell between the tier manifest and latest
    } else {
      ++complete;
    }
    CHECK(read_object_latest(*store)->step == step);
  }
  MESSAGE(killed_mid << " of " << kills << " kills hit a running process (one commit: " << one.count() << " us); left: "
                     << uncommitted << " uncommitted (" << landed_late
                     << " of them committed by the dead child's last request, landing after it died), " << before_latest
                     << " committed before latest moved, " << complete
                     << " complete");
  CHECK(killed_mid > 0);
}
