// SPDX-License-Identifier: Apache-2.0
#include "ckpt/read/mapped.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/read/chunk_check.hpp"
#include "ckpt/read/tensor_lookup.hpp"
#include "ckpt/fs/posix_open.hpp"
#include "ckpt/fs/layout.hpp"

namespace ckpt {

namespace {

// A chunk's state. unchecked -> checking (one thread, the one whose compare-exchange won) ->
// good or bad; a failed read goes back to unchecked. Waiters block in atomic::wait on
// `checking` and are woken by the thread that leaves it.
enum ChunkState : std::uint32_t { kUnchecked, kChecking, kGood, kBad };

}  // namespace

struct MappedShard::State {
  int rank = 0;
  Verify mode = Verify::fast;
  std::string path;
  std::uint64_t size = 0, chunk_size = 0;
  std::vector<std::uint64_t> chunk_xxh3;
  std::vector<TensorRecord> tensors;
  std::unordered_map<std::string_view, std::size_t> by_name;

  // Mapped: `map` is the mapping (nullptr for an empty file). Fallback: `file` and `buffer`.
  void* map = nullptr;
  std::unique_ptr<ReadableFile> file;
  AlignedBuffer buffer;
  const std::byte* base = nullptr;

  // One per chunk when chunks need work before a view (a verify mode, or the fallback's read).
  std::unique_ptr<std::atomic<std::uint32_t>[]> state;
  std::unique_ptr<std::uint64_t[]> bad_hash;  // written before kBad is published
  std::atomic<std::uint64_t> chunks_checked{0}, bytes_checked{0}, bytes_read{0};

  ~State() {
    if (map) ::munmap(map, static_cast<std::size_t>(size));
  }

  std::uint64_t chunk_len(std::uint64_t k) const { return std::min(chunk_size, size - k * chunk_size); }
  std::span<std::byte> writable_chunk(std::uint64_t k) {
    return {buffer.data() + k * chunk_size, static_cast<std::size_t>(chunk_len(k))};
  }
  [[noreturn]] void throw_bad(std::uint64_t k) const {
    detail::throw_chunk_mismatch(path, k, chunk_xxh3.size(), k * chunk_size, chunk_len(k), chunk_xxh3[k], bad_hash[k]);
  }

  // Makes chunk k usable: read (fallback) and hashed (verify modes), exactly once.
  void settle(std::uint64_t k) {
    std::atomic<std::uint32_t>& st = state[k];
    for (;;) {
      std::uint32_t cur = st.load(std::memory_order_acquire);
      if (cur == kGood) return;
      if (cur == kBad) throw_bad(k);
      if (cur == kChecking) {
        st.wait(kChecking, std::memory_order_acquire);
        continue;
      }
      if (st.compare_exchange_strong(cur, kChecking, std::memory_order_acq_rel)) break;
    }
    std::uint32_t result = kGood;
    try {
      const std::uint64_t begin = k * chunk_size, len = chunk_len(k);
      if (file) {
        file->read_at(begin, writable_chunk(k));
        bytes_read.fetch_add(len, std::memory_order_relaxed);
      } else {
        // The chunk is about to be read whole: ask for all of it at once (the mapping is
        // MADV_RANDOM, so a fault would read one page).
        const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
        const auto from = reinterpret_cast<std::uintptr_t>(base + begin) & ~(page - 1);
        ::madvise(reinterpret_cast<void*>(from), static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(base + begin + len) - from),
                  MADV_WILLNEED);
      }
      if (mode != Verify::none) {
        const std::uint64_t h = xxh3_64(base + begin, static_cast<std::size_t>(len));
        chunks_checked.fetch_add(1, std::memory_order_relaxed);
        bytes_checked.fetch_add(len, std::memory_order_relaxed);
        if (h != chunk_xxh3[k]) {
          bad_hash[k] = h;
          result = kBad;
        }
      }
    } catch (...) {
      st.store(kUnchecked, std::memory_order_release);  // a failed read: the next view retries
      st.notify_all();
      throw;
    }
    st.store(result, std::memory_order_release);
    st.notify_all();
    if (result == kBad) throw_bad(k);
  }

  std::span<const std::byte> view(std::uint64_t offset, std::uint64_t length) {
    if (offset > size || length > size - offset)
      throw Error(Errc::invalid_argument, path, "view range", "within " + std::to_string(size) + " bytes",
                  std::to_string(offset) + "+" + std::to_string(length));
    if (length == 0) return {base ? base + offset : nullptr, 0};
    if (state)
      for (std::uint64_t k = offset / chunk_size, last = (offset + length - 1) / chunk_size; k <= last; ++k) settle(k);
    return {base + offset, static_cast<std::size_t>(length)};
  }
};

