// SPDX-License-Identifier: Apache-2.0
// Element types of tensors, with the safetensors spelling ("F16", "BF16", ...) used on disk,
// and exact conversions between fp32 and the two 16-bit float formats.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>

CKPT_API_BEGIN
namespace ckpt {

enum class DType : std::uint8_t { F16, BF16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64, BOOL };

/// Bytes per element (BOOL is one byte).
std::size_t dtype_size(DType t) noexcept;
/// The safetensors name: "F16", "BF16", "F32", "F64", "I8", ..., "BOOL".
std::string_view dtype_name(DType t) noexcept;
/// Inverse of dtype_name; std::nullopt for an unknown name.
std::optional<DType> parse_dtype(std::string_view name) noexcept;
/// True for F16, BF16, F32, F64.
bool dtype_is_float(DType t) noexcept;

/// The DType of the C++ element type T: float F32, double F64, std::int8_t .. std::int64_t
/// I8 .. I64, std::uint8_t .. std::uint64_t U8 .. U64, bool BOOL (cv-qualifiers ignored).
/// A type with no DType (a struct, long double) does not compile. F16 and BF16 have no C++20
/// type: a tensor of them is stated with its DType (TensorView, LoadTarget).
template <class T>
constexpr DType dtype_of() noexcept {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return DType::F32;
  else if constexpr (std::is_same_v<U, double>) return DType::F64;
  else if constexpr (std::is_same_v<U, bool>) return DType::BOOL;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 1) return DType::I8;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 2) return DType::I16;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 4) return DType::I32;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 8) return DType::I64;
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 1) return DType::U8;
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 2) return DType::U16;
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 4) return DType::U32;
  else if constexpr (std::is_integral_v<U> && std::is_unsigned_v<U> && sizeof(U) == 8) return DType::U64;
  else static_assert(sizeof(U) == 0, "ckpt::dtype_of: this element type has no ckpt::DType");
}

/// IEEE 754 binary16 <-> binary32, round to nearest even; NaN and infinities are kept.
std::uint16_t f32_to_f16(float f) noexcept;
float f16_to_f32(std::uint16_t h) noexcept;
/// bfloat16 <-> binary32, round to nearest even; NaN stays NaN.
std::uint16_t f32_to_bf16(float f) noexcept;
float bf16_to_f32(std::uint16_t h) noexcept;

/// Converts `in`, elements of float type `from`, to float type `to` into `out` (both F16, BF16,
/// F32 or F64; in.size() / dtype_size(from) elements, out holding as many of `to`): F64 to F32
/// rounds once, to nearest even; every other narrowing goes through fp32 (a value exact in
/// fp32 is then rounded once); widening is exact. Same type: a copy. Both spans' sizes must
/// match (the caller checks; nothing is written past out).
void convert_floats(DType from, std::span<const std::byte> in, DType to, std::span<std::byte> out) noexcept;

}  // namespace ckpt
CKPT_API_END
