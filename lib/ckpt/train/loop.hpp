// SPDX-License-Identifier: Apache-2.0
// The training loop's decisions that every rank must take at the same step: when to save on
// a wall-clock cadence, and what to do when the job is preempted (runtime/preemption.hpp).
//
//   ckpt::Preemption preempt;                                  // once per process
//   auto cadence = ckpt::SaveCadence::every_seconds(600);
//   while (...) {
//     trainer.step();
//     SaveHandle h;
//     if (save_due(cadence, comm, trainer.step_count())) h = start_save(checkpointer, trainer);
//     if (const auto d = preempt.agree(comm); d.stop) {
//       const auto r = save_on_preemption(checkpointer, trainer, comm, h, preempt, d, grace_seconds);
//       print(preemption_line(r, d.signal)); flush; exit 0
//     }
//   }
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "ckpt/dist/communicator.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/runtime/preemption.hpp"
#include "ckpt/train/trainer.hpp"

namespace ckpt::train {

/// Whether the loop saves after step `step`: rank 0 asks its `cadence` (with its clock, `now`)
/// and broadcasts the answer, so every rank returns the same and saves the same steps
/// whatever its own clock says. The other ranks' cadence and `now` are not consulted.
/// Collective (one broadcast of one byte); throws what the communicator throws.
bool save_due(SaveCadence& cadence, dist::Communicator& comm, std::uint64_t step,
              std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

/// What save_on_preemption did; the same on every rank.
struct PreemptionSave {
  std::uint64_t step = 0;      ///< the step the ranks stopped at (the emergency step)
  bool reused = false;         ///< a save of that step was already in flight: no second one
  bool committed = false;      ///< the checkpoint of `step` is committed
  bool abandoned = false;      ///< it did not finish within the budget and was given up
  bool cleaned = false;        ///< abandoned and stopped in time: its temporary is removed
  std::string error;           ///< why it failed (its ckpt::Error's message), if it did
  std::optional<std::uint64_t> latest;  ///< the step the root's `latest` names (rank 0 reads it)
  bool in_memory = false;      ///< the root is a memory level (mem://): `latest` is in shared memory
  bool has_durable_tier = false;
  std::string durable_root;    ///< the durable tier's root, with a memory level (the level behind it)
  bool durable = false;        ///< the durable tier's `latest` names `latest` too
  bool durable_skipped = false;  ///< committed, but the wait for the durable copy was cut short
  double grace_seconds = 0;    ///< the budget it had
};

/// How long save_on_preemption waits, past the grace budget, for a cancelled save to stop.
inline constexpr double kCancelWaitSeconds = 5.0;

/// The emergency save of a preempted loop, on every rank (collective): saves the trainer's
/// current step unless `in_flight` is a save of that step already, then waits for it for up
/// to `grace_seconds` (the deadline). If any rank's save completed by then, every rank waits
/// for its outcome (the ranks share one commit outcome, so this is at most a moment); else it
/// is abandoned: every rank cancels it (Checkpointer::cancel), `latest` stays where it was,
/// and once the writes in flight have returned (at most kCancelWaitSeconds more, on every
/// rank) its temporary directory is removed and the checkpointer can be destroyed as usual
/// (`cleaned`). A cancel that came too late to stop it leaves it committed (`committed`,
/// not `abandoned`). If it does not stop in time (a write or fsync stuck in the kernel), the
/// handles are left running and the process should exit without destroying the
/// checkpointer (std::_Exit after flushing its output): the root is then as after a crash,
/// its temporary removed by the next start (store/local/commit.hpp). After a commit with a durable
/// tier, rank 0 waits for the durable tier to catch up (Checkpointer::drain_durable) until
/// the deadline or a second signal (decision.hurry, or preemption.count() >= 2); giving up
/// stops the copy running, so `durable` says what the durable tier holds from then on. Blocks in start_save while another step is in flight
/// (BusyPolicy::wait). Throws what the communicator throws; a failed save is reported in
/// `error`, not thrown.
PreemptionSave save_on_preemption(Checkpointer& checkpointer, Trainer& trainer, dist::Communicator& comm, SaveHandle in_flight,
                                  const Preemption& preemption, const PreemptionDecision& decision, double grace_seconds);

/// The one line a preempted program ends with, e.g.
///   preempted by SIGTERM at step 137: latest is step-0000000137 (durable tier: yes)
///   preempted by SIGTERM at step 185: latest is step-0000000185 in memory (durable tier /data/run: yes)
///   preempted by SIGTERM at step 137: the save of step 137 did not finish within the 30 s
///     grace budget and was abandoned; latest is step-0000000100 (durable tier: no)
std::string preemption_line(const PreemptionSave& save, int signal);

}  // namespace ckpt::train
