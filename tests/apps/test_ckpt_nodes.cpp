// SPDX-License-Identifier: Apache-2.0
// The ckpt tool on a node set: a checkpoint across node roots DIR/node-0, DIR/node-1, ...
// with redundancy (ls, inspect, verify, repair, prune, and the commands that read tensors).
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <filesystem>

#include "apps/ckpt_tool_fixture.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/format/sharding.hpp"
#include <cstring>
#include "support/node_checkpoint.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
using test::ckpt_run;
using test::SavedNodeCheckpoint;

const RedundancyScheme kRs31{.kind = RedundancyScheme::Kind::reed_solomon, .k = 3, .m = 1};
const RedundancyScheme kRs22{.kind = RedundancyScheme::Kind::reed_solomon, .k = 2, .m = 2};
const RedundancyScheme kReplicate2{.kind = RedundancyScheme::Kind::replicate, .copies = 2};

bool has(const std::string& out, const std::string& what) { return out.find(what) != std::string::npos; }
// Every one of `whats` is in `out`.
void check_has(const std::string& out, const std::vector<std::string>& whats) {
  for (const auto& w : whats) {
    CAPTURE(w);
    CHECK(has(out, w));
  }
}

boost::json::object json_of(const std::string& out) { return boost::json::parse(out.substr(0, out.find('\n'))).as_object(); }

// Every file under `dir` with its bytes, by path relative to `dir`.
std::map<std::string, std::vector<std::uint8_t>> tree(const fs::path& dir) {
  std::map<std::string, std::vector<std::uint8_t>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = test::read_all(e.path());
  return out;
}

// `ckpt repair TARGET` exits 0 and prints each of `lines`; the shards of `ranks` are then
// byte for byte what was saved, and the node set verifies in full.
void check_repair(const SavedNodeCheckpoint& s, const std::string& target, const std::vector<std::string>& lines, const std::vector<int>& ranks) {
  const auto r = ckpt_run("repair " + target);
  INFO(r.out);
  REQUIRE(r.status == 0);
  for (const auto& l : lines) CHECK(has(r.out, l));
  for (int rank : ranks) {
    CAPTURE(rank);
    CHECK(test::read_all(s.shard(rank)) == s.images[static_cast<std::size_t>(rank)]);
  }
  const auto v = ckpt_run("verify --full " + s.set());
  INFO(v.out);
  CHECK(v.status == 0);
  CHECK(has(v.out, "OK "));
  CHECK(has(v.out, std::to_string(s.m.shards.size()) + " shards"));
  CHECK(has(v.out, std::to_string(s.m.redundancy.size()) + " redundancy blocks"));
}
}  // namespace

TEST_CASE("ckpt ls of a node set lists each step with its scheme and how many more node losses it survives") {
  SavedNodeCheckpoint s(4, 4, kRs31);
  s.save_step(20);
  auto r = ckpt_run("ls " + s.set());
  INFO(r.out);
  CHECK(r.status == 0);
  check_has(r.out, {"SCHEME", "SURVIVES", "step-0000000010", "complete (latest)", "rs:3+1", "1 more node loss"});
  r = ckpt_run("ls --json " + s.set());
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto v = json_of(r.out);
  CHECK(v.at("ok").as_bool());
  const auto& list = v.at("checkpoints").as_array();
  REQUIRE(list.size() == 2);
  const auto& c = list[0].as_object();
  CHECK(c.at("name").as_string() == "step-0000000010");
  CHECK(c.at("latest").as_bool() == false);
  CHECK(list[1].at("latest").as_bool() == true);
  CHECK(c.at("nodes").as_int64() == 4);
  CHECK(c.at("redundancy").as_string() == "rs:3+1");
  CHECK(c.at("health").at("survives").as_int64() == 1);
  // The size counts the shards only; the parity blocks are counted apart, never as shards.
  std::uint64_t shards = 0, blocks = 0;
  for (const auto& sh : s.m.shards) shards += sh.size;
  for (const auto& b : s.m.redundancy) blocks += b.size;
  CHECK(c.at("bytes").to_number<std::uint64_t>() == shards);
  CHECK(c.at("redundancy_bytes").to_number<std::uint64_t>() == blocks);
  CHECK(c.at("world_size").as_int64() == 4);
}

