// SPDX-License-Identifier: Apache-2.0
// The redundancy schemes, the node layout and its stripes (format/redundancy.hpp), and the
// manifest's "nodes" and "redundancy_blocks" (format/manifest.hpp).
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "ckpt/core/error.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "support/test_support.hpp"
#include "support/manifest_edit.hpp"

using namespace ckpt;
namespace json = boost::json;

namespace {

// shard_file_name lives in fs/layout.hpp (not a format dependency); the tests spell it out.
std::string shard_file_name_for_test(int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05d-of-%05d.safetensors", rank, world);
  return buf;
}

RedundancyScheme scheme(std::string_view text) {
  const auto s = parse_redundancy(text);
  REQUIRE_MESSAGE(s.has_value(), text);
  return *s;
}

NodeLayout layout(int nodes, int ranks_per_node, std::string_view text) { return {nodes, ranks_per_node, scheme(text)}; }

std::string hex64(int seed) {
  static const char* digits = "0123456789abcdef";
  std::string s(64, '0');
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = digits[(static_cast<std::size_t>(seed) * 7 + i * 3) % 16];
  return s;
}

constexpr std::uint64_t kChunk = 4096;

// A manifest of `world` ranks with uneven shard sizes, its blocks planned by `l` with made-up
// checksums (a replica's are its shard's, as the decoder demands).
Manifest node_manifest(const NodeLayout& l) {
  const int world = l.world_size();
  Manifest m;
  m.world_size = world;
  m.step = 30;
  m.created_at = "2026-12-01T10:00:00.000Z";
  m.chunk_size = kChunk;
  m.param_numel = 100u * static_cast<std::uint64_t>(world);
  std::vector<std::uint64_t> sizes;
  for (int r = 0; r < world; ++r) {
    ShardRecord s;
    s.rank = r;
    s.path = shard_file_name_for_test(r, world);
    s.size = 5000 + 1237u * static_cast<std::uint64_t>(r);
    s.sha256 = hex64(r);
    s.xxh3 = 0x1000u + static_cast<std::uint64_t>(r);
    for (std::uint64_t c = 0; c < chunk_count(s.size, kChunk); ++c) s.chunk_xxh3.push_back(c * 7 + static_cast<std::uint64_t>(r));
    s.param_shard_offset = 100u * static_cast<std::uint64_t>(r);
    s.param_shard_numel = 100;
    sizes.push_back(s.size);
    m.shards.push_back(s);
    m.tensors.push_back({"master", r, DType::F32, {100}, 4096, 4496});
  }
  m.nodes = l;
  m.redundancy = planned_blocks(l, sizes);
  int seed = 100;
  for (auto& b : m.redundancy) {
    if (b.kind == RedundancyBlock::Kind::replica) {
      const auto& s = m.shards[static_cast<std::size_t>(b.rank)];
      b.sha256 = s.sha256, b.xxh3 = s.xxh3, b.chunk_xxh3 = s.chunk_xxh3;
    } else {
      b.sha256 = hex64(seed++);
      b.xxh3 = static_cast<std::uint64_t>(seed);
      for (std::uint64_t c = 0; c < chunk_count(b.size, kChunk); ++c) b.chunk_xxh3.push_back(c + static_cast<std::uint64_t>(seed));
    }
  }
  return m;
}

Error decode_error(const Manifest& m, const std::function<void(json::object&)>& edit) {
  return test::manifest_decode_error(m, edit, "/n/manifest.json");
}

json::object& block(json::object& o, std::size_t i) { return o["redundancy_blocks"].as_array()[i].as_object(); }

}  // namespace

