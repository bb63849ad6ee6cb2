// SPDX-License-Identifier: Apache-2.0
// The small file-system interface every ckpt write and read goes through, so that a
// fault-injecting wrapper (testing/fault_injection.hpp) can fail the n-th write, shorten a write, fail
// an fsync or stop the commit sequence at any step, for both the synchronous and the
// asynchronous writers. Every method states its contract; every failure is a ckpt::Error
// (Errc::io_error or Errc::no_space with errno, naming the file).
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

CKPT_API_BEGIN
namespace ckpt {

/// A file open for writing. Not thread-safe unless stated; one writer per file.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  /// Writes all of `data` at `offset`, retrying short writes and EINTR. With O_DIRECT the
  /// caller passes 4096-aligned offset, address and length. Thread-safe for disjoint ranges.
  virtual void write_at(std::uint64_t offset, std::span<const std::byte> data) = 0;
  /// Reserves `size` bytes on disk (fallocate), so later writes do not allocate blocks.
  virtual void allocate(std::uint64_t size) = 0;
  /// Sets the file length (used after an O_DIRECT write padded to the block size).
  virtual void truncate(std::uint64_t size) = 0;
  /// Makes all data written so far durable (fsync). Returns only once it is.
  virtual void sync() = 0;
  /// Closes the descriptor; errors of close are reported. Idempotent.
  virtual void close() = 0;
  /// The raw descriptor, for writers that drive it themselves (io_uring); -1 if none.
  virtual int native_handle() const noexcept = 0;
  /// Called by a writer that drives native_handle() itself, before each write it submits of
  /// `len` bytes at `offset`, so that what a file does to write_at (a fault-injecting file
  /// failing the n-th write, a crash stopping every write) reaches that writer too. Returns
  /// how many bytes of the write may go to the file: all of them (`len`, the default), or
  /// fewer, after which the writer fails the write with Errc::io_error (EIO), as a short
  /// write that ends in an error does. Throws the write's error to fail it before any byte
  /// moves. Thread-safe for disjoint ranges, like write_at.
  virtual std::size_t before_native_write(std::uint64_t offset, std::size_t len) {
    (void)offset;
    return len;
  }
  virtual bool is_direct() const noexcept = 0;
  /// For a file opened with O_DIRECT whose writes the file system refuses although it took
  /// the open (EINVAL from FUSE file systems: s3fs, gcsfuse, JuiceFS, blobfuse): opens the
  /// same file again without O_DIRECT and writes through that descriptor from now on
  /// (native_handle() changes, is_direct() becomes false); returns true. False where there
  /// is nothing to reopen (a buffered file, one without a descriptor). Throws
  /// Errc::io_error if the reopen fails or finds another file under the path. Not while
  /// writes are in flight. The writers call it on an EINVAL of a direct write and write
  /// the data again (runtime/write_backends.cpp).
  virtual bool reopen_buffered() { return false; }
  virtual const std::string& path() const noexcept = 0;
};

/// A file open for reading, never through a symlink.
class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  virtual std::uint64_t size() const = 0;
  /// Reads exactly data.size() bytes at `offset`; a short file is Errc::size_mismatch.
  virtual void read_at(std::uint64_t offset, std::span<std::byte> data) const = 0;
  virtual const std::string& path() const noexcept = 0;
};

enum class EntryType { file, directory, symlink, other };

struct DirEntry {
  std::string name;
  EntryType type;
};

struct FileStat {
  EntryType type;
  std::uint64_t size;
  /// The file's identity, where the file system offers one (0 where it does not): st_dev,
  /// st_ino and st_mtim in nanoseconds on POSIX; the in-memory file system numbers its
  /// files and their versions. The reader's manifest cache keys on it (reader.cpp), and
  /// caches nothing for a file whose inode is 0.
  std::uint64_t device = 0;
  std::uint64_t inode = 0;
  std::int64_t mtime_ns = 0;
};

/// An advisory lock taken by FileSystem::try_lock; released when destroyed (or when the
/// process dies: the kernel drops it). Not copyable; one owner.
class FileLock {
 public:
  virtual ~FileLock() = default;
};

