// SPDX-License-Identifier: Apache-2.0
// load_into: the targets are resolved against the manifest's index (all of them, before any
// read), then each shard file (or, with verify none or fast and fewer files than threads,
// each contiguous part of its needed chunks) is read by one thread as a sequence of reads of
// at most io_size bytes, cut at chunk boundaries, queue_depth of them in flight. Reads are processed
// in file order (the SHA-256 of Verify::full needs the bytes in order; a ring of queue_depth
// slots keeps the disk busy meanwhile): each read's bytes are hashed and copied out to the
// targets block by block while the block is in cache, and a chunk's XXH3 is compared when
// its last read is processed.
//
// O_DIRECT where it works: a file system may refuse it at open (EINVAL: tmpfs before 6.6), or
// accept the open and refuse the reads (EINVAL from many FUSE file systems: s3fs, gcsfuse,
// JuiceFS, blobfuse, LazyFS), or return a short read that leaves the next one misaligned.
// The sources report the last two as DirectRefused; the file is then reopened buffered and
// read again from its start, once (pump): the hashes restart, and every target is rewritten.
#include "ckpt/read/load_into.hpp"
#include "ckpt/read/chunk_check.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/hash/sha256.hpp"
#include "ckpt/hash/xxh3.hpp"

namespace ckpt {

namespace {

constexpr std::uint64_t kBlockAlign = 4096;  // O_DIRECT offsets, lengths and addresses
constexpr std::size_t kFuseBlock = 128u << 10;  // hash-and-copy unit: stays in L2 between the passes

std::uint64_t round_up(std::uint64_t n, std::uint64_t a) { return (n + a - 1) / a * a; }

std::string shape_text(const std::vector<std::uint64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Bytes [begin, end) of the file go to dest.
struct Piece {
  std::uint64_t begin = 0, end = 0;
  std::byte* dest = nullptr;
};

struct FilePlan {
  int rank = 0;
  std::string path;
  const ShardRecord* rec = nullptr;
  std::vector<Piece> pieces;  // by begin
};

// The chunks of `cs` bytes that pieces (sorted by begin) touch, in order, each once: what a
// load with verify none or fast reads, and what its split into parts divides.
std::vector<std::uint64_t> touched_chunks(const std::vector<Piece>& pieces, std::uint64_t cs) {
  std::vector<std::uint64_t> ks;
  for (const Piece& pc : pieces)
    for (std::uint64_t k = pc.begin / cs; k * cs < pc.end; ++k)
      if (ks.empty() || ks.back() < k) ks.push_back(k);  // sorted by begin: a smaller k is in already
  return ks;
}

// The plans of rank's files its targets touch (with no targets, of every file: each header is
// still checked), in part order.
std::vector<FilePlan> resolve(const CheckpointReader& ck, int rank, std::span<const LoadTarget> targets) {
  const Manifest& m = ck.manifest();
  check_rank(rank, m.world_size, "rank", ck.dir());
  std::vector<FilePlan> plans;
  for (const ShardRecord& f : m.files_of(rank)) plans.push_back({rank, ck.file_path(f), &f, {}});
  std::vector<bool> touched(plans.size(), targets.empty());
  std::unordered_map<std::string_view, const TensorRecord*> index;
  for (const auto& t : m.tensors)
    if (t.rank == rank) index.emplace(t.name, &t);
  for (const auto& tg : targets) {
    const auto found = index.find(tg.name);
    if (found == index.end())
      throw Error(Errc::not_found, plans.front().path, "no tensor '" + tg.name + "' on rank " + std::to_string(rank) + " in the manifest index");
    const TensorRecord& t = *found->second;
    FilePlan& plan = plans.at(static_cast<std::size_t>(t.part));
    touched[static_cast<std::size_t>(t.part)] = true;
    const std::string what = "the target buffer of tensor '" + tg.name + "'";
    if (tg.dtype != t.dtype)
      throw Error(Errc::invalid_argument, plan.path, "dtype of " + what, std::string(dtype_name(t.dtype)), std::string(dtype_name(tg.dtype)));
    if (tg.shape != t.shape) throw Error(Errc::invalid_argument, plan.path, "shape of " + what, shape_text(t.shape), shape_text(tg.shape));
    if (t.end < t.begin || t.end > plan.rec->size)
      throw Error(Errc::malformed_manifest, plan.path, "byte range of tensor '" + tg.name + "'",
                  "within " + std::to_string(plan.rec->size) + " bytes", std::to_string(t.begin) + "-" + std::to_string(t.end));
    const std::uint64_t es = dtype_size(t.dtype), numel = (t.end - t.begin) / es;
    const std::uint64_t count = tg.count.value_or(numel - std::min(numel, tg.first));
    if ((!tg.count && tg.first != 0) || tg.first > numel || count > numel - tg.first)
      throw Error(Errc::invalid_argument, plan.path, "element range of " + what, "within " + std::to_string(numel) + " elements",
                  std::to_string(tg.first) + "+" + (tg.count ? std::to_string(*tg.count) : std::string("all")));
    check_size(count * es, tg.out.size(), "size of " + what, plan.path);
    if (count == 0) continue;
    const std::uint64_t b = t.begin + tg.first * es;
    plan.pieces.push_back({b, b + count * es, tg.out.data()});
  }
  for (FilePlan& plan : plans)
    std::sort(plan.pieces.begin(), plan.pieces.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  std::vector<FilePlan> out;
  for (std::size_t i = 0; i < plans.size(); ++i)
    if (touched[i]) out.push_back(std::move(plans[i]));
  return out;
}

// The targets of `ranks` grouped by the rank whose shard stores them, in order of first
// appearance: a target naming a replicated tensor goes to the entry's rank (the lowest
// holder); any other (an unknown name too, which resolve then refuses) stays with its rank.
std::vector<std::pair<int, std::vector<LoadTarget>>> targets_by_file(const CheckpointReader& ck, std::span<const RankLoad> ranks) {
  const Manifest& m = ck.manifest();
  std::unordered_multimap<std::string_view, const TensorRecord*> replicated;
  for (const auto& t : m.tensors)
    if (t.sharding && t.sharding->kind == TensorSharding::Kind::replicated) replicated.emplace(t.name, &t);
  std::vector<std::pair<int, std::vector<LoadTarget>>> out;
  auto file_of = [&](int rank) -> std::vector<LoadTarget>& {
    for (auto& [r, ts] : out)
      if (r == rank) return ts;
    return out.emplace_back(rank, std::vector<LoadTarget>{}).second;
  };
  for (const auto& r : ranks) {
    check_rank(r.rank, m.world_size, "rank", ck.dir());
    if (r.targets.empty()) file_of(r.rank);  // its header is still checked, as before
    for (const auto& tg : r.targets) {
      int stored_by = r.rank;
      const auto [first, last] = replicated.equal_range(tg.name);
      for (auto it = first; it != last; ++it)
        if (it->second->held_by(r.rank)) stored_by = it->second->rank;
      file_of(stored_by).push_back(tg);
    }
  }
  return out;
}

// Pre-faulted, aligned bounce buffers, reused across loads (a fresh one costs a page fault per
// page on first touch, which is what loading into owned memory avoids).
class BouncePool {
 public:
  AlignedBuffer take(std::size_t size) {
    {
      std::lock_guard lock(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->capacity() >= size) {
          AlignedBuffer b = std::move(*it);
          free_.erase(it);
          held_ -= b.capacity();
          return b;
        }
    }
    return AlignedBuffer(size, /*prefault=*/true);
  }
  void give(AlignedBuffer b) {
    std::lock_guard lock(mu_);
    if (held_ + b.capacity() > kKeep) return;
    held_ += b.capacity();
    free_.push_back(std::move(b));
  }

 private:
  static constexpr std::size_t kKeep = 64u << 20;
  std::mutex mu_;
  std::vector<AlignedBuffer> free_;
  std::size_t held_ = 0;
};

BouncePool& bounce_pool() {
  static BouncePool pool;
  return pool;
}

// One read: `want` bytes of the file at `off` into buf, which has room for `len` >= want
// (an O_DIRECT read asks for whole blocks; the file's last block may be partial).
struct Req {
  std::uint64_t off = 0;
  std::byte* buf = nullptr;
  std::size_t len = 0, want = 0;
};

[[noreturn]] void ended_early(const std::string& path, std::uint64_t at, std::uint64_t size) {
  throw Error(Errc::size_mismatch, path, "file ended while being read, at byte " + std::to_string(at), std::to_string(size) + " bytes",
              std::to_string(at) + " bytes");
}

// An O_DIRECT read the file system would not do: EINVAL, or a short read that leaves the next
// read of the file misaligned. Never leaves FileLoad: it reads the file again, buffered.
struct DirectRefused {
  std::string why;
};

[[noreturn]] void refuse_einval(std::uint64_t at) {
  throw DirectRefused{"the file system refused an O_DIRECT read at byte " + std::to_string(at) + " (EINVAL: " + std::strerror(EINVAL) + ")"};
}

// A direct read that returned `got` of `asked` bytes at `off`, short of the file's end: the
// rest would have to start at an address and offset O_DIRECT does not take.
void check_direct_progress(std::uint64_t off, std::size_t got, std::size_t asked) {
  if (got < asked && got % kBlockAlign != 0)
    throw DirectRefused{"an O_DIRECT read at byte " + std::to_string(off) + " returned " + std::to_string(got) + " of " + std::to_string(asked) +
                        " bytes, short of the file's end and not a multiple of " + std::to_string(kBlockAlign)};
}

// Where the reads go: submit() starts the read of a slot, wait() returns once it has landed
// (or throws; DirectRefused only from a source reading an O_DIRECT descriptor), drain() waits
// for every read still in flight.
class Source {
 public:
  virtual ~Source() = default;
  virtual void submit(std::size_t slot, const Req& r) = 0;
  virtual void wait(std::size_t slot) = 0;
  virtual void drain() noexcept {}
  /// After drain(), once the file was reopened buffered: reads `fd` from now on (the same
  /// ring: a ring set up anew in the middle of a multi-file load would reuse the memory of
  /// the one let go, which ThreadSanitizer cannot see through liburing's raw mmap).
  virtual void read_buffered_from(int fd) { (void)fd; }
};

// Synchronous: the read runs in wait().
class PreadSource final : public Source {
 public:
  PreadSource(int fd, bool direct, const std::string& path, std::uint64_t size, std::size_t slots)
      : fd_(fd), direct_(direct), path_(path), size_(size), reqs_(slots) {}
  void submit(std::size_t s, const Req& r) override { reqs_[s] = r; }
  void read_buffered_from(int fd) override {
    fd_ = fd;
    direct_ = false;
  }
  void wait(std::size_t s) override {
    const Req& r = reqs_[s];
    std::size_t done = 0;
    while (done < r.want) {
      const ssize_t n = ::pread(fd_, r.buf + done, r.len - done, static_cast<off_t>(r.off + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL && direct_) refuse_einval(r.off + done);
      if (n < 0) throw_errno(errno, "pread", path_);
      if (n == 0) ended_early(path_, r.off + done, size_);
      done += static_cast<std::size_t>(n);
      if (direct_ && done < r.want) check_direct_progress(r.off, done, r.len);
    }
  }

 private:
  int fd_;
  bool direct_;
  const std::string& path_;
  std::uint64_t size_;
  std::vector<Req> reqs_;
};

// Any FileSystem: its read_at (which reports a short file as Errc::size_mismatch).
class FileSystemSource final : public Source {
 public:
  FileSystemSource(ReadableFile& f, std::size_t slots) : f_(f), reqs_(slots) {}
  void submit(std::size_t s, const Req& r) override { reqs_[s] = r; }
  void wait(std::size_t s) override { f_.read_at(reqs_[s].off, std::span(reqs_[s].buf, reqs_[s].want)); }

 private:
  ReadableFile& f_;
  std::vector<Req> reqs_;
};

// io_uring: one ring per file load, a read per slot in flight; short reads are requeued for
// their remainder, EINTR / EAGAIN retried (as liburing's io_uring-cp does).
class UringSource final : public Source {
 public:
  UringSource(int fd, bool direct, const std::string& path, std::uint64_t size, std::size_t slots)
      : fd_(fd), direct_(direct), path_(path), size_(size), slots_(slots) {}
  ~UringSource() override {
    drain();
    if (ready_) io_uring_queue_exit(&ring_);
  }
  /// Sets the ring up; false (and why) where the kernel or a seccomp filter refuses.
  bool init(std::string& why) {
    const int rc = io_uring_queue_init(static_cast<unsigned>(std::max<std::size_t>(2, slots_.size())), &ring_, 0);
    if (rc < 0) {
      why = std::strerror(-rc);
      return false;
    }
    ready_ = true;
    return true;
  }
  void submit(std::size_t s, const Req& r) override {
    slots_[s] = Slot{r};
    push(s);
  }
  void read_buffered_from(int fd) override {
    fd_ = fd;
    direct_ = false;
  }
  void wait(std::size_t s) override {
    while (!slots_[s].complete) reap();
    const Slot& sl = slots_[s];
    if (sl.err == EINVAL && direct_) refuse_einval(sl.req.off + sl.done);
    if (sl.err) throw_errno(sl.err, "io_uring read", path_);
    if (direct_ && sl.done < sl.req.want && !sl.eof) check_direct_progress(sl.req.off, sl.done, sl.req.len);
    if (sl.eof) ended_early(path_, sl.req.off + sl.done, size_);
  }
  void drain() noexcept override {
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;  // nothing more can complete
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
    }
  }

 private:
  struct Slot {
    Req req;
    std::size_t done = 0;
    bool complete = false, eof = false;
    int err = 0, retries = 0;
  };

  void push(std::size_t s) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (!sqe) throw Error(Errc::io_error, path_, "io_uring submission queue full");
    Slot& sl = slots_[s];
    io_uring_prep_read(sqe, fd_, sl.req.buf + sl.done, static_cast<unsigned>(sl.req.len - sl.done), sl.req.off + sl.done);
    io_uring_sqe_set_data64(sqe, s);
    int rc;
    do rc = io_uring_submit(&ring_);
    while (rc == -EINTR || rc == -EAGAIN);
    if (rc < 0) throw_errno(-rc, "io_uring submit", path_);
    ++in_flight_;
  }

  void reap() {
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(&ring_, &cqe);
    if (rc == -EINTR) return;
    if (rc < 0) throw_errno(-rc, "io_uring wait", path_);
    std::vector<std::size_t> again;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      --in_flight_;
      Slot& sl = slots_[static_cast<std::size_t>(io_uring_cqe_get_data64(cqe))];
      const int res = cqe->res;
      if ((res == -EINTR || res == -EAGAIN) && ++sl.retries <= 1000) {
        again.push_back(static_cast<std::size_t>(io_uring_cqe_get_data64(cqe)));
      } else if (res < 0) {
        sl.err = -res;
        sl.complete = true;
      } else if (res == 0) {
        sl.eof = true;
        sl.complete = true;
      } else {
        sl.done += static_cast<std::size_t>(res);
        // A direct read cut short off a block boundary cannot go on (wait() says so).
        if (sl.done >= sl.req.want || (direct_ && sl.done % kBlockAlign != 0)) sl.complete = true;
        else again.push_back(static_cast<std::size_t>(io_uring_cqe_get_data64(cqe)));  // short read: the rest
      }
    }
    io_uring_cq_advance(&ring_, seen);
    for (const auto s : again) push(s);
  }

  int fd_;
  bool direct_;
  const std::string& path_;
  std::uint64_t size_;
  std::vector<Slot> slots_;
  io_uring ring_{};
  bool ready_ = false;
  std::size_t in_flight_ = 0;
};

struct Fd {
  int fd = -1;
  ~Fd() { reset(-1); }
  void reset(int to) {
    if (fd >= 0) ::close(fd);
    fd = to;
  }
};

void log_uring_fallback_once(const std::string& why) {
  static std::once_flag once;
  std::call_once(once, [&] { log_event(LogLevel::warn, "reader_fallback", "load_into: io_uring unavailable (" + why + "), reading with pread"); });
}

struct FileResult {
  std::string engine, fallback;
  bool direct = false;
  std::uint64_t bytes = 0, chunks = 0, reads_direct = 0;
};

// Thrown inside a file's load when another file's load failed; never leaves load_into.
struct Stopped {};

// One read of the plan.
struct Read {
  std::uint64_t off = 0, want = 0, chunk = 0;
  bool last_of_chunk = false;
  std::byte* direct = nullptr;  // lands straight in this target memory
};

// Chunks [begin, end) of a file: the part of it one FileLoad reads.
struct ChunkRange {
  std::uint64_t begin = 0, end = ~0ull;
};

class FileLoad {
 public:
  // Reads the chunks of `range` the plan needs (with Verify::full, the whole file: range must
  // cover it, as its SHA-256 needs every byte in order).
  FileLoad(const CheckpointReader& ck, const FilePlan& plan, Verify mode, const LoadOptions& opt, const std::atomic<bool>& stop,
           ChunkRange range = {})
      : ck_(ck), plan_(plan), mode_(mode), opt_(opt), stop_(stop), cs_(ck.manifest().chunk_size), size_(plan.rec->size), range_(range) {}

