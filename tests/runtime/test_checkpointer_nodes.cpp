// SPDX-License-Identifier: Apache-2.0
// The Checkpointer across node roots (CheckpointerOptions::nodes): the redundancy is written
// with the shards and committed with them; a failure or a power cut at any point leaves the
// previous checkpoint whole and loadable on every node.
#include <doctest/doctest.h>

#include <filesystem>

#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "io/io_fixture.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {

CheckpointerOptions node_options(const std::string& root, const std::string& scheme, FileSystem* fsys = nullptr, int world = 4, int per_node = 1) {
  CheckpointerOptions o{.root = root, .world_size = world, .keep_last = 2, .fs = fsys};
  o.nodes = NodeOptions{.ranks_per_node = per_node, .redundancy = *parse_redundancy(scheme)};
  return o;
}

void save_all(Checkpointer& c, const test::Fixture& fx, std::uint64_t step) {
  std::vector<SaveHandle> handles;
  for (int r = 0; r < static_cast<int>(fx.request.ranks.size()); ++r)
    handles.push_back(c.save(r, step, fx.request.ranks[static_cast<std::size_t>(r)].tensors, {}));
  for (auto& h : handles) h.wait();
}

// The live checkpoint of the node set `root` is `fx`'s step, every shard and block verifies
// (fully), and every tensor holds what was saved.
void check_live(const std::string& root, const test::Fixture& fx) {
  const int world = static_cast<int>(fx.request.ranks.size());
  auto opened = open_latest(posix_file_system(), root, {.expected_world_size = world});
  REQUIRE(opened.name == checkpoint_dir_name(fx.request.step));
  const auto& m = opened.reader.manifest();
  REQUIRE(m.nodes);
  std::vector<std::string> roots = node_root_paths(root, m.nodes->nodes);
  const auto h = check_node_checkpoint(posix_file_system(), roots, opened.name, Verify::full);
  for (const auto& s : h.shards) CHECK_MESSAGE(s.ok, s.path << ": " << s.error);
  for (const auto& b : h.blocks) CHECK_MESSAGE(b.ok, b.path << ": " << b.error);
  CHECK(h.min_margin() == tolerated_node_losses(m.nodes->scheme));
  for (int r = 0; r < world; ++r) {
    const auto shard = opened.reader.load_shard(r, Verify::full);
    for (const auto& t : fx.request.ranks[static_cast<std::size_t>(r)].tensors) {
      const auto& got = shard.tensor(t.name);
      CHECK(std::equal(got.data.begin(), got.data.end(), t.data.begin(), t.data.end()));
    }
  }
}

bool any_temporary(const std::string& root) {
  for (const auto& n : fs::directory_iterator(root))
    for (const auto& e : fs::directory_iterator(n.path()))
      if (is_temporary_name(e.path().filename().string())) return true;
  return false;
}

}  // namespace

TEST_CASE("a Checkpointer across 4 node roots with rs:3+1 commits the shards, the parity and the manifest on every node") {
  test::TempDir dir;
  const std::string root = (dir.path() / "set").string();
  test::Fixture fx(4, 7);
  {
    Checkpointer c(node_options(root, "rs:3+1"));
    save_all(c, fx, 7);
  }
  for (int n = 0; n < 4; ++n) {
    CAPTURE(n);
    const fs::path d = dir.path() / "set" / ("node-" + std::to_string(n)) / "step-0000000007";
    CHECK(fs::exists(d / shard_file_name(n, 4)));
    CHECK(fs::exists(d / kManifestName));
    CHECK(fs::exists(d / parity_file_name((n + 1) % 4, 0)));
    CHECK(read_latest(posix_file_system(), (dir.path() / "set" / ("node-" + std::to_string(n))).string()) == "step-0000000007");
  }
  // The manifests are the same bytes on every node.
  const auto m0 = test::read_all(dir.path() / "set/node-0/step-0000000007/manifest.json");
  for (int n = 1; n < 4; ++n) CHECK(test::read_all(dir.path() / ("set/node-" + std::to_string(n)) / "step-0000000007/manifest.json") == m0);
  check_live(root, fx);
}