struct WriteOptions {
  bool direct = false;  ///< try O_DIRECT; falls back to buffered where the file system refuses
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  /// Creates a new file (fails if it exists: O_EXCL), mode 0644 (0600 in_memory_dir).
  virtual std::unique_ptr<WritableFile> create(const std::string& path, const WriteOptions& opts) = 0;
  /// Opens an existing regular file; a symlink is Errc::unsafe_path, absence Errc::not_found.
  virtual std::unique_ptr<ReadableFile> open_read(const std::string& path) = 0;
  /// Creates one directory (mode 0755; 0700 in_memory_dir); fails if it exists.
  virtual void create_dir(const std::string& path) = 0;
  /// Creates a directory and missing parents; no error if it exists.
  virtual void create_dirs(const std::string& path) = 0;
  /// fsync of a directory: makes the entries created, renamed or removed in it durable.
  virtual void sync_dir(const std::string& path) = 0;
  /// rename(2): atomic replacement within one file system.
  virtual void rename(const std::string& from, const std::string& to) = 0;
  /// Removes a file, or a directory with everything in it. No error if absent.
  virtual void remove_all(const std::string& path) = 0;
  /// Entries of a directory (not "." and ".."), sorted by name.
  virtual std::vector<DirEntry> list_dir(const std::string& path) = 0;
  /// lstat: nullopt when absent.
  virtual std::optional<FileStat> stat(const std::string& path) = 0;
  /// Takes an exclusive lock on the regular file `path` without waiting, creating the file
  /// (mode 0644) if it is missing; its parent directory must exist. POSIX: open with
  /// O_CREAT|O_CLOEXEC|O_NOFOLLOW, then flock(LOCK_EX|LOCK_NB): the lock belongs to that
  /// open file, so a second try_lock of the same file fails while the first is held, in this
  /// process as in any other. On success the file's content is replaced by `record` (who
  /// holds it) and the lock is returned; if someone else holds it, returns nullptr and
  /// leaves the file as it is. A symlink (or anything but a regular file) is
  /// Errc::unsafe_path; a file system without locks is Errc::io_error with errno ENOSYS,
  /// EOPNOTSUPP or ENOLCK. Never blocks on another holder.
  virtual std::unique_ptr<FileLock> try_lock(const std::string& path, std::string_view record) = 0;
  /// Bytes an unprivileged writer can still allocate on the file system holding `path`
  /// (statvfs: f_bavail x f_frsize), or nullopt when unknown (the default: file systems
  /// without a capacity, such as the in-memory one, and wrappers that do not forward it).
  /// The checkpointer's pre-save rotation runs only when this is known. Never throws.
  virtual std::optional<std::uint64_t> free_space(const std::string& path) noexcept {
    (void)path;
    return std::nullopt;
  }
};

/// A FileSystem that forwards every call to `target` (which must outlive it), so that a
/// wrapper (fault injection, timing, a test's race) overrides only the calls it changes.
class FileSystemWrapper : public FileSystem {
 public:
  explicit FileSystemWrapper(FileSystem& target) : target_(target) {}
  FileSystem& target() const noexcept { return target_; }

  std::unique_ptr<WritableFile> create(const std::string& path, const WriteOptions& opts) override { return target_.create(path, opts); }
  std::unique_ptr<ReadableFile> open_read(const std::string& path) override { return target_.open_read(path); }
  void create_dir(const std::string& path) override { target_.create_dir(path); }
  void create_dirs(const std::string& path) override { target_.create_dirs(path); }
  void sync_dir(const std::string& path) override { target_.sync_dir(path); }
  void rename(const std::string& from, const std::string& to) override { target_.rename(from, to); }
  void remove_all(const std::string& path) override { target_.remove_all(path); }
  std::vector<DirEntry> list_dir(const std::string& path) override { return target_.list_dir(path); }
  std::optional<FileStat> stat(const std::string& path) override { return target_.stat(path); }
  std::unique_ptr<FileLock> try_lock(const std::string& path, std::string_view record) override {
    return target_.try_lock(path, record);
  }
  std::optional<std::uint64_t> free_space(const std::string& path) noexcept override { return target_.free_space(path); }

 private:
  FileSystem& target_;
};

/// The real file system (POSIX calls). Thread-safe; the same object serves every caller.
FileSystem& posix_file_system();

/// The directory under which the memory roots of this user live (store/memory/memory.hpp):
/// $CKPT_MEMORY_DIR (or /dev/shm) + "/ckpt-UID", UID the effective user's id.
std::string memory_user_dir();
/// Whether `path` is memory_user_dir() or under it. There, posix_file_system() creates files
/// 0600 (locks too) and directories 0700, so that only the job's user reaches what a memory
/// root holds, and syncs nothing (WritableFile::sync and sync_dir return at once): shared
/// memory has no device to make a write durable on. Whoever writes there gets this, a
/// process serving another's file calls (fs/remote_file_system.hpp) included.
bool in_memory_dir(std::string_view path);

}  // namespace ckpt
CKPT_API_END
