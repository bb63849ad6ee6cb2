// SPDX-License-Identifier: Apache-2.0
// The asynchronous checkpointer: what a training loop links.
//
// Each rank thread calls save() with its shard state; save() copies the tensors into the
// rank's staging buffer (pre-faulted, 4096-aligned, reused across saves) and returns a
// SaveHandle at once. A writer thread then streams the shard to disk (io_uring through
// Boost.Asio, or pwrite on a worker pool) while worker threads compute its XXH3 per chunk and
// SHA-256 from the same staged bytes; when every rank's shard of the step is durable, one
// commit runs the protocol of store/local/commit.hpp, then rotation keeps the last K checkpoints.
//
//   ckpt::Checkpointer ckpt({.root = "/ckpts/run1", .world_size = 4, .keep_last = 3});
//   // in rank r's thread, every N steps:
//   ckpt::SaveHandle h = ckpt.save(r, step, tensors, info);   // returns after staging
//   ...train on; h.ready() polls, h.wait() blocks and rethrows a failed save's error...
//
// At most one checkpoint is in flight: a save for a new step that arrives while the previous
// checkpoint is still persisting waits for it (the wait is reported as stall time), or, with
// BusyPolicy::skip, is skipped. The destructor drains every started save; a checkpoint some
// rank never saved is abandoned with Errc::aborted on the handles of the ranks that did, and
// a log line says so.
//
// A full disk frees itself: before each checkpoint, when the root's free space
// (FileSystem::free_space) is below the expected size of the checkpoint, the oldest
// checkpoints older than the one `latest` names are removed (never that one, never one the
// durable tier still has to copy) until it fits or none is left (make_room, store/local/commit.hpp),
// with a log line and CheckpointerStats::early_rotations / early_rotated. The expected size
// is the sum of this process's shards of the step staged when the checkpoint begins, a
// local rank not staged yet counted as the largest staged one; with ranks in several
// processes only the committing process (rank 0's) does this, scaling its shards to the
// world size. Otherwise rotation keeps the last K after each commit, as before.
//
// Failures cannot go unnoticed: every failed checkpoint logs a line naming how many in a
// row have failed since the last commit (CheckpointerStats::consecutive_failures), and with
// CheckpointerOptions::max_consecutive_failures save() refuses to go on. A save that is the
// caller's mistake is refused (Errc::invalid_argument) and is not a failure: it neither
// raises nor resets the count (CheckpointerStats::saves_refused counts it).
//
// Shutdown: close() (or the destructor) refuses new saves, drains the started ones and
// releases the root; it may be called while other threads save or wait. Every save
// accepted before it ends, committed or failed (Errc::aborted when some rank never saved
// its step). A process forked from the one that made the Checkpointer has a copy of it
// without its threads: there close() and the destructor drop that copy without waiting and
// without touching the root, its lock or its temporaries, and the other calls throw.
#pragma once

#include "ckpt/core/export.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/runtime/coordinator.hpp"
#include "ckpt/runtime/tiering.hpp"

// This header needs no Asio. But a translation unit that uses Asio and the checkpointer must
// compile Asio as ckpt does (link ckpt::asio): see runtime/async_wait.hpp for why. Caught
// here when Asio was included first.
#if defined(BOOST_ASIO_DETAIL_CONFIG_HPP) && !defined(BOOST_ASIO_HAS_IO_URING)
#error "Asio is compiled here without BOOST_ASIO_HAS_IO_URING, unlike in ckpt: link the CMake target ckpt::asio"
#endif