  FileResult run() {
    open();
    plan_reads();
    try {
      pump();
    } catch (...) {
      if (source_) source_->drain();
      const std::string note = zero_unverified();
      for (auto& b : bounce_) bounce_pool().give(std::move(b));
      bounce_.clear();
      try {
        throw;
      } catch (const Error& e) {
        if (note.empty()) throw;
        throw Error(e.code(), e.file(), e.detail() + "; " + note, e.expected(), e.actual(), e.sys_errno());
      }
    }
    for (auto& b : bounce_) bounce_pool().give(std::move(b));
    return result_;
  }

 private:
  void open() {
    FileSystem& fs = ck_.file_system();
    const std::size_t slots = static_cast<std::size_t>(std::max(1, opt_.queue_depth));
    if (&fs != &posix_file_system()) {
      file_ = fs.open_read(plan_.path);
      check_size(size_, file_->size(), "shard size", plan_.path);
      source_ = std::make_unique<FileSystemSource>(*file_, slots);
      result_.engine = "file_system";
      return;
    }
    // chunk_size is a power of two >= 4096 (decode_manifest), so chunk and read offsets are
    // block-aligned for O_DIRECT.
    open_fd(opt_.direct);
    start_source();
  }

  // Opens the shard, with O_DIRECT if `direct` and the file system takes it at open, and
  // checks what was opened. A reopen must find the file the first open found.
  void open_fd(bool direct) {
    const int flags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW;
    int fd = ::open(plan_.path.c_str(), flags | (direct ? O_DIRECT : 0));
    if (fd < 0 && direct && errno == EINVAL) {
      direct = false;
      read_buffered_because("the file system refuses O_DIRECT at open (EINVAL)");
      fd = ::open(plan_.path.c_str(), flags);
    }
    if (fd < 0) {
      const int err = errno;
      if (err == ELOOP) throw Error(Errc::unsafe_path, plan_.path, "shard is a symlink", "regular file", "symlink");
      if (err == ENOENT)
        throw Error(Errc::missing_shard, plan_.path, "shard of rank " + std::to_string(plan_.rank) + " listed in the manifest", "present", "missing");
      throw_errno(err, "open", plan_.path);
    }
    fd_.reset(fd);
    struct stat st {};
    if (::fstat(fd_.fd, &st) != 0) throw_errno(errno, "fstat", plan_.path);
    if (!S_ISREG(st.st_mode)) throw Error(Errc::unsafe_path, plan_.path, "shard is not a regular file", "regular file", "other");
    check_size(size_, static_cast<std::uint64_t>(st.st_size), "shard size", plan_.path);
    const std::string identity = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
    if (!identity_.empty() && identity != identity_)
      throw Error(Errc::io_error, plan_.path, "shard replaced while it was reopened for buffered reads", "device:inode " + identity_,
                  "device:inode " + identity);
    identity_ = identity;
    direct_ = direct;
    result_.direct = direct;
  }

