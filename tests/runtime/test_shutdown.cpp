// SPDX-License-Identifier: Apache-2.0
// Shutdown and misuse: close() while other threads save and wait, a forked child's copy of a
// Checkpointer, the timed waits, and the saves refused as the caller's mistake (not counted as
// failures of the storage).
#include <doctest/doctest.h>

#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/root_lock.hpp"
#include "runtime/runtime_fixture.hpp"

using namespace ckpt;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kN = 3000;

// True if another open file description can take ROOT/.lock now (nobody holds it).
bool lock_free(const fs::path& root) {
  const int fd = ::open((root / ".lock").c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  const bool got = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return got;
}

// Waits up to `limit` for child `pid`; its wait status, or nullopt (the child is then killed).
std::optional<int> reap(pid_t pid, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    if (::waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(5ms);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return std::nullopt;
}

}  // namespace

TEST_CASE("close() aborts a save waiting at the barrier and every later save, and every accepted save ends") {
  test::TempDir dir;
  test::LogCapture log;
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  Checkpointer c({.root = dir.path().string(), .world_size = 2});
  SaveHandle h1 = c.save(0, 1, states[0].views(), test::info_for(0, 2, kN, 1));  // waits for rank 1, which never saves
  std::optional<Error> blocked;
  std::thread rank0([&] {
    try {
      c.save(0, 2, states[0].views(), test::info_for(0, 2, kN, 2));  // at the barrier, behind step 1
    } catch (const Error& e) {
      blocked = e;
    }
  });
  CHECK_FALSE(c.wait_turn_for(2, 50ms));  // rank 0's thread is waiting there
  c.close();
  rank0.join();
  REQUIRE(blocked.has_value());
  CHECK(blocked->code() == Errc::aborted);
  CHECK(blocked->file() == dir.path().string());
  CHECK(blocked->detail() == "save of step 2 by rank 0: the Checkpointer is closed");
  REQUIRE(h1.ready());
  const Error e = test::expect_error([&] { h1.wait(); });
  CHECK(e.code() == Errc::aborted);
  CHECK(std::string(e.what()).find("rank(s) 1 never saved it") != std::string::npos);
  CHECK(test::expect_error([&] { c.save(1, 1, states[1].views(), {}); }).code() == Errc::aborted);
  // Closed: the lock is released, nothing is left behind, the waits return, stats stay.
  CHECK(lock_free(dir.path()));
  CHECK(test::temporaries(dir.path()).empty());
  c.wait_all();
  c.wait_durable();
  CHECK(c.wait_all_for(0ns));
  CHECK(c.stats().saves_started == 2);  // the refused one had passed the argument checks
  CHECK(c.stats().staging_bytes == 0);
  CHECK_FALSE(c.staged(0).has_value());
  c.close();  // idempotent
}

TEST_CASE("close() racing rank threads that save in a loop never leaves a handle pending") {
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 6; ++round) {
    test::TempDir dir;
    test::LogCapture log;
    const int world = 3;
    std::vector<test::RankState> states;
    for (int r = 0; r < world; ++r) states.emplace_back(r, kN);
    auto c = std::make_unique<Checkpointer>(CheckpointerOptions{.root = dir.path().string(), .world_size = world});
    std::mutex mu;
    std::vector<SaveHandle> handles;
    std::atomic<int> refused{0};
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r)
      ranks.emplace_back([&, r] {
        for (std::uint64_t step = 1;; ++step) {
          try {
            auto h = c->save(r, step, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, step),
                             step % 2 ? Staging::deferred : Staging::copy);
            std::lock_guard lk(mu);
            handles.push_back(h);
          } catch (const Error& e) {
            CHECK(e.code() == Errc::aborted);
            ++refused;
            return;
          }
        }
      });
    std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 20000)(rng)));
    c->close();
    for (auto& t : ranks) t.join();
    CHECK(refused == world);
    for (const auto& h : handles) {
      REQUIRE(h.ready());
      try {
        const std::string committed = h.wait().dir;
        CHECK_FALSE(committed.empty());
      } catch (const Error& e) {
        CHECK(e.code() == Errc::aborted);  // or abandoned: some rank never saved its step
      }
    }
    CHECK(lock_free(dir.path()));
    CHECK(test::temporaries(dir.path()).empty());
    c.reset();
  }
}