TEST_CASE("every redundancy scheme's name parses back to the same scheme and name") {
  for (const char* text : {"none", "replicate:2", "replicate:3", "replicate:3/2", "replicate:255", "rs:1+1", "rs:3+1", "rs:2+2", "rs:4+2",
                           "rs:3+3", "rs:200+55"}) {
    INFO(text);
    const auto s = scheme(text);
    CHECK(redundancy_name(s) == text);
    CHECK(parse_redundancy(redundancy_name(s)) == s);
  }
  CHECK(scheme("rs:3+1") == RedundancyScheme{.kind = RedundancyScheme::Kind::reed_solomon, .k = 3, .m = 1});
  CHECK(scheme("replicate:3/2") == RedundancyScheme{.kind = RedundancyScheme::Kind::replicate, .copies = 3, .jump = 2});
  // The default jump is written without it.
  CHECK(redundancy_name(scheme("replicate:2/1")) == "replicate:2");
  CHECK(tolerated_node_losses(scheme("none")) == 0);
  CHECK(tolerated_node_losses(scheme("replicate:3")) == 2);
  CHECK(tolerated_node_losses(scheme("rs:4+2")) == 2);
}

TEST_CASE("malformed, out-of-range and padded redundancy texts are refused") {
  for (const char* text : {"", "None", "none ", "replicate", "replicate:", "replicate:1", "replicate:0", "replicate:-2", "replicate:+2",
                           "replicate:256", "replicate:2/", "replicate:2/0", "replicate:2/-1", "replicate:2/x", "replicate:2/3/4",
                           "replicate:2 ", " replicate:2", "replicate:99999999999", "rs", "rs:", "rs:3", "rs:3+", "rs:+1", "rs:0+1",
                           "rs:3+0", "rs:3-1", "rs:3+1+1", "rs:3+1 ", " rs:3+1", "rs:200+56", "rs:99999999999+1", "rs:-1+2", "RS:3+1",
                           "rs:3+1/2"}) {
    INFO("'" << text << "'");
    CHECK_FALSE(parse_redundancy(text).has_value());
  }
}

TEST_CASE("layout_problem names what a layout lacks for the world size and accepts the layouts that fit") {
  const auto problem = [](const NodeLayout& l, int world) { return layout_problem(l, world).value_or("(none)"); };
  CHECK(problem({0, 1, {}}, 4) == "nodes must be at least 1 (got 0)");
  CHECK(problem({4, 0, {}}, 4) == "ranks_per_node must be at least 1 (got 0)");
  CHECK(problem({3, 1, {}}, 4) == "nodes x ranks_per_node (3 x 1) must equal the world size 4");
  CHECK(problem({2, 3, {}}, 4) == "nodes x ranks_per_node (2 x 3) must equal the world size 4");
  CHECK(problem(layout(2, 1, "replicate:3"), 2) == "replicate:3 needs at least 3 nodes (got 2)");
  CHECK(problem(layout(4, 1, "replicate:3/2"), 4) == "replicate:3/2 puts two copies on one node with 4 nodes (choose another jump)");
  CHECK(problem(layout(4, 1, "replicate:2/4"), 4) == "replicate:2/4 puts two copies on one node with 4 nodes (choose another jump)");
  CHECK(problem(layout(4, 1, "rs:3+2"), 4) == "rs:3+2 needs at least K + M = 5 nodes (got 4)");
  for (const auto& [l, world] : std::vector<std::pair<NodeLayout, int>>{{layout(1, 4, "none"), 4},
                                                                       {layout(4, 1, "rs:3+1"), 4},
                                                                       {layout(4, 2, "rs:2+2"), 8},
                                                                       {layout(5, 1, "rs:3+2"), 5},
                                                                       {layout(4, 1, "replicate:2/2"), 4},
                                                                       {layout(5, 1, "replicate:3/2"), 5},
                                                                       {layout(3, 1, "replicate:3"), 3}}) {
    INFO(redundancy_name(l.scheme) << " over " << l.nodes);
    CHECK_FALSE(layout_problem(l, world).has_value());
  }
}