CKPT_API_BEGIN
namespace ckpt {

enum class WriterBackend {
  automatic,  ///< io_uring where the kernel allows it, else posix (with one log line)
  io_uring,   ///< io_uring through Boost.Asio's file support; Errc::io_error if unavailable
  posix,      ///< pwrite on a worker pool
};

/// What save() does when the previous checkpoint is still persisting.
enum class BusyPolicy {
  wait,  ///< block until it is committed (back-pressure; measured as stall time)
  skip,  ///< return a handle that reports skipped(); decided once per step for all ranks
};

/// When save() copies the caller's tensors into staging.
enum class Staging {
  /// Before save() returns (default): the caller may modify its tensors as soon as it has.
  copy,
  /// On ckpt's threads, after save() returned: the caller must not modify the saved tensors
  /// (nor free them) until SaveHandle::wait_staged() has returned, which blocks only until the
  /// copy is done. The training thread goes on with forward and backward meanwhile and calls
  /// the fence right before the optimizer step (the only place the saved state changes).
  /// A modification before the fence is the caller's error: the checkpoint may then hold a
  /// mix of old and new bytes, undetected unless CheckpointerOptions::check_deferred_staging.
  deferred,
  /// Before save() returns, as `copy`, but the shard's file is created, written and hashed
  /// while the copy goes on (each piece once it is copied) rather than after it: the
  /// checkpoint is durable sooner, and on a machine with few cores the hashing shares them
  /// with the copy, so save() may return later than with `copy`. save_sync() uses it (its
  /// caller waits for the checkpoint anyway).
  overlapped,
};

/// Ranks grouped into nodes, each node with its own local root (its NVMe), and the
/// redundancy that lets the others rebuild a lost node (format/redundancy.hpp,
/// store/nodes/node_commit.hpp, docs/format.md "Nodes and redundancy").
struct NodeOptions {
  int ranks_per_node = 1;            ///< rank r lives on node r / ranks_per_node
  RedundancyScheme redundancy{};     ///< none, replicate:F or rs:K+M (parse_redundancy)
};

/// CheckpointerOptions::max_file_bytes: one file per rank, however large.
inline constexpr std::uint64_t kOneFilePerRank = ~std::uint64_t{0};

struct CheckpointerOptions {
  /// Checkpoint root: a directory (created if missing), or mem://NAME, a root in shared
  /// memory that outlives the process (store/memory/memory.hpp; keep_last 2 keeps it at two
  /// generations).
  std::string root;
  /// A mem:// root's bound in bytes (StoreOptions::memory_limit; 0: the shared memory's size).
  std::uint64_t memory_limit = 0;
  int world_size = 1;               ///< ranks that save each checkpoint
  int keep_last = 3;                ///< rotation: keep this many checkpoints (0: keep all)
  WriterBackend backend = WriterBackend::automatic;  ///< overridden by env CKPT_WRITER=posix|io_uring
  BusyPolicy when_busy = BusyPolicy::wait;
  bool direct_io = true;            ///< O_DIRECT where the file system allows it
  std::uint64_t chunk_size = kDefaultChunkSize;  ///< XXH3 chunk, also the size of one write
  int queue_depth = 4;              ///< writes in flight per shard file
  /// The most tensor bytes one shard file holds: a rank's tensors are split across files at
  /// tensor boundaries, in the order given (a tensor larger than this has a file of its own),
  /// each file with its own checksums, all written and hashed in parallel (docs/format.md,
  /// schema 3). 0, the default, is automatic: a file's SHA-256 runs on one core, so each rank's
  /// shard is split into hashing threads / local ranks - 1 files of at least 64 MiB (one
  /// thread per rank is left for its copy into staging) when that is 2 or more, else one file
  /// per rank (as on a 2-core machine, where a rank of one file hashes on both cores already).
  /// kOneFilePerRank: always one file (what a node set, `nodes`, always writes).
  std::uint64_t max_file_bytes = 0;
  int hash_threads = 0;             ///< worker threads for hashing, fsync and commit (0: one per core, at least 2)
  /// Pre-allocate (and touch) each local rank's staging now: staging_bytes_for() of its
  /// tensors (0: at the first save; a save that needs more grows it then).
  std::uint64_t staging_bytes_per_rank = 0;
  FileSystem* fs = nullptr;         ///< file system (default: posix); for fault injection
  /// Default: in-process (every rank saves through this object). A multi-process coordinator
  /// (dist/mpi/mpi_comm.hpp) makes this object save only the coordinator's local_ranks():
  /// construction is then collective (rank 0's process cleans the root up, all agree on one
  /// temporary directory per step), only rank 0's process commits, and BusyPolicy::skip is
  /// refused (each process would decide alone).
  CommitCoordinator* coordinator = nullptr;
  /// Two tiers: after each commit (and local rotation) the checkpoint is copied in the
  /// background to this durable root, with its own commit and rotation (runtime/tiering.hpp).
  /// Steps waiting for or being copied are kept by local rotation. Unset: one tier. An
  /// s3:// durable root is claimed at construction (DurableReplicator::claim: its writer
  /// lease, for the run identity kept in this root, ROOT/.run, drawn for a fresh root), so
  /// the constructor throws Errc::busy when another job writes to that prefix,
  /// Errc::conflict when its newest checkpoint is another run's (store/run_identity.hpp), and
  /// Errc::invalid_argument naming the bucket when it does not exist. A store that fails
  /// otherwise (unreachable, 5xx) is logged and left to the first copy, which takes the lease
  /// first; the constructor waits for the client's retries then (a store that accepts
  /// connections and never answers: up to its attempts times its stall timeout).
  std::optional<DurableTierOptions> durable{};
  /// Three levels: a second tier between the root and `durable`, with its own root, cadence
  /// (DurableTierOptions::every) and rotation, copied from the root in the background as the
  /// durable tier is: a memory root (mem://NAME) every step, a local disk every M steps
  /// (this), the durable tier every L (docs/memory.md, "Levels"). A directory (it is read in
  /// place by a resume). Its steps pending or being copied are kept by the root's rotation
  /// too; Checkpointer::copy_to_durable hands a step to both tiers; wait_durable,
  /// drain_durable and the destructor wait for both. Unset: one tier at most.
  std::optional<DurableTierOptions> local_tier{};
  /// Saving a step at or before the one the root's `latest` names is refused (the save fails
  /// with Errc::invalid_argument naming both steps): it would move `latest` back. A run
  /// resumed from an older checkpoint sets this: deliberately, or because the resume may
  /// fall back to the durable tier or to an older good checkpoint when the one `latest`
  /// names is corrupt (Trainer::resume_latest_tiered, open_latest with fallback). Each such
  /// save is then logged, and commits normally; an existing committed step-N is refused even
  /// so. Also sets DurableTierOptions::allow_older_than_latest for the durable tier.
  bool allow_older_than_latest = false;
  /// Stops a loop whose saves keep failing: once this many saves in a row have failed (no
  /// commit in between), save() throws Errc::aborted naming the count and the last error
  /// instead of starting another (and so does every later save(): only a commit resets the
  /// count, so the loop is meant to stop). 0 (default): never; the loop trains on and every failure
  /// is still counted (CheckpointerStats::consecutive_failures) and logged.
  int max_consecutive_failures = 0;
  /// Node-local roots: node n's root is ROOT/node-n (ROOT is then the directory of the node
  /// roots, not a root itself). Each checkpoint is committed across every node root as one
  /// (store/nodes/node_commit.hpp); its redundancy blocks are computed from the staged shards while
  /// they are written (no read-back) and are durable before the commit. Every node root is
  /// locked and prepared (prepare_node_roots), and at construction every kept checkpoint
  /// with files missing or truncated (a replaced node) is rebuilt (repair_node_roots: one
  /// stat per file when nothing is missing), and the checkpoint `latest` names is checked
  /// (Verify::fast) and what is damaged in it rebuilt (repairs() says what was): opening a
  /// checkpoint never writes, so this is where a resume's repair happens. Pre-save rotation
  /// (make_room) is not run on node roots.
  /// Ranks in several processes (a multi-process coordinator, one rank per process): node n's
  /// root is touched only by node n's processes. Each process writes its rank's shard and
  /// the redundancy blocks that live on its node (redundancy_unit_rank), receiving the bytes
  /// of other nodes' shards they are computed from over the coordinator (send_bytes,
  /// receive_bytes; never through a shared file system); rank 0's process prepares, commits
  /// and rotates every node root through the coordinator's file transport (each process
  /// serves its node's files), including the construction's repair, so that each process may
  /// resume from its own node's files. A coordinator without a file transport is refused
  /// (Errc::invalid_argument).
  std::optional<NodeOptions> nodes{};
  /// The default staging of save() (a per-call argument overrides it).
  Staging staging = Staging::copy;
  /// A save() with no tensors is refused (Errc::invalid_argument, before anything starts):
  /// an empty checkpoint is almost always a bug in the caller. Set this where a rank may
  /// legitimately have nothing to save.
  bool allow_empty = false;
  /// Debug aid for Staging::deferred: save() takes the XXH3 of every tensor before it returns
  /// (one pass over the state on the caller's thread) and the copy compares it with what it
  /// copied; a tensor modified before its bytes were copied fails the save with
  /// Errc::invalid_argument naming the rank and tensor, and wait_staged() throws that error.
  bool check_deferred_staging = false;
};

/// Per-save information besides the tensors.
struct SaveInfo {
  std::uint64_t param_shard_offset = 0;  ///< this rank's range of the flat parameter space
  std::uint64_t param_shard_numel = 0;
  std::uint64_t param_numel = 0;         ///< size of the flat parameter space (rank 0's is recorded)
  double wall_clock_seconds = 0;         ///< training time so far (rank 0's is recorded)
  JsonObject metadata;          ///< this rank's state: data position, RNG, ...
  JsonObject training;          ///< global training metadata (rank 0's is recorded)
};

/// What a completed save reports.
struct SaveResult {
  std::uint64_t step = 0;
  std::string dir;             ///< the committed checkpoint directory
  std::uint64_t bytes = 0;     ///< this rank's shard file size
  std::string backend;         ///< "io_uring" or "posix"
  using ns = std::chrono::nanoseconds;
  ns stall{};   ///< time save() waited for the previous checkpoint (back-pressure)
  ns stage{};   ///< time spent copying into staging (by save(), or by ckpt's threads when deferred)
  bool deferred = false;  ///< staged by ckpt's threads after save() returned (Staging::deferred)
  ns write{};   ///< writer: first write submitted to last write completed
  ns hash{};    ///< hashing of this shard (overlaps write)
  ns fsync{};   ///< fsync + close of this shard
  ns commit{};  ///< manifest, renames, fsyncs, latest
  ns total{};   ///< save() call to commit done (rotation runs after it, off this path)
};

/// A rank's last committed save, read back from its staging buffer (Checkpointer::staged):
/// what an in-memory rollback restores without touching the disk.
struct StagedSnapshot {
  std::uint64_t step = 0;           ///< the committed step
  std::vector<TensorView> tensors;  ///< views into the staging buffer, in the shard's data order
  SaveInfo info;                    ///< what save() was given with them
};

namespace detail {
struct SaveState;
}

/// Completion of one rank's save. Cheap to copy; all copies refer to the same save.
/// Thread-safe. In a process forked from the saving one the save never completes: there
/// ready() and staged() are false, and the waits and on_ready() throw Errc::invalid_argument.
class SaveHandle {
 public:
  SaveHandle() = default;
  explicit SaveHandle(std::shared_ptr<detail::SaveState> s) : state_(std::move(s)) {}

