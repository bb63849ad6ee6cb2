// SPDX-License-Identifier: Apache-2.0
// The recovery planner: which checkpoint a restarted job resumes from, across the levels that
// hold its checkpoints, and how it is fetched.
//
// A job keeps its checkpoints on several levels, cheapest to read first: its memory
// (mem://NAME, store/memory/memory.hpp; a node set there when its ranks are grouped into
// nodes), a local disk (a directory or node roots) and a durable tier (a directory or
// s3://bucket/prefix). plan_recovery surveys every level given and picks the newest step that
// is complete (or that the level's redundancy rebuilds), fetched the cheapest way: from the
// first level, in the order given, that holds it usable. Each newer candidate passed over is
// kept with the reason, so that a resume can say in one line what it used and why.
//
// The survey reads manifests, directory entries and file sizes (CheckpointStore::describe; a
// node set's health by sizes), never the shards' bytes unless RecoveryOptions::verify asks:
// a plan costs milliseconds, and the load that follows verifies every chunk as it lands.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/read/reader.hpp"
#include "ckpt/store/store.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// How a candidate's checkpoint would be fetched.
enum class RecoveryFetch {
  read,     ///< read in place: every file is there
  rebuild,  ///< files are missing or damaged on some nodes, and the level's redundancy (the
            ///< other nodes' parity or replicas) rebuilds them first (StoreWriter::repair)
  restore,  ///< copied from an object store into the first local level, then read
};
/// "read", "rebuild", "restore".
std::string_view recovery_fetch_name(RecoveryFetch fetch) noexcept;

/// One level's view of one step.
struct RecoveryCandidate {
  std::size_t level = 0;  ///< index into the roots plan_recovery was given
  std::string root;
  StoreKind kind = StoreKind::directory;
  std::uint64_t step = 0;
  RecoveryFetch fetch = RecoveryFetch::read;
  std::uint64_t bytes = 0;      ///< the shards' bytes
  std::string passed_over;      ///< empty: usable; else why not (the typed error's message)
  bool usable() const noexcept { return passed_over.empty(); }
};

/// A level that could not be surveyed at all (a missing or hostile root, an unreachable
/// object store): its root and why.
struct RecoveryLevelError {
  std::size_t level = 0;
  std::string root;
  std::string error;
  Errc code = Errc::io_error;
};

struct RecoveryOptions {
  /// A step saved at another world size is passed over (Errc::invalid_argument) unless unset.
  std::optional<int> expected_world_size;
  /// What the survey checks of a candidate before taking it: Verify::none reads manifests,
  /// entries and sizes; fast also every chunk's XXH3 (reading the shards once); full the
  /// files' SHA-256 too.
  Verify verify = Verify::none;
  /// The file system directories, node sets and memory roots are read through (default:
  /// POSIX). Under MPI, the Checkpointer's (Checkpointer::file_system()), which reaches the
  /// other nodes' roots through their processes.
  FileSystem* fs = nullptr;
};

struct RecoveryPlan {
  /// The candidate to resume from; nullopt when no level holds a usable checkpoint.
  std::optional<RecoveryCandidate> chosen;
  /// Every candidate surveyed before the chosen one (newer steps, or cheaper levels of the
  /// same step), newest step first and cheapest level first, then the chosen one.
  std::vector<RecoveryCandidate> candidates;
  std::vector<RecoveryLevelError> level_errors;
  std::vector<std::string> roots;       ///< the levels, as given
  std::chrono::nanoseconds discover{};  ///< the survey's time
  /// One line: "step 30 from memory mem://run (read in place); passed over: step 31 on
  /// memory mem://run: ...", or "nothing to recover: ...".
  std::string summary() const;
};

/// What recover_planned did, and the checkpoint it opened.
struct Recovered {
  CheckpointReader reader;
  RecoveryCandidate from;           ///< the plan's chosen candidate
  std::chrono::nanoseconds fetch{};    ///< an object store's checkpoint restored into `restore_into`
  std::chrono::nanoseconds rebuild{};  ///< the level's lost files rebuilt (StoreWriter::repair of the step)
  std::chrono::nanoseconds verify{};   ///< the open: the manifest decoded and checked, every shard's size
};

/// Carries out `plan` (plan_recovery's, over the same file system `options.fs`): a rebuild
/// through the chosen level's writer (its lock, as any writer; StoreWriter::repair of that
/// step), or a restore of an object store's checkpoint into the directory root
/// `restore_into` (copy_checkpoint, each chunk checked), then opens the step, expecting
/// `options.expected_world_size`. Errc::not_found naming the plan's summary when it chose
/// nothing; Errc::invalid_argument for a restore without `restore_into`; the typed errors of
/// the rebuild, the copy and the open.
Recovered recover_planned(const RecoveryPlan& plan, const RecoveryOptions& options = {}, const std::string& restore_into = {});

/// The words for a level of kind `kind`: "memory", "disk", "node roots", "object store".
std::string_view recovery_level_name(StoreKind kind) noexcept;

/// Surveys `roots` (cheapest level first) and plans the recovery (the file comment). Never
/// writes. Errc::invalid_argument for no roots; a level that cannot be read is a
/// RecoveryLevelError, not a throw.
RecoveryPlan plan_recovery(const std::vector<std::string>& roots, const RecoveryOptions& options = {});

}  // namespace ckpt
CKPT_API_END
