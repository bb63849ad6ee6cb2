// The replicator's thread: takes the pending step, copies it (io/tiers.hpp), rotates the
// durable root, and on failure schedules a retry unless a newer step is waiting. All state
// is under one mutex; errors are kept as values (code and message), never as shared
// exception objects.
#include "ckpt/runtime/tiering.hpp"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "ckpt/core/log.hpp"
#include "ckpt/io/commit.hpp"
#include "ckpt/io/layout.hpp"
#include "ckpt/io/object_commit.hpp"
#include "ckpt/io/s3.hpp"
#include "ckpt/io/tiers.hpp"

namespace ckpt {

using Clock = std::chrono::steady_clock;

struct DurableReplicator::Impl {
  struct Job {
    std::uint64_t step = 0;
    int attempt = 1;
    Clock::time_point not_before{};
  };

  FileSystem& src_fs;
  const std::string src_root;
  const DurableTierOptions opt;
  FileSystem& dst_fs;
  // An s3:// durable root's store: options.object_store, or the one opened at construction
  // (used by the replicator's thread only, which alone calls copy()).
  std::unique_ptr<ObjectStore> owned_store;
  ObjectStore* store = nullptr;

  mutable std::mutex mu;
  std::condition_variable cv;  // the thread waits for work; wait_idle() for the end of it
  std::optional<Job> pending;
  std::optional<std::uint64_t> running;
  std::uint64_t generation = 0;  // bumped by submit(): ends a retry's backoff early
  bool stopping = false;
  DurableStats stats;
  std::thread thread;
  std::once_flag stopped;

  Impl(FileSystem& fs, std::string root, DurableTierOptions o)
      : src_fs(fs), src_root(std::move(root)), opt(std::move(o)), dst_fs(opt.fs ? *opt.fs : posix_file_system()) {
    if (opt.root.empty()) throw_invalid("DurableTierOptions.root is empty");
    if (opt.root == src_root) throw Error(Errc::invalid_argument, opt.root, "the durable root is the local root", "another directory", opt.root);
    if (opt.keep_last < 0) throw_invalid("DurableTierOptions.keep_last must be >= 0");
    if (opt.max_attempts < 1) throw_invalid("DurableTierOptions.max_attempts must be >= 1");
    if (opt.leftover_grace.count() < 0) throw_invalid("DurableTierOptions.leftover_grace must be >= 0");
    if (is_s3_root(opt.root)) {
      // Opening checks the configuration (root, endpoint, keys) without a request: a tier
      // that could never copy is refused here, before training, not after hours of it.
      if (opt.object_store) store = opt.object_store;
      else {
        S3Options s3;
        s3.root = opt.root;
        owned_store = open_s3(s3);
        store = owned_store.get();
      }
    }
    thread = std::thread([this] { run(); });
  }

  ~Impl() { stop(); }

  void stop() {
    std::call_once(stopped, [this] {
      {
        std::lock_guard lk(mu);
        stopping = true;
      }
      cv.notify_all();
      thread.join();
    });
  }

  void submit(std::uint64_t step) {
    {
      std::lock_guard lk(mu);
      if (stopping) {
        log_line("durable tier: step " + std::to_string(step) + " submitted after close: not copied to " + opt.root);
        return;
      }
      ++stats.submitted;
      if (pending) ++stats.superseded;
      pending = Job{step, 1, {}};
      ++generation;
    }
    cv.notify_all();
  }

  void run() {
    std::unique_lock lk(mu);
    for (;;) {
      if (!pending) {
        if (stopping) return;
        cv.wait(lk, [&] { return pending || stopping; });
        continue;
      }
      if (!stopping && pending->not_before > Clock::now()) {
        const auto gen = generation;
        const auto until = pending->not_before;
        cv.wait_until(lk, until, [&] { return stopping || generation != gen; });
        continue;
      }
      const Job job = *pending;
      pending.reset();
      running = job.step;
      lk.unlock();
      const auto outcome = copy(job.step);
      lk.lock();
      running.reset();
      if (outcome.error) failed(job, *outcome.error);
      else {
        ++stats.copies;
        stats.bytes += outcome.bytes;
        stats.rotated += outcome.rotated;
        stats.leftovers_collected += outcome.leftovers;
        if (!stats.last_step || *stats.last_step < job.step) stats.last_step = job.step;
      }
      lk.unlock();
      cv.notify_all();
      lk.lock();
    }
  }

  struct Outcome {
    std::optional<Error> error;
    std::uint64_t bytes = 0, rotated = 0, leftovers = 0;
  };

