// SPDX-License-Identifier: Apache-2.0
// The durable commit protocol (docs/commit-protocol.md is the same text, longer):
//
//   0. take the root's writer lock (store/root_lock.hpp: ROOT/.lock, held while writing);
//      prepare_root: create ROOT if needed; remove leftover temporaries (".tmp-*",
//      ".latest.tmp-*") from a crashed writer; fsync ROOT; remove the step directories that
//      were never committed (newer than what `latest` names, or all of them when there is no
//      `latest`: a root with no committed checkpoint is an empty root), with a log line each.
//   1. begin_checkpoint: refuse a committed step and a step at or before the one `latest`
//      names (unless allowed); mkdir ROOT/.tmp-step-N-<pid>-<n>/.
//   2. every rank writes its shard into the temporary directory (create, write, fsync, close);
//      the checksums are computed while the bytes stream out, never by reading them back.
//   3. commit_checkpoint, once every shard is durable:
//      a. write manifest.json into the temporary directory (create, write, fsync, close);
//      b. fsync the temporary directory (its entries: the shards and the manifest);
//      c. rename .tmp-step-N-... -> step-N (atomic within one file system);
//      d. fsync ROOT (the rename itself is now durable);
//      e. write ROOT/.latest.tmp-<pid>-<n> containing "step-N\n", fsync it, close;
//      f. rename it over ROOT/latest (atomic replacement);
//      g. fsync ROOT.
//   A crash before (c) leaves only a temporary directory: `latest` still names the previous
//   checkpoint, which is intact, and the next prepare_root removes the temporary. A crash
//   between (c) and (f) leaves a complete step-N that `latest` does not name yet: the loader
//   still opens the previous one (and `ckpt ls` shows both); the next prepare_root removes
//   the uncommitted step-N (after a crash in the first save: the root is empty again). An error (not a crash) between
//   (c) and (f) renames step-N back to its temporary name, which is then removed: a save that
//   reports failure leaves nothing behind. After (f) the new checkpoint is live; an error in
//   (g) is reported, but `latest` keeps naming the new checkpoint. Old checkpoints are removed
//   (rotation) only after (g).
//
// A root has one writer at a time, holding its lock (a second one fails with Errc::busy);
// readers take no lock and may run concurrently.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/store/root_lock.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// Step 0, the crash cleanup: creates `lock.root()` if needed and removes every temporary in
/// it (".tmp-*", ".latest.tmp-*"), whoever made it, and those inside its step directories (a
/// killed node-set repair's, "step-N/.tmp-*"); then the step directories that were never
/// committed: every step-N newer than the step `latest` names, or every step-N when there is
/// no `latest` (a crash between the first checkpoint's rename and the first `latest`: the
/// root holds no committed checkpoint, so it is an empty root), each through a temporary name
/// and with a log line; a `latest` that cannot be read or names no checkpoint leaves the step
/// directories alone. Returns the names removed (temporaries first); one log line names the
/// temporaries and the pids that made them. Only the holder of the root's lock may do this,
/// so it takes the lock as its proof (Errc::invalid_argument if it is released): every
/// writer takes the lock before it creates a temporary in the root and holds it until it
/// has committed or removed that temporary, and a dead writer's lock is dropped by the
/// kernel; so while we hold the lock, no other writer of this root is live and every
/// temporary in it is a dead writer's leftover. Call it right after taking the lock, before
/// this process creates temporaries of its own. (With ranks in several processes, the
/// others write only into the run's shared temporary, which they create after rank 0's
/// prepare_root: CommitCoordinator::start_run.)
std::vector<std::string> prepare_root(FileSystem& fs, const RootLock& lock);

/// What begin_checkpoint accepts besides a step after the one `latest` names.
struct BeginOptions {
  /// A step at or before the one `latest` names, for a run resumed from an older checkpoint
  /// (deliberately, or because the one `latest` names was corrupt and the resume fell back to
  /// an older one or to the durable tier): its commit moves `latest` back, with a log line.
  /// An existing committed step-N is refused even so.
  bool allow_older_than_latest = false;
};

/// Step 1: creates the temporary directory for `step` and returns its path. Throws
/// invalid_argument if ROOT/step-N exists and is committed (N at or below the step `latest`
/// names), and, unless options.allow_older_than_latest, if N is at or below the step
/// `latest` names even though step-N is gone (rotated away): that commit would move `latest`
/// back (the error names both steps). A step-N newer than `latest` was never committed (a
/// crash between its rename and the `latest` update) and is replaced, with a log line. Call
/// it holding the root's lock.
std::string begin_checkpoint(FileSystem& fs, const std::string& root, std::uint64_t step, const BeginOptions& options = {});

