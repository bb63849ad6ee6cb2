// SPDX-License-Identifier: Apache-2.0
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
#include "ckpt/store/copy.hpp"
#include "ckpt/store/store.hpp"
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
  // The durable store, opened at construction (open_store decides its kind); copies and
  // rotations run on the replicator's thread only.
  std::unique_ptr<CheckpointStore> dst;
  // A store whose writer is held for the run (WriterTenure::per_run: an object store's
  // lease), once claimed (by claim(), or by the first copy on the replicator's thread);
  // destroyed (released) before the store. Other stores' writers are taken per copy.
  std::unique_ptr<StoreWriter> held;
  std::mutex held_mu;  // claim() against the thread's first copy

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

  Impl(FileSystem& fs, std::string root, DurableTierOptions o) : src_fs(fs), src_root(std::move(root)), opt(std::move(o)) {
    if (opt.root.empty()) throw_invalid("DurableTierOptions.root is empty");
    if (opt.root == src_root) throw Error(Errc::invalid_argument, opt.root, "the durable root is the local root", "another directory", opt.root);
    if (opt.keep_last < 0) throw_invalid("DurableTierOptions.keep_last must be >= 0");
    if (opt.max_attempts < 1) throw_invalid("DurableTierOptions.max_attempts must be >= 1");
    if (opt.leftover_grace.count() < 0) throw_invalid("DurableTierOptions.leftover_grace must be >= 0");
    if (opt.drain_deadline.count() < 0) throw_invalid("DurableTierOptions.drain_deadline must be >= 0");
    // Opening checks the configuration (an object store's root, endpoint, keys) without a
    // request: a tier that could never copy is refused here, before training, not after hours of it.
    dst = open_store(opt.root, {.fs = opt.fs, .object_store = opt.object_store, .lease = opt.lease});
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
      held.reset();
    });
  }

  void submit(std::uint64_t step) {
    {
      std::lock_guard lk(mu);
      if (stopping) {
        log_event(LogLevel::warn, "tier_copy_dropped", "durable tier: step " + std::to_string(step) + " submitted after close: not copied to " + opt.root, {.step = step});
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
    log_event(LogLevel::error, "tier_gave_up", "durable tier: gave up after " + std::string(secs) + " s (" + why + "): step " +
             (out.step ? std::to_string(*out.step) : std::string("?")) + " is not committed to " + opt.root +
             (stats.last_error.empty() ? std::string() : "; the last error: " + stats.last_error), {.step = out.step});
    dst->abort_calls();
    cv.notify_all();
    cv.wait_for(lk, std::chrono::seconds(5), [&] { return !running; });
  }

  // The run identity a copy claims the prefix with when claim() was not called.
  std::string default_run() const {
    if (!opt.run.empty()) return opt.run;
    try {
      if (auto run = read_run_identity(src_fs, src_root)) return *run;
    } catch (const Error& e) {
      log_event(LogLevel::warn, "tier_run_identity", "durable tier: " + std::string(e.what()) + "; this replicator uses a run identity of its own");
    }
    return random_id();
  }

  bool holds_writer() const noexcept { return dst->writer_tenure() == WriterTenure::per_run; }

  void claim(const std::string& run) {
    if (!holds_writer()) return;
    std::lock_guard lk(held_mu);
    claim_locked(run);
  }

  // The writer the thread's copies commit under: claimed now if claim() was not called.
  StoreWriter& held_writer() {
    std::lock_guard lk(held_mu);
    if (!held) claim_locked(default_run());
    return *held;
  }

  // Under held_mu.
  void claim_locked(const std::string& run) {
    if (held) return;
    auto taken = dst->writer({.run = run});
    // The store's newest checkpoint must be this run's (or record no run).
    std::optional<std::uint64_t> newest = dst->latest();
    if (!newest)
      if (const auto steps = dst->steps(); !steps.empty()) newest = steps.back();
    if (newest)
      if (const std::string theirs = dst->run_of(*newest); !theirs.empty() && theirs != run)
        throw Error(Errc::conflict, dst->name_of(*newest) + "/" + std::string(kManifestName),
                    "the newest checkpoint on " + opt.root + ", " + checkpoint_dir_name(*newest) + ", was committed by run " + theirs +
                        ", not by this run " + run + ": another job's checkpoints (resume that run with adopt_run (ckpt-demo --adopt-run) into a new local root, or use another prefix)",
                    "run " + run, "run " + theirs);
    held = std::move(taken);
  }

  // The newest step the durable tier holds, as DurableReplicator::durable_latest says.
  std::optional<std::uint64_t> durable_latest() {
    {
      std::lock_guard lk(mu);
      if (stats.last_step || holds_writer()) return stats.last_step;
    }
    try {
      return dst->latest();
    } catch (const Error&) {
      return std::nullopt;
    }
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

  // Outside the lock: the copy, the durable rotation and (a store that keeps leftovers) the
  // collection, each write behind the writer's right (a lock taken for this copy, or the
  // writer held for the run, whose lease is checked before each write that commits).
  Outcome copy(std::uint64_t step) {
    Outcome out;
    std::unique_ptr<StoreWriter> taken;
    StoreWriter* writer = nullptr;
    try {
      const auto source = open_store(src_root, {.fs = &src_fs});
      if (holds_writer()) writer = &held_writer();
      else {
        (void)source->manifest(step);  // a source that does not open never touches the durable root
        taken = dst->writer();
        writer = taken.get();
      }
      out.bytes = copy_checkpoint(*source, step, *writer, {.verify = opt.verify, .begin = {.allow_older_than_latest = opt.allow_older_than_latest}})
                      .bytes;
    } catch (...) {
      out.error = to_error(std::current_exception());
      out.lease_lost = writer && writer->lost();
      return out;
    }
    try {
      out.rotated = writer->rotate(opt.keep_last, step).size();
    } catch (const Error& e) {
      log_event(LogLevel::warn, "tier_rotation_failed", "durable tier: rotation failed (step " + std::to_string(step) + " is committed there): " + e.what(), {.step = step});
    }
    if (opt.leftover_grace.count() > 0) out.leftovers = collect_leftovers(step, *writer);
    return out;
  }

  // After a commit to the object store: what failed or killed commits left there, older than
  // the grace period. Logged; a failure too, never thrown. Returns objects removed plus
  // uploads aborted.
  std::uint64_t collect_leftovers(std::uint64_t step, StoreWriter& writer) const {
    try {
      const auto report = writer.collect_leftovers(opt.leftover_grace);
      if (!report) return 0;  // its next writer removes what a failed copy left
      const LeftoverReport& r = *report;
      const std::size_t n = r.removed.size() + r.aborted.size();
      if (n > 0) {
        std::string keys;
        std::size_t shown = 0;
        for (const auto* list : {&r.removed, &r.aborted})
          for (const auto& k : *list)
            if (shown++ < 10) keys += (keys.empty() ? "" : ", ") + k;
        if (n > 10) keys += " and " + std::to_string(n - 10) + " more";
        log_event(LogLevel::info, "tier_leftovers_collected", "durable tier: collected " + std::to_string(r.removed.size()) + " leftover object(s) and aborted " +
                 std::to_string(r.aborted.size()) + " multipart upload(s) older than " + std::to_string(opt.leftover_grace.count()) +
                 " s under " + opt.root + ": " + keys, {.step = step});
      }
      return n;
    } catch (const Error& e) {
      log_event(LogLevel::warn, "tier_leftover_collection_failed", "durable tier: leftover collection failed (step " + std::to_string(step) + " is committed there): " + e.what(), {.step = step});
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
      log_event(LogLevel::error, "tier_copy_given_up", head + "; given up with the drain: " + e.what(), {.step = job.step});
    } else if (pending) {
      ++stats.superseded;
      if (job.attempt == 1) log_event(LogLevel::warn, "tier_copy_superseded", head + "; a newer step is copied instead: " + e.what(), {.step = job.step});
    } else if (job.attempt < opt.max_attempts && !stopping && !stats.lease_lost) {
      pending = Job{job.step, job.attempt + 1, Clock::now() + opt.retry_backoff * (1 << std::min(job.attempt - 1, 16))};
      if (job.attempt == 1) log_event(LogLevel::warn, "tier_copy_retrying", head + "; retrying: " + e.what(), {.step = job.step});
    } else {
      ++stats.given_up;
      log_event(LogLevel::error, "tier_copy_given_up", head + "; given up, the next commit is copied: " + e.what(), {.step = job.step});
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

bool DurableReplicator::holds_writer() const noexcept { return impl_->holds_writer(); }

std::optional<std::uint64_t> DurableReplicator::durable_latest() { return impl_->durable_latest(); }

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
