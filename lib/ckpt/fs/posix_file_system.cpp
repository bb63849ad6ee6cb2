// SPDX-License-Identifier: Apache-2.0
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cerrno>
#include <filesystem>
#include <utility>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/posix_open.hpp"
#include "ckpt/fs/file_system.hpp"

namespace ckpt {

namespace {

// How the POSIX file system creates what it creates at a path, and whether it syncs there:
// under the memory directory (memory_user_dir) private and unsynced, elsewhere 0644 / 0755
// and synced.
struct PosixModes {
  mode_t file = 0644;
  mode_t dir = 0755;
  bool sync = true;
};
PosixModes modes_at(std::string_view path) {
  if (in_memory_dir(path)) return {.file = 0600, .dir = 0700, .sync = false};
  return {};
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path, bool direct, bool sync) : fd_(fd), path_(std::move(path)), direct_(direct), sync_(sync) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  void write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    while (!data.empty()) {
      const ssize_t n = ::pwrite(fd_, data.data(), data.size(), static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_errno(errno, "pwrite", path_);
      }
      if (n == 0) throw_errno(EIO, "pwrite (no progress)", path_);
      data = data.subspan(static_cast<std::size_t>(n));
      offset += static_cast<std::uint64_t>(n);
    }
  }
  void allocate(std::uint64_t size) override {
    if (size == 0) return;
    const int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(size));
    // File systems without fallocate support (EOPNOTSUPP) still work, only slower.
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) throw_errno(rc, "fallocate", path_);
  }
  void truncate(std::uint64_t size) override {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) throw_errno(errno, "ftruncate", path_);
  }
  void sync() override {
    if (sync_ && ::fsync(fd_) != 0) throw_errno(errno, "fsync", path_);
  }
  void close() override {
    if (fd_ < 0) return;
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0 && errno != EINTR) throw_errno(errno, "close", path_);
  }
  int native_handle() const noexcept override { return fd_; }
  bool is_direct() const noexcept override { return direct_; }
  bool reopen_buffered() override {
    if (!direct_ || fd_ < 0) return false;
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) throw_errno(errno, "reopen for buffered writes", path_);
    struct stat was {}, now {};
    if (::fstat(fd_, &was) != 0 || ::fstat(fd, &now) != 0 || was.st_dev != now.st_dev || was.st_ino != now.st_ino) {
      ::close(fd);
      throw Error(Errc::io_error, path_, "file replaced while it was reopened for buffered writes", "the file being written", "another file");
    }
    ::close(std::exchange(fd_, fd));
    direct_ = false;
    return true;
  }
  const std::string& path() const noexcept override { return path_; }

 private:
  int fd_;
  std::string path_;
  bool direct_;
  bool sync_;
};

}  // namespace

detail::OpenedFd detail::open_regular_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) throw Error(Errc::unsafe_path, path, "is a symlink", "regular file", "symlink");
    if (err == ENOENT) throw Error(Errc::not_found, path, "open failed: no such file", {}, {}, err);
    throw_errno(err, "open", path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw_errno(err, "fstat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(Errc::unsafe_path, path, "not a regular file", "regular file", "other file type");
  }
  return {fd, static_cast<std::uint64_t>(st.st_size)};
}

namespace {

class PosixReadableFile final : public ReadableFile {
 public:
  PosixReadableFile(int fd, std::string path, std::uint64_t size) : fd_(fd), path_(std::move(path)), size_(size) {}
  ~PosixReadableFile() override { ::close(fd_); }
  std::uint64_t size() const override { return size_; }
  void read_at(std::uint64_t offset, std::span<std::byte> data) const override {
    while (!data.empty()) {
      const ssize_t n = ::pread(fd_, data.data(), data.size(), static_cast<off_t>(offset));
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_errno(errno, "pread", path_);
      }
      if (n == 0)
        throw Error(Errc::size_mismatch, path_, "file ended early", "at least " + std::to_string(offset + data.size()) + " bytes",
                    std::to_string(offset) + " bytes");
      data = data.subspan(static_cast<std::size_t>(n));
      offset += static_cast<std::uint64_t>(n);
    }
  }
  const std::string& path() const noexcept override { return path_; }

 private:
  int fd_;
  std::string path_;
  std::uint64_t size_;
};

// Holds the descriptor an flock was taken on: closing it releases the lock.
class PosixFileLock final : public FileLock {
 public:
  explicit PosixFileLock(int fd) : fd_(fd) {}
  ~PosixFileLock() override { ::close(fd_); }

 private:
  int fd_;
};

EntryType type_of(mode_t m) {
  if (S_ISREG(m)) return EntryType::file;
  if (S_ISDIR(m)) return EntryType::directory;
  if (S_ISLNK(m)) return EntryType::symlink;
  return EntryType::other;
}

