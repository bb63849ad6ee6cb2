// SPDX-License-Identifier: Apache-2.0
// MappedShard: zero-copy views of a mapped shard, each chunk checked the first time a view
// covers it.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/hash/xxh3.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/mapped.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "io/io_fixture.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

using Saved = test::SavedCheckpoint;

bool equal_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

void flip_byte(const fs::path& p, std::uint64_t at) {
  auto b = test::read_all(p);
  b.at(static_cast<std::size_t>(at)) ^= 0x20;
  test::write_all(p, b);
}

// The chunks [first, last] a byte range covers (first > last for an empty range).
std::pair<std::uint64_t, std::uint64_t> chunks_of(const TensorRecord& t, std::uint64_t cs) {
  if (t.end == t.begin) return {1, 0};
  return {t.begin / cs, (t.end - 1) / cs};
}

const TensorRecord& record(const Manifest& m, std::string_view name, int rank) {
  const TensorRecord* t = m.find_tensor(name, rank);
  REQUIRE(t);
  return *t;
}

}  // namespace

TEST_CASE("every view of a mapped shard equals the bytes that were saved, in every verify mode") {
  Saved s;
  const auto reader = s.open();
  for (const Verify mode : {Verify::none, Verify::fast, Verify::full}) {
    for (int r = 0; r < 2; ++r) {
      const MappedShard shard(reader, r, mode);
      CHECK(shard.is_mapped());
      CHECK(shard.size() == s.m.shards[static_cast<std::size_t>(r)].size);
      CHECK(shard.tensors().size() == s.fx.request.ranks[0].tensors.size());
      for (const auto& saved : s.fx.request.ranks[static_cast<std::size_t>(r)].tensors) {
        const TensorView v = shard.tensor(saved.name);
        CHECK(v.name == saved.name);
        CHECK(v.dtype == saved.dtype);
        CHECK(v.shape == saved.shape);
        CHECK(equal_bytes(v.data, saved.data));
      }
      // Zero-copy: the view points into the mapping, not into a copy per call.
      CHECK(shard.tensor("f32").data.data() == shard.tensor("f32").data.data());
      CHECK(shard.bytes(0, 8).data() + record(s.m, "f32", r).begin == shard.tensor("f32").data.data());
    }
  }
}

TEST_CASE("a mapped shard outlives its reader, and a move keeps its views valid") {
  Saved s;
  std::optional<MappedShard> kept;
  std::span<const std::byte> view;
  {
    const auto reader = s.open();
    MappedShard shard(reader, 1, Verify::fast);
    view = shard.tensor("u8").data;
    kept.emplace(std::move(shard));
  }
  CHECK(equal_bytes(view, s.saved(1, "u8")));
  CHECK(equal_bytes(kept->tensor("f64").data, s.saved(1, "f64")));
}

TEST_CASE("a corrupt chunk is caught on the first view covering it, keeps failing, and views of other chunks still work") {
  Saved s;
  const std::uint64_t cs = s.m.chunk_size;
  // Two nonempty tensors of rank 1 that share no chunk.
  const TensorRecord *bad_p = nullptr, *good = nullptr;
  for (const auto& x : s.m.tensors)
    for (const auto& y : s.m.tensors) {
      const auto [x0, x1] = chunks_of(x, cs);
      const auto [y0, y1] = chunks_of(y, cs);
      if (!good && x.rank == 1 && y.rank == 1 && x.end > x.begin && y.end > y.begin && x.end - x.begin > 100 && (y1 < x0 || y0 > x1))
        bad_p = &x, good = &y;
    }
  REQUIRE(good);
  const TensorRecord& bad = *bad_p;
  const std::uint64_t at = bad.begin + 100;
  flip_byte(s.shard(1), at);
  const auto reader = s.open();
  const MappedShard shard(reader, 1, Verify::fast);
  const std::string chunk = "chunk " + std::to_string(at / cs) + " of " + std::to_string(s.m.shards[1].chunk_xxh3.size());
  for (int attempt = 0; attempt < 2; ++attempt) {
    const Error e = test::expect_error([&] { (void)shard.tensor(bad.name); });
    CHECK(e.code() == Errc::checksum_mismatch);
    CHECK(e.file() == s.shard(1).string());
    CHECK(e.detail().find(chunk) != std::string::npos);
    CHECK(e.expected() == xxh3_hex(s.m.shards[1].chunk_xxh3[at / cs]));
    CHECK(e.actual() != e.expected());
  }
  CHECK(shard.stats().chunks_checked == 1);  // the failure is remembered, not recomputed
  CHECK(equal_bytes(shard.tensor(good->name).data, s.saved(1, good->name)));
  // Without verification the same view is handed out as it is.
  const MappedShard raw(reader, 1, Verify::none);
  CHECK(raw.tensor(bad.name).data.size() == bad.end - bad.begin);
  CHECK(raw.stats().chunks_checked == 0);
}