  bool valid() const noexcept { return state_ != nullptr; }
  /// True once the checkpoint is committed, has failed, or the save was skipped. Never blocks.
  bool ready() const noexcept;
  /// True if the save was skipped (BusyPolicy::skip); ready() is then true at once.
  bool skipped() const noexcept;
  std::uint64_t step() const noexcept;
  /// Blocks until ready(); returns the result or rethrows the save's ckpt::Error.
  const SaveResult& wait() const;
  /// Blocks until ready() or until `timeout` has passed: returns ready() (never throws the
  /// save's error: wait() does). Errc::invalid_argument on an empty handle.
  bool wait_for(std::chrono::nanoseconds timeout) const;
  /// The fence of a deferred save (Staging::deferred): blocks until the tensors handed to
  /// save() are copied into staging; from then on the caller may modify them. Returns at once
  /// for a copy-before-return save, a skipped one, or a copy already done. Throws the copy's
  /// ckpt::Error (e.g. the check_deferred_staging mismatch), and Errc::invalid_argument on an
  /// empty handle. The save itself goes on (or has failed: wait() says which).
  void wait_staged() const;
  /// wait_staged() for at most `timeout`: returns staged() (never throws the copy's error:
  /// wait_staged() does). Errc::invalid_argument on an empty handle.
  bool wait_staged_for(std::chrono::nanoseconds timeout) const;
  /// True once the tensors are copied (at once for a copy-before-return save). Never blocks.
  bool staged() const noexcept;