  // The engine that reads fd_: io_uring, or pread where it cannot be set up (or is refused).
  void start_source() {
    const std::size_t slots = static_cast<std::size_t>(std::max(1, opt_.queue_depth));
    std::string why;
    if (opt_.engine != LoadEngine::pread) {
      auto ring = std::make_unique<UringSource>(fd_.fd, direct_, plan_.path, size_, slots);
      if (ring->init(why)) {
        source_ = std::move(ring);
        result_.engine = "io_uring";
        note_fallback();
        return;
      }
      log_uring_fallback_once(why);
      engine_why_ = "pread: io_uring unavailable (" + why + ")";
    } else {
      engine_why_ = "pread: forced (LoadOptions::engine)";
    }
    source_ = std::make_unique<PreadSource>(fd_.fd, direct_, plan_.path, size_, slots);
    result_.engine = "pread";
    note_fallback();
  }

  void note_fallback() {
    result_.fallback = engine_why_.empty() || buffered_why_.empty() ? engine_why_ + buffered_why_ : engine_why_ + "; " + buffered_why_;
  }

  // The one log line of a file read buffered although O_DIRECT was asked for.
  void read_buffered_because(const std::string& why, std::string_view how = "reading the file buffered") {
    log_event(LogLevel::warn, "direct_io_refused", "load_into: " + plan_.path + ": " + why + "; " + std::string(how), {.rank = plan_.rank});
    buffered_why_ = "buffered reads: " + why;
  }