  // Outside the lock: the copy and the durable rotation.
  Outcome copy(std::uint64_t step) const {
    if (is_s3_root(opt.root)) return copy_to_object_store(step);
    Outcome out;
    try {
      out.bytes = copy_checkpoint(src_fs, src_root, step, dst_fs, opt.root, opt.verify,
                                  {.allow_older_than_latest = opt.allow_older_than_latest})
                      .bytes;
    } catch (...) {
      out.error = to_error(std::current_exception());
      return out;
    }
    try {
      const RootLock lock(dst_fs, opt.root);
      out.rotated = rotate_checkpoints(dst_fs, opt.root, opt.keep_last, checkpoint_dir_name(step)).size();
    } catch (const Error& e) {
      log_line("durable tier: rotation failed (step " + std::to_string(step) + " is committed there): " + e.what());
    }
    return out;
  }

  // The same for an object store: the commit (data, tier manifest, latest) and its rotation.
  Outcome copy_to_object_store(std::uint64_t step) const {
    Outcome out;
    try {
      ObjectCommitOptions commit;
      commit.verify_chunks = opt.verify != Verify::none;
      out.bytes = commit_to_object_store(src_fs, src_root, step, *store, commit).bytes;
    } catch (...) {
      out.error = to_error(std::current_exception());
      return out;
    }
    if (opt.keep_last > 0) {
      try {
        out.rotated = rotate_object_checkpoints(*store, opt.keep_last).size();
      } catch (const Error& e) {
        log_line("durable tier: rotation failed (step " + std::to_string(step) + " is committed there): " + e.what());
      }
    }
    if (opt.leftover_grace.count() > 0) out.leftovers = collect_leftovers(step);
    return out;
  }

  // After a commit to the object store: what failed or killed commits left there, older than
  // the grace period. Logged; a failure too, never thrown. Returns objects removed plus
  // uploads aborted.
  std::uint64_t collect_leftovers(std::uint64_t step) const {
    try {
      const LeftoverReport r = collect_object_leftovers(*store, opt.leftover_grace);
      const std::size_t n = r.removed.size() + r.aborted.size();
      if (n > 0) {
        std::string keys;
        std::size_t shown = 0;
        for (const auto* list : {&r.removed, &r.aborted})
          for (const auto& k : *list)
            if (shown++ < 10) keys += (keys.empty() ? "" : ", ") + k;
        if (n > 10) keys += " and " + std::to_string(n - 10) + " more";
        log_line("durable tier: collected " + std::to_string(r.removed.size()) + " leftover object(s) and aborted " +
                 std::to_string(r.aborted.size()) + " multipart upload(s) older than " + std::to_string(opt.leftover_grace.count()) +
                 " s under " + opt.root + ": " + keys);
      }
      return n;
    } catch (const Error& e) {
      log_line("durable tier: leftover collection failed (step " + std::to_string(step) + " is committed there): " + e.what());
      return 0;
    }
  }

  // Under the lock: count, log, and decide between retry, superseded and given up.
  void failed(const Job& job, const Error& e) {
    ++stats.failures;
    stats.last_failed_step = job.step;
    stats.last_error_code = e.code();
    stats.last_error = e.what();
    const std::string head = "durable tier: copy of step " + std::to_string(job.step) + " to " + opt.root + " failed (attempt " +
                             std::to_string(job.attempt) + " of " + std::to_string(opt.max_attempts) + ", " +
                             std::string(errc_name(e.code())) + ")";
    if (pending) {
      ++stats.superseded;
      if (job.attempt == 1) log_line(head + "; a newer step is copied instead: " + e.what());
    } else if (job.attempt < opt.max_attempts && !stopping) {
      pending = Job{job.step, job.attempt + 1, Clock::now() + opt.retry_backoff * (1 << std::min(job.attempt - 1, 16))};
      if (job.attempt == 1) log_line(head + "; retrying: " + e.what());
    } else {
      ++stats.given_up;
      log_line(head + "; given up, the next commit is copied: " + e.what());
    }
  }
};

DurableReplicator::DurableReplicator(FileSystem& source_fs, std::string source_root, DurableTierOptions options)
    : impl_(std::make_unique<Impl>(source_fs, std::move(source_root), std::move(options))) {}
DurableReplicator::~DurableReplicator() = default;

void DurableReplicator::submit(std::uint64_t step) { impl_->submit(step); }

bool DurableReplicator::pinned(std::string_view dir_name) const {
  const auto step = parse_checkpoint_dir_name(dir_name);
  if (!step) return false;
  std::lock_guard lk(impl_->mu);
  return (impl_->pending && impl_->pending->step == *step) || impl_->running == step;
}

void DurableReplicator::wait_idle() {
  std::unique_lock lk(impl_->mu);
  impl_->cv.wait(lk, [&] { return !impl_->pending && !impl_->running; });
}

bool DurableReplicator::wait_idle_for(std::chrono::nanoseconds timeout) {
  std::unique_lock lk(impl_->mu);
  return impl_->cv.wait_for(lk, timeout, [&] { return !impl_->pending && !impl_->running; });
}

void DurableReplicator::close() { impl_->stop(); }

DurableStats DurableReplicator::stats() const {
  std::lock_guard lk(impl_->mu);
  return impl_->stats;
}

const DurableTierOptions& DurableReplicator::options() const noexcept { return impl_->opt; }

}  // namespace ckpt