TEST_CASE("a view of a tensor covering two chunks checks both, and a corruption in the second is named") {
  Saved s;
  const std::uint64_t cs = s.m.chunk_size;
  const TensorRecord& u8 = record(s.m, "u8", 0);  // 4097 bytes: at least two 4096-byte chunks
  const auto [k0, k1] = chunks_of(u8, cs);
  REQUIRE(k1 > k0);
  {
    const auto reader = s.open();
    const MappedShard shard(reader, 0, Verify::fast);
    CHECK(equal_bytes(shard.tensor("u8").data, s.saved(0, "u8")));
    const MappedShardStats st = shard.stats();
    CHECK(st.chunks_checked == k1 - k0 + 1);
    std::uint64_t bytes = 0;
    for (std::uint64_t k = k0; k <= k1; ++k) bytes += std::min(cs, s.m.shards[0].size - k * cs);
    CHECK(st.bytes_checked == bytes);
    CHECK(st.bytes_read == 0);  // mapped: nothing goes through read_at
  }
  flip_byte(s.shard(0), u8.end - 1);  // in the tensor's last chunk
  const auto reader = s.open();
  const MappedShard shard(reader, 0, Verify::fast);
  const Error e = test::expect_error([&] { (void)shard.tensor("u8"); });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.detail().find("chunk " + std::to_string(k1) + " of") != std::string::npos);
}

TEST_CASE("Verify::full checks the whole file at open and catches a corruption no view covers") {
  Saved s;
  const TensorRecord& f64 = record(s.m, "f64", 0);
  flip_byte(s.shard(0), f64.begin);
  const auto reader = s.open();
  const Error e = test::expect_error([&] { MappedShard(reader, 0, Verify::full); });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.file() == s.shard(0).string());
  CHECK(e.detail().find("chunk " + std::to_string(f64.begin / s.m.chunk_size)) != std::string::npos);
  // Fast opens it (nothing read yet) and the view of another chunk's tensor works.
  const MappedShard fast(reader, 0, Verify::fast);
  CHECK(fast.stats().chunks_checked == 0);
  const MappedShard full(reader, 1, Verify::full);  // rank 1 is intact
  CHECK(full.stats().bytes_checked == s.m.shards[1].size);
  CHECK(equal_bytes(full.tensor("f16").data, s.saved(1, "f16")));
  CHECK(full.stats().chunks_checked == s.m.shards[1].chunk_xxh3.size());  // nothing more after open
}

TEST_CASE("a shard truncated or grown after the checkpoint was opened is refused at open with both sizes") {
  Saved s;
  const auto reader = s.open();
  const std::uint64_t size = s.m.shards[1].size;
  for (const std::uint64_t now : {size - 1, std::uint64_t{0}, size + 4096}) {
    fs::resize_file(s.shard(1), now);
    const Error e = test::expect_error([&] { MappedShard(reader, 1, Verify::none); });
    CHECK(e.code() == Errc::size_mismatch);
    CHECK(e.file() == s.shard(1).string());
    CHECK(e.expected() == std::to_string(size) + " bytes");
    CHECK(e.actual() == std::to_string(now) + " bytes");
  }
}

