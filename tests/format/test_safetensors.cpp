// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstring>
#include <string>

#include "ckpt/core/error.hpp"
#include "ckpt/format/safetensors.hpp"

using namespace ckpt;

namespace {
std::span<const std::byte> as_bytes(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

// A hand-written header of `json` for a file with `data` bytes of tensor data.
std::string header_file(const std::string& json, std::uint64_t data) {
  std::string f(8, '\0');
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) f[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return f + json + std::string(data, '\0');
}

Errc parse_error(const std::string& json, std::uint64_t data) {
  const std::string f = header_file(json, data);
  try {
    const auto start = parse_shard_prefix(as_bytes(f).first(8), f.size(), "x.safetensors");
    parse_shard_header(std::string_view(f).substr(8, start - 8), f.size(), "x.safetensors");
  } catch (const Error& e) {
    return e.code();
  }
  FAIL("accepted: " << json);
  return Errc::aborted;
}
}  // namespace

TEST_CASE("planned header puts data at a 4096-aligned offset and parses back") {
  std::vector<std::byte> a(6), b(12), c(0);
  std::vector<TensorView> ts{{"half", DType::F16, {3}, a}, {"dbl", DType::F64, {1, 1}, std::span(b).first(8)},
                             {"empty", DType::F32, {0, 5}, c}, {"ints", DType::I32, {1}, std::span(b).first(4)}};
  const ShardHeader h = plan_shard(ts, {{"k", "v"}});
  CHECK(h.data_start % kDataAlignment == 0);
  CHECK(h.data_size == 6 + 8 + 0 + 4);
  // Ordered by element size: the F64 first, then F32/I32, then F16; each aligned to its size.
  CHECK(h.tensors[0].name == "dbl");
  CHECK(h.tensors.back().name == "half");
  for (const auto& t : h.tensors) CHECK((h.data_start + t.begin) % dtype_size(t.dtype) == 0);
  const std::string enc = encode_shard_header(h);
  REQUIRE(enc.size() == h.data_start);
  CHECK(enc.back() == ' ');
  const auto start = parse_shard_prefix(as_bytes(enc).first(8), h.file_size(), "f");
  CHECK(start == h.data_start);
  const ShardHeader back = parse_shard_header(std::string_view(enc).substr(8), h.file_size(), "f");
  CHECK(back.metadata.at("k") == "v");
  REQUIRE(back.tensors.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(back.tensors[i].begin == h.tensors[i].begin);
    CHECK(back.tensors[i].shape == h.tensors[i].shape);
    CHECK(back.tensors[i].dtype == h.tensors[i].dtype);
  }
}

TEST_CASE("plan rejects duplicate names, reserved names and wrong data sizes") {
  std::vector<std::byte> a(4);
  CHECK_THROWS_AS(plan_shard(std::vector<TensorView>{{"x", DType::F32, {1}, a}, {"x", DType::F32, {1}, a}}), Error);
  CHECK_THROWS_AS(plan_shard(std::vector<TensorView>{{"__metadata__", DType::F32, {1}, a}}), Error);
  try {
    plan_shard(std::vector<TensorView>{{"x", DType::F32, {2}, a}});
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.expected() == "8");
    CHECK(e.actual() == "4");
  }
  CHECK_THROWS_AS(shape_numel(std::vector<std::uint64_t>{1ull << 40, 1ull << 40}), Error);
}

TEST_CASE("prefix with a header length beyond the file or the cap is refused") {
  std::string f(16, '\0');
  f[0] = 100;  // header of 100 bytes in a 16-byte file
  try {
    parse_shard_prefix(as_bytes(f).first(8), f.size(), "s.safetensors");
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::malformed_shard);
    CHECK(e.file() == "s.safetensors");
    CHECK(e.expected() == "at most 8");
    CHECK(e.actual() == "100");
  }
  std::string huge(8, '\xff');
  CHECK_THROWS_AS(parse_shard_prefix(as_bytes(huge), 1ull << 40, "s"), Error);
  CHECK_THROWS_AS(parse_shard_prefix(as_bytes(huge).first(4), 4, "s"), Error);
}

TEST_CASE("hostile headers are refused as malformed shards") {
  CHECK(parse_error("not json", 0) == Errc::malformed_shard);
  CHECK(parse_error("[1,2]", 0) == Errc::malformed_shard);
  CHECK(parse_error(R"({"a":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", 4) == Errc::malformed_shard);
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4) == Errc::malformed_shard);
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4) == Errc::malformed_shard);
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4) == Errc::malformed_shard);  // size
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8) == Errc::malformed_shard);  // hole at end
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8) == Errc::malformed_shard);  // hole at start
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", 8) ==
        Errc::malformed_shard);  // overlap
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})", 4) ==
        Errc::malformed_shard);  // numel overflow
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}})", 4) == Errc::malformed_shard);
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", 4) == Errc::malformed_shard);
  CHECK(parse_error(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4) == Errc::malformed_shard);
  CHECK(parse_error(R"({"__metadata__":{"k":1}})", 0) == Errc::malformed_shard);
  CHECK(parse_error(std::string(200, '[') + std::string(200, ']'), 0) == Errc::malformed_shard);  // deep nesting
}

TEST_CASE("a header with 100k tensor entries parses in bounded time") {
  std::string json = "{";
  for (int i = 0; i < 100000; ++i) {
    if (i) json += ",";
    json += "\"t" + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" + std::to_string(i) + "," +
            std::to_string(i + 1) + "]}";
  }
  json += "}";
  const std::string f = header_file(json, 100000);
  const ShardHeader h = parse_shard_header(std::string_view(f).substr(8, json.size()), f.size(), "big");
  CHECK(h.tensors.size() == 100000);
}