  /// Called once when the save is ready(): with a null exception_ptr and the result, or with
  /// the save's ckpt::Error (a copy of its own for each callback) and an empty result.
  using ReadyCallback = std::function<void(std::exception_ptr, SaveResult)>;
  /// Registers `callback`. If the save is ready already, it runs at once on the calling
  /// thread; otherwise on the ckpt thread that completes the save, which it must not block.
  /// It must not throw. On an empty handle it runs at once with Errc::invalid_argument; an
  /// empty `callback` throws Errc::invalid_argument. Never blocks itself; thread-safe. For coroutines, futures and completion tokens,
  /// ckpt::async_wait (runtime/async_wait.hpp, opt-in) wraps this as an Asio operation.
  void on_ready(ReadyCallback callback) const;

 private:
  std::shared_ptr<detail::SaveState> state_;
};

/// How long one phase of the saves took, as a cumulative histogram over fixed bounds (the
/// Prometheus convention: bucket i counts the observations at most kBounds[i] seconds; an
/// implicit +Inf bucket is `count`).
struct DurationHistogram {
  /// Upper bounds in seconds, ascending: 0.5 ms (a small stage copy) to a minute (an fsync of
  /// a large shard on a slow disk).
  static constexpr std::array<double, 14> kBounds{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60};
  std::array<std::uint64_t, kBounds.size()> at_most{};  ///< cumulative counts, one per bound
  std::uint64_t count = 0;
  double sum_seconds = 0;
  void observe(std::chrono::nanoseconds d) noexcept;
};

/// The phases of SaveResult, over every rank's save of every committed checkpoint.
struct SavePhaseTimings {
  DurationHistogram stall, stage, write, hash, fsync, commit, total;
};

/// Counters over the checkpointer's life.
struct CheckpointerStats {
  std::uint64_t saves_started = 0, saves_skipped = 0, commits = 0, failures = 0;
  /// Checkpoints refused as the caller's mistake (Errc::invalid_argument once started: a
  /// step at or before the one `latest` names, a committed step, a deferred tensor modified
  /// before its fence): counted here, not in failures, and leaving consecutive_failures as
  /// it was.
  std::uint64_t saves_refused = 0;
  std::uint64_t rotated = 0;              ///< checkpoints removed by rotation
  /// Pre-save rotation (a full disk, see Checkpointer): the saves before which it removed
  /// checkpoints, and how many it removed (not counted in `rotated`).
  std::uint64_t early_rotations = 0, early_rotated = 0;
  /// Checkpoints that failed since the last commit (0 after a commit). Each failure logs a
  /// line naming this count and the error.
  std::uint64_t consecutive_failures = 0;
  std::string last_failure;               ///< what() of the last failed checkpoint ("" if none)
  std::uint64_t staging_bytes = 0;        ///< staging memory held now (all ranks)
  std::uint64_t staging_allocations = 0;  ///< times a staging buffer was (re)allocated
  std::chrono::nanoseconds total_stall{};
  /// Shard bytes of this process's ranks in committed checkpoints (SaveResult::bytes summed).
  std::uint64_t bytes_committed = 0;
  std::optional<std::uint64_t> last_committed_step;  ///< the newest step committed by this object
  /// Each committed rank save's SaveResult phases (failed saves have no complete timings).
  SavePhaseTimings phases;
  DurableStats durable;  ///< the copies to the durable tier (all zero without one)
  DurableStats local_tier;  ///< the copies to CheckpointerOptions::local_tier (all zero without one)
};

class Checkpointer {
 public:
  /// Takes the root's writer lock (store/root_lock.hpp) and holds it until destruction,
  /// prepares the root (removes temporaries a crashed writer left) and starts the writer
  /// threads. With several processes only the one that prepares the root (rank 0's) takes
  /// the lock. Throws Errc::busy (naming the root and the holder's pid, having touched
  /// nothing) if another writer holds the lock, Errc::invalid_argument for bad options,
  /// Errc::io_error if the root cannot be created or an explicitly requested io_uring is
  /// unavailable.
  explicit Checkpointer(CheckpointerOptions options);
  /// close(). In a forked child: drops this copy without waiting (see close()).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// Called by rank `rank`'s thread. Blocks while a checkpoint of another step is in flight
  /// (BusyPolicy::wait), then copies `tensors` into staging and returns; the caller may
  /// modify its tensors as soon as this returns. Thread-safe across ranks; one call per
  /// (rank, step). Throws Errc::invalid_argument (bad rank, step saved twice, bad tensors,
  /// no tensors unless options().allow_empty, `info.metadata` or `info.training` that a
  /// manifest could not hold: check_free_form of format/manifest_limits.hpp, the check the
  /// commit makes; all before anything starts, the step going on for the other ranks) or
  /// std::bad_alloc; Errc::aborted, before anything is staged, once close() was called, and
  /// once options().max_consecutive_failures saves in a row have failed (checked after the
  /// barrier, so every rank of the step sees the same count).
  SaveHandle save(int rank, std::uint64_t step, std::span<const TensorView> tensors, const SaveInfo& info);
  /// The same with this call's staging: Staging::deferred returns after the barrier, before
  /// the copy (the tensors' views, and the memory they name, must stay valid and unmodified
  /// until the handle's wait_staged() returns; `info` is copied before return).
  SaveHandle save(int rank, std::uint64_t step, std::span<const TensorView> tensors, const SaveInfo& info, Staging staging);

