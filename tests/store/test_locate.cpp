// SPDX-License-Identifier: Apache-2.0
// locate_checkpoint: every path form the tools take (a root, ROOT/step-N, a node set, one of
// its node roots, DIR/node-n/step-N, a checkpoint directory of another name) resolves to the
// store open_store opens and the step the path names, and nothing is written.
#include <doctest/doctest.h>

#include <filesystem>

#include "ckpt/format/redundancy.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/store/store.hpp"
#include "io/io_fixture.hpp"
#include "support/node_checkpoint.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
// Every entry under `dir`, as relative paths.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) out.push_back(fs::relative(e.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

TEST_CASE("locate_checkpoint resolves a root, a step of it, a node set, a node root, a node's step and a checkpoint of another name") {
  test::TempDir dir;
  const std::string root = (dir / "run").string();
  for (std::uint64_t s : {1, 2}) {
    const test::Fixture fx(2, s);
    save_checkpoint_sync(posix_file_system(), root, fx.request);
  }
  const std::string set = (dir / "set").string();
  const test::Fixture nf(4, 10);
  test::save_node_checkpoint(set, 4, RedundancyScheme{.kind = RedundancyScheme::Kind::reed_solomon, .k = 3, .m = 1}, nf.request);
  fs::copy(fs::path(root) / checkpoint_dir_name(2), dir / "copy", fs::copy_options::recursive);
  const auto before = entries(dir.path());

  auto at = locate_checkpoint(root + "/");
  REQUIRE(at.store);
  CHECK(at.store->kind() == StoreKind::directory);
  CHECK(at.store->root() == root);
  CHECK_FALSE(at.step);
  CHECK_FALSE(at.node_root);

  at = locate_checkpoint(root + "/" + checkpoint_dir_name(1));
  REQUIRE(at.store);
  CHECK(at.store->kind() == StoreKind::directory);
  CHECK(at.store->root() == root);
  CHECK(at.step == std::optional<std::uint64_t>(1));

  at = locate_checkpoint(set);
  REQUIRE(at.store);
  CHECK(at.store->kind() == StoreKind::node_set);
  CHECK(at.store->root() == set);
  CHECK_FALSE(at.step);

  at = locate_checkpoint(set + "/node-2");
  REQUIRE(at.store);
  CHECK(at.store->kind() == StoreKind::node_set);
  CHECK(at.store->root() == set);
  CHECK(at.node_root);
  CHECK_FALSE(at.step);
  CHECK(at.store->latest() == std::optional<std::uint64_t>(10));

  at = locate_checkpoint(set + "/node-2/" + checkpoint_dir_name(10));
  REQUIRE(at.store);
  CHECK(at.store->kind() == StoreKind::node_set);
  CHECK(at.store->root() == set);
  CHECK(at.step == std::optional<std::uint64_t>(10));
  CHECK(at.store->open(10).manifest().world_size == 4);

  // A checkpoint directory copied out of its root under another name: outside any store.
  at = locate_checkpoint((dir / "copy").string());
  CHECK_FALSE(at.store);
  CHECK(at.dir == (dir / "copy").string());

  // A root that does not exist yet is a directory root to be (a save's target).
  at = locate_checkpoint((dir / "fresh").string());
  REQUIRE(at.store);
  CHECK(at.store->kind() == StoreKind::directory);
  CHECK_FALSE(at.store->latest());

  CHECK(entries(dir.path()) == before);  // nothing written
}
