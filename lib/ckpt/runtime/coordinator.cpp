#include "ckpt/runtime/coordinator.hpp"

#include <map>
#include <mutex>
#include <optional>

#include "ckpt/core/error.hpp"

namespace ckpt {

namespace {

class InProcessCoordinator final : public CommitCoordinator {
 public:
  explicit InProcessCoordinator(int world) : world_(world) {
    if (world < 1) throw_invalid("coordinator world size must be >= 1");
  }
  int world_size() const noexcept override { return world_; }

  void report(std::uint64_t step, RankReport report, CommitFn commit, OutcomeFn on_outcome) override {
    const int rank = report.rank;
    check_rank(rank, world_, "report rank");
    std::unique_lock lk(mu_);
    if (auto it = abandoned_.find(step); it != abandoned_.end()) {
      const CommitOutcome outcome = it->second;
      lk.unlock();
      on_outcome(outcome);
      return;
    }
    Step& s = steps_[step];
    if (s.reports.empty()) s.reports.resize(static_cast<std::size_t>(world_)), s.outcome_fns.resize(static_cast<std::size_t>(world_));
    if (s.outcome_fns[static_cast<std::size_t>(rank)])
      throw Error(Errc::invalid_argument, {}, "rank " + std::to_string(rank) + " reported step " + std::to_string(step) + " twice");
    s.reports[static_cast<std::size_t>(rank)] = std::move(report);
    s.outcome_fns[static_cast<std::size_t>(rank)] = std::move(on_outcome);
    if (++s.count < world_) return;
    Step done = std::move(s);
    steps_.erase(step);
    lk.unlock();
    // The last reporter commits; nobody else touches this step any more.
    const CommitOutcome outcome = commit(done.reports);
    for (auto& fn : done.outcome_fns) fn(outcome);
  }

  void abandon(std::uint64_t step, const CommitOutcome& outcome) override {
    std::unique_lock lk(mu_);
    abandoned_[step] = outcome;
    auto it = steps_.find(step);
    if (it == steps_.end()) return;
    Step s = std::move(it->second);
    steps_.erase(it);
    lk.unlock();
    for (auto& fn : s.outcome_fns)
      if (fn) fn(outcome);
  }

  std::vector<int> reported(std::uint64_t step) const override {
    std::lock_guard lk(mu_);
    std::vector<int> out;
    auto it = steps_.find(step);
    if (it == steps_.end()) return out;
    for (int r = 0; r < world_; ++r)
      if (it->second.outcome_fns[static_cast<std::size_t>(r)]) out.push_back(r);
    return out;
  }

 private:
  struct Step {
    std::vector<RankReport> reports;
    std::vector<OutcomeFn> outcome_fns;
    int count = 0;
  };
  int world_;
  mutable std::mutex mu_;
  std::map<std::uint64_t, Step> steps_;
  std::map<std::uint64_t, CommitOutcome> abandoned_;
};

}  // namespace

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

std::unique_ptr<CommitCoordinator> make_in_process_coordinator(int world_size) {
  return std::make_unique<InProcessCoordinator>(world_size);
}

}  // namespace ckpt
