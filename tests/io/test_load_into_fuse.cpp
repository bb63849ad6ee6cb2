// SPDX-License-Identifier: Apache-2.0
// load_into on file systems that treat O_DIRECT their own way: FUSE mounts that take an
// O_DIRECT open and refuse the reads (EINVAL), or cut them short off a block boundary, or
// refuse the open; bindfs, a real passthrough; tmpfs. Every load gives the checkpoint's
// bytes, LoadReport says how they were read, and a file read buffered against the caller's
// wish says so in exactly one log line.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "ckpt/store/store.hpp"
#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/ops/save.hpp"
#include "support/fuse_mount.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
namespace fs = std::filesystem;
using Kind = test::FuseMount::Kind;

namespace {

constexpr std::uint64_t kChunk = 16384;
constexpr std::byte kUntouched{0xAB};
constexpr int kRanks = 2;

struct Tensor {
  const char* name;
  DType dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t bytes() const {
    std::uint64_t n = dtype_size(dtype);
    for (auto d : shape) n *= d;
    return n;
  }
};
// About 170 KB per shard: 11 chunks of 16 KiB, two 8 KiB reads each with io_size 8192.
const std::vector<Tensor> kTensors = {{"w", DType::F32, {300, 100}}, {"x", DType::U8, {50001}}, {"y", DType::F16, {7}}};

// Two ranks' shards of kTensors (random bytes) saved under `root`.
struct Saved {
  fs::path root;
  Manifest m;
  std::vector<std::vector<std::vector<std::uint8_t>>> bytes;  // [rank][tensor]

  explicit Saved(const fs::path& dir) : root(dir) {
    SaveRequest req;
    req.step = 7;
    req.chunk_size = kChunk;
    req.param_numel = kRanks;
    bytes.resize(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      RankState rs;
      for (std::size_t t = 0; t < kTensors.size(); ++t) {
        bytes[static_cast<std::size_t>(r)].push_back(test::random_bytes(kTensors[t].bytes(), 31 * static_cast<std::uint64_t>(r) + t));
        rs.tensors.push_back({kTensors[t].name, kTensors[t].dtype, kTensors[t].shape, std::as_bytes(std::span(bytes[static_cast<std::size_t>(r)][t]))});
      }
      rs.param_shard_offset = static_cast<std::uint64_t>(r);
      rs.param_shard_numel = 1;
      req.ranks.push_back(std::move(rs));
    }
    m = save_checkpoint_sync(posix_file_system(), root.string(), req);
  }
  std::uint64_t size(int r) const { return m.shards[static_cast<std::size_t>(r)].size; }
  const TensorRecord& record(const char* name, int r) const { return *m.find_tensor(name, r); }
};

// Every tensor of every rank, each in its own buffer filled with kUntouched; "w" of each rank
// lies at an address that agrees with its file offset mod 4096, so whole reads of it land
// straight in the target (no bounce buffer), the path a refused pass leaves half-written.
struct Targets {
  std::vector<AlignedBuffer> mem;
  std::vector<std::vector<LoadTarget>> of_rank;
  std::vector<RankLoad> loads;

  explicit Targets(const Saved& s) : of_rank(kRanks) {
    for (int r = 0; r < kRanks; ++r)
      for (const auto& t : kTensors) {
        const std::uint64_t shift = s.record(t.name, r).begin % 4096;
        AlignedBuffer& b = mem.emplace_back(static_cast<std::size_t>(t.bytes() + shift), true);
        std::memset(b.data(), static_cast<int>(kUntouched), b.capacity());
        of_rank[static_cast<std::size_t>(r)].push_back({t.name, std::span(b.data() + shift, static_cast<std::size_t>(t.bytes())), t.dtype, t.shape});
      }
    for (int r = 0; r < kRanks; ++r) loads.push_back({r, of_rank[static_cast<std::size_t>(r)]});
  }
  std::span<std::byte> out(int r, std::size_t t) const { return of_rank[static_cast<std::size_t>(r)][t].out; }
  bool holds(const Saved& s, int r) const {
    for (std::size_t t = 0; t < kTensors.size(); ++t) {
      const auto& want = s.bytes[static_cast<std::size_t>(r)][t];
      if (std::memcmp(out(r, t).data(), want.data(), want.size()) != 0) return false;
    }
    return true;
  }
};

CheckpointReader open_at(const fs::path& root) { return open_latest(posix_file_system(), root.string()).reader; }

// True if an O_DIRECT read of the file's first block succeeds.
bool direct_read_works(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) return false;
  AlignedBuffer b(4096, false);
  const ssize_t n = ::pread(fd, b.data(), 4096, 0);
  ::close(fd);
  return n == 4096;
}