TEST_CASE("ckpt inspect of a node set shows the layout, each shard's node, each redundancy block and the stripes") {
  SavedNodeCheckpoint s(4, 4, kRs31);
  auto r = ckpt_run("inspect " + s.set());
  INFO(r.out);
  REQUIRE(r.status == 0);
  check_has(r.out, {"nodes       4, 1 rank per node", "redundancy  rs:3+1 (survives 1 lost node)", "health      complete: survives 1 more node loss",
                    "parity-s00002-p0.rs", "DATA (NODE:PIECE)", "rank-00003-of-00004.safetensors",
                    "0:0 1:1 2:2"});  // stripe 0: piece i of node i, parity on node 3
  // The same through a node's checkpoint directory, and with the step asked for.
  CHECK(ckpt_run("inspect " + s.ckpt_dir(2).string()).out == r.out);
  CHECK(ckpt_run("inspect " + s.set() + " 10").out == r.out);
  r = ckpt_run("inspect --json " + s.set());
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto v = json_of(r.out);
  CHECK(v.at("manifest").at("nodes").at("redundancy").as_string() == "rs:3+1");
  CHECK(v.at("manifest").at("redundancy_blocks").as_array().size() == 4);
  CHECK(v.at("health").at("state").as_string() == "complete");
  CHECK(v.at("health").at("margins").as_array().size() == 4);  // one per stripe
  // A step that is not there: the typed error naming it.
  r = ckpt_run("inspect " + s.set() + " 30");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "not found"));
  CHECK(has(r.out, "step-0000000030"));
}

TEST_CASE("a lost node root: ckpt verify names the lost shard and says rs can rebuild it, repair rebuilds it byte for byte, verify is clean again") {
  SavedNodeCheckpoint s(4, 4, kRs31);
  fs::remove_all(s.root(1));
  auto r = ckpt_run("verify " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "BAD "));
  CHECK(has(r.out, "1 of 4 shards, 1 of 4 redundancy blocks and 1 of 4 manifest copies bad"));
  CHECK(has(r.out, "manifest copy on node 1: not found: " + (s.ckpt_dir(1) / "manifest.json").string()));
  CHECK(has(r.out, "shard of rank 1 on node 1: missing shard"));
  CHECK(has(r.out, s.shard(1).string()));
  CHECK(has(r.out, "parity 0 of stripe 2 on node 1"));  // stripe 2's parity lives on node (2+3)%4
  CHECK(has(r.out, "rs:3+1 can rebuild rank 1: ckpt repair " + s.set()));
  r = ckpt_run("verify --json " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  auto v = json_of(r.out);
  CHECK(v.at("ok").as_bool() == false);
  CHECK(v.at("health").at("state").as_string() == "degraded");
  CHECK(v.at("health").at("bad_ranks").as_array() == boost::json::array{1});
  CHECK(v.at("health").at("lost_ranks").as_array().empty());
  CHECK(v.at("error").at("code").as_string() == "missing_shard");
  CHECK(v.at("error").at("file").as_string() == s.shard(1).string());
  r = ckpt_run("ls " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "degraded (latest)"));
  CHECK(has(r.out, "0 more node losses"));

  check_repair(s, s.set(),
               {"rank 1 (node-1/step-0000000010/rank-00001-of-00004.safetensors) rebuilt from parity", "parity 0 of stripe 2 on node 1 re-encoded",
                "repaired step-0000000010: 2 files rebuilt", "rs:3+1 survives 1 more node loss"},
               {1});
  CHECK(fs::exists(s.root(1) / "latest"));
  CHECK(fs::exists(s.ckpt_dir(1) / "manifest.json"));
  // Nothing left to do: exit 0, and it says so.
  r = ckpt_run("repair --json " + s.set());
  INFO(r.out);
  CHECK(r.status == 0);
  v = json_of(r.out);
  CHECK(v.at("rebuilt").as_array().empty());
  CHECK(v.at("health").at("healthy").as_bool());
}

