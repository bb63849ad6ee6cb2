// SPDX-License-Identifier: Apache-2.0
// The asynchronous checkpointer: the save path as one pipeline of C++20 coroutines on
// Boost.Asio. Who runs where:
//
//   rank thread     save(): barrier (blocks while another step is in flight), staging copy
//                   into the rank's reused buffer, hand-off of the staged shard to the
//                   step's checkpoint coroutine (Staging::overlapped: the hand-off first,
//                   the writes and the hashing following the copy through
//                   detail::StagedBytes); nothing else.
//   io_context      one thread (`io_thread`) runs every coroutine below and the io_uring
//                   completions; it never blocks: blocking calls are awaited on a pool.
//   work pool       hashing, and every blocking file-system call but pwrite (create,
//                   fallocate, fsync, close, mkdir, rename, remove) via detail::offload.
//   io pool         pwrite of the posix writer.
//
//   run_checkpoint(step)                      one per step, spawned by its first save()
//     temp = co_await begin_checkpoint        work pool, under root_mu
//     for each local rank, as it is staged:
//       co_spawn write_shard(rank)            one per shard, concurrently:
//         writer = co_await create+fallocate    work pool
//         co_await both(backend.write(image),   io_uring lanes on the io_context
//                       hash(image))            (posix: pwrite lanes on the io pool),
//                                               concurrently XXH3 + SHA-256 on the work pool
//                                               (on two of its threads, the XXH3s and SHA-256
//                                               apart, when this process has fewer shards
//                                               than the pool has threads)
//         report = co_await fsync+close         work pool
//         -> inbox                              the shard's typed RankReport
//     reports = co_await inbox (every local rank)
//     outcome = co_await exchange(reports)    CommitCoordinator: the world's last report runs
//                                             commit() (manifest, renames, fsyncs, latest)
//                                             on the work pool, or on rank 0's process
//     complete(outcome)                       handles complete, barrier opens
//     co_await rotate                         work pool, under root_mu: off the next save's path
//
// Typed all the way: shards report RankReport (a ShardReport or an Error), the commit
// assembles the manifest from them with assemble_manifest, the outcome is a CommitOutcome;
// JSON exists only where a multi-process coordinator puts them on its wire.
#include "ckpt/runtime/checkpointer.hpp"

#include <algorithm>
#include <atomic>
#include <boost/asio/append.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/json.hpp>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unistd.h>
#include <unordered_map>
#include <variant>

#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/fs/remote_file_system.hpp"
#include "ckpt/store/run_identity.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/shard/shard_writer.hpp"
#include "ckpt/shard/sharded_save.hpp"
#include "ckpt/runtime/detail/offload.hpp"
#include "ckpt/runtime/detail/staged_bytes.hpp"
#include "ckpt/runtime/wire.hpp"
#include "ckpt/runtime/write_backend.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "ckpt/store/store.hpp"

namespace ckpt {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using Handler = SaveHandle::ReadyCallback;

namespace detail {
// The process an object belongs to. A process forked from it has the object's memory but none
// of its threads (so nothing there completes a save or opens the barrier) and shares its
// lock's file description: there the object must neither wait nor touch what it owns. Checked
// before any mutex, which a thread of the parent may have held at the fork.
struct OwnerProcess {
  const pid_t pid = ::getpid();
  bool forked() const noexcept { return ::getpid() != pid; }
  void refuse_if_forked(std::string_view call, const std::string& file = {}) const {
    if (forked())
      throw Error(Errc::invalid_argument, file,
                  std::string(call) + " in a process forked from the one that owns it (only that one has its threads)",
                  "pid " + std::to_string(pid), "pid " + std::to_string(::getpid()));
  }
};

struct SaveState {
  OwnerProcess owner;  // whose threads complete this save
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool skipped = false;
  bool staged = true;  // false while a deferred copy is pending
  std::optional<Error> stage_error;
  std::uint64_t step = 0;
  // The error is kept by value and thrown afresh in each waiting thread: sharing one
  // exception object between threads through exception_ptr copies races in libstdc++'s
  // uninstrumented reference count (ThreadSanitizer reports it).
  std::optional<Error> error;
  SaveResult result;
  std::vector<Handler> waiters;

  void mark_staged(std::optional<Error> e) {
    {
      std::lock_guard lk(mu);
      stage_error = std::move(e);
      staged = true;
    }
    cv.notify_all();
  }

  void complete(std::optional<Error> e, SaveResult r) {
    std::vector<Handler> to_call;
    {
      std::lock_guard lk(mu);
      error = std::move(e);
      result = std::move(r);
      done = true;
      to_call.swap(waiters);
    }
    cv.notify_all();
    for (const auto& h : to_call) run_callback(h, error, result);
  }

  // Runs a SaveHandle::on_ready callback on this thread. No Asio type crosses here: an Asio
  // handler is wrapped (and dispatched to its executor) by runtime/async_wait.hpp, compiled
  // in the caller's translation unit.
  static void run_callback(const Handler& h, const std::optional<Error>& e, SaveResult r) {
    h(e ? std::make_exception_ptr(*e) : std::exception_ptr(), std::move(r));
  }
};
}  // namespace detail

bool SaveHandle::ready() const noexcept {
  if (!state_ || state_->owner.forked()) return false;
  std::lock_guard lk(state_->mu);
  return state_->done;
}
bool SaveHandle::skipped() const noexcept {
  if (!state_ || state_->owner.forked()) return false;
  std::lock_guard lk(state_->mu);
  return state_->skipped;
}
std::uint64_t SaveHandle::step() const noexcept { return state_ ? state_->step : 0; }

const SaveResult& SaveHandle::wait() const {
  if (!state_) throw_invalid("wait() on an empty SaveHandle");
  state_->owner.refuse_if_forked("SaveHandle::wait()");
  std::unique_lock lk(state_->mu);
  state_->cv.wait(lk, [&] { return state_->done; });
  if (state_->error) throw *state_->error;
  return state_->result;
}

bool SaveHandle::wait_for(std::chrono::nanoseconds timeout) const {
  if (!state_) throw_invalid("wait_for() on an empty SaveHandle");
  state_->owner.refuse_if_forked("SaveHandle::wait_for()");
  std::unique_lock lk(state_->mu);
  return state_->cv.wait_for(lk, timeout, [&] { return state_->done; });
}

void SaveHandle::wait_staged() const {
  if (!state_) throw_invalid("wait_staged() on an empty SaveHandle");
  state_->owner.refuse_if_forked("SaveHandle::wait_staged()");
  std::unique_lock lk(state_->mu);
  state_->cv.wait(lk, [&] { return state_->staged; });
  if (state_->stage_error) throw *state_->stage_error;
}

bool SaveHandle::wait_staged_for(std::chrono::nanoseconds timeout) const {
  if (!state_) throw_invalid("wait_staged_for() on an empty SaveHandle");
  state_->owner.refuse_if_forked("SaveHandle::wait_staged_for()");
  std::unique_lock lk(state_->mu);
  return state_->cv.wait_for(lk, timeout, [&] { return state_->staged; });
}

bool SaveHandle::staged() const noexcept {
  if (!state_ || state_->owner.forked()) return false;
  std::lock_guard lk(state_->mu);
  return state_->staged;
}

void SaveHandle::on_ready(ReadyCallback h) const {
  const auto& s = state_;
  if (!h) throw_invalid("SaveHandle::on_ready: empty callback");
  if (!s) {
    detail::SaveState::run_callback(h, Error(Errc::invalid_argument, {}, "on_ready / async_wait on an empty SaveHandle"), {});
    return;
  }
  s->owner.refuse_if_forked("SaveHandle::on_ready()");
  std::unique_lock lk(s->mu);
  if (!s->done) {
    s->waiters.push_back(std::move(h));
    return;
  }
  auto e = s->error;
  auto r = s->result;
  lk.unlock();
  detail::SaveState::run_callback(h, e, std::move(r));
}

namespace {

std::chrono::nanoseconds since(Clock::time_point t0) { return Clock::now() - t0; }

}  // namespace

struct Checkpointer::Impl {
  // One file of a rank's shard: its header, and where its image sits in the rank's staging.
  struct FileImage {
    ShardHeader header;
    std::uint64_t offset = 0;  // in the staging buffer, a multiple of 4096
    std::uint64_t size = 0;    // file bytes
    std::uint64_t padded = 0;  // size rounded up to 4096 (what O_DIRECT writes)
  };
  // One rank's shard of the step in flight, from staging to its report.
  struct ShardJob {
    int rank = 0;
    std::uint64_t step = 0;
    std::uint64_t size = 0;    // file bytes, all files
    std::uint64_t padded = 0;  // staging bytes: the files' padded images back to back
    std::vector<FileImage> files;  // in part order (one, unless CheckpointerOptions::max_file_bytes splits)
    ShardingByName sharding;  // the tensors' descriptions, for the manifest index
    SaveInfo info;
    std::shared_ptr<detail::SaveState> handle;
    SaveResult result;  // rank-local timings, filled as the job goes
    Clock::time_point t_call;
    // Set: handed over before its copy into staging is done (Staging::overlapped); the writes, the
    // hashing and the redundancy units follow the copy through it. Null: staged before.
    std::shared_ptr<detail::StagedBytes> staged;
  };

  // What reaches a checkpoint coroutine's inbox: a rank's staged shard, a rank's report
  // (its shard is durable, or it failed), or the shutdown's decision to give up on the step.
  struct Abandon {
    Error error;
  };
  // One unit of the step's redundancy (one block: a parity block of a stripe, or a replica) is durable, or failed.
  struct BlocksDone {
    std::size_t unit = 0;
    std::vector<RedundancyBlock> blocks;
    std::optional<Error> error;
  };
  // Ranks in several processes: every rank's shard size (from every process), or why the
  // step has no redundancy (a rank failed to stage or begin somewhere).
  struct SizesKnown {
    std::vector<std::uint64_t> sizes;
    std::optional<std::string> failed;  // which process said what failed
    std::optional<Error> error;         // the exchange itself failed
  };
  using Message = std::variant<std::shared_ptr<ShardJob>, RankReport, Abandon, BlocksDone, SizesKnown>;
  using Inbox = asio::experimental::channel<void(boost::system::error_code, Message)>;

