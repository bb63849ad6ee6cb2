// SPDX-License-Identifier: Apache-2.0
// Conformance suite of the async checkpointer: every test runs on each writer backend.
#include <doctest/doctest.h>

#include <atomic>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <optional>
#include <fstream>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/runtime/async_wait.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "runtime/runtime_fixture.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kN = 3000;  // floats per rank: spans a 4096-byte chunk boundary

// The checkpoint at `dir` holds exactly `states` (rank order).
void check_checkpoint(const std::string& dir, const std::vector<test::RankState>& states) {
  const auto reader = CheckpointReader::open(posix_file_system(), dir, static_cast<int>(states.size()));
  reader.verify(Verify::full);
  for (int r = 0; r < static_cast<int>(states.size()); ++r) {
    const auto shard = reader.load_shard(r, Verify::full);
    const auto& m = shard.tensor("master");
    REQUIRE(m.data.size() == kN * 4);
    CHECK(std::memcmp(m.data.data(), states[static_cast<std::size_t>(r)].master.data(), m.data.size()) == 0);
    CHECK(std::memcmp(shard.tensor("counter").data.data(), states[static_cast<std::size_t>(r)].counter.data(), 8) == 0);
    CHECK(shard.record.param_shard_offset == static_cast<std::uint64_t>(r) * kN);
  }
}

using test::step_dirs;
using test::temporaries;

}  // namespace

TEST_CASE("round trip: rank threads save concurrently and the checkpoint loads byte-equal") {
  for (auto b : test::backends()) {
    CAPTURE(test::backend_label(b));
    test::TempDir dir;
    const int world = 4;
    std::vector<test::RankState> states;
    for (int r = 0; r < world; ++r) states.emplace_back(r, kN);
    Checkpointer ckpt({.root = dir.path().string(), .world_size = world, .backend = b});
    CHECK(ckpt.backend_name() == test::backend_label(b));
    std::vector<SaveResult> results(world);
    test::run_ranks(world, [&](int r) {
      auto h = ckpt.save(r, 5, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, 5));
      results[static_cast<std::size_t>(r)] = h.wait();
      CHECK(h.ready());
    });
    for (const auto& res : results) {
      CHECK(res.dir == (dir / "step-0000000005").string());
      CHECK(res.step == 5);
      CHECK(res.backend == test::backend_label(b));
      CHECK(res.bytes > kN * 4);
    }
    check_checkpoint(results[0].dir, states);
    const auto opened = open_latest(posix_file_system(), dir.path().string(), {.expected_world_size = world});
    CHECK(opened.name == "step-0000000005");
    CHECK(json_of(opened.reader.manifest().shard(2).metadata).at("data_position").as_int64() == 52);
    CHECK(json_of(opened.reader.manifest().training).at("lr").as_double() == 0.001);
  }
}

TEST_CASE("the snapshot is isolated from mutations right after save returns") {
  for (auto b : test::backends()) {
    CAPTURE(test::backend_label(b));
    test::TempDir dir;
    const int world = 2;
    std::vector<test::RankState> states, saved;
    for (int r = 0; r < world; ++r) states.emplace_back(r, kN);
    saved = states;
    Checkpointer ckpt({.root = dir.path().string(), .world_size = world, .backend = b});
    std::vector<SaveHandle> handles(world);
    test::run_ranks(world, [&](int r) {
      handles[static_cast<std::size_t>(r)] = ckpt.save(r, 1, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, 1));
      states[static_cast<std::size_t>(r)].set(r, 99);  // training goes on and overwrites its tensors
    });
    for (auto& h : handles) h.wait();
    check_checkpoint(handles[0].wait().dir, saved);
  }
}

TEST_CASE("one checkpoint in flight: the next save waits for the previous commit and reports the stall") {
  for (auto b : test::backends()) {
    CAPTURE(test::backend_label(b));
    test::TempDir dir;
    FaultInjectionFileSystem slow(posix_file_system());
    std::vector<test::RankState> states{test::RankState(0, kN)};
    Checkpointer ckpt({.root = dir.path().string(), .world_size = 1, .backend = b, .fs = &slow});
    slow.hold_syncs(true);
    auto first = ckpt.save(0, 1, states[0].views(), test::info_for(0, 1, kN, 1));
    while (slow.held_syncs() == 0) std::this_thread::sleep_for(1ms);  // step 1 is now stuck in fsync
    std::atomic<bool> returned{false};
    SaveHandle second;
    std::thread t([&] {
      second = ckpt.save(0, 2, states[0].views(), test::info_for(0, 1, kN, 2));
      returned = true;
    });
    std::this_thread::sleep_for(50ms);
    CHECK_FALSE(returned.load());  // blocked behind step 1
    CHECK_FALSE(first.ready());
    slow.hold_syncs(false);
    t.join();
    CHECK(first.wait().step == 1);
    const SaveResult& r2 = second.wait();
    CHECK(r2.stall >= 40ms);
    CHECK(ckpt.stats().total_stall >= 40ms);
    CHECK(step_dirs(dir.path()) == std::vector<std::string>{"step-0000000001", "step-0000000002"});
  }
}

