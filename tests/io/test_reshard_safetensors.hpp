// SPDX-License-Identifier: Apache-2.0
// An independent safetensors reader for the tests of consolidate: written from the format's
// specification (https://huggingface.co/docs/safetensors, "Format"), sharing no code with
// lib/ckpt/format, so a bug in ckpt's own parser cannot hide the same bug in its writer.
//
//   8 bytes: N, unsigned little-endian 64-bit integer, the size of the header
//   N bytes: a UTF-8 JSON object {"TENSOR": {"dtype", "shape", "data_offsets": [BEGIN, END]},
//            "__metadata__": {string: string}}, possibly padded with trailing spaces
//   rest:    the byte buffer; offsets are relative to its start, and the tensors must cover
//            it entirely, without holes or overlaps
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

namespace ckpt::test {

struct StTensor {
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint8_t> bytes;
};

struct StFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, StTensor> tensors;
};

/// Parses a whole safetensors file, failing the current test (REQUIRE) on any violation.
inline StFile parse_safetensors_independently(const std::vector<std::uint8_t>& file) {
  static const std::map<std::string, std::uint64_t> kSizes = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8}};
  REQUIRE(file.size() >= 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<std::size_t>(i)];
  REQUIRE(n <= file.size() - 8);  // header bounds
  const std::string header(reinterpret_cast<const char*>(file.data()) + 8, static_cast<std::size_t>(n));
  REQUIRE(!header.empty());
  REQUIRE(header.front() == '{');
  const auto last = header.find_last_not_of(' ');
  REQUIRE(last != std::string::npos);
  REQUIRE(header[last] == '}');  // only spaces pad the header
  const boost::json::object root = boost::json::parse(header.substr(0, last + 1)).as_object();
  const std::uint64_t buffer_start = 8 + n, buffer_size = file.size() - buffer_start;
  StFile out;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& kv : root) {
    if (kv.key() == "__metadata__") {
      for (const auto& m : kv.value().as_object()) {
        REQUIRE(m.value().is_string());
        out.metadata[std::string(m.key())] = std::string(m.value().as_string());
      }
      continue;
    }
    const auto& t = kv.value().as_object();
    REQUIRE(t.size() == 3);
    StTensor st;
    st.dtype = std::string(t.at("dtype").as_string());
    REQUIRE_MESSAGE(kSizes.count(st.dtype), "unknown dtype " << st.dtype);
    std::uint64_t numel = 1;
    for (const auto& d : t.at("shape").as_array()) {
      st.shape.push_back(d.to_number<std::uint64_t>());
      numel *= st.shape.back();
    }
    const auto& offs = t.at("data_offsets").as_array();
    REQUIRE(offs.size() == 2);
    const std::uint64_t b = offs[0].to_number<std::uint64_t>(), e = offs[1].to_number<std::uint64_t>();
    REQUIRE(b <= e);
    REQUIRE(e <= buffer_size);
    REQUIRE(e - b == numel * kSizes.at(st.dtype));
    ranges.emplace_back(b, e);
    st.bytes.assign(file.begin() + static_cast<std::ptrdiff_t>(buffer_start + b), file.begin() + static_cast<std::ptrdiff_t>(buffer_start + e));
    out.tensors[std::string(kv.key())] = std::move(st);
  }
  // The data_offsets cover the byte buffer entirely: no hole, no overlap, nothing after.
  std::sort(ranges.begin(), ranges.end());
  std::uint64_t at = 0;
  for (const auto& [b, e] : ranges) {
    REQUIRE(b == at);
    at = e;
  }
  REQUIRE(at == buffer_size);
  return out;
}

/// The floats of an F32 tensor.
inline std::vector<float> st_floats(const StTensor& t) {
  std::vector<float> v(t.bytes.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

}  // namespace ckpt::test
