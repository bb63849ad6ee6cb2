// SPDX-License-Identifier: Apache-2.0
// Background replication of committed checkpoints from the local tier to the durable tier:
// each copy is the copy between stores (store/copy.hpp) from the local root's store into the
// durable root's (open_store: a directory, or `s3://bucket/prefix` with its own commit), and
// the durable rotation that store writer's. The
// Checkpointer owns one when CheckpointerOptions::durable is set; it can also be used alone.
//
// Policy (docs/commit-protocol.md, "Two tiers"):
//   - one thread of its own copies one checkpoint at a time; submit() never blocks on I/O,
//     so the copy never delays training or the next local save;
//   - at most one copy running and one pending: a step submitted while another is pending
//     replaces it ("latest wins"); the replaced step never reaches the durable tier and is
//     counted as superseded;
//   - a failed copy (EIO, ENOSPC, a missing mount, a corrupt source) leaves no temporary in
//     the durable root, is counted, logged (once per step, and again if it is given up), and
//     retried after a backoff that doubles, up to max_attempts; a newer step submitted
//     meanwhile is copied instead. Nothing is ever thrown into the caller of submit();
//   - the steps pending or being copied are pinned: local rotation keeps them (pinned()),
//     so a copy never reads a directory that rotation is deleting;
//   - the durable root has its own rotation (keep_last), run after each durable commit; on an
//     object store, each commit (and its rotation, if any) is followed by a collection of
//     leftovers older than leftover_grace (store/object/object_commit.hpp's collect_object_leftovers:
//     data of failed or killed commits, multipart uploads never completed), logged and
//     counted; a failed collection is logged and never fails the copy;
//   - each copy and each rotation holds the durable root's writer lock (store/root_lock.hpp),
//     taken then and not for the replicator's life, since the durable root may not exist
//     yet; another writer holding it makes that copy fail with Errc::busy (and be retried);
//   - an s3:// root has no lock: the replicator holds the prefix's writer lease
//     (store/object/object_lease.hpp) for its life, taken by claim() (the Checkpointer calls it at
//     construction; else the first copy takes it), and commits only while the lease holds
//     (checked before the tier manifest, `latest`, rotation and collection). The tier
//     manifests and `latest` record the run identity (store/run_identity.hpp); claim() refuses
//     a prefix whose newest checkpoint is another run's. A lease taken over by another
//     writer fails every later copy with Errc::busy: this replicator commits nothing more;
//   - drain(deadline) waits for the tier to catch up, and gives up at the deadline (or when
//     asked): pending copies are dropped, an s3:// root's requests in flight are aborted
//     (ObjectStore::abort_calls), and nothing more is copied; close() (the destructor calls
//     it) drains the same way with DurableTierOptions::drain_deadline: it finishes the copy
//     running and the pending one, one attempt each with no backoff or retry, within that
//     deadline, then joins the thread.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/store/object/object_lease.hpp"
#include "ckpt/objstore/object_store.hpp"
#include "ckpt/read/reader.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// The durable tier: where committed checkpoints are copied, and how.
struct DurableTierOptions {
  /// Durable root: a directory (created at the first copy; not the local root), or an object
  /// store, `s3://bucket/prefix` (docs/object-store.md; the commit is store/object/object_commit.hpp's,
  /// which never moves `latest` backwards, whatever allow_older_than_latest says).
  std::string root{};
  int keep_last = 10;          ///< rotation of the durable root (0: keep all)
  /// The tier's own cadence: a Checkpointer hands it the committed steps that are multiples
  /// of `every` (1: every commit). A memory root saved every step with a disk tier every 10
  /// is `every = 10` (docs/memory.md, "Levels"); Checkpointer::copy_to_durable hands over a
  /// step off the cadence (an emergency save's). At least 1.
  std::uint64_t every = 1;
  Verify verify = Verify::fast;  ///< per-chunk XXH3 while copying; full: also SHA-256 per file
  FileSystem* fs = nullptr;    ///< file system of the durable root (default: posix)
  int max_attempts = 3;        ///< copies of one step before it is given up (at least 1)
  std::chrono::milliseconds retry_backoff{200};  ///< before the 2nd attempt; doubles after each failure
  /// Copy a step at or before the one the durable `latest` names (BeginOptions); set by a
  /// Checkpointer from CheckpointerOptions::allow_older_than_latest.
  bool allow_older_than_latest = false;
  /// For an s3:// root: the store to commit to, which must outlive the replicator (tests pass
  /// a fault-injecting one). Null: open_object_store(root) (ckpt::s3's open_s3, in a program
  /// that links ckpt::s3) with the endpoint of the environment (AWS_ENDPOINT_URL, ...) and the
  /// credentials of the chain (objstore/s3.hpp), opened by the constructor, which throws
  /// Errc::invalid_argument for a configuration that could never work (a malformed root or
  /// endpoint, no credentials, a broken profile, no S3 client) and Errc::io_error when the
  /// first credentials cannot be fetched; what fails once requests are made (a refresh
  /// included) is a counted failure.
  ObjectStore* object_store = nullptr;
  /// For an s3:// root: after each commit (and rotation), uncommitted objects and multipart
  /// uploads the server dates more than this before now are collected (collect_object_leftovers).
  /// It must exceed the longest commit to this root by any writer, plus the clock skew between
  /// this host and the server: a commit still uploading when its data is collected fails.
  /// Zero: no collection. Negative: Errc::invalid_argument.
  std::chrono::seconds leftover_grace{std::chrono::hours(1)};
  /// How long the drain at the end (the destructor's; Checkpointer::drain_durable's default)
  /// waits for the copy running and the one pending before giving them up: an s3:// root's
  /// requests are then aborted and those steps stay in the local tier only (logged, counted
  /// as given up). Default 5 minutes: about twice the longest a store that answers takes for
  /// one attempt of a commit the size of the demo's to a large job's per-node shard at the
  /// measured 100-160 MiB/s (tens of GiB), and well past the 30 s stall timeout after which
  /// one request of a silent store fails; a store that stopped answering holds the end of a
  /// run this long and no longer (it was 4 attempts of ~190 s each). Zero: give up at once.
  /// Negative: Errc::invalid_argument. A directory root's copy stuck in a system call cannot
  /// be aborted: the drain returns at the deadline, the destructor still waits for it.
  std::chrono::milliseconds drain_deadline{std::chrono::minutes(5)};
  /// For an s3:// root: the writer lease's period and renewal interval (store/object/object_lease.hpp).
  /// The defaults, 60 s and 15 s, cost one small PUT per 15 s, survive three failed renewals
  /// in a row (a 30 s stall of the store included) without losing the lease, and let the
  /// successor of a job that died take over within one to two minutes, less than a requeue
  /// takes. Tests use periods of a second or two.
  ObjectLeaseOptions lease{};
  /// For an s3:// root: this run's identity (store/run_identity.hpp), recorded in the tier
  /// manifests and `latest` and held in the lease. Empty: the Checkpointer passes the local
  /// root's to claim(); a replicator used alone whose first copy claims the prefix reads the
  /// source root's (ROOT/.run), or draws a random one for its life.
  std::string run{};
};

