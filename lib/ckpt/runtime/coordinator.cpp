// SPDX-License-Identifier: Apache-2.0
// The commit coordination protocol (coordinator.hpp), once for every backend.
#include "ckpt/runtime/coordinator.hpp"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <unistd.h>

#include "ckpt/core/error.hpp"
#include "ckpt/runtime/wire.hpp"

namespace ckpt {

struct ChannelCoordinator::State {
  // A step's reports of this process's ranks, until all of them are in.
  struct Step {
    std::map<int, RankReport> reports;
    CommitFn commit;  // the last reporter's
  };
  // A round of the channel: the start of the run, or a step's vote.
  struct Round {
    bool start = false;
    std::uint64_t step = 0;
    std::string mine;  // this process's message
    CommitFn commit;   // process 0's
  };

  int world = 0;
  int rank = 0;                               // with a transport: the rank (and process) hosted here
  CoordinationTransport* transport = nullptr;  // null: every rank here
  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<std::uint64_t, Step> steps;                                  // reports so far, round not yet run
  std::map<std::uint64_t, std::map<int, OutcomeFn>> waiting;            // reported, not answered
  std::map<std::uint64_t, CommitOutcome> abandoned;
  std::deque<Round> rounds;                                             // for serve(), in order
  std::optional<std::string> start_answer;
  std::optional<std::string> broken;  // why the channel failed
  bool closed = false;

  int local_count() const { return transport ? 1 : world; }

  static CommitOutcome failed(Errc code, std::string what) {
    CommitOutcome o;
    o.error = Error(code, {}, std::move(what));
    return o;
  }
  static CommitOutcome closed_outcome(std::uint64_t step) {
    return failed(Errc::comm_error, "step " + std::to_string(step) +
                                        ": the checkpoint coordinator was closed before the Checkpointer (close the Checkpointer first)");
  }

  // Hands every local rank waiting for `step` its outcome.
  void deliver(std::uint64_t step, const CommitOutcome& outcome) {
    std::map<int, OutcomeFn> fns;
    {
      std::lock_guard lk(mu);
      if (auto it = waiting.find(step); it != waiting.end()) {
        fns = std::move(it->second);
        waiting.erase(it);
      }
    }
    for (auto& [r, fn] : fns)
      if (fn) fn(outcome);
  }

  // Process 0: the commit over every process's vote (process order), as an outcome.
  CommitOutcome commit_votes(std::uint64_t step, const std::vector<std::string>& votes, const CommitFn& commit) {
    if (static_cast<int>(votes.size()) != world)
      return failed(Errc::comm_error, "step " + std::to_string(step) + ": votes gathered: expected " + std::to_string(world) + ", actual " +
                                          std::to_string(votes.size()));
    std::vector<RankReport> reports;
    for (int p = 0; p < world; ++p) {
      RankReport rep;
      try {
        const detail::Vote v = detail::decode_vote(votes[static_cast<std::size_t>(p)]);
        if (v.step != step)
          return failed(Errc::comm_error, "the ranks voted on different steps: rank " + std::to_string(p) + " on step " + std::to_string(v.step) +
                                              ", rank 0 on step " + std::to_string(step));
        if (v.reports.size() != 1)
          throw Error(Errc::comm_error, {}, "vote of rank " + std::to_string(p) + " on step " + std::to_string(step), "1 report",
                      std::to_string(v.reports.size()) + " reports");
        rep = detail::decode_rank_report(v.reports.front());
      } catch (const Error& e) {
        rep = RankReport{};
        rep.error = e;
      }
      rep.rank = p;  // the sender is the rank, whatever the message says
      reports.push_back(std::move(rep));
    }
    try {
      return commit(reports);
    } catch (...) {
      CommitOutcome o;
      o.error = to_error(std::current_exception());
      return o;
    }
  }

  // One round on the channel (serve's thread).
  void run(Round& r) {
    if (r.start) {
      const std::string answer = transport->broadcast(r.mine);
      std::lock_guard lk(mu);
      start_answer = answer;
      cv.notify_all();
      return;
    }
    const std::vector<std::string> votes = transport->gather(r.mine);
    std::string outcome_text;
    if (rank == 0) {
      // The commit, and what it holds of the step, go once it has run: before the outcome
      // lets the Checkpointer go on (and perhaps end).
      const CommitFn commit = std::move(r.commit);
      r.commit = nullptr;
      outcome_text = detail::encode_outcome(commit_votes(r.step, votes, commit));
    }
    outcome_text = transport->broadcast(outcome_text);
    CommitOutcome outcome;
    try {
      outcome = detail::decode_outcome(outcome_text);
    } catch (const Error& e) {
      outcome.error = e;
    }
    deliver(r.step, outcome);
  }

