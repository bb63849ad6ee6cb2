// SPDX-License-Identifier: Apache-2.0
// ckpt-test-fuse: a FUSE file system for the tests that mirrors a directory, as many FUSE file
// systems in production do (s3fs, gcsfuse, JuiceFS, blobfuse, LazyFS), and treats O_DIRECT the
// way they do:
//
//   ckpt-test-fuse MODE SOURCE MOUNTPOINT [FROM]   (foreground; SIGTERM / fusermount3 -u ends it)
//
//   refuse-direct-io     O_DIRECT opens succeed; every read and write of a file opened with
//                        O_DIRECT fails with EINVAL (the reported failure)
//   short-direct-reads   reads of a file opened with O_DIRECT return 512 bytes fewer than the
//                        file holds there (short of what was asked and of the file's end: the
//                        caller's next read would start off a block boundary), and refuse an
//                        offset off a 4096 boundary with EINVAL
//   refuse-direct-open   an open or create with O_DIRECT fails with EINVAL before anything is
//                        created (tmpfs before Linux 6.6)
//
// With FROM, O_DIRECT reads and writes that start before byte FROM of a file go through, as a
// file system whose refusal depends on where the request lands: a load then meets the refusal
// in the middle of a file. Files are opened buffered underneath in every mode; only what the
// caller asked for differs.
// Caches are off (timeouts 0), so changes made through SOURCE show at once. Exits 77 when the
// kernel refuses the mount (no /dev/fuse, no permission): the tests skip then.
#define FUSE_USE_VERSION 31
#include <dirent.h>
#include <fcntl.h>
#include <fuse.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

enum class Mode { refuse_direct_io, short_direct_reads, refuse_direct_open };

Mode g_mode = Mode::refuse_direct_io;
int g_src = -1;        // the mirrored directory
off_t g_from = 0;      // O_DIRECT requests from this byte on are treated as the mode says

// fh: the descriptor underneath, and bit 32 set when the caller opened with O_DIRECT.
constexpr std::uint64_t kDirect = 1ull << 32;
int fd_of(const fuse_file_info* fi) { return static_cast<int>(fi->fh & 0xffffffffu); }
bool direct_of(const fuse_file_info* fi) { return (fi->fh & kDirect) != 0; }

// The path below SOURCE: "/a/b" -> "a/b", "/" -> ".".
const char* rel(const char* path) { return path[1] ? path + 1 : "."; }

int err(int rc) { return rc < 0 ? -errno : rc; }

void* fs_init(fuse_conn_info*, fuse_config* cfg) {
  cfg->use_ino = 1;
  cfg->entry_timeout = cfg->attr_timeout = cfg->negative_timeout = 0;
  cfg->direct_io = 0;  // the kernel's own O_DIRECT path: the daemon sees the caller's requests
  return nullptr;
}

int fs_getattr(const char* path, struct stat* st, fuse_file_info* fi) {
  if (fi) return err(::fstat(fd_of(fi), st));
  return err(::fstatat(g_src, rel(path), st, AT_SYMLINK_NOFOLLOW));
}

int fs_readlink(const char* path, char* buf, size_t size) {
  const ssize_t n = ::readlinkat(g_src, rel(path), buf, size - 1);
  if (n < 0) return -errno;
  buf[n] = '\0';
  return 0;
}

int fs_mkdir(const char* path, mode_t mode) { return err(::mkdirat(g_src, rel(path), mode)); }
int fs_unlink(const char* path) { return err(::unlinkat(g_src, rel(path), 0)); }
int fs_rmdir(const char* path) { return err(::unlinkat(g_src, rel(path), AT_REMOVEDIR)); }
int fs_symlink(const char* target, const char* path) { return err(::symlinkat(target, g_src, rel(path))); }
int fs_rename(const char* from, const char* to, unsigned int flags) { return err(::renameat2(g_src, rel(from), g_src, rel(to), flags)); }
int fs_chmod(const char* path, mode_t mode, fuse_file_info* fi) {
  if (fi) return err(::fchmod(fd_of(fi), mode));
  return err(::fchmodat(g_src, rel(path), mode, 0));
}
int fs_utimens(const char* path, const struct timespec tv[2], fuse_file_info* fi) {
  if (fi) return err(::futimens(fd_of(fi), tv));
  return err(::utimensat(g_src, rel(path), tv, AT_SYMLINK_NOFOLLOW));
}

int fs_truncate(const char* path, off_t size, fuse_file_info* fi) {
  if (fi) return err(::ftruncate(fd_of(fi), size));
  const int fd = ::openat(g_src, rel(path), O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return -errno;
  const int rc = err(::ftruncate(fd, size));
  ::close(fd);
  return rc;
}

// Opens underneath without O_DIRECT, and remembers whether the caller asked for it.
int open_file(const char* path, fuse_file_info* fi, bool create, mode_t mode) {
  const bool direct = (fi->flags & O_DIRECT) != 0;
  if (direct && g_mode == Mode::refuse_direct_open) return -EINVAL;
  const int flags = (fi->flags & ~O_DIRECT) | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0);
  const int fd = ::openat(g_src, rel(path), flags, mode);
  if (fd < 0) return -errno;
  fi->fh = static_cast<std::uint64_t>(fd) | (direct ? kDirect : 0);
  return 0;
}

int fs_open(const char* path, fuse_file_info* fi) { return open_file(path, fi, false, 0); }
int fs_create(const char* path, mode_t mode, fuse_file_info* fi) { return open_file(path, fi, true, mode); }

