// SPDX-License-Identifier: Apache-2.0
// Schema 3: a rank's shard in several files. The table's rules (each (rank, part) once, parts
// 0..n-1 of every rank, a path once, the rank's param range and metadata on part 0 only, a
// tensor's part one of its rank's files and its byte range within that file), each hostile
// variant refused naming the field, the expected and the actual value.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <algorithm>
#include <string>

#include "ckpt/core/error.hpp"
#include "ckpt/format/boost_json.hpp"
#include "ckpt/format/manifest.hpp"
#include "support/test_support.hpp"
#include "support/manifest_edit.hpp"

using namespace ckpt;
namespace json = boost::json;

namespace {

ShardRecord file(int rank, int part, std::uint64_t size) {
  ShardRecord s;
  s.rank = rank;
  s.part = part;
  s.path = "rank-0000" + std::to_string(rank) + "-of-00002.part-0000" + std::to_string(part) + "-of-00002.safetensors";
  s.size = size;
  s.sha256 = std::string(64, 'a');
  s.xxh3 = 0x1234;
  s.chunk_xxh3 = {1, 2};
  return s;
}

// Two ranks, two files each: rank r's "a" in part 0, "b" in part 1.
Manifest sample() {
  std::vector<ShardReport> reports;
  for (int r = 0; r < 2; ++r) {
    ShardReport rep;
    rep.chunk_size = 4096;
    rep.shard = file(r, 0, 5000);
    rep.shard.param_shard_offset = 50u * static_cast<unsigned>(r);
    rep.shard.param_shard_numel = 50;
    json_of(rep.shard.metadata)["data_position"] = 7 + r;
    rep.more_files.push_back(file(r, 1, 6000));
    rep.tensors.push_back({"a", r, DType::F32, {50}, 4096, 4296, std::nullopt, 0});
    rep.tensors.push_back({"b", r, DType::F32, {10}, 4096, 4136, std::nullopt, 1});
    rep.param_numel = 100;
    reports.push_back(std::move(rep));
  }
  return assemble_manifest(10, 4096, std::move(reports));
}

Error decode_error(const std::function<void(json::object&)>& edit) { return test::manifest_decode_error(sample(), edit, "/c/manifest.json"); }

json::object& entry(json::object& o, const char* table, std::size_t i) { return o[table].as_array()[i].as_object(); }

}  // namespace