TEST_CASE("a shard replaced by a symlink, a FIFO or a directory after open is refused as unsafe, without blocking") {
  Saved s;
  const auto reader = s.open();
  const fs::path shard = s.shard(1), copy = s.dir / "copy";
  fs::copy_file(shard, copy);
  fs::remove(shard);
  fs::create_symlink(copy, shard);
  Error e = test::expect_error([&] { MappedShard(reader, 1); });
  CHECK(e.code() == Errc::unsafe_path);
  CHECK(e.file() == shard.string());
  CHECK(e.actual() == "symlink");
  fs::remove(shard);
  REQUIRE(::mkfifo(shard.c_str(), 0644) == 0);  // opening it for reading would block without O_NONBLOCK
  e = test::expect_error([&] { MappedShard(reader, 1); });
  CHECK(e.code() == Errc::unsafe_path);
  CHECK(e.detail() == "not a regular file");
  fs::remove(shard);
  fs::create_directory(shard);
  e = test::expect_error([&] { MappedShard(reader, 1); });
  CHECK(e.code() == Errc::unsafe_path);
  fs::remove(shard);
  e = test::expect_error([&] { MappedShard(reader, 1); });
  CHECK(e.code() == Errc::missing_shard);
}

TEST_CASE("a mapped shard refuses a rank outside the world, an unknown tensor (listing the rank's) and a range past the end") {
  Saved s;
  const auto reader = s.open();
  Error e = test::expect_error([&] { MappedShard(reader, 2); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "0..1");
  CHECK(e.actual() == "2");
  const MappedShard shard(reader, 0);
  e = test::expect_error([&] { (void)shard.tensor("nope"); });
  CHECK(e.code() == Errc::not_found);
  CHECK(e.file() == s.shard(0).string());
  CHECK(e.detail() == "no tensor 'nope' on rank 0");
  CHECK(e.expected() == "one of the 9 tensors of rank 0: f64, i64, f32, i32, empty, scalar, f16, bf16, u8");
  CHECK(e.actual() == "'nope'");
  e = test::expect_error([&] { (void)shard.bytes(shard.size() - 1, 2); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(shard.bytes(shard.size(), 0).empty());
  CHECK(shard.tensor("empty").data.empty());
  CHECK(shard.find("nope") == nullptr);
}

TEST_CASE("views of the same chunks taken by many threads at once hash each chunk once and all see the saved bytes") {
  Saved s;
  const auto reader = s.open();
  const std::uint64_t cs = s.m.chunk_size;
  std::set<std::uint64_t> covered;
  for (const auto& t : s.m.tensors) {
    if (t.rank != 0) continue;
    const auto [k0, k1] = chunks_of(t, cs);
    for (std::uint64_t k = k0; k <= k1 && k0 <= k1; ++k) covered.insert(k);
  }
  const MappedShard shard(reader, 0, Verify::fast);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      for (int round = 0; round < 20; ++round)
        for (const auto& saved : s.fx.request.ranks[0].tensors) {
          const auto& list = s.fx.request.ranks[0].tensors;
          const auto& t = list[(&saved - list.data() + static_cast<std::ptrdiff_t>(i)) % static_cast<std::ptrdiff_t>(list.size())];
          if (!equal_bytes(shard.tensor(t.name).data, t.data)) ++mismatches;
        }
    });
  for (auto& t : threads) t.join();
  CHECK(mismatches == 0);
  CHECK(shard.stats().chunks_checked == covered.size());
}

TEST_CASE("threads viewing a corrupt chunk at once all get the checksum error") {
  Saved s;
  flip_byte(s.shard(0), record(s.m, "u8", 0).begin);
  const auto reader = s.open();
  const MappedShard shard(reader, 0, Verify::fast);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&] {
      try {
        (void)shard.tensor("u8");
      } catch (const Error& e) {
        if (e.code() == Errc::checksum_mismatch) ++errors;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(errors == 6);
  CHECK(shard.stats().chunks_checked == 1);
}

TEST_CASE("threads viewing through the read fallback read each chunk once and all see the saved bytes") {
  Saved s;
  test::CountingFileSystem counting(posix_file_system());
  const auto reader = CheckpointReader::open(counting, s.ckpt_dir().string());
  const std::uint64_t cs = s.m.chunk_size, size = s.m.shards[0].size;
  std::set<std::uint64_t> covered;
  for (const auto& t : s.m.tensors) {
    const auto [k0, k1] = chunks_of(t, cs);
    for (std::uint64_t k = k0; t.rank == 0 && k <= k1 && k0 <= k1; ++k) covered.insert(k);
  }
  std::uint64_t bytes = 0;
  for (const auto k : covered) bytes += std::min(cs, size - k * cs);
  const MappedShard shard(reader, 0, Verify::fast);
  const std::uint64_t before = counting.bytes;
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&] {
      for (const auto& t : s.fx.request.ranks[0].tensors)
        if (!equal_bytes(shard.tensor(t.name).data, t.data)) ++mismatches;
    });
  for (auto& t : threads) t.join();
  CHECK(mismatches == 0);
  CHECK(counting.bytes - before == bytes);
  CHECK(shard.stats().chunks_checked == covered.size());
}

