// SPDX-License-Identifier: Apache-2.0
// The commit coordination protocol (runtime/coordinator.hpp), once for every backend: over a
// transport of several "processes" (threads here, each with its own ChannelCoordinator and
// channel thread, joined by an in-memory transport that behaves as MPI's or gloo's
// collectives do), and without one (every rank a thread of one process).
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/runtime/coordinator.hpp"
#include "ckpt/runtime/wire.hpp"
#include "ckpt/format/sharding.hpp"
#include "support/test_support.hpp"

using namespace ckpt;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The collectives of `processes` processes: each process's k-th call meets the others' k-th.
struct Loopback {
  explicit Loopback(int n) : processes(n) {}
  int processes;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<int, int>, std::string> slots;  // (collective, process) -> message
  bool cut = false;  // the connection is gone: every wait throws
};

class LoopTransport final : public CoordinationTransport {
 public:
  LoopTransport(Loopback& lb, int me) : lb_(lb), me_(me) {}
  std::function<void(int collective)> fault;  // throws to cut the channel at a collective
  std::vector<std::string> gather(const std::string& mine) override {
    const int k = next_++;
    if (fault) fault(k);
    std::unique_lock lk(lb_.mu);
    lb_.slots[{k, me_}] = mine;
    lb_.cv.notify_all();
    if (me_ != 0) return {};
    lb_.cv.wait(lk, [&] {
      if (lb_.cut) return true;
      for (int p = 0; p < lb_.processes; ++p)
        if (!lb_.slots.count({k, p})) return false;
      return true;
    });
    if (lb_.cut) throw std::runtime_error("connection cut");
    std::vector<std::string> out;
    for (int p = 0; p < lb_.processes; ++p) out.push_back(lb_.slots[{k, p}]);
    return out;
  }
  std::string broadcast(const std::string& text) override {
    const int k = next_++;
    if (fault) fault(k);
    std::unique_lock lk(lb_.mu);
    if (me_ == 0) {
      lb_.slots[{k, 0}] = text;
      lb_.cv.notify_all();
      return text;
    }
    lb_.cv.wait(lk, [&] { return lb_.cut || lb_.slots.count({k, 0}) > 0; });
    if (lb_.cut) throw std::runtime_error("connection cut");
    return lb_.slots[{k, 0}];
  }

 private:
  Loopback& lb_;
  int me_;
  int next_ = 0;
};

// A job of `n` processes, each a ChannelCoordinator over its LoopTransport with a channel
// thread running serve().
struct Job {
  explicit Job(int n) : lb(n) {
    for (int p = 0; p < n; ++p) transports.push_back(std::make_unique<LoopTransport>(lb, p));
    for (int p = 0; p < n; ++p) coords.push_back(std::make_unique<ChannelCoordinator>(n, p, *transports[static_cast<std::size_t>(p)]));
    for (int p = 0; p < n; ++p) channels.emplace_back([this, p] { coords[static_cast<std::size_t>(p)]->serve(); });
  }
  ~Job() {
    for (auto& c : coords) c->close();
    for (auto& t : channels) t.join();
  }
  int size() const { return lb.processes; }
  Loopback lb;
  std::vector<std::unique_ptr<LoopTransport>> transports;
  std::vector<std::unique_ptr<ChannelCoordinator>> coords;
  std::vector<std::thread> channels;
};

// One rank's outcome of a step, waited for.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<CommitOutcome> outcome;
  CommitCoordinator::OutcomeFn fn() {
    return [this](const CommitOutcome& o) {
      std::lock_guard lk(mu);
      outcome = o;
      cv.notify_all();
    };
  }
  CommitOutcome get() {
    std::unique_lock lk(mu);
    REQUIRE(cv.wait_for(lk, std::chrono::seconds(30), [&] { return outcome.has_value(); }));
    return *outcome;
  }
};

// A shard report as a rank hands it over (one tensor, chunk checksums), sized by its rank.
RankReport good_report(int rank) {
  RankReport r;
  r.rank = rank;
  r.shard.shard.rank = rank;
  r.shard.shard.path = "rank-0000" + std::to_string(rank) + "-of-00004.safetensors";
  r.shard.shard.size = 8200u + static_cast<std::uint64_t>(rank);
  r.shard.shard.sha256 = std::string(64, 'a');
  r.shard.shard.chunk_xxh3 = {1, 2, 3};
  r.shard.chunk_size = 4096;
  r.shard.tensors.push_back({"w", rank, DType::U8, {8}, 4096, 4104, rank_local()});
  return r;
}

