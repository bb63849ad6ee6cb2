// SPDX-License-Identifier: Apache-2.0
// The command-line conventions every program shares (apps/common/cli.hpp).
#include <doctest/doctest.h>

#include <regex>

#include "cli.hpp"

using ckpt::cli::parse_size;

TEST_CASE("sizes are parsed alike: digits, an optional fraction, a binary unit in any spelling") {
  const std::pair<const char*, std::uint64_t> ok[] = {
      {"1024", 1024},
      {"1", 1},
      {"64K", 64ull << 10},
      {"64k", 64ull << 10},
      {"64KB", 64ull << 10},
      {"64KiB", 64ull << 10},
      {"500M", 500ull << 20},
      {"500mib", 500ull << 20},
      {"1.5G", 3ull << 29},
      {"1.5GB", 3ull << 29},
      {"0.5K", 512},
      {".25M", 256ull << 10},
      {"2T", 2ull << 40},
      {"1P", 1ull << 50},
      {"5G", 5ull << 30},
      {"100B", 100},
      {"18446744073709551615", 18446744073709551615ull},
      {"15.75P", 63ull << 48},
  };
  for (const auto& [text, bytes] : ok) {
    CAPTURE(text);
    CHECK(parse_size(text) == bytes);
  }
}

TEST_CASE("a text that is not a whole positive number of bytes is no size") {
  for (const char* text : {"", "G", "-1K", "+1K", "1.5", "0.3K", "1.", ".", "0", "0K", "0.0G", "1.5Q", "5 G", " 5G", "5G ", "1e3",
                           "1,5G", "16384P", "18446744073709551616", "0x10",
                           "0.000000000931322574615478515625G"}) {  // exactly one byte, but more fraction digits than are read
    CAPTURE(text);
    CHECK_FALSE(parse_size(text).has_value());
  }
}

TEST_CASE("the version is the CMake project version") {
  CHECK(std::regex_match(std::string(ckpt::cli::version()), std::regex(R"(\d+\.\d+\.\d+)")));
}
