// SPDX-License-Identifier: Apache-2.0
#include "ckpt/read/node_layout.hpp"

#include <algorithm>
#include <cstdint>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"

namespace ckpt {

std::vector<std::string> node_root_paths(const std::string& dir, int nodes) {
  if (nodes < 1) throw Error(Errc::invalid_argument, dir, "node count", "at least 1", std::to_string(nodes));
  std::vector<std::string> out;
  for (int n = 0; n < nodes; ++n) out.push_back(join_path(dir, "node-" + std::to_string(n)));
  return out;
}

int node_root_index(std::string_view name) noexcept {
  if (!name.starts_with("node-")) return -1;
  const auto digits = name.substr(5);
  if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string_view::npos) return -1;
  int n = 0;
  for (const char c : digits) n = n * 10 + (c - '0');
  return n;
}

bool is_node_set(FileSystem& fs, const std::string& dir) {
  try {
    const auto st = fs.stat(dir);
    if (!st || st->type != EntryType::directory || fs.stat(join_path(dir, kLatestName))) return false;
    for (const auto& e : fs.list_dir(dir))
      if (e.type == EntryType::directory && node_root_index(e.name) >= 0) return true;
  } catch (const Error&) {
  }
  return false;
}

int count_node_roots(FileSystem& fs, const std::string& dir) {
  if (!is_node_set(fs, dir)) return 0;
  int n = 0;
  std::vector<std::string> present;
  for (const auto& e : fs.list_dir(dir))
    if (const int i = node_root_index(e.name); e.type == EntryType::directory && i >= 0) {
      n = std::max(n, i + 1);
      present.push_back(join_path(dir, e.name));
    }
  // The last nodes may be the lost ones: the manifest of a node's latest checkpoint knows.
  for (const auto& r : present) {
    try {
      const auto name = read_latest(fs, r);
      if (!name) continue;
      if (const auto m = read_checkpoint_manifest(fs, join_path(r, *name)); m->nodes) return std::max(n, m->nodes->nodes);
    } catch (const Error&) {
    }
  }
  return n;
}

std::optional<std::uint64_t> node_latest_step(FileSystem& fs, const std::string& root) {
  try {
    if (!fs.stat(root)) return std::nullopt;
    if (const auto name = read_latest(fs, root)) return parse_checkpoint_dir_name(*name);
  } catch (const Error&) {
  }
  return std::nullopt;
}

std::optional<std::string> read_latest_nodes(FileSystem& fs, std::span<const std::string> roots) {
  std::optional<std::uint64_t> newest;
  for (const auto& r : roots)
    if (const auto s = node_latest_step(fs, r); s && (!newest || *s > *newest)) newest = s;
  if (!newest) return std::nullopt;
  return checkpoint_dir_name(*newest);
}

}  // namespace ckpt