TEST_CASE("with the skip policy a save arriving while one is in flight is skipped on every rank") {
  test::TempDir dir;
  FaultInjectionFileSystem slow(posix_file_system());
  const int world = 2;
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  Checkpointer ckpt({.root = dir.path().string(), .world_size = world, .when_busy = BusyPolicy::skip, .fs = &slow});
  slow.hold_syncs(true);
  std::vector<SaveHandle> first(world);
  test::run_ranks(world, [&](int r) { first[static_cast<std::size_t>(r)] = ckpt.save(r, 1, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, 1)); });
  auto skipped0 = ckpt.save(0, 2, states[0].views(), test::info_for(0, world, kN, 2));
  CHECK(skipped0.skipped());
  CHECK(skipped0.ready());
  slow.hold_syncs(false);
  for (auto& h : first) h.wait();
  // Step 1 is done now, but rank 1 must skip step 2 too, or step 2 would never complete.
  auto skipped1 = ckpt.save(1, 2, states[1].views(), test::info_for(1, world, kN, 2));
  CHECK(skipped1.skipped());
  CHECK(ckpt.stats().saves_skipped == 2);
  CHECK(step_dirs(dir.path()) == std::vector<std::string>{"step-0000000001"});
}

TEST_CASE("rotation keeps the last K checkpoints and never deletes the newest") {
  for (auto b : test::backends()) {
    for (int keep = 1; keep <= 4; ++keep) {
      CAPTURE(test::backend_label(b));
      CAPTURE(keep);
      test::TempDir dir;
      const int world = 2;
      std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
      Checkpointer ckpt({.root = dir.path().string(), .world_size = world, .keep_last = keep, .backend = b});
      for (std::uint64_t step = 1; step <= 7; ++step) {
        test::run_ranks(world, [&](int r) {
          states[static_cast<std::size_t>(r)].set(r, step);
          ckpt.save(r, step, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, step)).wait();
        });
        ckpt.wait_all();  // rotation runs after the handles complete
        const auto dirs = step_dirs(dir.path());
        CHECK(dirs.size() == std::min<std::size_t>(static_cast<std::size_t>(keep), step));
        CHECK(dirs.back() == checkpoint_dir_name(step));
        CHECK(*read_latest(posix_file_system(), dir.path().string()) == checkpoint_dir_name(step));
      }
      check_checkpoint((dir / "step-0000000007").string(), states);
    }
  }
}

TEST_CASE("a failed write fails the checkpoint on every rank, keeps the previous one, and the next save succeeds") {
  for (auto b : test::backends()) {
    for (int err : {EIO, ENOSPC}) {
      CAPTURE(test::backend_label(b));
      CAPTURE(err);
      test::TempDir dir;
      FaultInjectionFileSystem faulty(posix_file_system());
      const int world = 2;
      std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
      Checkpointer ckpt({.root = dir.path().string(), .world_size = world, .backend = b, .fs = &faulty});
      test::run_ranks(world, [&](int r) { ckpt.save(r, 1, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, 1)).wait(); });
      const auto good = states;
      faulty.fail_nth(FaultInjectionFileSystem::Op::write, 1, err);
      std::vector<std::string> errors(world);
      test::run_ranks(world, [&](int r) {
        states[static_cast<std::size_t>(r)].set(r, 2);
        try {
          ckpt.save(r, 2, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, 2)).wait();
        } catch (const Error& e) {
          CHECK(e.code() == (err == ENOSPC ? Errc::no_space : Errc::io_error));
          CHECK(e.sys_errno() == err);
          CHECK(e.file().find(".tmp-step-0000000002") != std::string::npos);
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
      CHECK_FALSE(errors[0].empty());
      CHECK(errors[0] == errors[1]);  // every rank reports the same typed error
      CHECK(temporaries(dir.path()).empty());
      CHECK(*read_latest(posix_file_system(), dir.path().string()) == "step-0000000001");
      check_checkpoint((dir / "step-0000000001").string(), good);
      test::run_ranks(world, [&](int r) { ckpt.save(r, 3, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, 3)).wait(); });
      check_checkpoint((dir / "step-0000000003").string(), states);
    }
  }
}

