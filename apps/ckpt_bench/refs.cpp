// SPDX-License-Identifier: Apache-2.0
// Reference figures measured in the same run as ckpt's: what the disk does with nothing in
// between (an own io_uring loop, O_DIRECT, like fio's sequential job) and what one core hashes.
#include <fcntl.h>
#include <liburing.h>

#include "ckpt/runtime/write_backend.hpp"
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "bench.hpp"
#include "ckpt/hash/sha256.hpp"
#include "ckpt/hash/xxh3.hpp"

namespace bench {

namespace {

[[noreturn]] void fail(const std::string& what, int err) { throw std::runtime_error(what + ": " + std::strerror(err)); }

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Moves `bytes` at offset 0.. through `ring` in `piece`-sized pieces, `qd` in flight; short
// transfers are requeued for their remainder (as liburing's io_uring-cp does).
// With `linear`, piece k goes to buf + its file offset (buf spans the whole file); otherwise
// each in-flight slot reuses its own piece of buf.
void uring_loop(io_uring& ring, int fd, bool write, std::uint64_t bytes, std::uint64_t piece, int qd, std::byte* buf,
                bool linear = false) {
  struct Slot {
    std::uint64_t off = 0, len = 0, done = 0;
  };
  std::vector<Slot> slots(static_cast<std::size_t>(qd));
  std::uint64_t next = 0;
  int in_flight = 0;
  auto submit = [&](std::size_t i) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (!sqe) throw std::runtime_error("io_uring: submission queue full");
    Slot& s = slots[i];
    std::byte* p = (linear ? buf + s.off : buf + i * piece) + s.done;
    const auto len = static_cast<unsigned>(s.len - s.done);
    if (write) io_uring_prep_write(sqe, fd, p, len, s.off + s.done);
    else io_uring_prep_read(sqe, fd, p, len, s.off + s.done);
    io_uring_sqe_set_data64(sqe, i);
  };
  for (std::size_t i = 0; i < slots.size() && next < bytes; ++i) {
    slots[i] = {next, std::min(piece, bytes - next), 0};
    next += slots[i].len;
    submit(i);
    ++in_flight;
  }
  while (in_flight > 0) {
    const int rc = io_uring_submit_and_wait(&ring, 1);
    if (rc < 0 && rc != -EINTR) fail("io_uring_submit_and_wait", -rc);
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++seen;
      const auto i = static_cast<std::size_t>(io_uring_cqe_get_data64(cqe));
      const int res = cqe->res;
      if (res < 0) fail(write ? "raw write" : "raw read", -res);
      if (res == 0) throw std::runtime_error(write ? "raw write made no progress" : "raw read hit end of file");
      Slot& s = slots[i];
      s.done += static_cast<std::uint64_t>(res);
      if (s.done < s.len) {
        submit(i);  // short transfer: the rest again
      } else if (next < bytes) {
        s = {next, std::min(piece, bytes - next), 0};
        next += s.len;
        submit(i);
      } else {
        --in_flight;
      }
    }
    io_uring_cq_advance(&ring, seen);
  }
}