/// Counters of the replication, over the replicator's life.
struct DurableStats {
  std::uint64_t submitted = 0;   ///< steps handed over by local commits
  std::uint64_t copies = 0;      ///< checkpoints committed in the durable tier
  std::uint64_t failures = 0;    ///< failed copy attempts
  std::uint64_t superseded = 0;  ///< steps replaced by a newer one before they were copied
  std::uint64_t given_up = 0;    ///< steps dropped after max_attempts failures
  std::uint64_t bytes = 0;       ///< shard bytes copied
  std::optional<std::uint64_t> last_step;  ///< newest step committed in the durable tier
  std::optional<std::uint64_t> last_failed_step;
  std::optional<Errc> last_error_code;     ///< of the last failed attempt
  std::string last_error;                  ///< its message (what())
  std::uint64_t rotated = 0;               ///< durable checkpoints removed by rotation
  std::uint64_t leftovers_collected = 0;   ///< s3 root: leftover objects removed plus multipart uploads aborted
  bool gave_up = false;                    ///< a drain gave up: nothing more is copied
  bool lease_lost = false;                 ///< s3 root: the writer lease was taken over: nothing more is committed
};

/// What a drain is waiting for, as its progress callback sees it.
struct DurableDrainStatus {
  std::chrono::milliseconds waited{0}, deadline{0};
  std::optional<std::uint64_t> running;  ///< the step being copied
  std::optional<std::uint64_t> pending;  ///< the step waiting (or waiting for its retry)
  int attempt = 0;                       ///< of the step pending or running
  int max_attempts = 0;
  std::string last_error;                ///< of the last failed attempt, if any
};

