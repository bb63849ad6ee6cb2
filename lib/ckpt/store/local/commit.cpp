// SPDX-License-Identifier: Apache-2.0
// Implements the commit protocol described step by step in commit.hpp and
// docs/commit-protocol.md. The order of the calls below is the protocol; do not reorder.
#include "ckpt/store/local/commit.hpp"

#include <algorithm>
#include <utility>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"

namespace ckpt {


using detail::write_small_file;

namespace {
// Renames ROOT/`name` to a temporary name, makes that durable, then removes it: a crash
// mid-removal leaves a temporary (removed by the next prepare_root), never a half-deleted
// directory under a checkpoint's name.
void retire_dir(FileSystem& fs, const std::string& root, const std::string& name) {
  const std::string doomed = join_path(root, temporary_name(name));
  fs.rename(join_path(root, name), doomed);
  fs.sync_dir(root);
  fs.remove_all(doomed);
}

// The step of the last committed checkpoint: {true, nullopt} when there is no `latest` (the
// root holds no committed checkpoint), {false, ...} when `latest` cannot be read or holds
// something else than a checkpoint name (nothing can be told apart then).
std::pair<bool, std::optional<std::uint64_t>> committed_step(FileSystem& fs, const std::string& root) {
  try {
    const auto latest = read_latest(fs, root);
    if (!latest) return {true, std::nullopt};
    const auto step = parse_checkpoint_dir_name(*latest);
    return {step.has_value(), step};
  } catch (const Error&) {
    return {false, std::nullopt};
  }
}
}  // namespace

std::vector<std::string> prepare_root(FileSystem& fs, const RootLock& lock) {
  // The reasoning that makes removing other processes' temporaries safe is in commit.hpp:
  // under the lock, no other writer of this root is live.
  const std::string& root = lock.root();
  if (!lock.held()) throw Error(Errc::invalid_argument, root, "prepare_root without the root's lock", "the lock held", "released");
  fs.create_dirs(root);
  std::vector<std::string> removed;
  std::string owners;
  for (const auto& e : fs.list_dir(root)) {
    if (!is_temporary_name(e.name)) continue;
    fs.remove_all(join_path(root, e.name));
    removed.push_back(e.name);
    const auto t = parse_temporary_name(e.name);
    owners += (owners.empty() ? "" : ", ") + e.name + (t ? " (pid " + std::to_string(t->pid) + ")" : " (a shared run)");
  }
  if (!removed.empty()) {
    fs.sync_dir(root);
    log_event(LogLevel::info, "leftover_removed", root + ": removed what a writer that is gone left behind: " + owners);
  }
  // Inside committed checkpoints: the file temporaries of a repair that was killed
  // (repair_node_checkpoint writes a rebuilt file beside its name, then renames it).
  for (const auto& e : fs.list_dir(root)) {
    if (e.type != EntryType::directory || !parse_checkpoint_dir_name(e.name)) continue;
    const std::string dir = join_path(root, e.name);
    bool any = false;
    for (const auto& f : fs.list_dir(dir))
      if (is_temporary_name(f.name)) {
        fs.remove_all(join_path(dir, f.name));
        removed.push_back(e.name + "/" + f.name);
        log_event(LogLevel::info, "leftover_removed", join_path(dir, f.name) + ": removed what a repair that is gone left behind");
        any = true;
      }
    if (any) fs.sync_dir(dir);
  }
  // Step directories `latest` never named: a crash between a checkpoint's rename and the
  // `latest` update (for the first checkpoint: no `latest` at all, so the root holds no
  // committed checkpoint and is an empty root).
  const auto [known, live] = committed_step(fs, root);
  if (!known) return removed;
  for (const auto& e : fs.list_dir(root)) {
    const auto step = parse_checkpoint_dir_name(e.name);
    if (e.type != EntryType::directory || !step || (live && *step <= *live)) continue;
    log_event(LogLevel::info, "uncommitted_removed", "removing " + join_path(root, e.name) + ": never committed (" +
             (live ? "newer than what latest names" : "no latest: the root holds no committed checkpoint") + ")");
    retire_dir(fs, root, e.name);
    removed.push_back(e.name);
  }
  return removed;
}

namespace {
// Refuses a committed ROOT/step-N and, unless `allow_older`, any step at or before the one
// `latest` names; with `replace`, removes a step-N that was never committed. `replace` is
// also the process that logs (the committer, in several processes).
void check_step_free(FileSystem& fs, const std::string& root, std::uint64_t step, bool replace, bool allow_older) {
  const std::string name = checkpoint_dir_name(step);
  const std::string dir = join_path(root, name);
  const bool exists = fs.stat(dir).has_value();
  std::optional<std::uint64_t> live;
  try {
    if (const auto latest = read_latest(fs, root)) live = parse_checkpoint_dir_name(*latest);
  } catch (const Error&) {
    // An unreadable `latest` names no step that a save could move back from (the commit
    // replaces it); but an existing step-N is then of unknown standing, and never replaced.
    if (exists) throw;
  }
  if (live && step <= *live) {
    // A committed step (at or below the one `latest` names) is never overwritten.
    if (exists) throw Error(Errc::invalid_argument, dir, "checkpoint for step " + std::to_string(step) + " already exists");
    // Its directory was rotated away (or deleted): committing would move `latest` back.
    if (!allow_older)
      throw Error(Errc::invalid_argument, root,
                  "saving step " + std::to_string(step) + " would move latest back from step " + std::to_string(*live) +
                      " (a run resumed from an older checkpoint opts in with allow_older_than_latest)",
                  "a step after " + std::to_string(*live), "step " + std::to_string(step));
    if (replace)
      log_event(LogLevel::warn, "latest_moving_back", root + ": saving step " + std::to_string(step) + ", at or before step " + std::to_string(*live) +
               " that latest names (allow_older_than_latest): latest moves back to " + name + " when it commits", {.step = step});
    return;
  }
  if (!exists || !replace) return;
  // A step-N newer than what `latest` names was never committed: a crash hit between its
  // rename and the `latest` update, and the run resumed from the older checkpoint. The
  // resumed run saves step N again, so the leftover is replaced.
  log_event(LogLevel::info, "uncommitted_removed", "replacing " + dir + ": never committed (newer than what latest names)");
  retire_dir(fs, root, name);
}
}  // namespace

std::string begin_checkpoint(FileSystem& fs, const std::string& root, std::uint64_t step, const BeginOptions& options) {
  check_step_free(fs, root, step, true, options.allow_older_than_latest);
  const std::string temp = join_path(root, temporary_name(checkpoint_dir_name(step)));
  fs.create_dir(temp);
  return temp;
}

std::string begin_shared_checkpoint(FileSystem& fs, const std::string& root, std::uint64_t step, const std::string& run_id,
                                    bool committer, const BeginOptions& options) {
  if (run_id.empty() || run_id.find('/') != std::string::npos)
    throw Error(Errc::invalid_argument, root, "shared checkpoint run id", "a non-empty name without '/'", run_id);
  check_step_free(fs, root, step, committer, options.allow_older_than_latest);
  const std::string temp = shared_temporary_dir(root, step, run_id);
  fs.create_dirs(temp);
  return temp;
}

std::string shared_temporary_dir(const std::string& root, std::uint64_t step, const std::string& run_id) {
  return join_path(root, ".tmp-" + checkpoint_dir_name(step) + "-" + run_id);
}

namespace {
// Steps e-g. `replaced` turns true once `latest` names the new checkpoint (after f): from
// then on a failure (of g) must not undo the checkpoint `latest` already points to.
void replace_latest(FileSystem& fs, const std::string& root, const std::string& dir_name, bool& replaced) {
  const std::string temp = join_path(root, temporary_name(kLatestName));
  try {
    write_small_file(fs, temp, dir_name + "\n");      // e
    fs.rename(temp, join_path(root, kLatestName));    // f
  } catch (...) {
    try {
      fs.remove_all(temp);
    } catch (...) {
    }
    throw;
  }
  replaced = true;
  fs.sync_dir(root);  // g
}
}  // namespace

void write_latest(FileSystem& fs, const std::string& root, const std::string& dir_name) {
  bool replaced = false;
  replace_latest(fs, root, dir_name, replaced);
}

std::string commit_checkpoint(FileSystem& fs, const std::string& root, const std::string& temp_dir,
                              const Manifest& manifest, std::string_view manifest_text) {
  const std::string name = checkpoint_dir_name(manifest.step);
  const std::string final_dir = join_path(root, name);
  const std::string text = manifest_text.empty() ? encode_manifest(manifest) : std::string(manifest_text);
  // Never commit a manifest the loader would refuse: decode it with the loader's checks first.
  if (const Manifest decoded = decode_manifest(text, join_path(temp_dir, kManifestName)); decoded.step != manifest.step)
    throw Error(Errc::invalid_argument, join_path(temp_dir, kManifestName), "the manifest's step", std::to_string(manifest.step),
                std::to_string(decoded.step));
  write_small_file(fs, join_path(temp_dir, kManifestName), text);  // a
  fs.sync_dir(temp_dir);                                                                // b
  if (fs.stat(final_dir))
    throw Error(Errc::invalid_argument, final_dir, "checkpoint for step " + std::to_string(manifest.step) + " already exists");
  fs.rename(temp_dir, final_dir);  // c
  bool replaced = false;
  try {
    fs.sync_dir(root);                        // d
    replace_latest(fs, root, name, replaced);  // e, f, g
  } catch (...) {
    // A save that reports failure must not leave a complete-looking step-N behind that
    // `latest` does not name: move it back to its temporary name for abort_checkpoint.
    if (!replaced) {
      try {
        fs.rename(final_dir, temp_dir);
      } catch (...) {
      }
    }
    throw;
  }
  return final_dir;
}

void abort_checkpoint(FileSystem& fs, const std::string& root, const std::string& temp_dir) noexcept {
  try {
    fs.remove_all(temp_dir);
    fs.sync_dir(root);
  } catch (...) {
    // The next prepare_root removes it; the failure that led here is what the caller reports.
  }
}

void remove_checkpoint(FileSystem& fs, const std::string& root, const std::string& dir_name) {
  const std::string dir = join_path(root, dir_name);
  if (!parse_checkpoint_dir_name(dir_name)) throw Error(Errc::invalid_argument, dir, "not a checkpoint directory name", "step-NNNNNNNNNN", dir_name);
  const auto st = fs.stat(dir);
  if (!st || st->type != EntryType::directory) throw Error(Errc::not_found, dir, "no such checkpoint");
  if (read_latest(fs, root) == dir_name)
    throw Error(Errc::invalid_argument, dir, "refusing to remove the checkpoint `latest` names");
  retire_dir(fs, root, dir_name);
  fs.sync_dir(root);
}

std::vector<std::string> rotate_checkpoints(FileSystem& fs, const std::string& root, int keep_last,
                                            const std::string& committed, const std::function<bool(const std::string&)>& keep) {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  const auto latest = read_latest(fs, root);
  std::vector<std::string> others;
  for (const auto& e : fs.list_dir(root))
    if (e.type == EntryType::directory && parse_checkpoint_dir_name(e.name) && e.name != committed && (!latest || e.name != *latest))
      others.push_back(e.name);
  for (const auto& name : rotation_victims(std::move(others), keep_last, keep)) {
    remove_checkpoint(fs, root, name);
    removed.push_back(name);
  }
  return removed;
}

std::vector<std::string> rotation_victims(std::vector<std::string> others, int keep_last, const std::function<bool(const std::string&)>& keep) {
  std::vector<std::string> out;
  if (keep_last <= 0) return out;
  std::sort(others.rbegin(), others.rend());
  others.erase(std::unique(others.begin(), others.end()), others.end());
  for (std::size_t i = static_cast<std::size_t>(keep_last - 1); i < others.size(); ++i)
    if (!keep || !keep(others[i])) out.push_back(others[i]);
  return out;
}

std::vector<std::string> make_room(FileSystem& fs, const std::string& root, std::uint64_t needed,
                                   const std::function<bool(const std::string&)>& keep) {
  std::vector<std::string> removed;
  auto free = fs.free_space(root);
  if (!free || *free >= needed) return removed;
  const auto [known, live] = committed_step(fs, root);
  if (!known || !live) return removed;
  std::vector<std::string> older;  // oldest first
  for (const auto& e : fs.list_dir(root)) {
    const auto step = parse_checkpoint_dir_name(e.name);
    if (e.type == EntryType::directory && step && *step < *live && !(keep && keep(e.name))) older.push_back(e.name);
  }
  std::sort(older.begin(), older.end());
  const std::string want = std::to_string(needed) + " bytes";
  for (const auto& name : older) {
    log_event(LogLevel::warn, "disk_nearly_full", "disk nearly full (" + std::to_string(*free) + " bytes free, the next checkpoint needs about " + want +
             "): removing " + join_path(root, name) + " before saving");
    remove_checkpoint(fs, root, name);
    removed.push_back(name);
    free = fs.free_space(root);
    if (!free || *free >= needed) return removed;
  }
  log_event(LogLevel::warn, "disk_nearly_full", "disk nearly full (" + std::to_string(*free) + " bytes free, the next checkpoint needs about " + want +
           "): nothing left to remove but the checkpoint latest names" + (keep ? " and those the durable tier still needs" : ""));
  return removed;
}

}  // namespace ckpt