// The log lines of load_into about `shard`.
std::size_t lines_about(const test::LogCapture& log, const std::string& shard) { return log.matching({"load_into: " + shard + ": "}).size(); }

// Loads every tensor of both ranks through `root` and checks what the report and the log say
// about a load that had to read every file buffered (`because` in LoadReport::fallback).
void check_buffered_load(const Saved& saved, const fs::path& root, const std::string& because) {
  const auto reader = open_at(root);
  for (const LoadEngine engine : {LoadEngine::automatic, LoadEngine::pread})
    for (const Verify v : {Verify::none, Verify::fast, Verify::full}) {
      CAPTURE(static_cast<int>(engine));
      CAPTURE(static_cast<int>(v));
      Targets t(saved);
      test::LogCapture log;
      const LoadReport rep = load_into(reader, t.loads, v, {.engine = engine, .io_size = 8192, .threads = 2});
      for (int r = 0; r < kRanks; ++r) CHECK(t.holds(saved, r));
      CHECK(rep.files == 2);
      CHECK_FALSE(rep.direct);
      CHECK(rep.fallback.find("buffered reads: " + because) != std::string::npos);
      for (int r = 0; r < kRanks; ++r) CHECK(lines_about(log, reader.shard_path(r)) == 1);
      CHECK(log.lines().size() == 2);
    }
}

// Loads every tensor of both ranks through `root`, on a file system left alone: direct where
// an O_DIRECT read works there, else buffered (refused at open), one log line per file.
void check_load_as_allowed(const Saved& saved, const fs::path& root) {
  const auto reader = open_at(root);
  const bool direct = direct_read_works(reader.shard_path(0));
  for (const Verify v : {Verify::none, Verify::fast, Verify::full}) {
    CAPTURE(static_cast<int>(v));
    Targets t(saved);
    test::LogCapture log;
    const LoadReport rep = load_into(reader, t.loads, v, {.io_size = 8192});
    for (int r = 0; r < kRanks; ++r) CHECK(t.holds(saved, r));
    CHECK(rep.direct == direct);
    if (!direct) CHECK(rep.fallback.find("buffered reads: the file system refuses O_DIRECT at open (EINVAL)") != std::string::npos);
    for (int r = 0; r < kRanks; ++r) CHECK(lines_about(log, reader.shard_path(r)) == (direct ? 0u : 1u));
  }
}

}  // namespace

TEST_CASE("through a FUSE mount that takes O_DIRECT opens and refuses the reads, load_into reads each file again buffered: same bytes, one log line per file") {
  test::TempDir dir;
  const Saved saved(dir / "src");
  const test::FuseMount mnt(saved.root, dir / "mnt", Kind::refuse_direct_io);
  const auto reader = open_at(mnt.path());
  REQUIRE_FALSE(direct_read_works(reader.shard_path(0)));  // the refusal this test is about
  check_buffered_load(saved, mnt.path(), "the file system refused an O_DIRECT read at byte ");
  // Buffered reads (not asked to be direct) take no detour and log nothing.
  Targets t(saved);
  test::LogCapture log;
  const LoadReport rep = load_into(reader, t.loads, Verify::full, {.direct = false});
  CHECK(t.holds(saved, 0));
  CHECK(t.holds(saved, 1));
  CHECK(rep.fallback.empty());
  CHECK(log.lines().empty());
}

TEST_CASE("an O_DIRECT read refused in the middle of a file starts that file over buffered: its hashes restart and targets already written are written again") {
  test::TempDir dir;
  const Saved saved(dir / "src");
  // Reads before byte 3 chunks + 8 KiB go through: the refused read is the second of chunk 3,
  // after chunks 0-2 were hashed, checked and copied out (and "w" partly read in place).
  const std::uint64_t from = 3 * kChunk + 8192;
  const test::FuseMount mnt(saved.root, dir / "mnt", Kind::refuse_direct_io, from);
  const auto reader = open_at(mnt.path());
  REQUIRE(direct_read_works(reader.shard_path(0)));
  for (const LoadEngine engine : {LoadEngine::automatic, LoadEngine::pread})
    for (const Verify v : {Verify::fast, Verify::full}) {
      CAPTURE(static_cast<int>(engine));
      CAPTURE(static_cast<int>(v));
      Targets t(saved);
      test::LogCapture log;
      const LoadReport rep = load_into(reader, t.loads, v, {.engine = engine, .queue_depth = 2, .io_size = 8192, .threads = 1});
      // A SHA-256 or chunk XXH3 fed the first pass's bytes again would fail the load.
      for (int r = 0; r < kRanks; ++r) CHECK(t.holds(saved, r));
      CHECK_FALSE(rep.direct);
      CHECK(rep.fallback.find("buffered reads: the file system refused an O_DIRECT read at byte " + std::to_string(from) + " ") != std::string::npos);
      // The report counts the pass that delivered the bytes: each byte once.
      if (v == Verify::full) CHECK(rep.bytes_read == saved.size(0) + saved.size(1));
      for (int r = 0; r < kRanks; ++r) CHECK(lines_about(log, reader.shard_path(r)) == 1);
      CHECK(log.matching({"refused an O_DIRECT read at byte " + std::to_string(from), "again from its start, buffered"}).size() == 2);
    }
}

