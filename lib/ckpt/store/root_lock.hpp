// SPDX-License-Identifier: Apache-2.0
// The writer lock of a checkpoint root: one writer at a time, enforced.
//
// Every writer of a root takes ROOT/.lock before it touches the root and holds it while it
// writes: the Checkpointer for its whole life (with ranks in several processes, only the
// process that runs the root's crash cleanup and the commits: rank 0's), the synchronous
// save_checkpoint, `ckpt prune`, `ckpt reshard` into the root, and each copy to and rotation
// of a durable tier. The lock is an exclusive, non-blocking flock on ROOT/.lock
// (FileSystem::try_lock), so a second writer fails at once with Errc::busy naming the root
// and the holder, and removes nothing; the kernel drops the lock of a writer that dies, so a
// crash never leaves the root locked. Readers (open_latest, list_checkpoints, `ckpt ls`,
// `inspect`, `verify`, `diff`) take no lock and keep working while a writer saves.
//
// The lock file holds who took it last, one "key value" line each:
//   pid 12345
//   host node7
//   program ckpt-demo
//   since 2025-01-01T12:00:00Z
// so that a refused writer can name the holder. The file stays after release (removing it
// would let a second writer lock a fresh file while a third still holds the old one); it is
// neither a checkpoint nor a temporary, and listing, rotation and prune ignore it. Do not
// delete it while a writer runs.
//
// What the lock cannot do (docs/commit-protocol.md, "The writer lock"): flock is advisory (a
// program that does not take it is not stopped); on NFS, Linux emulates flock with byte-range
// locks, which do exclude writers on other clients but are lost if the server or client
// loses its lease; some cluster file systems make flock local to each node or refuse it.
// A file system that refuses locks (ENOSYS, EOPNOTSUPP, ENOLCK) gets a lock that excludes
// nothing: the writer goes on as before this lock existed, with one log line saying so
// (exclusive() is then false).
#pragma once

#include "ckpt/core/export.hpp"

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/fs/file_system.hpp"

CKPT_API_BEGIN
namespace ckpt {

inline constexpr std::string_view kLockName = ".lock";

/// Who holds (or last held) a lock, as its lock file records it.
struct LockHolder {
  long pid = 0;          ///< 0: not recorded (the holder has not written its record yet)
  std::string host;      ///< gethostname()
  std::string program;   ///< the holder's program name
  std::string since;     ///< when it took the lock (UTC, RFC 3339)
  /// "pid 12345 (ckpt-demo) on host node7 since 2025-...Z", or "an unknown process".
  std::string describe() const;
};

/// This process's record, written into a lock file it takes.
std::string lock_record();
/// Parses a lock file's content; fields it does not find stay empty. Never throws.
LockHolder parse_lock_record(std::string_view text) noexcept;

class RootLock {
 public:
  /// Takes the writer lock of `root`: creates `root` (and missing parents) if needed, then
  /// locks ROOT/.lock without waiting. Throws Errc::busy if another writer (another process,
  /// or another RootLock in this one) holds it: "busy: ROOT: another writer holds its lock
  /// ROOT/.lock: expected no other writer, actual pid N (program) on host H since T" (if
  /// that pid has exited on this host, the holder is a program that writes no record, and the
  /// message says so). Throws the file system's errors otherwise (io_error, unsafe_path for
  /// a symlink at ROOT/.lock). Blocks only on the file system, never on the other writer.
  /// The descriptor is closed on exec (O_CLOEXEC): a program this process starts does not
  /// hold the lock, but a child forked without exec shares it while it lives.
  RootLock(FileSystem& fs, std::string root);

  RootLock(RootLock&& other) noexcept;
  RootLock& operator=(RootLock&& other) noexcept;
  RootLock(const RootLock&) = delete;
  RootLock& operator=(const RootLock&) = delete;
  /// Releases the lock.
  ~RootLock();

  /// The root this lock is for.
  const std::string& root() const noexcept { return root_; }
  const std::string& lock_path() const noexcept { return lock_path_; }
  /// True until release() or a move from this object.
  bool held() const noexcept { return held_; }
  /// False when the file system refused locks: held() but excluding nobody.
  bool exclusive() const noexcept { return lock_ != nullptr; }
  /// Releases the lock now; idempotent. Not thread-safe against other calls on this object.
  void release() noexcept;

 private:
  std::string root_, lock_path_;
  std::unique_ptr<FileLock> lock_;
  bool held_ = false;
};

/// The record in the lock file `lock_path` (e.g. ROOT/.lock), whether or not it is held now;
/// nullopt if there is none or it cannot be read. Takes no lock; never throws.
std::optional<LockHolder> read_lock_holder(FileSystem& fs, const std::string& lock_path) noexcept;

}  // namespace ckpt
CKPT_API_END
