// The asynchronous checkpointer. Threads:
//   - rank threads call save(): barrier, staging copy, hand-off; nothing else;
//   - one writer thread runs the io_context: creates shard files and drives their writes
//     (io_uring completions, or completions of pool writes);
//   - the work pool hashes staged shards (XXH3 per chunk, XXH3 and SHA-256 per file) while the
//     writes are in flight, then fsyncs, reports to the coordinator and, on the last report,
//     commits and rotates;
//   - the io pool runs blocking pwrites (posix backend, fault-injected files).
// Per step, the InFlight record counts ranks staged and reported; the barrier is "no other
// step in flight".
#include "ckpt/runtime/checkpointer.hpp"

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/json.hpp>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/io/commit.hpp"
#include "ckpt/io/layout.hpp"
#include "ckpt/io/reader.hpp"
#include "ckpt/runtime/detail/write_backend.hpp"

namespace ckpt {

namespace asio = boost::asio;
namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using Handler = SaveHandle::ReadyCallback;

namespace detail {
struct SaveState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool skipped = false;
  std::uint64_t step = 0;
  // The error is kept by value and thrown afresh in each waiting thread: sharing one
  // exception object between threads through exception_ptr copies races in libstdc++'s
  // uninstrumented reference count (ThreadSanitizer reports it).
  std::optional<Error> error;
  SaveResult result;
  std::vector<Handler> waiters;

  // A copy with its own message buffer (std::runtime_error shares its message between copies
  // through the same uninstrumented reference count).
  static Error fresh(const Error& e) { return Error(e.code(), e.file(), e.detail(), e.expected(), e.actual(), e.sys_errno()); }

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
    h(e ? std::make_exception_ptr(fresh(*e)) : std::exception_ptr(), std::move(r));
  }
};
}  // namespace detail

bool SaveHandle::ready() const noexcept {
  if (!state_) return false;
  std::lock_guard lk(state_->mu);
  return state_->done;
}
bool SaveHandle::skipped() const noexcept {
  if (!state_) return false;
  std::lock_guard lk(state_->mu);
  return state_->skipped;
}
std::uint64_t SaveHandle::step() const noexcept { return state_ ? state_->step : 0; }

const SaveResult& SaveHandle::wait() const {
  if (!state_) throw_invalid("wait() on an empty SaveHandle");
  std::unique_lock lk(state_->mu);
  state_->cv.wait(lk, [&] { return state_->done; });
  if (state_->error) throw detail::SaveState::fresh(*state_->error);
  return state_->result;
}

void SaveHandle::on_ready(ReadyCallback h) const {
  const auto& s = state_;
  if (!h) throw_invalid("SaveHandle::on_ready: empty callback");
  if (!s) {
    detail::SaveState::run_callback(h, Error(Errc::invalid_argument, {}, "on_ready / async_wait on an empty SaveHandle"), {});
    return;
  }
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

std::string error_report(const Error& e) {
  return json::serialize(json::object{{"ok", false}, {"error", json::parse(error_to_json(e))}});
}

Error error_of(const json::object& o) { return error_from_json(json::serialize(o.at("error"))); }

std::int64_t ns_of(Clock::duration d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); }

}  // namespace

struct Checkpointer::Impl {
  // One rank's shard of the step in flight, from staging to its outcome.
  struct ShardJob {
    int rank = 0;
    std::uint64_t step = 0;
    std::uint64_t size = 0;    // file bytes
    std::uint64_t padded = 0;  // size rounded up to 4096 (what O_DIRECT writes)
    ShardHeader header;
    SaveInfo info;
    std::shared_ptr<detail::SaveState> handle;
    SaveResult result;  // rank-local timings, filled as the job goes
    Clock::time_point t_call, t_write0;
    std::unique_ptr<WritableFile> file;
    std::optional<FileDigest> digest;
    std::exception_ptr write_error, hash_error;
    int pending = 2;  // write and hash (on the io_context thread)
  };

  struct InFlight {
    std::uint64_t step = 0;
    std::string temp_dir;
    std::optional<Error> temp_error;
    std::vector<std::shared_ptr<detail::SaveState>> handles;  // per rank, null until it saves
    int staged = 0, reported = 0, delivered = 0;
    bool abandoned = false;  // shutdown gave up on the ranks that never saved
    std::vector<std::pair<std::optional<Error>, SaveResult>> outcomes;
  };

