// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <bit>
#include <boost/json.hpp>
#include <limits>
#include <string>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/format/manifest.hpp"
#include "support/test_support.hpp"
#include "support/manifest_edit.hpp"

using namespace ckpt;
namespace json = boost::json;

namespace {
Manifest sample() {
  Manifest m;
  m.world_size = 2;
  m.step = 10;
  m.wall_clock_seconds = 4.5;
  m.created_at = "2026-11-29T10:00:00.000Z";
  m.chunk_size = 4096;
  m.param_numel = 100;
  for (int r = 0; r < 2; ++r) {
    ShardRecord s;
    s.rank = r;
    s.path = "rank-0000" + std::to_string(r) + "-of-00002.safetensors";
    s.size = 5000;
    s.sha256 = std::string(64, 'a');
    s.xxh3 = 0x1234;
    s.chunk_xxh3 = {1, 2};
    s.param_shard_offset = 50u * r;
    s.param_shard_numel = 50;
    json_of(s.metadata)["data_position"] = 7;
    m.shards.push_back(s);
    m.tensors.push_back({"master", r, DType::F32, {50}, 4096, 4296});
  }
  json_of(m.training)["lr"] = 0.01;
  return m;
}

// Decodes sample() after `edit` changed its JSON, returning the error.
Error decode_error(const std::function<void(json::object&)>& edit) { return test::manifest_decode_error(sample(), edit, "/c/manifest.json"); }
}  // namespace

TEST_CASE("manifest round-trips every field") {
  const Manifest m = sample();
  const Manifest d = decode_manifest(encode_manifest(m), "m");
  CHECK(d.world_size == 2);
  CHECK(d.step == 10);
  CHECK(d.wall_clock_seconds == 4.5);
  CHECK(d.created_at == m.created_at);
  CHECK(d.chunk_size == 4096);
  CHECK(d.shards[1].path == m.shards[1].path);
  CHECK(d.shards[1].chunk_xxh3 == m.shards[1].chunk_xxh3);
  CHECK(d.shards[1].param_shard_offset == 50);
  CHECK(json_of(d.shards[1].metadata).at("data_position").as_int64() == 7);
  CHECK(d.tensors.size() == 2);
  CHECK(d.find_tensor("master", 1)->begin == 4096);
  CHECK(json_of(d.training).at("lr").as_double() == 0.01);
  CHECK(encode_manifest(d) == encode_manifest(m));
}

TEST_CASE("NaN and infinities in training and metadata round-trip bit for bit, written as tagged objects") {
  Manifest m = sample();
  const double negative_nan = std::bit_cast<double>(0xfff8000000000000ull);  // what 0 * inf gives on x86
  const double payload_nan = std::bit_cast<double>(0x7ff0000000000123ull);
  json_of(m.training)["loss"] = std::numeric_limits<double>::quiet_NaN();
  json_of(m.training)["bounds"] = json::array{std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(), 1.5};
  json_of(m.shards[1].metadata)["nested"] = json::object{{"a", negative_nan}, {"b", payload_nan}};
  const std::string text = encode_manifest(m);
  CHECK(text.find(R"("loss":{"__float__":"nan"})") != std::string::npos);
  CHECK(text.find(R"("bounds":[{"__float__":"inf"},{"__float__":"-inf"},1.5E0])") != std::string::npos);
  CHECK(text.find(R"({"a":{"__float__":"nan:0xfff8000000000000"},"b":{"__float__":"nan:0x7ff0000000000123"}})") != std::string::npos);
  CHECK(json::parse(text).is_object());  // valid JSON: what any reader can read
  const Manifest d = decode_manifest(text, "m");
  const auto bits = [](const json::value& v) { return std::bit_cast<std::uint64_t>(v.as_double()); };
  CHECK(bits(json_of(d.training).at("loss")) == 0x7ff8000000000000ull);
  CHECK(json_of(d.training).at("bounds").as_array()[0].as_double() == std::numeric_limits<double>::infinity());
  CHECK(json_of(d.training).at("bounds").as_array()[1].as_double() == -std::numeric_limits<double>::infinity());
  CHECK(bits(json_of(d.shards[1].metadata).at("nested").at("a")) == 0xfff8000000000000ull);
  CHECK(bits(json_of(d.shards[1].metadata).at("nested").at("b")) == 0x7ff0000000000123ull);
  CHECK(encode_manifest(d) == text);
  // Objects that are not exactly a tag stay objects; a literal beyond the double range is refused.
  m = sample();
  json_of(m.training)["not_tags"] = json::array{json::object{{"__float__", "nan"}, {"x", 1}}, json::object{{"__float__", "0x1.8p+1"}},
                                       json::object{{"__float__", "nan:0x7ff0000000000000"}}};
  const Manifest kept = decode_manifest(encode_manifest(m), "m");
  CHECK(json_of(kept.training).at("not_tags") == json_of(m.training).at("not_tags"));
  std::string literal = encode_manifest(sample());
  literal = literal.substr(0, literal.find("\"training\": ")) + "\"training\": {\"x\": 1e400}\n}\n";
  const Error e = test::expect_error([&] { (void)decode_manifest(literal, "m"); });
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.detail() == "training");
}

