// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <string>

#include "ckpt/core/error.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/format/manifest_limits.hpp"
#include "ckpt/format/detail/manifest_parse.hpp"
#include "ckpt/format/sharding.hpp"

using namespace ckpt;
namespace json = boost::json;

namespace {
// A manifest of `world` ranks, rank r holding one F32 tensor "w" of `shapes[r]` elements at
// byte 4096, with the sharding `desc[r]`.
Manifest sliced(const std::vector<std::vector<std::uint64_t>>& shapes, const std::vector<std::optional<TensorSharding>>& desc) {
  Manifest m;
  m.world_size = static_cast<int>(shapes.size());
  m.created_at = "2026-11-29T10:00:00.000Z";
  m.chunk_size = 4096;
  for (int r = 0; r < m.world_size; ++r) {
    ShardRecord s;
    s.rank = r;
    s.path = "rank-" + std::to_string(r) + ".safetensors";
    s.size = 1 << 20;
    s.sha256 = std::string(64, 'a');
    s.chunk_xxh3.assign(256, 1);
    m.shards.push_back(s);
    std::uint64_t n = 1;
    for (auto d : shapes[static_cast<std::size_t>(r)]) n *= d;
    TensorRecord t{"w", r, DType::F32, shapes[static_cast<std::size_t>(r)], 4096, 4096 + 4 * n, desc[static_cast<std::size_t>(r)]};
    m.tensors.push_back(t);
  }
  return m;
}

Error decode_error_of(const Manifest& m) {
  try {
    decode_manifest(encode_manifest(m), "/c/manifest.json");
  } catch (const Error& e) {
    return e;
  }
  FAIL("accepted");
  return Error(Errc::aborted, "", "");
}
}  // namespace

TEST_CASE("split_range gives the first n mod parts parts one more item, as numpy.array_split") {
  CHECK(split_range(10, 0, 3).first == 0);
  CHECK(split_range(10, 0, 3).count == 4);
  CHECK(split_range(10, 1, 3).first == 4);
  CHECK(split_range(10, 1, 3).count == 3);
  CHECK(split_range(10, 2, 3).first == 7);
  CHECK(split_range(10, 2, 3).count == 3);
  CHECK(split_range(2, 3, 4).count == 0);
  CHECK(split_range(2, 3, 4).first == 2);
  CHECK_THROWS_AS(split_range(10, 3, 3), Error);
  CHECK_THROWS_AS(split_range(10, 0, 0), Error);
}

TEST_CASE("row and column slices describe their box of the global tensor") {
  const TensorSharding r = row_slice("W", 5, 4, 1, 2);
  CHECK(r.global == "W");
  CHECK(r.global_shape == std::vector<std::uint64_t>{5, 4});
  CHECK(r.offsets == std::vector<std::uint64_t>{3, 0});
  CHECK(r.lengths == std::vector<std::uint64_t>{2, 4});
  const TensorSharding c = column_slice("W", 5, 7, 2, 3);
  CHECK(c.offsets == std::vector<std::uint64_t>{0, 5});
  CHECK(c.lengths == std::vector<std::uint64_t>{5, 2});
  const TensorSharding h = replicated({3, 1, 1, 2});
  CHECK(h.kind == TensorSharding::Kind::replicated);
  CHECK(h.holders == std::vector<int>{1, 2, 3});
  CHECK_THROWS_AS(replicated({}), Error);
}

TEST_CASE("sharding descriptions round-trip through the manifest as schema 2") {
  Manifest m = sliced({{3, 4}, {2, 4}, {1}}, {row_slice("W", 5, 4, 0, 2), row_slice("W", 5, 4, 1, 2), rank_local()});
  m.tensors[2].name = "rng";
  m.tensors.push_back({"bias", 0, DType::F32, {4}, 8192, 8208, replicated({0, 1, 2})});
  const std::string text = encode_manifest(m);
  CHECK(text.find("\"schema_version\": 2") != std::string::npos);
  const Manifest d = decode_manifest(text, "m");
  CHECK(d.schema_version == 2);
  REQUIRE(d.tensors.size() == 4);
  CHECK(d.tensors[0].sharding == m.tensors[0].sharding);
  CHECK(d.tensors[1].sharding == m.tensors[1].sharding);
  CHECK(d.tensors[2].sharding->kind == TensorSharding::Kind::rank_local);
  CHECK(d.tensors[3].sharding->holders == std::vector<int>{0, 1, 2});
  CHECK(d.find_tensor("bias", 2) == nullptr);
  CHECK(d.find_held_tensor("bias", 2) == &d.tensors[3]);
  CHECK(encode_manifest(d) == text);
}

