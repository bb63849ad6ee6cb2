// SPDX-License-Identifier: Apache-2.0
#include "ckpt/format/redundancy.hpp"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <set>

#include "ckpt/format/file_names.hpp"

namespace ckpt {

namespace {
std::optional<int> parse_int(std::string_view s) noexcept {
  int v = 0;
  const auto* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc{} || p != end || s.empty() || v < 0) return std::nullopt;
  return v;
}
}  // namespace

std::optional<RedundancyScheme> parse_redundancy(std::string_view text) noexcept {
  RedundancyScheme s;
  if (text == "none") return s;
  if (text.starts_with("replicate:")) {
    auto rest = text.substr(10);
    std::string_view f = rest, j;
    if (const auto slash = rest.find('/'); slash != std::string_view::npos) f = rest.substr(0, slash), j = rest.substr(slash + 1);
    const auto copies = parse_int(f);
    if (!copies || *copies < 2 || *copies > 255) return std::nullopt;
    s.kind = RedundancyScheme::Kind::replicate;
    s.copies = *copies;
    if (!j.empty() || rest.find('/') != std::string_view::npos) {
      const auto jump = parse_int(j);
      if (!jump || *jump < 1) return std::nullopt;
      s.jump = *jump;
    }
    return s;
  }
  if (text.starts_with("rs:")) {
    const auto rest = text.substr(3);
    const auto plus = rest.find('+');
    if (plus == std::string_view::npos) return std::nullopt;
    const auto k = parse_int(rest.substr(0, plus)), m = parse_int(rest.substr(plus + 1));
    if (!k || !m || *k < 1 || *m < 1 || *k + *m > 255) return std::nullopt;
    s.kind = RedundancyScheme::Kind::reed_solomon;
    s.k = *k;
    s.m = *m;
    return s;
  }
  return std::nullopt;
}

std::string redundancy_name(const RedundancyScheme& s) {
  switch (s.kind) {
    case RedundancyScheme::Kind::none: return "none";
    case RedundancyScheme::Kind::replicate:
      return "replicate:" + std::to_string(s.copies) + (s.jump != 1 ? "/" + std::to_string(s.jump) : "");
    case RedundancyScheme::Kind::reed_solomon: return "rs:" + std::to_string(s.k) + "+" + std::to_string(s.m);
  }
  return "?";
}

int tolerated_node_losses(const RedundancyScheme& s) noexcept {
  switch (s.kind) {
    case RedundancyScheme::Kind::none: return 0;
    case RedundancyScheme::Kind::replicate: return s.copies - 1;
    case RedundancyScheme::Kind::reed_solomon: return s.m;
  }
  return 0;
}

std::optional<std::string> layout_problem(const NodeLayout& l, int world_size) {
  if (l.nodes < 1) return "nodes must be at least 1 (got " + std::to_string(l.nodes) + ")";
  if (l.ranks_per_node < 1) return "ranks_per_node must be at least 1 (got " + std::to_string(l.ranks_per_node) + ")";
  if (static_cast<long long>(l.nodes) * l.ranks_per_node != world_size)
    return "nodes x ranks_per_node (" + std::to_string(l.nodes) + " x " + std::to_string(l.ranks_per_node) + ") must equal the world size " +
           std::to_string(world_size);
  const auto& s = l.scheme;
  if (s.kind == RedundancyScheme::Kind::replicate) {
    if (s.copies > l.nodes)
      return redundancy_name(s) + " needs at least " + std::to_string(s.copies) + " nodes (got " + std::to_string(l.nodes) + ")";
    if (s.jump < 1) return "replicate jump must be at least 1";
    std::set<int> at{0};
    for (int c = 1; c < s.copies; ++c)
      if (!at.insert(static_cast<int>((static_cast<long long>(c) * s.jump) % l.nodes)).second)
        return redundancy_name(s) + " puts two copies on one node with " + std::to_string(l.nodes) + " nodes (choose another jump)";
  } else if (s.kind == RedundancyScheme::Kind::reed_solomon) {
    if (s.k < 1 || s.m < 1) return "rs:K+M needs K >= 1 and M >= 1";
    if (s.k + s.m > l.nodes)
      return redundancy_name(s) + " needs at least K + M = " + std::to_string(s.k + s.m) + " nodes (got " + std::to_string(l.nodes) + ")";
  }
  return std::nullopt;
}