TEST_CASE("a Checkpointer with 2 ranks per node and replicate:2 stores each node's shards on the next node, and rotation keeps 2 on every node") {
  test::TempDir dir;
  const std::string root = (dir.path() / "set").string();
  std::vector<test::Fixture> fxs;
  for (std::uint64_t s = 1; s <= 3; ++s) fxs.emplace_back(4, s);
  {
    Checkpointer c(node_options(root, "replicate:2", nullptr, 4, 2));
    for (std::uint64_t s = 1; s <= 3; ++s) save_all(c, fxs[s - 1], s);
    c.wait_all();
  }
  for (int n = 0; n < 2; ++n) {
    const fs::path node = dir.path() / "set" / ("node-" + std::to_string(n));
    CHECK(!fs::exists(node / "step-0000000001"));
    CHECK(fs::exists(node / "step-0000000002"));
    for (int r = 0; r < 4; ++r) {
      CAPTURE(r);
      const bool mine = r / 2 == n;
      CHECK(fs::exists(node / "step-0000000003" / shard_file_name(r, 4)) == mine);
      CHECK(fs::exists(node / "step-0000000003" / replica_file_name(r, 4)) == !mine);
    }
  }
  check_live(root, fxs[2]);
}

TEST_CASE("a Checkpointer refuses node options that cannot hold its ranks, before touching the root") {
  test::TempDir dir;
  const std::string root = (dir.path() / "set").string();
  const auto refused = [&](CheckpointerOptions o, const std::string& message) {
    CAPTURE(message);
    try {
      Checkpointer c(std::move(o));
      FAIL("accepted");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_argument);
      CHECK(std::string(e.what()).find(message) != std::string::npos);
    }
    CHECK(!fs::exists(root));
  };
  refused(node_options(root, "rs:3+2"), "rs:3+2 needs at least K + M = 5 nodes (got 4)");
  refused(node_options(root, "replicate:2", nullptr, 4, 3), "ranks_per_node must divide the world size");
  refused(node_options(root, "replicate:5"), "replicate:5 needs at least 5 nodes (got 4)");
}

TEST_CASE("a shard or parity file that cannot be created fails the checkpoint with no_space, leaves no temporary, and the previous one stays whole") {
  test::TempDir dir;
  const std::string root = (dir.path() / "set").string();
  test::Fixture first(4, 1), second(4, 2);
  {
    Checkpointer c(node_options(root, "rs:2+1"));
    save_all(c, first, 1);
  }
  bool parity_failed = false;
  for (std::uint64_t n = 0; n < 8; ++n) {  // 4 shards and 4 parity blocks are created
    CAPTURE(n);
    FaultInjectionFileSystem faulty(posix_file_system());
    Checkpointer c(node_options(root, "rs:2+1", &faulty));
    faulty.fail_nth(FaultInjectionFileSystem::Op::create, n, ENOSPC);
    std::vector<SaveHandle> handles;
    for (int r = 0; r < 4; ++r) handles.push_back(c.save(r, 2, second.request.ranks[static_cast<std::size_t>(r)].tensors, {}));
    for (auto& h : handles) {
      try {
        h.wait();
        FAIL("the save did not fail");
      } catch (const Error& e) {
        CHECK(e.code() == Errc::no_space);
        parity_failed |= std::string(e.what()).find("parity-s") != std::string::npos;
      }
    }
    c.wait_all();
    CHECK(!any_temporary(root));
    check_live(root, first);
  }
  CHECK(parity_failed);
}