namespace {
// A checkpoint of one rank, 48 MiB in 1 MiB chunks, with a 1000-byte tensor in the middle.
struct Large {
  static constexpr std::uint64_t kChunk = 1 << 20, kHalf = 24ull << 20;
  test::TempDir dir;
  std::vector<std::uint8_t> a = test::random_bytes(kHalf, 1), small = test::random_bytes(1000, 2), b = test::random_bytes(kHalf, 3);
  Manifest m;
  explicit Large(FileSystem& fsys = posix_file_system(), std::string root = {}) {
    SaveRequest req;
    req.step = 1;
    req.chunk_size = kChunk;
    RankState rs;
    rs.tensors = {{"a", DType::U8, {kHalf}, std::as_bytes(std::span(a))},
                  {"small", DType::F32, {250}, std::as_bytes(std::span(small))},
                  {"b", DType::U8, {kHalf}, std::as_bytes(std::span(b))}};
    req.ranks.push_back(std::move(rs));
    m = save_checkpoint_sync(fsys, root.empty() ? dir.path().string() : root, req);
  }
  std::string ckpt_dir(std::string root = {}) const {
    return join_path(root.empty() ? dir.path().string() : root, checkpoint_dir_name(1));
  }
};
}  // namespace

TEST_CASE("reading one small tensor from a large checkpoint checks, reads and faults in only the chunks covering it") {
  Large big;
  const TensorRecord& t = record(big.m, "small", 0);
  const auto [k0, k1] = chunks_of(t, Large::kChunk);
  std::uint64_t covering = 0;
  for (std::uint64_t k = k0; k <= k1; ++k) covering += std::min(Large::kChunk, big.m.shards[0].size - k * Large::kChunk);
  const std::string dir = big.ckpt_dir();
  const std::string path = join_path(dir, big.m.shards[0].path);

  SUBCASE("mapped: the chunks hashed, and the pages resident in the page cache (mincore)") {
    // Drop the file's pages from the page cache (they are clean: the save fsynced them).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    const auto reader = CheckpointReader::open(posix_file_system(), dir);
    const MappedShard shard(reader, 0, Verify::fast);
    const std::byte* base = shard.bytes(0, 0).data();  // opening read only the header (pread), so this view checks nothing
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> resident((shard.size() + page - 1) / page);
    REQUIRE(::mincore(const_cast<std::byte*>(base), static_cast<std::size_t>(shard.size()), resident.data()) == 0);
    const auto cached = std::count_if(resident.begin(), resident.end(), [](unsigned char c) { return c & 1; });
    if (cached > 16) {
      MESSAGE("the file system kept the pages after POSIX_FADV_DONTNEED (" << cached << " cached): mincore check skipped");
      return;
    }
    const TensorView v = shard.tensor("small");
    CHECK(equal_bytes(v.data, std::as_bytes(std::span(big.small))));
    CHECK(v.data.data() == base + t.begin);
    CHECK(shard.stats().chunks_checked == k1 - k0 + 1);
    CHECK(shard.stats().bytes_checked == covering);
    REQUIRE(::mincore(const_cast<std::byte*>(base), static_cast<std::size_t>(shard.size()), resident.data()) == 0);
    std::uint64_t inside = 0, outside = 0;
    for (std::size_t p = 0; p < resident.size(); ++p) {
      if (!(resident[p] & 1)) continue;
      const std::uint64_t at = p * page;
      (at >= k0 * Large::kChunk && at < (k1 + 1) * Large::kChunk ? inside : outside) += page;
    }
    MESSAGE("resident after one view: " << inside << " bytes in the covering chunks, " << outside << " outside");
    CHECK(inside == covering);
    // Outside: at most the header page(s) the save left cached if the kernel kept them; never
    // a neighbouring chunk.
    CHECK(outside <= 64 * 1024);
  }
  SUBCASE("read fallback: the bytes read through the file system") {
    test::CountingFileSystem counting(posix_file_system());
    const auto reader = CheckpointReader::open(counting, dir);
    const std::uint64_t before = counting.bytes;
    const MappedShard shard(reader, 0, Verify::fast);
    CHECK_FALSE(shard.is_mapped());
    // Opening read the shard's header alone (its length and JSON: data_start bytes), once.
    std::uint64_t header = big.m.shards[0].size;  // the data section starts at the first tensor
    for (const auto& x : big.m.tensors) header = std::min(header, x.begin);
    CHECK(header == 4096);
    CHECK(counting.bytes - before == header);
    CHECK(equal_bytes(shard.tensor("small").data, std::as_bytes(std::span(big.small))));
    CHECK(counting.bytes - before == header + covering);
    CHECK(shard.stats().bytes_read == covering);
    (void)shard.tensor("small");  // a second view reads nothing more
    const MappedShard again(reader, 0, Verify::fast);  // nor does a second shard of this reader
    CHECK(counting.bytes - before == header + covering);
  }
}