  // The checkpoint of one step, from its first save() to its rotation.
  struct StepState {
    std::uint64_t step = 0;
    Inbox inbox;  // used on the io_context's thread only
    // Under Impl::mu:
    std::vector<std::shared_ptr<ShardJob>> jobs;  // per rank, null until it saves
    int staged = 0, reported = 0;
    bool abandoned = false;
    // Set by cancel(): the shards start no further write (read on any thread).
    std::atomic<bool> cancelled{false};
    std::string cancel_reason;  // under Impl::mu, set before `cancelled`
    // Where the step's shards go (StoreWriter::begin), set once it has begun; the redundancy
    // blocks (node roots) in planned order, once every unit is durable.
    std::shared_ptr<StepTarget> target;
    std::vector<RedundancyBlock> blocks;
    // Every rank's shard size, once every local rank is staged (from the other processes
    // through the coordinator when ranks live in several); the threads that move redundancy
    // bytes between processes, joined when the step's units are done.
    std::vector<std::uint64_t> sizes;
    std::vector<std::thread> movers;
    std::atomic<bool> failed{false};  // a shard failed: the redundancy units stop
    bool committed_here = false;

    // The inbox holds two messages per rank, the abandon and one per redundancy unit.
    StepState(asio::io_context& ctx, std::uint64_t s, int world, std::size_t units)
        : step(s), inbox(ctx, static_cast<std::size_t>(2 * world + 2) + units), jobs(static_cast<std::size_t>(world)) {}
  };

  CheckpointerOptions opt;
  // Node roots with ranks in several processes: the other nodes' roots are reached through
  // the coordinator's file transport (route_node_roots); declared before everything that
  // uses it, so destroyed after.
  std::unique_ptr<FileSystem> routed;
  FileSystem& fs;
  std::unique_ptr<CommitCoordinator> own_coordinator;
  CommitCoordinator* coordinator;
  // The ranks this process saves (the coordinator's local_ranks) and the run id the
  // processes of one run name their shared temporary directories with ("" in one process).
  std::vector<bool> local;
  int local_count = 0;
  std::string run_id;
  // CheckpointerOptions::nodes: the layout (node n's root is ROOT/node-n).
  std::optional<NodeLayout> layout;
  // Where the checkpoints go (a directory, or node roots), and this process's writer of it:
  // the lead's (rank 0's process: the store's lock(s), held for this object's life, the
  // crash cleanup, commits, rotation), or a participant's in the other processes of a run;
  // destroyed after everything below.
  std::unique_ptr<CheckpointStore> store;
  std::unique_ptr<StoreWriter> writer;
  std::vector<RepairReport> repairs;  // what the construction rebuilt (the preparing process)

  asio::io_context ctx{1};
  asio::executor_work_guard<asio::io_context::executor_type> guard{ctx.get_executor()};
  asio::thread_pool work_pool;  // deferred copies, hashing, and the shards' blocking file-system calls but pwrite
  asio::thread_pool io_pool;    // pwrite (posix writer)
  // The root directory's own calls (begin, commit, abort, rotation), one at a time: removing
  // an old checkpoint can take hundreds of ms (a discard-mounted disk frees its extents at
  // the journal commit), and must never hold up the next save's copies and hashing.
  asio::thread_pool root_pool{1};
  std::unique_ptr<detail::WriteBackend> backend;
  std::thread io_thread;

  std::vector<AlignedBuffer> staging;  // per rank, reused across saves
  // Per rank: what its staging buffer holds, from the end of staging until its next save
  // starts staging (under mu); committed once the checkpoint of that step is.
  struct StagedRecord {
    std::uint64_t step = 0;
    std::vector<FileImage> files;
    SaveInfo info;
    bool committed = false;
  };
  std::vector<std::optional<StagedRecord>> staged_records;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::shared_ptr<StepState> in_flight;  // the barrier: at most one step from save() to its handles
  int checkpoints_running = 0;           // checkpoint coroutines not finished (rotation included)
  std::map<std::uint64_t, bool> skip_decisions;  // step -> skipped (BusyPolicy::skip)
  CheckpointerStats stats;
  bool closing = false;  // close() began: save() refuses, the barrier's waiters wake and refuse
  std::once_flag closed;
  detail::OwnerProcess owner;  // the process that made this object (Checkpointer::close())
  // Serialises what changes the root itself: begin, commit, abort and rotation (run on the
  // work pool, or under MPI the commit on the coordinator's thread).
  std::mutex root_mu;
  // Declared last: destroyed first, after ~Impl has drained the local saves (whose commits
  // submit to it); its own destructor then drains the copies.
  std::unique_ptr<DurableReplicator> replicator;
  std::unique_ptr<DurableReplicator> local_replicator;  // CheckpointerOptions::local_tier

  static int pool_size(const CheckpointerOptions& o) {
    if (o.hash_threads > 0) return o.hash_threads;
    return std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  }

  // Node roots with ranks in several processes: a file system on which node n's root (for
  // every node but this process's) is served by the process hosting node n's first rank.
  // Null otherwise, or when the options are bad (the constructor then says why).
  static std::unique_ptr<FileSystem> route_node_roots(const CheckpointerOptions& o, FileSystem& base) {
    if (!o.nodes || !o.coordinator || o.root.empty() || o.nodes->ranks_per_node < 1 || o.world_size < 1 ||
        o.world_size % o.nodes->ranks_per_node != 0)
      return nullptr;
    const auto mine = o.coordinator->local_ranks();
    FileTransport* transport = o.coordinator->file_transport();
    if (mine.empty() || static_cast<int>(mine.size()) >= o.world_size || !transport) return nullptr;
    const int rpn = o.nodes->ranks_per_node, nodes = o.world_size / rpn;
    const auto roots = node_root_paths(root_directory(o.root), nodes);  // a memory root's: in shared memory
    std::vector<FileRoute> routes;
    for (int n = 0; n < nodes; ++n)
      if (n != mine.front() / rpn) routes.push_back({roots[static_cast<std::size_t>(n)], n * rpn});
    return make_routed_file_system(base, *transport, std::move(routes));
  }

  explicit Impl(CheckpointerOptions o)
      : opt(std::move(o)),
        routed(route_node_roots(opt, opt.fs ? *opt.fs : posix_file_system())),
        fs(routed ? *routed : opt.fs ? *opt.fs : posix_file_system()),
        coordinator(opt.coordinator),
        work_pool(static_cast<std::size_t>(pool_size(opt))),
        io_pool(static_cast<std::size_t>(std::max(1, opt.queue_depth))) {
    if (opt.root.empty()) throw_invalid("CheckpointerOptions.root is empty");
    if (opt.world_size < 1) throw_invalid("CheckpointerOptions.world_size must be >= 1");
    if (opt.keep_last < 0) throw_invalid("CheckpointerOptions.keep_last must be >= 0");
    if (opt.queue_depth < 1) throw_invalid("CheckpointerOptions.queue_depth must be >= 1");
    if (opt.max_consecutive_failures < 0) throw_invalid("CheckpointerOptions.max_consecutive_failures must be >= 0");
    if (opt.chunk_size < 4096 || (opt.chunk_size & (opt.chunk_size - 1)) || opt.chunk_size > (1ull << 30))
      throw_invalid("CheckpointerOptions.chunk_size must be a power of two from 4096 to 2^30");
    if (!coordinator) {
      own_coordinator = make_in_process_coordinator(opt.world_size);
      coordinator = own_coordinator.get();
    }
    if (coordinator->world_size() != opt.world_size)
      throw Error(Errc::invalid_argument, {}, "coordinator world size", std::to_string(opt.world_size),
                  std::to_string(coordinator->world_size()));
    local.assign(static_cast<std::size_t>(opt.world_size), false);
    for (int r : coordinator->local_ranks()) {
      if (r < 0 || r >= opt.world_size || local[static_cast<std::size_t>(r)])
        throw Error(Errc::invalid_argument, {}, "coordinator local rank", "distinct ranks in 0.." + std::to_string(opt.world_size - 1),
                    std::to_string(r));
      local[static_cast<std::size_t>(r)] = true;
      ++local_count;
    }
    if (local_count < opt.world_size && opt.when_busy == BusyPolicy::skip)
      throw Error(Errc::invalid_argument, {}, "BusyPolicy::skip with ranks in several processes (each would decide alone)",
                  "BusyPolicy::wait", "BusyPolicy::skip");
    if (opt.nodes) {
      if (local_count < opt.world_size && !coordinator->file_transport())
        throw Error(Errc::invalid_argument, opt.root,
                    "CheckpointerOptions.nodes with ranks in several processes needs a coordinator that moves bytes between them (file_transport)",
                    "a file transport", "none");
      const int rpn = opt.nodes->ranks_per_node;
      NodeLayout l{rpn >= 1 ? opt.world_size / rpn : 0, rpn, opt.nodes->redundancy};
      if (rpn >= 1 && opt.world_size % rpn != 0) throw_invalid("CheckpointerOptions.nodes.ranks_per_node must divide the world size");
      if (const auto problem = layout_problem(l, opt.world_size)) throw Error(Errc::invalid_argument, opt.root, "CheckpointerOptions.nodes: " + *problem);
      if (opt.max_file_bytes != 0 && opt.max_file_bytes != kOneFilePerRank)
        throw Error(Errc::invalid_argument, opt.root,
                    "CheckpointerOptions.max_file_bytes with nodes (a node set's redundancy is planned over each rank's one file)",
                    "0 or kOneFilePerRank", std::to_string(opt.max_file_bytes));
      layout = l;
    }
    StoreOptions where;
    where.fs = &fs;
    where.nodes = layout;
    where.memory_limit = opt.memory_limit;
    store = open_store(opt.root, where);
    if (store->kind() == StoreKind::object_store)
      throw Error(Errc::invalid_argument, opt.root, "CheckpointerOptions.root: the checkpointer saves to a directory or node roots",
                  "a local root (an s3:// root is a durable tier: CheckpointerOptions.durable)", opt.root);
    if (store->kind() == StoreKind::node_set && !layout)
      throw Error(Errc::invalid_argument, opt.root, "CheckpointerOptions.root holds node roots (node-n) and no latest of its own",
                  "CheckpointerOptions.nodes set for a node set", "a single-root checkpointer");
    // The durable tier first: a configuration it refuses (an s3:// root without credentials)
    // fails here, before the root is touched or staging allocated. Node roots: the durable
    // copy reads each checkpoint from the node set (its shards; redundancy blocks are not copied).
    if (opt.durable) {
      if (opt.durable->every < 1) throw Error(Errc::invalid_argument, opt.durable->root, "DurableTierOptions::every", "at least 1", "0");
      opt.durable->allow_older_than_latest |= opt.allow_older_than_latest;
      replicator = std::make_unique<DurableReplicator>(fs, opt.root, *opt.durable);
    }
    if (opt.local_tier) {
      if (opt.local_tier->every < 1) throw Error(Errc::invalid_argument, opt.local_tier->root, "DurableTierOptions::every", "at least 1", "0");
      if (root_kind(opt.local_tier->root) != StoreKind::directory)
        throw Error(Errc::invalid_argument, opt.local_tier->root, "CheckpointerOptions::local_tier: a directory", "a directory root",
                    std::string(store_kind_name(root_kind(opt.local_tier->root))));
      if (opt.durable && opt.durable->root == opt.local_tier->root)
        throw Error(Errc::invalid_argument, opt.local_tier->root, "CheckpointerOptions::local_tier and durable: one root", "two roots", "the same");
      opt.local_tier->allow_older_than_latest |= opt.allow_older_than_latest;
      local_replicator = std::make_unique<DurableReplicator>(fs, opt.root, *opt.local_tier);
    }
    choose_backend();
    // In several processes, one of them cleans the root up before any can start writing.
    run_id = coordinator->start_run([this] {
      writer = store->writer();  // the lock(s) and the crash cleanup
      claim_durable();
      if (!layout) return;
      // A replaced node's empty root (or a truncated file): every kept checkpoint is made
      // whole again, not only the one a resume reads.
      repairs = writer->repair();
      // Reads never write: the live checkpoint is checked here, once (Verify::fast), and what
      // is damaged rebuilt, before any rank (of any process) resumes from it.
      repair_latest();
    });
    if (!writer) writer = store->writer({.lead = false});
    staging.resize(static_cast<std::size_t>(opt.world_size));
    staged_records.resize(static_cast<std::size_t>(opt.world_size));
    if (opt.staging_bytes_per_rank)
      for (int r = 0; r < opt.world_size; ++r) {
        if (!local[static_cast<std::size_t>(r)]) continue;
        auto& b = staging[static_cast<std::size_t>(r)];
        b = AlignedBuffer(static_cast<std::size_t>(opt.staging_bytes_per_rank), /*prefault=*/true);
        ++stats.staging_allocations;
        stats.staging_bytes += b.capacity();
      }
    io_thread = std::thread([this] { ctx.run(); });
  }