TEST_CASE("replica nodes are the jumps after the node, wrapping around") {
  CHECK(replica_nodes(layout(3, 1, "replicate:2"), 2) == std::vector<int>{0});
  CHECK(replica_nodes(layout(4, 1, "replicate:3"), 3) == std::vector<int>{0, 1});
  CHECK(replica_nodes(layout(5, 1, "replicate:3/2"), 4) == std::vector<int>{1, 3});
  CHECK(replica_nodes(layout(4, 1, "rs:3+1"), 0).empty());
}

TEST_CASE("the redundancy block file names") {
  CHECK(parity_file_name(3, 0) == "parity-s00003-p0.rs");
  CHECK(parity_file_name(12, 1) == "parity-s00012-p1.rs");
  CHECK(replica_file_name(1, 4) == "replica-rank-00001-of-00004.safetensors");
  CHECK(replica_file_name(1, 4) == "replica-" + shard_file_name_for_test(1, 4));
}

TEST_CASE("rs stripes cover every node's data exactly once with K pieces and never put data and parity of a stripe on one node") {
  struct Config {
    int nodes, rpn, k, m;
    std::vector<std::uint64_t> sizes;  // per rank
  };
  const std::vector<Config> configs = {
      {4, 1, 3, 1, {9000, 9000, 9000, 9000}},           // equal sizes, divisible by K
      {4, 1, 3, 1, {9001, 9001, 9001, 9001}},           // equal sizes, padded
      {4, 1, 2, 2, {100, 7, 12345, 1}},                 // uneven
      {5, 1, 3, 2, {5000, 6237, 7474, 8711, 9948}},     // uneven, M = 2
      {4, 2, 3, 1, {10, 20, 30, 40, 50, 60, 70, 80}},   // two ranks per node
      {6, 1, 2, 1, {4096, 4097, 1, 0, 8192, 3}},        // an empty node, more nodes than K + M
      {3, 2, 1, 2, {0, 0, 5, 6, 7, 0}},                 // K = 1 (parity are copies), an empty node
      {7, 1, 4, 3, {1, 2, 3, 4, 5, 6, 7}},
  };
  for (const auto& c : configs) {
    const NodeLayout l{c.nodes, c.rpn, {.kind = RedundancyScheme::Kind::reed_solomon, .k = c.k, .m = c.m}};
    INFO("rs:" << c.k << "+" << c.m << " over " << c.nodes << " nodes, " << c.rpn << " ranks per node, first size " << c.sizes[0]);
    REQUIRE_FALSE(layout_problem(l, static_cast<int>(c.sizes.size())).has_value());
    const auto data = node_data_bytes(l, c.sizes);
    REQUIRE(data.size() == static_cast<std::size_t>(c.nodes));
    for (int n = 0; n < c.nodes; ++n) {
      std::uint64_t d = 0;
      for (int r = n * c.rpn; r < (n + 1) * c.rpn; ++r) d += c.sizes[static_cast<std::size_t>(r)];
      CHECK(data[static_cast<std::size_t>(n)] == d);
    }
    const auto stripes = rs_stripes(l, c.sizes);
    REQUIRE(stripes.size() == static_cast<std::size_t>(c.nodes));
    std::map<int, std::vector<StripePiece>> pieces;  // per node
    std::map<int, int> as_data, as_parity;
    std::uint64_t parity_bytes = 0;
    for (std::size_t s = 0; s < stripes.size(); ++s) {
      const auto& st = stripes[s];
      CHECK(st.index == static_cast<int>(s));
      REQUIRE(st.data.size() == static_cast<std::size_t>(c.k));
      REQUIRE(st.parity_nodes.size() == static_cast<std::size_t>(c.m));
      std::set<int> members;
      std::uint64_t longest = 0;
      for (int i = 0; i < c.k; ++i) {
        const auto& p = st.data[static_cast<std::size_t>(i)];
        CHECK(p.index == i);  // code row i is piece i
        CHECK(p.node == (static_cast<int>(s) + i) % c.nodes);
        CHECK(members.insert(p.node).second);
        pieces[p.node].push_back(p);
        ++as_data[p.node];
        longest = std::max(longest, p.length);
      }
      for (int p = 0; p < c.m; ++p) {
        const int node = st.parity_nodes[static_cast<std::size_t>(p)];
        CHECK(node == (static_cast<int>(s) + c.k + p) % c.nodes);
        CHECK_MESSAGE(members.insert(node).second, "node " << node << " is both data and parity of stripe " << s);
        ++as_parity[node];
      }
      CHECK(st.length == longest);
      parity_bytes += st.length * static_cast<std::uint64_t>(c.m);
    }
    std::uint64_t total = 0;
    for (int n = 0; n < c.nodes; ++n) {
      const std::uint64_t d = data[static_cast<std::size_t>(n)];
      total += d;
      CHECK(as_data[n] == c.k);
      CHECK(as_parity[n] == c.m);
      auto v = pieces[n];
      REQUIRE(v.size() == static_cast<std::size_t>(c.k));
      std::sort(v.begin(), v.end(), [](const StripePiece& a, const StripePiece& b) { return a.index < b.index; });
      // Pieces 0..K-1 in order, back to back, covering [0, D) exactly; each at most ceil(D / K).
      std::uint64_t at = 0;
      const std::uint64_t piece = (d + static_cast<std::uint64_t>(c.k) - 1) / static_cast<std::uint64_t>(c.k);
      for (int i = 0; i < c.k; ++i) {
        CHECK(v[static_cast<std::size_t>(i)].index == i);
        CHECK(v[static_cast<std::size_t>(i)].offset == std::min(d, at));
        CHECK(v[static_cast<std::size_t>(i)].length <= piece);
        at = v[static_cast<std::size_t>(i)].offset + v[static_cast<std::size_t>(i)].length;
      }
      CHECK(at == d);
    }
    // With equal sizes divisible by K, parity is exactly M / K of the data.
    if (std::all_of(c.sizes.begin(), c.sizes.end(), [&](auto x) { return x == c.sizes[0]; }) && c.sizes[0] * c.rpn % c.k == 0)
      CHECK(parity_bytes * static_cast<std::uint64_t>(c.k) == total * static_cast<std::uint64_t>(c.m));
    // Planned blocks: stripe by stripe, parity by index, of the stripe's length on its parity node.
    const auto blocks = planned_blocks(l, c.sizes);
    REQUIRE(blocks.size() == static_cast<std::size_t>(c.nodes * c.m));
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const auto& b = blocks[i];
      const auto& st = stripes[i / static_cast<std::size_t>(c.m)];
      const int p = static_cast<int>(i % static_cast<std::size_t>(c.m));
      CHECK(b.kind == RedundancyBlock::Kind::parity);
      CHECK(b.stripe == st.index);
      CHECK(b.index == p);
      CHECK(b.node == st.parity_nodes[static_cast<std::size_t>(p)]);
      CHECK(b.size == st.length);
      CHECK(b.path == parity_file_name(st.index, p));
      CHECK(b.rank == -1);
    }
  }
  // Other schemes have no stripes.
  CHECK(rs_stripes(layout(3, 1, "replicate:2"), std::vector<std::uint64_t>{1, 2, 3}).empty());
  CHECK(rs_stripes(layout(3, 1, "none"), std::vector<std::uint64_t>{1, 2, 3}).empty());
}