TEST_CASE("a failed fsync fails the checkpoint and keeps the previous one") {
  test::TempDir dir;
  FaultInjectionFileSystem faulty(posix_file_system());
  std::vector<test::RankState> states{test::RankState(0, kN)};
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 1, .fs = &faulty});
  ckpt.save(0, 1, states[0].views(), test::info_for(0, 1, kN, 1)).wait();
  faulty.fail_nth(FaultInjectionFileSystem::Op::sync, 0, EIO);
  CHECK_THROWS_AS(ckpt.save(0, 2, states[0].views(), test::info_for(0, 1, kN, 2)).wait(), Error);
  CHECK(step_dirs(dir.path()) == std::vector<std::string>{"step-0000000001"});
  CHECK(temporaries(dir.path()).empty());
}

TEST_CASE("200 saves in a row reuse the staging pool and leave exactly K checkpoints") {
  for (auto b : test::backends()) {
    CAPTURE(test::backend_label(b));
    test::TempDir dir;
    const int world = 2;
    std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
    Checkpointer ckpt({.root = dir.path().string(), .world_size = world, .keep_last = 3, .backend = b});
    std::uint64_t staging_after_first = 0;
    test::run_ranks(world, [&](int r) {
      for (std::uint64_t step = 1; step <= 200; ++step) {
        auto h = ckpt.save(r, step, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, step));
        if (step == 200) h.wait();
      }
    });
    ckpt.wait_all();
    const auto st = ckpt.stats();
    staging_after_first = st.staging_bytes;
    CHECK(st.staging_allocations == static_cast<std::uint64_t>(world));  // once per rank, never again
    CHECK(staging_after_first <= world * (kN * 4 + 3 * 4096));
    CHECK(st.commits == 200);
    CHECK(st.failures == 0);
    CHECK(step_dirs(dir.path()) == std::vector<std::string>{"step-0000000198", "step-0000000199", "step-0000000200"});
  }
}

TEST_CASE("pre-allocated staging is used without reallocating") {
  test::TempDir dir;
  std::vector<test::RankState> states{test::RankState(0, kN)};
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 1, .staging_bytes_per_rank = 1 << 20});
  CHECK(ckpt.stats().staging_allocations == 1);
  ckpt.save(0, 1, states[0].views(), test::info_for(0, 1, kN, 1)).wait();
  CHECK(ckpt.stats().staging_allocations == 1);
  CHECK(ckpt.stats().staging_bytes == 1 << 20);
}

TEST_CASE("async_wait works from a coroutine, with a future and with a callback") {
  test::TempDir dir;
  std::vector<test::RankState> states{test::RankState(0, kN)};
  // The io_context outlives the checkpointer, whose threads may still be inside a post to it
  // when the coroutine has already finished.
  boost::asio::io_context io;
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 1});
  std::uint64_t got = 0;
  boost::asio::co_spawn(
      io,
      [&]() -> boost::asio::awaitable<void> {
        auto h = ckpt.save(0, 1, states[0].views(), test::info_for(0, 1, kN, 1));
        SaveResult r = co_await async_wait(h, boost::asio::use_awaitable);
        got = r.step;
      },
      boost::asio::detached);
  io.run();
  CHECK(got == 1);
  auto fut = async_wait(ckpt.save(0, 2, states[0].views(), test::info_for(0, 1, kN, 2)), boost::asio::use_future);
  CHECK(fut.get().step == 2);
  std::promise<std::uint64_t> p;
  async_wait(ckpt.save(0, 3, states[0].views(), test::info_for(0, 1, kN, 3)), [&](std::exception_ptr e, SaveResult r) {
    p.set_value(e ? 0 : r.step);
  });
  CHECK(p.get_future().get() == 3);
}

