// SPDX-License-Identifier: Apache-2.0
// Signal handlers that only count (see preemption.hpp). What a handler may touch is limited to
// lock-free atomics; everything else happens at the step boundary, in agree().
#include "ckpt/runtime/preemption.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "ckpt/core/error.hpp"

namespace ckpt {

namespace {

std::atomic<int> g_count{0};
std::atomic<int> g_first{0};
std::atomic<bool> g_installed{false};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

// A C++ function of this file alone (internal linkage, not a global `extern "C"` symbol that
// could collide with a program's own): GCC and Clang call a handler through the same
// convention whatever its language linkage.
void on_preemption_signal(int sig) {
  int none = 0;
  g_first.compare_exchange_strong(none, sig, std::memory_order_relaxed);
  g_count.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::vector<int> Preemption::default_signals() { return {SIGTERM, SIGINT, SIGUSR1}; }

Preemption::Preemption(std::vector<int> signals) : signals_(std::move(signals)) {
  if (signals_.empty()) throw_invalid("Preemption: no signals to handle");
  for (std::size_t i = 0; i < signals_.size(); ++i) {
    const int s = signals_[i];
    if (s == SIGKILL || s == SIGSTOP || s <= 0 || s >= NSIG)
      throw Error(Errc::invalid_argument, {}, "Preemption: a signal that can be caught", "SIGTERM, SIGINT, SIGUSR1, ...", signal_name(s));
    if (std::count(signals_.begin(), signals_.end(), s) > 1)
      throw Error(Errc::invalid_argument, {}, "Preemption: each signal once", "distinct signals", signal_name(s) + " twice");
  }
  if (g_installed.exchange(true))
    throw Error(Errc::invalid_argument, {}, "Preemption: one per process (signal handlers are process-wide)", "none alive", "another one");
  g_count.store(0);
  g_first.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_preemption_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (const int s : signals_) {
    struct sigaction old {};
    if (::sigaction(s, &sa, &old) != 0) {
      const int err = errno;
      for (std::size_t i = 0; i < previous_.size(); ++i) ::sigaction(signals_[i], &previous_[i], nullptr);
      g_installed.store(false);
      throw Error(Errc::invalid_argument, {}, std::string("Preemption: sigaction refused: ") + std::strerror(err), "a catchable signal",
                  signal_name(s));
    }
    previous_.push_back(old);
  }
}

Preemption::~Preemption() {
  for (std::size_t i = 0; i < previous_.size(); ++i) ::sigaction(signals_[i], &previous_[i], nullptr);
  g_installed.store(false);
}

int Preemption::count() const noexcept { return g_count.load(std::memory_order_relaxed); }
int Preemption::first_signal() const noexcept { return g_first.load(std::memory_order_relaxed); }

PreemptionDecision Preemption::agree(dist::Communicator& comm) const {
  // [ranks that saw two or more signals, then per configured signal: ranks whose first it was]
  std::vector<std::int32_t> v(1 + signals_.size(), 0);
  const int n = count(), first = first_signal();
  v[0] = n >= 2;
  for (std::size_t i = 0; i < signals_.size(); ++i) v[1 + i] = n >= 1 && first == signals_[i];
  comm.all_reduce(std::span<std::int32_t>(v), dist::ReduceOp::sum);
  PreemptionDecision d;
  d.hurry = v[0] > 0;
  for (std::size_t i = 0; i < signals_.size() && !d.stop; ++i)
    if (v[1 + i] > 0) d.stop = true, d.signal = signals_[i];
  return d;
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    case SIGUSR2: return "SIGUSR2";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    case SIGKILL: return "SIGKILL";
    case SIGSTOP: return "SIGSTOP";
    case SIGXCPU: return "SIGXCPU";
    default: return "signal " + std::to_string(sig);
  }
}

}  // namespace ckpt
