// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <unistd.h>

#include "ckpt/store/store.hpp"
#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "io/io_fixture.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

constexpr std::byte kUntouched{0xAB};

// Two ranks of tensors spanning many 4 KiB chunks, so that loads stop mid-file.
struct Spec {
  const char* name;
  DType dtype;
  std::vector<std::uint64_t> shape;
};
const std::vector<Spec> kSpecs = {{"a", DType::U8, {40000}}, {"b", DType::F32, {100, 100}}, {"c", DType::U8, {70001}}, {"d", DType::F32, {3}}};

struct Big {
  std::vector<std::vector<std::vector<std::uint8_t>>> blobs;  // [rank][tensor]
  fs::path root;
  Manifest m;

  explicit Big(const fs::path& dir, FileSystem& fsys = posix_file_system()) : root(dir) {
    SaveRequest req;
    req.step = 7;
    req.chunk_size = 4096;
    req.param_numel = 2;
    blobs.resize(2);
    for (int r = 0; r < 2; ++r) {
      RankState rs;
      auto& b = blobs[static_cast<std::size_t>(r)];
      for (const auto& s : kSpecs) {
        std::uint64_t n = dtype_size(s.dtype);
        for (auto d : s.shape) n *= d;
        b.push_back(test::random_bytes(n, 100 + static_cast<std::uint64_t>(r) * 10 + b.size()));
      }
      for (std::size_t i = 0; i < kSpecs.size(); ++i) rs.tensors.push_back({kSpecs[i].name, kSpecs[i].dtype, kSpecs[i].shape, std::as_bytes(std::span(b[i]))});
      rs.param_shard_offset = static_cast<std::uint64_t>(r);
      rs.param_shard_numel = 1;
      req.ranks.push_back(std::move(rs));
    }
    m = save_checkpoint_sync(fsys, root.string(), req);
  }
  fs::path shard(int r) const { return root / checkpoint_dir_name(m.step) / m.shards[static_cast<std::size_t>(r)].path; }
  const std::vector<std::uint8_t>& blob(int r, std::size_t t) const { return blobs[static_cast<std::size_t>(r)][t]; }
};

// One buffer per tensor of kSpecs, filled with kUntouched.
struct Buffers {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<LoadTarget> targets;
  explicit Buffers(std::vector<std::size_t> which = {0, 1, 2, 3}) {
    for (auto i : which) {
      std::uint64_t n = dtype_size(kSpecs[i].dtype);
      for (auto d : kSpecs[i].shape) n *= d;
      bufs.emplace_back(n, kUntouched);
    }
    for (std::size_t j = 0; j < which.size(); ++j) {
      const Spec& s = kSpecs[which[j]];
      targets.push_back({s.name, std::span(bufs[j]), s.dtype, s.shape});
    }
  }
  bool equals(std::size_t j, const std::vector<std::uint8_t>& want) const {
    return bufs[j].size() == want.size() && std::memcmp(bufs[j].data(), want.data(), want.size()) == 0;
  }
  bool all(std::size_t j, std::byte v) const {
    return std::all_of(bufs[j].begin(), bufs[j].end(), [v](std::byte b) { return b == v; });
  }
};

void flip_byte(const fs::path& p, std::size_t at) {
  auto b = test::read_all(p);
  b.at(at) ^= 0x20;
  test::write_all(p, b);
}

const TensorRecord& record(const Manifest& m, const char* name, int rank) { return *m.find_tensor(name, rank); }

CheckpointReader open_big(const Big& b) { return open_latest(posix_file_system(), b.root.string()).reader; }

}  // namespace

TEST_CASE("load_into fills the caller's buffers with every tensor of a shard, bit-exact, each chunk read once") {
  test::TempDir dir;
  Big big(dir.path());
  const auto reader = open_big(big);
  for (const Verify v : {Verify::none, Verify::fast, Verify::full}) {
    for (int r = 0; r < 2; ++r) {
      Buffers b;
      const LoadReport rep = load_into(reader, r, b.targets, v);
      for (std::size_t t = 0; t < kSpecs.size(); ++t) CHECK(b.equals(t, big.blob(r, t)));
      CHECK(rep.files == 1);
      std::string why;
      if (rep.engine == "io_uring") {
        CHECK(rep.direct);  // /var/tmp takes O_DIRECT here
      } else {
        CHECK(rep.engine == "pread");
        CHECK(rep.fallback.find("io_uring unavailable") != std::string::npos);
      }
      // With none/fast, the chunks from the first tensor's on; with full, every chunk.
      const std::uint64_t n = chunk_count(big.m.shards[static_cast<std::size_t>(r)].size, 4096);
      std::uint64_t first = n;
      for (const auto& s : kSpecs) first = std::min(first, record(big.m, s.name, r).begin / 4096);
      CHECK(rep.chunks_read == (v == Verify::full ? n : n - first));
    }
  }
}

