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