/// Step 1 for writers in several processes (one checkpoint, one shard per process): the
/// temporary directory ROOT/.tmp-step-N-<run_id>, the same path in every process, created
/// if missing (each process calls this; whichever comes first creates it). Every process
/// refuses a committed step-N as begin_checkpoint does; only the `committer` (the process
/// that will run commit_checkpoint) replaces an uncommitted one, so no two processes race on
/// it. Errc::invalid_argument for an empty run id or one containing '/'.
std::string begin_shared_checkpoint(FileSystem& fs, const std::string& root, std::uint64_t step, const std::string& run_id,
                                    bool committer, const BeginOptions& options = {});
/// The path begin_shared_checkpoint makes, without touching the file system: for a process
/// that names another node's temporary (checkpoints across node roots under MPI).
std::string shared_temporary_dir(const std::string& root, std::uint64_t step, const std::string& run_id);

/// Step 3: the manifest, the renames and the fsyncs, in the order above.
/// Returns the final checkpoint directory path. `manifest_text`, when not empty, is written
/// as the manifest byte for byte (a copy's: the source's bytes) instead of `manifest`'s
/// encoding; it must decode with the loader's checks to the same step
/// (Errc::invalid_argument otherwise).
std::string commit_checkpoint(FileSystem& fs, const std::string& root, const std::string& temp_dir,
                              const Manifest& manifest, std::string_view manifest_text = {});

/// Steps e-g alone: atomically points ROOT/latest at `dir_name`.
void write_latest(FileSystem& fs, const std::string& root, const std::string& dir_name);

/// Best effort removal of a failed checkpoint's temporary directory (never throws).
void abort_checkpoint(FileSystem& fs, const std::string& root, const std::string& temp_dir) noexcept;

/// Durably removes the committed checkpoint ROOT/`dir_name` (e.g. "step-0000000010"): renames
/// it to a temporary name first and fsyncs ROOT, so a crash mid-removal leaves a temporary
/// (removed by the next prepare_root, listed as "in progress") and never a half-deleted
/// directory under a checkpoint's name; then removes the temporary and fsyncs ROOT again.
/// Refuses (invalid_argument) the checkpoint `latest` names and names that are not
/// checkpoint directories; Errc::not_found if it does not exist. Blocks on the file system.
void remove_checkpoint(FileSystem& fs, const std::string& root, const std::string& dir_name);

/// Rotation: keeps the newest `keep_last` checkpoints of `root`, counting `committed` (the one
/// just committed), which is never removed, nor is whatever `latest` names, nor any name for
/// which `keep` returns true (e.g. a checkpoint still being copied to another tier). Each
/// removal goes through remove_checkpoint. keep_last 0 keeps everything. Call only after
/// `latest` is durable. Returns the names removed; throws the first removal's error.
std::vector<std::string> rotate_checkpoints(FileSystem& fs, const std::string& root, int keep_last,
                                            const std::string& committed,
                                            const std::function<bool(const std::string&)>& keep = {});

/// Rotation's choice, for a directory root and a node set alike: of `others` (checkpoint
/// directory names in any order, the committed step and those a `latest` names left out),
/// all but the newest keep_last - 1, less those `keep` keeps; newest first. Empty for
/// keep_last <= 0.
std::vector<std::string> rotation_victims(std::vector<std::string> others, int keep_last, const std::function<bool(const std::string&)>& keep);

/// Pre-save rotation, for a full disk: while fs.free_space(root) is known and below `needed`
/// (the expected size of the next checkpoint), removes the oldest committed checkpoint older
/// than the one `latest` names, never that one nor any name for which `keep` returns true
/// (e.g. a checkpoint the durable tier still has to copy), through remove_checkpoint, and
/// asks again; it stops once the checkpoint fits or only those are left. Nothing happens
/// without a `latest` or when the free space is unknown. Logs a line per removal and one
/// when the space is still short. Returns the names removed; throws a removal's error.
/// Call between checkpoints (not between a commit and its `latest`); one writer.
std::vector<std::string> make_room(FileSystem& fs, const std::string& root, std::uint64_t needed,
                                   const std::function<bool(const std::string&)>& keep = {});

}  // namespace ckpt
CKPT_API_END