TEST_CASE("on the in-memory file system a shard falls back to reading, with the same views and checks") {
  testing::MemoryFileSystem mem;
  test::Fixture fx(2, 10);
  const Manifest m = save_checkpoint_sync(mem, "/root", fx.request);
  const std::string dir = join_path("/root", checkpoint_dir_name(10));
  const std::string path = join_path(dir, m.shards[1].path);
  {
    const auto reader = CheckpointReader::open(mem, dir);
    for (const Verify mode : {Verify::none, Verify::fast, Verify::full}) {
      const MappedShard shard(reader, 1, mode);
      CHECK_FALSE(shard.is_mapped());
      for (const auto& saved : fx.request.ranks[1].tensors) CHECK(equal_bytes(shard.tensor(saved.name).data, saved.data));
    }
  }
  auto bytes = *mem.file_bytes(path);
  const TensorRecord& f64 = record(m, "f64", 1);
  bytes[static_cast<std::size_t>(f64.begin)] ^= std::byte{1};
  mem.put_file(path, bytes);
  const auto reader = CheckpointReader::open(mem, dir);
  const MappedShard shard(reader, 1, Verify::fast);
  const Error e = test::expect_error([&] { (void)shard.tensor("f64"); });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.file() == path);
  CHECK(test::expect_error([&] { MappedShard(reader, 1, Verify::full); }).code() == Errc::checksum_mismatch);
  mem.put_symlink(path, "/elsewhere");
  CHECK(test::expect_error([&] { MappedShard(reader, 1); }).code() == Errc::unsafe_path);
}