TEST_CASE("a node's missing or emptied manifest copy: verify reports it, repair restores the other nodes' bytes and removes a killed repair's temporaries") {
  SavedNodeCheckpoint s(4, 4, kRs31);
  const auto pristine = test::read_all(s.ckpt_dir(0) / "manifest.json");
  fs::remove(s.ckpt_dir(2) / "manifest.json");
  test::write_all(s.ckpt_dir(3) / "manifest.json", {});
  // What a repair killed mid-way leaves: a rebuilt file beside its name.
  const fs::path leftover = s.ckpt_dir(1) / temporary_name(s.m.shards[1].path);
  test::write_all(leftover, {1, 2, 3});
  auto r = ckpt_run("verify " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "0 of 4 shards, 0 of 4 redundancy blocks and 2 of 4 manifest copies bad"));
  CHECK(has(r.out, "manifest copy on node 2: not found: " + (s.ckpt_dir(2) / "manifest.json").string()));
  CHECK(has(r.out, "manifest copy on node 3: checksum mismatch: " + (s.ckpt_dir(3) / "manifest.json").string()));
  CHECK(has(r.out, "the other nodes' copies of the manifest restore it: ckpt repair " + s.set()));
  r = ckpt_run("ls " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "degraded (latest)"));
  r = ckpt_run("repair --verify full " + s.set());
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(has(r.out, "node 2: manifest.json restored as the copy the other nodes hold"));
  CHECK(has(r.out, "node 3: manifest.json restored as the copy the other nodes hold"));
  for (int n = 0; n < 4; ++n) CHECK(test::read_all(s.ckpt_dir(n) / "manifest.json") == pristine);
  CHECK_FALSE(fs::exists(leftover));
  r = ckpt_run("verify --full " + s.set());
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(has(r.out, "OK "));
}

TEST_CASE("ckpt repair rebuilds a bit-flipped shard and a truncated parity block found by their checksums") {
  SavedNodeCheckpoint s(4, 4, kRs31);
  auto bytes = test::read_all(s.shard(2));
  bytes[bytes.size() / 2] ^= 0x10;
  test::write_all(s.shard(2), bytes);
  fs::resize_file(s.block(3), 7);  // parity of stripe 3 (data of nodes 3, 0, 1) on node 2
  auto r = ckpt_run("verify " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "shard of rank 2 on node 2: checksum mismatch"));
  CHECK(has(r.out, "parity 0 of stripe 3 on node 2: size mismatch"));
  // A node's checkpoint directory names the same checkpoint.
  check_repair(s, s.ckpt_dir(0).string(),
               {"rank 2 (node-2/step-0000000010/rank-00002-of-00004.safetensors) rebuilt from parity", "parity 0 of stripe 3 on node 2 re-encoded"},
               {2});
}

TEST_CASE("ckpt repair rebuilds two lost nodes under rs:2+2 and one under replicate:2") {
  {
    SavedNodeCheckpoint s(8, 4, kRs22);
    fs::remove_all(s.root(0));
    fs::remove_all(s.root(3));
    check_repair(s, s.set(), {"rank 0 (", "rank 1 (", "rank 6 (", "rank 7 ("}, {0, 1, 6, 7});
  }
  {
    SavedNodeCheckpoint s(4, 4, kReplicate2);
    fs::remove_all(s.root(0));
    const auto r = ckpt_run("verify " + s.set());
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(has(r.out, "replicate:2 can rebuild rank 0"));
    check_repair(s, s.set(),
                 {"rank 0 (node-0/step-0000000010/rank-00000-of-00004.safetensors) rebuilt from its replica on node 1",
                  "replica of rank 3 on node 0 rewritten"},
                 {0});
  }
}