TEST_CASE("an O_DIRECT read through FUSE cut short off a block boundary makes load_into read the file again buffered") {
  test::TempDir dir;
  const Saved saved(dir / "src");
  const test::FuseMount mnt(saved.root, dir / "mnt", Kind::short_direct_reads);
  check_buffered_load(saved, mnt.path(), "an O_DIRECT read at byte 0 returned 7680 of 8192 bytes, short of the file's end");
}

TEST_CASE("a FUSE mount that refuses O_DIRECT at open is read buffered: same bytes, one log line per file") {
  test::TempDir dir;
  const Saved saved(dir / "src");
  const test::FuseMount mnt(saved.root, dir / "mnt", Kind::refuse_direct_open);
  check_buffered_load(saved, mnt.path(), "the file system refuses O_DIRECT at open (EINVAL)");
}

TEST_CASE("through bindfs, a passthrough FUSE file system, load_into loads the same bytes with every verify mode") {
  test::TempDir dir;
  const Saved saved(dir / "src");
  const test::FuseMount mnt(saved.root, dir / "mnt", Kind::bindfs);
  check_load_as_allowed(saved, mnt.path());  // bindfs hands O_DIRECT to the directory below
}

TEST_CASE("on tmpfs load_into loads the same bytes with every verify mode: direct where tmpfs takes O_DIRECT, else buffered with one log line per file") {
  if (!fs::is_directory("/dev/shm")) {
    MESSAGE("skipped: no tmpfs at /dev/shm");
    std::exit(77);
  }
  const test::TempDir shm("ckpt-load-into", "/dev/shm");
  const Saved saved(shm.path());
  check_load_as_allowed(saved, saved.root);  // direct since Linux 6.6
}

TEST_CASE("a corrupt chunk read through a FUSE mount that refuses O_DIRECT reads is a checksum mismatch naming the file and chunk, after one fallback") {
  test::TempDir dir;
  const Saved saved(dir / "src");
  const fs::path shard = saved.root / checkpoint_dir_name(saved.m.step) / saved.m.shards[0].path;
  const TensorRecord& x = saved.record("x", 0);
  const std::uint64_t k = x.begin / kChunk + 1;  // a chunk inside "x"
  auto b = test::read_all(shard);
  b.at(k * kChunk + 100) ^= 0x20;
  test::write_all(shard, b);
  const test::FuseMount mnt(saved.root, dir / "mnt", Kind::refuse_direct_io);
  const auto reader = open_at(mnt.path());
  for (const Verify v : {Verify::fast, Verify::full}) {
    CAPTURE(static_cast<int>(v));
    Targets t(saved);
    test::LogCapture log;
    const Error e = test::expect_error([&] { load_into(reader, 0, t.of_rank[0], v, {.queue_depth = 1, .io_size = 8192}); });
    CHECK(e.code() == Errc::checksum_mismatch);
    CHECK(e.file() == reader.shard_path(0));
    CHECK(e.expected() != e.actual());
    CHECK(lines_about(log, reader.shard_path(0)) == 1);
    CHECK(e.detail().find("xxh3 of chunk " + std::to_string(k) + " of") != std::string::npos);
    if (v == Verify::fast) {
      CHECK(e.detail().find("chunks " + std::to_string(k) + ".." + std::to_string(k) + " were zeroed") != std::string::npos);
      // "w" lies before chunk k: verified and whole; "x" verified up to chunk k, zero in it.
      CHECK(std::memcmp(t.out(0, 0).data(), saved.bytes[0][0].data(), saved.bytes[0][0].size()) == 0);
      const std::size_t zb = static_cast<std::size_t>(k * kChunk - x.begin);
      CHECK(std::memcmp(t.out(0, 1).data(), saved.bytes[0][1].data(), zb) == 0);
      CHECK(std::all_of(t.out(0, 1).begin() + static_cast<std::ptrdiff_t>(zb), t.out(0, 1).begin() + static_cast<std::ptrdiff_t>(zb + kChunk),
                        [](std::byte c) { return c == std::byte{0}; }));
    } else {
      CHECK(e.detail().find("every target of this file was zeroed") != std::string::npos);
      for (std::size_t i = 0; i < kTensors.size(); ++i)
        CHECK(std::all_of(t.out(0, i).begin(), t.out(0, i).end(), [](std::byte c) { return c == std::byte{0}; }));
    }
  }
}