TEST_CASE("replicate plans F-1 copies of every shard rank by rank on the jumped nodes") {
  const NodeLayout l = layout(5, 2, "replicate:3/2");
  const std::vector<std::uint64_t> sizes = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  const auto blocks = planned_blocks(l, sizes);
  REQUIRE(blocks.size() == sizes.size() * 2);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    const int r = static_cast<int>(i / 2), copy = static_cast<int>(i % 2) + 1;
    CHECK(b.kind == RedundancyBlock::Kind::replica);
    CHECK(b.rank == r);
    CHECK(b.node == (l.node_of(r) + copy * 2) % 5);
    CHECK(b.node != l.node_of(r));
    CHECK(b.size == sizes[static_cast<std::size_t>(r)]);
    CHECK(b.path == replica_file_name(r, 10));
    CHECK(b.stripe == -1);
  }
  CHECK(planned_blocks(layout(4, 1, "none"), std::vector<std::uint64_t>{1, 2, 3, 4}).empty());
}

TEST_CASE("a manifest with nodes and redundancy blocks round-trips exactly") {
  for (const auto& l : {layout(4, 1, "rs:3+1"), layout(4, 2, "rs:2+2"), layout(5, 1, "rs:3+2"), layout(3, 1, "replicate:2"),
                        layout(4, 1, "replicate:3"), layout(5, 1, "replicate:3/2"), layout(2, 2, "none")}) {
    INFO(redundancy_name(l.scheme) << " over " << l.nodes);
    const Manifest m = node_manifest(l);
    const std::string text = encode_manifest(m);
    const Manifest d = decode_manifest(text, "/n/manifest.json");
    REQUIRE(d.nodes.has_value());
    CHECK(*d.nodes == l);
    REQUIRE(d.redundancy.size() == m.redundancy.size());
    for (std::size_t i = 0; i < m.redundancy.size(); ++i) {
      const auto &a = m.redundancy[i], &b = d.redundancy[i];
      CHECK(a.kind == b.kind);
      CHECK(a.node == b.node);
      CHECK(a.stripe == b.stripe);
      CHECK(a.index == b.index);
      CHECK(a.rank == b.rank);
      CHECK(a.path == b.path);
      CHECK(a.size == b.size);
      CHECK(a.sha256 == b.sha256);
      CHECK(a.xxh3 == b.xxh3);
      CHECK(a.chunk_xxh3 == b.chunk_xxh3);
    }
    CHECK(encode_manifest(d) == text);
    // The parity entries carry their stripe's members for an independent decoder.
    const json::object o = json::parse(text).as_object();
    CHECK(o.at("nodes").at("redundancy").as_string() == redundancy_name(l.scheme));
    if (l.scheme.kind == RedundancyScheme::Kind::reed_solomon) {
      const auto stripes = rs_stripes(l, [&] {
        std::vector<std::uint64_t> s;
        for (const auto& r : m.shards) s.push_back(r.size);
        return s;
      }());
      const auto& members = o.at("redundancy_blocks").as_array().at(0).at("members").as_array();
      REQUIRE(members.size() == static_cast<std::size_t>(l.scheme.k));
      for (std::size_t j = 0; j < members.size(); ++j) {
        const auto& e = members[j].as_array();
        CHECK(e.at(0).to_number<int>() == stripes[0].data[j].node);
        CHECK(e.at(1).to_number<int>() == stripes[0].data[j].index);
        CHECK(e.at(2).to_number<std::uint64_t>() == stripes[0].data[j].offset);
        CHECK(e.at(3).to_number<std::uint64_t>() == stripes[0].data[j].length);
      }
    }
  }
  // Without nodes: neither field is written, and none is decoded.
  Manifest plain = node_manifest(layout(2, 1, "none"));
  plain.nodes.reset();
  plain.redundancy.clear();
  const std::string text = encode_manifest(plain);
  CHECK(text.find("\"nodes\"") == std::string::npos);
  CHECK(text.find("redundancy_blocks") == std::string::npos);
  CHECK_FALSE(decode_manifest(text, "m").nodes.has_value());
}