// Every process reports `step` for its rank; returns each rank's outcome. `commits` counts
// the commits run and `seen` the ranks and sizes the commit saw.
std::vector<CommitOutcome> vote(Job& job, std::uint64_t step, std::atomic<int>& commits, std::vector<std::pair<int, std::uint64_t>>* seen = nullptr,
                                const std::function<RankReport(int)>& report_of = good_report) {
  std::vector<Waiter> waiters(static_cast<std::size_t>(job.size()));
  std::vector<std::thread> ranks;
  for (int p = 0; p < job.size(); ++p)
    ranks.emplace_back([&, p] {
      job.coords[static_cast<std::size_t>(p)]->report(
          step, report_of(p),
          [&](std::vector<RankReport>& reports) {
            ++commits;
            CommitOutcome o;
            for (const auto& r : reports) {
              if (seen) seen->push_back({r.rank, r.error ? 0 : r.shard.shard.size});
              if (r.error && !o.error) o.error = r.error;
            }
            o.dir = "/root/step-" + std::to_string(step);
            return o;
          },
          waiters[static_cast<std::size_t>(p)].fn());
    });
  for (auto& t : ranks) t.join();
  std::vector<CommitOutcome> out;
  for (auto& w : waiters) out.push_back(w.get());
  return out;
}

}  // namespace

TEST_CASE("over a transport, the start-run handshake runs prepare once, on the process of rank 0, and every process gets its run id") {
  Job job(3);
  std::atomic<int> prepared{0};
  std::vector<std::string> ids(3);
  std::vector<std::thread> ts;
  for (int p = 0; p < 3; ++p)
    ts.emplace_back([&, p] { ids[static_cast<std::size_t>(p)] = job.coords[static_cast<std::size_t>(p)]->start_run([&] { ++prepared; }); });
  for (auto& t : ts) t.join();
  CHECK(prepared == 1);
  CHECK_FALSE(ids[0].empty());
  CHECK(ids[1] == ids[0]);
  CHECK(ids[2] == ids[0]);
  CHECK(job.coords[1]->local_ranks() == std::vector<int>{1});
}

TEST_CASE("over a transport, a failed prepare on rank 0 is every process's error, typed as it was thrown") {
  Job job(3);
  std::vector<std::optional<Error>> errors(3);
  std::vector<std::thread> ts;
  for (int p = 0; p < 3; ++p)
    ts.emplace_back([&, p] {
      try {
        job.coords[static_cast<std::size_t>(p)]->start_run([] { throw Error(Errc::busy, "/root", "held by pid 7"); });
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(p)] = e;
      }
    });
  for (auto& t : ts) t.join();
  for (const auto& e : errors) {
    REQUIRE(e.has_value());
    CHECK(e->code() == Errc::busy);
    CHECK(e->file() == "/root");
    CHECK(e->detail() == "held by pid 7");
  }
}

TEST_CASE("over a transport, each step commits once on rank 0 with every rank's report in rank order, and every rank gets the outcome") {
  Job job(4);
  std::atomic<int> commits{0};
  for (std::uint64_t step : {10u, 20u, 30u}) {
    std::vector<std::pair<int, std::uint64_t>> seen;
    const auto outcomes = vote(job, step, commits, &seen);
    CHECK(seen == std::vector<std::pair<int, std::uint64_t>>{{0, 8200}, {1, 8201}, {2, 8202}, {3, 8203}});
    for (const auto& o : outcomes) {
      CHECK_FALSE(o.error.has_value());
      CHECK(o.dir == "/root/step-" + std::to_string(step));
    }
  }
  CHECK(commits == 3);
}

TEST_CASE("over a transport, a rank's failure reaches the commit typed, and the commit's outcome fails every rank") {
  Job job(3);
  std::atomic<int> commits{0};
  const auto outcomes = vote(job, 10, commits, nullptr, [](int rank) {
    RankReport r = good_report(rank);
    if (rank == 2) r.error = Error(Errc::no_space, "/root/.tmp-step-10/rank-2", "disk full");
    return r;
  });
  CHECK(commits == 1);
  for (const auto& o : outcomes) {
    REQUIRE(o.error.has_value());
    CHECK(o.error->code() == Errc::no_space);
    CHECK(o.error->file() == "/root/.tmp-step-10/rank-2");
  }
}

TEST_CASE("over a transport, votes on different steps are not committed: every rank fails with comm_error naming both steps") {
  Job job(2);
  std::atomic<int> commits{0};
  Waiter w0, w1;
  const auto commit = [&](std::vector<RankReport>&) {
    ++commits;
    return CommitOutcome{};
  };
  job.coords[0]->report(10, good_report(0), commit, w0.fn());
  job.coords[1]->report(11, good_report(1), commit, w1.fn());
  for (Waiter* w : {&w0, &w1}) {
    const CommitOutcome o = w->get();
    REQUIRE(o.error.has_value());
    CHECK(o.error->code() == Errc::comm_error);
    CHECK(contains(o.error->what(), "rank 1 on step 11"));
    CHECK(contains(o.error->what(), "rank 0 on step 10"));
  }
  CHECK(commits == 0);
}