  // A round the channel could not run: the start's waiter, or the step's ranks, get `why`.
  void fail(const Round& r, const std::string& why) {
    if (r.start) {
      std::lock_guard lk(mu);
      start_answer = detail::encode_run_start_failure(Error(Errc::comm_error, {}, why));
      cv.notify_all();
      return;
    }
    deliver(r.step, failed(Errc::comm_error, why));
  }
};

ChannelCoordinator::ChannelCoordinator(int world_size) : s_(std::make_unique<State>()) {
  if (world_size < 1) throw_invalid("coordinator world size must be >= 1");
  s_->world = world_size;
}

ChannelCoordinator::ChannelCoordinator(int world_size, int rank, CoordinationTransport& transport) : s_(std::make_unique<State>()) {
  if (world_size < 1) throw_invalid("coordinator world size must be >= 1");
  check_rank(rank, world_size, "coordinator rank");
  s_->world = world_size;
  s_->rank = rank;
  s_->transport = &transport;
}

// Nobody is answered here: the callbacks of steps still waiting belong to a Checkpointer that
// is gone or going (close() is the explicit way to fail them).
ChannelCoordinator::~ChannelCoordinator() { stop_serving(); }

void ChannelCoordinator::stop_serving() noexcept {
  std::lock_guard lk(s_->mu);
  s_->closed = true;
  s_->rounds.clear();
  s_->cv.notify_all();
}

int ChannelCoordinator::world_size() const noexcept { return s_->world; }

std::vector<int> ChannelCoordinator::local_ranks() const {
  if (s_->transport) return {s_->rank};
  return CommitCoordinator::local_ranks();
}

std::string ChannelCoordinator::start_run(const std::function<void()>& prepare) {
  State& s = *s_;
  if (!s.transport) {
    prepare();
    return {};
  }
  std::string mine;
  if (s.rank == 0) {
    try {
      prepare();
      std::random_device rd;
      char buf[32];
      std::snprintf(buf, sizeof buf, "run%x%08x", static_cast<unsigned>(::getpid()), rd());
      mine = detail::encode_run_start(buf);
    } catch (...) {
      mine = detail::encode_run_start_failure(to_error(std::current_exception()));
    }
  }
  std::unique_lock lk(s.mu);
  if (s.closed) throw Error(Errc::aborted, {}, "the checkpoint coordinator was closed before the run started");
  s.start_answer.reset();
  s.rounds.push_back({.start = true, .mine = std::move(mine), .commit = {}});
  s.cv.notify_all();
  s.cv.wait(lk, [&] { return s.start_answer.has_value() || s.closed; });
  if (!s.start_answer) throw Error(Errc::aborted, {}, "the checkpoint coordinator was closed before the run started");
  const std::string answer = std::move(*s.start_answer);
  s.start_answer.reset();
  lk.unlock();
  return detail::decode_run_start(answer);
}

void ChannelCoordinator::report(std::uint64_t step, RankReport report, CommitFn commit, OutcomeFn on_outcome) {
  State& s = *s_;
  const int rank = report.rank;
  if (s.transport) {
    if (rank != s.rank)
      throw Error(Errc::invalid_argument, {}, "report rank: this process hosts only its own rank", std::to_string(s.rank), std::to_string(rank));
  } else {
    check_rank(rank, s.world, "report rank");
  }
  std::unique_lock lk(s.mu);
  if (auto it = s.abandoned.find(step); it != s.abandoned.end()) {
    const CommitOutcome outcome = it->second;
    lk.unlock();
    on_outcome(outcome);
    return;
  }
  if (s.closed) {
    lk.unlock();
    on_outcome(State::closed_outcome(step));
    return;
  }
  auto& waiting = s.waiting[step];
  if (waiting.contains(rank))
    throw Error(Errc::invalid_argument, {}, "rank " + std::to_string(rank) + " reported step " + std::to_string(step) + " twice");
  waiting[rank] = std::move(on_outcome);
  State::Step& st = s.steps[step];
  st.reports[rank] = std::move(report);
  st.commit = std::move(commit);
  if (static_cast<int>(st.reports.size()) < s.local_count()) return;
  State::Step done = std::move(st);
  s.steps.erase(step);
  if (!s.transport) {
    // Every rank here: the last reporter commits; nobody else touches this step any more.
    lk.unlock();
    std::vector<RankReport> reports;
    for (auto& [r, rep] : done.reports) reports.push_back(std::move(rep));
    const CommitOutcome outcome = done.commit(reports);
    s.deliver(step, outcome);
    return;
  }
  const std::string text = detail::encode_rank_report(step, done.reports.begin()->second);
  // Only process 0 commits; elsewhere the commit (and what it holds of the step) goes now, on
  // the reporting thread, not later on the channel's.
  CommitFn unused;
  if (s.rank != 0) unused = std::move(done.commit);
  s.rounds.push_back({.step = step, .mine = detail::encode_vote(step, std::span(&text, 1)), .commit = std::move(done.commit)});
  s.cv.notify_all();
  lk.unlock();
}

void ChannelCoordinator::abandon(std::uint64_t step, const CommitOutcome& outcome) {
  State& s = *s_;
  {
    std::lock_guard lk(s.mu);
    s.abandoned[step] = outcome;
    s.steps.erase(step);
  }
  s.deliver(step, outcome);
}

std::vector<int> ChannelCoordinator::reported(std::uint64_t step) const {
  std::lock_guard lk(s_->mu);
  std::vector<int> out;
  if (auto it = s_->waiting.find(step); it != s_->waiting.end())
    for (const auto& [r, fn] : it->second) out.push_back(r);
  return out;
}

void ChannelCoordinator::serve() {
  State& s = *s_;
  if (!s.transport) throw_invalid("ChannelCoordinator::serve: a coordinator without a transport has no channel");
  for (;;) {
    State::Round r;
    {
      std::unique_lock lk(s.mu);
      s.cv.wait(lk, [&] { return !s.rounds.empty() || s.closed; });
      if (s.rounds.empty()) return;
      r = std::move(s.rounds.front());
      s.rounds.pop_front();
    }
    std::optional<std::string> broken;
    {
      std::lock_guard lk(s.mu);
      broken = s.broken;
    }
    if (broken) {
      r.commit = nullptr;  // before the failure lets the Checkpointer go on
      s.fail(r, *broken);
      continue;
    }
    try {
      s.run(r);
    } catch (...) {
      const Error e = to_error(std::current_exception());
      const std::string why = "checkpoint coordination failed " + (r.start ? std::string("at the start of the run") : "at step " + std::to_string(r.step)) +
                              ": " + e.what();
      {
        std::lock_guard lk(s.mu);
        s.broken = why;
      }
      r.commit = nullptr;
      s.fail(r, why);
    }
  }
}

void ChannelCoordinator::close() {
  State& s = *s_;
  std::map<std::uint64_t, std::map<int, OutcomeFn>> unanswered;
  {
    std::lock_guard lk(s.mu);
    s.closed = true;
    s.rounds.clear();
    s.steps.clear();
    unanswered.swap(s.waiting);
    s.cv.notify_all();
  }
  for (auto& [step, fns] : unanswered)
    for (auto& [r, fn] : fns)
      if (fn) fn(State::closed_outcome(step));
}

std::vector<int> CommitCoordinator::local_ranks() const {
  std::vector<int> all(static_cast<std::size_t>(world_size()));
  for (int r = 0; r < world_size(); ++r) all[static_cast<std::size_t>(r)] = r;
  return all;
}

std::string CommitCoordinator::start_run(const std::function<void()>& prepare) {
  prepare();
  return {};
}

namespace {
[[noreturn]] void one_process(const char* what) {
  throw Error(Errc::invalid_argument, {}, std::string(what) + ": this coordinator hosts every rank in one process (nothing to move between processes)");
}
}  // namespace

std::vector<std::string> CommitCoordinator::exchange(std::uint64_t, const std::string& mine) { return {mine}; }
void CommitCoordinator::send_bytes(int, std::uint32_t, std::span<const std::byte>) { one_process("send_bytes"); }
void CommitCoordinator::receive_bytes(int, std::uint32_t, std::span<std::byte>) { one_process("receive_bytes"); }
FileTransport* CommitCoordinator::file_transport() { return nullptr; }

std::unique_ptr<CommitCoordinator> make_in_process_coordinator(int world_size) { return std::make_unique<ChannelCoordinator>(world_size); }

}  // namespace ckpt