std::vector<int> replica_nodes(const NodeLayout& l, int node) {
  std::vector<int> out;
  if (l.scheme.kind != RedundancyScheme::Kind::replicate) return out;
  for (int c = 1; c < l.scheme.copies; ++c)
    out.push_back(static_cast<int>((node + static_cast<long long>(c) * l.scheme.jump) % l.nodes));
  return out;
}

std::vector<std::uint64_t> node_data_bytes(const NodeLayout& l, std::span<const std::uint64_t> shard_sizes) {
  std::vector<std::uint64_t> d(static_cast<std::size_t>(l.nodes), 0);
  for (std::size_t r = 0; r < shard_sizes.size(); ++r) d[static_cast<std::size_t>(l.node_of(static_cast<int>(r)))] += shard_sizes[r];
  return d;
}

std::vector<Stripe> rs_stripes(const NodeLayout& l, std::span<const std::uint64_t> shard_sizes) {
  std::vector<Stripe> out;
  if (l.scheme.kind != RedundancyScheme::Kind::reed_solomon) return out;
  const auto k = static_cast<std::uint64_t>(l.scheme.k);
  const auto data = node_data_bytes(l, shard_sizes);
  for (int s = 0; s < l.nodes; ++s) {
    Stripe st;
    st.index = s;
    for (int i = 0; i < l.scheme.k; ++i) {
      const int n = (s + i) % l.nodes;
      const std::uint64_t d = data[static_cast<std::size_t>(n)];
      const std::uint64_t piece = (d + k - 1) / k;
      const std::uint64_t begin = std::min(d, static_cast<std::uint64_t>(i) * piece);
      const std::uint64_t end = std::min(d, begin + piece);
      st.data.push_back({n, i, begin, end - begin});
      st.length = std::max(st.length, end - begin);
    }
    for (int p = 0; p < l.scheme.m; ++p) st.parity_nodes.push_back((s + l.scheme.k + p) % l.nodes);
    out.push_back(std::move(st));
  }
  return out;
}

std::string parity_file_name(int stripe, int index) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "parity-s%05d-p%d.rs", stripe, index);
  return buf;
}

std::string replica_file_name(int rank, int world_size) { return "replica-" + shard_file_name(rank, world_size); }

std::vector<RedundancyBlock> planned_blocks(const NodeLayout& l, std::span<const std::uint64_t> shard_sizes) {
  std::vector<RedundancyBlock> out;
  if (l.scheme.kind == RedundancyScheme::Kind::reed_solomon) {
    for (const auto& st : rs_stripes(l, shard_sizes))
      for (int p = 0; p < l.scheme.m; ++p) {
        RedundancyBlock b;
        b.kind = RedundancyBlock::Kind::parity;
        b.node = st.parity_nodes[static_cast<std::size_t>(p)];
        b.stripe = st.index;
        b.index = p;
        b.path = parity_file_name(st.index, p);
        b.size = st.length;
        out.push_back(std::move(b));
      }
  } else if (l.scheme.kind == RedundancyScheme::Kind::replicate) {
    const int world = static_cast<int>(shard_sizes.size());
    for (int r = 0; r < world; ++r)
      for (int n : replica_nodes(l, l.node_of(r))) {
        RedundancyBlock b;
        b.kind = RedundancyBlock::Kind::replica;
        b.node = n;
        b.rank = r;
        b.path = replica_file_name(r, world);
        b.size = shard_sizes[static_cast<std::size_t>(r)];
        out.push_back(std::move(b));
      }
  }
  return out;
}

}  // namespace ckpt
