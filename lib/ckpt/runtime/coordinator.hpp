// How the ranks of one checkpoint agree that it is complete, without sharing memory.
//
// Every rank, once its shard is durable (or has failed), hands the coordinator a typed report
// (RankReport: the shard's manifest part, or the rank's error). When all world_size reports of
// a step are in, the coordinator runs the commit exactly once, on one rank, with the reports in
// rank order, and delivers the commit's outcome (CommitOutcome) to every rank. The in-process
// coordinator below does this with a mutex; a multi-process backend encodes the same structs
// for its wire (runtime/wire.hpp, the one place they become text) and sends them over a
// channel of its own to one committing rank and back, so they can never interleave with the
// training loop's collectives.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/format/manifest.hpp"

namespace ckpt {

class FileTransport;  // fs/remote_file_system.hpp

/// What one rank hands the coordinator for a step: its shard's part of the manifest once the
/// shard is durable, or the error that stopped it.
struct RankReport {
  int rank = 0;
  std::optional<Error> error;  ///< set: this rank failed, and so does the checkpoint
  ShardReport shard;           ///< without error: the shard's record and tensor index
  /// Checkpoints across node roots: the redundancy blocks this rank's process wrote for the
  /// step (with their checksums), carried by the lowest rank it hosts; the commit places them
  /// in the manifest in planned order, and a block missing from every report fails it.
  std::vector<RedundancyBlock> blocks;
};

/// What the commit hands back to every rank.
struct CommitOutcome {
  std::optional<Error> error;          ///< set: the checkpoint was not committed
  std::string dir;                     ///< the committed checkpoint directory
  std::chrono::nanoseconds commit{};   ///< time the commit took (manifest, renames, fsyncs, latest)
};

class CommitCoordinator {
 public:
  /// Runs the commit with every rank's report (rank order); returns the outcome.
  using CommitFn = std::function<CommitOutcome(std::vector<RankReport>& reports)>;
  /// Receives the outcome on a rank.
  using OutcomeFn = std::function<void(const CommitOutcome& outcome)>;

  virtual ~CommitCoordinator() = default;
  virtual int world_size() const noexcept = 0;
  /// Rank `report.rank` delivers its report for `step`. Never blocks on other ranks. If this is the
  /// last report of the step, `commit` runs on the calling thread before this returns, and
  /// every rank's `on_outcome` is called (also on the calling thread, in-process). Reporting
  /// twice for one (step, rank) is Errc::invalid_argument.
  virtual void report(std::uint64_t step, RankReport report, CommitFn commit, OutcomeFn on_outcome) = 0;
  /// Gives up on `step` (some rank will never report): every rank that reported gets
  /// `outcome`; later reports for the step are answered with it at once.
  virtual void abandon(std::uint64_t step, const CommitOutcome& outcome) = 0;
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

  // ---- Between processes: checkpoints across node-local roots ---------------------------
  // With ranks in several processes and node-local roots (CheckpointerOptions::nodes), a
  // node's root is reachable only from that node's processes. The redundancy bytes of a save
  // move between processes through send_bytes/receive_bytes, the shard sizes through
  // exchange, and the process that commits reaches the other nodes' roots through
  // file_transport() (each process serves its own files to the others). On the coordinator's
  // own channel, never the training's. The defaults are those of one process, where every
  // rank is local: exchange() returns {mine}, send_bytes() and receive_bytes() throw
  // Errc::invalid_argument (nothing to move), file_transport() is null.

  /// Every process's `mine` for `step`, one string per process in the order of the ranks they
  /// host. Blocks until each process has called it for the step. Collective over the processes.
  virtual std::vector<std::string> exchange(std::uint64_t step, const std::string& mine);
  /// Sends `bytes` to the process hosting rank `to` on `channel`; returns once they are handed
  /// over (the buffer may be reused). Messages from one process on one channel arrive in the
  /// order sent. Thread-safe; a channel has one sending and one receiving thread at a time.
  virtual void send_bytes(int to, std::uint32_t channel, std::span<const std::byte> bytes);
  /// Receives the next message from the process hosting rank `from` on `channel` into `out`.
  /// Blocks until it arrives. A message of another size is Errc::comm_error naming both.
  virtual void receive_bytes(int from, std::uint32_t channel, std::span<std::byte> out);
  /// The transport through which this process calls the file services of the others (the
  /// process hosting rank r serves its node's files); null when one process hosts every rank.
  virtual FileTransport* file_transport();
};

/// The coordinator for ranks that are threads of one process.
std::unique_ptr<CommitCoordinator> make_in_process_coordinator(int world_size);

}  // namespace ckpt