TEST_CASE("a subset load reads only the chunks that cover the requested tensors") {
  test::TempDir dir;
  Big big(dir.path());
  const auto reader = open_big(big);
  Buffers b({1});  // "b": 40000 of the shard's 150000 bytes
  const LoadReport rep = load_into(reader, 1, b.targets, Verify::fast);
  CHECK(b.equals(0, big.blob(1, 1)));
  const TensorRecord& t = record(big.m, "b", 1);
  const std::uint64_t chunks = (t.end + 4095) / 4096 - t.begin / 4096;
  CHECK(rep.chunks_read == chunks);
  CHECK(rep.bytes_read == chunks * 4096);
  CHECK(rep.bytes_read < big.m.shards[1].size / 2);
}

TEST_CASE("an element range of a tensor loads into a buffer of exactly its size") {
  test::TempDir dir;
  Big big(dir.path());
  const auto reader = open_big(big);
  std::vector<std::byte> out(250 * 4, kUntouched);
  const LoadTarget t{"b", out, DType::F32, {100, 100}, 4321, 250};
  const LoadReport rep = load_into(reader, 0, std::span(&t, 1), Verify::fast);
  CHECK(std::memcmp(out.data(), big.blob(0, 1).data() + 4321 * 4, out.size()) == 0);
  CHECK(rep.chunks_read == 1);
  const LoadTarget past{"b", out, DType::F32, {100, 100}, 9800, 250};
  const Error e = test::expect_error([&] { load_into(reader, 0, std::span(&past, 1), Verify::fast); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "within 10000 elements");
  CHECK(e.actual() == "9800+250");
}

TEST_CASE("whole chunks land straight in target memory aligned like the file") {
  test::TempDir dir;
  Big big(dir.path());
  const auto reader = open_big(big);
  const TensorRecord& t = record(big.m, "c", 0);
  AlignedBuffer mem(70001 + 8192, true);
  std::byte* dest = mem.data() + t.begin % 4096;  // file offset and address agree mod 4096
  const LoadTarget tg{"c", std::span(dest, 70001), DType::U8, {70001}};
  const LoadReport rep = load_into(reader, 0, std::span(&tg, 1), Verify::fast, {.io_size = 4096});
  CHECK(std::memcmp(dest, big.blob(0, 2).data(), 70001) == 0);
  if (rep.direct) CHECK(rep.reads_direct >= 70001 / 4096 - 2);
  else CHECK(rep.reads_direct > 0);  // buffered: no alignment needed at all
}

TEST_CASE("the pread fallback, forced, loads the same bytes and says why it was used") {
  test::TempDir dir;
  Big big(dir.path());
  const auto reader = open_big(big);
  for (const Verify v : {Verify::fast, Verify::full}) {
    Buffers b;
    const LoadReport rep = load_into(reader, 1, b.targets, v, {.engine = LoadEngine::pread, .io_size = 8192});
    for (std::size_t t = 0; t < kSpecs.size(); ++t) CHECK(b.equals(t, big.blob(1, t)));
    CHECK(rep.engine == "pread");
    CHECK(rep.fallback.find("forced") != std::string::npos);
  }
}

TEST_CASE("where O_DIRECT is refused or not asked for, the load reads buffered and says why it did") {
  // tmpfs refused O_DIRECT (EINVAL) before Linux 6.6 and takes it since: whichever this
  // kernel does, the load must agree with a probe and load the same bytes.
  if (fs::is_directory("/dev/shm")) {
    std::string templ = "/dev/shm/ckpt-load-into-XXXXXX";
    REQUIRE(mkdtemp(templ.data()) != nullptr);
    struct Remove {
      std::string p;
      ~Remove() { fs::remove_all(p); }
    } remove{templ};
    Big big(templ);
    const int probe = ::open(big.shard(0).c_str(), O_RDONLY | O_DIRECT);
    const bool takes_direct = probe >= 0;
    if (probe >= 0) ::close(probe);
    const auto reader = open_big(big);
    Buffers b;
    const LoadReport rep = load_into(reader, 0, b.targets, Verify::fast);
    for (std::size_t t = 0; t < kSpecs.size(); ++t) CHECK(b.equals(t, big.blob(0, t)));
    CHECK(rep.direct == takes_direct);
    if (!takes_direct) CHECK(rep.fallback.find("refuses O_DIRECT") != std::string::npos);
  }
  test::TempDir dir;
  Big big(dir.path());
  const auto reader = open_big(big);
  for (const LoadEngine engine : {LoadEngine::automatic, LoadEngine::pread}) {
    Buffers b;
    const LoadReport rep = load_into(reader, 1, b.targets, Verify::full, {.engine = engine, .direct = false});
    for (std::size_t t = 0; t < kSpecs.size(); ++t) CHECK(b.equals(t, big.blob(1, t)));
    CHECK_FALSE(rep.direct);
  }
}

TEST_CASE("a checksum mismatch in chunk k names the file and chunk, leaves earlier targets verified and zeroes the chunks in flight") {
  test::TempDir dir;
  Big big(dir.path());
  const TensorRecord& c = record(big.m, "c", 0);
  const std::uint64_t k = c.begin / 4096 + 5;  // a chunk inside "c"
  flip_byte(big.shard(0), k * 4096 + 100);
  const auto reader = open_big(big);
  for (const LoadEngine engine : {LoadEngine::automatic, LoadEngine::pread}) {
    CAPTURE(static_cast<int>(engine));
    Buffers b;
    const Error e = test::expect_error(
        [&] { load_into(reader, 0, b.targets, Verify::fast, {.engine = engine, .queue_depth = 2, .io_size = 4096}); });
    CHECK(e.code() == Errc::checksum_mismatch);
    CHECK(e.file() == big.shard(0).string());
    CHECK(e.detail().find("xxh3 of chunk " + std::to_string(k) + " of") != std::string::npos);
    CHECK(e.detail().find("chunks " + std::to_string(k) + ".." + std::to_string(k + 1) + " were zeroed") != std::string::npos);
    CHECK(e.expected() != e.actual());
    // The file holds b, d, a, c (larger elements first): the first three lie before chunk k,
    // verified and whole.
    CHECK(record(big.m, "a", 0).end <= k * 4096);
    CHECK(b.equals(0, big.blob(0, 0)));
    CHECK(b.equals(1, big.blob(0, 1)));
    CHECK(b.equals(3, big.blob(0, 3)));
    // "c": verified bytes before chunk k, zeros for chunks k and k + 1, untouched after.
    const std::size_t zb = k * 4096 - c.begin, ze = zb + 2 * 4096;
    const auto& want = big.blob(0, 2);
    CHECK(std::memcmp(b.bufs[2].data(), want.data(), zb) == 0);
    CHECK(std::all_of(b.bufs[2].begin() + static_cast<std::ptrdiff_t>(zb), b.bufs[2].begin() + static_cast<std::ptrdiff_t>(ze),
                      [](std::byte x) { return x == std::byte{0}; }));
    CHECK(std::all_of(b.bufs[2].begin() + static_cast<std::ptrdiff_t>(ze), b.bufs[2].end(), [](std::byte x) { return x == kUntouched; }));
  }
  // Targets that the bad chunk does not cover still load.
  Buffers ok({0, 1, 3});
  CHECK_NOTHROW(load_into(reader, 0, ok.targets, Verify::fast));
  CHECK(ok.equals(0, big.blob(0, 0)));
  CHECK(ok.equals(2, big.blob(0, 3)));
}

TEST_CASE("a shard truncated after the checkpoint was opened is a size mismatch and no target is touched") {
  test::TempDir dir;
  Big big(dir.path());
  const auto reader = open_big(big);
  const auto size = fs::file_size(big.shard(1));
  fs::resize_file(big.shard(1), size - 5000);
  for (const LoadEngine engine : {LoadEngine::automatic, LoadEngine::pread}) {
    Buffers b;
    const Error e = test::expect_error([&] { load_into(reader, 1, b.targets, Verify::fast, {.engine = engine}); });
    CHECK(e.code() == Errc::size_mismatch);
    CHECK(e.file() == big.shard(1).string());
    CHECK(e.expected() == std::to_string(size) + " bytes");
    CHECK(e.actual() == std::to_string(size - 5000) + " bytes");
    for (std::size_t t = 0; t < kSpecs.size(); ++t) CHECK(b.all(t, kUntouched));
  }
}

TEST_CASE("a target of the wrong dtype, shape or size, or naming no tensor, is refused before anything is read") {
  test::TempDir dir;
  Big big(dir.path());
  const auto reader = open_big(big);
  const std::string shard = big.shard(0).string();
  auto refused = [&](auto&& change) {
    Buffers b;
    change(b.targets);
    const Error e = test::expect_error([&] { load_into(reader, 0, b.targets, Verify::fast); });
    CHECK(e.file() == shard);
    for (std::size_t t = 0; t < kSpecs.size(); ++t) CHECK(b.all(t, kUntouched));  // nothing read
    return e;
  };
  Error e = refused([](auto& t) { t[1].dtype = DType::BF16; });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "dtype of the target buffer of tensor 'b'");
  CHECK(e.expected() == "F32");
  CHECK(e.actual() == "BF16");
  e = refused([](auto& t) { t[1].shape = {10000}; });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "shape of the target buffer of tensor 'b'");
  CHECK(e.expected() == "[100, 100]");
  CHECK(e.actual() == "[10000]");
  e = refused([](auto& t) { t[3].out = t[3].out.first(8); });
  CHECK(e.code() == Errc::size_mismatch);
  CHECK(e.detail().find("tensor 'd'") != std::string::npos);
  CHECK(e.expected() == "12 bytes");
  CHECK(e.actual() == "8 bytes");
  e = refused([](auto& t) { t[2].name = "nope"; });
  CHECK(e.code() == Errc::not_found);
  CHECK(e.detail().find("'nope'") != std::string::npos);
  // In a multi-rank load, a bad target of the last rank stops the load before any file is read.
  Buffers first, second;
  second.targets[0].name = "nope";
  const RankLoad both[] = {{0, first.targets}, {1, second.targets}};
  e = test::expect_error([&] { load_into(reader, both, Verify::fast); });
  CHECK(e.code() == Errc::not_found);
  CHECK(first.all(0, kUntouched));
}