TEST_CASE("two lost nodes under rs:3+1: verify says rs cannot rebuild them, repair fails with the missing shard error naming the ranks and the limit and writes nothing") {
  SavedNodeCheckpoint s(4, 4, kRs31);
  fs::remove_all(s.root(1));
  fs::remove_all(s.root(2));
  const auto before = tree(s.dir.path());
  auto r = ckpt_run("verify " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "rs:3+1 cannot rebuild ranks 1, 2: it survives at most 1 lost node(s) per stripe"));
  r = ckpt_run("ls " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "lost"));
  CHECK(has(r.out, "corrupt (latest)"));
  r = ckpt_run("repair " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(r.status < 128);
  CHECK(has(r.out, "ckpt repair: missing shard"));
  CHECK(has(r.out, "rank 1 (node 1), rank 2 (node 2)"));
  CHECK(has(r.out, "beyond what rs:3+1 restores"));
  CHECK(has(r.out, "at most 1 lost node(s) per stripe"));
  CHECK(!fs::exists(s.root(1)));  // the locks it took did not leave the lost roots behind
  CHECK(!fs::exists(s.root(2)));
  auto after = tree(s.dir.path());
  std::erase_if(after, [](const auto& e) { return fs::path(e.first).filename() == ".lock"; });
  std::map<std::string, std::vector<std::uint8_t>> expected = before;
  std::erase_if(expected, [](const auto& e) { return fs::path(e.first).filename() == ".lock"; });
  CHECK(after == expected);
  r = ckpt_run("repair --json " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(json_of(r.out).at("error").at("code").as_string() == "missing_shard");
}

TEST_CASE("ckpt repair of a single root says there is nothing to rebuild without redundancy, and a busy node root is refused") {
  test::Saved plain;
  const auto before = tree(plain.dir.path());
  for (const std::string& dir : {plain.root(), plain.ckpt_dir().string()}) {
    CAPTURE(dir);
    const auto r = ckpt_run("repair " + dir);
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(has(r.out, "ckpt repair: invalid argument"));
    CHECK(has(r.out, "nothing to rebuild: a checkpoint in one root has no redundancy"));
  }
  CHECK(tree(plain.dir.path()) == before);
  CHECK(ckpt_run("repair " + (plain.dir / "nowhere").string()).status == 1);

  SavedNodeCheckpoint s(4, 4, kRs31);
  fs::remove_all(s.shard(3));
  const RootLock held(posix_file_system(), s.root(2).string());  // a writer on node 2
  auto r = ckpt_run("repair " + s.set());
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "ckpt repair: busy"));
  CHECK(has(r.out, s.root(2).string()));
  CHECK(!fs::exists(s.shard(3)));  // nothing rebuilt behind the writer's back
}

TEST_CASE("ckpt prune of a node set removes each old step on every node root and keeps the latest") {
  SavedNodeCheckpoint s(4, 4, kRs31);
  s.save_step(20);
  s.save_step(30);
  auto r = ckpt_run("prune " + s.set() + " --keep 1 --dry-run");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(has(r.out, "would remove step-0000000010"));
  for (int n = 0; n < 4; ++n) CHECK(fs::exists(s.root(n) / "step-0000000010"));
  r = ckpt_run("prune " + s.set() + " --keep 1 --json");
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto v = json_of(r.out);
  CHECK(v.at("kept").as_array().size() == 1);
  CHECK(v.at("removed").as_array().size() == 2);
  for (int n = 0; n < 4; ++n) {
    CAPTURE(n);
    CHECK(!fs::exists(s.root(n) / "step-0000000010"));
    CHECK(!fs::exists(s.root(n) / "step-0000000020"));
    CHECK(fs::exists(s.root(n) / "step-0000000030"));
    CHECK(read_latest(posix_file_system(), s.root(n).string()) == "step-0000000030");
  }
  CHECK(ckpt_run("verify " + s.set()).status == 0);
  // One node root alone is refused: it would strand the other nodes' parts.
  r = ckpt_run("prune " + s.root(0).string() + " --keep 1");
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "invalid argument"));
  CHECK(has(r.out, "one node root of the node set " + s.set()));
}

