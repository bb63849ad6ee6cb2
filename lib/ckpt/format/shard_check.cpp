// SPDX-License-Identifier: Apache-2.0
#include "ckpt/format/shard_check.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/core/error.hpp"
#include "ckpt/format/sharding.hpp"

namespace ckpt {

std::vector<std::byte> read_shard_head(const ReadAt& read_at, std::uint64_t file_size, std::string_view file) {
  std::byte prefix[8] = {};
  const std::size_t have = file_size >= 8 ? 8 : 0;
  if (have) read_at(0, std::span(prefix, have));
  const std::uint64_t data_start = parse_shard_prefix(std::span(prefix, have), file_size, file);
  std::vector<std::byte> head(static_cast<std::size_t>(data_start));
  std::memcpy(head.data(), prefix, 8);
  if (data_start > 8) read_at(8, std::span(head).subspan(8));
  return head;
}

namespace {

std::string byte_range(std::uint64_t begin, std::uint64_t end) { return std::to_string(begin) + "-" + std::to_string(end); }
std::string single_quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

}  // namespace

CheckedShardHeader check_shard_head(const Manifest& m, const ShardRecord& rec, std::span<const std::byte> head, std::string_view file) {
  // The index entries of this file: its rank's, of its part.
  const auto in_file = [&rec](const TensorRecord& t) { return t.rank == rec.rank && t.part == rec.part; };
  const std::uint64_t data_start = parse_shard_prefix(head.first(std::min<std::size_t>(8, head.size())), rec.size, file);
  if (head.size() < data_start)
    throw Error(Errc::malformed_shard, std::string(file), "header bytes available", std::to_string(data_start), std::to_string(head.size()));
  const std::string_view json(reinterpret_cast<const char*>(head.data()) + 8, static_cast<std::size_t>(data_start - 8));
  CheckedShardHeader out{parse_shard_header(json, rec.size, file), {}};
  const ShardHeader& h = out.header;
  // One lookup per header entry: a linear find_tensor per entry is quadratic, minutes for a
  // 100k-tensor shard. Names are unique per rank (decode_manifest checks) and per header (the
  // offsets of a name given twice cannot tile).
  std::unordered_map<std::string_view, const TensorRecord*> index;
  for (const auto& t : m.tensors)
    if (in_file(t)) index.emplace(t.name, &t);
  auto disagree = [&](const std::string& what, std::string expected, std::string actual) {
    throw Error(Errc::malformed_shard, std::string(file), what, std::move(expected), std::move(actual));
  };
  // The header's absolute range of tensor t (parse_shard_header: end <= data_size, and
  // data_start + data_size is the file size, so nothing overflows).
  auto begin_of = [&](const ShardTensor& t) { return h.data_start + t.begin; };
  auto end_of = [&](const ShardTensor& t) { return h.data_start + t.end; };
  out.records.reserve(h.tensors.size());
  for (const auto& t : h.tensors) {
    const auto found = index.find(t.name);
    if (found == index.end()) {
      // The index entry for the same bytes, if one has a name the header lacks, is what the
      // manifest calls them.
      std::unordered_set<std::string_view> names;
      for (const auto& x : h.tensors) names.insert(x.name);
      std::string expected = "absent";
      for (const auto& r : m.tensors)
        if (in_file(r) && r.begin == begin_of(t) && r.end == end_of(t) && !names.contains(r.name)) {
          expected = single_quoted(r.name);
          break;
        }
      disagree("tensor '" + t.name + "' of the shard header disagrees with the manifest index in its name", expected, single_quoted(t.name));
    }
    const TensorRecord& r = *found->second;
    const std::string what = "tensor '" + t.name + "' disagrees with the manifest index in its ";
    if (r.dtype != t.dtype) disagree(what + "dtype", std::string(dtype_name(r.dtype)), std::string(dtype_name(t.dtype)));
    if (r.shape != t.shape) disagree(what + "shape", format_index(r.shape), format_index(t.shape));
    if (r.begin != begin_of(t) || r.end != end_of(t)) disagree(what + "byte range", byte_range(r.begin, r.end), byte_range(begin_of(t), end_of(t)));
    out.records.push_back(&r);
  }
  if (index.size() != h.tensors.size()) {
    // Every header tensor has its entry, so some entry has no header tensor: the first in the file.
    std::unordered_set<std::string_view> names;
    for (const auto& x : h.tensors) names.insert(x.name);
    const TensorRecord* first = nullptr;
    for (const auto& r : m.tensors)
      if (in_file(r) && !names.contains(r.name) && (!first || r.begin < first->begin)) first = &r;
    std::string actual = "absent";
    for (const auto& t : h.tensors)
      if (begin_of(t) == first->begin && end_of(t) == first->end) {
        actual = single_quoted(t.name);
        break;
      }
    disagree("tensor '" + first->name + "' of the manifest index disagrees with the shard header in its name", single_quoted(first->name), actual);
  }
  return out;
}

}  // namespace ckpt
