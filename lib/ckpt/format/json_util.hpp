// SPDX-License-Identifier: Apache-2.0
// Not installed: strict accessors for untrusted JSON, each throwing a ckpt::Error with the given
// code that names the file, the field and what was expected.
#pragma once

#include "ckpt/core/export.hpp"

#include <boost/json.hpp>
#include <cstdint>
#include <string>
#include <string_view>

#include <vector>

#include "ckpt/core/dtype.hpp"
#include "ckpt/core/error.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

struct JsonContext {
  Errc code;
  std::string_view file;
  [[noreturn]] void fail(std::string_view field, std::string_view expected, std::string actual) const {
    throw Error(code, std::string(file), std::string(field), std::string(expected), std::move(actual));
  }
};

inline std::string json_kind(const boost::json::value& v) {
  switch (v.kind()) {
    case boost::json::kind::null: return "null";
    case boost::json::kind::bool_: return "boolean";
    case boost::json::kind::int64: return "integer " + std::to_string(v.get_int64());
    case boost::json::kind::uint64: return "integer " + std::to_string(v.get_uint64());
    case boost::json::kind::double_: return "number " + boost::json::serialize(v);
    case boost::json::kind::string: return "string";
    case boost::json::kind::array: return "array";
    case boost::json::kind::object: return "object";
  }
  return "?";
}

inline const boost::json::value& json_field(const JsonContext& c, const boost::json::object& o,
                                            std::string_view key, std::string_view where) {
  const auto* v = o.if_contains(key);
  if (!v) c.fail(std::string(where) + std::string(key), "field present", "missing");
  return *v;
}

inline std::uint64_t json_u64(const JsonContext& c, const boost::json::value& v, std::string_view field,
                              std::uint64_t max = UINT64_MAX) {
  std::uint64_t out;
  if (v.is_uint64()) out = v.get_uint64();
  else if (v.is_int64() && v.get_int64() >= 0) out = static_cast<std::uint64_t>(v.get_int64());
  else c.fail(field, "unsigned integer", json_kind(v));
  if (out > max) c.fail(field, "at most " + std::to_string(max), std::to_string(out));
  return out;
}

inline const std::string_view json_str(const JsonContext& c, const boost::json::value& v, std::string_view field) {
  if (!v.is_string()) c.fail(field, "string", json_kind(v));
  return v.get_string();
}

inline const boost::json::object& json_obj(const JsonContext& c, const boost::json::value& v, std::string_view field) {
  if (!v.is_object()) c.fail(field, "object", json_kind(v));
  return v.get_object();
}

inline const boost::json::array& json_arr(const JsonContext& c, const boost::json::value& v, std::string_view field) {
  if (!v.is_array()) c.fail(field, "array", json_kind(v));
  return v.get_array();
}

/// A tensor's "dtype" and "shape" fields, validated: a known dtype, at most 64 dimensions of
/// unsigned integers, element and byte counts within 64 bits.
struct JsonTensorType {
  DType dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t bytes;
};
inline JsonTensorType json_tensor_type(const JsonContext& c, const boost::json::object& o, const std::string& where) {
  JsonTensorType out{};
  const auto name = json_str(c, json_field(c, o, "dtype", where + "."), where + ".dtype");
  const auto dt = parse_dtype(name);
  if (!dt) c.fail(where + ".dtype", "a safetensors dtype (F16, BF16, F32, F64, I8..I64, U8..U64, BOOL)", std::string(name));
  out.dtype = *dt;
  const auto& shape = json_arr(c, json_field(c, o, "shape", where + "."), where + ".shape");
  if (shape.size() > 64) c.fail(where + ".shape", "at most 64 dimensions", std::to_string(shape.size()));
  std::uint64_t numel = 1;
  for (const auto& d : shape) {
    out.shape.push_back(json_u64(c, d, where + ".shape"));
    if (__builtin_mul_overflow(numel, out.shape.back(), &numel)) c.fail(where + ".shape", "element count within 64 bits", "overflow");
  }
  if (__builtin_mul_overflow(numel, dtype_size(out.dtype), &out.bytes)) c.fail(where + ".shape", "byte size within 64 bits", "overflow");
  return out;
}

/// Parses untrusted text with a depth limit; malformed JSON is reported with its position.
/// `sp`: where the document's memory comes from (default: the heap).
inline boost::json::value json_parse(const JsonContext& c, std::string_view text, std::string_view what, boost::json::storage_ptr sp = {}) {
  boost::json::parse_options opt;
  opt.max_depth = 32;
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(text, ec, std::move(sp), opt);
  if (ec) c.fail(what, "valid JSON", ec.message());
  return v;
}

}  // namespace ckpt::detail
CKPT_API_END