TEST_CASE("a coroutine awaiting a failed save gets the typed error") {
  test::TempDir dir;
  FaultInjectionFileSystem faulty(posix_file_system());
  std::vector<test::RankState> states{test::RankState(0, kN)};
  boost::asio::io_context io;  // outlives the checkpointer's threads
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 1, .fs = &faulty});
  faulty.fail_nth(FaultInjectionFileSystem::Op::write, 0, ENOSPC);
  Errc code = Errc::aborted;
  boost::asio::co_spawn(
      io,
      [&]() -> boost::asio::awaitable<void> {
        try {
          co_await async_wait(ckpt.save(0, 1, states[0].views(), test::info_for(0, 1, kN, 1)), boost::asio::use_awaitable);
        } catch (const Error& e) {
          code = e.code();
        }
      },
      boost::asio::detached);
  io.run();
  CHECK(code == Errc::no_space);
}

TEST_CASE("on_ready calls back once with the result, at once on the calling thread when the save is ready already") {
  test::TempDir dir;
  FaultInjectionFileSystem slow(posix_file_system());
  std::vector<test::RankState> states{test::RankState(0, kN)};
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 1, .fs = &slow});
  slow.hold_syncs(true);
  auto h = ckpt.save(0, 1, states[0].views(), test::info_for(0, 1, kN, 1));
  while (slow.held_syncs() == 0) std::this_thread::sleep_for(1ms);
  std::atomic<int> calls{0};
  std::promise<std::thread::id> ran_on;
  h.on_ready([&](std::exception_ptr e, SaveResult r) {
    CHECK_FALSE(e);
    CHECK(r.step == 1);
    ++calls;
    ran_on.set_value(std::this_thread::get_id());
  });
  CHECK(calls.load() == 0);  // still in flight: registered, not called
  slow.hold_syncs(false);
  CHECK(ran_on.get_future().get() != std::this_thread::get_id());  // the ckpt thread that completed it
  h.wait();
  std::thread::id late_thread;
  h.on_ready([&](std::exception_ptr e, SaveResult r) {
    CHECK_FALSE(e);
    CHECK(r.step == 1);
    late_thread = std::this_thread::get_id();
  });
  CHECK(late_thread == std::this_thread::get_id());
  CHECK(calls.load() == 1);
}

TEST_CASE("on_ready and async_wait on an empty handle report invalid_argument, and an empty callback is refused") {
  SaveHandle empty;
  std::optional<Errc> code;
  empty.on_ready([&](std::exception_ptr e, SaveResult) {
    try {
      if (e) std::rethrow_exception(e);
    } catch (const Error& err) {
      code = err.code();
    }
  });
  CHECK(code == Errc::invalid_argument);
  auto fut = async_wait(empty, boost::asio::use_future);
  CHECK(test::expect_error([&] { fut.get(); }).code() == Errc::invalid_argument);
  test::TempDir dir;
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 1});
  std::vector<test::RankState> states{test::RankState(0, kN)};
  auto h = ckpt.save(0, 1, states[0].views(), test::info_for(0, 1, kN, 1));
  CHECK(test::expect_error([&] { h.on_ready(nullptr); }).code() == Errc::invalid_argument);
  h.wait();
}

TEST_CASE("async_wait counts as outstanding work: io_context::run() returns only once the save is done") {
  test::TempDir dir;
  FaultInjectionFileSystem slow(posix_file_system());
  std::vector<test::RankState> states{test::RankState(0, kN)};
  boost::asio::io_context io;  // outlives the checkpointer's threads
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 1, .fs = &slow});
  slow.hold_syncs(true);
  auto h = ckpt.save(0, 1, states[0].views(), test::info_for(0, 1, kN, 1));
  std::atomic<bool> run_returned{false};
  std::uint64_t got = 0;
  async_wait(h, boost::asio::bind_executor(io, [&](std::exception_ptr e, SaveResult r) {
    CHECK(io.get_executor().running_in_this_thread());  // through the handler's executor
    got = e ? 0 : r.step;
  }));
  std::thread runner([&] {
    io.run();
    run_returned = true;
  });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(run_returned.load());  // nothing else keeps io busy: the pending wait does
  slow.hold_syncs(false);
  runner.join();
  CHECK(got == 1);
}

TEST_CASE("destruction drains staged saves and abandons a checkpoint some rank never saved") {
  test::TempDir dir;
  std::vector<std::string> logged;
  auto previous = set_log_sink([&](std::string_view l) { logged.emplace_back(l); });
  SaveHandle h;
  std::vector<test::RankState> states{test::RankState(0, kN)};
  {
    Checkpointer ckpt({.root = dir.path().string(), .world_size = 2});
    h = ckpt.save(0, 1, states[0].views(), test::info_for(0, 2, kN, 1));
  }
  set_log_sink(previous);
  try {
    h.wait();
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::aborted);
    CHECK(std::string(e.what()).find("rank(s) 1 never saved it") != std::string::npos);
  }
  REQUIRE(logged.size() == 1);
  CHECK(logged[0].find("abandoned") != std::string::npos);
  CHECK(temporaries(dir.path()).empty());
  CHECK(step_dirs(dir.path()).empty());
}