  // After a refused O_DIRECT read (no read in flight): the same file, buffered, through the
  // same source. The direct descriptor stays open until the new one is checked, so the
  // file's inode stays the one the kernel holds (a FUSE file system may number a file anew
  // once it is let go).
  void reopen_buffered(const std::string& why) {
    Fd direct;
    std::swap(direct.fd, fd_.fd);
    read_buffered_because(why, "reading the file again from its start, buffered");
    open_fd(false);
    source_->read_buffered_from(fd_.fd);
    note_fallback();
  }

  // Which chunks to read, the reads they take, and which pieces each chunk feeds.
  void plan_reads() {
    const std::uint64_t n = chunk_count(size_, cs_);
    if (plan_.rec->chunk_xxh3.size() != n)
      throw Error(Errc::malformed_manifest, plan_.path, "chunk checksums of the shard", std::to_string(n),
                  std::to_string(plan_.rec->chunk_xxh3.size()));
    // (chunk, piece) for every chunk a piece touches, in chunk order.
    for (std::size_t p = 0; p < plan_.pieces.size(); ++p)
      for (std::uint64_t k = plan_.pieces[p].begin / cs_; k * cs_ < plan_.pieces[p].end; ++k) feeds_.push_back({k, p});
    std::sort(feeds_.begin(), feeds_.end());
    std::vector<std::uint64_t> chunks;
    if (mode_ == Verify::full) {
      for (std::uint64_t k = 0; k < n; ++k) chunks.push_back(k);
    } else {
      for (const auto k : touched_chunks(plan_.pieces, cs_))
        if (k >= range_.begin && k < range_.end) chunks.push_back(k);
    }
    const std::uint64_t io = std::max<std::uint64_t>(kBlockAlign, round_up(opt_.io_size, kBlockAlign));
    std::uint64_t largest = 0;
    for (const auto k : chunks) {
      const std::uint64_t cb = k * cs_, ce = std::min(size_, cb + cs_);
      for (std::uint64_t off = cb; off < ce; off += io) {
        Read r{off, std::min(io, ce - off), k, off + io >= ce, nullptr};
        largest = std::max(largest, r.want);
        // Straight into the target: one piece covers the whole read, and O_DIRECT's
        // alignment holds for its address and length.
        const auto [lo, hi] = feeds_of(k);
        if (hi - lo == 1) {
          const Piece& p = plan_.pieces[feeds_[lo].second];
          std::byte* dest = p.dest + (off - std::min(off, p.begin));
          if (p.begin <= off && off + r.want <= p.end &&
              (!direct_ || (reinterpret_cast<std::uintptr_t>(dest) % kBlockAlign == 0 && r.want % kBlockAlign == 0)))
            r.direct = dest;
        }
        reads_.push_back(r);
      }
    }
    result_.chunks = chunks.size();
    const std::size_t slots = std::min<std::size_t>(static_cast<std::size_t>(std::max(1, opt_.queue_depth)), reads_.size());
    const bool any_bounce = std::any_of(reads_.begin(), reads_.end(), [](const Read& r) { return !r.direct; });
    if (any_bounce)
      for (std::size_t i = 0; i < slots; ++i) bounce_.push_back(bounce_pool().take(static_cast<std::size_t>(round_up(largest, kBlockAlign))));
    slots_ = std::max<std::size_t>(1, slots);
  }