TEST_CASE("a parity block with another stripe geometry is refused naming its members field") {
  const Manifest m = node_manifest(layout(4, 1, "rs:3+1"));
  const Error e = decode_error(m, [](json::object& o) { block(o, 2)["members"].as_array()[1].as_array()[3] = 1; });
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == "/n/manifest.json");
  CHECK(e.detail() == "redundancy_blocks[2].members");
  CHECK(e.expected().find("the stripe geometry of the shard sizes") != std::string::npos);
  // Members swapped, one dropped, one added, a malformed entry: all refused on the same field.
  for (const auto& edit : std::vector<std::function<void(json::object&)>>{
           [](json::object& o) { std::swap(block(o, 0)["members"].as_array()[0], block(o, 0)["members"].as_array()[1]); },
           [](json::object& o) { block(o, 0)["members"].as_array().pop_back(); },
           [](json::object& o) { block(o, 0)["members"].as_array().push_back(json::array{3, 0, 0, 1}); },
           [](json::object& o) { block(o, 0)["members"].as_array()[0].as_array()[0] = 3; }}) {
    const Error f = decode_error(m, edit);
    CHECK(f.code() == Errc::malformed_manifest);
    CHECK(f.detail() == "redundancy_blocks[0].members");
  }
  const Error g = decode_error(m, [](json::object& o) { block(o, 0)["members"].as_array()[0].as_array().pop_back(); });
  CHECK(g.code() == Errc::malformed_manifest);
  CHECK(g.detail() == "redundancy_blocks[0].members[0]");
  const Error h = decode_error(m, [](json::object& o) { block(o, 0).erase("members"); });
  CHECK(h.detail() == "redundancy_blocks[0].members");
}

