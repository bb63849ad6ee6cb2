// SPDX-License-Identifier: Apache-2.0
// check_shard_head and read_shard_head (format/shard_check.hpp): a shard's own header against
// the manifest index, the one check every read path makes, and the error naming the first
// disagreement's tensor and field with the manifest's value as expected, the header's as actual.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/format/shard_check.hpp"
#include "support/test_support.hpp"

using namespace ckpt;

namespace {

constexpr const char* kFile = "/ck/step-0000000001/rank-00000-of-00001.safetensors";

// A shard of three tensors (w: F32 [2, 3], b: F32 [3], n: U8 [5]), its bytes and a manifest
// whose index matches its header.
struct Shard {
  std::string file;
  Manifest m;
  ShardHeader h;
  Shard() {
    std::vector<std::byte> w(24), b(12), n(5);
    const std::vector<TensorView> ts{{"w", DType::F32, {2, 3}, w}, {"b", DType::F32, {3}, b}, {"n", DType::U8, {5}, n}};
    h = plan_shard(ts);
    file = encode_shard_header(h) + std::string(h.data_size, '\x5a');
    m.world_size = 1;
    m.shards.push_back({.rank = 0, .path = "rank-00000-of-00001.safetensors", .size = file.size()});
    for (const auto& t : h.tensors) m.tensors.push_back({t.name, 0, t.dtype, t.shape, h.data_start + t.begin, h.data_start + t.end});
  }
  TensorRecord& entry(std::string_view name) {
    for (auto& t : m.tensors)
      if (t.name == name) return t;
    FAIL("no entry " << name);
    return m.tensors.front();
  }
  std::span<const std::byte> head() const { return std::as_bytes(std::span(file.data(), file.size())); }
  Error refusal() const {
    return test::error_of([&] { check_shard_head(m, m.shard(0), head(), kFile); });
  }
};

void check_refusal(const Error& e, const std::string& detail, const std::string& expected, const std::string& actual) {
  CHECK(e.code() == Errc::malformed_shard);
  CHECK(e.file() == kFile);
  CHECK(e.detail() == detail);
  CHECK(e.expected() == expected);
  CHECK(e.actual() == actual);
}

}  // namespace

TEST_CASE("a header that agrees with the index is returned with each tensor's index entry") {
  Shard s;
  const CheckedShardHeader c = check_shard_head(s.m, s.m.shard(0), s.head(), kFile);
  REQUIRE(c.header.tensors.size() == 3);
  REQUIRE(c.records.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(c.records[i]->name == c.header.tensors[i].name);
    CHECK(c.records[i]->begin == c.header.data_start + c.header.tensors[i].begin);
  }
  // Only the first data_start bytes are needed.
  CHECK_NOTHROW(check_shard_head(s.m, s.m.shard(0), s.head().first(static_cast<std::size_t>(s.h.data_start)), kFile));
  const Error e = test::error_of([&] { check_shard_head(s.m, s.m.shard(0), s.head().first(100), kFile); });
  check_refusal(e, "header bytes available", std::to_string(s.h.data_start), "100");
}

TEST_CASE("a dtype, shape or byte range the index gives otherwise is refused naming the tensor and the field, the index's value expected") {
  {
    Shard s;
    s.entry("b").dtype = DType::I32;  // the same bytes, read as integers
    check_refusal(s.refusal(), "tensor 'b' disagrees with the manifest index in its dtype", "I32", "F32");
  }
  {
    Shard s;
    s.entry("w").shape = {6};
    check_refusal(s.refusal(), "tensor 'w' disagrees with the manifest index in its shape", "[6]", "[2, 3]");
  }
  {
    Shard s;
    TensorRecord& n = s.entry("n");
    const std::uint64_t b = n.begin, e = n.end;
    n.begin -= 4, n.end -= 4;
    check_refusal(s.refusal(), "tensor 'n' disagrees with the manifest index in its byte range",
                  std::to_string(b - 4) + "-" + std::to_string(e - 4), std::to_string(b) + "-" + std::to_string(e));
  }
}

