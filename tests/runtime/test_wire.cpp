// SPDX-License-Identifier: Apache-2.0
// The commit coordination's messages between processes (runtime/wire.hpp) on what
// another process, broken or hostile, may send: every message that does not decode is
// Errc::comm_error naming what was being decoded, never another error, a wrapped number or a
// silent default. (The reports' manifest parts and redundancy blocks: tests/io/test_sharded.cpp;
// every message kind on arbitrary bytes, with read-back round trips: tests/fuzz, fuzz_wire.)
#include <doctest/doctest.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/runtime/wire.hpp"
#include "support/test_support.hpp"

using namespace ckpt;

namespace {
detail::ShardSizes decode(std::vector<std::string> messages, int world = 3) { return detail::decode_shard_sizes(messages, world, 12); }
}  // namespace

TEST_CASE("the shard sizes of every process read back as one size per rank, and a process's failure as the first failure") {
  const std::vector<std::pair<int, std::uint64_t>> a{{0, 4096}, {2, 18446744073709551615ull}}, b{{1, 0}};
  const auto all = decode({detail::encode_shard_sizes(a), detail::encode_shard_sizes(b)});
  CHECK(all.sizes == std::vector<std::uint64_t>{4096, 0, 18446744073709551615ull});
  CHECK(!all.failed);
  const auto failed = decode({detail::encode_shard_sizes(a), detail::encode_sizes_failure("rank 1: disk full"), detail::encode_sizes_failure("x")});
  CHECK(failed.failed == "rank 1: disk full");
  CHECK(failed.sizes.empty());
}

// Each of these was read before as a size or a rank: "-5" as 2^64 - 5 (std::stoull takes a
// sign), " 5" and "5x" as 5; a rank sent twice overwrote the first; a rank of 2^32 + 1 or
// a rank that was no number failed as an io_error or invalid_argument from std::stoi and
// check_rank instead of the wire's comm_error.
TEST_CASE("shard sizes that are not +rank:size entries of decimal numbers, once per rank in range, are a comm_error naming the step") {
  for (const auto& [text, expected, actual] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"+0:-5+1:0+2:0", "+rank:size ...", "+0:-5+1:0+2:0"},
           {"+0: 5+1:0+2:0", "+rank:size ...", "+0: 5+1:0+2:0"},
           {"+0:5x+1:0+2:0", "+rank:size ...", "+0:5x+1:0+2:0"},
           {"+0:18446744073709551616+1:0+2:0", "+rank:size ...", "+0:18446744073709551616+1:0+2:0"},
           {"+0:1+1:0+2:0+0:7", "each rank once", "rank 0 again"},
           {"+4294967297:1+1:0+2:0", "+rank:size ...", "+4294967297:1+1:0+2:0"},
           {"+x:1+1:0+2:0", "+rank:size ...", "+x:1+1:0+2:0"},
           {"+3:1+1:0+2:0", "a rank 0..2", "+3:1"},
           {"+-1:1+1:0+2:0", "+rank:size ...", "+-1:1+1:0+2:0"},
           {"0:1+1:0+2:0", "+rank:size ...", "0:1+1:0+2:0"},
           {"+0:1+1:0", "every rank's", "none for rank 2"}}) {
    CAPTURE(text);
    const Error e = test::error_of([&] { decode({text}); });
    CHECK(e.code() == Errc::comm_error);
    CHECK(e.detail() == "shard sizes of step 12");
    CHECK(e.expected() == expected);
    CHECK(e.actual() == actual);
  }
}

TEST_CASE("a rank report whose rank is no int is a comm_error, not a rank cut to 32 bits") {
  const Error e = test::error_of([] { detail::decode_rank_report(R"({"rank":4294967297,"error":{"code":8,"file":"","detail":"d","expected":"","actual":"","errno":0}})"); });
  CHECK(e.code() == Errc::comm_error);
  CHECK(e.detail() == "undecodable checkpoint coordination message: rank report");
}

// fuzz_wire (after the error JSON took any bytes): encode_rank_report parsed error_to_json's
// text as strict UTF-8 and threw boost::system::system_error, no ckpt::Error, out of report().
TEST_CASE("a rank report and an outcome whose error names a path that is not UTF-8 cross byte for byte") {
  RankReport r;
  r.rank = 3;
  r.error = Error(Errc::io_error, "/ckpt/\xcd\xff/rank-3.safetensors", "pwrite failed", {}, {}, 5);
  const RankReport back = detail::decode_rank_report(detail::encode_rank_report(12, r));
  REQUIRE(back.error.has_value());
  CHECK(back.rank == 3);
  CHECK(back.error->file() == r.error->file());
  CommitOutcome o;
  o.error = r.error;
  o.dir = "/ckpt/\xcd\xff/step-0000000012";
  const CommitOutcome ob = detail::decode_outcome(detail::encode_outcome(o));
  CHECK(ob.dir == o.dir);
  CHECK(ob.error->file() == r.error->file());
}