  CheckpointerOptions opt;
  FileSystem& fs;
  std::unique_ptr<CommitCoordinator> own_coordinator;
  CommitCoordinator* coordinator;
  // The ranks this process saves (the coordinator's local_ranks) and the run id the
  // processes of one run name their shared temporary directories with ("" in one process).
  std::vector<bool> local;
  int local_count = 0;
  std::string run_id;

  asio::io_context ctx;
  asio::executor_work_guard<asio::io_context::executor_type> guard{ctx.get_executor()};
  asio::thread_pool work_pool;
  asio::thread_pool io_pool;
  std::unique_ptr<detail::WriteBackend> backend;
  std::thread io_thread;

  std::vector<AlignedBuffer> staging;  // per rank, reused across saves
  // Per rank: what its staging buffer holds, from the end of staging until its next save
  // starts staging (under mu); committed once the checkpoint of that step is.
  struct StagedRecord {
    std::uint64_t step = 0;
    ShardHeader header;
    SaveInfo info;
    bool committed = false;
  };
  std::vector<std::optional<StagedRecord>> staged_records;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::optional<InFlight> in_flight;
  std::map<std::uint64_t, bool> skip_decisions;  // step -> skipped (BusyPolicy::skip)
  CheckpointerStats stats;
  // Declared last: destroyed first, after ~Impl has drained the local saves (whose commits
  // submit to it); its own destructor then drains the copies.
  std::unique_ptr<DurableReplicator> replicator;

  static int pool_size(const CheckpointerOptions& o) {
    if (o.hash_threads > 0) return o.hash_threads;
    return std::max(2, static_cast<int>(std::thread::hardware_concurrency()));
  }