TEST_CASE("a manifest index that calls an F32 tensor I32 is refused at every verify level naming the field, and no target is touched") {
  // The shard is intact and its header says F32: loading its float bits as int32 because the
  // index says so is what the header check prevents. The caller asks for what the index says.
  test::TempDir dir;
  Big big(dir.path());
  test::write_index_dtype(big.root / checkpoint_dir_name(big.m.step), big.m, "b", 1, DType::I32);
  const auto reader = open_big(big);
  for (const Verify v : {Verify::none, Verify::fast, Verify::full}) {
    CAPTURE(verify_name(v));
    for (const bool both_ranks : {false, true}) {
      Buffers r0, r1;
      r1.targets[1].dtype = DType::I32;
      const RankLoad both[] = {{0, r0.targets}, {1, r1.targets}};
      const Error e = test::expect_error([&] {
        if (both_ranks) load_into(reader, both, v, {.threads = 2});
        else load_into(reader, 1, r1.targets, v);
      });
      CHECK(e.code() == Errc::malformed_shard);
      CHECK(e.file() == big.shard(1).string());
      CHECK(e.detail() == "tensor 'b' disagrees with the manifest index in its dtype");
      CHECK(e.expected() == "I32");
      CHECK(e.actual() == "F32");
      // Refused before any target of either rank was written.
      for (std::size_t t = 0; t < kSpecs.size(); ++t) {
        CHECK(r0.all(t, kUntouched));
        CHECK(r1.all(t, kUntouched));
      }
    }
  }
  // Rank 0's shard, whose index is right, still loads.
  Buffers ok;
  load_into(reader, 0, ok.targets, Verify::none);
  for (std::size_t t = 0; t < kSpecs.size(); ++t) CHECK(ok.equals(t, big.blob(0, t)));
}

