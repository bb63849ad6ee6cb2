// SPDX-License-Identifier: Apache-2.0
// A rank's shard in several files (CheckpointerOptions::max_file_bytes, schema 3), through
// the Checkpointer and every reader: load_into, load_shard, read_tensor(_range), mapped
// files, verify, a copy to another root; a damaged file refused naming it, the other files
// and the previous checkpoint still loading; the automatic split.
#include <doctest/doctest.h>

#include <cstring>
#include <fstream>

#include "ckpt/read/load_into.hpp"
#include "ckpt/read/mapped.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/copy.hpp"
#include "ckpt/store/store.hpp"
#include "runtime/runtime_fixture.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

// Rank r's tensors; with max_file_bytes 12000 its files are {w0}, {w1}, {big} (larger than the
// limit: a file of its own) and {w2, w3, tiny}.
struct Spec {
  const char* name;
  DType dtype;
  std::uint64_t numel;
  int part;
};
const Spec kSpecs[] = {{"w0", DType::U8, 9000, 0}, {"w1", DType::F32, 1000, 1}, {"big", DType::U8, 40000, 2},
                       {"w2", DType::U8, 5000, 3},  {"w3", DType::U8, 5000, 3},  {"tiny", DType::I64, 1, 3}};
constexpr int kWorld = 2;
constexpr std::uint64_t kLimit = 12000;

struct State {
  std::vector<std::vector<std::uint8_t>> blobs;  // per tensor
  State(int rank, std::uint64_t version) {
    for (const auto& s : kSpecs) blobs.push_back(test::random_bytes(s.numel * dtype_size(s.dtype), 1000 * version + 10 * static_cast<std::uint64_t>(rank) + blobs.size()));
  }
  std::vector<TensorView> views() const {
    std::vector<TensorView> v;
    for (std::size_t i = 0; i < blobs.size(); ++i) v.push_back({kSpecs[i].name, kSpecs[i].dtype, {kSpecs[i].numel}, std::as_bytes(std::span(blobs[i]))});
    return v;
  }
};

// Saves steps 1 and 2 (the states of version 1 and 2) with `limit` as max_file_bytes.
std::vector<State> save_two(const fs::path& root, std::uint64_t limit, WriterBackend b = WriterBackend::posix) {
  std::vector<State> last;
  Checkpointer ckpt({.root = root.string(), .world_size = kWorld, .keep_last = 3, .backend = b, .max_file_bytes = limit});
  for (std::uint64_t step = 1; step <= 2; ++step) {
    std::vector<State> states;
    for (int r = 0; r < kWorld; ++r) states.emplace_back(r, step);
    test::run_ranks(kWorld, [&](int r) { ckpt.save(r, step, states[static_cast<std::size_t>(r)].views(), test::info_for(r, kWorld, 1, step)).wait(); });
    last = std::move(states);
  }
  return last;
}

bool same(std::span<const std::byte> a, const std::vector<std::uint8_t>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), b.size()) == 0;
}

}  // namespace