  /// save() with Staging::overlapped (whatever options().staging says), followed by wait():
  /// the synchronous path through the same code, its copy overlapping the writes.
  SaveResult save_sync(int rank, std::uint64_t step, std::span<const TensorView> tensors, const SaveInfo& info);

  /// Blocks until no checkpoint is in flight and the rotation after the last commit has run
  /// (every rank must have saved the step in flight, or this waits for them). Does not
  /// rethrow save errors: the handles do.
  void wait_all();
  /// wait_all() for at most `timeout`: true once nothing is in flight.
  bool wait_all_for(std::chrono::nanoseconds timeout);
  /// Blocks, for at most `timeout`, until a save() of `step` would not wait at the barrier
  /// (no checkpoint of another step in flight, BusyPolicy::skip, or close() called): true then. What a caller
  /// that must stay responsive (the Python module, checking for signals) calls before
  /// save(); another rank may start a step in between, and save() then waits for it.
  bool wait_turn_for(std::uint64_t step, std::chrono::nanoseconds timeout);

  /// Shuts down: refuses new saves, drains the started ones and releases the root. In order:
  /// every later save(), and every save() waiting at the barrier, throws Errc::aborted
  /// ("the Checkpointer is closed") having started nothing; every shard staged or being
  /// staged is written; a checkpoint some local rank never saved is abandoned (its handles
  /// fail with Errc::aborted naming the ranks, its temporary is removed; with ranks in
  /// several processes the coordinator's outcome is awaited when every local rank saved);
  /// the rotation after the last commit runs; the threads stop; the durable tier drains
  /// (runtime/tiering.hpp); the staging memory is freed and the root's lock (and node
  /// roots' locks) released. Blocks until all that is done, so never from a ckpt thread (an
  /// on_ready callback). Thread-safe, also against every other call on other threads (which
  /// must not destroy this object meanwhile); a second call waits for the first. Afterwards wait_all() and wait_durable() return at
  /// once, staged() gives nullopt and stats() the final counts.
  /// In a process forked from the one that constructed this object (which has none of its
  /// threads), returns at once having touched nothing: the parent's root, lock (whose file
  /// description the child shares: unlocking it would unlock the parent's) and temporaries
  /// stay the parent's. The other calls there (save, the waits, cancel, staged, stats)
  /// throw Errc::invalid_argument.
  void close();

