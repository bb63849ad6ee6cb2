// SPDX-License-Identifier: Apache-2.0
// The recovery planner (store/recovery.hpp) over real levels: a memory root (one root, and a
// node set with parity), a disk directory, a missing and a hostile level.
#include <unistd.h>

#include <filesystem>

#include "ckpt/store/memory/memory.hpp"
#include "ckpt/store/recovery.hpp"
#include "store/conformance.hpp"

namespace {

using namespace ckpt;
namespace fs = std::filesystem;
using test::put_checkpoint;
using test::SourceCheckpoint;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A memory root of this process, removed with the object.
struct Mem {
  std::string root;
  fs::path dir;
  explicit Mem(const std::string& tag) : root("mem://recovery-" + tag + "-" + std::to_string(::getpid())), dir(memory_root_dir(root)) {
    fs::remove_all(dir);
  }
  ~Mem() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

void put(const std::string& root, std::initializer_list<std::uint64_t> steps, const StoreOptions& options = {}, int world = 2) {
  auto store = open_store(root, options);
  auto w = store->writer();
  for (const auto s : steps) put_checkpoint(*w, SourceCheckpoint(world, s));
}

NodeLayout rs21() {
  RedundancyScheme s{};
  s.kind = RedundancyScheme::Kind::reed_solomon;
  s.k = 2, s.m = 1;
  return {3, 1, s};
}

}  // namespace

TEST_CASE("the plan takes the newest step, from the cheapest level that holds it usable") {
  Mem mem("newest");
  test::TempDir disk;
  const std::string durable = (disk / "durable").string();
  put(durable, {10, 20});
  put(mem.root, {20, 30});
  RecoveryPlan plan = plan_recovery({mem.root, durable});
  REQUIRE(plan.chosen.has_value());
  CHECK(plan.chosen->step == 30);
  CHECK(plan.chosen->level == 0);
  CHECK(plan.chosen->kind == StoreKind::memory);
  CHECK(plan.chosen->fetch == RecoveryFetch::read);
  CHECK(plan.candidates.size() == 1);
  CHECK(plan.summary() == "step 30 from memory " + mem.root + " (read in place)");
  // The same step on both levels: the cheaper one.
  put(durable, {30});
  plan = plan_recovery({durable, mem.root});
  REQUIRE(plan.chosen.has_value());
  CHECK(plan.chosen->level == 0);  // the order given is the order of cost
  CHECK(plan.chosen->root == durable);
  CHECK(plan.chosen->kind == StoreKind::directory);
}

TEST_CASE("a newer step that is damaged, or saved at another world size, is passed over with its typed error, and an older one is taken") {
  Mem mem("damaged");
  test::TempDir disk;
  const std::string durable = (disk / "durable").string();
  put(durable, {10});
  put(mem.root, {20, 30});
  const fs::path shard = mem.dir / checkpoint_dir_name(30) / shard_file_name(1, 2);
  fs::resize_file(shard, 100);
  RecoveryPlan plan = plan_recovery({mem.root, durable});
  REQUIRE(plan.chosen.has_value());
  CHECK(plan.chosen->step == 20);
  REQUIRE(plan.candidates.size() == 2);
  CHECK(plan.candidates[0].step == 30);
  CHECK_FALSE(plan.candidates[0].usable());
  CHECK(contains(plan.candidates[0].passed_over, shard.string()));
  CHECK(contains(plan.summary(), "step 20 from memory " + mem.root + " (read in place); passed over: step 30 on memory " + mem.root + ": "));
  // Expecting 4 ranks: every step of 2 is passed over, naming both sizes.
  plan = plan_recovery({mem.root, durable}, {.expected_world_size = 4});
  CHECK_FALSE(plan.chosen.has_value());
  CHECK(plan.candidates.size() == 3);
  CHECK(contains(plan.candidates[1].passed_over, "saved at another world size: expected 4, actual 2"));
  CHECK(plan.summary().starts_with("nothing to recover; passed over: step 30"));
}

TEST_CASE("with Verify::fast the survey reads the chunks: a flipped bit passes a step over that a survey by sizes takes") {
  Mem mem("bits");
  put(mem.root, {10, 20});
  const fs::path shard = mem.dir / checkpoint_dir_name(20) / shard_file_name(0, 2);
  auto bytes = test::read_all(shard);
  bytes[bytes.size() - 3] ^= 0x10;
  test::write_all(shard, bytes);
  CHECK(plan_recovery({mem.root}).chosen->step == 20);
  const RecoveryPlan plan = plan_recovery({mem.root}, {.verify = Verify::fast});
  REQUIRE(plan.chosen.has_value());
  CHECK(plan.chosen->step == 10);
  CHECK(contains(plan.candidates[0].passed_over, "checksum mismatch"));
}

TEST_CASE("a memory node set with a node's memory gone is rebuilt from its peers, and beyond its parity the plan falls to the next level") {
  Mem mem("nodes");
  test::TempDir disk;
  const std::string durable = (disk / "durable").string();
  put(durable, {20}, {}, 3);
  put(mem.root, {10, 20}, {.nodes = rs21()}, 3);
  fs::remove_all(mem.dir / "node-1");
  RecoveryPlan plan = plan_recovery({mem.root, durable});
  REQUIRE(plan.chosen.has_value());
  CHECK(plan.chosen->step == 20);
  CHECK(plan.chosen->level == 0);
  CHECK(plan.chosen->fetch == RecoveryFetch::rebuild);
  CHECK(contains(plan.summary(), "(its lost files rebuilt from the other nodes' redundancy first)"));
  fs::remove_all(mem.dir / "node-2");
  plan = plan_recovery({mem.root, durable});
  REQUIRE(plan.chosen.has_value());
  CHECK(plan.chosen->level == 1);
  CHECK(plan.chosen->step == 20);
  REQUIRE_FALSE(plan.candidates.front().usable());
  CHECK(contains(plan.candidates.front().passed_over, "beyond its redundancy: ranks 1, 2 cannot be rebuilt"));
  // Planning wrote nothing: the lost nodes are still lost.
  CHECK_FALSE(fs::exists(mem.dir / "node-1"));
}

TEST_CASE("a level that cannot be read is named with its error, never thrown, and the others are planned") {
  test::TempDir scratch;
  ::setenv("CKPT_MEMORY_DIR", scratch.path().c_str(), 1);
  const fs::path user = scratch / ("ckpt-" + std::to_string(::geteuid()));
  fs::create_directory(user);
  fs::permissions(user, fs::perms(0777));
  const std::string durable = (scratch / "durable").string();
  put(durable, {10});
  const RecoveryPlan plan = plan_recovery({"mem://run", durable, (scratch / "missing").string()});
  ::unsetenv("CKPT_MEMORY_DIR");
  REQUIRE(plan.chosen.has_value());
  CHECK(plan.chosen->root == durable);
  REQUIRE(plan.level_errors.size() == 2);
  CHECK(plan.level_errors[0].code == Errc::unsafe_path);
  CHECK(contains(plan.level_errors[0].error, "mode 0777"));
  CHECK(plan.level_errors[1].code == Errc::not_found);
  CHECK(contains(plan.summary(), "not used: mem://run: "));
  CHECK(test::expect_error([] { plan_recovery({}); }).code() == Errc::invalid_argument);
}

TEST_CASE("a peer's redundancy block with a flipped bit is refused by a verifying survey, and the plan falls back a level, saying so") {
  Mem mem("flipped");
  test::TempDir disk;
  const std::string durable = (disk / "durable").string();
  put(durable, {20}, {}, 3);
  put(mem.root, {20}, {.nodes = rs21()}, 3);
  fs::remove_all(mem.dir / "node-1");
  // Node 1 is rebuilt from the other two nodes' blocks; flip a bit in one of them.
  fs::path parity;
  for (const auto& e : fs::recursive_directory_iterator(mem.dir))
    if (e.path().extension() == ".rs") parity = e.path();
  REQUIRE_FALSE(parity.empty());
  auto bytes = test::read_all(parity);
  bytes[bytes.size() / 2] ^= 0x01;
  test::write_all(parity, bytes);
  // By sizes the memory level looks rebuildable; reading the chunks shows it is not.
  CHECK(plan_recovery({mem.root, durable}).chosen->level == 0);
  const RecoveryPlan plan = plan_recovery({mem.root, durable}, {.verify = Verify::fast});
  REQUIRE(plan.chosen.has_value());
  CHECK(plan.chosen->level == 1);
  REQUIRE_FALSE(plan.candidates.front().usable());
  CHECK(contains(plan.candidates.front().passed_over, "beyond its redundancy"));
  INFO(plan.summary());
  CHECK(contains(plan.summary(), "checksum mismatch"));
  CHECK(contains(plan.summary(), parity.filename().string()));
}
