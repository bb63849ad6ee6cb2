// SPDX-License-Identifier: Apache-2.0
// The memory store: checkpoint generations held in shared memory (tmpfs), so that a process
// that crashes and is restarted on the same node finds its state without reading a disk.
//
// A root `mem://NAME` is the directory MEMDIR/ckpt-UID/NAME, where MEMDIR is $CKPT_MEMORY_DIR
// or /dev/shm and UID the effective user's id. It holds what a directory root holds (or, with
// a node layout, what a node set holds: MEMDIR/ckpt-UID/NAME/node-n), under the same commit
// protocol (store/local/commit.hpp): a generation's shards are written into a temporary, the
// manifest (with every chunk's XXH3 and every shard's SHA-256) goes in last, one rename
// publishes it and `latest` moves to it; the previous generation stays until then, so a kill
// at any point leaves the previous generation or the new one, whole. What differs from a
// disk root:
//   - nothing is fsynced (fs/file_system.hpp's in_memory_dir): shared memory has nothing to
//     be made durable on, and a generation survives the process, not the machine;
//   - only the job's user reaches it: MEMDIR/ckpt-UID and NAME are directories of mode 0700
//     owned by that user, files are 0600; a directory owned by another user, open to others,
//     or a symlink is refused (Errc::unsafe_path) before anything in it is read or written;
//   - its size is bounded (StoreOptions::memory_limit): a generation is committed only if two
//     of its size (the previous one is kept until the new one is whole) fit in the bound.
// A root held by another live writer is refused with Errc::busy, as a directory's is.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <string>
#include <string_view>

#include "ckpt/fs/file_system.hpp"  // memory_user_dir, in_memory_dir

CKPT_API_BEGIN
namespace ckpt {

/// Whether `root` is a memory root ("mem://...").
bool is_memory_root(std::string_view root) noexcept;

/// The name of memory root `root` ("mem://NAME" -> "NAME"). Errc::invalid_argument unless NAME
/// is 1..64 of [A-Za-z0-9._-] not starting with '.'.
std::string memory_root_name(std::string_view root);

/// The directory memory root `root` resolves to (memory_user_dir() + "/" + its name).
std::string memory_root_dir(std::string_view root);

/// The directory a file-backed root's files are in: a memory root's memory_root_dir, any
/// other root as it is.
std::string root_directory(std::string_view root);

/// Checks that `dir` (the user's memory directory or a root's) is a directory owned by this
/// user and reachable by nobody else: Errc::unsafe_path naming it, with the owner and mode
/// expected and found, for a symlink, another file type, another owner, or group or other
/// permission bits. A missing `dir` passes (nothing to refuse yet).
void check_private_dir(const std::string& dir);

/// The bytes a memory store must be allowed to hold to keep two generations of `generation`
/// bytes each (shards and redundancy blocks): 2 x generation.
constexpr std::uint64_t memory_needed(std::uint64_t generation) noexcept { return 2 * generation; }

}  // namespace ckpt
CKPT_API_END
