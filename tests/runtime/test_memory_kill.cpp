// SPDX-License-Identifier: Apache-2.0
// A kill at every phase of a commit to a memory root (mem://NAME): chunks in flight, parity
// in flight, the manifest, the rename into place, `latest`, and the rotation between
// generations. FaultInjectionFileSystem::crash_after(k) stops every mutation after the k-th,
// which is what a SIGKILL leaves in shared memory (nothing is lost to a power cut there: the
// memory itself is). For every k the next run must find the previous generation or the new
// one, whole (every shard, and on a node set every parity block, verifies fully), with the
// right contents, never a mix, and no temporary left once a Checkpointer has started.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "io/io_fixture.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {

// CKPT_MEMORY_DIR at `dir` while the object lives.
struct MemoryDirAt : test::ScopedEnv {
  explicit MemoryDirAt(const fs::path& dir) : test::ScopedEnv({{"CKPT_MEMORY_DIR", dir.string()}}) {}
};

CheckpointerOptions memory_options(const std::string& root, const std::string& scheme, FileSystem* fsys) {
  CheckpointerOptions o{.root = root, .world_size = 4, .keep_last = 2, .fs = fsys};
  if (!scheme.empty()) o.nodes = NodeOptions{.ranks_per_node = 1, .redundancy = *parse_redundancy(scheme)};
  return o;
}

// Saves every rank of `fx` at `step`; false if the save failed (the simulated kill).
bool save_all(Checkpointer& c, const test::Fixture& fx, std::uint64_t step) {
  std::vector<SaveHandle> handles;
  for (int r = 0; r < 4; ++r) handles.push_back(c.save(r, step, fx.request.ranks[static_cast<std::size_t>(r)].tensors, {}));
  bool ok = true;
  for (auto& h : handles) {
    try {
      h.wait();
    } catch (const Error&) {
      ok = false;
    }
  }
  return ok;
}

// Every directory under the memory root that holds checkpoints (the root, or its node roots).
std::vector<fs::path> holders(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().starts_with("node-")) out.push_back(e.path());
  if (out.empty()) out.push_back(dir);
  return out;
}

bool any_temporary(const fs::path& dir) {
  for (const auto& h : holders(dir))
    for (const auto& e : fs::directory_iterator(h))
      if (is_temporary_name(e.path().filename().string())) return true;
  return false;
}

// The live generation is `fx`'s step: it verifies fully (parity blocks included) and every
// tensor holds what was saved at that step.
void check_live(const std::string& root, const test::Fixture& fx) {
  auto store = open_store(root);
  const auto latest = store->latest();
  REQUIRE(latest.has_value());
  REQUIRE(*latest == fx.request.step);
  store->verify(*latest, Verify::full);
  const auto reader = store->open(*latest, 4);
  for (int r = 0; r < 4; ++r) {
    const auto shard = reader.load_shard(r, Verify::full);
    for (const auto& t : fx.request.ranks[static_cast<std::size_t>(r)].tensors) {
      const auto& got = shard.tensor(t.name);
      CHECK(std::equal(got.data.begin(), got.data.end(), t.data.begin(), t.data.end()));
    }
  }
}

}  // namespace

TEST_CASE("a kill after any operation of a save to a memory root leaves the previous generation or the new one, whole, never a mix") {
  for (const std::string scheme : {"", "rs:3+1"}) {
    CAPTURE(scheme);
    test::TempDir scratch;
    MemoryDirAt at(scratch.path());
    const std::string root = "mem://kill";
    const fs::path dir = root_directory(root);
    test::Fixture first(4, 1), second(4, 2);
    {
      Checkpointer c(memory_options(root, scheme, nullptr));
      REQUIRE(save_all(c, first, 1));
    }
    // How many mutations a save of step 2 makes, counted on a root of its own.
    std::uint64_t total = 0;
    {
      FaultInjectionFileSystem counter(posix_file_system());
      Checkpointer c(memory_options("mem://count", scheme, &counter));
      const auto before = counter.mutations();
      REQUIRE(save_all(c, second, 2));
      c.wait_all();
      total = counter.mutations() - before;
    }
    REQUIRE(total > 8);
    int saw_new = 0, saw_old = 0;
    for (std::uint64_t k = 0; k <= total; ++k) {
      CAPTURE(k);
      FaultInjectionFileSystem faulty(posix_file_system());
      {
        Checkpointer c(memory_options(root, scheme, &faulty));
        faulty.crash_after(k);
        save_all(c, second, 2);
        c.wait_all();
      }
      // The next run's start-up cleans up what the killed one left.
      { Checkpointer reopened(memory_options(root, scheme, nullptr)); }
      CHECK_FALSE(any_temporary(dir));
      const auto live = open_store(root)->latest();
      REQUIRE(live.has_value());
      if (*live == 2) {
        ++saw_new;
        check_live(root, second);
        // Back to step 1 for the next kill.
        for (const auto& h : holders(dir)) {
          write_latest(posix_file_system(), h.string(), checkpoint_dir_name(1));
          fs::remove_all(h / checkpoint_dir_name(2));
        }
        check_live(root, first);
      } else {
        ++saw_old;
        check_live(root, first);
      }
    }
    CHECK(saw_old > 0);
    CHECK(saw_new > 0);
  }
}