  std::pair<std::size_t, std::size_t> feeds_of(std::uint64_t k) const {
    const auto lo = std::lower_bound(feeds_.begin(), feeds_.end(), std::pair<std::uint64_t, std::size_t>{k, 0});
    auto hi = lo;
    while (hi != feeds_.end() && hi->first == k) ++hi;
    return {static_cast<std::size_t>(lo - feeds_.begin()), static_cast<std::size_t>(hi - feeds_.begin())};
  }

  Req req_of(std::size_t i) {
    const Read& r = reads_[i];
    std::byte* buf = r.direct ? r.direct : bounce_[i % slots_].data();
    const std::size_t len = static_cast<std::size_t>(r.direct || !direct_ ? r.want : round_up(r.want, kBlockAlign));
    return {r.off, buf, len, static_cast<std::size_t>(r.want)};
  }

  void submit(std::size_t i) {
    source_->submit(i % slots_, req_of(i));
    submitted_ = i + 1;
  }

  // Reads the file; where its O_DIRECT reads are refused, once more from its start, buffered:
  // the hashes start over, and every target of the file is written again.
  void pump() {
    try {
      pass();
    } catch (const DirectRefused& refused) {
      source_->drain();
      zero_unverified();  // what the refused pass left unchecked in the targets (rewritten now)
      reopen_buffered(refused.why);
      pass();
    }
  }