TEST_CASE("a manifest whose ranks have several files is schema 3 and round-trips every file") {
  const Manifest m = sample();
  CHECK(m.schema_version == kFilesPerRankSchemaVersion);
  const std::string text = encode_manifest(m);
  const json::object o = json::parse(text).as_object();
  CHECK(o.at("schema_version").as_int64() == 3);
  // Part 0 carries the rank's range and metadata; part 1 does not.
  CHECK(o.at("shards").as_array()[0].as_object().contains("param_shard_offset"));
  CHECK(!o.at("shards").as_array()[1].as_object().contains("param_shard_offset"));
  CHECK(!o.at("shards").as_array()[1].as_object().contains("metadata"));
  CHECK(o.at("tensors").as_array()[1].as_object().at("part").as_int64() == 1);
  CHECK(!o.at("tensors").as_array()[0].as_object().contains("part"));

  const Manifest d = decode_manifest(text, "/c/manifest.json");
  REQUIRE(d.shards.size() == 4);
  CHECK(d.has_file_parts());
  for (int r = 0; r < 2; ++r) {
    const auto files = d.files_of(r);
    REQUIRE(files.size() == 2);
    CHECK(files[0].part == 0);
    CHECK(files[1].part == 1);
    CHECK(files[1].size == 6000);
    CHECK(d.rank_record(r).param_shard_offset == 50u * static_cast<unsigned>(r));
    CHECK(json_of(d.rank_record(r).metadata).at("data_position").as_int64() == 7 + r);
    const TensorRecord* b = d.find_tensor("b", r);
    REQUIRE(b);
    CHECK(b->part == 1);
    CHECK(&d.file_of(*b) == &files[1]);
  }
  // Asking for "the" file of a rank with two is refused, naming both counts.
  const Error e = test::expect_error([&] { (void)d.shard(1); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "1");
  CHECK(e.actual() == "2");
  // The table's order in the file does not matter: it is sorted by (rank, part) on decode.
  json::value v = json::parse(text);
  auto& shards = v.as_object()["shards"].as_array();
  std::swap(shards[0], shards[3]);
  const Manifest shuffled = decode_manifest(json::serialize(v), "/c/manifest.json");
  CHECK(shuffled.files_of(1)[1].size == 6000);
  CHECK(shuffled.shards.front().rank == 0);
}

TEST_CASE("schema 3's hostile shard tables are refused naming the field, the expected and the actual value") {
  SUBCASE("a file listed twice (the same rank and part)") {
    const Error e = decode_error([](json::object& o) { entry(o, "shards", 1)["part"] = 0; });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.detail() == "shards[1]");
    CHECK(e.expected() == "each (rank, part) once");
    CHECK(e.actual() == "rank 0 part 0 repeated");
  }
  SUBCASE("two entries naming the same file") {
    const Error e = decode_error([](json::object& o) { entry(o, "shards", 3)["path"] = entry(o, "shards", 1)["path"]; });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.detail() == "shards[rank 1 part 1].path");
    CHECK(e.expected() == "a path used once");
  }
  SUBCASE("a part missing from a rank's files") {
    const Error e = decode_error([](json::object& o) { entry(o, "shards", 1)["part"] = 2; });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.detail() == "shards[rank 0].part");
    CHECK(e.expected() == "parts 0..n-1 of each rank: part 1");
    CHECK(e.actual() == "part 2");
  }
  SUBCASE("a rank with no file") {
    const Error e = decode_error([](json::object& o) {
      auto& shards = o["shards"].as_array();
      shards.erase(shards.begin() + 2, shards.end());
    });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.detail() == "shards");
    CHECK(e.expected() == "a file for every rank");
    CHECK(e.actual() == "none for rank 1");
  }
  SUBCASE("fewer entries than ranks") {
    const Error e = decode_error([](json::object& o) {
      auto& shards = o["shards"].as_array();
      shards.erase(shards.begin() + 1, shards.end());
    });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.expected() == "at least 2 entries (world_size)");
    CHECK(e.actual() == "1");
  }
  SUBCASE("a further file carrying the rank's param range") {
    const Error e = decode_error([](json::object& o) { entry(o, "shards", 1)["param_shard_offset"] = 0; });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.detail() == "shards[1].param_shard_offset");
    CHECK(e.actual() == "present");
  }
  SUBCASE("a shard entry without its part") {
    const Error e = decode_error([](json::object& o) { entry(o, "shards", 1).erase("part"); });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.detail().find("part") != std::string::npos);
  }
  SUBCASE("a tensor in a file its rank does not have") {
    const Error e = decode_error([](json::object& o) { entry(o, "tensors", 1)["part"] = 2; });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.detail() == "tensors[1].part");
    CHECK(e.expected() == "a part of rank 0's shard (0..1)");
    CHECK(e.actual() == "2");
  }
  SUBCASE("a tensor past the end of its own file (the other file is larger)") {
    const Error e = decode_error([](json::object& o) {
      entry(o, "tensors", 0)["byte_range"] = json::array{5500, 5700};
      entry(o, "tensors", 0)["shape"] = json::array{50};
    });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.detail() == "tensors[0].byte_range");
    CHECK(e.expected() == "begin <= end <= shard size 5000");
  }
  SUBCASE("a part in a schema 2 manifest") {
    const Error e = decode_error([](json::object& o) {
      o["schema_version"] = 2;
      auto& shards = o["shards"].as_array();
      shards.erase(shards.begin() + 3);
      shards.erase(shards.begin() + 1);
    });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.detail() == "shards[0].part");
    CHECK(e.expected() == "absent below schema_version 3");
  }
}

TEST_CASE("a schema 3 manifest with one file per rank reads as the schema 2 one it equals") {
  Manifest m = sample();
  m.shards.erase(std::remove_if(m.shards.begin(), m.shards.end(), [](const ShardRecord& s) { return s.part != 0; }), m.shards.end());
  m.tensors.erase(std::remove_if(m.tensors.begin(), m.tensors.end(), [](const TensorRecord& t) { return t.part != 0; }), m.tensors.end());
  const Manifest d = decode_manifest(encode_manifest(m), "/c/manifest.json");
  CHECK(d.schema_version == 3);
  CHECK(!d.has_file_parts());
  CHECK(d.shard(1).size == 5000);
  m.schema_version = 2;
  const Manifest two = decode_manifest(encode_manifest(m), "/c/manifest.json");
  CHECK(two.shard(1).sha256 == d.shard(1).sha256);
  CHECK(two.find_tensor("a", 1)->begin == d.find_tensor("a", 1)->begin);
}
