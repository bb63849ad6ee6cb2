// SPDX-License-Identifier: Apache-2.0
// Two storage tiers: a fast local root that the checkpointer commits to, and a durable root
// (a directory standing for shared storage or an object store) that committed checkpoints are
// copied to. This file is the I/O of it: one checkpoint copied with the durable tier's own
// commit, the record of the copy, and opening the newest checkpoint of the two tiers for a
// resume. The background replication (a thread, "latest wins", retries) is
// runtime/tiering.hpp.
//
// A copy follows the commit protocol of store/local/commit.hpp in the durable root, holding its writer
// lock (store/root_lock.hpp) throughout: prepare_root (which removes the temporaries of a
// failed earlier copy), begin_checkpoint, every shard streamed
// from the local checkpoint into the temporary directory (each chunk's XXH3 checked against
// the source manifest on the way; SHA-256 only with Verify::full), fsync, then tier.json (the
// copy record), then commit_checkpoint with the source manifest (manifest, renames, fsyncs,
// `latest`). A copy that fails leaves no temporary behind and never touches the local root.
//
//   ROOT-DURABLE/latest
//   ROOT-DURABLE/step-0000000010/manifest.json      the source's manifest (same checksums)
//   ROOT-DURABLE/step-0000000010/rank-*.safetensors
//   ROOT-DURABLE/step-0000000010/tier.json          the copy record (below)
//
// tier.json is a file the manifest does not list: the reader and `ckpt verify` ignore it, so
// the durable checkpoint opens, verifies and resumes exactly as the local one.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <string>
#include <string_view>

#include "ckpt/store/copy.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/objstore/object_store.hpp"
#include "ckpt/read/reader.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// Copies the committed checkpoint `src_root`/step-N to `dst_root` (created if missing) with
/// the durable commit, then writes nothing else: rotation of the durable root is the caller's.
/// Checks every chunk per `verify` while streaming (one read of the source, never a second
/// pass). Throws the source's open/verify errors (Errc::checksum_mismatch naming the source
/// file and chunk, missing_shard, ...), the durable file system's errors (io_error, no_space),
/// Errc::busy if another writer holds the durable root's lock, or invalid_argument if the
/// durable root already holds a committed step-N or (unless `begin` allows it) its `latest`
/// names step N or a later one. On any failure the durable temporary is removed and `latest`
/// there is untouched.
CopyRecord copy_checkpoint(FileSystem& src_fs, const std::string& src_root, std::uint64_t step, FileSystem& dst_fs,
                           const std::string& dst_root, Verify verify = Verify::fast, const BeginOptions& begin = {});


/// Which tier a resume used, and why the local tier was passed over.
struct TieredCheckpoint {
  OpenedCheckpoint opened;
  std::string tier;         ///< "local" or "durable"
  std::string local_error;  ///< when tier is "durable": the local tier's error (missing, corrupt, ...)
  std::string adopted_run;  ///< an object store's checkpoint of another run was restored with adopt_run: that run
  bool restored = false;    ///< the durable checkpoint was restored into the local root (an object store's), not read in place
};

/// Whether a resume-or-start may start fresh in `root`: what in it may be a committed
/// checkpoint, or nullopt if nothing is (an empty root). Per kind of root, as its commit
/// protocol defines "committed" (docs/commit-protocol.md, "What counts as an empty root"):
///   - a directory: its `latest` (whatever it holds: one that does not open is the resume's
///     error to report, never a reason to start over); step directories without one were
///     never committed and the next writer removes them;
///   - a node set (DIR/node-n): any node root's `latest`, or else a step renamed into place
///     on every node root that holds checkpoints (newest_node_checkpoint: committed, though
///     no `latest` names it yet; the next writer's prepare_node_roots moves every `latest`
///     to it).
/// Returns what says so ("ROOT/latest", "ROOT/node-1/latest", "ROOT/node-*/step-N (...)").
/// A missing root is an empty one. Reads only; throws the file system's errors.
std::optional<std::string> find_committed_checkpoint(FileSystem& fs, const std::string& root);
/// The same for an object store, whose commit point is the tier manifest: its `latest`, or
/// else its newest committed step (a crash between a first commit's tier manifest and its
/// `latest` leaves committed steps and no `latest`). Throws the store's errors (a missing
/// bucket is Errc::invalid_argument naming it, never "empty").
std::optional<std::string> find_committed_checkpoint(ObjectStore& store);

/// Opens the newest checkpoint for a resume: the one the local `latest` names if it opens and
/// verifies (options.verify; Verify::none still checks the manifest and file sizes), else the
/// durable tier's (opened the same way, and with options.fallback also its older ones), else
/// (with options.fallback) an older local one. A world-size mismatch is thrown at once, as
/// open_latest does. When nothing opens: Errc::not_found naming both tiers' errors.
TieredCheckpoint open_latest_tiered(FileSystem& local_fs, const std::string& local_root, FileSystem& durable_fs,
                                    const std::string& durable_root, const OpenLatestOptions& options = {});

/// The same with an object store as the durable tier (store/object/object_commit.hpp's layout): the
/// local `latest` if it opens and verifies; else the step the store's `latest` names (with
/// options.fallback, then its other committed steps, newest first; without a `latest`, every
/// committed step, newest first, until one restores: what --resume and a resume-or-start
/// take alike) is restored into the local root (restore_from_object_store: verified, durable,
/// committed there, `latest` moved to it; a damaged local copy of that step is set aside as a
/// temporary first, with a log line, and removed by the restore's prepare_root), then opened
/// from there; tier is "durable" and opened.note says what was restored from where.
/// A checkpoint on the store committed by another run than the local root's
/// (store/run_identity.hpp; a local root without one counts as another) is refused with
/// Errc::conflict naming both runs, unless `adopt_run`: then it is restored and its run
/// becomes the local root's (adopted_run says which). One that records no run (a store
/// written before run identities) is restored either way. Nothing is restored while the
/// store's writer lease is held, unexpired, by another run than the local root's
/// (store/object/object_lease.hpp): Errc::busy naming its holder. A world-size mismatch, a run refusal
/// and busy (the store's lease, or the local root's lock) are thrown at once. When nothing
/// opens: Errc::not_found naming both tiers' errors.
TieredCheckpoint open_latest_tiered(FileSystem& local_fs, const std::string& local_root, ObjectStore& durable,
                                    const OpenLatestOptions& options = {}, bool adopt_run = false);

/// Either of the above for a durable root of any kind (open_store's: a directory, read in
/// place; s3://bucket/prefix, restored into the local root; `durable_fs` for the former, the
/// S3 client open_store makes for the latter, with the environment's endpoint and keys).
TieredCheckpoint open_latest_tiered(FileSystem& local_fs, const std::string& local_root, FileSystem& durable_fs,
                                    const std::string& durable_root, const OpenLatestOptions& options, bool adopt_run);

}  // namespace ckpt
CKPT_API_END