  /// Cancels the checkpoint in flight, if any (the step between its first save() and its
  /// handles' completion): its shards start no further write or hash, each shard that had
  /// not reported yet fails with Errc::aborted naming the shard and `why`, and the step then
  /// fails as any failed save does: its temporary directory is removed, `latest` stays, every
  /// handle of the step rethrows the error (counted in stats() as a failure). Returns at once,
  /// with the step cancelled (nullopt if none was in flight); the handles complete once the
  /// writes and system calls already in flight have returned (an fsync is not interrupted):
  /// wait on them. A step whose shards were all durable already may still commit: its handles
  /// say which. With several processes, a cancel in any one fails the step for every rank.
  /// Thread-safe; a second call for the same step does nothing.
  std::optional<std::uint64_t> cancel(const std::string& why);

  /// Rank `rank`'s last save, if it is committed and its staging buffer still holds it: the
  /// buffer is reused, so the snapshot lasts until this rank's next save() starts staging
  /// (a save in flight, failed or abandoned gives nullopt; so does a rank that never saved).
  /// The views stay valid until that next save(), close() or the destruction: call
  /// this from the thread that saves for `rank` and use the views before its next save().
  /// Other ranks may call it and save() concurrently. Errc::invalid_argument for a bad rank.
  std::optional<StagedSnapshot> staged(int rank) const;

