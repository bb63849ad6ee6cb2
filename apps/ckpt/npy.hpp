// SPDX-License-Identifier: Apache-2.0
// The NumPy .npy format, version 1.0, as `ckpt get` writes it
// (numpy.lib.format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html):
//   "\x93NUMPY" 0x01 0x00, a little-endian uint16 header length, then the header: a Python
//   dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (3, 5), } padded with
//   spaces and ended by '\n' so that the data starts at a multiple of 64 bytes; then the data,
//   C order. Safetensors data is little-endian, as the descr says.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/core/dtype.hpp"

namespace ckpt::tool {

/// The numpy descr of a dtype. BF16 has no numpy dtype: its raw 16-bit patterns are written
/// as '<u2' (ml_dtypes' bfloat16, or `(a.astype('<u4') << 16).view('<f4')`, turns them into
/// numbers).
inline std::string_view npy_descr(DType t) noexcept {
  switch (t) {
    case DType::F16: return "<f2";
    case DType::BF16: return "<u2";
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::I8: return "|i1";
    case DType::I16: return "<i2";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::U8: return "|u1";
    case DType::U16: return "<u2";
    case DType::U32: return "<u4";
    case DType::U64: return "<u8";
    case DType::BOOL: return "|b1";
  }
  return "|u1";
}

/// The bytes before the data: magic, version 1.0, header length, header padded to 64.
/// nullopt if the header would not fit version 1.0's 16-bit length (tens of thousands of
/// dimensions).
inline std::optional<std::string> npy_preamble(DType t, const std::vector<std::uint64_t>& shape) {
  std::string dims;
  for (const auto d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);  // (3, 5); a 1-d shape keeps its comma: (7,)
  else if (shape.size() == 1) dims.pop_back();
  std::string header = "{'descr': '" + std::string(npy_descr(t)) + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  constexpr std::size_t kPrefix = 10;  // magic (6), version (2), header length (2)
  const std::size_t total = (kPrefix + header.size() + 1 + 63) / 64 * 64;
  const std::size_t len = total - kPrefix;
  if (len > 0xffff) return std::nullopt;
  header.append(len - header.size() - 1, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>(len >> 8);
  return out + header;
}

}  // namespace ckpt::tool