class PosixFileSystem final : public FileSystem {
 public:
  std::unique_ptr<WritableFile> create(const std::string& path, const WriteOptions& opts) override {
    const PosixModes modes = modes_at(path);
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW;
    int fd = -1;
    bool direct = false;
    if (opts.direct) {
      fd = ::open(path.c_str(), flags | O_DIRECT, modes.file);
      if (fd >= 0) direct = true;
      else if (errno != EINVAL) throw_errno(errno, "open", path);  // EINVAL: no O_DIRECT here (tmpfs)
    }
    if (fd < 0) fd = ::open(path.c_str(), flags, modes.file);
    if (fd < 0) throw_errno(errno, "open", path);
    return std::make_unique<PosixWritableFile>(fd, path, direct, modes.sync);
  }
  std::unique_ptr<ReadableFile> open_read(const std::string& path) override {
    const detail::OpenedFd f = detail::open_regular_file(path);
    return std::make_unique<PosixReadableFile>(f.fd, path, f.size);
  }
  void create_dir(const std::string& path) override {
    if (::mkdir(path.c_str(), modes_at(path).dir) != 0) throw_errno(errno, "mkdir", path);
  }
  void create_dirs(const std::string& path) override {
    if (const PosixModes modes = modes_at(path); modes.dir != 0755) {
      // Each missing directory made with this file system's mode (create_directories would
      // make them 0777 less the umask).
      std::string at;
      for (std::size_t from = 0; from <= path.size();) {
        const std::size_t slash = std::min(path.find('/', from), path.size());
        at = path.substr(0, slash);
        from = slash + 1;
        if (at.empty()) continue;
        if (::mkdir(at.c_str(), modes.dir) != 0 && errno != EEXIST) throw_errno(errno, "mkdir -p", at);
      }
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) throw_errno(errno, "mkdir -p", path);
      if (!S_ISDIR(st.st_mode)) throw_errno(ENOTDIR, "mkdir -p", path);
      return;
    }
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) throw_errno(ec.value(), "mkdir -p", path);
  }
  void sync_dir(const std::string& path) override {
    if (!modes_at(path).sync) return;
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) throw_errno(errno, "open directory", path);
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) throw_errno(err, "fsync directory", path);
  }
  void rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) throw_errno(errno, "rename to " + to, from);
  }
  void remove_all(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) throw_errno(ec.value(), "remove", path);
  }
  std::vector<DirEntry> list_dir(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (!d) {
      if (errno == ENOENT) throw Error(Errc::not_found, path, "no such directory", {}, {}, ENOENT);
      throw_errno(errno, "opendir", path);
    }
    std::vector<DirEntry> out;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat st {};
      if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // vanished meanwhile
      out.push_back({name, type_of(st.st_mode)});
    }
    ::closedir(d);
    std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) { return a.name < b.name; });
    return out;
  }
  std::optional<FileStat> stat(const std::string& path) override {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
      throw_errno(errno, "lstat", path);
    }
    return FileStat{.type = type_of(st.st_mode),
                    .size = static_cast<std::uint64_t>(st.st_size),
                    .device = static_cast<std::uint64_t>(st.st_dev),
                    .inode = static_cast<std::uint64_t>(st.st_ino),
                    .mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
  }
  std::unique_ptr<FileLock> try_lock(const std::string& path, std::string_view record) override {
    // O_NONBLOCK: a FIFO planted under the lock's name must not hang the open.
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, modes_at(path).file);
    if (fd < 0) {
      const int err = errno;
      if (err == ELOOP) throw Error(Errc::unsafe_path, path, "lock file is a symlink", "regular file", "symlink");
      if (err == EISDIR) throw Error(Errc::unsafe_path, path, "lock file is a directory", "regular file", "directory");
      throw_errno(err, "open", path);
    }
    auto fail = [&](int err, std::string_view action) {
      ::close(fd);
      throw_errno(err, action, path);
    };
    struct stat st {};
    if (::fstat(fd, &st) != 0) fail(errno, "fstat");
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      throw Error(Errc::unsafe_path, path, "lock file is not a regular file", "regular file", "other file type");
    }
    int rc;
    do rc = ::flock(fd, LOCK_EX | LOCK_NB);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      if (errno == EWOULDBLOCK) {
        ::close(fd);
        return nullptr;
      }
      fail(errno, "flock");
    }
    if (::ftruncate(fd, 0) != 0) fail(errno, "ftruncate");
    for (std::size_t done = 0; done < record.size();) {
      const ssize_t n = ::pwrite(fd, record.data() + done, record.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail(n < 0 ? errno : EIO, "pwrite");
      done += static_cast<std::size_t>(n);
    }
    return std::make_unique<PosixFileLock>(fd);
  }

  std::optional<std::uint64_t> free_space(const std::string& path) noexcept override {
    struct statvfs sv {};
    if (::statvfs(path.c_str(), &sv) != 0) return std::nullopt;
    return static_cast<std::uint64_t>(sv.f_bavail) * static_cast<std::uint64_t>(sv.f_frsize);
  }
};

}  // namespace

FileSystem& posix_file_system() {
  static PosixFileSystem fs;
  return fs;
}

std::string memory_user_dir() {
  const char* base = std::getenv("CKPT_MEMORY_DIR");
  std::string dir = base && *base ? base : "/dev/shm";
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir + "/ckpt-" + std::to_string(::geteuid());
}

bool in_memory_dir(std::string_view path) {
  const std::string dir = memory_user_dir();
  return path.starts_with(dir) && (path.size() == dir.size() || path[dir.size()] == '/');
}

}  // namespace ckpt
