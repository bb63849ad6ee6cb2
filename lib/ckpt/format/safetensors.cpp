// SPDX-License-Identifier: Apache-2.0
#include "ckpt/format/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <set>

#include "ckpt/core/error.hpp"
#include "ckpt/format/json_util.hpp"

namespace ckpt {

namespace json = boost::json;

std::uint64_t shape_numel(std::span<const std::uint64_t> shape) {
  std::uint64_t n = 1;
  for (auto d : shape)
    if (__builtin_mul_overflow(n, d, &n)) throw_invalid("tensor shape overflows 64-bit element count");
  return n;
}

namespace {

json::object header_json(const ShardHeader& h) {
  json::object o;
  if (!h.metadata.empty()) {
    json::object meta;
    for (const auto& [k, v] : h.metadata) meta[k] = v;
    o["__metadata__"] = std::move(meta);
  }
  for (const auto& t : h.tensors) {
    json::array shape;
    for (auto d : t.shape) shape.emplace_back(d);
    o[t.name] = json::object{{"dtype", dtype_name(t.dtype)},
                             {"shape", std::move(shape)},
                             {"data_offsets", json::array{t.begin, t.end}}};
  }
  return o;
}

std::uint64_t round_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

ShardHeader plan_shard_specs(std::span<const TensorSpec> tensors, std::map<std::string, std::string> metadata) {
  // The same rules as plan_shard (format/safetensors.cpp): larger elements first, stable, and
  // the header JSON built field by field in the same order, so that both plans agree byte
  // for byte (a test holds them to it).
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return dtype_size(tensors[a].dtype) > dtype_size(tensors[b].dtype); });
  ShardHeader h;
  h.metadata = std::move(metadata);
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (std::size_t i : order) {
    const TensorSpec& t = tensors[i];
    if (t.name.empty() || t.name == "__metadata__") throw_invalid("tensor name '" + t.name + "' is reserved or empty");
    if (!names.insert(t.name).second) throw_invalid("duplicate tensor name '" + t.name + "'");
    std::uint64_t bytes, end;
    if (__builtin_mul_overflow(shape_numel(t.shape), dtype_size(t.dtype), &bytes) || __builtin_add_overflow(offset, bytes, &end))
      throw_invalid("tensor '" + t.name + "' is too large");
    h.tensors.push_back({t.name, t.dtype, t.shape, offset, end});
    offset = end;
  }
  h.data_size = offset;
  h.data_start = planned_data_start(h);
  return h;
}

ShardHeader plan_shard(std::span<const TensorView> tensors, std::map<std::string, std::string> metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  ShardHeader h = plan_shard_specs(specs, std::move(metadata));
  // The layout needs only the specs; the bytes must then fit it exactly.
  for (const auto& t : tensors) {
    const std::uint64_t bytes = shape_numel(t.shape) * dtype_size(t.dtype);
    if (bytes != t.data.size())
      throw Error(Errc::invalid_argument, {}, "tensor '" + t.name + "' data size", std::to_string(bytes), std::to_string(t.data.size()));
  }
  return h;
}

std::uint64_t planned_data_start(const ShardHeader& h) {
  return round_up(8 + json::serialize(header_json(h)).size(), kDataAlignment);
}

std::string encode_shard_header(const ShardHeader& h) {
  std::string text = json::serialize(header_json(h));
  if (8 + text.size() > h.data_start) throw_invalid("shard header does not fit its planned size");
  const std::uint64_t n = h.data_start - 8;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += text;
  out.resize(h.data_start, ' ');
  return out;
}

std::uint64_t parse_shard_prefix(std::span<const std::byte> first8, std::uint64_t file_size, std::string_view file) {
  if (file_size < 8 || first8.size() < 8)
    throw Error(Errc::malformed_shard, std::string(file), "file shorter than the 8-byte header length",
                ">= 8 bytes", std::to_string(file_size) + " bytes");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | std::to_integer<std::uint64_t>(first8[static_cast<std::size_t>(i)]);
  if (n > kMaxHeaderBytes)
    throw Error(Errc::malformed_shard, std::string(file), "header length",
                "at most " + std::to_string(kMaxHeaderBytes), std::to_string(n));
  if (n > file_size - 8)
    throw Error(Errc::malformed_shard, std::string(file), "header length beyond end of file",
                "at most " + std::to_string(file_size - 8), std::to_string(n));
  return 8 + n;
}

ShardHeader parse_shard_header(std::string_view text, std::uint64_t file_size, std::string_view file) {
  const detail::JsonContext c{Errc::malformed_shard, file};
  if (file_size < 8 + text.size())
    c.fail("header length", "at most " + std::to_string(file_size >= 8 ? file_size - 8 : 0), std::to_string(text.size()));
  ShardHeader h;
  h.data_start = 8 + text.size();
  h.data_size = file_size - h.data_start;
  // Trailing spaces are padding; anything else after the JSON value is rejected by the parser.
  // The document lives only while it is read into `h`: an arena frees it at once instead of
  // node by node (a 100k-tensor header is a million allocations; every read path parses it).
  json::monotonic_resource arena;
  const json::value root = detail::json_parse(c, text, "header JSON", &arena);
  const json::object& o = detail::json_obj(c, root, "header");
  for (const auto& kv : o) {
    const std::string_view key = kv.key();
    if (key == "__metadata__") {
      for (const auto& m : detail::json_obj(c, kv.value(), "__metadata__"))
        h.metadata[std::string(m.key())] = std::string(detail::json_str(c, m.value(), "__metadata__." + std::string(m.key())));
      continue;
    }
    const std::string where = "tensor '" + std::string(key) + "'";
    if (key.empty()) c.fail("tensor name", "non-empty", "empty");
    const json::object& t = detail::json_obj(c, kv.value(), where);
    for (const auto& f : t)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        c.fail(where, "fields dtype, shape, data_offsets", "unexpected field '" + std::string(f.key()) + "'");
    ShardTensor st;
    st.name = std::string(key);
    auto type = detail::json_tensor_type(c, t, where);
    st.dtype = type.dtype;
    st.shape = std::move(type.shape);
    const auto& offs = detail::json_arr(c, detail::json_field(c, t, "data_offsets", where + "."), where + ".data_offsets");
    if (offs.size() != 2) c.fail(where + ".data_offsets", "2 entries", std::to_string(offs.size()));
    st.begin = detail::json_u64(c, offs[0], where + ".data_offsets[0]");
    st.end = detail::json_u64(c, offs[1], where + ".data_offsets[1]");
    if (st.end < st.begin)
      c.fail(where + ".data_offsets", "begin <= end", std::to_string(st.begin) + " > " + std::to_string(st.end));
    const std::uint64_t bytes = type.bytes;
    if (st.end - st.begin != bytes)
      c.fail(where + ".data_offsets", std::to_string(bytes) + " bytes (shape x dtype)", std::to_string(st.end - st.begin) + " bytes");
    h.tensors.push_back(std::move(st));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const ShardTensor& a, const ShardTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The offsets must tile [0, data_size) exactly: a hole or an overlap means a tampered or
  // mis-written file, and bytes past the last tensor would go unchecked by the reader.
  std::uint64_t expect = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != expect)
      c.fail("tensor '" + t.name + "' data_offsets", "begin " + std::to_string(expect) + " (no hole or overlap)",
             "begin " + std::to_string(t.begin));
    expect = t.end;
  }
  if (expect != h.data_size)
    c.fail("data section", std::to_string(h.data_size) + " bytes covered by tensors", std::to_string(expect) + " bytes");
  return h;
}

}  // namespace ckpt