TEST_CASE("a wrong number of redundancy blocks is refused naming the count the scheme plans") {
  const Manifest m = node_manifest(layout(4, 1, "rs:3+1"));
  const Error e = decode_error(m, [](json::object& o) { o["redundancy_blocks"].as_array().pop_back(); });
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.detail() == "redundancy_blocks");
  CHECK(e.expected() == "4 blocks (rs:3+1 over 4 nodes)");
  CHECK(e.actual() == "3");
  const Error f = decode_error(m, [](json::object& o) { o.erase("redundancy_blocks"); });
  CHECK(f.detail() == "redundancy_blocks");
  CHECK(f.actual() == "0");
  const Error g = decode_error(m, [](json::object& o) {
    auto& a = o["redundancy_blocks"].as_array();
    a.push_back(a[0]);
  });
  CHECK(g.actual() == "5");
  const Error h = decode_error(m, [](json::object& o) { o["redundancy_blocks"] = json::object{}; });
  CHECK(h.detail() == "redundancy_blocks");
}

TEST_CASE("a parity block named as a shard, moved to another node or given another size is refused naming the block") {
  const Manifest m = node_manifest(layout(4, 1, "rs:3+1"));
  const Error e = decode_error(m, [](json::object& o) { block(o, 1)["path"] = "rank-00001-of-00004.safetensors"; });
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.detail() == "redundancy_blocks[1]");
  CHECK(e.expected().find("'parity-s00001-p0.rs'") != std::string::npos);
  CHECK(e.actual().find("'rank-00001-of-00004.safetensors'") != std::string::npos);
  const Error f = decode_error(m, [](json::object& o) { block(o, 1)["node"] = 1; });  // node 1 holds data of stripe 1
  CHECK(f.detail() == "redundancy_blocks[1]");
  CHECK(f.expected().find("on node 0") != std::string::npos);
  CHECK(f.actual().find("on node 1") != std::string::npos);
  const Error g = decode_error(m, [](json::object& o) { block(o, 1)["size"] = block(o, 1)["size"].to_number<std::uint64_t>() + 1; });
  CHECK(g.detail() == "redundancy_blocks[1]");
  const Error h = decode_error(m, [](json::object& o) { block(o, 1)["stripe"] = 2; });
  CHECK(h.detail() == "redundancy_blocks[1]");
  const Error i = decode_error(m, [](json::object& o) { block(o, 1)["kind"] = "replica"; });
  CHECK(i.code() == Errc::malformed_manifest);
  const Error j = decode_error(m, [](json::object& o) { block(o, 1)["kind"] = "mirror"; });
  CHECK(j.detail() == "redundancy_blocks[1].kind");
  const Error k = decode_error(m, [](json::object& o) { block(o, 1)["path"] = "../parity-s00001-p0.rs"; });
  CHECK(k.code() == Errc::unsafe_path);
  CHECK(k.detail() == "redundancy_blocks[1].path");
  const Error l = decode_error(m, [](json::object& o) { block(o, 1)["chunk_xxh3"].as_array().pop_back(); });
  CHECK(l.detail() == "redundancy_blocks[1].chunk_xxh3");
  const Error n = decode_error(m, [](json::object& o) { block(o, 1)["sha256"] = std::string(64, 'A'); });
  CHECK(n.detail() == "redundancy_blocks[1].sha256");
  const Error p = decode_error(m, [](json::object& o) { block(o, 1).erase("index"); });
  CHECK(p.detail() == "redundancy_blocks[1].index");
}