  void pass() {
    submitted_ = current_ = 0;
    result_.bytes = result_.reads_direct = 0;
    const bool check = mode_ != Verify::none, full = mode_ == Verify::full;
    std::optional<Sha256> sha;
    if (full) sha.emplace();
    Xxh3 chunk_hash, whole;
    for (std::size_t i = 0; i < std::min(slots_, reads_.size()); ++i) submit(i);
    for (std::size_t i = 0; i < reads_.size(); ++i) {
      if (stop_.load(std::memory_order_relaxed)) throw Stopped{};
      current_ = i;
      const Read& r = reads_[i];
      source_->wait(i % slots_);
      const std::byte* data = r.direct ? r.direct : bounce_[i % slots_].data();
      if (r.off == r.chunk * cs_) chunk_hash.reset();
      const auto [lo, hi] = feeds_of(r.chunk);
      for (std::uint64_t b = 0; b < r.want; b += kFuseBlock) {
        const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(kFuseBlock, r.want - b));
        const std::byte* block = data + b;
        if (check) chunk_hash.update(block, len);
        if (full) {
          sha->update(block, len);
          whole.update(block, len);
        }
        if (r.direct) continue;
        const std::uint64_t bo = r.off + b, be = bo + len;
        for (std::size_t f = lo; f < hi; ++f) {
          const Piece& p = plan_.pieces[feeds_[f].second];
          const std::uint64_t from = std::max(bo, p.begin), to = std::min(be, p.end);
          if (from < to) std::memcpy(p.dest + (from - p.begin), block + (from - bo), static_cast<std::size_t>(to - from));
        }
      }
      result_.bytes += r.want;
      if (r.direct) ++result_.reads_direct;
      if (check && r.last_of_chunk) {
        const std::uint64_t h = chunk_hash.digest(), expected = plan_.rec->chunk_xxh3[r.chunk];
        if (h != expected) {
          const std::uint64_t cb = r.chunk * cs_;
          detail::throw_chunk_mismatch(plan_.path, r.chunk, plan_.rec->chunk_xxh3.size(), cb, std::min(size_, cb + cs_) - cb, expected, h);
        }
      }
      if (i + slots_ < reads_.size()) submit(i + slots_);
    }
    current_ = reads_.size();
    if (full) {
      const std::string actual = to_hex(sha->finish());
      if (actual != plan_.rec->sha256) throw Error(Errc::checksum_mismatch, plan_.path, "sha256 of the whole file", plan_.rec->sha256, actual);
      if (whole.digest() != plan_.rec->xxh3)
        throw Error(Errc::checksum_mismatch, plan_.path, "xxh3 of the whole file", xxh3_hex(plan_.rec->xxh3), xxh3_hex(whole.digest()));
    }
  }