TEST_CASE("bad calls are refused with invalid_argument and fail the checkpoint for the other ranks") {
  test::TempDir dir;
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  Checkpointer ckpt({.root = dir.path().string(), .world_size = 2});
  CHECK_THROWS_AS(ckpt.save(2, 1, states[0].views(), {}), Error);
  auto h0 = ckpt.save(0, 1, states[0].views(), test::info_for(0, 2, kN, 1));
  CHECK_THROWS_AS(ckpt.save(0, 1, states[0].views(), {}), Error);  // twice
  std::vector<TensorView> bad{{"x", DType::F32, {5}, std::as_bytes(std::span(states[1].master)).first(8)}};
  try {
    ckpt.save(1, 1, bad, test::info_for(1, 2, kN, 1));
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
  }
  // Rank 1 could not stage, so it contributed nothing; rank 0 can still finish the step.
  auto h1 = ckpt.save(1, 1, states[1].views(), test::info_for(1, 2, kN, 1));
  CHECK_NOTHROW(h0.wait());
  CHECK_NOTHROW(h1.wait());
  CHECK_THROWS_AS(Checkpointer({.root = dir.path().string(), .world_size = 0}), Error);
  CHECK_THROWS_AS(Checkpointer({.root = "", .world_size = 1}), Error);
  CHECK_THROWS_AS(Checkpointer({.root = dir.path().string(), .chunk_size = 1000}), Error);
}

TEST_CASE("cadence: every N steps and every T seconds") {
  auto steps = SaveCadence::every_steps(10);
  CHECK_FALSE(steps.due(0));
  CHECK_FALSE(steps.due(9));
  CHECK(steps.due(10));
  CHECK(steps.due(20));
  const auto t0 = std::chrono::steady_clock::now();
  auto secs = SaveCadence::every_seconds(60);
  CHECK_FALSE(secs.due(1, t0 + 30s));
  CHECK(secs.due(2, t0 + 61s));
  CHECK_FALSE(secs.due(3, t0 + 100s));
  CHECK(secs.due(4, t0 + 122s));
  CHECK_THROWS_AS(SaveCadence::every_steps(0), Error);
}

TEST_CASE("200 saves to a memory root keep two generations: the shared memory it holds and the process's RSS stay flat") {
  const std::string root = "mem://checkpointer-200-" + std::to_string(::getpid());
  const fs::path dir = memory_root_dir(root);
  fs::remove_all(dir);
  // Bytes the root holds in shared memory (allocated blocks of every file under it).
  auto held = [&] {
    std::uint64_t bytes = 0;
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
    }
    return bytes;
  };
  auto rss = [] {
    std::ifstream in("/proc/self/statm");
    std::uint64_t size = 0, resident = 0;
    in >> size >> resident;
    return resident * static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  };
  const int world = 2;
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  std::uint64_t held_at_20 = 0, rss_at_20 = 0, held_max = 0, rss_max = 0;
  {
    Checkpointer ckpt({.root = root, .world_size = world, .keep_last = 2});
    for (std::uint64_t step = 1; step <= 200; ++step) {
      test::run_ranks(world, [&](int r) { ckpt.save(r, step, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, step)).wait(); });
      ckpt.wait_all();  // its rotation too
      if (step == 20) held_at_20 = held(), rss_at_20 = rss();
      if (step > 20) held_max = std::max(held_max, held()), rss_max = std::max(rss_max, rss());
    }
    CHECK(ckpt.stats().staging_allocations == static_cast<std::uint64_t>(world));
    CHECK(ckpt.stats().commits == 200);
  }
  CHECK(step_dirs(dir) == std::vector<std::string>{"step-0000000199", "step-0000000200"});
  CHECK(held_at_20 > 2 * world * kN * 4);  // two generations of both ranks' state
  CHECK(held_max <= held_at_20);
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (A sanitizer's allocator keeps freed memory in quarantine: its RSS grows by design.)
  CHECK(rss_max <= rss_at_20 + (4u << 20));
#endif
  open_store(root)->verify(200, Verify::full);
  fs::remove_all(dir);
}