TEST_CASE("a schema 1 manifest still loads and may not carry sharding descriptions") {
  Manifest m = sliced({{4}}, {std::nullopt});
  m.schema_version = 1;
  CHECK(decode_manifest(encode_manifest(m), "m").schema_version == 1);
  m.tensors[0].sharding = rank_local();
  const Error e = decode_error_of(m);
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.detail() == "tensors[0].rank_local");
}

TEST_CASE("overlapping slices are refused naming the global tensor and both ranks") {
  const Error e = decode_error_of(sliced({{3, 4}, {3, 4}}, {slice_of("W", {5, 4}, {0, 0}, {3, 4}), slice_of("W", {5, 4}, {2, 0}, {3, 4})}));
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == "/c/manifest.json");
  CHECK(e.detail() == "slices of global tensor 'W'");
  CHECK(e.expected() == "slices that tile [5, 4] exactly (no gap, no overlap)");
  CHECK(e.actual() == "the slices of rank 0 and rank 1 overlap at element [2, 0]");
}

TEST_CASE("a gap between slices is refused naming the element no slice covers") {
  const Error e = decode_error_of(sliced({{2, 4}, {2, 4}}, {slice_of("W", {5, 4}, {0, 0}, {2, 4}), slice_of("W", {5, 4}, {3, 0}, {2, 4})}));
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.detail() == "slices of global tensor 'W'");
  CHECK(e.actual() == "no slice covers element [2, 0] (slices from ranks 0, 1)");
}

TEST_CASE("a slice outside the global shape is refused naming its rank") {
  const Error e = decode_error_of(sliced({{3, 4}, {3, 4}}, {slice_of("W", {5, 4}, {0, 0}, {3, 4}), slice_of("W", {5, 4}, {3, 0}, {3, 4})}));
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.detail() == "tensors[1].slice");
  CHECK(e.actual() == "offsets [3, 0], lengths [3, 4] on rank 1");
}

TEST_CASE("slices of one global tensor with different dtypes or global shapes are refused") {
  Manifest m = sliced({{3, 4}, {2, 4}}, {row_slice("W", 5, 4, 0, 2), row_slice("W", 5, 4, 1, 2)});
  m.tensors[1].dtype = DType::I32;
  Error e = decode_error_of(m);
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.expected() == "one dtype (F32 on rank 0)");
  CHECK(e.actual() == "I32 on rank 1");
  m = sliced({{3, 4}, {2, 4}}, {row_slice("W", 5, 4, 0, 2), slice_of("W", {6, 4}, {3, 0}, {2, 4})});
  e = decode_error_of(m);
  CHECK(e.actual() == "[6, 4] on rank 1");
  CHECK(e.detail() == "slices of global tensor 'W'");
}

TEST_CASE("slice lengths must equal the tensor's shape") {
  const Error e = decode_error_of(sliced({{3, 4}, {2, 4}}, {row_slice("W", 5, 4, 0, 2), slice_of("W", {5, 4}, {3, 0}, {2, 3})}));
  CHECK(e.detail() == "tensors[1].slice.lengths");
  CHECK(e.expected() == "the tensor's shape [2, 4]");
}

TEST_CASE("replicated holders must be ascending and start at the entry's rank") {
  Manifest m = sliced({{4}, {4}}, {replicated({0, 1}), std::nullopt});
  m.tensors.pop_back();
  m.tensors[0].sharding->holders = {1, 0};
  Error e = decode_error_of(m);
  CHECK(e.detail() == "tensors[0].replicated.holders");
  CHECK(e.expected() == "ascending ranks, each once");
  m.tensors[0].sharding->holders = {1};
  e = decode_error_of(m);
  CHECK(e.expected() == "the lowest holder is the entry's rank 0");
  m.tensors[0].sharding->holders = {0, 2};
  e = decode_error_of(m);
  CHECK(e.detail() == "tensors[0].replicated.holders");
  CHECK(e.expected() == "at most 1");
}