namespace {

// open(2) of the shard as the file comment says; returns the descriptor. A shard gone since
// the checkpoint was opened is missing, as CheckpointReader::open calls it.
int open_shard(const std::string& path, int rank) {
  try {
    return detail::open_regular_file(path).fd;
  } catch (const Error& e) {
    if (e.code() != Errc::not_found) throw;
    throw Error(Errc::missing_shard, path, "shard of rank " + std::to_string(rank) + " listed in the manifest", "present", "missing",
                e.sys_errno());
  }
}

// mmap of `size` bytes of fd, then the size check (the file may have changed since the
// manifest was read, or between open and mmap). Closes fd.
void* map_checked(int fd, std::uint64_t size, const std::string& path) {
  void* map = nullptr;
  int err = 0;
  const char* action = "mmap";
  if (size > 0) {
    map = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) err = errno, map = nullptr;
  }
  struct stat st {};
  if (!err && ::fstat(fd, &st) != 0) err = errno, action = "fstat";
  ::close(fd);
  auto unmap = [&] {
    if (map) ::munmap(map, static_cast<std::size_t>(size));
  };
  if (err) {
    unmap();
    throw_errno(err, action, path);
  }
  if (static_cast<std::uint64_t>(st.st_size) != size) {
    unmap();
    check_size(size, static_cast<std::uint64_t>(st.st_size), "shard size", path);
  }
  return map;
}

}  // namespace

MappedShard::MappedShard(const CheckpointReader& checkpoint, int rank, Verify mode)
    : MappedShard(checkpoint, (check_rank(rank, checkpoint.manifest().world_size, "rank", checkpoint.dir()), checkpoint.manifest().shard(rank)), mode) {}

MappedShard::MappedShard(const CheckpointReader& checkpoint, const ShardRecord& rec, Verify mode) : s_(std::make_unique<State>()) {
  const Manifest& m = checkpoint.manifest();
  const int rank = rec.rank;
  State& s = *s_;
  s.rank = rank;
  s.mode = mode;
  s.path = checkpoint.file_path(rec);
  s.size = rec.size;
  s.chunk_size = m.chunk_size;
  s.chunk_xxh3 = rec.chunk_xxh3;
  for (const auto& t : m.tensors)
    if (t.rank == rank && t.part == rec.part) s.tensors.push_back(t);
  for (std::size_t i = 0; i < s.tensors.size(); ++i) s.by_name.emplace(s.tensors[i].name, i);

  const std::uint64_t n = chunk_count(s.size, s.chunk_size);
  if (&checkpoint.file_system() == &posix_file_system()) {
    s.map = map_checked(open_shard(s.path, rank), s.size, s.path);
    s.base = static_cast<const std::byte*>(s.map);
    if (s.map && mode != Verify::none) ::madvise(s.map, static_cast<std::size_t>(s.size), MADV_RANDOM);
  } else {
    s.file = with_typed_errors(s.path, [&] { return checkpoint.file_system().open_read(s.path); });
    check_size(s.size, s.file->size(), "shard size", s.path);
    s.buffer = with_typed_errors(s.path, [&] { return AlignedBuffer(static_cast<std::size_t>(s.size)); });
    s.base = s.buffer.data();
  }
  // The views' places come from the index: the shard's own header must say the same.
  checkpoint.check_file_header(rec, mode);
  if (mode != Verify::none || s.file) {
    s.state = std::make_unique<std::atomic<std::uint32_t>[]>(static_cast<std::size_t>(n));
    s.bad_hash = std::make_unique<std::uint64_t[]>(static_cast<std::size_t>(n));
  }
  if (mode == Verify::full) {
    // The whole-file check of the reader (chunk XXH3s, then SHA-256 and XXH3 of the file),
    // through the file system; the fallback keeps the bytes as they pass.
    checkpoint.stream_file(rec, Verify::full, [&](std::uint64_t offset, std::span<const std::byte> chunk) {
      if (s.file) std::memcpy(s.buffer.data() + offset, chunk.data(), chunk.size());
    });
    for (std::uint64_t k = 0; k < n; ++k) s.state[k].store(kGood, std::memory_order_relaxed);
    s.chunks_checked = n;
    s.bytes_checked = s.size;
    if (s.file) s.bytes_read = s.size;
  }
}

MappedShard::~MappedShard() = default;
MappedShard::MappedShard(MappedShard&&) noexcept = default;
MappedShard& MappedShard::operator=(MappedShard&&) noexcept = default;

int MappedShard::rank() const noexcept { return s_->rank; }
Verify MappedShard::mode() const noexcept { return s_->mode; }
const std::string& MappedShard::path() const noexcept { return s_->path; }
std::uint64_t MappedShard::size() const noexcept { return s_->size; }
bool MappedShard::is_mapped() const noexcept { return !s_->file; }
const std::vector<TensorRecord>& MappedShard::tensors() const noexcept { return s_->tensors; }

const TensorRecord* MappedShard::find(std::string_view name) const noexcept {
  const auto it = s_->by_name.find(name);
  return it == s_->by_name.end() ? nullptr : &s_->tensors[it->second];
}

TensorView MappedShard::tensor(std::string_view name) const {
  const TensorRecord* t = find(name);
  if (!t) detail::throw_no_tensor(s_->path, s_->rank, s_->tensors, name);
  return {t->name, t->dtype, t->shape, s_->view(t->begin, t->end - t->begin), t->sharding};
}

std::span<const std::byte> MappedShard::bytes(std::uint64_t offset, std::uint64_t length) const { return s_->view(offset, length); }

MappedShardStats MappedShard::stats() const noexcept {
  return {s_->chunks_checked.load(std::memory_order_relaxed), s_->bytes_checked.load(std::memory_order_relaxed),
          s_->bytes_read.load(std::memory_order_relaxed)};
}

}  // namespace ckpt