TEST_CASE("a rank's shard in several files: the manifest lists them and every reader reads them") {
  for (auto b : test::backends()) {
    CAPTURE(test::backend_label(b));
    test::TempDir dir;
    const auto states = save_two(dir.path(), kLimit, b);
    const auto opened = open_latest(posix_file_system(), dir.path().string(), {.expected_world_size = kWorld});
    const CheckpointReader& reader = opened.reader;
    const Manifest& m = reader.manifest();
    CHECK(m.schema_version == 3);
    REQUIRE(m.shards.size() == 8);
    for (int r = 0; r < kWorld; ++r) {
      const auto files = m.files_of(r);
      REQUIRE(files.size() == 4);
      for (int k = 0; k < 4; ++k) {
        CHECK(files[static_cast<std::size_t>(k)].path == shard_file_name(r, kWorld, k, 4));
        CHECK(fs::file_size(dir.path() / "step-0000000002" / files[static_cast<std::size_t>(k)].path) == files[static_cast<std::size_t>(k)].size);
      }
      CHECK(json_of(m.rank_record(r).metadata).at("data_position").as_int64() == 20 + r);
      for (const auto& s : kSpecs) CHECK(m.find_tensor(s.name, r)->part == s.part);
    }

    for (Verify v : {Verify::none, Verify::fast, Verify::full}) {
      CAPTURE(static_cast<int>(v));
      // load_into: every file of both ranks, into memory the test owns.
      std::vector<std::vector<std::vector<std::byte>>> out(kWorld);
      std::vector<std::vector<LoadTarget>> targets(kWorld);
      std::vector<RankLoad> loads;
      for (int r = 0; r < kWorld; ++r) {
        for (std::size_t i = 0; i < std::size(kSpecs); ++i) out[static_cast<std::size_t>(r)].emplace_back(states[static_cast<std::size_t>(r)].blobs[i].size(), std::byte{0xAB});
        for (std::size_t i = 0; i < std::size(kSpecs); ++i)
          targets[static_cast<std::size_t>(r)].push_back({kSpecs[i].name, out[static_cast<std::size_t>(r)][i], kSpecs[i].dtype, {kSpecs[i].numel}, 0, std::nullopt});
        loads.push_back({r, targets[static_cast<std::size_t>(r)]});
      }
      const LoadReport rep = load_into(reader, loads, v);
      CHECK(rep.files == 8);
      for (int r = 0; r < kWorld; ++r)
        for (std::size_t i = 0; i < std::size(kSpecs); ++i) CHECK(same(out[static_cast<std::size_t>(r)][i], states[static_cast<std::size_t>(r)].blobs[i]));

      // load_shard: the rank's files in one buffer, each tensor where its file put it.
      const LoadedShard shard = reader.load_shard(1, v);
      CHECK(shard.record.part == 0);
      CHECK(json_of(shard.record.metadata).at("data_position").as_int64() == 21);
      REQUIRE(shard.tensors.size() == std::size(kSpecs));
      for (std::size_t i = 0; i < std::size(kSpecs); ++i) CHECK(same(shard.tensor(kSpecs[i].name).data, states[1].blobs[i]));

      // One tensor, and a range of one, from the file that holds it.
      CHECK(same(reader.read_tensor("big", 0, v), states[0].blobs[2]));
      const auto range = reader.read_tensor_range("w1", 1, 10, 5, v);
      CHECK(std::memcmp(range.data(), states[1].blobs[1].data() + 40, 20) == 0);
    }

    // Mapped: each file on its own; the rank's shard as one mapping is refused, naming it.
    for (const ShardRecord& f : m.files_of(0)) {
      const MappedShard mapped(reader, f, Verify::fast);
      for (std::size_t i = 0; i < std::size(kSpecs); ++i)
        if (kSpecs[i].part == f.part) CHECK(same(mapped.tensor(kSpecs[i].name).data, states[0].blobs[i]));
    }
    const Error e = test::expect_error([&] { MappedShard(reader, 0, Verify::fast); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.actual() == "4");

    CHECK_NOTHROW(reader.verify(Verify::full));
    CHECK_NOTHROW(reader.verify_shard(1, Verify::full));
  }
}

TEST_CASE("a damaged file of a rank's several is refused naming it, and its other files and the previous checkpoint still load") {
  test::TempDir dir;
  const auto states = save_two(dir.path(), kLimit);
  const fs::path step2 = dir.path() / "step-0000000002";
  const auto opened = open_latest(posix_file_system(), dir.path().string(), {.expected_world_size = kWorld});
  const ShardRecord& bad = opened.reader.manifest().files_of(1)[2];  // rank 1's "big"
  {
    std::fstream f(step2 / bad.path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(bad.size - 100));
    f.put('\x5a');
  }
  const Error full = test::expect_error([&] { opened.reader.verify(Verify::full); });
  CHECK(full.code() == Errc::checksum_mismatch);
  CHECK(full.file() == (step2 / bad.path).string());

  std::vector<std::byte> big(40000), w0(9000);
  const LoadTarget t_big[] = {{"big", big, DType::U8, {40000}, 0, std::nullopt}};
  const Error fast = test::expect_error([&] { load_into(opened.reader, 1, t_big, Verify::fast); });
  CHECK(fast.code() == Errc::checksum_mismatch);
  CHECK(fast.file() == (step2 / bad.path).string());
  // The rank's first file is whole: what it holds still loads, checked.
  const LoadTarget t_w0[] = {{"w0", w0, DType::U8, {9000}, 0, std::nullopt}};
  load_into(opened.reader, 1, t_w0, Verify::fast);
  CHECK(same(w0, states[1].blobs[0]));
  // The previous checkpoint is untouched and loads in full.
  const auto previous = open_step(posix_file_system(), dir.path().string(), 1, kWorld);
  CHECK_NOTHROW(previous.verify(Verify::full));
  const LoadTarget t_prev[] = {{"big", big, DType::U8, {40000}, 0, std::nullopt}};
  load_into(previous, 1, t_prev, Verify::full);
  CHECK(same(big, State(1, 1).blobs[2]));
}

TEST_CASE("a checkpoint of several files per rank copies to another root file by file, verified") {
  test::TempDir dir, other;
  const auto states = save_two(dir.path(), kLimit);
  const auto source = open_store(dir.path().string());
  const auto destination = open_store(other.path().string());
  const auto writer = destination->writer();
  const CopyReport rep = copy_checkpoint(*source, 2, *writer, {.verify = Verify::full});
  CHECK(rep.step == 2);
  const auto copied = open_latest(posix_file_system(), other.path().string(), {.expected_world_size = kWorld});
  CHECK(copied.reader.manifest().shards.size() == 8);
  CHECK_NOTHROW(copied.reader.verify(Verify::full));
  CHECK(same(copied.reader.read_tensor("tiny", 1), states[1].blobs[5]));
}

TEST_CASE("max_file_bytes: automatic splits a large rank into a file per hashing thread but one, never on two threads, and kOneFilePerRank never splits") {
  test::TempDir dir;
  // Two tensors of 65 MiB: above the automatic split's 64 MiB floor, so with four hashing
  // threads and one rank (three files wanted, one thread left for the copy) each is a file.
  std::vector<std::uint8_t> a = test::random_bytes(65u << 20, 1), b = test::random_bytes(65u << 20, 2);
  const std::vector<TensorView> views{{"a", DType::U8, {a.size()}, std::as_bytes(std::span(a))}, {"b", DType::U8, {b.size()}, std::as_bytes(std::span(b))}};
  // With two hashing threads (two cores) the automatic rule leaves the rank one file: it hashes
  // on both threads already (XXH3s apart from SHA-256).
  struct Case {
    std::uint64_t limit;
    int threads;
    std::size_t files;
  };
  for (const Case c : {Case{0, 4, 2}, Case{0, 2, 1}, Case{kOneFilePerRank, 4, 1}}) {
    CAPTURE(c.limit);
    CAPTURE(c.threads);
    test::TempDir root;
    Checkpointer ckpt({.root = root.path().string(), .world_size = 1, .max_file_bytes = c.limit, .hash_threads = c.threads});
    ckpt.save_sync(0, 1, views, SaveInfo{});
    const auto opened = open_latest(posix_file_system(), root.path().string(), {});
    CHECK(opened.reader.manifest().files_of(0).size() == c.files);
    CHECK(opened.reader.manifest().schema_version == (c.files > 1 ? 3 : 2));
    std::vector<std::byte> got(b.size());
    const LoadTarget t[] = {{"b", got, DType::U8, {b.size()}, 0, std::nullopt}};
    load_into(opened.reader, 0, t, Verify::full);
    CHECK(same(got, b));
  }
}

TEST_CASE("max_file_bytes with a node set is refused: its redundancy is planned over one file per rank") {
  test::TempDir dir;
  const Error e = test::expect_error([&] {
    Checkpointer({.root = dir.path().string(), .world_size = 4, .max_file_bytes = 1 << 20, .nodes = NodeOptions{2, *parse_redundancy("replicate:2")}});
  });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "0 or kOneFilePerRank");
}
