// SPDX-License-Identifier: Apache-2.0
// Sharded-tensor metadata end to end: save() records slice, replicated and rank-local
// descriptions (replicated tensors written once), and load_slices reads any box of a global
// tensor at any world size and split, N -> M -> N byte-identical.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <thread>

#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/read/slice_load.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/runtime/coordinator.hpp"
#include "ckpt/runtime/wire.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using ckpt::testing::MemoryFileSystem;

namespace {

enum class Split { rows, columns };

// The global [R, C] F32 tensor "W": element (i, j) = i * 1000 + j + seed.
std::vector<float> global_w(std::uint64_t R, std::uint64_t C, float seed) {
  std::vector<float> w(R * C);
  for (std::uint64_t i = 0; i < R; ++i)
    for (std::uint64_t j = 0; j < C; ++j) w[i * C + j] = static_cast<float>(i * 1000 + j) + seed;
  return w;
}

TensorSharding part_of(Split s, std::uint64_t R, std::uint64_t C, int part, int parts) {
  return s == Split::rows ? row_slice("W", R, C, part, parts) : column_slice("W", R, C, part, parts);
}

// The box of `w` a description names, copied out row-major.
std::vector<float> box_of(const std::vector<float>& w, std::uint64_t C, const TensorSharding& d) {
  std::vector<float> out;
  for (std::uint64_t i = 0; i < d.lengths[0]; ++i)
    for (std::uint64_t j = 0; j < d.lengths[1]; ++j) out.push_back(w[(d.offsets[0] + i) * C + d.offsets[1] + j]);
  return out;
}

struct Saved {
  std::vector<std::vector<float>> parts;  // per rank
  std::vector<float> bias;                // replicated on every rank
  std::vector<std::uint64_t> rng;         // rank-local, per rank
};

// Saves W split `s` over `world` ranks, a replicated bias and a rank-local rng, at `step`.
Manifest save_layout(FileSystem& fs, const std::string& root, std::uint64_t step, const std::vector<float>& w, std::uint64_t R,
                     std::uint64_t C, Split s, int world, Saved& keep) {
  keep.parts.clear();
  keep.bias = {1.5f, 2.5f, 3.5f};
  keep.rng.resize(static_cast<std::size_t>(world));
  std::iota(keep.rng.begin(), keep.rng.end(), 100);
  SaveRequest req;
  req.step = step;
  for (int r = 0; r < world; ++r) keep.parts.push_back(box_of(w, C, part_of(s, R, C, r, world)));
  std::vector<int> all(static_cast<std::size_t>(world));
  std::iota(all.begin(), all.end(), 0);
  for (int r = 0; r < world; ++r) {
    const TensorSharding d = part_of(s, R, C, r, world);
    RankState rs;
    rs.tensors.push_back({"w.part", DType::F32, d.lengths, std::as_bytes(std::span(keep.parts[static_cast<std::size_t>(r)])), d});
    rs.tensors.push_back({"bias", DType::F32, {3}, std::as_bytes(std::span(keep.bias)), replicated(all)});
    rs.tensors.push_back({"rng", DType::U64, {1}, std::as_bytes(std::span(keep.rng).subspan(static_cast<std::size_t>(r), 1)), rank_local()});
    req.ranks.push_back(std::move(rs));
  }
  return save_checkpoint_sync(fs, root, req);
}

// A checkpoint of the global [R, C] W row-sliced over `world` ranks, in memory, opened.
struct RowSliced {
  MemoryFileSystem fs;
  std::vector<float> w;
  Saved keep;
  CheckpointReader reader;
  RowSliced(std::uint64_t R, std::uint64_t C, int world)
      : w(global_w(R, C, 0)), reader((save_layout(fs, "/a", 1, w, R, C, Split::rows, world, keep), CheckpointReader::open(fs, "/a/" + checkpoint_dir_name(1)))) {}
};

// Loads the box `d` of global W from `reader`.
std::vector<float> load_box(const CheckpointReader& reader, const TensorSharding& d) {
  std::uint64_t n = 1;
  for (auto l : d.lengths) n *= l;
  std::vector<float> out(n, -1.0f);
  const SliceTarget t{"W", DType::F32, d.offsets, d.lengths, std::as_writable_bytes(std::span(out))};
  load_slices(reader, std::span(&t, 1), Verify::fast);
  return out;
}

}  // namespace