TEST_CASE("with verify full a SHA-256 mismatch zeroes every target of the file and the error says so") {
  test::TempDir dir;
  Big big(dir.path());
  // Forge the chunk digests to match a tampered shard: only the SHA-256 can tell.
  flip_byte(big.shard(0), static_cast<std::size_t>(record(big.m, "b", 0).begin + 10));
  Manifest m = big.m;
  FileHasher h(m.chunk_size, false);
  const auto bytes = test::read_all(big.shard(0));
  h.update(std::as_bytes(std::span(bytes)));
  m.shards[0].chunk_xxh3 = h.finish().chunk_xxh3;
  const auto text = encode_manifest(m);
  test::write_all(big.root / checkpoint_dir_name(m.step) / "manifest.json", std::vector<std::uint8_t>(text.begin(), text.end()));
  const auto reader = open_big(big);
  {
    Buffers b;
    CHECK_NOTHROW(load_into(reader, 0, b.targets, Verify::fast));  // every chunk passes
  }
  Buffers b, other;
  const RankLoad both[] = {{1, other.targets}, {0, b.targets}};
  const Error e = test::expect_error([&] { load_into(reader, both, Verify::full, {.threads = 1}); });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.file() == big.shard(0).string());
  CHECK(e.detail().find("sha256 of the whole file; every target of this file was zeroed") == 0);
  CHECK(e.expected() == big.m.shards[0].sha256);
  for (std::size_t t = 0; t < kSpecs.size(); ++t) {
    CHECK(b.all(t, std::byte{0}));
    CHECK(other.equals(t, big.blob(1, t)));  // rank 1's file passed before rank 0's was read
  }
}

