// SPDX-License-Identifier: Apache-2.0
// A checkpoint across node roots (DIR/node-0, DIR/node-1, ...) with redundancy, written the
// way a save across nodes writes one (store/nodes/node_commit.hpp): the shards into every node's
// temporary directory, the redundancy blocks over the shard images (write_redundancy: no
// read-back), the manifest with its node layout and blocks, then commit_node_checkpoint.
// For the tests of anything that reads, checks or repairs such checkpoints.
#pragma once

#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "ckpt/format/redundancy.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/ops/save.hpp"
#include "io/io_fixture.hpp"
#include "support/test_support.hpp"

namespace ckpt::test {

/// Writes `request` (world = request.ranks.size() ranks, split evenly over `nodes`) as one
/// checkpoint across the node roots node_root_paths(dir, nodes) with `scheme`, committed on
/// every node (each node root's `latest` names it). The shard files are those
/// save_checkpoint_sync writes (same bytes, same checksums). `images`, if given, receives
/// every rank's shard file. Returns the committed manifest. Throws what the library throws.
/// The node roots are written through `fs` (a routed file system, say); the scratch root the
/// shard files are first saved into is a local directory.
inline Manifest save_node_checkpoint(FileSystem& fs, const std::string& dir, int nodes, const RedundancyScheme& scheme,
                                     const SaveRequest& request, std::vector<std::vector<std::uint8_t>>* images = nullptr) {
  const int world = static_cast<int>(request.ranks.size());
  // The shard files: written by the synchronous save into a scratch root, then their bytes.
  TempDir scratch;
  Manifest m = save_checkpoint_sync(posix_file_system(), scratch.path().string(), request);
  std::vector<std::vector<std::uint8_t>> files;
  for (const auto& s : m.shards) files.push_back(read_all(scratch / checkpoint_dir_name(m.step) / s.path));
  const NodeLayout layout{nodes, world / nodes, scheme};
  REQUIRE_MESSAGE(!layout_problem(layout, world), *layout_problem(layout, world));
  const auto roots = node_root_paths(dir, nodes);
  std::vector<RootLock> locks;
  for (const auto& r : roots) locks.emplace_back(fs, r);
  prepare_node_roots(fs, locks);
  const auto temps = begin_node_checkpoint(fs, roots, m.step);
  try {
    std::vector<std::span<const std::byte>> spans;
    std::vector<std::uint64_t> sizes;
    for (const auto& f : files) spans.push_back(std::as_bytes(std::span(f))), sizes.push_back(f.size());
    for (int r = 0; r < world; ++r) {
      const auto& bytes = files[static_cast<std::size_t>(r)];
      write_file_from(
          fs, temps[static_cast<std::size_t>(layout.node_of(r))], m.shards[static_cast<std::size_t>(r)].path, bytes.size(),
          [&](std::uint64_t off, std::span<std::byte> out) { std::memcpy(out.data(), bytes.data() + off, out.size()); }, m.chunk_size);
    }
    m.nodes = layout;
    m.redundancy = write_redundancy(fs, temps, layout, sizes, node_bytes_from_images(layout, spans), m.chunk_size);
    commit_node_checkpoint(fs, roots, temps, m);
  } catch (...) {
    abort_node_checkpoint(fs, roots, temps);
    throw;
  }
  if (images) *images = std::move(files);
  return m;
}

inline Manifest save_node_checkpoint(const std::string& dir, int nodes, const RedundancyScheme& scheme, const SaveRequest& request,
                                     std::vector<std::vector<std::uint8_t>>* images = nullptr) {
  return save_node_checkpoint(posix_file_system(), dir, nodes, scheme, request, images);
}

/// The fixture's checkpoint (every dtype, io_fixture.hpp) of `world` ranks at `step` across
/// `nodes` node roots with `scheme`, in a fresh directory.
struct SavedNodeCheckpoint {
  TempDir dir;
  Fixture fx;
  Manifest m;
  std::vector<std::vector<std::uint8_t>> images;  ///< every rank's shard file as written

  SavedNodeCheckpoint(int world, int nodes, const RedundancyScheme& scheme, std::uint64_t step = 10) : fx(world, step) {
    m = save_node_checkpoint(dir.path().string(), nodes, scheme, fx.request, &images);
  }
  /// One more checkpoint at `step` on the same node roots (the fixture's payload for that step).
  Manifest save_step(std::uint64_t step) {
    const Fixture f(static_cast<int>(m.shards.size()), step);
    return save_node_checkpoint(dir.path().string(), m.nodes->nodes, m.nodes->scheme, f.request);
  }
  std::string set() const { return dir.path().string(); }
  std::filesystem::path root(int node) const { return dir / ("node-" + std::to_string(node)); }
  std::filesystem::path ckpt_dir(int node) const { return root(node) / checkpoint_dir_name(m.step); }
  std::filesystem::path shard(int rank) const {
    return ckpt_dir(m.nodes->node_of(rank)) / m.shards[static_cast<std::size_t>(rank)].path;
  }
  std::filesystem::path block(std::size_t i) const { return ckpt_dir(m.redundancy[i].node) / m.redundancy[i].path; }
};

/// The resume of a node set, as the Checkpointer's start-up does it through the store: the
/// node roots' parent opened with open_store (through `fs`), the checkpoint `latest` names
/// repaired by the store's writer (StoreWriter::repair with `verify`; `report`, if given,
/// says what was rebuilt), then opened, read-only, at `expected_world_size`. Throws what the
/// store throws.
inline CheckpointReader repair_then_open_latest(FileSystem& fs, std::span<const std::string> roots, std::optional<int> expected_world_size = {},
                                                Verify verify = Verify::fast, RepairReport* report = nullptr) {
  REQUIRE(!roots.empty());
  const auto store = open_store(std::filesystem::path(roots.front()).parent_path().string(), {.fs = &fs});
  const auto step = store->latest();
  if (!step) throw Error(Errc::not_found, store->root(), "no latest pointer on any node root: nothing committed yet");
  {
    const auto writer = store->writer();
    auto reports = writer->repair(*step, verify);
    if (report) *report = reports.empty() ? RepairReport{} : std::move(reports.front());
  }
  return store->open(*step, expected_world_size);
}

}  // namespace ckpt::test
