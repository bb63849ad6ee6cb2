// SPDX-License-Identifier: Apache-2.0
// Preemption: a signal (SIGTERM from a scheduler, SIGINT from a terminal, SIGUSR1 that mpirun
// forwards) becomes a request the training loop sees at its next step boundary, the same step
// on every rank.
//
//   ckpt::Preemption preempt;                 // installs the handlers (one object per process)
//   while (...) {
//     trainer.step();
//     if (const auto d = preempt.agree(comm); d.stop) {   // collective, every step
//       ...emergency save of this step, wait (d.hurry: skip the durable tier), exit 0...
//     }
//   }
//
// The handlers only count: a lock-free atomic counter and the first signal's number, nothing
// else (async-signal-safe). The first signal is the request; a second one asks to hurry (skip
// the wait for the durable tier). Ranks agree through one small all-reduce per step, so a
// signal that reached one process (or one rank thread's view of it) stops every rank at the
// same step, with the thread and MPI backends alike.
#pragma once

#include "ckpt/core/export.hpp"

#include <csignal>
#include <string>
#include <vector>

#include "ckpt/dist/communicator.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// What the ranks agreed at a step boundary (Preemption::agree).
struct PreemptionDecision {
  bool stop = false;   ///< some rank saw a signal: every rank stops at this step
  bool hurry = false;  ///< some rank saw two or more: skip the wait for the durable tier
  int signal = 0;      ///< the signal that asked (0 if none; the first in the configured list any rank saw)
};

class Preemption {
 public:
  /// SIGTERM, SIGINT, SIGUSR1.
  static std::vector<int> default_signals();

  /// Installs a handler for each of `signals` (sigaction, SA_RESTART), remembering the handlers
  /// they replace. Errc::invalid_argument if another Preemption is alive in this process (the
  /// handlers are process-wide), if `signals` is empty or holds a signal twice, or a signal
  /// that cannot be caught (SIGKILL, SIGSTOP) or sigaction refuses. Not thread-safe against
  /// another thread constructing one at the same time.
  explicit Preemption(std::vector<int> signals = default_signals());
  /// Restores the handlers the constructor replaced. A signal arriving afterwards gets the
  /// previous disposition (by default: the process dies of it).
  ~Preemption();
  Preemption(const Preemption&) = delete;
  Preemption& operator=(const Preemption&) = delete;

  /// This process's view, without communicating: signals received so far (of the configured
  /// ones) and the first one's number (0: none). Never block; any thread.
  int count() const noexcept;
  int first_signal() const noexcept;
  const std::vector<int>& signals() const noexcept { return signals_; }

  /// Collective over `comm` (every rank calls it once per step boundary, in the same order as
  /// its other collectives): one all-reduce of (1 + signals().size()) int32 values. Every rank
  /// returns the same decision. Throws what the communicator throws (Errc::aborted,
  /// Errc::comm_error). Thread-safe: the rank threads of one process may call it at once.
  PreemptionDecision agree(dist::Communicator& comm) const;

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
};

/// "SIGTERM", "SIGINT", "SIGUSR1", ... ("signal N" for one without a name here).
std::string signal_name(int sig);

}  // namespace ckpt
CKPT_API_END