TEST_CASE("a multi-rank load reads every shard on its own thread, with full verification") {
  test::TempDir dir;
  Big big(dir.path());
  const auto reader = open_big(big);
  Buffers r0, r1;
  const RankLoad both[] = {{0, r0.targets}, {1, r1.targets}};
  const LoadReport rep = load_into(reader, both, Verify::full, {.threads = 2});
  CHECK(rep.files == 2);
  CHECK(rep.bytes_read == big.m.shards[0].size + big.m.shards[1].size);
  for (std::size_t t = 0; t < kSpecs.size(); ++t) {
    CHECK(r0.equals(t, big.blob(0, t)));
    CHECK(r1.equals(t, big.blob(1, t)));
  }
}

TEST_CASE("a checkpoint on another FileSystem loads through its read_at") {
  testing::MemoryFileSystem mem;
  mem.create_dirs("/root");
  Big big("/root", mem);
  const auto reader = open_latest(mem, "/root").reader;
  Buffers b;
  const LoadReport rep = load_into(reader, 1, b.targets, Verify::full);
  CHECK(rep.engine == "file_system");
  CHECK_FALSE(rep.direct);
  for (std::size_t t = 0; t < kSpecs.size(); ++t) CHECK(b.equals(t, big.blob(1, t)));
}