TEST_CASE("a replicated tensor counts as a tensor of every holder for name uniqueness") {
  Manifest m = sliced({{4}, {4}}, {replicated({0, 1}), std::nullopt});
  const Error e = decode_error_of(m);
  CHECK(e.detail() == "tensors");
  CHECK(e.actual() == "'w' repeated on rank 1");
}

TEST_CASE("uneven, empty and two-dimensional grid slices tile their tensor") {
  // 3 rows over 4 ranks: the last one holds none.
  CHECK_NOTHROW(decode_manifest(encode_manifest(sliced({{1, 2}, {1, 2}, {1, 2}, {0, 2}}, {row_slice("W", 3, 2, 0, 4), row_slice("W", 3, 2, 1, 4),
                                                                                             row_slice("W", 3, 2, 2, 4), row_slice("W", 3, 2, 3, 4)})),
                                "m"));
  // a 2 x 2 grid of a [4, 6] tensor
  CHECK_NOTHROW(decode_manifest(encode_manifest(sliced({{2, 3}, {2, 3}, {2, 3}, {2, 3}},
                                                       {slice_of("W", {4, 6}, {0, 0}, {2, 3}), slice_of("W", {4, 6}, {0, 3}, {2, 3}),
                                                        slice_of("W", {4, 6}, {2, 0}, {2, 3}), slice_of("W", {4, 6}, {2, 3}, {2, 3})})),
                                "m"));
}

TEST_CASE("tiling_problem checks many slices in time proportional to their grid") {
  constexpr int kParts = 20000;
  std::vector<std::vector<std::uint64_t>> offs(kParts), lens(kParts);
  std::vector<SliceBox> boxes;
  for (int p = 0; p < kParts; ++p) {
    const SplitRange s = split_range(1000003, p, kParts);
    offs[p] = {s.first};
    lens[p] = {s.count};
  }
  for (int p = 0; p < kParts; ++p) boxes.push_back({p, offs[p], lens[p]});
  const std::vector<std::uint64_t> shape{1000003};
  CHECK_FALSE(tiling_problem(shape, boxes).has_value());
  lens[kParts - 1][0] -= 1;
  CHECK(tiling_problem(shape, boxes) == std::optional<std::string>("no slice covers element [1000002] (slices from ranks 0, 1, 2, 3, 4, 5, 6, 7, ...)"));
}

TEST_CASE("a tiling cut into too many pieces is refused instead of examined") {
  // n slices each cutting both dimensions at new places: n^2 grid cells.
  constexpr std::uint64_t n = 2000;
  std::vector<std::vector<std::uint64_t>> offs(n), lens(n);
  std::vector<SliceBox> boxes;
  for (std::uint64_t i = 0; i < n; ++i) {
    offs[i] = {i, i};
    lens[i] = {1, 1};
  }
  for (std::uint64_t i = 0; i < n; ++i) boxes.push_back({static_cast<int>(i), offs[i], lens[i]});
  const std::vector<std::uint64_t> shape{n, n};
  const auto p = tiling_problem(shape, boxes);
  REQUIRE(p.has_value());
  CHECK(p->find("too fragmented") != std::string::npos);
}

TEST_CASE("the manifest scan counts sharding fields inside the schema and their allowance") {
  Manifest m = sliced({{3, 4}, {2, 4}}, {row_slice("W", 5, 4, 0, 2), row_slice("W", 5, 4, 1, 2)});
  m.tensors.push_back({"b", 0, DType::F32, {4}, 8192, 8208, replicated({0, 1})});
  const std::string text = encode_manifest(m);
  detail::ManifestParseStats stats;
  detail::parse_manifest_json(text.size(), [&](std::uint64_t o) { return std::string_view(text).substr(o); }, "m", [](const json::value&) {},
                              &stats);
  CHECK(stats.counts.outside_schema_bytes == 0);
  CHECK(stats.counts.shardings == 3);
  CHECK(stats.counts.holders == 2);
  CHECK(stats.counts.dims == 2 + 2 + 1 + 3 * 2 * 2);
  CHECK(text.size() * 2 < stats.allowance);
}