TEST_CASE("a forked child drops its Checkpointer without waiting, and the parent's lock, temporaries and saves are untouched") {
  test::TempDir dir;
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  auto c = std::make_unique<Checkpointer>(CheckpointerOptions{.root = dir.path().string(), .world_size = 2});
  SaveHandle h0 = c->save(0, 1, states[0].views(), test::info_for(0, 2, kN, 1));  // in flight, waiting for rank 1
  for (int i = 0; i < 1000 && test::temporaries(dir.path()).empty(); ++i) std::this_thread::sleep_for(5ms);
  REQUIRE(test::temporaries(dir.path()).size() == 1);  // the step's temporary, made on ckpt's thread
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child: its calls are refused, close() and the destructor return at once.
    int code = 0;
    try {
      c->save(1, 1, states[1].views(), {});
      code = 10;
    } catch (const Error& e) {
      if (e.code() != Errc::invalid_argument || std::string(e.what()).find("forked") == std::string::npos) code = 11;
    }
    try {
      h0.wait();
      code = 12;
    } catch (const Error& e) {
      if (e.code() != Errc::invalid_argument) code = 13;
    }
    if (h0.ready()) code = 14;
    c->close();
    c.reset();
    ::_exit(code);
  }
  const auto status = reap(pid, 10s);
  REQUIRE(status.has_value());  // not hung
  CHECK(WIFEXITED(*status));
  CHECK(WEXITSTATUS(*status) == 0);
  // The parent's lock is still held, its temporary still there, and the step commits.
  CHECK_FALSE(lock_free(dir.path()));
  CHECK(test::temporaries(dir.path()).size() == 1);
  SaveHandle h1 = c->save(1, 1, states[1].views(), test::info_for(1, 2, kN, 1));
  CHECK(h0.wait().dir == h1.wait().dir);
  CHECK(read_latest(posix_file_system(), dir.path().string()) == checkpoint_dir_name(1));
  c.reset();
  CHECK(lock_free(dir.path()));
}

TEST_CASE("the timed waits return false at the deadline and true once done") {
  test::TempDir dir;
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  Checkpointer c({.root = dir.path().string(), .world_size = 2});
  SaveHandle h0 = c.save(0, 1, states[0].views(), test::info_for(0, 2, kN, 1), Staging::deferred);
  CHECK(h0.wait_staged_for(10s));
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(h0.wait_for(30ms));
  CHECK(std::chrono::steady_clock::now() - t0 >= 30ms);
  CHECK_FALSE(c.wait_all_for(10ms));
  CHECK(c.wait_turn_for(1, 0ns));       // step 1 is the one in flight
  CHECK_FALSE(c.wait_turn_for(2, 10ms));  // step 2 waits for it
  CHECK(c.wait_durable_for(0ns));       // no durable tier
  SaveHandle h1 = c.save(1, 1, states[1].views(), test::info_for(1, 2, kN, 1));
  CHECK(h0.wait_for(10s));
  CHECK(h1.wait_for(10s));
  CHECK(c.wait_all_for(10s));
  CHECK(c.wait_turn_for(2, 0ns));
  CHECK(test::expect_error([] { SaveHandle().wait_for(1ms); }).code() == Errc::invalid_argument);
  // With the skip policy a save never waits at the barrier.
  Checkpointer skipping({.root = (dir / "skip").string(), .world_size = 2, .when_busy = BusyPolicy::skip});
  SaveHandle in_flight = skipping.save(0, 1, states[0].views(), test::info_for(0, 2, kN, 1));
  CHECK(skipping.wait_turn_for(2, 0ns));
  CHECK(skipping.save(0, 2, states[0].views(), test::info_for(0, 2, kN, 2)).skipped());
  skipping.save(1, 1, states[1].views(), test::info_for(1, 2, kN, 1));
  CHECK(in_flight.wait().step == 1);
}