TEST_CASE("bad load options are refused by name") {
  test::TempDir dir;
  Big big(dir.path());
  const auto reader = open_big(big);
  Buffers b;
  Error e = test::expect_error([&] { load_into(reader, 0, b.targets, Verify::fast, {.queue_depth = 0}); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "LoadOptions::queue_depth");
  e = test::expect_error([&] { load_into(reader, 0, b.targets, Verify::fast, {.io_size = 1000}); });
  CHECK(e.detail() == "LoadOptions::io_size");
  CHECK(b.all(0, kUntouched));
}

namespace {

// One rank of 50 MiB in 1 MiB chunks: enough for load_into to read it in three parts of at
// least 16 MiB. The file holds "y" (F32, 20 MiB) then "x" (U8, 30 MiB + 13).
struct Wide {
  std::vector<std::uint8_t> x = test::random_bytes((30u << 20) + 13, 71), y = test::random_bytes(20u << 20, 72);
  fs::path root;
  Manifest m;
  explicit Wide(const fs::path& dir) : root(dir) {
    SaveRequest req;
    req.step = 3;
    req.chunk_size = 1u << 20;
    req.param_numel = 1;
    RankState rs;
    rs.tensors.push_back({"x", DType::U8, {x.size()}, std::as_bytes(std::span(x))});
    rs.tensors.push_back({"y", DType::F32, {y.size() / 4}, std::as_bytes(std::span(y))});
    rs.param_shard_numel = 1;
    req.ranks.push_back(std::move(rs));
    m = save_checkpoint_sync(posix_file_system(), root.string(), req);
  }
  fs::path shard() const { return root / checkpoint_dir_name(m.step) / m.shards[0].path; }
};

// Targets for Wide: "x" one byte off its file offset mod 4096 (every read through a bounce
// buffer), "y" at its file offset mod 4096 (whole reads land in it).
struct WideTargets {
  std::vector<std::byte> xmem;
  AlignedBuffer ymem;
  std::span<std::byte> x, y;
  std::vector<LoadTarget> targets;
  explicit WideTargets(const Wide& w) : xmem(w.x.size() + 4096 + 1, kUntouched), ymem(w.y.size() + 4096, true) {
    const TensorRecord& tx = *w.m.find_tensor("x", 0);
    const TensorRecord& ty = *w.m.find_tensor("y", 0);
    std::byte* xa = xmem.data() + (4096 - reinterpret_cast<std::uintptr_t>(xmem.data()) % 4096) % 4096;  // 4096-aligned
    x = std::span(xa + (tx.begin + 1) % 4096, w.x.size());
    y = std::span(ymem.data() + ty.begin % 4096, w.y.size());
    std::memset(y.data(), static_cast<int>(kUntouched), y.size());
    targets = {{"x", x, DType::U8, {w.x.size()}}, {"y", y, DType::F32, {w.y.size() / 4}}};
  }
};

}  // namespace

TEST_CASE("with fewer files than threads one file is read in parts by several threads, bit-exact, with verify none and fast") {
  test::TempDir dir;
  Wide w(dir.path());
  const auto reader = open_latest(posix_file_system(), w.root.string()).reader;
  const std::uint64_t chunks = (w.m.shards[0].size + (1u << 20) - 1) >> 20;
  for (const Verify v : {Verify::none, Verify::fast, Verify::full}) {
    for (const int threads : {1, 3, 8}) {
      CAPTURE(static_cast<int>(v));
      CAPTURE(threads);
      WideTargets t(w);
      const LoadReport rep = load_into(reader, 0, t.targets, v, {.threads = threads});
      CHECK(rep.files == 1);
      // Full verification hashes the file in order: one part. Otherwise min(threads, 50 MiB / 16 MiB).
      CHECK(rep.parts == (v == Verify::full || threads == 1 ? 1u : 3u));
      CHECK(rep.chunks_read == chunks);
      CHECK(rep.bytes_read == w.m.shards[0].size);
      CHECK(std::memcmp(t.x.data(), w.x.data(), w.x.size()) == 0);
      CHECK(std::memcmp(t.y.data(), w.y.data(), w.y.size()) == 0);
      if (rep.direct) CHECK(rep.reads_direct >= (w.y.size() >> 20) - 2);  // y's whole reads, in every part
    }
  }
}

TEST_CASE("a bad chunk in one part of a file read in parts is the error, once every part stopped, and nothing unverified is left unzeroed") {
  test::TempDir dir;
  Wide w(dir.path());
  const TensorRecord& tx = *w.m.find_tensor("x", 0);
  const std::uint64_t k = (tx.end >> 20) - 2;  // in the last third of the file: the last part
  flip_byte(w.shard(), k * (1u << 20) + 77);
  const auto reader = open_latest(posix_file_system(), w.root.string()).reader;
  WideTargets t(w);
  const Error e = test::expect_error([&] { load_into(reader, 0, t.targets, Verify::fast, {.threads = 3}); });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.file() == w.shard().string());
  CHECK(e.detail().find("xxh3 of chunk " + std::to_string(k) + " of") != std::string::npos);
  CHECK(e.detail().find("were zeroed") != std::string::npos);
  // Every byte of a target is the checkpoint's, zero (a chunk being read when the load stopped)
  // or untouched (a chunk not reached); the bad chunk's are zero.
  auto each_byte_allowed = [](std::span<const std::byte> got, const std::vector<std::uint8_t>& want) {
    for (std::size_t i = 0; i < got.size(); ++i)
      if (got[i] != std::byte{want[i]} && got[i] != std::byte{0} && got[i] != kUntouched) return false;
    return true;
  };
  CHECK(each_byte_allowed(t.x, w.x));
  CHECK(each_byte_allowed(t.y, w.y));
  const std::size_t kb = k * (1u << 20) - tx.begin;
  CHECK(std::all_of(t.x.begin() + static_cast<std::ptrdiff_t>(kb), t.x.begin() + static_cast<std::ptrdiff_t>(kb + (1u << 20)),
                    [](std::byte b) { return b == std::byte{0}; }));
  // Nothing lost: the tensor the bad chunk does not cover still loads.
  WideTargets again(w);
  load_into(reader, 0, std::span(&again.targets[1], 1), Verify::fast, {.threads = 3});
  CHECK(std::memcmp(again.y.data(), w.y.data(), w.y.size()) == 0);
}