TEST_CASE("a power cut after any operation of a save across node roots leaves the previous checkpoint or the new one, whole on every node") {
  for (const std::string scheme : {"rs:3+1", "replicate:2"}) {
    CAPTURE(scheme);
    test::TempDir dir;
    const std::string root = (dir.path() / "set").string();
    test::Fixture first(4, 1), second(4, 2);
    {
      Checkpointer c(node_options(root, scheme));
      save_all(c, first, 1);
    }
    std::uint64_t total = 0;
    {
      test::TempDir probe;
      FaultInjectionFileSystem counter(posix_file_system());
      Checkpointer c(node_options((probe.path() / "set").string(), scheme, &counter));
      const auto before = counter.mutations();
      save_all(c, second, 2);
      c.wait_all();
      total = counter.mutations() - before;
    }
    int saw_new = 0, saw_old = 0;
    for (std::uint64_t k = 0; k <= total; ++k) {
      CAPTURE(k);
      FaultInjectionFileSystem faulty(posix_file_system());
      {
        Checkpointer c(node_options(root, scheme, &faulty));
        faulty.crash_after(k);
        std::vector<SaveHandle> handles;
        for (int r = 0; r < 4; ++r) handles.push_back(c.save(r, 2, second.request.ranks[static_cast<std::size_t>(r)].tensors, {}));
        for (auto& h : handles) {
          try {
            h.wait();
          } catch (const Error&) {
            // the simulated crash fails the save; what matters is what the disks hold
          }
        }
        faulty.simulate_power_loss();
      }
      // After the reboot, as the next run finds it (a Checkpointer cleans the roots up).
      { Checkpointer reopened(node_options(root, scheme)); }
      CHECK(!any_temporary(root));
      const auto live_step = open_store(root)->latest();
      const auto live = live_step ? std::optional<std::string>(checkpoint_dir_name(*live_step)) : std::nullopt;
      REQUIRE(live);
      if (*live == "step-0000000002") {
        ++saw_new;
        check_live(root, second);
        // Back to step 1 for the next cut.
        for (const auto& r : node_root_paths(root, 4)) {
          write_latest(posix_file_system(), r, "step-0000000001");
          fs::remove_all(fs::path(r) / "step-0000000002");
        }
      } else {
        ++saw_old;
        check_live(root, first);
      }
    }
    CHECK(saw_old > 0);
    CHECK(saw_new > 0);
  }
}

TEST_CASE("a node set's checkpoint lost beyond the scheme: opening writes nothing, the Checkpointer's start-up rebuilds the older one, open_latest falls back to it") {
  test::TempDir dir;
  const std::string root = (dir.path() / "set").string();
  test::Fixture first(4, 1), second(4, 2);
  {
    Checkpointer c(node_options(root, "rs:3+1"));
    save_all(c, first, 1);
    save_all(c, second, 2);
  }
  // Step 2 loses two nodes (beyond rs:3+1), step 1 one.
  fs::remove_all(dir.path() / "set/node-1/step-0000000002");
  fs::remove_all(dir.path() / "set/node-2/step-0000000002");
  fs::remove_all(dir.path() / "set/node-3/step-0000000001");
  const Error e = test::expect_error([&] { open_latest(posix_file_system(), root); });
  CHECK(e.code() == Errc::missing_shard);
  CHECK(e.file() == (dir.path() / "set/node-1/step-0000000002/rank-00001-of-00004.safetensors").string());
  // Opening rebuilds nothing: with fallback, step 1 lacks node 3's files as well.
  const Error f = test::expect_error([&] { open_latest(posix_file_system(), root, {.fallback = true}); });
  CHECK(f.code() == Errc::not_found);
  CHECK_FALSE(fs::exists(dir.path() / "set/node-3/step-0000000001"));
  // The explicit repair, at the Checkpointer's start-up: step 1 is rebuilt, step 2 cannot be.
  {
    test::LogCapture log;
    Checkpointer c(node_options(root, "rs:3+1"));
    bool rebuilt = false;
    for (const auto& r : c.repairs())
      for (const auto& l : r.lines) rebuilt |= l.find("rank 3 (node-3/step-0000000001/rank-00003-of-00004.safetensors) rebuilt from parity") != std::string::npos;
    CHECK(rebuilt);
    CHECK(log.matching({"shards of rank 1 (node 1), rank 2 (node 2) are lost beyond what rs:3+1 restores"}).size() >= 1);
  }
  auto opened = open_latest(posix_file_system(), root, {.fallback = true});
  CHECK(opened.name == "step-0000000001");
  CHECK(opened.fell_back);
  CHECK(opened.note.find("missing shard") != std::string::npos);
  for (int r = 0; r < 4; ++r) {
    const auto shard = opened.reader.load_shard(r, Verify::full);
    for (const auto& t : first.request.ranks[static_cast<std::size_t>(r)].tensors) {
      const auto& got = shard.tensor(t.name);
      CHECK(std::equal(got.data.begin(), got.data.end(), t.data.begin(), t.data.end()));
    }
  }
}