TEST_CASE("save records slice, replicated and rank-local descriptions and writes a replicated tensor once") {
  MemoryFileSystem fs;
  const std::uint64_t R = 7, C = 5;
  const auto w = global_w(R, C, 0);
  Saved keep;
  const Manifest m = save_layout(fs, "/ck", 1, w, R, C, Split::rows, 3, keep);
  CHECK(m.schema_version == 2);
  const TensorRecord* p1 = m.find_tensor("w.part", 1);
  REQUIRE(p1);
  CHECK(p1->sharding == row_slice("W", 7, 5, 1, 3));
  const TensorRecord* bias = m.find_tensor("bias", 0);
  REQUIRE(bias);
  CHECK(bias->sharding->holders == std::vector<int>{0, 1, 2});
  CHECK(m.find_tensor("bias", 1) == nullptr);
  CHECK(m.find_tensor("bias", 2) == nullptr);
  CHECK(m.find_held_tensor("bias", 2) == bias);
  CHECK(m.find_tensor("rng", 2)->sharding->kind == TensorSharding::Kind::rank_local);
  // The reader decodes the same descriptions, and the holders' shards do not hold the bias.
  const auto reader = CheckpointReader::open(fs, m.shards.empty() ? "" : "/ck/" + checkpoint_dir_name(1));
  CHECK(reader.manifest().find_tensor("w.part", 2)->sharding == row_slice("W", 7, 5, 2, 3));
  const LoadedShard s1 = reader.load_shard(1, Verify::full);
  for (const auto& t : s1.tensors) CHECK(t.name != "bias");
  CHECK(s1.tensors.size() == 2);
}

TEST_CASE("a tensor replicated on 4 ranks costs its bytes once on disk") {
  const auto disk = [](bool replicate) {
    MemoryFileSystem fs;
    std::vector<float> big(1 << 16, 0.25f);
    SaveRequest req;
    req.step = 1;
    for (int r = 0; r < 4; ++r) {
      RankState rs;
      TensorView v{"embedding", DType::F32, {big.size()}, std::as_bytes(std::span(big)), std::nullopt};
      if (replicate) v.sharding = replicated({0, 1, 2, 3});
      rs.tensors.push_back(v);
      req.ranks.push_back(std::move(rs));
    }
    save_checkpoint_sync(fs, "/ck", req);
    return fs.total_file_bytes();
  };
  const std::uint64_t plain = disk(false), once = disk(true);
  MESSAGE("4 copies: " << plain << " bytes, replicated: " << once << " bytes");
  // 3 of the 4 copies of 256 KiB are gone (what remains of the other shards: their headers).
  CHECK(plain - once >= 3 * (256u << 10));
  CHECK(once < plain / 2);
}

TEST_CASE("the Checkpointer records descriptions and leaves replicated tensors to their lowest holder") {
  test::TempDir dir;
  const int world = 2;
  std::vector<float> a{1, 2, 3, 4}, b{5, 6, 7, 8}, shared{9, 9};
  Checkpointer ckpt({.root = dir.path().string(), .world_size = world});
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r)
    ranks.emplace_back([&, r] {
      std::vector<TensorView> views{{"w", DType::F32, {1, 4}, std::as_bytes(std::span(r == 0 ? a : b)), row_slice("W", 2, 4, r, 2)},
                                    {"shared", DType::F32, {2}, std::as_bytes(std::span(shared)), replicated({0, 1})}};
      ckpt.save(r, 3, views, SaveInfo{}).wait();
    });
  for (auto& t : ranks) t.join();
  const auto opened = open_latest(posix_file_system(), dir.path().string());
  const Manifest& m = opened.reader.manifest();
  CHECK(m.find_tensor("w", 1)->sharding == row_slice("W", 2, 4, 1, 2));
  CHECK(m.find_tensor("shared", 1) == nullptr);
  CHECK(m.find_held_tensor("shared", 1)->rank == 0);
  std::vector<float> whole(8);
  const SliceTarget t{"W", DType::F32, {}, {}, std::as_writable_bytes(std::span(whole))};
  load_slices(opened.reader, std::span(&t, 1), Verify::full);
  CHECK(whole == std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8});
}