  // A durable tier whose writer is held for the run (an s3:// prefix's writer lease), taken for this root's run (its identity
  // kept in the root the tier copies from, drawn for a fresh root), before anything is saved:
  // a prefix another job writes to, or whose newest checkpoint is another run's, is refused
  // here (store/object/object_lease.hpp). A store that does not answer now is not a refusal: the first
  // copy takes the lease instead, and until then nothing is committed there (a durable tier
  // that fails never fails training).
  void claim_durable() {
    if (!replicator || !replicator->holds_writer()) return;
    const std::string run = opt.durable->run.empty() ? writer->establish_run_identity() : opt.durable->run;
    try {
      replicator->claim(run);
    } catch (const Error& e) {
      if (e.code() == Errc::busy || e.code() == Errc::conflict || e.code() == Errc::invalid_argument) throw;
      log_event(LogLevel::warn, "durable_lease_deferred", "durable tier: the writer lease of " + opt.durable->root + " could not be taken now (" + e.what() +
               "); the first copy takes it, and nothing is committed there until then");
    }
  }

  // The checkpoint `latest` names across the node roots, checked (Verify::fast) and repaired;
  // a failure is logged and left for the resume to report.
  void repair_latest() {
    try {
      if (const auto step = store->latest())
        for (auto& r : writer->repair(*step, Verify::fast))
          if (!r.nothing_to_do()) repairs.push_back(std::move(r));
    } catch (const Error& e) {
      log_event(LogLevel::warn, "repair_failed", std::string("the live checkpoint is not rebuilt: ") + e.what());
    }
  }

  void choose_backend() {
    WriterBackend choice = opt.backend;
    if (const char* env = std::getenv("CKPT_WRITER"); env && *env) {
      const std::string_view v(env);
      if (v == "posix") choice = WriterBackend::posix;
      else if (v == "io_uring") choice = WriterBackend::io_uring;
      else if (v == "auto") choice = WriterBackend::automatic;
      else throw Error(Errc::invalid_argument, {}, "CKPT_WRITER", "posix, io_uring or auto", std::string(v));
    }
    std::string why;
    if (choice != WriterBackend::posix && !detail::io_uring_available(&why)) {
      if (choice == WriterBackend::io_uring) throw Error(Errc::io_error, {}, "io_uring requested but unavailable: " + why);
      log_event(LogLevel::warn, "writer_fallback", "io_uring unavailable (" + why + "); using the posix writer");
      choice = WriterBackend::posix;
    }
    backend = choice == WriterBackend::posix ? detail::make_posix_backend(io_pool) : detail::make_uring_backend(ctx, io_pool);
  }

  bool forked() const noexcept { return owner.forked(); }
  void refuse_if_forked(std::string_view call) const { owner.refuse_if_forked(call, opt.root); }

