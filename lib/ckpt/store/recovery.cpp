// SPDX-License-Identifier: Apache-2.0
#include "ckpt/store/recovery.hpp"

#include <algorithm>
#include <map>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/copy.hpp"

namespace ckpt {

std::string_view recovery_fetch_name(RecoveryFetch fetch) noexcept {
  switch (fetch) {
    case RecoveryFetch::read: return "read";
    case RecoveryFetch::rebuild: return "rebuild";
    case RecoveryFetch::restore: return "restore";
  }
  return "?";
}

std::string_view recovery_level_name(StoreKind kind) noexcept {
  switch (kind) {
    case StoreKind::memory: return "memory";
    case StoreKind::directory: return "disk";
    case StoreKind::node_set: return "node roots";
    case StoreKind::object_store: return "object store";
  }
  return "?";
}

namespace {

std::string where(const RecoveryCandidate& c) { return std::string(recovery_level_name(c.kind)) + " " + c.root; }

std::string how(RecoveryFetch f) {
  switch (f) {
    case RecoveryFetch::read: return "read in place";
    case RecoveryFetch::rebuild: return "its lost files rebuilt from the other nodes' redundancy first";
    case RecoveryFetch::restore: return "restored from the object store";
  }
  return "?";
}

// Why a node set's checkpoint cannot be rebuilt, from its health: the ranks lost, each bad
// file with its error's kind, and the full error of the first file that is damaged rather
// than missing (a survivor's bad block is what made the loss unrecoverable), else the first.
std::string beyond_redundancy(const NodeCheckpointHealth& h) {
  std::string ranks, files;
  for (const int r : h.lost_ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  const auto bad = h.bad_files();
  const MemberHealth* shown = bad.empty() ? nullptr : bad.front();
  for (const MemberHealth* f : bad) {
    files += (files.empty() ? "" : ", ") + f->what + " on node " + std::to_string(f->node) + " (" + std::string(errc_name(f->code)) + ")";
    if (shown->code == Errc::missing_shard && f->code != Errc::missing_shard) shown = f;
  }
  std::string out = "beyond its redundancy: rank" + std::string(h.lost_ranks.size() == 1 ? " " : "s ") + ranks + " cannot be rebuilt (bad: " + files + ")";
  if (shown) out += "; " + std::string(shown->code == Errc::missing_shard ? "first" : "damaged") + ": " + shown->error;
  return out;
}

// The candidate `step` of `store` (level `level`), checked as `options` asks.
RecoveryCandidate survey(CheckpointStore& store, std::size_t level, const std::string& root, std::uint64_t step, const RecoveryOptions& options) {
  RecoveryCandidate c;
  c.level = level;
  c.root = root;
  c.kind = store.kind();
  c.step = step;
  if (c.kind == StoreKind::object_store) c.fetch = RecoveryFetch::restore;
  try {
    const StoredCheckpoint d = store.describe(step);
    c.bytes = d.bytes;
    if (options.expected_world_size && d.world_size != *options.expected_world_size)
      throw Error(Errc::invalid_argument, store.name_of(step), "saved at another world size", std::to_string(*options.expected_world_size),
                  std::to_string(d.world_size));
    if (d.state == CheckpointState::corrupt) {
      c.passed_over = d.health ? beyond_redundancy(*d.health) : d.error;
      if (c.passed_over.empty()) c.passed_over = "corrupt";
      return c;
    }
    if (d.state == CheckpointState::degraded) c.fetch = RecoveryFetch::rebuild;
    if (options.verify != Verify::none) {
      if (const auto h = store.health(step, options.verify)) {
        if (!h->recoverable()) c.passed_over = beyond_redundancy(*h);
        else if (!h->healthy()) c.fetch = RecoveryFetch::rebuild;
      } else {
        store.verify(step, options.verify);
      }
    }
  } catch (const Error& e) {
    c.passed_over = e.what();
  }
  return c;
}

}  // namespace

RecoveryPlan plan_recovery(const std::vector<std::string>& roots, const RecoveryOptions& options) {
  if (roots.empty()) throw_invalid("plan_recovery: no levels to survey");
  const auto t0 = std::chrono::steady_clock::now();
  RecoveryPlan plan;
  plan.roots = roots;
  std::vector<std::unique_ptr<CheckpointStore>> stores(roots.size());
  std::map<std::uint64_t, std::vector<std::size_t>, std::greater<>> holders;  // step -> levels, newest step first
  for (std::size_t i = 0; i < roots.size(); ++i) {
    try {
      stores[i] = open_store(roots[i], {.fs = options.fs});
      const std::vector<std::uint64_t> steps = stores[i]->steps();
      if (steps.empty()) plan.level_errors.push_back({i, roots[i], "holds no committed checkpoint", Errc::not_found});
      for (const auto s : steps) holders[s].push_back(i);
    } catch (const Error& e) {
      plan.level_errors.push_back({i, roots[i], e.what(), e.code()});
    }
  }
  for (const auto& [step, levels] : holders) {
    for (const std::size_t i : levels) {
      RecoveryCandidate c = survey(*stores[i], i, roots[i], step, options);
      plan.candidates.push_back(c);
      if (c.usable()) {
        plan.chosen = std::move(c);
        break;
      }
    }
    if (plan.chosen) break;
  }
  plan.discover = std::chrono::steady_clock::now() - t0;
  return plan;
}

Recovered recover_planned(const RecoveryPlan& plan, const RecoveryOptions& options, const std::string& restore_into) {
  using Clock = std::chrono::steady_clock;
  if (!plan.chosen)
    throw Error(Errc::not_found, plan.roots.empty() ? std::string() : plan.roots.front(), "no level holds a checkpoint to recover from", "a plan's chosen candidate",
                plan.summary());
  const RecoveryCandidate& c = *plan.chosen;
  std::unique_ptr<CheckpointStore> store = open_store(c.root, {.fs = options.fs});
  std::chrono::nanoseconds fetch{}, rebuild{};
  if (c.fetch == RecoveryFetch::rebuild) {
    const auto t0 = Clock::now();
    store->writer()->repair(c.step, Verify::fast);
    rebuild = Clock::now() - t0;
  } else if (c.fetch == RecoveryFetch::restore) {
    if (restore_into.empty())
      throw Error(Errc::invalid_argument, c.root, "a restore from an object store needs a directory root to restore into", "restore_into", "none");
    const auto t0 = Clock::now();
    auto local = open_store(restore_into, {.fs = options.fs});
    copy_checkpoint(*store, c.step, *local->writer(), {.verify = Verify::fast, .begin = {.allow_older_than_latest = true}, .parallel_shards = 4});
    store = std::move(local);
    fetch = Clock::now() - t0;
  }
  const auto t0 = Clock::now();
  CheckpointReader reader = store->open(c.step, options.expected_world_size);
  return {std::move(reader), c, fetch, rebuild, Clock::now() - t0};
}

std::string RecoveryPlan::summary() const {
  std::string out;
  if (chosen) out = "step " + std::to_string(chosen->step) + " from " + where(*chosen) + " (" + how(chosen->fetch) + ")";
  else out = "nothing to recover";
  std::string passed;
  for (const auto& c : candidates) {
    if (c.usable()) continue;
    passed += (passed.empty() ? "" : "; ") + ("step " + std::to_string(c.step) + " on " + where(c) + ": " + c.passed_over);
  }
  if (!passed.empty()) out += "; passed over: " + passed;
  std::string levels;
  for (const auto& e : level_errors) {
    // A cheaper level than the chosen one, or any level when nothing was chosen, is worth naming.
    if (chosen && e.level > chosen->level) continue;
    levels += (levels.empty() ? "" : "; ") + e.root + ": " + e.error;
  }
  if (!levels.empty()) out += (chosen ? "; not used: " : ": ") + levels;
  return out;
}

}  // namespace ckpt