  // After a failure: zeroes what the contract says is not verified, and says what it zeroed.
  std::string zero_unverified() {
    if (submitted_ == 0) return {};  // nothing reached any target
    if (mode_ == Verify::full) {
      for (const Piece& p : plan_.pieces) std::memset(p.dest, 0, static_cast<std::size_t>(p.end - p.begin));
      return "every target of this file was zeroed (with verify full its bytes count as verified only once the file's SHA-256 matches)";
    }
    // The chunks from the one being processed to the last one submitted: partly copied out,
    // or read straight into a target, and not (all) checked.
    if (current_ >= reads_.size()) return {};
    const std::uint64_t k0 = reads_[current_].chunk, k1 = reads_[submitted_ - 1].chunk;
    const std::uint64_t zb = k0 * cs_, ze = std::min(size_, (k1 + 1) * cs_);
    for (const Piece& p : plan_.pieces) {
      const std::uint64_t from = std::max(zb, p.begin), to = std::min(ze, p.end);
      if (from < to) std::memset(p.dest + (from - p.begin), 0, static_cast<std::size_t>(to - from));
    }
    return "the targets' bytes of chunks " + std::to_string(k0) + ".." + std::to_string(k1) + " were zeroed";
  }

  const CheckpointReader& ck_;
  const FilePlan& plan_;
  Verify mode_;
  const LoadOptions& opt_;
  const std::atomic<bool>& stop_;
  std::uint64_t cs_, size_;
  ChunkRange range_;
  Fd fd_;
  std::unique_ptr<ReadableFile> file_;
  std::unique_ptr<Source> source_;
  bool direct_ = false;
  std::string identity_;      // device:inode of the file first opened
  std::string engine_why_;    // why pread reads the file, not io_uring
  std::string buffered_why_;  // why the file is read buffered although O_DIRECT was asked for
  std::vector<std::pair<std::uint64_t, std::size_t>> feeds_;
  std::vector<Read> reads_;
  std::vector<AlignedBuffer> bounce_;
  std::size_t slots_ = 1, submitted_ = 0, current_ = 0;
  FileResult result_;
};

}  // namespace