void pio_loop(int fd, bool write, std::uint64_t bytes, std::uint64_t piece, std::byte* buf) {
  for (std::uint64_t off = 0; off < bytes;) {
    const std::uint64_t len = std::min(piece, bytes - off);
    const ssize_t n = write ? ::pwrite(fd, buf, len, static_cast<off_t>(off)) : ::pread(fd, buf, len, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(write ? "raw pwrite" : "raw pread", n < 0 ? errno : EIO);
    off += static_cast<std::uint64_t>(n);
  }
}

// An io_uring of 2 x qd entries where the kernel (and seccomp) allow one; `ok` false otherwise.
struct Ring {
  io_uring ring{};
  bool ok;
  explicit Ring(int qd) : ok(io_uring_queue_init(static_cast<unsigned>(qd * 2), &ring, 0) == 0) {}
  ~Ring() {
    if (ok) io_uring_queue_exit(&ring);
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
};

// Reads bytes [0, bytes) of fd to buf + their offset, `piece` at a time: `qd` in flight
// through the ring, or one pread at a time where there is none.
void read_linear(Ring& r, int fd, std::uint64_t bytes, std::uint64_t piece, int qd, std::byte* buf) {
  if (r.ok) {
    uring_loop(r.ring, fd, false, bytes, piece, qd, buf, /*linear=*/true);
    return;
  }
  for (std::uint64_t off = 0; off < bytes;) {
    const ssize_t n = ::pread(fd, buf + off, static_cast<std::size_t>(std::min(piece, bytes - off)), static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("raw pread", n < 0 ? errno : EIO);
    off += static_cast<std::uint64_t>(n);
  }
}

}  // namespace

// The same probe the checkpointer uses to choose its writer.
bool io_uring_works(std::string* why) { return ckpt::detail::io_uring_available(why); }

RawDisk raw_disk(const std::string& dir, std::uint64_t bytes, std::uint64_t piece, int qd, std::byte* buf) {
  RawDisk r;
  r.bytes = (bytes + piece - 1) / piece * piece;
  const std::string path = dir + "/raw-reference.bin";
  ::unlink(path.c_str());
  Fd f;
  f.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0644);
  if (f.fd < 0 && errno == EINVAL) {  // no O_DIRECT here (tmpfs): measure what there is
    r.direct = false;
    f.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }
  if (f.fd < 0) fail("open " + path, errno);
  struct Unlink {
    std::string p;
    ~Unlink() { ::unlink(p.c_str()); }
  } unlink_after{path};
  if (const int rc = ::posix_fallocate(f.fd, 0, static_cast<off_t>(r.bytes)); rc != 0 && rc != EOPNOTSUPP) fail("fallocate " + path, rc);
  if (::fsync(f.fd) != 0) fail("fsync " + path, errno);  // the allocation itself is not part of the timing

  Ring ring(qd);
  r.engine = ring.ok ? "io_uring" : "pread/pwrite";
  auto t0 = Clock::now();
  if (ring.ok) uring_loop(ring.ring, f.fd, true, r.bytes, piece, qd, buf);
  else pio_loop(f.fd, true, r.bytes, piece, buf);
  if (::fsync(f.fd) != 0) fail("fsync " + path, errno);
  r.write_s = secs(Clock::now() - t0);
  if (!r.direct) drop_file_cache(path);
  t0 = Clock::now();
  if (ring.ok) uring_loop(ring.ring, f.fd, false, r.bytes, piece, qd, buf);
  else pio_loop(f.fd, false, r.bytes, piece, buf);
  r.read_s = secs(Clock::now() - t0);
  return r;
}

double raw_read_fresh_gbps(const std::string& dir, std::uint64_t bytes, std::uint64_t piece, int qd, std::byte* buf) {
  bytes = (bytes + piece - 1) / piece * piece;
  const std::string path = dir + "/raw-reference-fresh.bin";
  ::unlink(path.c_str());
  Fd f;
  f.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0644);
  const bool direct = f.fd >= 0;
  if (f.fd < 0 && errno == EINVAL) f.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (f.fd < 0) fail("open " + path, errno);
  struct Unlink {
    std::string p;
    ~Unlink() { ::unlink(p.c_str()); }
  } unlink_after{path};
  pio_loop(f.fd, true, bytes, piece, buf);  // the file's content (untimed)
  if (::fsync(f.fd) != 0) fail("fsync " + path, errno);
  if (!direct) drop_file_cache(path);
  ckpt::AlignedBuffer fresh(static_cast<std::size_t>(bytes));  // not touched yet
  Ring ring(qd);
  const auto t0 = Clock::now();
  read_linear(ring, f.fd, bytes, piece, qd, fresh.data());
  return gb_per_s(bytes, secs(Clock::now() - t0));
}

double raw_read_into_gbps(const std::vector<std::string>& paths, const std::vector<std::byte*>& dests, std::uint64_t piece, int qd) {
  std::vector<Fd> files(paths.size());
  std::vector<std::uint64_t> sizes(paths.size());
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    files[i].fd = ::open(paths[i].c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (files[i].fd < 0) fail("open " + paths[i], errno);
    struct stat st {};
    if (::fstat(files[i].fd, &st) != 0) fail("fstat " + paths[i], errno);
    sizes[i] = static_cast<std::uint64_t>(st.st_size) / 4096 * 4096;  // whole blocks: no short read at the end
    total += sizes[i];
  }
  Ring ring(qd);
  const auto t0 = Clock::now();
  for (std::size_t i = 0; i < paths.size(); ++i) read_linear(ring, files[i].fd, sizes[i], piece, qd, dests[i]);
  return gb_per_s(total, secs(Clock::now() - t0));
}

double xxh3_gbps(const std::byte* data, std::size_t n, double min_seconds) {
  std::uint64_t sink = 0, bytes = 0;
  const auto t0 = Clock::now();
  do {
    sink += ckpt::xxh3_64(data, n);
    bytes += n;
  } while (secs(Clock::now() - t0) < min_seconds);
  const double s = secs(Clock::now() - t0);
  if (sink == 42) std::fputc(' ', stderr);  // keeps the loop from being optimized out
  return gb_per_s(bytes, s);
}

double sha256_gbps(const std::byte* data, std::size_t n, double min_seconds) {
  ckpt::Sha256 h;
  std::uint64_t bytes = 0;
  const auto t0 = Clock::now();
  do {
    h.update(data, n);
    bytes += n;
  } while (secs(Clock::now() - t0) < min_seconds);
  (void)h.finish();
  return gb_per_s(bytes, secs(Clock::now() - t0));
}

}  // namespace bench
