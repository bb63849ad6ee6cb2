// SPDX-License-Identifier: Apache-2.0
// Checkpoints across node roots with redundancy, on real directories: every pattern of
// losses a scheme tolerates is rebuilt bit-exactly, one more is refused with nothing written,
// crashes anywhere in the commit across nodes leave a checkpoint that loads, rotation runs on
// every node, and the reader finds shards on the sibling node roots.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "io/io_fixture.hpp"
#include "support/node_checkpoint.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using ckpt::test::expect_error;
using ckpt::test::Fixture;
using ckpt::test::LogCapture;
using ckpt::test::random_bytes;
using ckpt::test::read_all;
using ckpt::test::TempDir;
using ckpt::test::write_all;
namespace fsys = std::filesystem;

namespace {

constexpr std::uint64_t kChunk = 4096;

NodeLayout layout_of(int nodes, int rpn, std::string_view scheme) {
  const auto s = parse_redundancy(scheme);
  REQUIRE(s.has_value());
  return {nodes, rpn, *s};
}

// The fixture's tensors plus one of a rank-dependent size: uneven shards, the first shard of
// a node (even rank) much smaller than the second.
struct State {
  Fixture fx;
  std::vector<std::vector<std::uint8_t>> extra;
  State(int world, std::uint64_t step) : fx(world, step, kChunk) {
    extra.reserve(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      const std::size_t n = r % 2 == 0 ? 100 + 37u * static_cast<std::size_t>(r) : 3000 + 511u * static_cast<std::size_t>(r);
      extra.push_back(random_bytes(n, step * 31 + static_cast<std::uint64_t>(r)));
      fx.request.ranks[static_cast<std::size_t>(r)].tensors.push_back(
          {"extra", DType::U8, {n}, std::as_bytes(std::span(extra.back())), std::nullopt});
    }
  }
};

// One checkpoint at `step` across `roots`, as a save with redundancy makes it: the shards
// streamed into the node temporaries, the blocks computed from the shard images (no read-back),
// the manifest with the layout and its blocks, the commit across nodes.
Manifest save_nodes(FileSystem& fs, const std::vector<std::string>& roots, const NodeLayout& l, std::uint64_t step) {
  const int world = l.world_size();
  State st(world, step);
  TempDir scratch("ckpt-node-scratch");
  const Manifest flat = save_checkpoint_sync(posix_file_system(), scratch.path().string(), st.fx.request);
  std::vector<std::vector<std::uint8_t>> images;
  for (const auto& s : flat.shards) images.push_back(read_all(scratch / checkpoint_dir_name(step) / s.path));
  std::vector<RootLock> locks;
  for (const auto& r : roots) locks.emplace_back(fs, r);
  prepare_node_roots(fs, locks);
  const auto temps = begin_node_checkpoint(fs, roots, step);
  try {
    std::vector<std::span<const std::byte>> spans;
    std::vector<std::uint64_t> sizes;
    for (int r = 0; r < world; ++r) {
      const auto& img = images[static_cast<std::size_t>(r)];
      const ShardRecord rec = write_file_from(
          fs, temps[static_cast<std::size_t>(l.node_of(r))], flat.shards[static_cast<std::size_t>(r)].path, img.size(),
          [&](std::uint64_t off, std::span<std::byte> out) { std::memcpy(out.data(), img.data() + off, out.size()); }, flat.chunk_size);
      REQUIRE(rec.sha256 == flat.shards[static_cast<std::size_t>(r)].sha256);
      spans.push_back(std::as_bytes(std::span(img)));
      sizes.push_back(img.size());
    }
    Manifest m = flat;
    m.nodes = l;
    m.redundancy = write_redundancy(fs, temps, l, sizes, node_bytes_from_images(l, spans), flat.chunk_size);
    commit_node_checkpoint(fs, roots, temps, m);
    return m;
  } catch (...) {
    abort_node_checkpoint(fs, roots, temps);
    throw;
  }
}

// Every file (relative path -> bytes) and directory ("path/") under `dir`.
using Tree = std::map<std::string, std::vector<std::uint8_t>>;
Tree snapshot(const fsys::path& dir, bool with_locks = true) {
  Tree t;
  if (!fsys::exists(dir)) return t;
  for (const auto& e : fsys::recursive_directory_iterator(dir)) {
    const std::string rel = fsys::relative(e.path(), dir).string();
    if (!with_locks && e.path().filename() == kLockName) continue;
    if (e.is_directory()) t[rel + "/"] = {};
    else t[rel] = read_all(e.path());
  }
  return t;
}
std::string tree_diff(const Tree& want, const Tree& got) {
  std::string out;
  for (const auto& [k, v] : want)
    if (!got.count(k)) out += " missing " + k;
    else if (got.at(k) != v) out += " differs " + k;
  for (const auto& [k, v] : got)
    if (!want.count(k)) out += " extra " + k;
  return out;
}

enum class Damage { lost_root, truncated, flipped, blocks, mixed };
std::string damage_name(Damage d) {
  switch (d) {
    case Damage::lost_root: return "root deleted";
    case Damage::truncated: return "shards truncated";
    case Damage::flipped: return "shards bit-flipped";
    case Damage::blocks: return "redundancy blocks damaged";
    case Damage::mixed: return "mixed";
  }
  return "?";
}

void flip(const fsys::path& p, std::uint64_t at) {
  auto b = read_all(p);
  REQUIRE(at < b.size());
  b[static_cast<std::size_t>(at)] ^= 0x10;
  write_all(p, b);
}

// The files a damage made bad: ranks and indices of manifest blocks.
struct Bad {
  std::set<int> ranks;
  std::set<std::size_t> blocks;
  std::set<int> nodes;
};

// Applies `d` to node `n` of the checkpoint `name` under `dir`.
void damage_node(const fsys::path& dir, const Manifest& m, const std::string& name, int n, Damage d, Bad& bad) {
  const NodeLayout& l = *m.nodes;
  const fsys::path root = dir / ("node-" + std::to_string(n));
  const fsys::path ck = root / name;
  bad.nodes.insert(n);
  const auto shards_of = [&] {
    std::vector<int> v;
    for (int r = n * l.ranks_per_node; r < (n + 1) * l.ranks_per_node; ++r) v.push_back(r);
    return v;
  };
  switch (d) {
    case Damage::lost_root:
      fsys::remove_all(root);
      for (int r : shards_of()) bad.ranks.insert(r);
      for (std::size_t i = 0; i < m.redundancy.size(); ++i)
        if (m.redundancy[i].node == n) bad.blocks.insert(i);
      break;
    case Damage::truncated:
      for (int r : shards_of()) {
        const auto& s = m.shards[static_cast<std::size_t>(r)];
        fsys::resize_file(ck / s.path, s.size / 2);
        bad.ranks.insert(r);
      }
      break;
    case Damage::flipped:
      for (int r : shards_of()) {
        const auto& s = m.shards[static_cast<std::size_t>(r)];
        flip(ck / s.path, s.size / 2 + static_cast<std::uint64_t>(r));
        bad.ranks.insert(r);
      }
      break;
    case Damage::blocks: {
      bool first = true;
      for (std::size_t i = 0; i < m.redundancy.size(); ++i) {
        const auto& b = m.redundancy[i];
        if (b.node != n) continue;
        if (first) fsys::resize_file(ck / b.path, b.size - 1);
        else flip(ck / b.path, b.size / 3);
        first = false;
        bad.blocks.insert(i);
      }
      break;
    }
    case Damage::mixed: break;
  }
}

// Every subset of {0..n-1} of exactly `size` elements.
std::vector<std::vector<int>> subsets_of_size(int n, int size) {
  std::vector<std::vector<int>> out;
  for (unsigned mask = 1; mask < (1u << n); ++mask)
    if (std::popcount(mask) == size) {
      std::vector<int> s;
      for (int i = 0; i < n; ++i)
        if (mask & (1u << i)) s.push_back(i);
      out.push_back(s);
    }
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<std::uint64_t> shard_sizes(const Manifest& m) {
  std::vector<std::uint64_t> v;
  for (const auto& sh : m.shards) v.push_back(sh.size);
  return v;
}

// A saved checkpoint across node roots and its pristine files, copied for each damage pattern.
struct Saved {
  TempDir pristine{"ckpt-nodes"};
  NodeLayout l;
  Manifest m;
  std::string name;
  Tree files;  // without the lock files
  std::vector<std::vector<std::uint8_t>> shard_bytes;
  explicit Saved(const NodeLayout& layout, std::uint64_t step = 10) : l(layout) {
    m = save_nodes(posix_file_system(), node_root_paths(pristine.path().string(), l.nodes), l, step);
    name = checkpoint_dir_name(step);
    files = snapshot(pristine.path(), false);
    for (const auto& s : m.shards)
      shard_bytes.push_back(read_all(pristine / ("node-" + std::to_string(l.node_of(s.rank))) / name / s.path));
  }
  std::vector<std::string> roots_in(const fsys::path& dir) const { return node_root_paths(dir.string(), l.nodes); }
  void copy_to(const fsys::path& dir) const { fsys::copy(pristine.path(), dir, fsys::copy_options::recursive); }
};

// Checks the repaired set under `dir` against the pristine one, bit for bit, and that it loads.
void check_whole(const Saved& s, const fsys::path& dir) {
  const auto roots = s.roots_in(dir);
  CHECK_MESSAGE(snapshot(dir, false) == s.files, "after repair:" << tree_diff(s.files, snapshot(dir, false)));
  const NodeCheckpointHealth h = check_node_checkpoint(posix_file_system(), roots, s.name, Verify::full);
  CHECK(h.healthy());
  CHECK(h.recoverable());
  CHECK(h.min_margin() == tolerated_node_losses(s.l.scheme));
  RepairReport again;
  const CheckpointReader reader = test::repair_then_open_latest(posix_file_system(), roots, s.l.world_size(), Verify::full, &again);
  CHECK(again.nothing_to_do());
  reader.verify(Verify::full);
  for (int r = 0; r < s.l.world_size(); ++r) {
    const auto shard = reader.load_shard(r, Verify::full);
    const auto& want = s.shard_bytes[static_cast<std::size_t>(r)];
    CHECK(std::equal(shard.file_bytes().begin(), shard.file_bytes().end(), reinterpret_cast<const std::byte*>(want.data()),
                     reinterpret_cast<const std::byte*>(want.data() + want.size())));
  }
}

// Checks that the report says what was rebuilt from what, one line per bad file.
void check_report(const Saved& s, const RepairReport& rep, const Bad& bad) {
  const NodeLayout& l = s.l;
  CHECK(rep.name == s.name);
  CHECK(rep.lines.size() == bad.ranks.size() + bad.blocks.size());
  CHECK(std::set<int>(rep.rebuilt_ranks.begin(), rep.rebuilt_ranks.end()) == bad.ranks);
  CHECK(rep.rebuilt_ranks.size() == bad.ranks.size());
  const auto stripes = rs_stripes(l, [&] {
    std::vector<std::uint64_t> v;
    for (const auto& sh : s.m.shards) v.push_back(sh.size);
    return v;
  }());
  for (int r : bad.ranks) {
    const int n = l.node_of(r);
    const std::string head = "rank " + std::to_string(r) + " (node-" + std::to_string(n) + "/" + s.name + "/" +
                             s.m.shards[static_cast<std::size_t>(r)].path + ") rebuilt from ";
    const auto it = std::find_if(rep.lines.begin(), rep.lines.end(), [&](const std::string& x) { return x.starts_with(head); });
    REQUIRE_MESSAGE(it != rep.lines.end(), "no report line for rank " << r);
    if (l.scheme.kind == RedundancyScheme::Kind::reed_solomon) {
      CHECK(contains(*it, "rebuilt from parity: "));
      // Each stripe holding a piece of the node, with the members the decoding could use.
      for (const auto& st : stripes)
        for (const auto& p : st.data) {
          if (p.node != n) continue;
          std::string data, parity;
          for (const auto& q : st.data) {
            bool good = true;
            for (int x = q.node * l.ranks_per_node; x < (q.node + 1) * l.ranks_per_node; ++x) good &= !bad.ranks.count(x);
            if (good) data += (data.empty() ? "" : ", ") + std::to_string(q.node);
          }
          for (std::size_t i = 0; i < s.m.redundancy.size(); ++i)
            if (s.m.redundancy[i].stripe == st.index && !bad.blocks.count(i))
              parity += (parity.empty() ? "" : ", ") + std::to_string(s.m.redundancy[i].node);
          const std::string want = "stripe " + std::to_string(st.index) + " (" + (data.empty() ? "" : "data of nodes " + data + ", ") +
                                   "parity on nodes " + parity + ")";
          CHECK_MESSAGE(contains(*it, want), *it << " lacks " << want);
        }
    } else {
      // From a copy on a node that holds a good one.
      bool named = false;
      for (int c : replica_nodes(l, n)) {
        std::size_t bi = 0;
        while (bi < s.m.redundancy.size() && !(s.m.redundancy[bi].rank == r && s.m.redundancy[bi].node == c)) ++bi;
        if (!bad.blocks.count(bi) && *it == head + "its replica on node " + std::to_string(c)) named = true;
      }
      CHECK_MESSAGE(named, *it);
    }
  }
  for (std::size_t i : bad.blocks) {
    const auto& b = s.m.redundancy[i];
    const std::string head = b.kind == RedundancyBlock::Kind::parity
                                 ? "parity " + std::to_string(b.index) + " of stripe " + std::to_string(b.stripe) + " on node " +
                                       std::to_string(b.node) + " re-encoded from the stripe's data"
                                 : "replica of rank " + std::to_string(b.rank) + " on node " + std::to_string(b.node) + " rewritten from ";
    CHECK_MESSAGE(std::any_of(rep.lines.begin(), rep.lines.end(), [&](const std::string& x) { return x.starts_with(head); }),
                  "no report line '" << head << "'");
  }
}

// Damages a copy of `s` on every node of `nodes` by `d`, checks the health, repairs, checks.
void lose_and_repair(const Saved& s, const std::vector<int>& nodes, Damage d, int pattern) {
  TempDir work("ckpt-nodes-work");
  const fsys::path dir = work / "set";
  s.copy_to(dir);
  Bad bad;
  for (std::size_t j = 0; j < nodes.size(); ++j) {
    const Damage dj = d == Damage::mixed ? static_cast<Damage>((static_cast<std::size_t>(pattern) + j) % 4) : d;
    damage_node(dir, s.m, s.name, nodes[j], dj, bad);
  }
  const auto roots = s.roots_in(dir);
  const NodeCheckpointHealth h = check_node_checkpoint(posix_file_system(), roots, s.name, Verify::fast);
  CHECK(std::set<int>(h.bad_ranks.begin(), h.bad_ranks.end()) == bad.ranks);
  std::set<std::size_t> bad_blocks;
  for (std::size_t i = 0; i < h.blocks.size(); ++i)
    if (!h.blocks[i].ok) bad_blocks.insert(i);
  CHECK(bad_blocks == bad.blocks);
  CHECK_FALSE(h.healthy());
  CHECK(h.recoverable());
  CHECK(h.min_margin() >= tolerated_node_losses(s.l.scheme) - static_cast<int>(nodes.size()));
  CHECK(h.min_margin() >= 0);
  // The margins, counted here from what was damaged: rs, per stripe, M minus its bad pieces
  // and parity blocks (a whole node's shards are damaged, so all its pieces); replicate, per
  // rank, its good copies minus one.
  std::vector<int> margins;
  if (s.l.scheme.kind == RedundancyScheme::Kind::reed_solomon) {
    for (const auto& st : rs_stripes(s.l, shard_sizes(s.m))) {
      int bad_members = 0;
      for (const auto& p : st.data) bad_members += bad.ranks.count(p.node * s.l.ranks_per_node) ? 1 : 0;
      for (std::size_t i = 0; i < s.m.redundancy.size(); ++i) bad_members += s.m.redundancy[i].stripe == st.index && bad.blocks.count(i);
      margins.push_back(s.l.scheme.m - bad_members);
    }
  } else {
    for (int r = 0; r < s.l.world_size(); ++r) {
      int good = bad.ranks.count(r) ? 0 : 1;
      for (std::size_t i = 0; i < s.m.redundancy.size(); ++i) good += s.m.redundancy[i].rank == r && !bad.blocks.count(i);
      margins.push_back(good - 1);
    }
  }
  CHECK(h.margins == margins);
  RepairReport rep;
  try {
    rep = repair_node_checkpoint(posix_file_system(), roots, s.name, Verify::fast);
  } catch (const Error& e) {
    FAIL_CHECK("repair failed: " << std::string(e.what()));
    return;
  }
  check_report(s, rep, bad);
  check_whole(s, dir);
}

std::string describe(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return "{" + out + "}";
}

void every_tolerated_loss(const NodeLayout& l) {
  LogCapture quiet;
  const Saved s(l);
  const int tolerated = tolerated_node_losses(l.scheme);
  int pattern = 0;
  for (int lost = 1; lost <= tolerated; ++lost)
    for (const auto& nodes : subsets_of_size(l.nodes, lost))
      for (const Damage d : {Damage::lost_root, Damage::truncated, Damage::flipped, Damage::blocks, Damage::mixed}) {
        INFO(redundancy_name(l.scheme) << " over " << l.nodes << " nodes x " << l.ranks_per_node << " ranks, nodes " << describe(nodes)
                                       << ": " << damage_name(d));
        lose_and_repair(s, nodes, d, pattern++);
      }
  CHECK(pattern > 0);
}

}  // namespace

TEST_CASE("rs:3+1 over 4 nodes rebuilds any one lost node bit-exactly from parity") { every_tolerated_loss(layout_of(4, 1, "rs:3+1")); }

TEST_CASE("rs:2+2 over 4 nodes rebuilds any two lost nodes bit-exactly") { every_tolerated_loss(layout_of(4, 1, "rs:2+2")); }

TEST_CASE("rs:3+2 over 5 nodes rebuilds any two lost nodes bit-exactly") { every_tolerated_loss(layout_of(5, 1, "rs:3+2")); }

TEST_CASE("rs:2+2 over 4 nodes of 2 ranks each rebuilds any two lost nodes bit-exactly") { every_tolerated_loss(layout_of(4, 2, "rs:2+2")); }

TEST_CASE("rs:2+1 over 6 nodes of 2 ranks each rebuilds any one lost node bit-exactly") { every_tolerated_loss(layout_of(6, 2, "rs:2+1")); }

TEST_CASE("replicate:2 over 3 nodes rebuilds any one lost node from its copies") { every_tolerated_loss(layout_of(3, 1, "replicate:2")); }

TEST_CASE("replicate:3 over 4 nodes rebuilds any two lost nodes from their copies") { every_tolerated_loss(layout_of(4, 1, "replicate:3")); }

TEST_CASE("replicate:3/2 over 5 nodes of 2 ranks each rebuilds any two lost nodes from their copies") {
  every_tolerated_loss(layout_of(5, 2, "replicate:3/2"));
}

TEST_CASE("the resume through the store (repair, then open) rebuilds a lost node before it loads and says what it rebuilt") {
  LogCapture quiet;
  for (const auto& l : {layout_of(4, 1, "rs:3+1"), layout_of(3, 1, "replicate:2")}) {
    INFO(redundancy_name(l.scheme));
    const Saved s(l);
    TempDir work("ckpt-nodes-work");
    const fsys::path dir = work / "set";
    s.copy_to(dir);
    fsys::remove_all(dir / "node-1");
    const auto roots = s.roots_in(dir);
    RepairReport rep;
    const CheckpointReader reader = test::repair_then_open_latest(posix_file_system(), roots, l.world_size(), Verify::full, &rep);
    CHECK(rep.rebuilt_ranks == std::vector<int>{1});
    CHECK_FALSE(rep.nothing_to_do());
    for (int r = 0; r < l.world_size(); ++r) {
      const auto shard = reader.load_shard(r, Verify::full);
      CHECK(shard.file_bytes().size() == s.shard_bytes[static_cast<std::size_t>(r)].size());
    }
    check_whole(s, dir);
    // Opening at a world size the checkpoint was not written at is refused, lost node or
    // not, and the open writes nothing.
    fsys::remove_all(dir / "node-2");
    const Tree before = snapshot(dir);
    const auto store = open_store(dir.string());
    const Error e = expect_error([&] { (void)store->open(s.m.step, l.world_size() + 1); });
    CHECK(e.code() == Errc::world_size_mismatch);
    CHECK(e.expected() == std::to_string(l.world_size() + 1));
    CHECK(e.actual() == std::to_string(l.world_size()));
    CHECK(snapshot(dir) == before);
  }
}

TEST_CASE("partial damage on more nodes than M is rebuilt when no stripe loses more than M members") {
  LogCapture quiet;
  // rs:2+1 over 3 nodes of 2 ranks: each node's first shard lies inside its piece 0. Losing
  // the first shard of nodes 0 and 1 leaves stripe 0 (node 0 piece 0, node 1 piece 1) and
  // stripe 1 (node 1 piece 0, node 2 piece 1) one bad member each.
  const Saved s(layout_of(3, 2, "rs:2+1"));
  const auto stripes = rs_stripes(s.l, [&] {
    std::vector<std::uint64_t> v;
    for (const auto& sh : s.m.shards) v.push_back(sh.size);
    return v;
  }());
  REQUIRE(s.m.shards[0].size <= stripes[0].data[0].length);
  REQUIRE(s.m.shards[2].size <= stripes[1].data[0].length);
  TempDir work("ckpt-nodes-work");
  const fsys::path dir = work / "set";
  s.copy_to(dir);
  flip(dir / "node-0" / s.name / s.m.shards[0].path, 5000);
  fsys::remove(dir / "node-1" / s.name / s.m.shards[2].path);
  const auto roots = s.roots_in(dir);
  const NodeCheckpointHealth h = check_node_checkpoint(posix_file_system(), roots, s.name);
  CHECK(h.bad_ranks == std::vector<int>{0, 2});
  CHECK(h.recoverable());
  CHECK(h.margins == std::vector<int>{0, 0, 1});
  RepairReport rep;
  REQUIRE_NOTHROW(rep = repair_node_checkpoint(posix_file_system(), roots, s.name));
  CHECK(rep.rebuilt_ranks == std::vector<int>{0, 2});
  check_whole(s, dir);
}

TEST_CASE("one lost node more than rs:K+M tolerates is refused naming the lost ranks and the limit, and nothing is written") {
  LogCapture quiet;
  int refused = 0, rebuilt_anyway = 0;
  for (const auto& l : {layout_of(4, 1, "rs:3+1"), layout_of(4, 1, "rs:2+2"), layout_of(5, 1, "rs:3+2"), layout_of(4, 2, "rs:2+2")}) {
    const Saved s(l);
    for (const auto& nodes : subsets_of_size(l.nodes, l.scheme.m + 1))
      for (const Damage d : {Damage::lost_root, Damage::truncated, Damage::flipped}) {
        INFO(redundancy_name(l.scheme) << " over " << l.nodes << " x " << l.ranks_per_node << ", nodes " << describe(nodes) << ": "
                                       << damage_name(d));
        TempDir work("ckpt-nodes-work");
        const fsys::path dir = work / "set";
        s.copy_to(dir);
        Bad bad;
        for (int n : nodes) damage_node(dir, s.m, s.name, n, d, bad);
        const auto roots = s.roots_in(dir);
        const Tree before = snapshot(dir);
        // Lost: the bad shards of a stripe with more than M bad members (its K data pieces
        // and M parity blocks; K + M = nodes, every stripe spans every node).
        std::set<int> lost;
        for (const auto& st : rs_stripes(l, shard_sizes(s.m))) {
          int bad_members = 0;
          for (const auto& p : st.data) bad_members += bad.nodes.count(p.node) && d != Damage::blocks;
          for (std::size_t i = 0; i < s.m.redundancy.size(); ++i) bad_members += s.m.redundancy[i].stripe == st.index && bad.blocks.count(i);
          if (bad_members > l.scheme.m)
            for (const auto& p : st.data)
              for (int r = p.node * l.ranks_per_node; r < (p.node + 1) * l.ranks_per_node; ++r)
                if (bad.ranks.count(r)) lost.insert(r);
        }
        // Deleted roots take the parity with them: nothing survives M + 1 of them.
        if (d == Damage::lost_root) CHECK(lost == bad.ranks);
        const NodeCheckpointHealth h = check_node_checkpoint(posix_file_system(), roots, s.name);
        CHECK(std::set<int>(h.lost_ranks.begin(), h.lost_ranks.end()) == lost);
        if (lost.empty()) {
          // Shards lost on M + 1 nodes with the parity intact: each stripe still has K good members.
          CHECK(h.recoverable());
          const RepairReport rep = repair_node_checkpoint(posix_file_system(), roots, s.name);
          CHECK(std::set<int>(rep.rebuilt_ranks.begin(), rep.rebuilt_ranks.end()) == bad.ranks);
          check_whole(s, dir);
          ++rebuilt_anyway;
          continue;
        }
        CHECK_FALSE(h.recoverable());
        CHECK(h.min_margin() < 0);
        const Error e = expect_error([&] { repair_node_checkpoint(posix_file_system(), roots, s.name); });
        CHECK(e.code() == Errc::missing_shard);
        CHECK(e.file() == join_path(roots[0], s.name));
        for (int r : lost) CHECK_MESSAGE(contains(e.detail(), "rank " + std::to_string(r) + " (node " + std::to_string(l.node_of(r)) + ")"), e.detail());
        CHECK(contains(e.detail(), redundancy_name(l.scheme)));
        ++refused;
        CHECK(e.expected() == "at most " + std::to_string(l.scheme.m) + " lost node(s) per stripe");
        CHECK(snapshot(dir) == before);
        // The resume through the store takes the node roots' locks (their records change)
        // and writes nothing else.
        const Tree unlocked = snapshot(dir, false);
        const Error f = expect_error([&] { test::repair_then_open_latest(posix_file_system(), roots); });
        CHECK(f.code() == Errc::missing_shard);
        CHECK_MESSAGE(snapshot(dir, false) == unlocked, tree_diff(unlocked, snapshot(dir, false)));
      }
  }
  CHECK(refused > 0);
  CHECK(rebuilt_anyway > 0);
}

TEST_CASE("losing every copy of a shard under replicate:F is refused naming it, and nothing is written") {
  LogCapture quiet;
  for (const auto& l : {layout_of(3, 1, "replicate:2"), layout_of(4, 1, "replicate:3"), layout_of(5, 2, "replicate:3/2")}) {
    const Saved s(l);
    for (const auto& nodes : subsets_of_size(l.nodes, l.scheme.copies)) {
      INFO(redundancy_name(l.scheme) << " over " << l.nodes << ", nodes " << describe(nodes));
      TempDir work("ckpt-nodes-work");
      const fsys::path dir = work / "set";
      s.copy_to(dir);
      Bad bad;
      for (int n : nodes) damage_node(dir, s.m, s.name, n, Damage::lost_root, bad);
      // A rank is lost when its node and every node holding a copy are gone.
      std::set<int> lost;
      for (int r : bad.ranks) {
        bool any = false;
        for (int c : replica_nodes(l, l.node_of(r))) any |= !bad.nodes.count(c);
        if (!any) lost.insert(r);
      }
      const auto roots = s.roots_in(dir);
      const NodeCheckpointHealth h = check_node_checkpoint(posix_file_system(), roots, s.name);
      CHECK(std::set<int>(h.lost_ranks.begin(), h.lost_ranks.end()) == lost);
      if (lost.empty()) {
        REQUIRE_NOTHROW(repair_node_checkpoint(posix_file_system(), roots, s.name));
        check_whole(s, dir);
        continue;
      }
      const Tree before = snapshot(dir);
      const Error e = expect_error([&] { repair_node_checkpoint(posix_file_system(), roots, s.name); });
      CHECK(e.code() == Errc::missing_shard);
      for (int r : lost) CHECK_MESSAGE(contains(e.detail(), "rank " + std::to_string(r) + " (node " + std::to_string(l.node_of(r)) + ")"), e.detail());
      CHECK(e.expected() == "at most " + std::to_string(l.scheme.copies - 1) + " lost node(s) per shard");
      CHECK(snapshot(dir) == before);
    }
  }
}

TEST_CASE("a crash or power loss at any step of a save across nodes leaves a checkpoint that loads, and prepare_node_roots settles every node") {
  LogCapture quiet;
  const NodeLayout l = layout_of(4, 1, "rs:3+1");
  TempDir base("ckpt-nodes-crash");
  const fsys::path pristine = base / "pristine";
  save_nodes(posix_file_system(), node_root_paths(pristine.string(), l.nodes), l, 10);
  // The mutations of the second save, counted.
  std::uint64_t total = 0;
  {
    const fsys::path probe = base / "probe";
    fsys::copy(pristine, probe, fsys::copy_options::recursive);
    testing::FaultInjectionFileSystem counter(posix_file_system());
    save_nodes(counter, node_root_paths(probe.string(), l.nodes), l, 20);
    total = counter.mutations();
  }
  REQUIRE(total > 20);
  bool saw_partial_renames = false, saw_partial_latest = false;
  for (const bool power : {false, true})
    for (std::uint64_t k = 0; k <= total; ++k) {
      INFO((power ? "power loss" : "crash") << " after " << k << " of " << total << " mutations");
      const fsys::path dir = base / ("run-" + std::to_string(power) + "-" + std::to_string(k));
      fsys::copy(pristine, dir, fsys::copy_options::recursive);
      const auto roots = node_root_paths(dir.string(), l.nodes);
      {
        testing::FaultInjectionFileSystem fi(posix_file_system());
        fi.crash_after(k);
        try {
          save_nodes(fi, roots, l, 20);
        } catch (const Error&) {
        }
        if (power) fi.simulate_power_loss();
      }
      // What the crash left: which nodes hold step-20 and which name it.
      int renamed = 0, named = 0;
      for (const auto& r : roots) {
        renamed += fsys::is_directory(fsys::path(r) / checkpoint_dir_name(20));
        named += read_latest(posix_file_system(), r) == checkpoint_dir_name(20);
      }
      if (!power && renamed > 0 && renamed < l.nodes && named == 0) saw_partial_renames = true;
      if (!power && named > 0 && named < l.nodes) saw_partial_latest = true;
      // Step 20 is the live one once a node names it, or once it is renamed on every node
      // (all of its files were durable before the first rename).
      const std::uint64_t want = named > 0 || renamed == l.nodes ? 20 : 10;
      {
        std::vector<RootLock> locks;
        for (const auto& r : roots) locks.emplace_back(posix_file_system(), r);
        LogCapture log;
        const auto removed = prepare_node_roots(posix_file_system(), locks);
        for (const auto& x : removed) CHECK_MESSAGE(!contains(x, checkpoint_dir_name(want)), x);
        if (named > 0 && named < l.nodes) CHECK(log.matching({"latest moved forward to " + checkpoint_dir_name(20)}).size() ==
                                                static_cast<std::size_t>(l.nodes - named));
      }
      // Every node names the same step now, holds no temporaries and no uncommitted step.
      for (const auto& r : roots) {
        CHECK(read_latest(posix_file_system(), r) == checkpoint_dir_name(want));
        for (const auto& e : fsys::directory_iterator(r)) {
          const std::string nm = e.path().filename().string();
          CHECK_MESSAGE(!is_temporary_name(nm), nm);
          if (const auto st = parse_checkpoint_dir_name(nm)) CHECK_MESSAGE(*st <= want, nm);
        }
      }
      const NodeCheckpointHealth h = check_node_checkpoint(posix_file_system(), roots, checkpoint_dir_name(want), Verify::full);
      CHECK(h.healthy());
      if (want == 20) {
        // The previous checkpoint is still whole too.
        CHECK(check_node_checkpoint(posix_file_system(), roots, checkpoint_dir_name(10), Verify::full).healthy());
      }
      const CheckpointReader reader = test::repair_then_open_latest(posix_file_system(), roots, l.world_size(), Verify::full);
      CHECK(reader.manifest().step == want);
      reader.verify(Verify::full);
      fsys::remove_all(dir);
    }
  CHECK(saw_partial_renames);
  CHECK(saw_partial_latest);
}

TEST_CASE("prepare_node_roots moves lagging latest pointers forward to a step every node holds and leaves the others") {
  LogCapture quiet;
  const NodeLayout l = layout_of(3, 1, "replicate:2");
  TempDir base("ckpt-nodes-prep");
  const auto roots = node_root_paths((base / "set").string(), l.nodes);
  save_nodes(posix_file_system(), roots, l, 10);
  save_nodes(posix_file_system(), roots, l, 20);
  // Nodes 1 and 2 back at step 10, as a crash between the latest updates leaves them.
  for (int n : {1, 2}) write_latest(posix_file_system(), roots[static_cast<std::size_t>(n)], checkpoint_dir_name(10));
  CHECK(read_latest_nodes(posix_file_system(), roots) == checkpoint_dir_name(20));
  // Without step-20 on node 2 (gone with the node), node 2 stays where it is.
  fsys::remove_all(fsys::path(roots[2]) / checkpoint_dir_name(20));
  {
    std::vector<RootLock> locks;
    for (const auto& r : roots) locks.emplace_back(posix_file_system(), r);
    const auto removed = prepare_node_roots(posix_file_system(), locks);
    CHECK(removed.empty());
  }
  CHECK(read_latest(posix_file_system(), roots[0]) == checkpoint_dir_name(20));
  CHECK(read_latest(posix_file_system(), roots[1]) == checkpoint_dir_name(20));
  CHECK(read_latest(posix_file_system(), roots[2]) == checkpoint_dir_name(10));
  // The repair brings node 2 forward with the step it lost.
  const auto rep = repair_node_checkpoint(posix_file_system(), roots, checkpoint_dir_name(20));
  CHECK(rep.rebuilt_ranks == std::vector<int>{2});
  CHECK(read_latest(posix_file_system(), roots[2]) == checkpoint_dir_name(20));
  CHECK(check_node_checkpoint(posix_file_system(), roots, checkpoint_dir_name(20), Verify::full).healthy());
  // Every file good but node 1 behind: the repair moves it forward and says so; repairing
  // the older step moves nothing back.
  write_latest(posix_file_system(), roots[1], checkpoint_dir_name(10));
  const auto forward = repair_node_checkpoint(posix_file_system(), roots, checkpoint_dir_name(20));
  CHECK(forward.rebuilt_ranks.empty());
  CHECK(forward.lines == std::vector<std::string>{"node 1: latest moved forward to " + checkpoint_dir_name(20)});
  CHECK(read_latest(posix_file_system(), roots[1]) == checkpoint_dir_name(20));
  CHECK(repair_node_checkpoint(posix_file_system(), roots, checkpoint_dir_name(20)).nothing_to_do());
  CHECK(repair_node_checkpoint(posix_file_system(), roots, checkpoint_dir_name(10)).nothing_to_do());
  for (const auto& r : roots) CHECK(read_latest(posix_file_system(), r) == checkpoint_dir_name(20));
}

TEST_CASE("read_latest_nodes takes the newest step any node names and counts a lost node as one without latest") {
  const NodeLayout l = layout_of(3, 1, "rs:2+1");
  TempDir base("ckpt-nodes-latest");
  const auto roots = node_root_paths((base / "set").string(), l.nodes);
  CHECK_FALSE(read_latest_nodes(posix_file_system(), roots).has_value());
  save_nodes(posix_file_system(), roots, l, 10);
  CHECK(read_latest_nodes(posix_file_system(), roots) == checkpoint_dir_name(10));
  fsys::remove_all(roots[0]);
  CHECK(read_latest_nodes(posix_file_system(), roots) == checkpoint_dir_name(10));
  write_all(fsys::path(roots[1]) / "latest", {'x'});
  CHECK(read_latest_nodes(posix_file_system(), roots) == checkpoint_dir_name(10));
  // node-0 is gone: the set is still one (any node-n marks it), of 3 nodes (the manifest says).
  CHECK(is_node_set(posix_file_system(), (base / "set").string()));
  CHECK(count_node_roots(posix_file_system(), (base / "set").string()) == 3);
  fsys::create_directories(roots[0]);
  CHECK(is_node_set(posix_file_system(), (base / "set").string()));
  CHECK(count_node_roots(posix_file_system(), (base / "set").string()) == 3);
  CHECK(count_node_roots(posix_file_system(), roots[1]) == 0);
  // The last node lost: the manifest of the others' latest still counts it.
  write_latest(posix_file_system(), roots[1], checkpoint_dir_name(10));
  fsys::remove_all(roots[2]);
  CHECK(count_node_roots(posix_file_system(), (base / "set").string()) == 3);
}

TEST_CASE("rotate_node_checkpoints keeps the newest K on every node and skips a lost node") {
  LogCapture quiet;
  const NodeLayout l = layout_of(4, 1, "rs:3+1");
  TempDir base("ckpt-nodes-rotate");
  const auto roots = node_root_paths((base / "set").string(), l.nodes);
  for (std::uint64_t step : {10, 20, 30}) save_nodes(posix_file_system(), roots, l, step);
  std::vector<std::string> removed;
  {
    std::vector<RootLock> locks;
    for (const auto& r : roots) locks.emplace_back(posix_file_system(), r);
    removed = rotate_node_checkpoints(posix_file_system(), roots, 2, checkpoint_dir_name(30));
  }
  CHECK(removed == std::vector<std::string>{checkpoint_dir_name(10)});
  for (const auto& r : roots) {
    std::vector<std::string> steps;
    for (const auto& e : fsys::directory_iterator(r))
      if (parse_checkpoint_dir_name(e.path().filename().string())) steps.push_back(e.path().filename().string());
    std::sort(steps.begin(), steps.end());
    CHECK(steps == std::vector<std::string>{checkpoint_dir_name(20), checkpoint_dir_name(30)});
  }
  // With node 3 gone, the others rotate; the step that remains is still rebuildable.
  save_nodes(posix_file_system(), roots, l, 40);
  fsys::remove_all(roots[3]);
  removed = rotate_node_checkpoints(posix_file_system(), roots, 1, checkpoint_dir_name(40));
  std::sort(removed.begin(), removed.end());
  CHECK(removed == std::vector<std::string>{checkpoint_dir_name(20), checkpoint_dir_name(30)});
  for (int n = 0; n < 3; ++n) {
    std::size_t steps = 0;
    for (const auto& e : fsys::directory_iterator(roots[static_cast<std::size_t>(n)])) steps += parse_checkpoint_dir_name(e.path().filename().string()).has_value();
    CHECK(steps == 1);
  }
  CHECK_FALSE(fsys::exists(roots[3]));
  const auto rep = repair_node_checkpoint(posix_file_system(), roots, checkpoint_dir_name(40));
  CHECK(rep.rebuilt_ranks == std::vector<int>{3});
  CHECK(check_node_checkpoint(posix_file_system(), roots, checkpoint_dir_name(40), Verify::full).healthy());
}

TEST_CASE("the reader opening one node's DIR/node-n/step-N finds every shard on its sibling node roots") {
  const Saved s(layout_of(4, 2, "rs:2+2"));
  const fsys::path dir = s.pristine.path();
  const CheckpointReader reader = CheckpointReader::open(posix_file_system(), (dir / "node-2" / s.name).string(), 8);
  CHECK(reader.manifest().nodes == s.l);
  for (int r = 0; r < 8; ++r) {
    CHECK(reader.shard_path(r) == join_path((dir / ("node-" + std::to_string(r / 2)) / s.name).string(), s.m.shards[static_cast<std::size_t>(r)].path));
    const auto shard = reader.load_shard(r, Verify::full);
    const auto& want = s.shard_bytes[static_cast<std::size_t>(r)];
    CHECK(std::equal(shard.file_bytes().begin(), shard.file_bytes().end(), reinterpret_cast<const std::byte*>(want.data()),
                     reinterpret_cast<const std::byte*>(want.data() + want.size())));
  }
  reader.verify(Verify::full);
  // open_nodes reads the manifest from the first node that has one that opens.
  TempDir work("ckpt-nodes-work");
  const fsys::path copy = work / "set";
  s.copy_to(copy);
  fsys::remove(copy / "node-0" / s.name / kManifestName);
  write_all(copy / "node-1" / s.name / kManifestName, {'{'});
  std::vector<std::string> dirs;
  for (int n = 0; n < 4; ++n) dirs.push_back((copy / ("node-" + std::to_string(n)) / s.name).string());
  const CheckpointReader r2 = CheckpointReader::open_nodes(posix_file_system(), dirs, 8);
  CHECK(r2.dir() == dirs[2]);
  r2.verify(Verify::full);
  // A shard missing on its node is the checkpoint's problem, named where it should be.
  fsys::remove(copy / "node-3" / s.name / s.m.shards[7].path);
  const Error e = expect_error([&] { CheckpointReader::open_nodes(posix_file_system(), dirs, 8); });
  CHECK(e.code() == Errc::missing_shard);
  CHECK(e.file() == join_path(dirs[3], s.m.shards[7].path));
  // Fewer node directories than the manifest's nodes.
  std::vector<std::string> pristine_dirs;
  for (int n = 0; n < 4; ++n) pristine_dirs.push_back((dir / ("node-" + std::to_string(n)) / s.name).string());
  const Error f = expect_error([&] { CheckpointReader::open_nodes(posix_file_system(), std::span(pristine_dirs).first(3), 8); });
  CHECK(f.code() == Errc::malformed_manifest);
  CHECK(f.file() == join_path(pristine_dirs[0], kManifestName));
  CHECK(f.detail() == "nodes.count (the node roots the checkpoint spans)");
}

TEST_CASE("an I/O error at any step of a save across nodes leaves either nothing of it or a step every node names after prepare") {
  LogCapture quiet;
  using Op = testing::FaultInjectionFileSystem::Op;
  const NodeLayout l = layout_of(3, 1, "rs:2+1");
  TempDir base("ckpt-nodes-eio");
  const fsys::path pristine = base / "pristine";
  save_nodes(posix_file_system(), node_root_paths(pristine.string(), l.nodes), l, 10);
  std::map<Op, std::uint64_t> counts;
  {
    const fsys::path probe = base / "probe";
    fsys::copy(pristine, probe, fsys::copy_options::recursive);
    testing::FaultInjectionFileSystem counter(posix_file_system());
    save_nodes(counter, node_root_paths(probe.string(), l.nodes), l, 20);
    for (Op op : {Op::create, Op::write, Op::sync, Op::close, Op::create_dir, Op::sync_dir, Op::rename}) counts[op] = counter.count(op);
  }
  int failed_clean = 0, failed_committed = 0;
  for (const auto& [op, count] : counts)
    for (std::uint64_t n = 0; n < count; ++n) {
      INFO("op " << static_cast<int>(op) << " number " << n << " of " << count << " fails with EIO");
      const fsys::path dir = base / "run";
      fsys::remove_all(dir);
      fsys::copy(pristine, dir, fsys::copy_options::recursive);
      const auto roots = node_root_paths(dir.string(), l.nodes);
      testing::FaultInjectionFileSystem fi(posix_file_system());
      fi.fail_nth(op, n, EIO);
      const Error e = expect_error([&] { save_nodes(fi, roots, l, 20); });
      CHECK(e.code() == Errc::io_error);
      int named = 0;
      for (const auto& r : roots) named += read_latest(posix_file_system(), r) == checkpoint_dir_name(20);
      if (named == 0) {
        // A failed save leaves nothing behind: no step-20, no temporaries, step 10 whole.
        ++failed_clean;
        for (const auto& r : roots)
          for (const auto& x : fsys::directory_iterator(r)) {
            const std::string nm = x.path().filename().string();
            CHECK_MESSAGE((nm == ".lock" || nm == "latest" || nm == checkpoint_dir_name(10)), nm);
          }
      } else {
        ++failed_committed;
        std::vector<RootLock> locks;
        for (const auto& r : roots) locks.emplace_back(posix_file_system(), r);
        prepare_node_roots(posix_file_system(), locks);
        for (const auto& r : roots) CHECK(read_latest(posix_file_system(), r) == checkpoint_dir_name(20));
      }
      const std::string want = checkpoint_dir_name(named > 0 ? 20 : 10);
      CHECK(check_node_checkpoint(posix_file_system(), roots, want, Verify::full).healthy());
      CHECK(test::repair_then_open_latest(posix_file_system(), roots, l.world_size(), Verify::full).manifest().step == (named > 0 ? 20u : 10u));
    }
  CHECK(failed_clean > 0);
  CHECK(failed_committed > 0);
}

TEST_CASE("a repair cut by an I/O error leaves no temporaries, changes no good file, and the next repair completes it") {
  LogCapture quiet;
  using Op = testing::FaultInjectionFileSystem::Op;
  for (const auto& l : {layout_of(4, 1, "rs:2+2"), layout_of(4, 1, "replicate:3")}) {
    const Saved s(l);
    // Node 1 lost, node 2's shard flipped and node 3's blocks damaged: every kind of target.
    const auto damage = [&](const fsys::path& dir) {
      Bad bad;
      damage_node(dir, s.m, s.name, 1, Damage::lost_root, bad);
      damage_node(dir, s.m, s.name, 2, Damage::flipped, bad);
      return bad;
    };
    std::map<Op, std::uint64_t> counts;
    {
      TempDir probe("ckpt-nodes-work");
      s.copy_to(probe / "set");
      damage(probe / "set");
      testing::FaultInjectionFileSystem counter(posix_file_system());
      repair_node_checkpoint(counter, s.roots_in(probe / "set"), s.name);
      for (Op op : {Op::create, Op::write, Op::sync, Op::close, Op::create_dir, Op::sync_dir, Op::rename}) counts[op] = counter.count(op);
    }
    for (const auto& [op, count] : counts)
      for (std::uint64_t n = 0; n < count; ++n) {
        INFO(redundancy_name(l.scheme) << ": op " << static_cast<int>(op) << " number " << n << " of " << count << " fails with EIO");
        TempDir work("ckpt-nodes-work");
        const fsys::path dir = work / "set";
        s.copy_to(dir);
        damage(dir);
        const Tree before = snapshot(dir);
        const auto roots = s.roots_in(dir);
        testing::FaultInjectionFileSystem fi(posix_file_system());
        fi.fail_nth(op, n, EIO);
        const Error e = expect_error([&] { repair_node_checkpoint(fi, roots, s.name); });
        CHECK(e.code() == Errc::io_error);
        // Every file now there is either as it was or as the pristine checkpoint has it.
        for (const auto& [path, bytes] : snapshot(dir)) {
          CHECK_MESSAGE(!contains(path, "/.tmp-"), path);
          CHECK_MESSAGE(!fsys::path(path).filename().string().starts_with(".tmp-"), path);
          if (path.ends_with("/") || path.ends_with(std::string(kLockName))) continue;
          const bool as_before = before.count(path) && before.at(path) == bytes;
          const bool as_pristine = s.files.count(path) && s.files.at(path) == bytes;
          CHECK_MESSAGE((as_before || as_pristine), path);
        }
        REQUIRE_NOTHROW(repair_node_checkpoint(posix_file_system(), roots, s.name));
        check_whole(s, dir);
      }
  }
}

TEST_CASE("a repair is durable: a power loss right after it keeps every rebuilt file, a recreated node root included") {
  LogCapture quiet;
  for (const auto& l : {layout_of(4, 1, "rs:2+2"), layout_of(4, 1, "replicate:3")}) {
    INFO(redundancy_name(l.scheme));
    const Saved s(l);
    TempDir work("ckpt-nodes-work");
    const fsys::path dir = work / "set";
    s.copy_to(dir);
    // A lost root (recreated) and a damaged shard (replaced in place).
    Bad bad;
    damage_node(dir, s.m, s.name, 1, Damage::lost_root, bad);
    damage_node(dir, s.m, s.name, 3, Damage::flipped, bad);
    const auto roots = s.roots_in(dir);
    {
      testing::FaultInjectionFileSystem fi(posix_file_system());
      const auto rep = repair_node_checkpoint(fi, roots, s.name);
      CHECK(rep.rebuilt_ranks == std::vector<int>{1, 3});
      const auto undone = fi.simulate_power_loss();
      for (const auto& u : undone) MESSAGE("undone by the power loss: " << u);
      CHECK(undone.empty());
    }
    check_whole(s, dir);
  }
}

TEST_CASE("health and repair read the manifest most nodes hold, report a bad copy, and restore it as those bytes") {
  LogCapture quiet;
  const Saved s(layout_of(4, 1, "rs:2+2"));
  TempDir work("ckpt-nodes-work");
  const fsys::path dir = work / "set";
  s.copy_to(dir);
  const std::string manifest_rel = "/" + s.name + "/" + std::string(kManifestName);
  write_all(dir / "node-0" / s.name / kManifestName, {'{', '"'});
  Bad bad;
  damage_node(dir, s.m, s.name, 1, Damage::lost_root, bad);
  const auto roots = s.roots_in(dir);
  const NodeCheckpointHealth h = check_node_checkpoint(posix_file_system(), roots, s.name);
  CHECK(h.bad_ranks == std::vector<int>{1});
  CHECK(encode_manifest(h.manifest) == encode_manifest(s.m));
  const auto& pristine = s.files.at("node-2" + manifest_rel);
  CHECK(std::string(pristine.begin(), pristine.end()) == h.manifest_bytes);
  REQUIRE(h.manifests.size() == 4);
  CHECK_FALSE(h.manifests[0].ok);
  CHECK_MESSAGE(contains(h.manifests[0].error, "other bytes"), h.manifests[0].error);
  CHECK_FALSE(h.manifests[1].ok);
  CHECK(h.manifests[2].ok);
  CHECK(h.manifests[3].ok);
  const auto rep = repair_node_checkpoint(posix_file_system(), roots, s.name);
  CHECK(rep.rebuilt_ranks == std::vector<int>{1});
  CHECK(std::any_of(rep.lines.begin(), rep.lines.end(), [](const std::string& l) { return contains(l, "node 0: manifest.json restored"); }));
  // Both copies are the same bytes as before, the damaged one and the lost node's.
  for (const char* node : {"node-0", "node-1"}) CHECK(read_all(dir / node / s.name / kManifestName) == s.files.at(node + manifest_rel));
  check_whole(s, dir);
  // No node with a manifest that opens and some missing: not_found naming every node's copy.
  write_all(dir / "node-0" / s.name / kManifestName, {'{', '"'});
  for (int n : {1, 2, 3}) fsys::remove(dir / ("node-" + std::to_string(n)) / s.name / kManifestName);
  const Error e = expect_error([&] { check_node_checkpoint(posix_file_system(), roots, s.name); });
  CHECK(e.code() == Errc::not_found);
  for (int n = 0; n < 4; ++n) CHECK_MESSAGE(contains(e.actual(), join_path(join_path(roots[static_cast<std::size_t>(n)], s.name), std::string(kManifestName))), e.actual());
  const Error f = expect_error([&] { repair_node_checkpoint(posix_file_system(), roots, s.name); });
  CHECK(f.code() == Errc::not_found);
  // Every copy there and none that opens: the first copy's own error.
  for (int n = 0; n < 4; ++n) write_all(dir / ("node-" + std::to_string(n)) / s.name / kManifestName, {'{', '"'});
  const Error g = expect_error([&] { check_node_checkpoint(posix_file_system(), roots, s.name); });
  CHECK(g.code() == Errc::malformed_manifest);
  CHECK(g.file() == join_path(join_path(roots[0], s.name), std::string(kManifestName)));
}

TEST_CASE("a copy of the manifest missing, emptied or with other bytes on one node is found by the health check and restored by repair") {
  LogCapture quiet;
  const Saved s(layout_of(3, 1, "replicate:2"));
  const std::string manifest_rel = "/" + s.name + "/" + std::string(kManifestName);
  const auto& pristine = s.files.at("node-0" + manifest_rel);
  // Other bytes that decode as the same manifest: what a repair that re-encoded the decoded
  // manifest could leave (a re-encoded double need not be the same text).
  std::vector<std::uint8_t> spaced = pristine;
  spaced.push_back(' ');
  for (const auto& [what, damage] : std::vector<std::pair<std::string, std::function<void(const fsys::path&)>>>{
           {"missing", [](const fsys::path& p) { fsys::remove(p); }},
           {"emptied", [](const fsys::path& p) { write_all(p, {}); }},
           {"other bytes", [&](const fsys::path& p) { write_all(p, spaced); }}}) {
    INFO(what);
    TempDir work("ckpt-nodes-work");
    const fsys::path dir = work / "set";
    s.copy_to(dir);
    const auto roots = s.roots_in(dir);
    damage(dir / "node-1" / s.name / kManifestName);
    // Reading takes the copy most nodes hold and writes nothing.
    const Tree before = snapshot(dir);
    std::vector<std::string> dirs;
    for (const auto& r : roots) dirs.push_back(join_path(r, s.name));
    const NodeManifest nm = read_node_manifest(posix_file_system(), dirs, /*with_bytes=*/true);
    CHECK(nm.node == 0);
    CHECK(nm.bytes == std::string(pristine.begin(), pristine.end()));
    CHECK_FALSE(nm.problems[0]);
    REQUIRE(nm.problems[1]);
    CHECK(contains(nm.problems[1]->what(), "node-1"));
    CHECK_FALSE(nm.problems[2]);
    const NodeCheckpointHealth h = check_node_checkpoint(posix_file_system(), roots, s.name, Verify::full);
    CHECK_FALSE(h.healthy());
    CHECK(h.recoverable());
    CHECK(h.bad_ranks.empty());
    REQUIRE(h.bad_files().size() == 1);
    CHECK(h.bad_files()[0]->node == 1);
    CHECK(h.bad_files()[0]->what == "manifest copy");
    CHECK(snapshot(dir) == before);
    // The repair restores it as the other nodes' bytes; a second repair has nothing to do.
    const auto rep = repair_node_checkpoint(posix_file_system(), roots, s.name);
    REQUIRE(rep.lines.size() == 1);
    CHECK_MESSAGE(contains(rep.lines[0], "node 1: manifest.json restored"), rep.lines[0]);
    CHECK(read_all(dir / "node-1" / s.name / kManifestName) == pristine);
    CHECK(repair_node_checkpoint(posix_file_system(), roots, s.name).nothing_to_do());
    check_whole(s, dir);
  }
}

TEST_CASE("the manifest of a node set is the bytes most nodes hold, not the first node's") {
  LogCapture quiet;
  const Saved s(layout_of(3, 1, "replicate:2"));
  TempDir work("ckpt-nodes-work");
  const fsys::path dir = work / "set";
  s.copy_to(dir);
  // Node 0 holds a manifest that decodes and describes a checkpoint across 3 nodes, but other
  // bytes (one tensor's metadata edited); nodes 1 and 2 agree.
  Manifest edited = s.m;
  json_of(edited.shards[0].metadata)["edited"] = "yes";
  const std::string text = encode_manifest(edited);
  write_all(dir / "node-0" / s.name / kManifestName, std::vector<std::uint8_t>(text.begin(), text.end()));
  const auto roots = s.roots_in(dir);
  std::vector<std::string> dirs;
  for (const auto& r : roots) dirs.push_back(join_path(r, s.name));
  const NodeManifest nm = read_node_manifest(posix_file_system(), dirs);
  CHECK(nm.node == 1);
  CHECK(json_of(nm.manifest->shards[0].metadata).count("edited") == 0);
  REQUIRE(nm.problems[0]);
  CHECK_MESSAGE(contains(nm.problems[0]->what(), "other bytes"), nm.problems[0]->what());
  CHECK(nm.problems[0]->code() == Errc::checksum_mismatch);
  // The reader opens the same manifest, through the node set and through node 0's directory.
  CHECK(json_of(CheckpointReader::open_nodes(posix_file_system(), dirs).manifest().shards[0].metadata).count("edited") == 0);
  CHECK(json_of(CheckpointReader::open(posix_file_system(), dirs[0]).manifest().shards[0].metadata).count("edited") == 0);
}

TEST_CASE("a killed repair's temporaries are removed by the next writer's or repair's crash cleanup") {
  LogCapture quiet;
  const Saved s(layout_of(3, 1, "rs:2+1"));
  TempDir work("ckpt-nodes-work");
  const fsys::path dir = work / "set";
  s.copy_to(dir);
  const auto roots = s.roots_in(dir);
  // What a repair killed mid-way leaves: a rebuilt file beside its name, a recreated
  // checkpoint directory not yet renamed into place.
  const std::string file_tmp = temporary_name(s.m.shards[1].path), dir_tmp = temporary_name(s.name);
  write_all(dir / "node-1" / s.name / file_tmp, {1, 2, 3});
  fsys::create_directories(dir / "node-2" / dir_tmp);
  write_all(dir / "node-2" / dir_tmp / s.m.shards[2].path, {4});
  std::vector<RootLock> locks;
  for (const auto& r : roots) locks.emplace_back(posix_file_system(), r);
  const auto removed = prepare_node_roots(posix_file_system(), locks);
  CHECK(std::find(removed.begin(), removed.end(), "node-1/" + s.name + "/" + file_tmp) != removed.end());
  CHECK(std::find(removed.begin(), removed.end(), "node-2/" + dir_tmp) != removed.end());
  CHECK_FALSE(fsys::exists(dir / "node-1" / s.name / file_tmp));
  CHECK_FALSE(fsys::exists(dir / "node-2" / dir_tmp));
  locks.clear();
  check_whole(s, dir);
}

TEST_CASE("opening a node set's latest checkpoint never writes: a lost node is refused until the explicit repair") {
  LogCapture quiet;
  const Saved s(layout_of(3, 1, "rs:2+1"));
  TempDir work("ckpt-nodes-work");
  const fsys::path dir = work / "set";
  s.copy_to(dir);
  fsys::remove_all(dir / "node-1" / s.name);
  const Tree before = snapshot(dir);
  const Error e = expect_error([&] { open_latest(posix_file_system(), dir.string(), {.expected_world_size = s.l.world_size()}); });
  CHECK(e.code() == Errc::missing_shard);
  CHECK(snapshot(dir) == before);
  // With fallback there is no older checkpoint: not found, and still nothing written.
  const Error f = expect_error([&] { open_latest(posix_file_system(), dir.string(), {.fallback = true}); });
  CHECK(f.code() == Errc::not_found);
  CHECK(snapshot(dir) == before);
  // The explicit repair rebuilds it; then it opens.
  const auto rep = repair_node_checkpoint(posix_file_system(), s.roots_in(dir), s.name);
  CHECK(rep.rebuilt_ranks == std::vector<int>{1});
  CHECK_NOTHROW(open_latest(posix_file_system(), dir.string(), {.expected_world_size = s.l.world_size()}).reader.verify(Verify::full));
}

TEST_CASE("begin and commit across nodes refuse what they cannot do and leave no temporaries, and a stopped redundancy write is aborted") {
  LogCapture quiet;
  const NodeLayout l = layout_of(3, 1, "rs:2+1");
  TempDir base("ckpt-nodes-begin");
  const auto roots = node_root_paths((base / "set").string(), l.nodes);
  save_nodes(posix_file_system(), roots, l, 10);
  const Tree before = snapshot(base / "set");
  // Step 10 is committed on every node: begin refuses on node 0, and creates nothing.
  CHECK(expect_error([&] { begin_node_checkpoint(posix_file_system(), roots, 10); }).code() == Errc::invalid_argument);
  CHECK(snapshot(base / "set") == before);
  // A node whose latest is ahead refuses step 20: the temporaries already made on the nodes
  // before it are removed.
  write_latest(posix_file_system(), roots[2], checkpoint_dir_name(30));
  const Error e = expect_error([&] { begin_node_checkpoint(posix_file_system(), roots, 20); });
  CHECK(e.code() == Errc::invalid_argument);
  for (const auto& r : roots)
    for (const auto& x : fsys::directory_iterator(r)) CHECK_MESSAGE(!is_temporary_name(x.path().filename().string()), x.path());
  write_latest(posix_file_system(), roots[2], checkpoint_dir_name(10));
  // commit_node_checkpoint wants the manifest's node count of roots and temporaries.
  const auto temps = begin_node_checkpoint(posix_file_system(), roots, 20);
  Manifest m = decode_manifest(std::string(reinterpret_cast<const char*>(before.at("node-0/" + checkpoint_dir_name(10) + "/manifest.json").data()),
                                           before.at("node-0/" + checkpoint_dir_name(10) + "/manifest.json").size()),
                               "m");
  m.step = 20;
  const Error f = expect_error([&] { commit_node_checkpoint(posix_file_system(), std::span(roots).first(2), std::span(temps).first(2), m); });
  CHECK(f.code() == Errc::invalid_argument);
  Manifest flat = m;
  flat.nodes.reset();
  flat.redundancy.clear();
  CHECK(expect_error([&] { commit_node_checkpoint(posix_file_system(), roots, temps, flat); }).code() == Errc::invalid_argument);
  // A stop request between chunks fails the redundancy write with aborted.
  const std::vector<std::uint8_t> img(3 * kChunk, 7);
  std::vector<std::span<const std::byte>> images(3, std::as_bytes(std::span(img)));
  const std::vector<std::uint64_t> sizes(3, img.size());
  int polls = 0;
  const Error g = expect_error([&] {
    write_redundancy(posix_file_system(), temps, l, sizes, node_bytes_from_images(l, images), kChunk, [&] { return ++polls > 1; });
  });
  CHECK(g.code() == Errc::aborted);
  abort_node_checkpoint(posix_file_system(), roots, temps);
  CHECK(snapshot(base / "set") == before);
  CHECK(read_latest_nodes(posix_file_system(), roots) == checkpoint_dir_name(10));
}

TEST_CASE("unit_reads lists every read a redundancy unit makes, in order, and each block's writer is a rank of the block's node") {
  // What the processes of a multi-process save send to a unit's writer: it must be exactly
  // what the writer reads, or a writer would wait for bytes nobody sends.
  const std::vector<std::pair<NodeLayout, std::vector<std::uint64_t>>> cases = {
      {layout_of(4, 1, "rs:3+1"), {10000, 20000, 5, 0}},
      {layout_of(4, 2, "rs:2+2"), {100, 9000, 3000, 17, 4096, 4097, 1, 12288}},
      {layout_of(5, 2, "rs:3+2"), {5000, 5000, 0, 0, 8191, 1, 2, 3, 4096, 4096}},
      {layout_of(4, 2, "replicate:2"), {100, 9000, 3000, 17, 4096, 4097, 1, 12288}},
      {layout_of(5, 1, "replicate:3/2"), {4096, 0, 10000, 7, 8193}},
  };
  for (const auto& [l, sizes] : cases) {
    INFO(redundancy_name(l.scheme) << " over " << l.nodes << " nodes of " << l.ranks_per_node);
    std::vector<std::vector<std::uint8_t>> images;
    for (std::size_t r = 0; r < sizes.size(); ++r) images.push_back(random_bytes(static_cast<std::size_t>(sizes[r]), 900 + r));
    std::vector<std::span<const std::byte>> spans;
    for (const auto& i : images) spans.push_back(std::as_bytes(std::span(i)));
    const auto want_blocks = [&] {
      TempDir d("ckpt-unit-reads");
      std::vector<std::string> dirs;
      for (int n = 0; n < l.nodes; ++n) dirs.push_back((d.path() / ("n" + std::to_string(n))).string()), fsys::create_directories(dirs.back());
      return write_redundancy(posix_file_system(), dirs, l, sizes, node_bytes_from_images(l, spans), kChunk);
    }();
    const std::size_t units = redundancy_units(l, sizes);
    REQUIRE(units == want_blocks.size());
    for (std::size_t u = 0; u < units; ++u) {
      INFO("unit " << u);
      TempDir d("ckpt-unit-reads");
      std::vector<std::string> dirs;
      for (int n = 0; n < l.nodes; ++n) dirs.push_back((d.path() / ("n" + std::to_string(n))).string()), fsys::create_directories(dirs.back());
      std::vector<RankRead> seen;
      const NodeBytes recorded = node_bytes_by_rank(l, sizes, [&](int r, std::uint64_t at, std::span<std::byte> out) {
        seen.push_back({r, at, out.size()});
        std::memcpy(out.data(), images[static_cast<std::size_t>(r)].data() + at, out.size());
      });
      const auto blocks = write_redundancy_unit(posix_file_system(), dirs, l, sizes, recorded, kChunk, u);
      REQUIRE(blocks.size() == 1);
      CHECK(blocks[0].sha256 == want_blocks[u].sha256);  // one unit alone writes the same block
      CHECK(seen == unit_reads(l, sizes, u, kChunk));
      CHECK((!seen.empty() || want_blocks[u].size == 0));
      const int writer = redundancy_unit_rank(l, sizes, u);
      CHECK(l.node_of(writer) == want_blocks[u].node);
    }
  }
}

TEST_CASE("the ranks of a process opening one node set read each node's copy of the manifest once between them") {
  LogCapture quiet;
  const Saved s(layout_of(3, 1, "replicate:2"));
  // Counts the opens of manifest.json files (a read of a copy, or the decode's open).
  struct Counting final : FileSystemWrapper {
    using FileSystemWrapper::FileSystemWrapper;
    std::atomic<int> manifest_opens{0};
    std::unique_ptr<ReadableFile> open_read(const std::string& path) override {
      if (path.ends_with(kManifestName)) ++manifest_opens;
      return FileSystemWrapper::open_read(path);
    }
  };
  Counting fs(posix_file_system());
  std::vector<std::string> dirs;
  for (const auto& r : s.roots_in(s.pristine.path())) dirs.push_back(join_path(r, s.name));
  (void)CheckpointReader::open_nodes(fs, dirs);
  CHECK(fs.manifest_opens == 4);  // each of the 3 copies read, and the decode's open
  for (int rank = 0; rank < 8; ++rank) (void)CheckpointReader::open_nodes(fs, dirs);
  CHECK(fs.manifest_opens == 4 + 8);  // then only the decode cache's open: no copy read again
}
