#include <doctest/doctest.h>

#include <string>

#include "ckpt/core/error.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using test::expect_error;

TEST_CASE("check_rank accepts 0..N-1 and refuses anything else naming the file, the range and the rank") {
  CHECK_NOTHROW(check_rank(0, 1, "rank"));
  CHECK_NOTHROW(check_rank(3, 4, "rank"));
  for (int bad : {-1, 4, 1 << 30}) {
    const Error e = expect_error([&] { check_rank(bad, 4, "save rank", "/ckpts/run1"); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.file() == "/ckpts/run1");
    CHECK(e.detail() == "save rank");
    CHECK(e.expected() == "0..3");
    CHECK(e.actual() == std::to_string(bad));
  }
  const Error none = expect_error([] { check_rank(0, 0, "shard rank"); });
  CHECK(none.expected() == "none (world size 0)");
}

TEST_CASE("check_size refuses a size other than the recorded one as size_mismatch in bytes") {
  CHECK_NOTHROW(check_size(4096, 4096, "shard size", "/c/rank-00000-of-00001.safetensors"));
  const Error e = expect_error([] { check_size(4096, 100, "shard size", "/c/rank-00000-of-00001.safetensors"); });
  CHECK(e.code() == Errc::size_mismatch);
  CHECK(std::string(e.what()) == "size mismatch: /c/rank-00000-of-00001.safetensors: shard size: expected 4096 bytes, actual 100 bytes");
}
