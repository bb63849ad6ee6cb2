// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ckpt/core/dtype.hpp"
#include "ckpt/core/error.hpp"

using namespace ckpt;

TEST_CASE("dtype names round-trip and sizes match safetensors") {
  for (DType t : {DType::F16, DType::BF16, DType::F32, DType::F64, DType::I32, DType::I64, DType::U8}) {
    auto back = parse_dtype(dtype_name(t));
    REQUIRE(back.has_value());
    CHECK(*back == t);
  }
  CHECK(dtype_size(DType::BF16) == 2);
  CHECK(dtype_size(DType::F64) == 8);
  CHECK(dtype_name(DType::BF16) == "BF16");
  CHECK_FALSE(parse_dtype("f32").has_value());
  CHECK_FALSE(parse_dtype("").has_value());
}

TEST_CASE("f16 conversion is exact for every half value and rounds to nearest even") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      CHECK(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    REQUIRE(f32_to_f16(f) == h);
  }
  CHECK(f32_to_f16(1.0f + 1.0f / 2048) == 0x3c00);  // halfway: ties to even (down)
  CHECK(f32_to_f16(1.0f + 3.0f / 2048) == 0x3c02);  // halfway: ties to even (up)
  CHECK(f32_to_f16(70000.f) == 0x7c00);               // overflow to +inf
  CHECK(f32_to_f16(1e-10f) == 0x0000);                // underflow to zero
}

TEST_CASE("bf16 conversion is exact for representable values and rounds to nearest even") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(f32_to_bf16(f) == h);
  }
  CHECK(f32_to_bf16(std::bit_cast<float>(0x3f808000u)) == 0x3f80);  // tie to even
  CHECK(f32_to_bf16(std::bit_cast<float>(0x3f818000u)) == 0x3f82);
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("error message names the file, the expected and the actual value") {
  Error e(Errc::size_mismatch, "/x/rank-00001.safetensors", "file size", "4096", "100");
  CHECK(std::string(e.what()) == "size mismatch: /x/rank-00001.safetensors: file size: expected 4096, actual 100");
  CHECK(e.code() == Errc::size_mismatch);
  try {
    throw_errno(28, "write", "/x/f");
    FAIL("no throw");
  } catch (const Error& err) {
    CHECK(err.code() == Errc::no_space);
    CHECK(err.sys_errno() == 28);
    CHECK(std::string(err.what()) == "no space left: /x/f: write failed: No space left on device");
  }
}