/// How DurableReplicator::drain waits.
struct DurableDrainOptions {
  /// Give up after this long. nullopt: DurableTierOptions::drain_deadline.
  std::optional<std::chrono::milliseconds> deadline;
  /// Called on the caller's thread once the wait has lasted `first_progress` (a drain that
  /// ends sooner says nothing) and then every `progress_every`, outside the replicator's
  /// lock. May be empty.
  std::function<void(const DurableDrainStatus&)> progress;
  std::chrono::milliseconds first_progress{1000};
  std::chrono::milliseconds progress_every{10000};
  /// Polled about every 100 ms on the caller's thread: a non-empty answer gives up at once,
  /// that answer being the reason ("SIGTERM"). May be empty.
  std::function<std::string()> stop;
};

/// How a drain ended.
struct DurableDrain {
  bool complete = true;                  ///< the durable tier caught up: nothing pending or running
  std::chrono::milliseconds waited{0};   ///< how long it waited; when not complete, until it gave up (not the copy's stop after)
  std::string gave_up_on;                ///< when not complete: "the deadline" or the stop() answer
  std::optional<std::uint64_t> step;     ///< when not complete: the newest step given up
  std::string last_error;                ///< when not complete: the last copy failure before it gave up, if any
};

class DurableReplicator {
 public:
  /// Copies checkpoints of `source_root` (read through `source_fs`, which must outlive this)
  /// to options.root. Touches neither root here: a missing durable mount shows up as failed
  /// copies, never as an exception. Throws Errc::invalid_argument for bad options (empty
  /// root, the local root itself, keep_last < 0, max_attempts < 1, leftover_grace < 0).
  DurableReplicator(FileSystem& source_fs, std::string source_root, DurableTierOptions options);
  /// close().
  ~DurableReplicator();
  DurableReplicator(const DurableReplicator&) = delete;
  DurableReplicator& operator=(const DurableReplicator&) = delete;

  /// Hands over the committed checkpoint source_root/step-N. Never blocks on I/O, never
  /// throws for I/O; replaces a pending older step (counted as superseded).
  void submit(std::uint64_t step);
  /// True while ROOT/`dir_name` is pending or being copied: local rotation must keep it.
  bool pinned(std::string_view dir_name) const;
  /// Blocks until nothing is pending or running (retries included, up to max_attempts).
  /// Never throws: failures are in stats().
  void wait_idle();
  /// Waits, as wait_idle() does (retries included), until nothing is pending or running, or
  /// until the deadline passes or options.stop answers: then it gives up (logged, counted in
  /// stats().given_up; stats().gave_up set): the pending step is dropped, an s3:// root's
  /// calls are aborted (the copy running fails within about a second), and nothing more is
  /// copied (a later submit() is counted as given up). Returns once the copy running has
  /// ended (a directory root's copy stuck in a system call: after 5 s more at most, still
  /// running). Never throws.
  DurableDrain drain(const DurableDrainOptions& options = {});
  /// For an s3:// root: takes the prefix's writer lease for run `run` (store/object/object_lease.hpp;
  /// may wait up to one lease period if the lease it finds has expired, to see its holder is
  /// gone) and checks that the store's newest checkpoint (what find_committed_checkpoint
  /// finds) records this run or none. Throws Errc::busy (another live writer holds the lease,
  /// naming it and this run), Errc::conflict (the newest checkpoint is another run's, naming
  /// both: the lease is released again), Errc::invalid_argument (a bad run), the store's
  /// errors (a missing bucket: invalid_argument naming it). Idempotent once it succeeded.
  /// A directory root: nothing. Not thread-safe against another claim().
  void claim(const std::string& run);
  /// Whether the durable store's writer is held for the replicator's life (an object
  /// store's lease: WriterTenure::per_run), which claim() takes; a directory's lock is taken
  /// for each copy instead.
  bool holds_writer() const noexcept;
  /// The newest step the durable tier holds as far as this replicator knows: the last it
  /// committed; before its first copy, a store whose `latest` is a local read (a directory)
  /// is read, an object store is not (no request on the way out of a preempted run).
  std::optional<std::uint64_t> durable_latest();
  /// wait_idle() for at most `timeout`: true once nothing is pending or running.
  bool wait_idle_for(std::chrono::nanoseconds timeout);
  /// Drains (see the policy above: within DurableTierOptions::drain_deadline, then giving
  /// up as drain() does), releases an s3:// root's lease, and joins the thread; a step
  /// submitted afterwards is not
  /// copied (a log line says so). Thread-safe; a second call waits for the first. stats(),
  /// pinned() and the waits keep working (nothing is pending any more).
  void close();
  DurableStats stats() const;
  const DurableTierOptions& options() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
CKPT_API_END