TEST_CASE("over a transport, a channel that fails fails that step and every later one with comm_error saying why, and sends nothing more") {
  Job job(2);
  // Process 1's channel breaks at its third collective (the first step's vote takes two).
  job.transports[1]->fault = [](int k) {
    if (k == 2) throw std::runtime_error("connection reset by peer");
  };
  std::atomic<int> commits{0};
  const auto first = vote(job, 10, commits);
  CHECK_FALSE(first[1].error.has_value());
  Waiter w1;
  job.coords[1]->report(20, good_report(1), [](std::vector<RankReport>&) { return CommitOutcome{}; }, w1.fn());
  const CommitOutcome o = w1.get();
  REQUIRE(o.error.has_value());
  CHECK(o.error->code() == Errc::comm_error);
  CHECK(contains(o.error->what(), "checkpoint coordination failed at step 20"));
  CHECK(contains(o.error->what(), "connection reset by peer"));
  Waiter later;
  job.coords[1]->report(30, good_report(1), [](std::vector<RankReport>&) { return CommitOutcome{}; }, later.fn());
  const CommitOutcome again = later.get();
  REQUIRE(again.error.has_value());
  CHECK(contains(again.error->what(), "failed at step 20"));
  // Process 0 waits for a vote that never comes: closing ends its wait with comm_error.
  Waiter w0;
  job.coords[0]->report(20, good_report(0), [](std::vector<RankReport>&) { return CommitOutcome{}; }, w0.fn());
  job.coords[0]->close();
  job.coords[0]->close();  // idempotent
  {
    std::lock_guard lk(job.lb.mu);
    job.lb.cut = true;  // the round process 0 is in ends (its channel thread joins)
  }
  job.lb.cv.notify_all();
  const CommitOutcome closed = w0.get();
  REQUIRE(closed.error.has_value());
  CHECK(closed.error->code() == Errc::comm_error);
  CHECK(commits == 1);
}

TEST_CASE("closing a coordinator fails its unanswered steps and later reports with comm_error instead of waiting forever") {
  Job job(2);
  Waiter w;
  job.coords[1]->report(10, good_report(1), [](std::vector<RankReport>&) { return CommitOutcome{}; }, w.fn());
  job.coords[1]->close();
  const CommitOutcome o = w.get();
  REQUIRE(o.error.has_value());
  CHECK(o.error->code() == Errc::comm_error);
  CHECK(contains(o.error->what(), "closed before the Checkpointer"));
  Waiter after;
  job.coords[1]->report(20, good_report(1), [](std::vector<RankReport>&) { return CommitOutcome{}; }, after.fn());
  REQUIRE(after.get().error.has_value());
  CHECK_THROWS_AS(job.coords[1]->start_run([] {}), Error);
  {
    std::lock_guard lk(job.lb.mu);
    job.lb.cut = true;  // process 1's channel, waiting for rank 0's outcome, ends
  }
  job.lb.cv.notify_all();
}

TEST_CASE("a report of a rank another process hosts, or a second report of a step, is invalid_argument") {
  Job job(2);
  const Error e = test::expect_error([&] { job.coords[0]->report(10, good_report(1), {}, {}); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "0");
  CHECK(e.actual() == "1");
  Waiter w;  // outlives the coordinator
  auto one = make_in_process_coordinator(2);
  one->report(10, good_report(0), [](std::vector<RankReport>&) { return CommitOutcome{}; }, w.fn());
  const Error twice = test::expect_error([&] { one->report(10, good_report(0), {}, {}); });
  CHECK(twice.code() == Errc::invalid_argument);
  CHECK(contains(twice.what(), "reported step 10 twice"));
  CHECK(one->reported(10) == std::vector<int>{0});
}

TEST_CASE("without a transport, the last reporter commits on its own thread before report returns, and abandon answers every rank") {
  auto c = make_in_process_coordinator(3);
  CHECK(c->start_run([] {}).empty());
  CHECK(c->local_ranks() == std::vector<int>{0, 1, 2});
  std::vector<Waiter> w(3);
  std::thread::id committer;
  int commits = 0;
  for (int r = 0; r < 3; ++r)
    c->report(10, good_report(r),
              [&](std::vector<RankReport>& reports) {
                ++commits;
                committer = std::this_thread::get_id();
                CHECK(reports.size() == 3);
                return CommitOutcome{.dir = "/root/step-10"};
              },
              w[static_cast<std::size_t>(r)].fn());
  CHECK(commits == 1);
  CHECK(committer == std::this_thread::get_id());
  for (auto& x : w) CHECK(x.get().dir == "/root/step-10");
  // Rank 2 never saves step 20: abandoning it answers the ranks that reported, and the late one.
  Waiter a0, a2;
  c->report(20, good_report(0), [](std::vector<RankReport>&) { return CommitOutcome{}; }, a0.fn());
  CHECK(c->reported(20) == std::vector<int>{0});
  CommitOutcome gave_up;
  gave_up.error = Error(Errc::aborted, {}, "abandoned at shutdown");
  c->abandon(20, gave_up);
  CHECK(a0.get().error->code() == Errc::aborted);
  c->report(20, good_report(2), [](std::vector<RankReport>&) { return CommitOutcome{}; }, a2.fn());
  CHECK(a2.get().error->code() == Errc::aborted);
  CHECK(c->reported(20).empty());
}