LoadReport load_into(const CheckpointReader& checkpoint, std::span<const RankLoad> ranks, Verify mode, const LoadOptions& options) {
  if (options.queue_depth < 1 || options.queue_depth > 4096)
    throw Error(Errc::invalid_argument, checkpoint.dir(), "LoadOptions::queue_depth", "1..4096", std::to_string(options.queue_depth));
  if (options.io_size == 0 || options.io_size % kBlockAlign != 0)
    throw Error(Errc::invalid_argument, checkpoint.dir(), "LoadOptions::io_size", "a positive multiple of 4096", std::to_string(options.io_size));
  // Every check before any read, one plan per file: a replicated tensor a rank holds is in
  // its lowest holder's shard, so its target joins that file's.
  std::vector<FilePlan> plans;
  for (auto& [file_rank, targets] : targets_by_file(checkpoint, ranks))
    for (FilePlan& p : resolve(checkpoint, file_rank, targets)) plans.push_back(std::move(p));

  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t max_threads = options.threads > 0 ? static_cast<std::size_t>(options.threads) : cores;
  // The loads: a file each, or, with fewer files than threads and no SHA-256 to compute in
  // file order (verify none or fast), a file's needed chunks split into contiguous parts of at
  // least kMinPartBytes, each read by its own thread through its own ring: one file's reads,
  // checks and bounce copies (a target not laid out as the file is, mod 4096: O_DIRECT cannot
  // land in it) then use every core, not one.
  struct Job {
    std::size_t plan = 0;
    ChunkRange range;
  };
  constexpr std::uint64_t kMinPartBytes = 16u << 20;
  const std::uint64_t cs = checkpoint.manifest().chunk_size;
  std::vector<Job> jobs;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    std::vector<std::uint64_t> needed;
    if (mode != Verify::full && plans.size() < max_threads) needed = touched_chunks(plans[i].pieces, cs);
    const std::uint64_t want = static_cast<std::uint64_t>(needed.size()) * cs;
    const std::size_t parts = std::max<std::size_t>(
        1, std::min<std::size_t>({(max_threads + plans.size() - 1) / plans.size(), static_cast<std::size_t>(want / kMinPartBytes), needed.size()}));
    if (parts == 1) {
      jobs.push_back({i, {}});
      continue;
    }
    for (std::size_t p = 0; p < parts; ++p) {
      const std::size_t lo = needed.size() * p / parts, hi = needed.size() * (p + 1) / parts;
      jobs.push_back({i, {needed[lo], p + 1 == parts ? ~0ull : needed[hi]}});
    }
  }

  // Runs job(i) for i in [0, count), `threads` at a time (the calling thread among them). The
  // first error sets `stop`, which the other jobs see at their next read; every error is kept.
  std::vector<std::exception_ptr> errors(std::max(plans.size(), jobs.size()));
  std::atomic<bool> stop{false};
  std::atomic<std::ptrdiff_t> first_error{-1};
  auto run_jobs = [&](std::size_t count, const std::function<void(std::size_t)>& job) {
    const std::size_t threads = std::min(count, max_threads);
    std::atomic<std::size_t> next{0};
    auto worker = [&] {
      for (;;) {
        const std::size_t i = next.fetch_add(1);
        if (i >= count || stop.load()) return;
        try {
          job(i);
        } catch (const Stopped&) {
          return;
        } catch (...) {
          errors[i] = std::current_exception();
          std::ptrdiff_t none = -1;
          first_error.compare_exchange_strong(none, static_cast<std::ptrdiff_t>(i));
          stop.store(true);
          return;
        }
      }
    };
    if (threads <= 1) {
      worker();
      return;
    }
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
  };

  // Every file's header against the index, before any target is written: what is loaded is
  // what the file's own header says is there, and a refused header leaves every target as it
  // was. Of several refused headers, the first file's is reported.
  run_jobs(plans.size(), [&](std::size_t i) { checkpoint.check_file_header(*plans[i].rec, mode); });
  if (first_error.load() >= 0)
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);

  std::vector<FileResult> results(jobs.size());
  run_jobs(jobs.size(), [&](std::size_t j) { results[j] = FileLoad(checkpoint, plans[jobs[j].plan], mode, options, stop, jobs[j].range).run(); });
  if (first_error.load() >= 0) std::rethrow_exception(errors[static_cast<std::size_t>(first_error.load())]);

  LoadReport rep;
  rep.direct = !results.empty();
  rep.files = plans.size();
  rep.parts = jobs.size();
  for (const auto& r : results) {
    if (rep.engine.empty()) rep.engine = r.engine;
    else if (rep.engine != r.engine) rep.engine = "mixed";
    if (rep.fallback.empty()) rep.fallback = r.fallback;
    rep.direct = rep.direct && r.direct;
    rep.bytes_read += r.bytes;
    rep.chunks_read += r.chunks;
    rep.reads_direct += r.reads_direct;
  }
  return rep;
}

LoadReport load_into(const CheckpointReader& checkpoint, int rank, std::span<const LoadTarget> targets, Verify mode,
                     const LoadOptions& options) {
  const RankLoad one{rank, targets};
  return load_into(checkpoint, std::span(&one, 1), mode, options);
}

}  // namespace ckpt