  // Checkpointer::close(), once, in the process that made this object.
  void shutdown() noexcept {
    std::shared_ptr<StepState> give_up;
    std::optional<Error> why;
    {
      std::unique_lock lk(mu);
      closing = true;
      cv.notify_all();  // the saves waiting at the barrier refuse
      // Every staged shard finishes (written, or failed); only then is anything abandoned.
      // When every local rank has saved, the outcome comes (from the coordinator), so wait for it.
      cv.wait(lk, [&] { return !in_flight || (in_flight->reported == in_flight->staged && in_flight->staged < local_count); });
      if (in_flight) {
        std::string missing;
        for (int r = 0; r < opt.world_size; ++r)
          if (local[static_cast<std::size_t>(r)] && !in_flight->jobs[static_cast<std::size_t>(r)])
            missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        why = Error(Errc::aborted, opt.root,
                    "checkpoint of step " + std::to_string(in_flight->step) + " abandoned at shutdown: rank(s) " + missing + " never saved it");
        log_event(LogLevel::warn, "save_abandoned", why->what(), {.step = in_flight->step});
        in_flight->abandoned = true;
        give_up = in_flight;
      }
    }
    if (give_up) send(give_up, Abandon{*why});
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return checkpoints_running == 0; });  // rotations included
    }
    guard.reset();
    io_thread.join();
    work_pool.join();
    io_pool.join();
    root_pool.join();
    // After the local saves, whose commits hand it their steps; before the lock: the copies
    // read the local root.
    if (local_replicator) local_replicator->close();
    if (replicator) replicator->close();
    {
      std::lock_guard lk(mu);
      for (auto& b : staging) b = AlignedBuffer();
      for (auto& r : staged_records) r.reset();
      stats.staging_bytes = 0;
    }
    writer.reset();
  }

  // ---- rank thread side ----------------------------------------------------------------

  SaveHandle save(int rank, std::uint64_t step, std::span<const TensorView> given, const SaveInfo& info, Staging staging) {
    const auto t_call = Clock::now();
    refuse_if_forked("save()");
    check_rank(rank, opt.world_size, "save rank");
    if (given.empty() && !opt.allow_empty)
      throw Error(Errc::invalid_argument, opt.root,
                  "save of step " + std::to_string(step) + " by rank " + std::to_string(rank) +
                      ": no tensors (an empty save is refused unless CheckpointerOptions::allow_empty)",
                  "at least one tensor", "none");
    check_free_form(info.metadata, info.training, "metadata and training of rank " + std::to_string(rank) + " (step " + std::to_string(step) + ")");
    const std::vector<TensorView> kept = tensors_to_write(rank, opt.world_size, given);  // replicated: the lowest holder's only
    const std::span<const TensorView> tensors = kept;
    if (!local[static_cast<std::size_t>(rank)])
      throw Error(Errc::invalid_argument, {}, "save rank: not one of this process's ranks (the coordinator's local_ranks)",
                  "a local rank", std::to_string(rank));
    checkpoint_dir_name(step);  // validates the step
    auto job = std::make_shared<ShardJob>();
    job->rank = rank;
    job->step = step;
    job->t_call = t_call;
    job->info = info;
    plan_files(*job, tensors);
    job->sharding = sharding_by_name(tensors);
    job->handle = std::make_shared<detail::SaveState>();
    job->handle->step = step;
    job->result.step = step;
    job->result.backend = std::string(backend->name());

    std::shared_ptr<StepState> st;
    {
      std::unique_lock lk(mu);
      if (closing) throw closed_error(rank, step);
      ++stats.saves_started;
      auto skip_it = skip_decisions.find(step);
      const bool busy = in_flight && in_flight->step != step;
      if ((skip_it != skip_decisions.end() && skip_it->second) || (busy && opt.when_busy == BusyPolicy::skip)) {
        // One decision per step, so every rank skips the same checkpoint.
        skip_decisions[step] = true;
        while (skip_decisions.size() > 64) skip_decisions.erase(skip_decisions.begin());
        ++stats.saves_skipped;
        job->handle->skipped = true;
        job->handle->complete(std::nullopt, job->result);
        return SaveHandle(job->handle);
      }
      // The barrier: rank threads are not coroutines, so they block here; the checkpoint
      // coroutine releases it when the handles of the step in flight complete.
      cv.wait(lk, [&] { return closing || !in_flight || in_flight->step == step; });
      if (closing) throw closed_error(rank, step);
      if (opt.max_consecutive_failures > 0 && stats.consecutive_failures >= static_cast<std::uint64_t>(opt.max_consecutive_failures))
        throw Error(Errc::aborted, opt.root,
                    std::to_string(stats.consecutive_failures) + " saves in a row failed (max_consecutive_failures); the last: " +
                        stats.last_failure,
                    "fewer than " + std::to_string(opt.max_consecutive_failures), std::to_string(stats.consecutive_failures));
      if (opt.when_busy == BusyPolicy::skip) skip_decisions[step] = false;
      if (!in_flight) {
        // Per unit: its writer's message, and with ranks in several processes a sender's;
        // and the sizes of the shards.
        in_flight = std::make_shared<StepState>(ctx, step, opt.world_size, 2 * max_units() + 1);
        ++checkpoints_running;
        asio::co_spawn(ctx, run_checkpoint(in_flight), asio::detached);
      }
      auto& slot = in_flight->jobs[static_cast<std::size_t>(rank)];
      if (slot) throw Error(Errc::invalid_argument, {}, "rank " + std::to_string(rank) + " saved step " + std::to_string(step) + " twice");
      slot = job;
      ++in_flight->staged;
      st = in_flight;
      staged_records[static_cast<std::size_t>(rank)].reset();  // the buffer is about to be overwritten
      job->result.stall = Clock::now() - t_call;
      stats.total_stall += job->result.stall;
    }

    if (staging == Staging::deferred) {
      // The copy runs on the work pool; the caller's views (and, with the debug check, the
      // XXH3 of every tensor as it is now) go with it.
      std::vector<TensorView> views(tensors.begin(), tensors.end());
      std::vector<std::uint64_t> sums;
      if (opt.check_deferred_staging)
        for (const auto& t : views) sums.push_back(xxh3_64(t.data.data(), t.data.size()));
      job->result.deferred = true;
      {
        std::lock_guard lk(job->handle->mu);
        job->handle->staged = false;
      }
      asio::post(work_pool, [this, st, job, views = std::move(views), sums = std::move(sums)] {
        std::optional<Error> bad;
        try {
          stage_and_hand_off(st, job, views);
          check_staged_tensors(*job, views, sums);
        } catch (...) {
          bad = to_error(std::current_exception());
        }
        // Released before the report: a rank waiting in wait_staged() learns first.
        job->handle->mark_staged(bad ? std::optional<Error>(*bad) : std::nullopt);
        if (bad) send(st, RankReport{job->rank, *bad, {}, {}});
        else send(st, job);
      });
      return SaveHandle(job->handle);
    }
    if (staging == Staging::overlapped) {
      stage_overlapped(st, job, tensors);
      return SaveHandle(job->handle);
    }
    stage_and_hand_off(st, job, tensors);
    send(st, job);  // the hand-off: from here on the pipeline owns the staged shard
    return SaveHandle(job->handle);
  }

  Error closed_error(int rank, std::uint64_t step) const {
    return Error(Errc::aborted, opt.root,
                 "save of step " + std::to_string(step) + " by rank " + std::to_string(rank) + ": the Checkpointer is closed");
  }

  // Copies the tensors into the rank's staging buffer and records what it holds. A failure
  // fails the checkpoint for every rank (reported here) rather than hang it, and is rethrown.
  void stage_and_hand_off(const std::shared_ptr<StepState>& st, const std::shared_ptr<ShardJob>& job, std::span<const TensorView> tensors) {
    const auto t_stage = Clock::now();
    try {
      stage(*job, tensors);
    } catch (...) {
      if (job->result.deferred) throw;  // the deferred path reports it (after the fence opens)
      send(st, RankReport{job->rank, to_error(std::current_exception()), {}, {}});
      throw;
    }
    job->result.stage = Clock::now() - t_stage;
    std::lock_guard lk(mu);
    staged_records[static_cast<std::size_t>(job->rank)] = StagedRecord{job->step, job->files, job->info, false};
  }

  // The most tensor bytes of one file for `bytes` of a rank's tensors (max_file_bytes).
  std::uint64_t file_limit(std::uint64_t bytes) const {
    if (opt.max_file_bytes != 0) return opt.max_file_bytes;
    // A file per hashing thread, the pool's threads shared among this process's ranks, less
    // one per rank for its copy into staging: a rank of one file hashes on two threads already
    // (its XXH3s apart from its SHA-256), and on 2 cores a 1 GiB save split in two files ran
    // 1.19-1.51 s against 1.04-1.27 s in one (interleaved, 5 rounds): the two files' hashing
    // took the core the copy and the writes needed.
    const int per_rank = pool_size(opt) / std::max(1, local_count) - 1;
    if (layout || per_rank < 2) return kOneFilePerRank;
    constexpr std::uint64_t kMinAutoFile = std::uint64_t{64} << 20;
    const auto files = static_cast<std::uint64_t>(per_rank);
    return std::max(kMinAutoFile, (bytes + files - 1) / files);
  }

  // The rank's files: its tensors split at tensor boundaries, in the caller's order, into
  // groups of at most file_limit() bytes (a larger tensor alone), each planned as a shard
  // file, their images back to back in staging at 4096-aligned offsets.
  void plan_files(ShardJob& job, std::span<const TensorView> tensors) const {
    std::uint64_t total = 0;
    for (const auto& t : tensors) total += t.data.size();
    const std::uint64_t limit = file_limit(total);
    std::vector<std::vector<TensorView>> groups(1);
    std::uint64_t in_group = 0;
    for (const auto& t : tensors) {
      if (!groups.back().empty() && (t.data.size() > limit || in_group > limit - t.data.size())) {
        groups.emplace_back();
        in_group = 0;
      }
      groups.back().push_back(t);
      in_group += t.data.size();
    }
    job.files.clear();
    job.size = job.padded = 0;
    for (const auto& g : groups) {
      FileImage f;
      f.header = plan_shard(g, shard_header_metadata(job.rank, opt.world_size, job.step));
      f.offset = job.padded;
      f.size = f.header.file_size();
      f.padded = (f.size + 4095) / 4096 * 4096;
      job.size += f.size;
      job.padded += f.padded;
      job.files.push_back(std::move(f));
    }
  }

  // Staging::overlapped: the same, handing the shard over first: its file is created, written
  // and hashed while the copy goes on (the pipeline follows job->staged). A copy that fails
  // fails the shard through job->staged (its write reports it) and is rethrown.
  void stage_overlapped(const std::shared_ptr<StepState>& st, const std::shared_ptr<ShardJob>& job, std::span<const TensorView> tensors) {
    const auto t_stage = Clock::now();
    try {
      reserve_staging(*job);
    } catch (...) {
      send(st, RankReport{job->rank, to_error(std::current_exception()), {}, {}});
      throw;
    }
    job->staged = std::make_shared<detail::StagedBytes>(ctx);
    send(st, job);
    try {
      copy_into_staging(*job, tensors, [&](std::uint64_t n, bool last) {
        if (last) {
          // Under mu, where complete() reads the result, and before the last publication, which
          // the shard's commit waits for. (A shard failed meanwhile, say at begin, may have
          // completed already: its result then has no stage time.)
          std::lock_guard lk(mu);
          job->result.stage = Clock::now() - t_stage;
        }
        job->staged->publish(n, last);
      });
    } catch (...) {
      job->staged->fail(to_error(std::current_exception()));
      throw;
    }
    std::lock_guard lk(mu);
    staged_records[static_cast<std::size_t>(job->rank)] = StagedRecord{job->step, job->files, job->info, false};
  }

  // check_deferred_staging: the staged bytes of each of `views` must be what save() saw
  // (`at_save`, their XXH3 then, in the same order).
  void check_staged_tensors(const ShardJob& job, std::span<const TensorView> views, std::span<const std::uint64_t> at_save) {
    if (at_save.empty()) return;  // the option is off
    std::unordered_map<std::string_view, std::pair<const FileImage*, const ShardTensor*>> by_name;
    for (const auto& f : job.files)
      for (const auto& h : f.header.tensors) by_name.emplace(h.name, std::pair(&f, &h));
    for (std::size_t i = 0; i < at_save.size(); ++i) {
      const auto [file, rec] = by_name.at(views[i].name);
      check_staged_tensor(job, views[i], *file, *rec, at_save[i]);
    }
  }

  void check_staged_tensor(const ShardJob& job, const TensorView& t, const FileImage& file, const ShardTensor& rec, std::uint64_t at_save) {
    const std::byte* data = staging[static_cast<std::size_t>(job.rank)].data() + file.offset + file.header.data_start + rec.begin;
    const std::uint64_t copied = xxh3_64(data, static_cast<std::size_t>(rec.end - rec.begin));
    if (copied != at_save) {
      std::lock_guard lk(mu);
      staged_records[static_cast<std::size_t>(job.rank)].reset();
      throw Error(Errc::invalid_argument, {},
                  "tensor '" + t.name + "' of rank " + std::to_string(job.rank) + " (step " + std::to_string(job.step) +
                      ") was modified between save() and the end of its deferred copy (check_deferred_staging): the caller must not "
                      "modify saved tensors until wait_staged() returns",
                  "xxh3 " + xxh3_hex(at_save) + " (at save())", "xxh3 " + xxh3_hex(copied) + " (copied)");
    }
  }

  void stage(ShardJob& job, std::span<const TensorView> tensors) {
    reserve_staging(job);
    copy_into_staging(job, tensors, [](std::uint64_t, bool) {});
  }

  void reserve_staging(const ShardJob& job) {
    AlignedBuffer& buf = staging[static_cast<std::size_t>(job.rank)];
    if (buf.capacity() < job.padded) {
      // Grows only when the state grows; pre-faulted so the copy below runs at memcpy speed.
      const std::uint64_t old = buf.capacity();
      buf = AlignedBuffer(static_cast<std::size_t>(job.padded), /*prefault=*/true);
      std::lock_guard lk(mu);
      ++stats.staging_allocations;
      stats.staging_bytes += buf.capacity() - old;
    }
  }

  // The images into the reserved buffer, file after file, each in file order (header,
  // tensors, the O_DIRECT padding), calling published(n, last) as each prefix [0, n) of the
  // staging is in place.
  template <typename Published>
  void copy_into_staging(const ShardJob& job, std::span<const TensorView> tensors, Published published) {
    std::byte* const base = staging[static_cast<std::size_t>(job.rank)].data();
    std::unordered_map<std::string_view, const TensorView*> by_name;
    for (const auto& t : tensors) by_name.emplace(t.name, &t);
    for (const FileImage& f : job.files) {
      std::byte* const out = base + f.offset;
      const std::string head = encode_shard_header(f.header);
      std::memcpy(out, head.data(), head.size());
      std::vector<const ShardTensor*> order;
      order.reserve(f.header.tensors.size());
      for (const auto& t : f.header.tensors) order.push_back(&t);
      std::sort(order.begin(), order.end(), [](const ShardTensor* a, const ShardTensor* b) { return a->begin < b->begin; });
      for (const ShardTensor* t : order) {
        const auto& src = by_name.at(t->name)->data;
        std::byte* dst = out + f.header.data_start + t->begin;
        for (std::size_t done = 0; done < src.size();) {
          const std::size_t n = std::min<std::size_t>(src.size() - done, detail::StagedBytes::kPublishStep);
          std::memcpy(dst + done, src.data() + done, n);
          done += n;
          published(f.offset + f.header.data_start + t->begin + done, false);
        }
      }
      std::memset(out + f.size, 0, static_cast<std::size_t>(f.padded - f.size));
      published(f.offset + f.padded, &f == &job.files.back());
    }
  }

  // Into a checkpoint coroutine's inbox, from any thread. A report counts as the rank's
  // report at once, so that the shutdown drain sees it.
  void send(const std::shared_ptr<StepState>& st, Message m) {
    if (std::holds_alternative<RankReport>(m)) {
      std::lock_guard lk(mu);
      ++st->reported;
    }
    cv.notify_all();
    asio::post(ctx, [st, m = std::move(m)]() mutable {
      // The inbox holds every message a step can get (StepState): it never fills.
      st->inbox.try_send(boost::system::error_code{}, std::move(m));
    });
  }

  template <typename F>
  auto on_work_pool(F f) {
    return detail::offload(work_pool.get_executor(), std::move(f));
  }
  template <typename F>
  auto on_root_pool(F f) {
    return detail::offload(root_pool.get_executor(), std::move(f));
  }

  // ---- the checkpoint coroutine (one per step, on the io_context) ----------------------

  asio::awaitable<void> run_checkpoint(std::shared_ptr<StepState> st) {
    // 1. The temporary directory, once for all the step's shards.
    std::optional<Error> begun_badly;
    try {
      // (st by an init-capture: g++ 12 copies a coroutine parameter named in a lambda's
      // capture list from the argument, gone by now, rather than from the frame's copy.)
      st->target = co_await on_root_pool([this, step = st->step, needed = expected_bytes(*st)] {
        std::lock_guard lk(root_mu);
        if (local[0]) make_room_for(needed);
        StepOptions o;
        o.begin.allow_older_than_latest = opt.allow_older_than_latest;
        // Ranks in several processes: every process makes or names the run's shared
        // temporaries (StoreWriter::begin).
        if (!run_id.empty()) o.shared = SharedRun{run_id, first_local()};
        return std::shared_ptr<StepTarget>(writer->begin(step, o));
      });
    } catch (...) {
      begun_badly = to_error(std::current_exception());
    }

    // 2. Every local rank's shard: a shard coroutine starts as the rank hands it over; each
    //    reports back here when it is durable or has failed.
    //    With node roots, once every shard is staged, the redundancy units start too (from
    //    the staged images, while the shards are written); the commit waits for them.
    std::vector<RankReport> reports;
    std::optional<Error> abandoned, blocks_failed;
    int settled = 0;  // local ranks whose shard was handed over, or whose staging failed
    std::vector<bool> handed(static_cast<std::size_t>(opt.world_size), false);
    std::size_t units = 0, units_done = 0;
    std::vector<std::vector<RedundancyBlock>> unit_blocks;
    bool exchanging = false;
    // Once every local rank is settled: the redundancy units, from the staged images while the
    // shards are written. In one process at once; across processes after the sizes are known
    // everywhere (so every process plans the same units, or none).
    // (The frame's own copy of st: g++ 12 takes a coroutine parameter named in a lambda from
    // the argument, gone by now; see step 1.)
    const std::shared_ptr<StepState> step_state = st;
    const auto all_settled = [&] {
      if (!layout) return;
      if (multi_process()) {
        exchanging = true;
        std::optional<std::string> failed;
        if (begun_badly) failed = std::string("rank ") + std::to_string(first_local()) + ": " + begun_badly->what();
        for (int r = 0; r < opt.world_size; ++r)
          if (local[static_cast<std::size_t>(r)] && !handed[static_cast<std::size_t>(r)] && !failed)
            failed = "rank " + std::to_string(r) + " failed to stage its shard";
        exchange_sizes(step_state, std::move(failed));
        return;
      }
      if (begun_badly || step_state->failed) return;
      step_state->sizes = shard_sizes(*step_state);
      units = redundancy_units(*layout, step_state->sizes);
      unit_blocks.resize(units);
      for (std::size_t u = 0; u < units; ++u)
        asio::post(work_pool, [this, state = step_state, u] { send(state, unit_work(state, u)); });
    };
    while ((static_cast<int>(reports.size()) < local_count || units_done < units || exchanging) && !abandoned) {
      Message m = co_await st->inbox.async_receive(asio::use_awaitable);
      if (auto* job = std::get_if<std::shared_ptr<ShardJob>>(&m)) {
        if (begun_badly) send(st, RankReport{(*job)->rank, *begun_badly, {}, {}});
        else asio::co_spawn(ctx, write_shard(st, *job), asio::detached);
        handed[static_cast<std::size_t>((*job)->rank)] = true;
        if (++settled == local_count) all_settled();
      } else if (auto* r = std::get_if<RankReport>(&m)) {
        if (r->error) st->failed = true;
        const bool staging_failed = !handed[static_cast<std::size_t>(r->rank)];
        reports.push_back(std::move(*r));
        if (staging_failed && ++settled == local_count) all_settled();
      } else if (auto* b = std::get_if<BlocksDone>(&m)) {
        ++units_done;
        if (b->error && !blocks_failed) blocks_failed = b->error;
        for (auto& x : b->blocks) unit_blocks[b->unit].push_back(std::move(x));
      } else if (auto* k = std::get_if<SizesKnown>(&m)) {
        exchanging = false;
        if (k->error) {
          blocks_failed = k->error;
        } else if (!k->failed) {
          st->sizes = std::move(k->sizes);
          units = start_units_across_processes(st);
          unit_blocks.resize(redundancy_units(*layout, st->sizes));
        }
      } else {
        abandoned = std::get<Abandon>(m).error;
      }
    }
    if (!step_state->movers.empty())
      co_await on_root_pool([&] {
        for (auto& t : step_state->movers) t.join();  // each has sent its last message
      });
    for (auto& u : unit_blocks)
      for (auto& b : u) st->blocks.push_back(std::move(b));
    // The blocks this process wrote go to the commit with its lowest rank's report.
    if (!reports.empty()) {
      auto& first = *std::min_element(reports.begin(), reports.end(), [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
      first.blocks = std::move(st->blocks);
      st->blocks.clear();
    }
    // A redundancy block that failed fails the checkpoint, as a shard would; when a shard
    // failed, its error is the cause (the blocks stopped because of it).
    const bool shard_failed = std::any_of(reports.begin(), reports.end(), [](const RankReport& r) { return r.error.has_value(); });
    if (blocks_failed && !shard_failed && !reports.empty() && !abandoned) {
      auto& first = *std::min_element(reports.begin(), reports.end(), [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
      if (!first.error) first.error = *blocks_failed;
    }

    // 3. The commit, across every rank of the world (the coordinator), once.
    CommitOutcome outcome;
    if (abandoned) {
      outcome.error = *abandoned;
      co_await on_root_pool([&] {
        if (st->target) {
          std::lock_guard lk(root_mu);
          abort_step(*st);
        }
        coordinator->abandon(st->step, outcome);
      });
    } else {
      std::sort(reports.begin(), reports.end(), [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
      outcome = co_await exchange(st, std::move(reports));
    }

    // 4. The handles complete, and the barrier opens for the next step.
    complete(st, outcome);

    // 5. Rotation, off the path of the next save, which may already be staging.
    if (st->committed_here && !outcome.error) co_await on_root_pool([this, step = st->step] { rotate(step); });

    {
      std::lock_guard lk(mu);
      --checkpoints_running;
    }
    cv.notify_all();
  }

  // One shard, on the io_context: create and preallocate its files, then write each staged
  // image and hash it at the same time, fsync, report. A shard of several files has them
  // written one after the other and hashed all at once, each on its own work-pool thread.
  asio::awaitable<void> write_shard(std::shared_ptr<StepState> st, std::shared_ptr<ShardJob> job) {
    RankReport report{job->rank, std::nullopt, {}, {}};
    std::vector<std::unique_ptr<ShardWriter>> writers;
    const auto stopped = [&st] { return st->cancelled.load(); };
    struct Cancelled {};
    const int parts = static_cast<int>(job->files.size());
    try {
      if (stopped()) throw Cancelled{};
      writers = co_await on_work_pool([&] {
        std::vector<std::unique_ptr<ShardWriter>> ws;
        for (int k = 0; k < parts; ++k)
          ws.push_back(std::make_unique<ShardWriter>(ShardWriter::image(fs, shard_dir(*st, job->rank), shard_file_name(job->rank, opt.world_size, k, parts),
                                                                        job->files[static_cast<std::size_t>(k)].header,
                                                                        {.chunk_size = opt.chunk_size, .direct = opt.direct_io})));
        return ws;
      });
      const auto t_write = Clock::now();
      detail::StagedBytes* const staged = job->staged.get();
      // A file's SHA-256 is sequential, so a file's hashing is one thread's; the step's files
      // hash in parallel on the work pool (a thread per core). When this process has fewer
      // shards than the pool has threads and a shard is one file, its hashing is split in two
      // (the XXH3s on one thread, SHA-256 on another), so that the file is bounded by SHA-256
      // alone; a shard of several files (max_file_bytes) has a thread per file instead.
      const bool split = parts == 1 && local_count < pool_size(opt);
      std::vector<asio::awaitable<std::chrono::nanoseconds>> hashing;
      for (int k = 0; k < parts; ++k) {
        ShardWriter& w = *writers[static_cast<std::size_t>(k)];
        const FileImage& f = job->files[static_cast<std::size_t>(k)];
        const auto bytes = staging[static_cast<std::size_t>(job->rank)].span(static_cast<std::size_t>(job->padded)).subspan(
            static_cast<std::size_t>(f.offset), static_cast<std::size_t>(f.size));
        // (Chosen before the co_await: g++ 12 mishandles a conditional's temporaries inside one.)
        if (split) hashing.push_back(hash_split(w, bytes, staged, f.offset, stopped));
        else
          hashing.push_back(on_work_pool([&w, bytes, staged, base = f.offset, &stopped] {
            return hash_image(w, bytes, staged, base, stopped, &ShardWriter::hash);
          }));
      }
      auto [writer_name, hash_times] = co_await detail::both(write_files(writers, *job, *st, staged), detail::all(std::move(hashing)));
      if (stopped()) throw Cancelled{};
      job->result.write = since(t_write);
      job->result.hash = *std::max_element(hash_times.begin(), hash_times.end());
      job->result.backend = std::string(writer_name);
      const auto t_sync = Clock::now();
      std::vector<ShardReport> done = co_await on_work_pool([&writers, rank = job->rank] {
        std::vector<ShardReport> out;
        for (auto& w : writers) out.push_back(w->finish(rank));
        return out;
      });
      report.shard = std::move(done.front());
      for (std::size_t k = 1; k < done.size(); ++k) {
        done[k].shard.part = static_cast<int>(k);
        report.shard.more_files.push_back(std::move(done[k].shard));
        for (auto& t : done[k].tensors) {
          t.part = static_cast<int>(k);
          report.shard.tensors.push_back(std::move(t));
        }
      }
      attach_sharding(report.shard.tensors, job->sharding);
      job->result.fsync = since(t_sync);
      report.shard.shard.param_shard_offset = job->info.param_shard_offset;
      report.shard.shard.param_shard_numel = job->info.param_shard_numel;
      report.shard.shard.metadata = job->info.metadata;
      report.shard.param_numel = job->info.param_numel;
      report.shard.wall_clock_seconds = job->info.wall_clock_seconds;
      report.shard.training = job->info.training;
    } catch (...) {
      report.error = to_error(std::current_exception());
    }
    if (report.error && stopped()) {
      // A shard the cancel stopped fails with the reason cancel() gave (a shard already
      // durable when it came reports as usual).
      std::lock_guard lk(mu);
      report.error = Error(Errc::aborted, join_path(st->target ? st->target->shard_dir(job->rank) : opt.root, shard_file_name(job->rank, opt.world_size, 0, parts)),
                           "save of step " + std::to_string(st->step) + " cancelled: " + st->cancel_reason);
    }
    if (!writers.empty() && report.error) co_await on_work_pool([&] { writers.clear(); });  // closes the failed files
    send(st, std::move(report));
  }

  // The files' staged images into their files, one after the other; the writer's name.
  asio::awaitable<std::string_view> write_files(std::vector<std::unique_ptr<ShardWriter>>& writers, const ShardJob& job, StepState& st,
                                                detail::StagedBytes* staged) {
    std::string_view name;
    for (std::size_t k = 0; k < writers.size(); ++k) {
      ShardWriter& w = *writers[k];
      const FileImage& f = job.files[k];
      const auto image = staging[static_cast<std::size_t>(job.rank)].span(static_cast<std::size_t>(job.padded)).subspan(
          static_cast<std::size_t>(f.offset), static_cast<std::size_t>(w.file().is_direct() ? f.padded : f.size));
      name = co_await write_image(w.file(), image, st, staged, f.offset);
      w.mark_written(image.size());
    }
    co_return name;
  }

  // A shard's image into its file. Syncs behind the writes: a durable save ends with an
  // fsync, which has the device persist all of the shard at once (this VM's disk took 480 ms
  // for a 1 GiB shard after its writes); a large image is written in pieces, each while the
  // pieces before it are synced, so that the last fsync (in finish()) has only the tail left.
  // A device flush is the whole device's, so the process's shards share one rate: a piece is
  // kFlushBehind bytes times the shards this process writes (four 256 MiB shards at once
  // synced behind every 64 MiB wrote 0.72x as fast as with their last fsyncs alone). The
  // last piece takes the remainder: an image of less than two pieces is written as one.
  static constexpr std::size_t kFlushBehind = std::size_t{64} << 20;
  // `base`: where the image starts in the rank's staging (what the staged watermark counts).
  asio::awaitable<std::string_view> write_image(WritableFile& file, std::span<const std::byte> image, StepState& st, detail::StagedBytes* staged,
                                                std::uint64_t base) {
    const auto io = static_cast<std::size_t>(opt.chunk_size);
    const std::size_t step = kFlushBehind * static_cast<std::size_t>(std::max(1, local_count));
    const std::size_t pieces = std::max<std::size_t>(1, image.size() / step);
    const auto first = pieces > 1 ? image.first(step) : image;  // (not inside the co_await: g++ 12, above)
    std::string_view name = co_await backend->write(file, first, io, opt.queue_depth, &st.cancelled, staged, 0, base);
    for (std::size_t k = 1; k < pieces; ++k) {
      const std::size_t off = k * step;
      const auto piece = k + 1 < pieces ? image.subspan(off, step) : image.subspan(off);
      auto [n, synced] = co_await detail::both(backend->write(file, piece, io, opt.queue_depth, &st.cancelled, staged, off, base), on_work_pool([&file] {
                                                 file.sync();
                                                 return true;
                                               }));
      (void)synced;
      name = n;
    }
    co_return name;
  }

  // Feeds `bytes` (a shard's image) to `part` of the shard's hashing, in pieces, so that a
  // cancelled save stops hashing too (the shard is failed then); an overlapped save's pieces
  // as its copy publishes them. Returns the time it took.
  template <typename Stopped>
  static std::chrono::nanoseconds hash_image(ShardWriter& w, std::span<const std::byte> bytes, detail::StagedBytes* staged, std::uint64_t base,
                                             const Stopped& stopped, void (ShardWriter::*part)(std::span<const std::byte>)) {
    const std::size_t piece = staged ? detail::StagedBytes::kPublishStep : std::size_t{64} << 20;
    const auto t0 = Clock::now();
    for (std::size_t off = 0; off < bytes.size() && !stopped(); off += piece) {
      const std::size_t n = std::min(piece, bytes.size() - off);
      if (staged) staged->wait(base + off + n);
      (w.*part)(bytes.subspan(off, n));
    }
    return since(t0);
  }

  // The XXH3s and SHA-256 of one shard on two work-pool threads at once; the longer time.
  // (Awaited in the caller's full-expression: its arguments, the caller's locals, outlive it.)
  template <typename Stopped>
  asio::awaitable<std::chrono::nanoseconds> hash_split(ShardWriter& w, std::span<const std::byte> bytes, detail::StagedBytes* staged,
                                                       std::uint64_t base, const Stopped& stopped) {
    auto [a, b] = co_await detail::both(
        on_work_pool([&w, bytes, staged, base, &stopped] { return hash_image(w, bytes, staged, base, stopped, &ShardWriter::hash_checksums); }),
        on_work_pool([&w, bytes, staged, base, &stopped] { return hash_image(w, bytes, staged, base, stopped, &ShardWriter::hash_sha256); }));
    co_return std::max(a, b);
  }

  // The most redundancy units a step can have (its inbox holds their messages).
  std::size_t max_units() const noexcept {
    if (!layout) return 0;
    if (layout->scheme.kind == RedundancyScheme::Kind::reed_solomon)
      return static_cast<std::size_t>(layout->nodes) * static_cast<std::size_t>(layout->scheme.m);
    return static_cast<std::size_t>(layout->scheme.copies) * static_cast<std::size_t>(opt.world_size);
  }

  // Where rank's shard goes.
  static const std::string& shard_dir(const StepState& st, int rank) { return st.target->shard_dir(rank); }

  std::vector<std::uint64_t> shard_sizes(const StepState& st) const {
    std::vector<std::uint64_t> sizes;
    std::lock_guard lk(mu);
    for (const auto& j : st.jobs) sizes.push_back(j ? j->size : 0);
    return sizes;
  }

  bool multi_process() const noexcept { return local_count < opt.world_size; }
  int first_local() const noexcept {
    int r = 0;
    while (r + 1 < opt.world_size && !local[static_cast<std::size_t>(r)]) ++r;
    return r;
  }

  // One unit of the step's redundancy (node roots): its block written from the staged images
  // of the ranks (valid until the step completes: no save restages meanwhile), a local rank's
  // bytes copied, another process's received. A unit that stops early (a failure, a cancel)
  // still takes in every message its senders will send, so none of them is left waiting.
  BlocksDone unit_work(const std::shared_ptr<StepState>& st, std::size_t unit) {
    BlocksDone done;
    done.unit = unit;
    std::size_t consumed = 0;  // reads taken, in unit_reads' order
    try {
      done.blocks = st->target->write_redundancy_unit(
          st->sizes, unit,
          [&](int r, std::uint64_t at, std::span<std::byte> out) {
            ++consumed;
            if (local[static_cast<std::size_t>(r)]) {
              // A pipelined save's copy may still be going on: the unit reads what is staged.
              std::shared_ptr<detail::StagedBytes> staged;
              {
                std::lock_guard lk(mu);
                if (const auto& job = st->jobs[static_cast<std::size_t>(r)]) staged = job->staged;
              }
              if (staged) staged->wait(at + out.size());
              std::memcpy(out.data(), staging[static_cast<std::size_t>(r)].data() + at, out.size());
            }
            else coordinator->receive_bytes(r, static_cast<std::uint32_t>(unit), out);
          },
          opt.chunk_size, [&st] { return st->cancelled.load() || st->failed.load(); });
    } catch (...) {
      done.error = to_error(std::current_exception());
      try {
        const auto reads = unit_reads(*layout, st->sizes, unit, opt.chunk_size);
        AlignedBuffer scratch;
        for (std::size_t i = consumed; i < reads.size(); ++i) {
          if (local[static_cast<std::size_t>(reads[i].rank)]) continue;
          if (scratch.capacity() < reads[i].length) scratch = AlignedBuffer(static_cast<std::size_t>(reads[i].length));
          coordinator->receive_bytes(reads[i].rank, static_cast<std::uint32_t>(unit), scratch.span(static_cast<std::size_t>(reads[i].length)));
        }
      } catch (const Error& e) {
        log_event(LogLevel::warn, "redundancy_drain_failed", "redundancy unit " + std::to_string(unit) + " of step " + std::to_string(st->step) + " could not drain its senders: " + e.what(), {.step = st->step});
      }
    }
    return done;
  }


  // Ranks in several processes: every process's shard sizes for the step, through the
  // coordinator, on a thread of its own (it waits for the slowest process).
  void exchange_sizes(const std::shared_ptr<StepState>& st, std::optional<std::string> failed) {
    std::string mine;
    if (failed) {
      mine = detail::encode_sizes_failure(*failed);
    } else {
      const auto sizes = shard_sizes(*st);
      std::vector<std::pair<int, std::uint64_t>> hosted;
      for (int r = 0; r < opt.world_size; ++r)
        if (local[static_cast<std::size_t>(r)]) hosted.emplace_back(r, sizes[static_cast<std::size_t>(r)]);
      mine = detail::encode_shard_sizes(hosted);
    }
    st->movers.emplace_back([this, st, mine = std::move(mine)] {
      SizesKnown k;
      try {
        detail::ShardSizes all = detail::decode_shard_sizes(coordinator->exchange(st->step, mine), opt.world_size, st->step);
        k.sizes = std::move(all.sizes);
        k.failed = std::move(all.failed);
      } catch (...) {
        k.error = to_error(std::current_exception());
      }
      send(st, std::move(k));
    });
  }

  // Ranks in several processes, the sizes known: the units whose block this process writes
  // (redundancy_unit_rank), and for the others the bytes of this process's ranks that their
  // writers read (unit_reads), each on a thread of its own: a writer waits for its senders and
  // a sender for its writer, so none may wait behind another's. Returns how many messages to
  // await (one per thread).
  std::size_t start_units_across_processes(const std::shared_ptr<StepState>& st) {
    std::size_t started = 0;
    const std::size_t units = redundancy_units(*layout, st->sizes);
    for (std::size_t u = 0; u < units; ++u) {
      const int writer = redundancy_unit_rank(*layout, st->sizes, u);
      if (local[static_cast<std::size_t>(writer)]) {
        st->movers.emplace_back([this, st, u] { send(st, unit_work(st, u)); });
        ++started;
        continue;
      }
      std::vector<RankRead> mine;
      for (const auto& r : unit_reads(*layout, st->sizes, u, opt.chunk_size))
        if (local[static_cast<std::size_t>(r.rank)]) mine.push_back(r);
      if (mine.empty()) continue;
      st->movers.emplace_back([this, st, u, writer, mine = std::move(mine)] {
        BlocksDone done;
        done.unit = u;
        try {
          for (const auto& r : mine)
            coordinator->send_bytes(writer, static_cast<std::uint32_t>(u),
                                    std::span<const std::byte>(staging[static_cast<std::size_t>(r.rank)].data() + r.offset, static_cast<std::size_t>(r.length)));
        } catch (...) {
          done.error = to_error(std::current_exception());
        }
        send(st, std::move(done));
      });
      ++started;
    }
    return started;
  }

  // Removes the step's temporaries (one root, or every node root). Under root_mu.
  static void abort_step(const StepState& st) noexcept {
    if (st.target) st.target->abort();
  }

  // Hands this process's reports to the coordinator and awaits the outcome. The last report
  // of the world runs the commit (in-process: on the root thread, here; under MPI: on rank 0's
  // process), and every rank's outcome comes back through its callback.
  asio::awaitable<CommitOutcome> exchange(const std::shared_ptr<StepState>& st, std::vector<RankReport> reports) {
    return asio::async_initiate<const asio::use_awaitable_t<>&, void(CommitOutcome)>(
        [this, st, reports = std::move(reports)](auto handler) mutable {
          struct Waiting {
            Waiting(decltype(handler) handler_, std::size_t n) : h(std::move(handler_)), left(n) {}
            decltype(handler) h;
            std::mutex m;
            std::size_t left;
          };
          auto waiting = std::make_shared<Waiting>(std::move(handler), reports.size());
          asio::post(root_pool, [this, st, waiting, reports = std::move(reports)]() mutable {
            for (auto& r : reports)
              coordinator->report(
                  st->step, std::move(r), [this, st](std::vector<RankReport>& all) { return commit(*st, all); },
                  [waiting](const CommitOutcome& o) {
                    std::unique_lock lk(waiting->m);
                    if (--waiting->left > 0) return;
                    lk.unlock();
                    // Every rank of a step gets the same outcome; one copy with its own strings
                    // goes back to the coroutine's thread.
                    CommitOutcome mine = o;
                    asio::dispatch(asio::append(std::move(waiting->h), std::move(mine)));
                  });
          });
        },
        asio::use_awaitable);
  }

  // ---- the commit (in the committing process, once per step) --------------------------

  CommitOutcome commit(StepState& st, std::vector<RankReport>& reports) {
    const auto t0 = Clock::now();
    std::lock_guard lk(root_mu);
    try {
      std::vector<ShardReport> shards;
      std::vector<RedundancyBlock> blocks;
      for (auto& r : reports) {
        if (r.error) throw *r.error;
        shards.push_back(std::move(r.shard));
        for (auto& b : r.blocks) blocks.push_back(std::move(b));
      }
      if (!st.target) throw Error(Errc::invalid_argument, opt.root, "step " + std::to_string(st.step) + " was never begun");
      // A node set records its layout and the blocks, in the layout's order (StepTarget::commit).
      std::string dir = st.target->commit(assemble_manifest(st.step, opt.chunk_size, std::move(shards)), std::move(blocks));
      // Handed over before rotation, so that an older step whose copy it supersedes is no
      // longer pinned and rotates away now.
      if (replicator && st.step % opt.durable->every == 0) replicator->submit(st.step);
      if (local_replicator && st.step % opt.local_tier->every == 0) local_replicator->submit(st.step);
      st.committed_here = true;
      return {std::nullopt, dir, since(t0)};
    } catch (...) {
      abort_step(st);
      return {to_error(std::current_exception()), {}, since(t0)};
    }
  }

  // The expected size of the step's checkpoint: this process's shards staged so far, a local
  // rank not staged yet counted as the largest of them, scaled to the world size when other
  // processes save the other ranks.
  std::uint64_t expected_bytes(const StepState& st) const {
    std::lock_guard lk(mu);
    std::uint64_t sum = 0, largest = 0;
    int known = 0;
    for (const auto& job : st.jobs)
      if (job) sum += job->padded, largest = std::max(largest, job->padded), ++known;
    sum += static_cast<std::uint64_t>(local_count - known) * largest;
    return sum / static_cast<std::uint64_t>(local_count) * static_cast<std::uint64_t>(opt.world_size);
  }

  // Pre-save rotation (under root_mu, before begin): a failure is logged, not thrown; the
  // save then goes on and fails on its own if the space is short.
  void make_room_for(std::uint64_t needed) {
    try {
      const auto removed = writer->make_room(needed, pinned());
      if (removed.empty()) return;
      std::lock_guard slk(mu);
      ++stats.early_rotations;
      stats.early_rotated += removed.size();
    } catch (const Error& e) {
      log_event(LogLevel::warn, "pre_save_rotation_failed", std::string("pre-save rotation failed: ") + e.what());
    }
  }

  // Keeps the newest keep_last checkpoints (store/local/commit.hpp), and those the durable tier still
  // has to copy. Runs after the handles complete; a failure is logged, not thrown: the new
  // checkpoint is committed.
  // The steps the durable tier still has to copy (none without one).
  KeepStep pinned() const {
    if (!replicator && !local_replicator) return {};
    return [this](std::uint64_t step) {
      const std::string name = checkpoint_dir_name(step);
      return (replicator && replicator->pinned(name)) || (local_replicator && local_replicator->pinned(name));
    };
  }

  void rotate(std::uint64_t committed) {
    std::lock_guard lk(root_mu);
    try {
      const auto removed = writer->rotate(opt.keep_last, committed, pinned());
      std::lock_guard slk(mu);
      stats.rotated += removed.size();
    } catch (const Error& e) {
      log_event(LogLevel::warn, "rotation_failed", std::string("rotation failed (the new checkpoint is committed): ") + e.what());
    }
  }

  // ---- outcome, on the io_context ------------------------------------------------------

  // One rank's committed save in the counters and phase histograms (under mu).
  void record_committed(const SaveResult& res) {
    stats.bytes_committed += res.bytes;
    SavePhaseTimings& p = stats.phases;
    p.stall.observe(res.stall), p.stage.observe(res.stage), p.write.observe(res.write), p.hash.observe(res.hash);
    p.fsync.observe(res.fsync), p.commit.observe(res.commit), p.total.observe(res.total);
  }

  void complete(const std::shared_ptr<StepState>& st, const CommitOutcome& outcome) {
    std::vector<std::pair<std::shared_ptr<ShardJob>, SaveResult>> done;
    {
      std::lock_guard lk(mu);
      if (outcome.error && outcome.error->code() == Errc::invalid_argument) {
        // The caller's mistake (a step at or before `latest`, ...): refused, not a failure of
        // the storage, so neither counted as one nor resetting the count.
        ++stats.saves_refused;
        log_event(LogLevel::error, "save_refused", "save of step " + std::to_string(st->step) + " refused: " + outcome.error->what(), {.step = st->step});
      } else if (outcome.error) {
        ++stats.failures;
        ++stats.consecutive_failures;
        stats.last_failure = outcome.error->what();
        // An abandoned checkpoint (shutdown) has had its line already.
        if (!st->abandoned)
          log_event(LogLevel::error, "save_failed", "save of step " + std::to_string(st->step) + " failed (" + std::to_string(stats.consecutive_failures) +
                   " in a row since the last commit): " + stats.last_failure, {.step = st->step});
      } else {
        ++stats.commits;
        stats.consecutive_failures = 0;
        stats.last_committed_step = st->step;
        log_event(LogLevel::debug, "save_committed", "step " + std::to_string(st->step) + " committed: " + outcome.dir, {.step = st->step});
      }
      if (!outcome.error)
        for (auto& rec : staged_records)
          if (rec && rec->step == st->step) rec->committed = true;
      for (auto& job : st->jobs) {
        if (!job) continue;
        SaveResult res = job->result;
        res.bytes = job->size;
        res.dir = outcome.dir;
        res.commit = outcome.commit;
        res.total = since(job->t_call);
        if (!outcome.error) record_committed(res);
        done.emplace_back(job, std::move(res));
      }
      // Every rank gets the same outcome; the handles complete together, after the barrier
      // is released, so a ready() handle means the next save will not stall on this one.
      if (in_flight == st) in_flight.reset();
    }
    cv.notify_all();
    for (auto& [job, res] : done)
      job->handle->complete(outcome.error, std::move(res));
  }
};

void DurationHistogram::observe(std::chrono::nanoseconds d) noexcept {
  const double seconds = std::chrono::duration<double>(d).count();
  for (std::size_t i = 0; i < kBounds.size(); ++i)
    if (seconds <= kBounds[i]) ++at_most[i];
  ++count;
  sum_seconds += seconds;
}

Checkpointer::Checkpointer(CheckpointerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Checkpointer::~Checkpointer() {
  if (impl_->forked()) {
    // A forked child's copy: its threads are the parent's, gone here, and its lock's file
    // description is shared with the parent. Dropped without a destructor (a leak, until
    // the child exits), so nothing is joined, unlocked or removed.
    (void)impl_.release();
    return;
  }
  close();
}

void Checkpointer::close() {
  if (impl_->forked()) return;
  std::call_once(impl_->closed, [this] { impl_->shutdown(); });
}

SaveHandle Checkpointer::save(int rank, std::uint64_t step, std::span<const TensorView> tensors, const SaveInfo& info) {
  return impl_->save(rank, step, tensors, info, impl_->opt.staging);
}

SaveHandle Checkpointer::save(int rank, std::uint64_t step, std::span<const TensorView> tensors, const SaveInfo& info, Staging staging) {
  return impl_->save(rank, step, tensors, info, staging);
}

SaveResult Checkpointer::save_sync(int rank, std::uint64_t step, std::span<const TensorView> tensors, const SaveInfo& info) {
  // Blocks until durable: the copy may as well overlap the writes and the hashing.
  return impl_->save(rank, step, tensors, info, Staging::overlapped).wait();
}

void Checkpointer::wait_all() {
  impl_->refuse_if_forked("wait_all()");
  std::unique_lock lk(impl_->mu);
  impl_->cv.wait(lk, [&] { return !impl_->in_flight && impl_->checkpoints_running == 0; });
}

bool Checkpointer::wait_all_for(std::chrono::nanoseconds timeout) {
  impl_->refuse_if_forked("wait_all_for()");
  std::unique_lock lk(impl_->mu);
  return impl_->cv.wait_for(lk, timeout, [&] { return !impl_->in_flight && impl_->checkpoints_running == 0; });
}

bool Checkpointer::wait_turn_for(std::uint64_t step, std::chrono::nanoseconds timeout) {
  impl_->refuse_if_forked("wait_turn_for()");
  std::unique_lock lk(impl_->mu);
  return impl_->cv.wait_for(lk, timeout, [&] {
    return impl_->closing || impl_->opt.when_busy == BusyPolicy::skip || !impl_->in_flight || impl_->in_flight->step == step;
  });
}

std::optional<std::uint64_t> Checkpointer::cancel(const std::string& why) {
  impl_->refuse_if_forked("cancel()");
  std::shared_ptr<Impl::StepState> st;
  {
    std::lock_guard lk(impl_->mu);
    st = impl_->in_flight;
    if (!st || st->cancelled) return st ? std::optional(st->step) : std::nullopt;
    st->cancel_reason = why;
    st->cancelled = true;
  }
  log_event(LogLevel::warn, "save_cancelled", "cancelling the save of step " + std::to_string(st->step) + ": " + why, {.step = st->step});
  return st->step;
}

std::optional<StagedSnapshot> Checkpointer::staged(int rank) const {
  impl_->refuse_if_forked("staged()");
  check_rank(rank, impl_->opt.world_size, "staged rank");
  std::lock_guard lk(impl_->mu);
  const auto& rec = impl_->staged_records[static_cast<std::size_t>(rank)];
  if (!rec || !rec->committed) return std::nullopt;
  StagedSnapshot snap{rec->step, {}, rec->info};
  for (const auto& f : rec->files) {
    const std::byte* data = impl_->staging[static_cast<std::size_t>(rank)].data() + f.offset + f.header.data_start;
    for (const auto& t : f.header.tensors)
      snap.tensors.push_back({t.name, t.dtype, t.shape, std::span(data + t.begin, static_cast<std::size_t>(t.end - t.begin)), std::nullopt});
  }
  return snap;
}

void Checkpointer::copy_to_durable(std::uint64_t step) {
  impl_->refuse_if_forked("copy_to_durable()");
  // Only where the tier's cadence passed the step over: a step it took is copied already.
  if (impl_->local_replicator && step % impl_->opt.local_tier->every != 0) impl_->local_replicator->submit(step);
  if (impl_->replicator && step % impl_->opt.durable->every != 0) impl_->replicator->submit(step);
}

void Checkpointer::wait_durable() {
  impl_->refuse_if_forked("wait_durable()");
  if (impl_->local_replicator) impl_->local_replicator->wait_idle();
  if (impl_->replicator) impl_->replicator->wait_idle();
}

std::optional<std::uint64_t> Checkpointer::durable_latest() {
  return impl_->replicator ? impl_->replicator->durable_latest() : std::nullopt;
}

DurableDrain Checkpointer::drain_durable(const DurableDrainOptions& options) {
  impl_->refuse_if_forked("drain_durable()");
  // The local tier first (a disk: it drains within the deadline as a rule), then the durable
  // tier with what is left of the deadline.
  if (impl_->local_replicator) {
    const auto t0 = std::chrono::steady_clock::now();
    const DurableDrain local = impl_->local_replicator->drain(options);
    if (!local.complete) log_event(LogLevel::warn, "tier_drain_gave_up", "local tier " + impl_->opt.local_tier->root + ": its drain gave up");
    if (impl_->replicator) {
      DurableDrainOptions rest = options;
      if (rest.deadline) {
        const auto used = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
        rest.deadline = std::max(std::chrono::milliseconds(0), *rest.deadline - used);
      }
      return impl_->replicator->drain(rest);
    }
    return local;
  }
  return impl_->replicator ? impl_->replicator->drain(options) : DurableDrain{};
}

bool Checkpointer::wait_durable_for(std::chrono::nanoseconds timeout) {
  impl_->refuse_if_forked("wait_durable_for()");
  const auto t0 = std::chrono::steady_clock::now();
  if (impl_->local_replicator && !impl_->local_replicator->wait_idle_for(timeout)) return false;
  return !impl_->replicator || impl_->replicator->wait_idle_for(std::max(std::chrono::nanoseconds(0), timeout - (std::chrono::steady_clock::now() - t0)));
}

FileSystem& Checkpointer::file_system() const noexcept { return impl_->fs; }
const std::vector<RepairReport>& Checkpointer::repairs() const noexcept { return impl_->repairs; }

std::string_view Checkpointer::backend_name() const noexcept { return impl_->backend->name(); }

std::uint64_t staging_bytes_for(std::span<const TensorSpec> tensors, int world_size) {
  if (world_size < 1)
    throw Error(Errc::invalid_argument, {}, "staging_bytes_for: world_size", "at least 1", std::to_string(world_size));
  // The header with the longest values its metadata can take: no step or rank needs more.
  const ShardHeader h =
      plan_shard_specs(tensors, shard_header_metadata(world_size - 1, world_size, std::numeric_limits<std::uint64_t>::max()));
  // A shard split into files (CheckpointerOptions::max_file_bytes, automatic up to a file per
  // core) holds the same tensor bytes; each further file adds a header (of a subset of these
  // tensors: at most this one) and up to 4095 bytes of padding twice over (its data start, its end).
  const auto files = static_cast<std::uint64_t>(std::max(2u, std::thread::hardware_concurrency()));
  return (h.file_size() + 4095) / 4096 * 4096 + (files - 1) * (h.data_start + 8192);
}
const CheckpointerOptions& Checkpointer::options() const noexcept { return impl_->opt; }
CheckpointerStats Checkpointer::stats() const {
  impl_->refuse_if_forked("stats()");
  CheckpointerStats out;
  {
    std::lock_guard lk(impl_->mu);
    out = impl_->stats;
  }
  if (impl_->replicator) out.durable = impl_->replicator->stats();
  if (impl_->local_replicator) out.local_tier = impl_->local_replicator->stats();
  return out;
}

SaveCadence SaveCadence::every_steps(std::uint64_t n) {
  if (n == 0) throw_invalid("SaveCadence::every_steps: n must be > 0");
  SaveCadence c;
  c.every_steps_ = n;
  return c;
}

SaveCadence SaveCadence::every_seconds(double seconds, std::chrono::steady_clock::time_point start) {
  if (!(seconds > 0)) throw_invalid("SaveCadence::every_seconds: seconds must be > 0");
  SaveCadence c;
  c.every_ = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds));
  c.last_ = start;
  return c;
}

bool SaveCadence::due(std::uint64_t step, std::chrono::steady_clock::time_point now) {
  if (every_steps_) return step != 0 && step % every_steps_ == 0;
  if (now - last_ < every_) return false;
  last_ = now;
  return true;
}

}  // namespace ckpt