TEST_CASE("ckpt prune of a node set with a lost node root removes old steps on the others and does not make the lost root") {
  SavedNodeCheckpoint s(4, 4, kRs31);
  s.save_step(20);
  fs::remove_all(s.root(3));
  const auto r = ckpt_run("prune " + s.set() + " --keep 1");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(has(r.out, "removed  step-0000000010"));
  for (int n = 0; n < 3; ++n) {
    CAPTURE(n);
    CHECK_FALSE(fs::exists(s.root(n) / "step-0000000010"));
    CHECK(fs::exists(s.root(n) / "step-0000000020"));
  }
  CHECK_FALSE(fs::exists(s.root(3)));  // the lock prune took there did not leave it behind
}

TEST_CASE("ckpt get, diff and reshard read a node set through the reader, never taking a redundancy block for a shard") {
  SavedNodeCheckpoint s(4, 4, kRs31);
  test::Saved plain(4);  // the same fixture in one root
  const std::string out = (s.dir / "u8.npy").string();
  auto r = ckpt_run("get " + s.set() + " u8 --rank 2 --out " + out);
  INFO(r.out);
  REQUIRE(r.status == 0);
  const auto npy = test::read_all(out);
  const auto want = plain.saved(2, "u8");
  REQUIRE(npy.size() >= want.size());
  CHECK(std::memcmp(npy.data() + npy.size() - want.size(), want.data(), want.size()) == 0);
  // The same through a node's checkpoint directory: the reader finds the other nodes' shards.
  r = ckpt_run("get " + s.ckpt_dir(0).string() + " u8 --rank 2 --out " + out);
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(test::read_all(out) == npy);
  r = ckpt_run("diff " + s.ckpt_dir(1).string() + " " + plain.root());
  INFO(r.out);
  CHECK(r.status == 0);
  r = ckpt_run("diff " + s.set() + " " + plain.root());
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(has(r.out, "the checkpoints are equal"));
  // A checkpoint of one global tensor sliced over the 4 ranks, across 4 nodes: reshard and
  // consolidate see the tensor, never a parity block.
  std::vector<std::vector<std::uint8_t>> rows;
  SaveRequest sliced{.step = 10};
  for (int r = 0; r < 4; ++r) {
    rows.push_back(test::random_bytes(2 * 3 * 4, 100 + static_cast<std::uint64_t>(r)));
    RankState rs;
    rs.tensors.push_back({"w", DType::F32, {2, 3}, std::as_bytes(std::span(rows.back())), row_slice("w", 8, 3, r, 4)});
    sliced.ranks.push_back(std::move(rs));
  }
  test::TempDir sliced_dir;
  test::save_node_checkpoint(sliced_dir.path().string(), 4, kRs31, sliced);
  const std::string dst = (s.dir / "r2").string();
  r = ckpt_run("reshard " + sliced_dir.path().string() + " " + dst + " --world-size 2");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(has(r.out, "from world size 4 to 2"));
  CHECK(ckpt_run("verify --full " + dst).status == 0);
  CHECK(ckpt_run("diff " + sliced_dir.path().string() + " " + dst).status == 0);
  const std::string model = (s.dir / "model").string();
  r = ckpt_run("consolidate " + sliced_dir.path().string() + " " + model + " --json");
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(json_of(r.out).at("tensors").as_int64() == 1);
  // Into a node set or one of its node roots: refused, nothing written there.
  for (const std::string& into : {s.set(), s.root(1).string()}) {
    CAPTURE(into);
    const auto before = tree(s.dir.path() / "node-1");
    r = ckpt_run("reshard " + plain.root() + " " + into + " --world-size 2");
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(has(r.out, "reshard writes its checkpoint into one root, not across node roots"));
    CHECK(tree(s.dir.path() / "node-1") == before);
  }
  // A lost node: the reader refuses with the missing shard, which repair then rebuilds.
  fs::remove_all(s.root(3));
  r = ckpt_run("get " + s.set() + " u8 --rank 3 --out " + out);
  INFO(r.out);
  CHECK(r.status == 1);
  CHECK(has(r.out, "missing shard"));
}
