// SPDX-License-Identifier: Apache-2.0
// The copy between tiers and the tiered open; the protocol is in tiers.hpp and
// docs/commit-protocol.md ("Two tiers").
#include "ckpt/store/tiers.hpp"

#include <exception>
#include <functional>
#include <optional>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/store/object/object_lease.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/store/detail/kinds.hpp"
#include "ckpt/store/run_identity.hpp"

namespace ckpt {


CopyRecord copy_checkpoint(FileSystem& src_fs, const std::string& src_root, std::uint64_t step, FileSystem& dst_fs,
                           const std::string& dst_root, Verify verify, const BeginOptions& begin) {
  // The one copy between stores (store/copy.hpp), under the durable root's writer.
  const auto source = open_store(src_root, {.fs = &src_fs});
  const auto destination = open_store(dst_root, {.fs = &dst_fs});
  const auto writer = destination->writer();
  const CopyReport r = copy_checkpoint(*source, step, *writer, {.verify = verify, .begin = begin});
  return CopyRecord{step, src_root, checkpoint_dir_name(step), r.copied_at, r.bytes, r.chunks_verified, r.sha256_verified};
}

namespace {

// The newest checkpoint of one root, verified. `older`: also try the older ones.
OpenedCheckpoint open_verified(FileSystem& fs, const std::string& root, const OpenLatestOptions& opt, bool older) {
  if (older) return open_latest(fs, root, {.expected_world_size = opt.expected_world_size, .fallback = true, .verify = opt.verify});
  OpenedCheckpoint o = open_latest(fs, root, {.expected_world_size = opt.expected_world_size});
  o.reader.verify(opt.verify);
  return o;
}

}  // namespace

namespace {

// Both durable tiers' order: the newest local checkpoint, verified; else what `open_durable`
// opens (it throws when the durable tier has nothing good); else, with opt.fallback, an older
// local one. A world-size mismatch is never retried elsewhere: it is the caller's error.
TieredCheckpoint open_in_tiers(FileSystem& local_fs, const std::string& local_root, const OpenLatestOptions& opt,
                               const std::string& durable_name, const std::function<OpenedCheckpoint()>& open_durable) {
  std::string local_error, durable_error;
  try {
    return {open_verified(local_fs, local_root, opt, false), "local", {}, {}};
  } catch (const Error& e) {
    if (e.code() == Errc::world_size_mismatch) throw;
    local_error = e.what();
  }
  try {
    return {open_durable(), "durable", local_error, {}};
  } catch (const Error& e) {
    // A world-size mismatch is the caller's; a checkpoint of another run, or a live writer
    // (of the store, or of the local root), is refused, not passed over for an older one.
    if (e.code() == Errc::world_size_mismatch || e.code() == Errc::conflict || e.code() == Errc::busy) throw;
    durable_error = e.what();
  }
  if (opt.fallback) {
    try {
      return {open_verified(local_fs, local_root, opt, true), "local", {}, {}};
    } catch (const Error& e) {
      if (e.code() == Errc::world_size_mismatch) throw;
    }
  }
  throw Error(Errc::not_found, local_root, "no checkpoint that opens and verifies in either tier (durable: " + durable_name + ")",
              "a good checkpoint", "local: " + local_error + "; durable: " + durable_error);
}

// Refuses (Errc::conflict, naming both runs) to continue `tier`'s checkpoint in a local root
// of another run (or of none), unless `adopt`. A checkpoint that records no run (a store
// written before run identities) passes.
void check_run(const ObjectManifest& tier, const std::optional<std::string>& local_run, bool adopt, const std::string& object,
               const std::string& local_root) {
  if (tier.run.empty() || tier.run == local_run || adopt) return;
  const std::string step = checkpoint_dir_name(tier.step);
  if (local_run)
    throw Error(Errc::conflict, object,
                step + " was committed by run " + tier.run + ", not by run " + *local_run + " of the local root " + local_root +
                    ": another job's checkpoint on this prefix (to continue run " + tier.run +
                    " here, resume with adopt_run (ckpt-demo --adopt-run); to keep run " + *local_run + ", use another prefix)",
                "run " + *local_run, "run " + tier.run);
  throw Error(Errc::conflict, object,
              step + " was committed by run " + tier.run + "; the local root " + local_root +
                  " has no run of its own (a new root): resume with adopt_run (ckpt-demo --adopt-run) to continue run " + tier.run + " here",
              "a run of the local root", "run " + tier.run);
}

// A writer of another run than the local root's holds the store's lease and it has not
// expired: restoring (and adopting) what it is still writing would race it, and its lease
// refuses this run's writer anyway (store/object/object_lease.hpp). Errc::busy naming both.
void refuse_live_writer(ObjectStore& durable, const std::optional<std::string>& local_run, const std::string& local_root) {
  std::optional<ObjectLeaseState> lease;
  try {
    lease = read_object_lease(durable);
  } catch (const Error& e) {
    if (e.code() != Errc::malformed_manifest) throw;  // not a lease: the writer's take() deals with it
  }
  if (!lease || lease->record.released || lease->record.run == local_run) return;
  const auto expires = parse_rfc3339(lease->record.expires_at);
  if (!expires || *expires <= std::chrono::system_clock::now()) return;
  throw Error(Errc::busy, durable.name_of(kLeaseName),
              "another writer holds the lease of " + durable.name_of("") + " and writes there now: a resume into " + local_root + " (run " +
                  local_run.value_or("none yet") + ") does not restore its checkpoints",
              "no live writer of another run", lease->record.describe());
}

// The object store's candidates, newest first, restored into the local root in turn until
// one opens; the first failure is rethrown when none does. Without a `latest` every
// committed step is a candidate (none is "the" checkpoint: the newest that restores is).
OpenedCheckpoint restore_from_object_tier(FileSystem& local_fs, const std::string& local_root, ObjectStore& durable,
                                          const OpenLatestOptions& opt, bool adopt, std::string& adopted) {
  std::vector<std::uint64_t> candidates;
  if (const auto latest = read_object_latest(durable)) candidates.push_back(latest->step);
  const bool no_latest = candidates.empty();
  if (opt.fallback || no_latest) {
    auto steps = list_object_checkpoints(durable);
    for (auto it = steps.rbegin(); it != steps.rend(); ++it)
      if (candidates.empty() || *it != candidates.front()) candidates.push_back(*it);
  }
  if (candidates.empty()) throw Error(Errc::not_found, durable.name_of(""), "no committed checkpoint on the object store");
  const std::optional<std::string> local_run = read_run_identity(local_fs, local_root);
  refuse_live_writer(durable, local_run, local_root);
  std::exception_ptr first_error;
  for (const std::uint64_t step : candidates) {
    try {
      const std::string name = checkpoint_dir_name(step);
      const ObjectManifest tier = read_object_manifest(durable, step);
      check_run(tier, local_run, adopt, durable.name_of(name + "/" + std::string(kObjectManifestName)), local_root);
      if (local_fs.stat(join_path(local_root, name))) {
        // A local copy that did not open or verify (`latest` may name it, so
        // remove_checkpoint would refuse): renamed to a temporary, which the restore's
        // prepare_root removes, as it would a crashed writer's.
        const RootLock lock(local_fs, local_root);
        const std::string temp = join_path(local_root, temporary_name(name));
        log_event(LogLevel::info, "resume_restore", "resume: setting the local " + join_path(local_root, name) + " aside (" + temp + ") to restore it from " +
                 durable.name_of(name));
        local_fs.rename(join_path(local_root, name), temp);
        local_fs.sync_dir(local_root);
      }
      const Verify v = opt.verify == Verify::none ? Verify::fast : opt.verify;
      restore_from_object_store(durable, step, local_fs, local_root, {.verify = v, .begin = {.allow_older_than_latest = true}});
      std::string note = "restored " + name + " from " + durable.name_of(name) + " into " + local_root;
      if (!tier.run.empty() && tier.run != local_run) {
        // Adopted: the local root continues that run from now on.
        write_run_identity(local_fs, RootLock(local_fs, local_root), tier.run);
        adopted = tier.run;
        note += ", adopting run " + tier.run + (local_run ? " in place of the local root's run " + *local_run : std::string());
      }
      CheckpointReader reader = open_step(local_fs, local_root, step, opt.expected_world_size);
      log_event(LogLevel::info, "resume_tier", "resume: " + note);
      return OpenedCheckpoint{std::move(reader), name, step != candidates.front() && !no_latest, note};
    } catch (const Error& e) {
      if (e.code() == Errc::world_size_mismatch || e.code() == Errc::conflict || e.code() == Errc::busy) throw;
      if (!first_error) first_error = std::current_exception();
    }
  }
  std::rethrow_exception(first_error);
}

}  // namespace

TieredCheckpoint open_latest_tiered(FileSystem& local_fs, const std::string& local_root, FileSystem& durable_fs,
                                    const std::string& durable_root, const OpenLatestOptions& opt) {
  return open_in_tiers(local_fs, local_root, opt, durable_root,
                       [&] { return open_verified(durable_fs, durable_root, opt, opt.fallback); });
}

TieredCheckpoint open_latest_tiered(FileSystem& local_fs, const std::string& local_root, ObjectStore& durable,
                                    const OpenLatestOptions& opt, bool adopt_run) {
  std::string adopted;
  TieredCheckpoint t = open_in_tiers(local_fs, local_root, opt, durable.name_of(""),
                                     [&] { return restore_from_object_tier(local_fs, local_root, durable, opt, adopt_run, adopted); });
  t.adopted_run = std::move(adopted);
  t.restored = t.tier == "durable";
  return t;
}

TieredCheckpoint open_latest_tiered(FileSystem& local_fs, const std::string& local_root, FileSystem& durable_fs,
                                    const std::string& durable_root, const OpenLatestOptions& opt, bool adopt_run) {
  const auto durable = open_store(durable_root, {.fs = &durable_fs});
  if (ObjectStore* client = detail::object_client(*durable)) return open_latest_tiered(local_fs, local_root, *client, opt, adopt_run);
  return open_latest_tiered(local_fs, local_root, durable_fs, durable->root(), opt);
}

std::optional<std::string> find_committed_checkpoint(FileSystem& fs, const std::string& root) {
  return open_store(root, {.fs = &fs})->committed_evidence();
}

std::optional<std::string> find_committed_checkpoint(ObjectStore& store) {
  if (read_object_latest(store)) return store.name_of(kLatestName);
  const auto steps = list_object_checkpoints(store);
  if (steps.empty()) return std::nullopt;
  return store.name_of(checkpoint_dir_name(steps.back()) + "/" + std::string(kObjectManifestName)) + " (committed, no latest names it)";
}

}  // namespace ckpt