TEST_CASE("a save with no tensors is refused unless allow_empty, before anything starts") {
  test::TempDir dir;
  std::vector<test::RankState> states{test::RankState(0, kN)};
  {
    Checkpointer c({.root = dir.path().string()});
    const Error e = test::expect_error([&] { c.save(0, 1, std::span<const TensorView>(), {}); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.file() == dir.path().string());
    CHECK(e.detail() == "save of step 1 by rank 0: no tensors (an empty save is refused unless CheckpointerOptions::allow_empty)");
    CHECK(e.expected() == "at least one tensor");
    CHECK(e.actual() == "none");
    CHECK(c.stats().saves_started == 0);
    CHECK(c.stats().failures == 0);
    CHECK(test::temporaries(dir.path()).empty());
    CHECK(c.save(0, 1, states[0].views(), {}).wait().step == 1);  // the step goes on
  }
  Checkpointer c({.root = dir.path().string(), .allow_empty = true});
  CHECK(c.save(0, 2, std::span<const TensorView>(), {}).wait().step == 2);
}

TEST_CASE("a save at or before latest is refused, counted as refused, and does not stop the loop under max_consecutive_failures") {
  test::TempDir dir;
  test::LogCapture log;
  std::vector<test::RankState> states{test::RankState(0, kN)};
  Checkpointer c({.root = dir.path().string(), .max_consecutive_failures = 1});
  c.save(0, 5, states[0].views(), {}).wait();
  Error e = test::expect_error([&] { c.save(0, 5, states[0].views(), {}).wait(); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "checkpoint for step 5 already exists");
  e = test::expect_error([&] { c.save(0, 3, states[0].views(), {}).wait(); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.actual() == "step 3");
  const CheckpointerStats s = c.stats();
  CHECK(s.saves_refused == 2);
  CHECK(s.failures == 0);
  CHECK(s.consecutive_failures == 0);
  CHECK(s.last_failure.empty());
  CHECK(log.matching({"save of step 3 refused: invalid argument: "}).size() == 1);
  CHECK(log.matching({"failed"}).empty());
  CHECK(c.save(0, 6, states[0].views(), {}).wait().step == 6);  // not stopped
  CHECK(read_latest(posix_file_system(), dir.path().string()) == checkpoint_dir_name(6));
}

TEST_CASE("metadata a manifest cannot hold is refused by save() before anything starts, and NaN round-trips") {
  test::TempDir dir;
  std::vector<test::RankState> states{test::RankState(0, kN)};
  Checkpointer c({.root = dir.path().string()});
  SaveInfo info;
  json_of(info.metadata)["note"] = std::string(1u << 20, 'x');
  json_of(info.metadata)["note"].as_string().push_back('y');
  const Error e = test::expect_error([&] { c.save(0, 1, states[0].views(), info); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "metadata and training of rank 0 (step 1) cannot be held by a manifest: length of the string at shards[0].metadata");
  CHECK(e.expected() == "at most 1048576 bytes");
  CHECK(c.stats().saves_started == 0);
  CHECK(test::temporaries(dir.path()).empty());
  json_of(info.metadata).clear();
  json_of(info.metadata)["loss"] = std::numeric_limits<double>::quiet_NaN();
  json_of(info.training)["scale"] = -std::numeric_limits<double>::infinity();
  const std::string committed = c.save(0, 1, states[0].views(), info).wait().dir;
  const auto r = CheckpointReader::open(posix_file_system(), committed, 1);
  CHECK(std::isnan(json_of(r.manifest().shard(0).metadata).at("loss").as_double()));
  CHECK(json_of(r.manifest().training).at("scale").as_double() == -std::numeric_limits<double>::infinity());
}
