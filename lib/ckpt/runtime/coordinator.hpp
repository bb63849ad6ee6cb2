// SPDX-License-Identifier: Apache-2.0
// How the ranks of one checkpoint agree that it is complete, without sharing memory.
//
// Every rank, once its shard is durable (or has failed), hands the coordinator a typed report
// (RankReport: the shard's manifest part, or the rank's error). When all world_size reports of
// a step are in, the coordinator runs the commit exactly once, on one rank, with the reports in
// rank order, and delivers the commit's outcome (CommitOutcome) to every rank.
//
// The protocol is written once (ChannelCoordinator): the start-run handshake (the process
// hosting rank 0 cleans the root up and names the run; the others wait for its word) and the
// commit vote (each process's reports gathered on process 0, which commits once all are in,
// and the outcome broadcast back). Ranks that are threads of one process need no transport:
// the last reporter runs the round on its own thread. Ranks in several processes (MPI, a
// torch.distributed job) supply only a CoordinationTransport, two collectives over a channel
// of their own, so the checkpoint's messages never interleave with the training's; the
// messages are runtime/wire.hpp's (the one place the typed structs become text).
#pragma once

#include "ckpt/core/export.hpp"

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

CKPT_API_BEGIN
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

/// The bytes a multi-process coordinator moves between its processes, process p hosting rank
/// p: two collectives on a channel of the backend's own. Every process calls them in the same
/// order (ChannelCoordinator::serve does). A failure throws (any exception); the channel is
/// then taken as broken.
class CoordinationTransport {
 public:
  virtual ~CoordinationTransport() = default;
  /// Every process's `mine`, in process order, on process 0; empty elsewhere.
  virtual std::vector<std::string> gather(const std::string& mine) = 0;
  /// Process 0's `text` on every process (the others' `text` is ignored).
  virtual std::string broadcast(const std::string& text) = 0;
};

/// The commit coordination protocol (the top of this file), over a transport or none.
///
/// Without a transport, one process hosts every rank: start_run runs `prepare` and returns ""
/// (one process writes everything); the last report of a step runs the commit on the calling
/// thread and calls every rank's on_outcome there, before report() returns.
///
/// With a transport of `world_size` processes, this process hosts rank `transport_rank`:
/// report() queues the rank's report and returns; the backend's channel thread runs serve(),
/// which takes the queued rounds in order: the start-run handshake (process 0 runs `prepare`
/// and names the run; a failure there is every process's) and each step's vote (gather on
/// process 0, where the reports must all be of the step, each taken as its sender's rank;
/// the commit; the outcome broadcast and delivered). A transport failure breaks the channel:
/// that step and every later one fails on this process with Errc::comm_error saying why, and
/// nothing more is sent. close() ends serve() and fails every step still unanswered.
class ChannelCoordinator : public CommitCoordinator {
 public:
  /// One process, every rank: no transport.
  explicit ChannelCoordinator(int world_size);
  /// Ranks in `world_size` processes; this one hosts `rank`. `transport` outlives this.
  ChannelCoordinator(int world_size, int rank, CoordinationTransport& transport);
  ~ChannelCoordinator() override;
  ChannelCoordinator(const ChannelCoordinator&) = delete;
  ChannelCoordinator& operator=(const ChannelCoordinator&) = delete;

  int world_size() const noexcept override;
  std::vector<int> local_ranks() const override;
  std::string start_run(const std::function<void()>& prepare) override;
  void report(std::uint64_t step, RankReport report, CommitFn commit, OutcomeFn on_outcome) override;
  void abandon(std::uint64_t step, const CommitOutcome& outcome) override;
  std::vector<int> reported(std::uint64_t step) const override;

  /// The channel thread's loop (with a transport): runs the queued rounds until close().
  void serve();
  /// Ends serve() and fails every step reported and not answered, or reported from now on,
  /// with Errc::comm_error (the Checkpointer is meant to be closed first; if it is not, its
  /// saves end instead of waiting forever). A start_run waiting for its answer fails with
  /// Errc::aborted. Idempotent. The destructor ends serve() without calling anyone back.
  void close();

 protected:
  /// Ends serve() (after the round it is in) without calling any step's callback back: for a
  /// backend's destructor, which must join its channel thread.
  void stop_serving() noexcept;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

/// The coordinator for ranks that are threads of one process (a ChannelCoordinator without
/// a transport).
std::unique_ptr<CommitCoordinator> make_in_process_coordinator(int world_size);

}  // namespace ckpt
CKPT_API_END
