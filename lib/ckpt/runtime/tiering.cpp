// The replicator's thread: takes the pending step, copies it (store/tiers.hpp), rotates the
// durable root, and on failure schedules a retry unless a newer step is waiting. All state
// is under one mutex; errors are kept as values (code and message), never as shared
// exception objects.
#include "ckpt/runtime/tiering.hpp"

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "ckpt/core/log.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/store/run_identity.hpp"
#include "ckpt/objstore/s3.hpp"
#include "ckpt/store/tiers.hpp"

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
  // The s3:// root's writer lease, once claimed (by claim(), or by the first copy on the
  // replicator's thread); destroyed (released) before the store.
  std::unique_ptr<ObjectLease> lease;
  std::mutex lease_mu;  // claim() against the thread's first copy

  mutable std::mutex mu;
  std::condition_variable cv;  // the thread waits for work; wait_idle() for the end of it
  std::optional<Job> pending;
  std::optional<std::uint64_t> running;
  std::uint64_t generation = 0;  // bumped by submit(): ends a retry's backoff early
  bool stopping = false;
  bool gave_up = false;  // a drain gave up: nothing more is copied
  int running_attempt = 0;
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
    if (opt.drain_deadline.count() < 0) throw_invalid("DurableTierOptions.drain_deadline must be >= 0");
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

  // close(): a drain within drain_deadline (no retries: stopping), the thread joined, the
  // lease released (the store answers, unless the drain gave up on it).
  void stop() {
    std::call_once(stopped, [this] {
      {
        std::lock_guard lk(mu);
        stopping = true;
      }
      cv.notify_all();
      drain({});
      thread.join();
      lease.reset();
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
      if (gave_up) {
        ++stats.given_up;
        return;
      }
      if (pending) ++stats.superseded;
      pending = Job{step, 1, {}};
      ++generation;
    }
    cv.notify_all();
  }

  DurableDrainStatus status_locked(Clock::time_point t0, std::chrono::milliseconds deadline) const {
    DurableDrainStatus st;
    st.waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    st.deadline = deadline;
    st.running = running;
    if (pending) st.pending = pending->step;
    st.attempt = running ? running_attempt : pending ? pending->attempt : 0;
    st.max_attempts = opt.max_attempts;
    st.last_error = stats.last_error;
    return st;
  }

  DurableDrain drain(const DurableDrainOptions& d) {
    using std::chrono::milliseconds;
    const milliseconds deadline = d.deadline.value_or(opt.drain_deadline);
    const auto t0 = Clock::now(), until = t0 + deadline;
    auto next_progress = t0 + d.first_progress;
    DurableDrain out;
    std::unique_lock lk(mu);
    auto idle = [&] { return !pending && !running; };
    while (!idle() && !gave_up) {
      std::string why;
      if (d.stop) {
        lk.unlock();
        why = d.stop();
        lk.lock();
        if (idle()) break;
      }
      const auto now = Clock::now();
      if (why.empty() && now >= until) why = "the deadline";
      if (!why.empty()) {
        give_up(lk, why, t0, out);
        break;
      }
      if (d.progress && now >= next_progress) {
        const DurableDrainStatus st = status_locked(t0, deadline);
        lk.unlock();
        d.progress(st);
        lk.lock();
        next_progress = now + d.progress_every;
        continue;
      }
      auto wake = std::min(until, now + milliseconds(100));
      if (d.progress) wake = std::min(wake, next_progress);
      cv.wait_until(lk, wake, [&] { return idle(); });
    }
    if (out.complete) out.waited = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
    return out;
  }

  // Under the lock: the drain gives up. Drops the pending step, aborts the store's calls (the
  // copy running then fails at once, without a retry), and waits for it to end (at most 5 s:
  // a directory root's copy stuck in a system call cannot be stopped).
  void give_up(std::unique_lock<std::mutex>& lk, const std::string& why, Clock::time_point t0, DurableDrain& out) {
    gave_up = true;
    stats.gave_up = true;
    out.complete = false;
    out.gave_up_on = why;
    out.last_error = stats.last_error;
    if (running) out.step = running;
    if (pending) {
      out.step = std::max(out.step.value_or(0), pending->step);
      ++stats.given_up;
      pending.reset();
    }
    // The wait ends here, when it gives up; the few seconds the copy may still take to stop
    // (below) are not part of it.
    out.waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    const double waited = std::chrono::duration<double>(out.waited).count();
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.0f", waited);
    log_line("durable tier: gave up after " + std::string(secs) + " s (" + why + "): step " +
             (out.step ? std::to_string(*out.step) : std::string("?")) + " is not committed to " + opt.root +
             (stats.last_error.empty() ? std::string() : "; the last error: " + stats.last_error));
    if (store) store->abort_calls();
    cv.notify_all();
    cv.wait_for(lk, std::chrono::seconds(5), [&] { return !running; });
  }

  // The run identity a copy claims the prefix with when claim() was not called.
  std::string default_run() const {
    if (!opt.run.empty()) return opt.run;
    try {
      if (auto run = read_run_identity(src_fs, src_root)) return *run;
    } catch (const Error& e) {
      log_line("durable tier: " + std::string(e.what()) + "; this replicator uses a run identity of its own");
    }
    return random_id();
  }

  void claim(const std::string& run) {
    if (!store) return;
    std::lock_guard lk(lease_mu);
    claim_locked(run);
  }

  // The lease the thread's copies commit under: claimed now if claim() was not called.
  ObjectLease& held_lease() {
    std::lock_guard lk(lease_mu);
    if (!lease) claim_locked(default_run());
    return *lease;
  }

  // Under lease_mu.
  void claim_locked(const std::string& run) {
    if (lease) return;
    auto taken = std::make_unique<ObjectLease>(*store, run, opt.lease);
    // The store's newest checkpoint must be this run's (or predate run identities).
    std::string theirs;
    std::uint64_t step = 0;
    if (const auto latest = read_object_latest(*store)) {
      step = latest->step;
      theirs = latest->run.empty() ? read_object_manifest(*store, step).run : latest->run;
    } else if (const auto steps = list_object_checkpoints(*store); !steps.empty()) {
      step = steps.back();
      theirs = read_object_manifest(*store, step).run;
    }
    if (!theirs.empty() && theirs != run)
      throw Error(Errc::conflict, store->name_of(checkpoint_dir_name(step) + "/" + std::string(kObjectManifestName)),
                  "the newest checkpoint on " + opt.root + ", " + checkpoint_dir_name(step) + ", was committed by run " + theirs +
                      ", not by this run " + run + ": another job's checkpoints (resume that run with adopt_run (ckpt-demo --adopt-run) into a new local root, or use another prefix)",
                  "run " + run, "run " + theirs);
    lease = std::move(taken);
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
      running_attempt = job.attempt;
      lk.unlock();
      const auto outcome = copy(job.step);
      lk.lock();
      running.reset();
      if (outcome.lease_lost) stats.lease_lost = true;
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
    bool lease_lost = false;
  };

  // Outside the lock: the copy and the durable rotation.
  Outcome copy(std::uint64_t step) {
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

  // The same for an object store: the commit (data, tier manifest, latest) and its rotation,
  // each write that commits or removes behind the writer lease's check.
  Outcome copy_to_object_store(std::uint64_t step) {
    Outcome out;
    ObjectLease* held = nullptr;
    try {
      held = &held_lease();
      ObjectCommitOptions commit;
      commit.verify_chunks = opt.verify != Verify::none;
      commit.run = held->run();
      commit.holder = held->holder();
      commit.fence = [held] { held->check(); };
      out.bytes = commit_to_object_store(src_fs, src_root, step, *store, commit).bytes;
    } catch (...) {
      out.error = to_error(std::current_exception());
      out.lease_lost = held && held->lost();
      return out;
    }
    if (opt.keep_last > 0) {
      try {
        held->check();
        out.rotated = rotate_object_checkpoints(*store, opt.keep_last).size();
      } catch (const Error& e) {
        log_line("durable tier: rotation failed (step " + std::to_string(step) + " is committed there): " + e.what());
      }
    }
    if (opt.leftover_grace.count() > 0) out.leftovers = collect_leftovers(step, *held);
    return out;
  }

  // After a commit to the object store: what failed or killed commits left there, older than
  // the grace period. Logged; a failure too, never thrown. Returns objects removed plus
  // uploads aborted.
  std::uint64_t collect_leftovers(std::uint64_t step, const ObjectLease& held) const {
    try {
      held.check();
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
    if (gave_up) {
      ++stats.given_up;
      log_line(head + "; given up with the drain: " + e.what());
    } else if (pending) {
      ++stats.superseded;
      if (job.attempt == 1) log_line(head + "; a newer step is copied instead: " + e.what());
    } else if (job.attempt < opt.max_attempts && !stopping && !stats.lease_lost) {
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

DurableDrain DurableReplicator::drain(const DurableDrainOptions& options) { return impl_->drain(options); }

void DurableReplicator::claim(const std::string& run) { impl_->claim(run); }

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
