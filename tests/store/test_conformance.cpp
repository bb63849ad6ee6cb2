// SPDX-License-Identifier: Apache-2.0
// The conformance suite (store/conformance.hpp) over the file-backed kinds: a directory, node
// sets of 3 nodes without redundancy, with replicas, and with Reed-Solomon parity, and memory
// roots (mem://NAME in /dev/shm) of one root and of 3 nodes with Reed-Solomon parity.
#include "store/conformance.hpp"

#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "ckpt/format/redundancy.hpp"
#include "ckpt/store/memory/memory.hpp"

namespace {

using namespace ckpt;
namespace fs = std::filesystem;

void write_junk(const fs::path& file) { test::write_all(file, {'{', 'n', 'o', 't', ' ', 'j', 's', 'o', 'n'}); }

// A crashed save's temporary: a directory named as begin_checkpoint names them, with a file.
void leave_temporary(const fs::path& root, std::uint64_t step) {
  const fs::path t = root / temporary_name(checkpoint_dir_name(step));
  fs::create_directories(t);
  test::write_all(t / shard_file_name(0, 1), {1, 2, 3});
}

// A removal's temporary: the step's directory renamed as retire_dir and remove_node_step do.
void renamed_away(const fs::path& root, std::uint64_t step) {
  const std::string name = checkpoint_dir_name(step);
  REQUIRE(fs::exists(root / name));
  fs::rename(root / name, root / temporary_name(name));
}

bool has_temporary(const fs::path& root) {
  if (!fs::exists(root)) return false;
  for (const auto& e : fs::directory_iterator(root))
    if (is_temporary_name(e.path().filename().string())) return true;
  return false;
}

struct Directory {
  static constexpr const char* name = "directory";
  static constexpr int world = 2;
  static constexpr bool file_backed = true;
  test::TempDir dir;
  fs::path root() const { return dir / "run"; }
  std::unique_ptr<CheckpointStore> open() {
    auto s = open_store(root().string());
    REQUIRE(s->kind() == StoreKind::directory);
    return s;
  }
  void damage_manifest(std::uint64_t step) { write_junk(root() / checkpoint_dir_name(step) / "manifest.json"); }
  void leave_crashed_save(std::uint64_t step) { leave_temporary(root(), step); }
  // A removal renames the step to a temporary, then deletes that (retire_dir): cut between.
  void leave_crashed_removal(std::uint64_t step) { renamed_away(root(), step); }
  bool holds_step_dir(std::uint64_t step) { return fs::exists(root() / checkpoint_dir_name(step)); }
  bool has_leftovers() { return has_temporary(root()); }
};

template <RedundancyScheme::Kind K, int A, int B>
struct NodeSet {
  static constexpr const char* name = K == RedundancyScheme::Kind::none ? "node set" : K == RedundancyScheme::Kind::replicate ? "node set, replicate" : "node set, rs";
  static constexpr int world = 3;
  static constexpr bool file_backed = true;
  test::TempDir dir;
  fs::path root() const { return dir / "set"; }
  static NodeLayout layout() {
    RedundancyScheme s{};
    s.kind = K;
    if constexpr (K == RedundancyScheme::Kind::replicate) s.copies = A;
    if constexpr (K == RedundancyScheme::Kind::reed_solomon) s.k = A, s.m = B;
    return {3, 1, s};
  }
  std::unique_ptr<CheckpointStore> open() {
    auto s = open_store(root().string(), {.nodes = layout()});
    REQUIRE(s->kind() == StoreKind::node_set);
    return s;
  }
  void damage_manifest(std::uint64_t step) {
    for (int n = 0; n < 3; ++n) write_junk(root() / ("node-" + std::to_string(n)) / checkpoint_dir_name(step) / "manifest.json");
  }
  void leave_crashed_save(std::uint64_t step) {
    for (int n = 0; n < 3; ++n) leave_temporary(root() / ("node-" + std::to_string(n)), step);
  }
  // A removal across node roots renames the step on every node before it deletes any
  // (remove_node_step): cut after node 0's rename, the step is whole on nodes 1 and 2.
  void leave_crashed_removal(std::uint64_t step) { renamed_away(root() / "node-0", step); }
  bool holds_step_dir(std::uint64_t step) {
    for (int n = 0; n < 3; ++n)
      if (fs::exists(root() / ("node-" + std::to_string(n)) / checkpoint_dir_name(step))) return true;
    return false;
  }
  bool has_leftovers() {
    for (int n = 0; n < 3; ++n)
      if (has_temporary(root() / ("node-" + std::to_string(n)))) return true;
    return false;
  }
};

// A fresh memory root of this process, its directory removed with the Kind.
struct MemoryRoot {
  std::string root;
  fs::path dir;
  MemoryRoot() {
    static std::atomic<int> count{0};
    root = "mem://conformance-" + std::to_string(::getpid()) + "-" + std::to_string(count++);
    dir = memory_root_dir(root);
    fs::remove_all(dir);
  }
  ~MemoryRoot() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

struct Memory {
  static constexpr const char* name = "memory";
  static constexpr int world = 2;
  static constexpr bool file_backed = true;
  MemoryRoot mem;
  std::unique_ptr<CheckpointStore> open() {
    auto s = open_store(mem.root);
    REQUIRE(s->kind() == StoreKind::memory);
    return s;
  }
  void damage_manifest(std::uint64_t step) { write_junk(mem.dir / checkpoint_dir_name(step) / "manifest.json"); }
  void leave_crashed_save(std::uint64_t step) { leave_temporary(mem.dir, step); }
  void leave_crashed_removal(std::uint64_t step) { renamed_away(mem.dir, step); }
  bool holds_step_dir(std::uint64_t step) { return fs::exists(mem.dir / checkpoint_dir_name(step)); }
  bool has_leftovers() { return has_temporary(mem.dir); }
};

// A memory root of 3 nodes with Reed-Solomon 2+1 parity (mem://NAME/node-n).
struct MemoryNodesRs {
  static constexpr const char* name = "memory, node set, rs";
  static constexpr int world = 3;
  static constexpr bool file_backed = true;
  MemoryRoot mem;
  fs::path node(int n) const { return mem.dir / ("node-" + std::to_string(n)); }
  std::unique_ptr<CheckpointStore> open() {
    RedundancyScheme s{};
    s.kind = RedundancyScheme::Kind::reed_solomon;
    s.k = 2, s.m = 1;
    auto st = open_store(mem.root, {.nodes = NodeLayout{3, 1, s}});
    REQUIRE(st->kind() == StoreKind::memory);
    return st;
  }
  void damage_manifest(std::uint64_t step) {
    for (int n = 0; n < 3; ++n) write_junk(node(n) / checkpoint_dir_name(step) / "manifest.json");
  }
  void leave_crashed_save(std::uint64_t step) {
    for (int n = 0; n < 3; ++n) leave_temporary(node(n), step);
  }
  void leave_crashed_removal(std::uint64_t step) { renamed_away(node(0), step); }
  bool holds_step_dir(std::uint64_t step) {
    for (int n = 0; n < 3; ++n)
      if (fs::exists(node(n) / checkpoint_dir_name(step))) return true;
    return false;
  }
  bool has_leftovers() {
    for (int n = 0; n < 3; ++n)
      if (has_temporary(node(n))) return true;
    return false;
  }
};

using Nodes = NodeSet<RedundancyScheme::Kind::none, 0, 0>;
using NodesReplicated = NodeSet<RedundancyScheme::Kind::replicate, 2, 0>;
using NodesRs = NodeSet<RedundancyScheme::Kind::reed_solomon, 2, 1>;

}  // namespace

TEST_CASE_TEMPLATE_INVOKE(store_conformance, Directory, Nodes, NodesReplicated, NodesRs, Memory, MemoryNodesRs);
