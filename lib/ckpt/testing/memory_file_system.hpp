// SPDX-License-Identifier: Apache-2.0
// A FileSystem held entirely in memory: files, directories and symlinks in one tree, with the
// same contracts as the POSIX one (file_system.hpp) so that a test or a fuzzer runs the real
// save and load code without a disk. What it reproduces, because the loader's defences
// depend on it: create is O_EXCL; open_read refuses a symlink (Errc::unsafe_path) and reports
// absence as Errc::not_found; symlinks in the middle of a path are followed, relative to the
// directory holding the link or from the root when absolute ("..", loops: ELOOP after 40);
// rename replaces a file or an empty directory atomically and refuses to move a directory
// into itself; list_dir is sorted by name; an open file keeps its bytes after a rename or a
// removal (handles hold the inode, as on POSIX); try_lock locks a file node as flock locks an
// inode; stat reports an identity (FileStat::inode unique across all instances, mtime_ns a
// version that every change of a file's bytes moves on), so a cache keyed on it sees a
// rewritten file as a new one. What it leaves out: permissions, O_DIRECT (every file is buffered: is_direct() is
// false), durability (sync and sync_dir only check that their target exists;
// fault_injection.hpp models lost writes), hard links, other processes.
//
// Paths are '/'-separated; a relative path is taken from the root, so "a/b" and "/a/b" name
// the same file. Failures are the errors posix_file_system() raises for the same errno
// (Errc::io_error naming the path, Errc::not_found where the interface says so).
//
// Thread-safe: one mutex guards the tree and the contents of every file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/fs/file_system.hpp"

namespace ckpt::testing {

class MemoryFileSystem final : public FileSystem {
 public:
  MemoryFileSystem();
  ~MemoryFileSystem() override;
  MemoryFileSystem(MemoryFileSystem&&) noexcept;
  MemoryFileSystem& operator=(MemoryFileSystem&&) noexcept;
  MemoryFileSystem(const MemoryFileSystem&) = delete;
  MemoryFileSystem& operator=(const MemoryFileSystem&) = delete;

  /// A deep copy of the whole tree (files opened on this one stay attached to this one).
  MemoryFileSystem clone() const;

  // --- the FileSystem interface (contracts in file_system.hpp) ---
  std::unique_ptr<WritableFile> create(const std::string& path, const WriteOptions& opts) override;
  std::unique_ptr<ReadableFile> open_read(const std::string& path) override;
  void create_dir(const std::string& path) override;
  void create_dirs(const std::string& path) override;
  void sync_dir(const std::string& path) override;
  void rename(const std::string& from, const std::string& to) override;
  void remove_all(const std::string& path) override;
  std::vector<DirEntry> list_dir(const std::string& path) override;
  std::optional<FileStat> stat(const std::string& path) override;
  /// Locks are per file node (as flock is per inode): held until the FileLock is destroyed.
  std::unique_ptr<FileLock> try_lock(const std::string& path, std::string_view record) override;

  // --- helpers for tests and fuzzers: set up any tree, hostile ones included ---
  /// Creates or replaces the file at `path` (missing parent directories are created; a
  /// symlink or file of that name is replaced) with `bytes`.
  void put_file(const std::string& path, std::span<const std::byte> bytes);
  void put_file(const std::string& path, std::string_view bytes);
  /// Creates or replaces a symlink at `path` pointing to `target` (not resolved now).
  void put_symlink(const std::string& path, const std::string& target);
  /// Creates or replaces an entry that is neither file, directory nor symlink (a FIFO, say).
  void put_special(const std::string& path);
  /// The bytes of the regular file at `path` (no symlink followed in the last component),
  /// or nullopt if there is no such file.
  std::optional<std::vector<std::byte>> file_bytes(const std::string& path) const;
  /// The target of the symlink at `path`, or nullopt if it is not a symlink.
  std::optional<std::string> symlink_target(const std::string& path) const;
  /// Sum of the sizes of all regular files (what the tree holds in memory, roughly).
  std::uint64_t total_file_bytes() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ckpt::testing
