// How the ranks of one checkpoint agree that it is complete, without sharing memory.
//
// Every rank, once its shard is durable (or has failed), hands the coordinator a report as
// text (JSON). When all world_size reports of a step are in, the coordinator runs the commit
// exactly once, on one rank, with the reports in rank order, and delivers the commit's
// outcome (text again) to every rank. The in-process coordinator below does this with a
// mutex; a multi-process backend sends the same strings over its own channel to one
// committing rank and back, on a channel of its own so it can never interleave with the
// training loop's collectives.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ckpt {

class CommitCoordinator {
 public:
  /// Runs the commit with every rank's report (rank order); returns the outcome text.
  using CommitFn = std::function<std::string(const std::vector<std::string>& reports)>;
  /// Receives the outcome text on a rank.
  using OutcomeFn = std::function<void(const std::string& outcome)>;

  virtual ~CommitCoordinator() = default;
  virtual int world_size() const noexcept = 0;
  /// Rank `rank` delivers its report for `step`. Never blocks on other ranks. If this is the
  /// last report of the step, `commit` runs on the calling thread before this returns, and
  /// every rank's `on_outcome` is called (also on the calling thread, in-process). Reporting
  /// twice for one (step, rank) is Errc::invalid_argument.
  virtual void report(std::uint64_t step, int rank, std::string report, CommitFn commit, OutcomeFn on_outcome) = 0;
  /// Gives up on `step` (some rank will never report): every rank that reported gets
  /// `outcome`; later reports for the step are answered with it at once.
  virtual void abandon(std::uint64_t step, const std::string& outcome) = 0;
  /// Ranks that have reported for `step` so far.
  virtual std::vector<int> reported(std::uint64_t step) const = 0;

  /// The ranks this process saves (its Checkpointer accepts save() for these only and counts
  /// only these in its one-in-flight barrier and shutdown drain). Default: all of them.
  virtual std::vector<int> local_ranks() const;
  /// Called once by each process's Checkpointer at construction. Runs `prepare` (the root's
  /// crash cleanup) in exactly one process before any process can start a checkpoint, and
  /// returns the run id every process names its temporary directories with; empty means
  /// one process writes everything (the temporary gets a per-process name). Default:
  /// prepare(), then "". A multi-process coordinator makes this collective.
  virtual std::string start_run(const std::function<void()>& prepare);
};

/// The coordinator for ranks that are threads of one process.
std::unique_ptr<CommitCoordinator> make_in_process_coordinator(int world_size);

}  // namespace ckpt