TEST_CASE("every holder of a replicated tensor reads it from the lowest holder's shard") {
  MemoryFileSystem fs;
  std::vector<float> shared{1.5f, 2.5f, 3.5f, 4.5f};
  std::vector<float> own[3] = {{10}, {11}, {12}};
  SaveRequest req;
  req.step = 1;
  for (int r = 0; r < 3; ++r) {
    RankState rs;
    rs.tensors.push_back({"own", DType::F32, {1}, std::as_bytes(std::span(own[r])), std::nullopt});
    // Held by ranks 1 and 2 only: stored once, in rank 1's shard.
    if (r > 0) rs.tensors.push_back({"shared", DType::F32, {4}, std::as_bytes(std::span(shared)), replicated({1, 2})});
    req.ranks.push_back(std::move(rs));
  }
  save_checkpoint_sync(fs, "/ck", req);
  const auto reader = CheckpointReader::open(fs, "/ck/" + checkpoint_dir_name(1));
  const Manifest& m = reader.manifest();
  REQUIRE(m.find_tensor("shared", 2) == nullptr);
  CHECK(m.held_tensors(2).size() == 2);
  CHECK(m.held_tensors(0).size() == 1);
  const auto as_floats = [](const std::vector<std::byte>& b) {
    std::vector<float> f(b.size() / sizeof(float));
    std::memcpy(f.data(), b.data(), b.size());
    return f;
  };
  CHECK(as_floats(reader.read_tensor("shared", 2)) == shared);
  CHECK(as_floats(reader.read_tensor_range("shared", 2, 1, 2)) == std::vector<float>{2.5f, 3.5f});
  // Rank 2's own tensor and the replicated one in one load (two files), then ranks 1 and 2 at once.
  std::vector<float> got(4, 0.0f), got_own(1, 0.0f);
  const LoadTarget two[] = {load_target("shared", std::span(got)), load_target("own", std::span(got_own))};
  load_into(reader, 2, two, Verify::full);
  CHECK(got == shared);
  CHECK(got_own == std::vector<float>{12});
  std::vector<float> a(4), b(4);
  const LoadTarget ta[] = {load_target("shared", std::span(a))}, tb[] = {load_target("shared", std::span(b))};
  const RankLoad both[] = {{1, ta}, {2, tb}};
  load_into(reader, both, Verify::fast);
  CHECK(a == shared);
  CHECK(b == shared);
  // Rank 0 does not hold it: not found, naming the rank.
  std::vector<float> none(4);
  const LoadTarget t0[] = {load_target("shared", std::span(none))};
  CHECK_THROWS_WITH_AS(load_into(reader, 0, t0, Verify::fast), doctest::Contains("no tensor 'shared' on rank 0"), Error);
  CHECK_THROWS_AS(reader.read_tensor("shared", 0), Error);
}