TEST_CASE("future schema_version is refused as unsupported naming both versions") {
  const Error e = decode_error([](json::object& o) { o["schema_version"] = 4; });
  CHECK(e.code() == Errc::unsupported_schema);
  CHECK(e.expected() == "1 to 3");
  CHECK(e.actual() == "4");
  CHECK(e.file() == "/c/manifest.json");
}

TEST_CASE("hostile shard paths are refused as unsafe") {
  for (const char* p : {"/etc/passwd", "../x", "a/b", "..", ".", "", ".tmp-x", "a\\b"}) {
    const Error e = decode_error([&](json::object& o) { o["shards"].as_array()[0].as_object()["path"] = p; });
    CHECK_MESSAGE(e.code() == Errc::unsafe_path, p);
  }
}

TEST_CASE("overflowing and out-of-range numbers are refused") {
  auto shard = [](json::object& o) -> json::object& { return o["shards"].as_array()[0].as_object(); };
  CHECK(decode_error([&](json::object& o) { shard(o)["size"] = 18446744073709551615ull; }).code() == Errc::malformed_manifest);
  CHECK(decode_error([&](json::object& o) { shard(o)["size"] = -1; }).code() == Errc::malformed_manifest);
  CHECK(decode_error([&](json::object& o) { shard(o)["param_shard_offset"] = 18446744073709551615ull; }).code() == Errc::malformed_manifest);
  CHECK(decode_error([&](json::object& o) { o["world_size"] = 0; }).code() == Errc::malformed_manifest);
  CHECK(decode_error([&](json::object& o) { o["world_size"] = 3; }).code() == Errc::malformed_manifest);  // 2 shards
  CHECK(decode_error([&](json::object& o) { o["chunk_size"] = 1000; }).code() == Errc::malformed_manifest);
  CHECK(decode_error([&](json::object& o) { o["step"] = "10"; }).code() == Errc::malformed_manifest);
  CHECK(decode_error([&](json::object& o) { shard(o)["rank"] = 1; }).code() == Errc::malformed_manifest);  // duplicate rank
  CHECK(decode_error([&](json::object& o) { shard(o)["chunk_xxh3"] = json::array{"0000000000000001"}; }).code() ==
        Errc::malformed_manifest);  // size needs 2 chunks
  CHECK(decode_error([&](json::object& o) { shard(o)["sha256"] = "xyz"; }).code() == Errc::malformed_manifest);
  auto tensor = [](json::object& o) -> json::object& { return o["tensors"].as_array()[0].as_object(); };
  CHECK(decode_error([&](json::object& o) { tensor(o)["byte_range"] = json::array{4096, 9000}; }).code() == Errc::malformed_manifest);
  CHECK(decode_error([&](json::object& o) { tensor(o)["shape"] = json::array{51}; }).code() == Errc::malformed_manifest);
  CHECK(decode_error([&](json::object& o) { tensor(o)["dtype"] = "Q4"; }).code() == Errc::malformed_manifest);
  CHECK(decode_error([&](json::object& o) { o.erase("shards"); }).code() == Errc::malformed_manifest);
}

TEST_CASE("manifest error names the field, the expected and the actual value") {
  const Error e = decode_error([](json::object& o) { o["world_size"] = 3; });
  CHECK(e.detail() == "shards");
  CHECK(e.expected() == "3 entries (world_size)");
  CHECK(e.actual() == "2");
  CHECK(std::string(e.what()).find("/c/manifest.json") != std::string::npos);
}

TEST_CASE("Manifest::shard of a rank the manifest does not have throws ckpt::Error naming the manifest") {
  const Manifest m = sample();
  CHECK(m.shard(1).rank == 1);
  for (int bad : {99, 2, -1}) {
    const Error e = test::expect_error([&] { (void)m.shard(bad); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.file() == "manifest.json");
    CHECK(e.detail() == "shard rank");
    CHECK(e.expected() == "0..1");
    CHECK(e.actual() == std::to_string(bad));
  }
}

TEST_CASE("plain file name check") {
  CHECK(is_plain_file_name("rank-00000-of-00004.safetensors"));
  CHECK_FALSE(is_plain_file_name(std::string(256, 'a')));
  CHECK_FALSE(is_plain_file_name(std::string("a\0b", 3)));
}
