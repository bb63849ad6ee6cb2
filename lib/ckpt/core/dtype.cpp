// SPDX-License-Identifier: Apache-2.0
#include "ckpt/core/dtype.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

namespace ckpt {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  std::size_t size;
  bool is_float;
};
constexpr std::array<DTypeInfo, 13> kTypes{{
    {DType::F16, "F16", 2, true},   {DType::BF16, "BF16", 2, true}, {DType::F32, "F32", 4, true},
    {DType::F64, "F64", 8, true},   {DType::I8, "I8", 1, false},    {DType::I16, "I16", 2, false},
    {DType::I32, "I32", 4, false},  {DType::I64, "I64", 8, false},  {DType::U8, "U8", 1, false},
    {DType::U16, "U16", 2, false},  {DType::U32, "U32", 4, false},  {DType::U64, "U64", 8, false},
    {DType::BOOL, "BOOL", 1, false},
}};
const DTypeInfo& info(DType t) noexcept { return kTypes[static_cast<std::size_t>(t)]; }
}  // namespace

std::size_t dtype_size(DType t) noexcept { return info(t).size; }
std::string_view dtype_name(DType t) noexcept { return info(t).name; }
bool dtype_is_float(DType t) noexcept { return info(t).is_float; }

std::optional<DType> parse_dtype(std::string_view name) noexcept {
  for (const auto& i : kTypes)
    if (i.name == name) return i.type;
  return std::nullopt;
}

std::uint16_t f32_to_f16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t exp = (x >> 23) & 0xffu;
  std::uint32_t mant = x & 0x7fffffu;
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0));
  const int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 0x1f) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow to infinity
  if (e <= 0) {
    if (e < -10) return static_cast<std::uint16_t>(sign);  // underflows to signed zero
    mant |= 0x800000u;
    const int shift = 14 - e;
    std::uint32_t half = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1);
    const std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = sign | (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent
  return static_cast<std::uint16_t>(half);
}

float f16_to_f32(std::uint16_t h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t out;
  if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      out = sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(out);
}

std::uint16_t f32_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

float bf16_to_f32(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

namespace {
// One element of float type t at p, widened to double (exact for every float type).
double load_float(DType t, const std::byte* p) noexcept {
  switch (t) {
    case DType::F16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    case DType::BF16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    case DType::F64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

void store_float(DType t, double v, std::byte* p) noexcept {
  if (t == DType::F64) {
    std::memcpy(p, &v, 8);
    return;
  }
  const float f = static_cast<float>(v);
  if (t == DType::F16) {
    const std::uint16_t h = f32_to_f16(f);
    std::memcpy(p, &h, 2);
  } else if (t == DType::BF16) {
    const std::uint16_t h = f32_to_bf16(f);
    std::memcpy(p, &h, 2);
  } else {
    std::memcpy(p, &f, 4);
  }
}
}  // namespace

void convert_floats(DType from, std::span<const std::byte> in, DType to, std::span<std::byte> out) noexcept {
  if (from == to) {
    std::memcpy(out.data(), in.data(), std::min(in.size(), out.size()));
    return;
  }
  const std::size_t in_es = dtype_size(from), out_es = dtype_size(to);
  const std::size_t n = std::min(in.size() / in_es, out.size() / out_es);
  for (std::size_t i = 0; i < n; ++i) store_float(to, load_float(from, in.data() + i * in_es), out.data() + i * out_es);
}

}  // namespace ckpt
