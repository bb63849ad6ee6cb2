// SPDX-License-Identifier: Apache-2.0
#include "ckpt/train/loop.hpp"

#include <algorithm>
#include <cstdio>
#include <future>
#include <memory>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "ckpt/store/store.hpp"

namespace ckpt::train {

using Clock = std::chrono::steady_clock;

bool save_due(SaveCadence& cadence, dist::Communicator& comm, std::uint64_t step, Clock::time_point now) {
  std::uint8_t due = comm.rank() == 0 && cadence.due(step, now);
  comm.broadcast(std::span<std::uint8_t>(&due, 1), 0);
  return due != 0;
}

namespace {

// The step the checkpointer's root's `latest` names (a node set's: the newest any node names).
std::optional<std::uint64_t> latest_step(const Checkpointer& checkpointer) {
  try {
    return open_store(checkpointer.options().root, {.fs = &checkpointer.file_system()})->latest();
  } catch (const Error&) {
    // An unreadable `latest` names nothing.
  }
  return std::nullopt;
}

}  // namespace

PreemptionSave save_on_preemption(Checkpointer& checkpointer, Trainer& trainer, dist::Communicator& comm, SaveHandle in_flight,
                                  const Preemption& preemption, const PreemptionDecision& decision, double grace_seconds) {
  PreemptionSave out;
  out.step = trainer.step_count();
  out.grace_seconds = grace_seconds;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_seconds));
  out.reused = in_flight.valid() && !in_flight.skipped() && in_flight.step() == out.step;
  SaveHandle h = out.reused ? in_flight : start_save(checkpointer, trainer);
  auto ready = std::make_shared<std::promise<void>>();
  std::future<void> done = ready->get_future();
  h.on_ready([ready](std::exception_ptr, const SaveResult&) { ready->set_value(); });
  // Handles of one step complete together, so a save done on one rank is decided for all.
  std::int32_t finished = done.wait_until(deadline) == std::future_status::ready;
  comm.all_reduce(std::span<std::int32_t>(&finished, 1), dist::ReduceOp::sum);
  if (finished == 0) {
    // Out of time on every rank: cancel it (every process, so every rank's shard stops),
    // and give the writes in flight a moment to return so its temporary is removed.
    char budget[32];
    std::snprintf(budget, sizeof budget, "%g", grace_seconds);
    checkpointer.cancel(std::string("the ") + budget + " s grace budget of the preemption ran out");
    std::int32_t stopped = done.wait_for(std::chrono::duration<double>(kCancelWaitSeconds)) == std::future_status::ready;
    comm.all_reduce(std::span<std::int32_t>(&stopped, 1), dist::ReduceOp::sum);
    out.abandoned = true;
    out.cleaned = stopped == comm.size();
  }
  if (finished > 0 || out.cleaned) {
    try {
      h.wait();
      out.committed = true;  // it was past its writes when the cancel came
      out.abandoned = out.cleaned = false;
    } catch (const Error& e) {
      if (!out.abandoned) out.error = e.what();
    }
  }
  const auto& durable = checkpointer.options().durable;
  out.has_durable_tier = durable.has_value();
  out.in_memory = is_memory_root(checkpointer.options().root);
  if (durable && out.in_memory) out.durable_root = durable->root;
  // Rank 0 reads both tiers (under MPI its process commits and copies) and tells the others.
  std::uint64_t shared[3] = {0, 0, 0};  // latest + 1 (0: none), durable, durable_skipped
  if (comm.rank() == 0) {
    const auto latest = latest_step(checkpointer);
    shared[0] = latest ? *latest + 1 : 0;
    if (durable && latest) {
      // What the replicator knows the durable tier holds (an object store is not asked on
      // the way out: DurableReplicator::durable_latest).
      auto durable_latest = [&] { return checkpointer.durable_latest(); };
      // The emergency step is off the tiers' cadence (DurableTierOptions::every) as a rule:
      // handed over now, it is copied while the grace period lasts.
      if (out.committed) checkpointer.copy_to_durable(*latest);
      if (out.committed && durable_latest() != latest) {
        // Wait through the replicator's drain: when it gives up (the deadline, a second
        // signal) it also stops the copy running, so what the line says below is what the
        // durable tier holds when the process exits, not a copy that lands just after.
        DurableDrainOptions wait;
        wait.deadline = std::chrono::duration_cast<std::chrono::milliseconds>(std::max(deadline - Clock::now(), Clock::duration::zero()));
        wait.stop = [&]() -> std::string {
          return decision.hurry || preemption.count() >= 2 ? "a second signal" : "";
        };
        shared[2] = !checkpointer.drain_durable(wait).complete;
      }
      shared[1] = durable_latest() == latest;
      if (shared[1]) shared[2] = 0;
    }
  }
  comm.broadcast(std::span<std::uint64_t>(shared, 3), 0);
  if (shared[0]) out.latest = shared[0] - 1;
  out.durable = shared[1] != 0;
  out.durable_skipped = shared[2] != 0;
  return out;
}

std::string preemption_line(const PreemptionSave& s, int signal) {
  std::string line = "preempted by " + signal_name(signal) + " at step " + std::to_string(s.step) + ": ";
  char budget[32];
  std::snprintf(budget, sizeof budget, "%g", s.grace_seconds);
  if (s.abandoned)
    line += "the save of step " + std::to_string(s.step) + " did not finish within the " + budget + " s grace budget and was abandoned; ";
  else if (!s.committed)
    line += "the save of step " + std::to_string(s.step) + " failed (" + s.error + "); ";
  line += s.latest ? "latest is " + checkpoint_dir_name(*s.latest) + (s.in_memory ? " in memory" : "") : std::string("no checkpoint is committed");
  if (s.has_durable_tier)
    line += std::string(" (durable tier") + (s.durable_root.empty() ? "" : " " + s.durable_root) + ": " +
            (s.durable ? "yes" : s.durable_skipped ? "no, its copy was cut short" : "no") + ")";
  return line;
}

}  // namespace ckpt::train