int fs_read(const char*, char* buf, size_t size, off_t off, fuse_file_info* fi) {
  const bool treated = direct_of(fi) && off >= g_from;
  if (treated && g_mode == Mode::refuse_direct_io) return -EINVAL;
  if (treated && g_mode == Mode::short_direct_reads && off % 4096 != 0) return -EINVAL;
  ssize_t n = ::pread(fd_of(fi), buf, size, off);
  if (n < 0) return -errno;
  if (treated && g_mode == Mode::short_direct_reads && n > 512) n -= 512;  // short of the file's end too
  return static_cast<int>(n);
}

int fs_write(const char*, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  if (direct_of(fi) && off >= g_from && g_mode == Mode::refuse_direct_io) return -EINVAL;
  const ssize_t n = ::pwrite(fd_of(fi), buf, size, off);
  return n < 0 ? -errno : static_cast<int>(n);
}

int fs_statfs(const char*, struct statvfs* sv) { return err(::fstatvfs(g_src, sv)); }

int fs_flush(const char*, fuse_file_info* fi) {
  // close(dup()): reports what close would (a file system that writes back on close).
  const int fd = ::dup(fd_of(fi));
  return fd < 0 ? -errno : err(::close(fd));
}

int fs_release(const char*, fuse_file_info* fi) {
  ::close(fd_of(fi));
  return 0;
}

int fs_fsync(const char*, int datasync, fuse_file_info* fi) { return err(datasync ? ::fdatasync(fd_of(fi)) : ::fsync(fd_of(fi))); }

int fs_fallocate(const char*, int mode, off_t off, off_t len, fuse_file_info* fi) {
  if (mode != 0) return -EOPNOTSUPP;
  return -::posix_fallocate(fd_of(fi), off, len);
}

int fs_opendir(const char* path, fuse_file_info* fi) {
  const int fd = ::openat(g_src, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  fi->fh = static_cast<std::uint64_t>(fd);
  return 0;
}

int fs_readdir(const char*, void* buf, fuse_fill_dir_t fill, off_t, fuse_file_info* fi, fuse_readdir_flags) {
  const int fd = ::dup(fd_of(fi));
  if (fd < 0) return -errno;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return -errno;
  }
  ::rewinddir(d);
  while (const dirent* e = ::readdir(d)) {
    struct stat st {};
    st.st_ino = e->d_ino;
    st.st_mode = static_cast<mode_t>(DTTOIF(e->d_type));
    if (fill(buf, e->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0))) break;
  }
  ::closedir(d);
  return 0;
}

int fs_releasedir(const char*, fuse_file_info* fi) {
  ::close(fd_of(fi));
  return 0;
}

int fs_fsyncdir(const char*, int, fuse_file_info* fi) { return err(::fsync(fd_of(fi))); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s refuse-direct-io|short-direct-reads|refuse-direct-open SOURCE MOUNTPOINT [FROM]\n", argv[0]);
    return 2;
  }
  if (argc == 5) g_from = static_cast<off_t>(std::strtoull(argv[4], nullptr, 10));
  const std::string mode = argv[1];
  if (mode == "refuse-direct-io") g_mode = Mode::refuse_direct_io;
  else if (mode == "short-direct-reads") g_mode = Mode::short_direct_reads;
  else if (mode == "refuse-direct-open") g_mode = Mode::refuse_direct_open;
  else {
    std::fprintf(stderr, "ckpt-test-fuse: unknown mode '%s'\n", argv[1]);
    return 2;
  }
  g_src = ::open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (g_src < 0) {
    std::fprintf(stderr, "ckpt-test-fuse: %s: %s\n", argv[2], std::strerror(errno));
    return 2;
  }
  struct stat st {};
  if (::stat(argv[3], &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "ckpt-test-fuse: mount point %s is not a directory\n", argv[3]);
    return 2;
  }

  fuse_operations ops{};
  ops.init = fs_init;
  ops.getattr = fs_getattr;
  ops.readlink = fs_readlink;
  ops.mkdir = fs_mkdir;
  ops.unlink = fs_unlink;
  ops.rmdir = fs_rmdir;
  ops.symlink = fs_symlink;
  ops.rename = fs_rename;
  ops.chmod = fs_chmod;
  ops.utimens = fs_utimens;
  ops.truncate = fs_truncate;
  ops.open = fs_open;
  ops.create = fs_create;
  ops.read = fs_read;
  ops.write = fs_write;
  ops.statfs = fs_statfs;
  ops.flush = fs_flush;
  ops.release = fs_release;
  ops.fsync = fs_fsync;
  ops.fallocate = fs_fallocate;
  ops.opendir = fs_opendir;
  ops.readdir = fs_readdir;
  ops.releasedir = fs_releasedir;
  ops.fsyncdir = fs_fsyncdir;

  char name[] = "ckpt-test-fuse", opt[] = "-o", opts[] = "fsname=ckpt-test-fuse,subtype=ckpt-test";
  char* fargv[] = {name, opt, opts, nullptr};
  fuse_args args = FUSE_ARGS_INIT(3, fargv);
  fuse* f = fuse_new(&args, &ops, sizeof ops, nullptr);
  if (!f) return 2;
  if (fuse_mount(f, argv[3]) != 0) {
    std::fprintf(stderr, "ckpt-test-fuse: the kernel refused the FUSE mount of %s (see above)\n", argv[3]);
    fuse_destroy(f);
    return 77;
  }
  fuse_session* se = fuse_get_session(f);
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_unmount(f);
    fuse_destroy(f);
    return 2;
  }
  const int rc = fuse_loop_mt(f, 0);
  fuse_remove_signal_handlers(se);
  fuse_unmount(f);
  fuse_destroy(f);
  return rc == 0 ? 0 : 1;
}
