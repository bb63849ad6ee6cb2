// SPDX-License-Identifier: Apache-2.0
// The run identity of a checkpoint root: which training run its checkpoints belong to, so that
// a durable prefix two jobs share is noticed (docs/object-store.md, "Run identity").
//
//   ROOT/.run    "run 3f9c0e1a7b2d4c68\nsince 2026-12-02T01:15:21.551Z\n"
//
// A run identity is 1..64 of [A-Za-z0-9_-], drawn at random when a fresh root gets its first
// writer with an object-store durable tier, and kept in the local root for as long as that
// root lives: every resume of the job from it (the local tier, or the object store restored
// into it) is the same run. The object-store tier records it in each tier manifest and in
// `latest`, and takes a writer lease for it (store/object/object_lease.hpp). A job resumed on a new
// local root (a lost node) has no identity of its own until it adopts the store's
// (store/tiers.hpp: a resume that restores another run's checkpoint is refused unless told to
// adopt it, and adopting writes that run's identity here).
//
// ROOT/.run is neither a checkpoint nor a temporary: listing, rotation and prune ignore it,
// as they do ROOT/.lock. It is written as `latest` is: a temporary, fsync, rename, fsync of
// ROOT, under the root's writer lock.
#pragma once

#include "ckpt/core/export.hpp"

#include <optional>
#include <string>
#include <string_view>

#include "ckpt/fs/file_system.hpp"
#include "ckpt/store/root_lock.hpp"

CKPT_API_BEGIN
namespace ckpt {

inline constexpr std::string_view kRunIdentityName = ".run";

/// 16 random hex digits (std::random_device): a new run identity, and the other identifiers
/// the object-store tier draws (a commit attempt's data prefix, a lease holder).
std::string random_id();
/// True if `id` is 1..64 of [A-Za-z0-9_-]: a run identity, or one of the identifiers above.
bool is_valid_id(std::string_view id) noexcept;

/// ROOT/.run's identity, or nullopt if the root (or the file) does not exist. Takes no lock.
/// Errc::malformed_manifest naming the file if it holds no valid `run` line.
std::optional<std::string> read_run_identity(FileSystem& fs, const std::string& root);
/// Makes `run` the root's identity (replacing any), durably, under `lock` (the root's).
/// Errc::invalid_argument for an invalid identity; the file system's errors.
void write_run_identity(FileSystem& fs, const RootLock& lock, const std::string& run);
/// The root's identity; a fresh root (none yet) gets a random one, written. Under `lock`.
std::string establish_run_identity(FileSystem& fs, const RootLock& lock);

}  // namespace ckpt
CKPT_API_END
