// Private: what a multi-process CommitCoordinator (dist/mpi, and the Python package's
// torch.distributed one) keeps for the one rank its process hosts: the outcome callback of
// each step the rank reported and has not been answered for, and the abandoned steps, whose
// later reports are answered at once with the abandon's outcome. Not thread-safe: the
// coordinator's mutex guards it, and the callbacks it hands out are called after unlocking.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "ckpt/core/error.hpp"
#include "ckpt/runtime/coordinator.hpp"

namespace ckpt::detail {

struct LocalOutcomes {
  std::map<std::uint64_t, CommitCoordinator::OutcomeFn> pending;  ///< reported, not answered yet
  std::map<std::uint64_t, CommitOutcome> abandoned;

  /// Rank `rank` reports `step`: stores `fn` (moved from) and returns nullopt, or, for an
  /// abandoned step, leaves `fn` alone and returns the outcome to call it with. A second
  /// report of the step is Errc::invalid_argument.
  std::optional<CommitOutcome> add(std::uint64_t step, int rank, CommitCoordinator::OutcomeFn& fn) {
    if (auto it = abandoned.find(step); it != abandoned.end()) return it->second;
    if (pending.contains(step))
      throw Error(Errc::invalid_argument, {}, "rank " + std::to_string(rank) + " reported step " + std::to_string(step) + " twice");
    pending[step] = std::move(fn);
    return std::nullopt;
  }

  /// The step's callback, removed; empty if none is waiting.
  CommitCoordinator::OutcomeFn take(std::uint64_t step) {
    CommitCoordinator::OutcomeFn fn;
    if (auto it = pending.find(step); it != pending.end()) {
      fn = std::move(it->second);
      pending.erase(it);
    }
    return fn;
  }

  /// Records `step` as abandoned with `outcome`; returns the callback to call with it (empty
  /// if the rank had not reported).
  CommitCoordinator::OutcomeFn abandon(std::uint64_t step, const CommitOutcome& outcome) {
    abandoned[step] = outcome;
    return take(step);
  }
};

}  // namespace ckpt::detail