  explicit Impl(CheckpointerOptions o)
      : opt(std::move(o)),
        fs(opt.fs ? *opt.fs : posix_file_system()),
        coordinator(opt.coordinator),
        work_pool(static_cast<std::size_t>(pool_size(opt))),
        io_pool(static_cast<std::size_t>(std::max(1, opt.queue_depth))) {
    if (opt.root.empty()) throw_invalid("CheckpointerOptions.root is empty");
    if (opt.world_size < 1) throw_invalid("CheckpointerOptions.world_size must be >= 1");
    if (opt.keep_last < 0) throw_invalid("CheckpointerOptions.keep_last must be >= 0");
    if (opt.queue_depth < 1) throw_invalid("CheckpointerOptions.queue_depth must be >= 1");
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
    choose_backend();
    // In several processes, one of them cleans the root up before any can start writing.
    run_id = coordinator->start_run([this] { prepare_root(fs, opt.root); });
    if (!run_id.empty()) fs.create_dirs(opt.root);
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
    if (opt.durable) replicator = std::make_unique<DurableReplicator>(fs, opt.root, *opt.durable);
    io_thread = std::thread([this] { ctx.run(); });
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
      log_line("io_uring unavailable (" + why + "); using the posix writer");
      choice = WriterBackend::posix;
    }
    backend = choice == WriterBackend::posix ? detail::make_posix_backend(ctx, io_pool) : detail::make_uring_backend(ctx, io_pool);
  }

  ~Impl() {
    std::vector<std::shared_ptr<detail::SaveState>> orphans;
    std::string outcome;
    std::uint64_t step = 0;
    {
      std::unique_lock lk(mu);
      // Every staged shard finishes (written, or failed); only then is anything abandoned.
      // When every local rank has saved, the outcome comes (from the coordinator), so wait for it.
      cv.wait(lk, [&] {
        return !in_flight || (in_flight->reported == in_flight->staged && in_flight->staged < local_count);
      });
      if (in_flight) {
        step = in_flight->step;
        std::string missing;
        for (int r = 0; r < opt.world_size; ++r)
          if (local[static_cast<std::size_t>(r)] && !in_flight->handles[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        const Error e(Errc::aborted, opt.root,
                      "checkpoint of step " + std::to_string(step) + " abandoned at shutdown: rank(s) " + missing + " never saved it");
        log_line(e.what());
        outcome = error_report(e);
        in_flight->abandoned = true;
        if (!in_flight->temp_dir.empty()) abort_checkpoint(fs, opt.root, in_flight->temp_dir);
      }
    }
    if (!outcome.empty()) coordinator->abandon(step, outcome);
    guard.reset();
    io_thread.join();
    work_pool.join();
    io_pool.join();
  }

  // ---- rank thread side ----------------------------------------------------------------

  SaveHandle save(int rank, std::uint64_t step, std::span<const TensorView> tensors, const SaveInfo& info) {
    const auto t_call = Clock::now();
    if (rank < 0 || rank >= opt.world_size)
      throw Error(Errc::invalid_argument, {}, "save rank", "0.." + std::to_string(opt.world_size - 1), std::to_string(rank));
    if (!local[static_cast<std::size_t>(rank)])
      throw Error(Errc::invalid_argument, {}, "save rank: not one of this process's ranks (the coordinator's local_ranks)",
                  "a local rank", std::to_string(rank));
    checkpoint_dir_name(step);  // validates the step
    auto job = std::make_shared<ShardJob>();
    job->rank = rank;
    job->step = step;
    job->t_call = t_call;
    job->info = info;
    job->header = plan_shard(tensors, {{"ckpt.rank", std::to_string(rank)},
                                       {"ckpt.world_size", std::to_string(opt.world_size)},
                                       {"ckpt.step", std::to_string(step)}});
    job->size = job->header.file_size();
    job->padded = (job->size + 4095) / 4096 * 4096;
    job->handle = std::make_shared<detail::SaveState>();
    job->handle->step = step;
    job->result.step = step;
    job->result.backend = std::string(backend->name());

    {
      std::unique_lock lk(mu);
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
      cv.wait(lk, [&] { return !in_flight || in_flight->step == step; });
      if (opt.when_busy == BusyPolicy::skip) skip_decisions[step] = false;
      if (!in_flight) {
        in_flight.emplace();
        in_flight->step = step;
        in_flight->handles.resize(static_cast<std::size_t>(opt.world_size));
        in_flight->outcomes.resize(static_cast<std::size_t>(opt.world_size));
      }
      auto& slot = in_flight->handles[static_cast<std::size_t>(rank)];
      if (slot) throw Error(Errc::invalid_argument, {}, "rank " + std::to_string(rank) + " saved step " + std::to_string(step) + " twice");
      slot = job->handle;
      ++in_flight->staged;
      staged_records[static_cast<std::size_t>(rank)].reset();  // the buffer is about to be overwritten
      job->result.stall = Clock::now() - t_call;
      stats.total_stall += job->result.stall;
    }

    const auto t_stage = Clock::now();
    try {
      stage(*job, tensors);
    } catch (...) {
      // This rank cannot contribute: fail the checkpoint for everyone rather than hang it.
      fail_shard(job, to_error(std::current_exception()));
      throw;
    }
    job->result.stage = Clock::now() - t_stage;
    {
      std::lock_guard lk(mu);
      staged_records[static_cast<std::size_t>(rank)] = StagedRecord{step, job->header, job->info, false};
    }
    asio::post(ctx, [this, job] { start_shard(job); });
    return SaveHandle(job->handle);
  }

  void stage(ShardJob& job, std::span<const TensorView> tensors) {
    AlignedBuffer& buf = staging[static_cast<std::size_t>(job.rank)];
    if (buf.capacity() < job.padded) {
      // Grows only when the state grows; pre-faulted so the copy below runs at memcpy speed.
      const std::uint64_t old = buf.capacity();
      buf = AlignedBuffer(static_cast<std::size_t>(job.padded), /*prefault=*/true);
      std::lock_guard lk(mu);
      ++stats.staging_allocations;
      stats.staging_bytes += buf.capacity() - old;
    }
    std::byte* out = buf.data();
    const std::string head = encode_shard_header(job.header);
    std::memcpy(out, head.data(), head.size());
    std::unordered_map<std::string_view, const TensorView*> by_name;
    for (const auto& t : tensors) by_name.emplace(t.name, &t);
    for (const auto& t : job.header.tensors) {
      const auto& src = by_name.at(t.name)->data;
      if (!src.empty()) std::memcpy(out + job.header.data_start + t.begin, src.data(), src.size());
    }
    std::memset(out + job.size, 0, static_cast<std::size_t>(job.padded - job.size));
  }

  // ---- writer side ---------------------------------------------------------------------

  void start_shard(const std::shared_ptr<ShardJob>& job) {
    std::string temp;
    try {
      {
        std::lock_guard lk(mu);
        if (in_flight->temp_error) throw *in_flight->temp_error;
        if (in_flight->temp_dir.empty()) {
          try {
            in_flight->temp_dir = run_id.empty() ? begin_checkpoint(fs, opt.root, job->step)
                                                 : begin_shared_checkpoint(fs, opt.root, job->step, run_id, local[0]);
          } catch (const Error& e) {
            in_flight->temp_error = e;
            throw;
          }
        }
        temp = in_flight->temp_dir;
      }
      const std::string path = join_path(temp, shard_file_name(job->rank, opt.world_size));
      job->file = fs.create(path, {.direct = opt.direct_io});
      job->file->allocate(job->size);
    } catch (...) {
      fail_shard(job, to_error(std::current_exception()));
      return;
    }
    const std::span<const std::byte> bytes = staging[static_cast<std::size_t>(job->rank)].span(
        static_cast<std::size_t>(job->file->is_direct() ? job->padded : job->size));
    job->t_write0 = Clock::now();
    asio::post(work_pool, [this, job, bytes] {
      const auto t0 = Clock::now();
      std::exception_ptr err;
      std::optional<FileDigest> d;
      try {
        FileHasher h(opt.chunk_size);
        const auto data = bytes.first(static_cast<std::size_t>(job->size));
        for (std::size_t off = 0; off < data.size(); off += opt.chunk_size)
          h.update(data.subspan(off, std::min<std::size_t>(opt.chunk_size, data.size() - off)));
        d = h.finish();
      } catch (...) {
        err = std::current_exception();
      }
      const auto took = Clock::now() - t0;
      asio::post(ctx, [this, job, err, d = std::move(d), took]() mutable {
        job->result.hash = took;
        job->hash_error = err;
        job->digest = std::move(d);
        part_done(job);
      });
    });
    backend->async_write_all(*job->file, bytes, static_cast<std::size_t>(opt.chunk_size), opt.queue_depth,
                             [this, job](std::exception_ptr err) {
                               job->result.write = Clock::now() - job->t_write0;
                               job->write_error = err;
                               part_done(job);
                             });
  }

  // On the io_context thread, once for the write and once for the hash.
  void part_done(const std::shared_ptr<ShardJob>& job) {
    if (--job->pending > 0) return;
    asio::post(work_pool, [this, job] {
      try {
        if (job->write_error) std::rethrow_exception(job->write_error);
        if (job->hash_error) std::rethrow_exception(job->hash_error);
        const auto t0 = Clock::now();
        if (job->file->is_direct() && job->padded != job->size) job->file->truncate(job->size);
        job->file->sync();
        job->file->close();
        job->result.fsync = Clock::now() - t0;
      } catch (...) {
        fail_shard(job, to_error(std::current_exception()));
        return;
      }
      ShardRecord rec;
      rec.rank = job->rank;
      rec.path = shard_file_name(job->rank, opt.world_size);
      rec.size = job->digest->size;
      rec.sha256 = job->digest->sha256;
      rec.xxh3 = job->digest->xxh3;
      rec.chunk_xxh3 = job->digest->chunk_xxh3;
      rec.param_shard_offset = job->info.param_shard_offset;
      rec.param_shard_numel = job->info.param_shard_numel;
      rec.metadata = job->info.metadata;
      json::array tensors;
      for (const auto& t : tensor_records(job->header, job->rank)) tensors.push_back(tensor_to_json(t));
      json::object r{{"ok", true},
                     {"shard", shard_to_json(rec)},
                     {"tensors", std::move(tensors)},
                     {"param_numel", job->info.param_numel},
                     {"wall_clock_seconds", job->info.wall_clock_seconds},
                     {"training", job->info.training}};
      report(job, json::serialize(r));
    });
  }

  void fail_shard(const std::shared_ptr<ShardJob>& job, const Error& e) {
    if (job->file) {
      try {
        job->file->close();
      } catch (...) {
      }
    }
    report(job, error_report(e));
  }

  void report(const std::shared_ptr<ShardJob>& job, std::string text) {
    std::string temp;
    {
      std::lock_guard lk(mu);
      ++in_flight->reported;
      temp = in_flight->temp_dir;
    }
    cv.notify_all();
    coordinator->report(
        job->step, job->rank, std::move(text),
        [this, step = job->step](const std::vector<std::string>& reports) { return commit(step, reports); },
        [this, job](const std::string& outcome) { deliver(job, outcome); });
  }

  // ---- the commit (one rank, the last reporter) ---------------------------------------

  std::string commit(std::uint64_t step, const std::vector<std::string>& reports) {
    const auto t0 = Clock::now();
    std::string temp;
    {
      std::lock_guard lk(mu);
      temp = in_flight->temp_dir;
    }
    try {
      std::vector<json::object> parsed;
      for (const auto& text : reports) parsed.push_back(json::parse(text).as_object());
      for (const auto& p : parsed)
        if (!p.at("ok").as_bool()) throw error_of(p);
      json::array shards, tensors;
      for (const auto& p : parsed) {
        shards.push_back(p.at("shard"));
        for (const auto& t : p.at("tensors").as_array()) tensors.push_back(t);
      }
      const json::object& r0 = parsed.front();
      json::object mj{{"schema_version", kSchemaVersion},
                      {"format", "ckpt"},
                      {"world_size", opt.world_size},
                      {"step", step},
                      {"wall_clock_seconds", r0.at("wall_clock_seconds")},
                      {"created_at", utc_now_rfc3339()},
                      {"chunk_size", opt.chunk_size},
                      {"param_numel", r0.at("param_numel")},
                      {"shards", std::move(shards)},
                      {"tensors", std::move(tensors)},
                      {"training", r0.at("training")}};
      const std::string mpath = join_path(temp, kManifestName);
      const Manifest m = decode_manifest(json::serialize(mj), mpath);
      const std::string dir = commit_checkpoint(fs, opt.root, temp, m);
      // Handed over before rotation, so that an older step whose copy it supersedes is no
      // longer pinned and rotates away now.
      if (replicator) replicator->submit(step);
      const auto rotated = rotate(checkpoint_dir_name(step));
      json::array rot;
      for (const auto& n : rotated) rot.emplace_back(n);
      return json::serialize(json::object{{"ok", true}, {"dir", dir}, {"commit_ns", ns_of(Clock::now() - t0)}, {"rotated", rot}});
    } catch (...) {
      if (!temp.empty()) abort_checkpoint(fs, opt.root, temp);
      return error_report(to_error(std::current_exception()));
    }
  }

  // Keeps the newest keep_last checkpoints (io/commit.hpp), and those the durable tier still
  // has to copy. Runs only after `latest` is durable; a failure is logged, not thrown: the new
  // checkpoint is committed.
  std::vector<std::string> rotate(const std::string& committed) {
    try {
      if (!replicator) return rotate_checkpoints(fs, opt.root, opt.keep_last, committed);
      return rotate_checkpoints(fs, opt.root, opt.keep_last, committed, [this](const std::string& name) { return replicator->pinned(name); });
    } catch (const Error& e) {
      log_line(std::string("rotation failed (the new checkpoint is committed): ") + e.what());
      return {};
    }
  }

  // ---- outcome, on every rank --------------------------------------------------------

  void deliver(const std::shared_ptr<ShardJob>& job, const std::string& outcome_text) {
    std::optional<Error> err;
    SaveResult res = job->result;
    res.bytes = job->size;
    try {
      const json::object o = json::parse(outcome_text).as_object();
      if (!o.at("ok").as_bool()) throw error_of(o);
      res.dir = std::string(o.at("dir").as_string());
      res.commit = std::chrono::nanoseconds(o.at("commit_ns").to_number<std::int64_t>());
      for (const auto& n : o.at("rotated").as_array()) res.rotated.emplace_back(n.as_string());
    } catch (...) {
      err = to_error(std::current_exception());
    }
    res.total = Clock::now() - job->t_call;
    std::vector<std::pair<std::shared_ptr<detail::SaveState>, std::pair<std::optional<Error>, SaveResult>>> complete;
    {
      std::lock_guard lk(mu);
      if (!in_flight || in_flight->step != job->step) return;
      in_flight->outcomes[static_cast<std::size_t>(job->rank)] = {err, res};
      // Every rank gets the same outcome; the handles complete together, after the barrier
      // is released, so a ready() handle means the next save will not stall on this one.
      if (++in_flight->delivered < (in_flight->abandoned ? in_flight->staged : local_count)) return;
      if (err) ++stats.failures;
      else ++stats.commits;
      if (!err)
        for (auto& rec : staged_records)
          if (rec && rec->step == job->step) rec->committed = true;
      for (int r = 0; r < opt.world_size; ++r)
        if (auto& h = in_flight->handles[static_cast<std::size_t>(r)]) complete.push_back({h, in_flight->outcomes[static_cast<std::size_t>(r)]});
      in_flight.reset();
    }
    cv.notify_all();
    for (auto& [h, o] : complete) h->complete(o.first, std::move(o.second));
  }

};

Checkpointer::Checkpointer(CheckpointerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Checkpointer::~Checkpointer() = default;

SaveHandle Checkpointer::save(int rank, std::uint64_t step, std::span<const TensorView> tensors, const SaveInfo& info) {
  return impl_->save(rank, step, tensors, info);
}

SaveResult Checkpointer::save_sync(int rank, std::uint64_t step, std::span<const TensorView> tensors, const SaveInfo& info) {
  return save(rank, step, tensors, info).wait();
}

void Checkpointer::wait_all() {
  std::unique_lock lk(impl_->mu);
  impl_->cv.wait(lk, [&] { return !impl_->in_flight; });
}

std::optional<StagedSnapshot> Checkpointer::staged(int rank) const {
  if (rank < 0 || rank >= impl_->opt.world_size)
    throw Error(Errc::invalid_argument, {}, "staged rank", "0.." + std::to_string(impl_->opt.world_size - 1), std::to_string(rank));
  std::lock_guard lk(impl_->mu);
  const auto& rec = impl_->staged_records[static_cast<std::size_t>(rank)];
  if (!rec || !rec->committed) return std::nullopt;
  const std::byte* data = impl_->staging[static_cast<std::size_t>(rank)].data() + rec->header.data_start;
  StagedSnapshot snap{rec->step, {}, rec->info};
  for (const auto& t : rec->header.tensors)
    snap.tensors.push_back({t.name, t.dtype, t.shape, std::span(data + t.begin, static_cast<std::size_t>(t.end - t.begin))});
  return snap;
}

void Checkpointer::wait_durable() {
  if (impl_->replicator) impl_->replicator->wait_idle();
}

std::string_view Checkpointer::backend_name() const noexcept { return impl_->backend->name(); }
const CheckpointerOptions& Checkpointer::options() const noexcept { return impl_->opt; }
CheckpointerStats Checkpointer::stats() const {
  CheckpointerStats out;
  {
    std::lock_guard lk(impl_->mu);
    out = impl_->stats;
  }
  if (impl_->replicator) out.durable = impl_->replicator->stats();
  return out;
}

SaveCadence SaveCadence::every_steps(std::uint64_t n) {
  if (n == 0) throw_invalid("SaveCadence::every_steps: n must be > 0");
  SaveCadence c;
  c.every_steps_ = n;
  return c;
}

SaveCadence SaveCadence::every_seconds(double seconds) {
  if (!(seconds > 0)) throw_invalid("SaveCadence::every_seconds: seconds must be > 0");
  SaveCadence c;
  c.every_ = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(seconds));
  c.last_ = std::chrono::steady_clock::now();
  return c;
}

bool SaveCadence::due(std::uint64_t step, std::chrono::steady_clock::time_point now) {
  if (every_steps_) return step != 0 && step % every_steps_ == 0;
  if (now - last_ < every_) return false;
  last_ = now;
  return true;
}

}  // namespace ckpt
