// SPDX-License-Identifier: Apache-2.0
// A checkpoint across node roots with redundancy (format/redundancy.hpp, store/nodes/redundancy_io.hpp)
// built from the fuzz input in a MemoryFileSystem, then checked, repaired and opened the way
// `ckpt verify`, `ckpt repair` and a resume do. What is read from outside: the manifest with
// its node layout and redundancy blocks (the blocks' records: kind, node, stripe, members,
// path, size, checksums), the shard files, the parity blocks and replicas, every `latest`.
// Input layout (what tests/fuzz/tools/make_seeds.cpp writes):
//
//   byte 0            bits 0-1: the verify level of the health check and the repair (none,
//                     fast, full, full); bit 2 reseal (rewrite the manifest's size and
//                     checksums of every shard and block to match its file, so the fuzzer gets
//                     past the checksums to the geometry and the decoder); bit 3 open the
//                     latest checkpoint (repairing first) and load every shard; bits 4-6: a
//                     node whose root is lost (0: none, k: node k-1)
//   bytes 1..         the text of manifest.json (written on every node), up to the first
//   "\n@@file@@ node-N/NAME\n" then the bytes of NAME in node N's checkpoint directory,
//                     repeated (node-N/manifest.json replaces that node's copy)
//
// The roots are /fz/set/node-0.. (as many as the manifest's nodes.count says, 1..8, else 3),
// the checkpoint is step-0000000020, and every node's `latest` names it. Properties: every call
// either succeeds or throws a ckpt::Error naming a file under /fz/; a repair refused because
// too much is lost (missing_shard) writes nothing; a repair that succeeds leaves a checkpoint
// whose health check, at the repair's level, finds every shard and block good; a checkpoint
// opened after a repair loads every shard (or refuses with a typed error).
#include <algorithm>
#include <array>
#include <boost/json.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "fuzz/support/bundle.hpp"
#include "fuzz/support/reseal.hpp"
#include "fuzz_common.hpp"

using namespace ckpt;
using namespace ckpt::testing;
using fuzz::require;

namespace {
const std::string kSet = "/fz/set";
const std::string kName = "step-0000000020";

int node_count(std::string_view manifest) {
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(manifest, ec);
  if (ec || !v.is_object()) return 3;
  const auto* nodes = v.as_object().if_contains("nodes");
  const auto* count = nodes && nodes->is_object() ? nodes->as_object().if_contains("count") : nullptr;
  if (!count || !count->is_int64() || count->get_int64() < 1 || count->get_int64() > 8) return 3;
  return static_cast<int>(count->get_int64());
}

// The manifest with every shard's and block's size and checksums those of its file (as found
// in the node directory the manifest places it in), or unchanged if it is not that shape.
std::string resealed(MemoryFileSystem& fs, const std::vector<std::string>& roots, const std::string& manifest) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(manifest, ec);
  if (ec || !v.is_object()) return manifest;
  auto& o = v.as_object();
  const auto chunk = fuzz::chunk_size_of(o);
  const auto* nodes = o.if_contains("nodes");
  const auto* rpn = nodes && nodes->is_object() ? nodes->as_object().if_contains("ranks_per_node") : nullptr;
  if (!chunk || !rpn || !rpn->is_int64() || rpn->get_int64() < 1) return manifest;
  const auto file_of = [&](const boost::json::object& entry, std::int64_t node) -> std::optional<std::vector<std::byte>> {
    const auto* path = entry.if_contains("path");
    if (!path || !path->is_string() || node < 0 || node >= static_cast<std::int64_t>(roots.size())) return std::nullopt;
    const std::string name(path->as_string());
    if (name.empty() || name.find('/') != std::string::npos) return std::nullopt;
    return fs.file_bytes(join_path(join_path(roots[static_cast<std::size_t>(node)], kName), name));
  };
  for (const char* list : {"shards", "redundancy_blocks"}) {
    auto* entries = o.if_contains(list);
    if (!entries || !entries->is_array()) continue;
    for (auto& e : entries->as_array()) {
      if (!e.is_object()) continue;
      auto& eo = e.as_object();
      const bool shard = list[0] == 's';
      const auto* where = eo.if_contains(shard ? "rank" : "node");
      if (!where || !where->is_int64()) continue;
      const std::int64_t node = shard ? where->get_int64() / rpn->get_int64() : where->get_int64();
      if (const auto bytes = file_of(eo, node)) fuzz::reseal_entry(eo, *bytes, *chunk);
    }
  }
  return boost::json::serialize(v);
}

// Every file (path -> bytes) and directory under the set: what "nothing written" compares.
std::map<std::string, std::string> tree(MemoryFileSystem& fs, const std::string& dir, std::map<std::string, std::string> out = {}) {
  for (const auto& e : fs.list_dir(dir)) {
    const std::string p = join_path(dir, e.name);
    if (e.type == EntryType::directory) {
      out[p + "/"] = {};
      out = tree(fs, p, std::move(out));
    } else if (const auto b = fs.file_bytes(p)) {
      out[p] = std::string(reinterpret_cast<const char*>(b->data()), b->size());
    }
  }
  return out;
}

