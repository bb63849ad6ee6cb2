// SPDX-License-Identifier: Apache-2.0
// The in-process backend beyond the Communicator contract: group creation, abort, run_ranks'
// error propagation, and the guards against the hangs users of other runtimes report.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/communicator.hpp"
#include "ckpt/dist/thread_comm.hpp"

using namespace ckpt;
using namespace ckpt::dist;

namespace {

// Runs fn(comm, rank) on one thread per rank of `comms` and returns the ckpt::Error each rank
// ended with (nullopt for a clean return).
std::vector<std::optional<Error>> run_on_threads(
    std::vector<std::unique_ptr<Communicator>>& comms, int threads,
    const std::function<void(Communicator&)>& fn) {
  std::vector<std::optional<Error>> seen(static_cast<std::size_t>(threads));
  std::vector<std::thread> ts;
  for (int r = 0; r < threads; ++r) {
    ts.emplace_back([&, r] {
      try {
        fn(*comms[static_cast<std::size_t>(r)]);
      } catch (const Error& e) {
        seen[static_cast<std::size_t>(r)] = e;
      }
    });
  }
  for (auto& t : ts) t.join();
  return seen;
}

}  // namespace

TEST_CASE("make_thread_group accepts 1 to 1024 ranks and rejects other sizes") {
  for (const int bad : {0, -1, 1025}) {
    INFO("world ", bad);
    try {
      make_thread_group(bad);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_argument);
      CHECK(e.expected() == "1..1024");
      CHECK(e.actual() == std::to_string(bad));
    }
  }
  CHECK(make_thread_group(1).size() == 1);
  CHECK(make_thread_group(1024).size() == 1024);
}

TEST_CASE("each communicator of a group reports its rank and the group size") {
  const auto comms = make_thread_group(5);
  for (int r = 0; r < 5; ++r) {
    CHECK(comms[static_cast<std::size_t>(r)]->rank() == r);
    CHECK(comms[static_cast<std::size_t>(r)]->size() == 5);
  }
}

TEST_CASE("abort wakes ranks blocked in a collective with Errc::aborted and the reason") {
  auto comms = make_thread_group(4);
  std::thread watchdog([&] {
    // Rank 3 never joins; give ranks 0-2 time to block. Entering after the abort throws
    // the same error, so the assertions hold whichever comes first.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    comms[3]->abort("rank 3 lost its device");
  });
  const auto seen = run_on_threads(comms, 3, [](Communicator& c) {
    std::vector<float> v(1000, 1.0f);
    c.all_reduce(std::span(v));
  });
  watchdog.join();
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("rank ", r);
    REQUIRE(seen[r].has_value());
    CHECK(seen[r]->code() == Errc::aborted);
    CHECK(seen[r]->detail() == "all_reduce: group aborted: rank 3 lost its device");
  }
}

TEST_CASE("an aborted group rejects every later collective and keeps the first reason") {
  auto comms = make_thread_group(2);
  comms[1]->abort("first");
  comms[0]->abort("second");
  std::vector<float> v(4);
  for (auto& c : comms) {
    try {
      c->barrier();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::aborted);
      CHECK(e.detail() == "barrier: group aborted: first");
    }
    CHECK_THROWS_AS(c->all_reduce(std::span(v)), Error);
    CHECK_THROWS_AS(c->all_gather_bytes({}), Error);
  }
}

TEST_CASE("abort during heavy traffic ends every rank without a hang or a stale read") {
  // Ranks free their buffers as soon as the abort reaches them; a rank that left while a
  // peer still read its buffer would show up under TSan (and ASan) as a use after free.
  constexpr int kWorld = 6;
  for (int trial = 0; trial < 12; ++trial) {
    auto comms = make_thread_group(kWorld);
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::microseconds(300 * trial));
      comms[static_cast<std::size_t>(trial % kWorld)]->abort("trial " + std::to_string(trial));
    });
    const auto seen = run_on_threads(comms, kWorld, [](Communicator& c) {
      for (;;) {
        std::vector<float> buf(20000, static_cast<float>(c.rank()));
        c.all_reduce(std::span(buf));
        std::vector<float> block(shard_range(buf.size(), c.size(), c.rank()).numel);
        c.reduce_scatter<float>(buf, block);
        c.all_gather<float>(block, buf);
        c.broadcast(std::span(buf), c.size() - 1);
      }
    });
    killer.join();
    for (std::size_t r = 0; r < kWorld; ++r) {
      INFO("trial ", trial, " rank ", r);
      REQUIRE(seen[r].has_value());
      CHECK(seen[r]->code() == Errc::aborted);
    }
  }
}

TEST_CASE("run_ranks rethrows a rank's exception after waking the peers it left blocked") {
  try {
    run_ranks(4, [](Communicator& c) {
      if (c.rank() == 2) throw std::runtime_error("rank 2 diverged");
      c.barrier();  // ranks 0, 1, 3 block here until run_ranks aborts the group
    });
    FAIL("no error");
  } catch (const std::runtime_error& e) {
    // The cause, not the Errc::aborted its peers saw.
    CHECK(std::string(e.what()) == "rank 2 diverged");
  }
}

TEST_CASE("run_ranks rethrows the lowest failing rank's error when several fail") {
  try {
    run_ranks(5, [](Communicator& c) {
      c.barrier();
      if (c.rank() == 3) throw Error(Errc::io_error, "/r3", "write");
      if (c.rank() == 1) throw Error(Errc::no_space, "/r1", "write");
      c.barrier();
    });
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::no_space);
    CHECK(e.file() == "/r1");
  }
}

TEST_CASE("run_ranks rethrows Errc::aborted with its reason when every rank was aborted") {
  try {
    run_ranks(3, [](Communicator& c) {
      if (c.rank() == 0) c.abort("operator stop");
      c.barrier();
    });
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::aborted);
    CHECK(e.detail() == "barrier: group aborted: operator stop");
  }
}

TEST_CASE("a collective that a returned rank will never join fails with comm_error") {
  try {
    run_ranks(3, [](Communicator& c) {
      c.barrier();
      if (c.rank() == 0) return;  // skips the second barrier the others call
      c.barrier();
    });
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::comm_error);
    CHECK(e.detail() ==
          "barrier: rank 0 returned from its rank function and will never join this collective");
  }
}

TEST_CASE("run_ranks rejects a world size outside 1..1024") {
  bool ran = false;
  CHECK_THROWS_AS(run_ranks(0, [&](Communicator&) { ran = true; }), Error);
  CHECK_FALSE(ran);
}

TEST_CASE("a second thread entering a collective on a busy rank gets invalid_argument") {
  // Two threads drive rank 0 while rank 1 holds back until one of them has been refused, so
  // the two calls are certainly concurrent; the other completes once rank 1 joins.
  auto comms = make_thread_group(2);
  std::atomic<int> refused{0}, completed{0};
  std::string refusal;
  const auto drive_rank0 = [&] {
    try {
      comms[0]->barrier();
      ++completed;
    } catch (const Error& e) {
      if (e.code() == Errc::invalid_argument) {
        refusal = e.detail();
        ++refused;
      }
    }
  };
  std::thread a(drive_rank0), b(drive_rank0);
  std::thread rank1([&] {
    while (refused.load() == 0) std::this_thread::yield();
    comms[1]->barrier();
  });
  a.join();
  b.join();
  rank1.join();
  CHECK(refused.load() == 1);
  CHECK(completed.load() == 1);
  CHECK(refusal == "barrier: rank 0's communicator is already in a collective on another thread");
}
