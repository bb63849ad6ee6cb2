// SPDX-License-Identifier: Apache-2.0
#include "ckpt/format/boost_json.hpp"
#include "ckpt/read/flat_layout.hpp"

#include <algorithm>
#include <boost/json.hpp>
#include <set>

#include "ckpt/core/error.hpp"

namespace ckpt {

namespace json = boost::json;

namespace {

[[noreturn]] void bad_manifest(std::string_view file, std::string detail, std::string expected, std::string actual) {
  throw Error(Errc::malformed_manifest, std::string(file), std::move(detail), std::move(expected), std::move(actual));
}

std::uint64_t json_u64(const json::value& v, std::string_view file, const std::string& field) {
  if (v.is_uint64()) return v.as_uint64();
  if (v.is_int64() && v.as_int64() >= 0) return static_cast<std::uint64_t>(v.as_int64());
  bad_manifest(file, field, "a non-negative integer", json::serialize(v).substr(0, 64));
}

bool contains(const std::vector<std::string>& v, std::string_view s) { return std::find(v.begin(), v.end(), s) != v.end(); }

}  // namespace

FlatLayout flat_layout(const Manifest& m, std::string_view file) {
  FlatLayout out;
  const json::value* ft = json_of(m.training).if_contains("flat_tensors");
  if (!ft)
    throw Error(Errc::invalid_argument, std::string(file),
                "the checkpoint does not record which tensors are partitioned across ranks (training.flat_tensors): "
                "it cannot be resharded",
                "training.flat_tensors", "absent");
  if (!ft->is_array()) bad_manifest(file, "training.flat_tensors", "an array of tensor names", json::serialize(*ft).substr(0, 64));
  for (const auto& v : ft->as_array()) {
    if (!v.is_string() || v.as_string().empty())
      bad_manifest(file, "training.flat_tensors", "non-empty tensor names", json::serialize(v).substr(0, 64));
    if (contains(out.tensors, v.as_string())) bad_manifest(file, "training.flat_tensors", "unique names", std::string(v.as_string()));
    out.tensors.emplace_back(v.as_string());
  }
  out.num_params = m.param_numel;
  if (const json::value* np = json_of(m.training).if_contains("num_params")) out.num_params = json_u64(*np, file, "training.num_params");
  if (out.num_params > m.param_numel)
    bad_manifest(file, "training.num_params", "at most param_numel " + std::to_string(m.param_numel), std::to_string(out.num_params));
  return out;
}

std::uint64_t padded_numel(std::uint64_t num_params, int world) {
  if (world < 1) throw_invalid("world size must be >= 1, got " + std::to_string(world));
  const auto w = static_cast<std::uint64_t>(world);
  std::uint64_t up;
  if (__builtin_add_overflow(num_params, w - 1, &up)) throw_invalid("flat size overflows when padded");
  return up / w * w;
}

dist::ShardRange flat_slice(std::uint64_t num_params, int world, int rank) {
  return dist::shard_range(padded_numel(num_params, world), world, rank);
}

std::vector<ParamSlice> param_layout(const Manifest& m, const FlatLayout& layout, std::string_view fallback_name, std::string_view file) {
  std::vector<ParamSlice> out;
  const json::value* pl = json_of(m.training).if_contains("param_layout");
  if (!pl) {
    out.push_back({std::string(fallback_name), {layout.num_params}, 0, layout.num_params});
    return out;
  }
  if (!pl->is_array()) bad_manifest(file, "training.param_layout", "an array", json::serialize(*pl).substr(0, 64));
  std::set<std::string> names;
  for (std::size_t i = 0; i < pl->as_array().size(); ++i) {
    const json::value& v = pl->as_array()[i];
    const std::string where = "training.param_layout[" + std::to_string(i) + "]";
    if (!v.is_object()) bad_manifest(file, where, "an object", json::serialize(v).substr(0, 64));
    const json::object& o = v.as_object();
    ParamSlice s;
    const json::value* name = o.if_contains("name");
    if (!name || !name->is_string()) bad_manifest(file, where + ".name", "a string", name ? json::serialize(*name).substr(0, 64) : "absent");
    s.name = std::string(name->as_string());
    if (s.name.empty() || s.name == "__metadata__" || !names.insert(s.name).second)
      bad_manifest(file, where + ".name", "a unique, non-empty name other than __metadata__", "'" + s.name + "'");
    const json::value* shape = o.if_contains("shape");
    if (!shape || !shape->is_array()) bad_manifest(file, where + ".shape", "an array", shape ? json::serialize(*shape).substr(0, 64) : "absent");
    for (const auto& d : shape->as_array()) s.shape.push_back(json_u64(d, file, where + ".shape"));
    for (const char* f : {"offset", "numel"}) {
      const json::value* x = o.if_contains(f);
      if (!x) bad_manifest(file, where + "." + f, "present", "absent");
    }
    s.offset = json_u64(o.at("offset"), file, where + ".offset");
    s.numel = json_u64(o.at("numel"), file, where + ".numel");
    std::uint64_t numel = 1, end;
    for (auto d : s.shape)
      if (__builtin_mul_overflow(numel, d, &numel)) bad_manifest(file, where + ".shape", "an element count that fits 64 bits", "overflow");
    if (numel != s.numel) bad_manifest(file, where + ".numel", std::to_string(numel) + " (product of shape)", std::to_string(s.numel));
    if (__builtin_add_overflow(s.offset, s.numel, &end) || end > layout.num_params)
      bad_manifest(file, where, "offset + numel <= num_params " + std::to_string(layout.num_params),
                   std::to_string(s.offset) + " + " + std::to_string(s.numel));
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace ckpt