TEST_CASE("a tensor on one side only is a disagreement in its name, naming what the other side calls those bytes") {
  {
    Shard s;
    s.entry("b").name = "bias";  // renamed in the index
    check_refusal(s.refusal(), "tensor 'b' of the shard header disagrees with the manifest index in its name", "'bias'", "'b'");
  }
  {
    Shard s;
    s.m.tensors.erase(s.m.tensors.begin());  // "w", the first in the file, dropped from the index
    check_refusal(s.refusal(), "tensor 'w' of the shard header disagrees with the manifest index in its name", "absent", "'w'");
  }
  {
    Shard s;
    s.m.tensors.push_back({"ghost", 0, DType::U8, {0}, s.file.size(), s.file.size()});
    check_refusal(s.refusal(), "tensor 'ghost' of the manifest index disagrees with the shard header in its name", "'ghost'", "absent");
  }
}

TEST_CASE("of several disagreements the first in the file is named, and the index's other ranks do not count") {
  Shard s;
  s.entry("n").dtype = DType::I8;
  s.entry("w").shape = {3, 2};  // w comes first in the file (larger elements first)
  check_refusal(s.refusal(), "tensor 'w' disagrees with the manifest index in its shape", "[3, 2]", "[2, 3]");
  Shard t;
  t.m.world_size = 2;
  t.m.shards.push_back({.rank = 1, .path = "rank-00001-of-00002.safetensors", .size = 1});
  t.m.tensors.push_back({"x", 1, DType::U8, {1}, 0, 1});
  CHECK_NOTHROW(check_shard_head(t.m, t.m.shard(0), t.head(), kFile));
}

TEST_CASE("what the parser refuses is refused as it says, before any comparison") {
  Shard s;
  std::string f = s.file;
  f.replace(f.find("\"F32\""), 5, "\"F8\" ");  // an unknown dtype, the JSON still padded
  const Error e = test::error_of([&] { check_shard_head(s.m, s.m.shard(0), std::as_bytes(std::span(f.data(), f.size())), kFile); });
  CHECK(e.code() == Errc::malformed_shard);
  CHECK(e.file() == kFile);
  CHECK(std::string(e.what()).find("F8") != std::string::npos);
}

TEST_CASE("read_shard_head reads the length, then the header, and no further") {
  Shard s;
  std::vector<std::pair<std::uint64_t, std::size_t>> reads;
  const ReadAt read_at = [&](std::uint64_t offset, std::span<std::byte> out) {
    reads.emplace_back(offset, out.size());
    std::memcpy(out.data(), s.file.data() + offset, out.size());
  };
  const std::vector<std::byte> head = read_shard_head(read_at, s.file.size(), kFile);
  CHECK(head.size() == s.h.data_start);
  CHECK(std::memcmp(head.data(), s.file.data(), head.size()) == 0);
  CHECK(reads == std::vector<std::pair<std::uint64_t, std::size_t>>{{0, 8}, {8, static_cast<std::size_t>(s.h.data_start - 8)}});
  // A length past the file is refused after reading its 8 bytes; a file under 8 bytes reads nothing.
  std::string bad = s.file;
  bad[6] = '\x01';
  reads.clear();
  const ReadAt bad_at = [&](std::uint64_t offset, std::span<std::byte> out) {
    reads.emplace_back(offset, out.size());
    std::memcpy(out.data(), bad.data() + offset, out.size());
  };
  const Error e = test::error_of([&] { read_shard_head(bad_at, bad.size(), kFile); });
  CHECK(e.code() == Errc::malformed_shard);
  CHECK(e.file() == kFile);
  CHECK(reads.size() == 1);
  reads.clear();
  CHECK(test::error_of([&] { read_shard_head(bad_at, 7, kFile); }).code() == Errc::malformed_shard);
  CHECK(reads.empty());
}