  /// Hands the committed checkpoint `step` to each tier whose cadence (DurableTierOptions::
  /// every) passed it over (the durable tier, and local_tier): an emergency save's step, or a
  /// run's last, copied while the grace period lasts. Like a commit's hand-over, it replaces
  /// a pending older step; a step not committed in the root fails that copy (logged and
  /// counted). No-op without a tier, or for a step every tier's cadence took.
  void copy_to_durable(std::uint64_t step);
  /// Blocks until the durable tier has caught up: no copy pending or running (a failing
  /// copy is retried up to DurableTierOptions::max_attempts first). Never throws; the
  /// outcome is in stats().durable. Returns at once without a durable tier. Does not wait
  /// for local saves: call wait_all() first to have the newest one copied as well.
  void wait_durable();
  /// wait_durable() with a deadline (options.deadline, default DurableTierOptions::
  /// drain_deadline), progress reports and a way to stop early (DurableReplicator::drain):
  /// past the deadline, or when options.stop answers, the copies not done are given up (an
  /// s3:// tier's requests aborted, logged and counted) and the durable tier copies nothing
  /// more. Returns how it ended (complete without a durable tier). Never throws. The
  /// destructor drains this way too, with the tier's drain_deadline.
  DurableDrain drain_durable(const DurableDrainOptions& options = {});
  /// wait_durable() for at most `timeout`: true once the durable tier has caught up.
  bool wait_durable_for(std::chrono::nanoseconds timeout);
  /// The newest step the durable tier holds as far as this process knows
  /// (DurableReplicator::durable_latest); nullopt without a durable tier.
  std::optional<std::uint64_t> durable_latest();

  /// The file system this Checkpointer writes through: options().fs (the posix one by
  /// default), or, with node roots and ranks in several processes, one on which the other
  /// nodes' roots are reached through the coordinator. A resume reads through it
  /// (train::Trainer::resume_latest(Checkpointer&)). Valid as long as this object.
  FileSystem& file_system() const noexcept;
  /// What the construction rebuilt across node roots, one report per checkpoint repaired
  /// (empty without node roots, when nothing was lost, and in the processes that did not
  /// prepare the roots: with ranks in several processes, only rank 0's does).
  const std::vector<RepairReport>& repairs() const noexcept;

  /// Name of the writer backend in use ("io_uring" or "posix").
  std::string_view backend_name() const noexcept;
  const CheckpointerOptions& options() const noexcept;
  CheckpointerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// When to save: every N steps, or every T seconds of wall clock (the production pattern).
/// Ranks must agree on the decision: with a time cadence, let rank 0 decide and broadcast it.
class SaveCadence {
 public:
  static SaveCadence every_steps(std::uint64_t n);
  /// `start`: the instant the first interval counts from (default now; a test injects its clock).
  static SaveCadence every_seconds(double seconds, std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now());
  /// every_steps: step % n == 0 (step 0 excluded). every_seconds: true when at least T
  /// seconds passed since `start` or since the last call that returned true. The training
  /// loop's collective form is train::save_due (train/loop.hpp): rank 0's clock decides.
  bool due(std::uint64_t step, std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

 private:
  SaveCadence() = default;
  std::uint64_t every_steps_ = 0;
  std::chrono::nanoseconds every_{};
  std::chrono::steady_clock::time_point last_{};
};

/// The staging a rank needs to save tensors of these names, dtypes and shapes (the shard
/// image, its header included, padded for O_DIRECT), whatever the step and the rank of a job
/// of `world_size` ranks: the value for CheckpointerOptions::staging_bytes_per_rank, so that
/// the pool is allocated and touched when the Checkpointer is made rather than inside the
/// first save. It allows for the shard to be split into as many files as this machine has
/// cores (CheckpointerOptions::max_file_bytes). Errors as plan_shard_specs.
std::uint64_t staging_bytes_for(std::span<const TensorSpec> tensors, int world_size);

}  // namespace ckpt
CKPT_API_END