TEST_CASE("a replica whose checksums are not its shard's is refused naming the rank") {
  const Manifest m = node_manifest(layout(4, 1, "replicate:2"));
  const Error e = decode_error(m, [](json::object& o) { block(o, 2)["sha256"] = hex64(99); });
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.detail() == "redundancy_blocks[2]");
  CHECK(e.expected().find("rank 2's shard") != std::string::npos);
  CHECK(e.actual() == "sha256 " + hex64(99));
  const Error f = decode_error(m, [](json::object& o) { block(o, 2)["chunk_xxh3"].as_array()[0] = "00000000000000ff"; });
  CHECK(f.detail() == "redundancy_blocks[2]");
  const Error g = decode_error(m, [](json::object& o) { block(o, 2)["rank"] = 3; });
  CHECK(g.detail() == "redundancy_blocks[2]");
  const Error h = decode_error(m, [](json::object& o) { block(o, 2)["node"] = 2; });  // rank 2's own node
  CHECK(h.detail() == "redundancy_blocks[2]");
  CHECK(h.expected().find("on node 3") != std::string::npos);
}

TEST_CASE("redundancy blocks without nodes, and node layouts that do not hold the world size, are refused") {
  const Manifest m = node_manifest(layout(4, 1, "rs:3+1"));
  const Error e = decode_error(m, [](json::object& o) { o.erase("nodes"); });
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.detail() == "redundancy_blocks");
  CHECK(e.expected() == "absent without \"nodes\"");
  const Error f = decode_error(m, [](json::object& o) { o["nodes"].as_object()["count"] = 3; });
  CHECK(f.detail() == "nodes");
  CHECK(f.expected() == "a layout for world_size 4");
  CHECK(f.actual() == "nodes x ranks_per_node (3 x 1) must equal the world size 4");
  const Error g = decode_error(m, [](json::object& o) { o["nodes"].as_object()["ranks_per_node"] = 2; });
  CHECK(g.detail() == "nodes");
  const Error h = decode_error(m, [](json::object& o) { o["nodes"].as_object()["redundancy"] = "rs:3+2"; });
  CHECK(h.detail() == "nodes");
  CHECK(h.actual() == "rs:3+2 needs at least K + M = 5 nodes (got 4)");
  const Error i = decode_error(m, [](json::object& o) { o["nodes"].as_object()["redundancy"] = "raid5"; });
  CHECK(i.detail() == "nodes.redundancy");
  const Error j = decode_error(m, [](json::object& o) { o["nodes"].as_object()["count"] = 0; });
  CHECK(j.detail() == "nodes");
  const Error k = decode_error(m, [](json::object& o) { o["nodes"] = json::array{}; });
  CHECK(k.detail() == "nodes");
  const Error l = decode_error(m, [](json::object& o) { o["nodes"].as_object().erase("count"); });
  CHECK(l.detail() == "nodes.count");
  const Error n = decode_error(m, [](json::object& o) { o["nodes"].as_object()["count"] = -4; });
  CHECK(n.detail() == "nodes.count");
  // A scheme change that keeps the block count still fails on the blocks themselves.
  const Error p = decode_error(m, [](json::object& o) { o["nodes"].as_object()["redundancy"] = "replicate:2"; });
  CHECK(p.code() == Errc::malformed_manifest);
  CHECK(p.detail() == "redundancy_blocks[0]");
}