template <class F>
bool refusable(F&& f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    require(!e.file().empty() && e.file().starts_with("/fz/"), std::string("error does not name a file: ") + e.what());
    return false;
  }
}

void check_health(const NodeCheckpointHealth& h) {
  const Manifest& m = h.manifest;
  require(m.nodes.has_value(), "a checkpoint across nodes without a layout");
  require(h.shards.size() == m.shards.size() && h.blocks.size() == m.redundancy.size(), "one health entry per shard and block");
  std::size_t bad = 0;
  for (const auto& s : h.shards) bad += !s.ok;
  require(bad == h.bad_ranks.size(), "bad_ranks lists every bad shard");
  for (int r : h.lost_ranks)
    require(std::find(h.bad_ranks.begin(), h.bad_ranks.end(), r) != h.bad_ranks.end(), "a lost rank that is not bad");
  if (h.recoverable())
    for (int margin : h.margins) require(margin >= 0 || m.nodes->scheme.kind == RedundancyScheme::Kind::reed_solomon, "negative margin, yet recoverable");
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const unsigned flags = data[0];
  const Verify verify = std::array{Verify::none, Verify::fast, Verify::full, Verify::full}[flags & 3];
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  struct File {
    std::size_t node;
    std::string name;
    std::string_view bytes;
  };
  std::vector<File> files;
  const std::string manifest(fuzz::split_bundle(in, [&](std::string_view name, std::string_view body) {
    // "node-N/NAME", N a digit, NAME a plain file name.
    const auto slash = name.find('/');
    if (!name.starts_with("node-") || slash != 6 || name[5] < '0' || name[5] > '9') return;
    const std::string_view file = name.substr(slash + 1);
    if (file.empty() || file.size() > 255 || file.find('/') != std::string_view::npos || file == "." || file == "..") return;
    files.push_back({static_cast<std::size_t>(name[5] - '0'), std::string(file), body});
  }));
  const auto roots = node_root_paths(kSet, node_count(manifest));

  MemoryFileSystem fs;
  for (const auto& r : roots) {
    fs.create_dirs(join_path(r, kName));
    fs.put_file(join_path(r, std::string(kLatestName)), kName + "\n");
  }
  std::vector<bool> own_manifest(roots.size(), false);
  for (const auto& f : files) {
    if (f.node >= roots.size()) continue;
    fs.put_file(join_path(join_path(roots[f.node], kName), f.name), f.bytes);
    if (f.name == kManifestName) own_manifest[f.node] = true;
  }
  const std::string text = flags & 4 ? resealed(fs, roots, manifest) : manifest;
  for (std::size_t n = 0; n < roots.size(); ++n)
    if (!own_manifest[n]) fs.put_file(join_path(join_path(roots[n], kName), std::string(kManifestName)), text);
  if (const unsigned lost = (flags >> 4) & 7; lost > 0 && lost <= roots.size()) fs.remove_all(roots[lost - 1]);

  refusable([&] { check_health(check_node_checkpoint(fs, roots, kName, verify)); });

  const auto before = tree(fs, kSet);
  try {
    repair_node_checkpoint(fs, roots, kName, verify);
    refusable([&] {
      const NodeCheckpointHealth after = check_node_checkpoint(fs, roots, kName, verify);
      check_health(after);
      require(after.healthy(), "a repair succeeded and left a bad shard or block: " +
                                   [&] {
                                     std::string why;
                                     for (const auto& m : after.shards) if (!m.ok) why += m.what + ": " + m.error + "; ";
                                     for (const auto& m : after.blocks) if (!m.ok) why += m.what + ": " + m.error + "; ";
                                     return why;
                                   }());
    });
  } catch (const Error& e) {
    require(!e.file().empty() && e.file().starts_with("/fz/"), std::string("error does not name a file: ") + e.what());
    if (e.code() == Errc::missing_shard) require(tree(fs, kSet) == before, std::string("a refused repair wrote: ") + e.what());
  }

  if (flags & 8) {
    refusable([&] {
      // The resume through the store: the writer repairs the live checkpoint, then it opens.
      const auto store = open_store(kSet, {.fs = &fs});
      const auto step = store->latest();
      if (!step) return;
      (void)store->writer()->repair(*step, verify);
      const CheckpointReader reader = store->open(*step);
      const Manifest& m = reader.manifest();
      for (int r = 0; r < m.world_size && r < 8; ++r)
        refusable([&] {
          const LoadedShard shard = reader.load_shard(r, Verify::fast);
          require(shard.file_bytes().size() == m.shard(r).size, "loaded shard size");
        });
    });
  }
  return 0;
}