TEST_CASE("save refuses descriptions that cannot be right and slices that do not tile their tensor") {
  MemoryFileSystem fs;
  std::vector<float> x(6);
  const auto save_with = [&](std::vector<std::optional<TensorSharding>> d) {
    SaveRequest req;
    req.step = 1;
    for (std::size_t r = 0; r < d.size(); ++r) {
      RankState rs;
      rs.tensors.push_back({"x", DType::F32, {2, 3}, std::as_bytes(std::span(x)), d[r]});
      req.ranks.push_back(std::move(rs));
    }
    save_checkpoint_sync(fs, "/ck", req);
  };
  Error e = test::error_of([&] { save_with({slice_of("W", {4, 3}, {0, 0}, {2, 2}), std::nullopt}); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "tensor 'x' of rank 0: slice lengths");
  e = test::error_of([&] { save_with({std::nullopt, replicated({0, 2})}); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "tensor 'x' of rank 1: replicated holders");
  e = test::error_of([&] { save_with({replicated({1}), std::nullopt}); });
  CHECK(e.expected() == "include the saving rank");
  // Each slice fits, together they overlap: the commit's manifest check refuses it.
  e = test::error_of([&] { save_with({slice_of("W", {3, 3}, {0, 0}, {2, 3}), slice_of("W", {3, 3}, {1, 0}, {2, 3})}); });
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.actual() == "the slices of rank 0 and rank 1 overlap at element [1, 0]");
  CHECK_FALSE(fs.stat("/ck/" + checkpoint_dir_name(1)));
}

TEST_CASE("row and column slices round-trip N to M to N byte-identical for 2, 3 and 4 ranks, even and uneven") {
  for (const auto& [R, C] : {std::pair<std::uint64_t, std::uint64_t>{12, 12}, {7, 5}}) {
    for (const Split s : {Split::rows, Split::columns}) {
      for (int n : {2, 3, 4}) {
        for (int mw : {2, 3, 4}) {
          CAPTURE(R);
          CAPTURE(C);
          CAPTURE(s == Split::rows ? "rows" : "columns");
          CAPTURE(n);
          CAPTURE(mw);
          MemoryFileSystem fs;
          const auto w = global_w(R, C, 0.5f);
          Saved first;
          save_layout(fs, "/a", 1, w, R, C, s, n, first);
          const auto a = CheckpointReader::open(fs, "/a/" + checkpoint_dir_name(1));
          // N -> M, with the other split (a row-sliced checkpoint loads as columns too).
          const Split other = s == Split::rows ? Split::columns : Split::rows;
          SaveRequest req;
          req.step = 2;
          std::vector<std::vector<float>> mid;
          for (int r = 0; r < mw; ++r) mid.push_back(load_box(a, part_of(other, R, C, r, mw)));
          for (int r = 0; r < mw; ++r) {
            CHECK(mid[static_cast<std::size_t>(r)] == box_of(w, C, part_of(other, R, C, r, mw)));
            const TensorSharding d = part_of(other, R, C, r, mw);
            RankState rs;
            rs.tensors.push_back({"w.part", DType::F32, d.lengths, std::as_bytes(std::span(mid[static_cast<std::size_t>(r)])), d});
            req.ranks.push_back(std::move(rs));
          }
          save_checkpoint_sync(fs, "/b", req);
          const auto b = CheckpointReader::open(fs, "/b/" + checkpoint_dir_name(2));
          // M -> N: the original parts, bit for bit.
          for (int r = 0; r < n; ++r) {
            const auto back = load_box(b, part_of(s, R, C, r, n));
            REQUIRE(back.size() == first.parts[static_cast<std::size_t>(r)].size());
            CHECK(std::memcmp(back.data(), first.parts[static_cast<std::size_t>(r)].data(), back.size() * 4) == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("a load reads only the byte ranges of the slices it needs") {
  const std::uint64_t R = 4096, C = 256;  // 4 MiB of F32, 1 MiB per rank
  const RowSliced ck(R, C, 4);
  const CheckpointReader& a = ck.reader;
  const auto& w = ck.w;
  // Rows 1024..1535 lie in rank 1's slice alone.
  std::vector<float> out(512 * C);
  const SliceTarget t{"W", DType::F32, {1024, 0}, {512, C}, std::as_writable_bytes(std::span(out))};
  const auto globals = global_tensors(a.manifest());
  const auto runs = plan_slice_reads(globals, std::span(&t, 1));
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].record->rank == 1);
  CHECK(runs[0].source_first == 0);
  CHECK(runs[0].count == 512 * C);
  const LoadReport rep = load_slices(a, std::span(&t, 1), Verify::fast);
  CHECK(rep.files == 1);
  CHECK(rep.bytes_read <= 512 * C * 4 + 2 * kDefaultChunkSize);
  CHECK(out == box_of(w, C, slice_of("W", {R, C}, {1024, 0}, {512, C})));
  // A column of a row-sliced tensor: one run per row, on every rank.
  std::vector<float> col(R);
  const SliceTarget c{"W", DType::F32, {0, 7}, {R, 1}, std::as_writable_bytes(std::span(col))};
  CHECK(plan_slice_reads(globals, std::span(&c, 1)).size() == R);
  load_slices(a, std::span(&c, 1), Verify::fast);
  for (std::uint64_t i = 0; i < R; ++i) CHECK(col[i] == w[i * C + 7]);
}

TEST_CASE("replicated and single tensors load as global tensors, rank-local ones do not") {
  const RowSliced ck(4, 4, 3);
  const CheckpointReader& a = ck.reader;
  const auto globals = global_tensors(a.manifest());
  REQUIRE(globals.size() == 2);
  CHECK(globals[0].name == "W");
  CHECK(globals[0].split_dims() == std::vector<std::size_t>{0});
  CHECK(globals[1].name == "bias");
  CHECK(globals[1].origin == GlobalTensor::Origin::replicated);
  std::vector<float> bias(3);
  const SliceTarget t{"bias", DType::F32, {}, {}, std::as_writable_bytes(std::span(bias))};
  load_slices(a, std::span(&t, 1), Verify::fast);
  CHECK(bias == ck.keep.bias);
}

TEST_CASE("targets outside the global shape, of another dtype, size or name are refused before anything is read") {
  const RowSliced ck(6, 4, 2);
  const CheckpointReader& a = ck.reader;
  std::vector<float> out(8, 7.0f);
  const auto bytes = std::as_writable_bytes(std::span(out));
  const auto err = [&](SliceTarget t) { return test::error_of([&] { load_slices(a, std::span(&t, 1), Verify::fast); }); };
  Error e = err({"W", DType::F32, {5, 0}, {2, 4}, bytes});
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "box of the target of global tensor 'W'");
  CHECK(e.expected() == "within its shape [6, 4]");
  CHECK(e.actual() == "offsets [5, 0], lengths [2, 4]");
  e = err({"W", DType::F16, {0, 0}, {2, 4}, bytes});
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "F32");
  CHECK(e.actual() == "F16");
  e = err({"W", DType::F32, {0, 0}, {2, 3}, bytes});
  CHECK(e.code() == Errc::size_mismatch);
  e = err({"W", DType::F32, {0}, {2}, bytes});
  CHECK(e.code() == Errc::invalid_argument);
  e = err({"V", DType::F32, {}, {}, bytes});
  CHECK(e.code() == Errc::not_found);
  CHECK(out == std::vector<float>(8, 7.0f));  // nothing written
}

TEST_CASE("a target asking to convert gets the stored floats in its own dtype, across the ranks' slices") {
  const RowSliced ck(6, 4, 3);  // W[i, j] = i * 1000 + j, rows split 2/2/2
  const CheckpointReader& a = ck.reader;
  // Rows 1..4 span three ranks' slices; as F64 (exact) and as BF16 (rounded once).
  std::vector<double> wide(16, -1.0);
  std::vector<std::uint16_t> narrow(16, 0);
  const SliceTarget targets[] = {{"W", DType::F64, {1, 0}, {4, 4}, std::as_writable_bytes(std::span(wide)), true},
                                 {"W", DType::BF16, {1, 0}, {4, 4}, std::as_writable_bytes(std::span(narrow)), true}};
  load_slices(a, targets, Verify::fast);
  for (std::uint64_t i = 0; i < 4; ++i)
    for (std::uint64_t j = 0; j < 4; ++j) {
      const float v = ck.w[(i + 1) * 4 + j];
      CHECK(wide[i * 4 + j] == static_cast<double>(v));
      CHECK(narrow[i * 4 + j] == f32_to_bf16(v));
    }
  // Only float types convert: asked for I32, still refused, and nothing is written.
  std::vector<std::int32_t> ints(16, 9);
  const SliceTarget bad{"W", DType::I32, {1, 0}, {4, 4}, std::as_writable_bytes(std::span(ints)), true};
  const Error e = test::error_of([&] { load_slices(a, std::span(&bad, 1), Verify::fast); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "dtype conversion of the target of global tensor 'W' (float types only)");
  CHECK(e.actual() == "F32 to I32");
  CHECK(ints == std::vector<std::int32_t>(16, 9));
}

TEST_CASE("a rank's report to the coordinator carries its sharding descriptions across processes") {
  RankReport r;
  r.rank = 1;
  r.shard.shard.rank = 1;
  r.shard.shard.path = "rank-00001-of-00002.safetensors";
  r.shard.shard.size = 8192;
  r.shard.shard.sha256 = std::string(64, 'a');
  r.shard.shard.chunk_xxh3 = {1, 2};
  r.shard.chunk_size = 4096;
  r.shard.tensors.push_back({"w", 1, DType::F32, {2, 4}, 4096, 4128, row_slice("W", 4, 4, 1, 2)});
  r.shard.tensors.push_back({"rng", 1, DType::U64, {1}, 4128, 4136, rank_local()});
  r.shard.tensors.push_back({"b", 1, DType::F32, {2}, 4136, 4144, replicated({1, 3})});
  const RankReport d = detail::decode_rank_report(detail::encode_rank_report(7, r));
  REQUIRE(d.shard.tensors.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(d.shard.tensors[i].rank == 1);
    CHECK(d.shard.tensors[i].sharding == r.shard.tensors[i].sharding);
  }
}

TEST_CASE("a rank's report carries the redundancy blocks its process wrote across processes, also with an error") {
  RankReport r;
  r.rank = 2;
  r.shard.shard.rank = 2;
  r.shard.shard.path = "rank-00002-of-00004.safetensors";
  r.shard.shard.size = 4096;
  r.shard.shard.sha256 = std::string(64, 'b');
  r.shard.shard.chunk_xxh3 = {3};
  r.shard.chunk_size = 4096;
  RedundancyBlock parity{RedundancyBlock::Kind::parity, 2, 3, 1, -1, "parity-s00003-p1.rs", 8193, std::string(64, 'c'), 0x0123456789abcdefull, {5, 6, 7}};
  RedundancyBlock replica{RedundancyBlock::Kind::replica, 3, -1, -1, 1, "replica-rank-00001-of-00004.safetensors", 4096, std::string(64, 'd'), 42, {9}};
  r.blocks = {parity, replica};
  const auto same = [](const RedundancyBlock& a, const RedundancyBlock& b) {
    return a.kind == b.kind && a.node == b.node && a.stripe == b.stripe && a.index == b.index && a.rank == b.rank && a.path == b.path &&
           a.size == b.size && a.sha256 == b.sha256 && a.xxh3 == b.xxh3 && a.chunk_xxh3 == b.chunk_xxh3;
  };
  const RankReport d = detail::decode_rank_report(detail::encode_rank_report(7, r));
  REQUIRE(d.blocks.size() == 2);
  CHECK(same(d.blocks[0], parity));
  CHECK(same(d.blocks[1], replica));
  // A rank whose shard failed still hands over the blocks its process wrote (they are
  // removed with the step's temporaries; the error is what counts).
  r.error = Error(Errc::no_space, "/n/x", "write failed");
  const RankReport e = detail::decode_rank_report(detail::encode_rank_report(7, r));
  REQUIRE(e.error.has_value());
  CHECK(e.error->code() == Errc::no_space);
  CHECK(e.blocks.size() == 2);
  // A block that does not decode makes the message a comm_error.
  std::string text = detail::encode_rank_report(7, r);
  text.replace(text.find("0123456789abcdef"), 16, "0123456789abcdeZ");
  CHECK(test::error_of([&] { detail::decode_rank_report(text); }).code() == Errc::comm_error);
}
