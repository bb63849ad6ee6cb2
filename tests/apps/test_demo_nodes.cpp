// SPDX-License-Identifier: Apache-2.0
// ckpt-demo across node roots (--nodes, --redundancy), run as a user would: a node's root is
// lost (deleted, or a shard damaged) between the run and its resume.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "support/test_support.hpp"

namespace fs = std::filesystem;

namespace {
const std::string kBin = std::string(CKPT_TEST_BINARY_DIR) + "/bin/";

std::string run(const std::string& cmd, int& status) { return ckpt::test::run_command(cmd + " 2>&1", &status); }

// step -> "loss_hex grad_norm param_norm" from a --metrics file.
std::map<std::int64_t, std::string> trajectory(const fs::path& path) {
  std::map<std::int64_t, std::string> out;
  const auto b = ckpt::test::read_all(path);
  std::istringstream in(std::string(b.begin(), b.end()));
  std::string line;
  while (std::getline(in, line)) {
    const auto v = boost::json::parse(line).as_object();
    out[v.at("step").as_int64()] = std::string(v.at("loss_hex").as_string()) + " " + boost::json::serialize(v.at("grad_norm")) + " " +
                                   boost::json::serialize(v.at("param_norm"));
  }
  return out;
}

// The uninterrupted 20-step run every resumed one must match (computed once per process).
const std::map<std::int64_t, std::string>& reference() {
  static const auto ref = [] {
    ckpt::test::TempDir dir;
    int status = 0;
    run(kBin + "ckpt-demo --steps 20 --nodes 4 --redundancy rs:3+1 --dir " + (dir / "ref").string() + " --metrics " + (dir / "ref.jsonl").string(),
        status);
    REQUIRE(status == 0);
    return trajectory(dir / "ref.jsonl");
  }();
  return ref;
}

void check_resumed_matches(const fs::path& metrics) {
  const auto resumed = trajectory(metrics);
  REQUIRE(resumed.size() == 10);
  for (const auto& [step, line] : resumed) {
    CAPTURE(step);
    CHECK(reference().at(step) == line);
  }
}

std::string node(const fs::path& dir, int n) { return (dir / ("node-" + std::to_string(n))).string(); }
const std::string kStep10 = "step-0000000010";
std::string shard(int rank) { return "rank-0000" + std::to_string(rank) + "-of-00004.safetensors"; }
}  // namespace

TEST_CASE("ckpt-demo --nodes 4 --redundancy rs:3+1: a deleted node root is rebuilt from parity on resume, byte for byte, and training continues bit-exactly") {
  ckpt::test::TempDir dir;
  const fs::path root = dir / "run";
  int status = 0;
  auto out = run(kBin + "ckpt-demo --nodes 4 --redundancy rs:3+1 --steps 10 --dir " + root.string(), status);
  REQUIRE(status == 0);
  // Node n holds its rank's shard, the manifest, and the parity of stripe (n + 1) % 4.
  for (int n = 0; n < 4; ++n) {
    CAPTURE(n);
    CHECK(fs::exists(fs::path(node(root, n)) / kStep10 / shard(n)));
    CHECK(fs::exists(fs::path(node(root, n)) / kStep10 / "manifest.json"));
    CHECK(fs::exists(fs::path(node(root, n)) / kStep10 / ("parity-s0000" + std::to_string((n + 1) % 4) + "-p0.rs")));
  }
  const auto original = ckpt::test::read_all(fs::path(node(root, 1)) / kStep10 / shard(1));
  const auto original_parity = ckpt::test::read_all(fs::path(node(root, 1)) / kStep10 / "parity-s00002-p0.rs");
  fs::remove_all(node(root, 1));
  out = run(kBin + "ckpt-demo --nodes 4 --redundancy rs:3+1 --resume --steps 20 --dir " + root.string() + " --metrics " + (dir / "c.jsonl").string(),
            status);
  CHECK(status == 0);
  CHECK(out.find("step-0000000010: rank 1 (node-1/step-0000000010/rank-00001-of-00004.safetensors) rebuilt from parity: stripe 0 (data of nodes 0, 2, parity on nodes 3)") !=
        std::string::npos);
  CHECK(out.find("parity 0 of stripe 2 on node 1 re-encoded from the stripe's data") != std::string::npos);
  CHECK(out.find("resumed from step 10") != std::string::npos);
  CHECK(out.find("(i) lost shards rebuilt bit-exactly      PASS: 2 file(s) of step-0000000010 rebuilt (1 shard(s)), each equal to the manifest's SHA-256; "
                 "afterwards every shard and block verifies") != std::string::npos);
  CHECK(ckpt::test::read_all(fs::path(node(root, 1)) / kStep10 / shard(1)) == original);
  CHECK(ckpt::test::read_all(fs::path(node(root, 1)) / kStep10 / "parity-s00002-p0.rs") == original_parity);
  check_resumed_matches(dir / "c.jsonl");
  // The run saved step 20 across the four node roots again; the tool verifies it.
  run(kBin + "ckpt verify --full " + node(root, 2) + "/step-0000000020", status);
  CHECK(status == 0);
}

TEST_CASE("ckpt-demo --nodes 4 --redundancy rs:2+2: every pattern of one or two lost node roots is rebuilt and the resume is bit-exact") {
  ckpt::test::TempDir dir;
  const fs::path saved = dir / "saved";
  int status = 0;
  run(kBin + "ckpt-demo --nodes 4 --redundancy rs:2+2 --steps 10 --dir " + saved.string(), status);
  REQUIRE(status == 0);
  std::vector<std::vector<int>> patterns;
  for (int a = 0; a < 4; ++a) {
    patterns.push_back({a});
    for (int b = a + 1; b < 4; ++b) patterns.push_back({a, b});
  }
  for (const auto& lost : patterns) {
    std::string name;
    for (int n : lost) name += std::to_string(n);
    CAPTURE(name);
    const fs::path root = dir / ("lost-" + name);
    fs::copy(saved, root, fs::copy_options::recursive);
    for (int n : lost) fs::remove_all(node(root, n));
    const fs::path metrics = dir / ("m-" + name + ".jsonl");
    const auto out = run(kBin + "ckpt-demo --nodes 4 --redundancy rs:2+2 --resume --steps 20 --dir " + root.string() + " --metrics " + metrics.string(),
                         status);
    CHECK(status == 0);
    for (int n : lost) CHECK(out.find("rank " + std::to_string(n) + " (node-" + std::to_string(n) + "/step-0000000010/") != std::string::npos);
    for (int n : lost) CHECK(ckpt::test::read_all(fs::path(node(root, n)) / kStep10 / shard(n)) == ckpt::test::read_all(fs::path(node(saved, n)) / kStep10 / shard(n)));
    // The reference is rs:3+1's run: the scheme changes where bytes go, not the training.
    check_resumed_matches(metrics);
  }
}

TEST_CASE("ckpt-demo --nodes 4 --redundancy replicate:2: a bit-flipped and a truncated shard are rebuilt from their replicas, and the resume is bit-exact") {
  ckpt::test::TempDir dir;
  const fs::path root = dir / "run";
  int status = 0;
  run(kBin + "ckpt-demo --nodes 4 --redundancy replicate:2 --steps 10 --dir " + root.string(), status);
  REQUIRE(status == 0);
  // Node n's shard is copied to node n + 1.
  const fs::path copy_of_2 = fs::path(node(root, 3)) / kStep10 / "replica-rank-00002-of-00004.safetensors";
  REQUIRE(fs::exists(copy_of_2));
  const auto original = ckpt::test::read_all(fs::path(node(root, 2)) / kStep10 / shard(2));
  CHECK(ckpt::test::read_all(copy_of_2) == original);
  {
    std::fstream f(fs::path(node(root, 2)) / kStep10 / shard(2), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    f.put('\x5a');
  }
  fs::resize_file(fs::path(node(root, 0)) / kStep10 / shard(0), 100);
  const auto out = run(kBin + "ckpt-demo --nodes 4 --redundancy replicate:2 --resume --steps 20 --dir " + root.string() + " --metrics " +
                           (dir / "c.jsonl").string(),
                       status);
  CHECK(status == 0);
  CHECK(out.find("shard of rank 2 on node 2 is bad: checksum mismatch") != std::string::npos);
  CHECK(out.find("rank 2 (node-2/step-0000000010/rank-00002-of-00004.safetensors) rebuilt from its replica on node 3") != std::string::npos);
  CHECK(out.find("rank 0 (node-0/step-0000000010/rank-00000-of-00004.safetensors) rebuilt from its replica on node 1") != std::string::npos);
  CHECK(ckpt::test::read_all(fs::path(node(root, 2)) / kStep10 / shard(2)) == original);
  check_resumed_matches(dir / "c.jsonl");
}

TEST_CASE("ckpt-demo --nodes: more lost nodes than the scheme survives are refused naming the lost shards and the limit, or the resume falls back to the durable tier") {
  ckpt::test::TempDir dir;
  const fs::path root = dir / "run", durable = dir / "durable";
  int status = 0;
  run(kBin + "ckpt-demo --nodes 4 --redundancy rs:3+1 --steps 10 --dir " + root.string() + " --durable-dir " + durable.string(), status);
  REQUIRE(status == 0);
  const fs::path spare = dir / "spare";
  fs::copy(root, spare, fs::copy_options::recursive);
  fs::remove_all(node(root, 1));
  fs::remove_all(node(root, 2));
  const auto survivor = ckpt::test::read_all(fs::path(node(root, 0)) / kStep10 / shard(0));
  // Without the durable tier: refused, nothing written.
  auto out = run(kBin + "ckpt-demo --nodes 4 --redundancy rs:3+1 --resume --steps 20 --dir " + root.string(), status);
  CHECK(status == 1);
  CHECK(out.find("missing shard: " + node(root, 0) + "/step-0000000010: checkpoint step-0000000010 cannot be rebuilt: shards of rank 1 (node 1), rank 2 (node 2) are lost "
                 "beyond what rs:3+1 restores: expected at most 1 lost node(s) per stripe, actual 2 bad shard(s): ranks 1, 2") != std::string::npos);
  CHECK(!fs::exists(fs::path(node(root, 1)) / kStep10));
  CHECK(ckpt::test::read_all(fs::path(node(root, 0)) / kStep10 / shard(0)) == survivor);
  // With it: the resume continues from the durable copy, bit-exactly.
  fs::remove_all(root);
  fs::copy(spare, root, fs::copy_options::recursive);
  fs::remove_all(node(root, 1));
  fs::remove_all(node(root, 2));
  out = run(kBin + "ckpt-demo --nodes 4 --redundancy rs:3+1 --resume --steps 20 --dir " + root.string() + " --durable-dir " + durable.string() + " --metrics " +
                (dir / "c.jsonl").string(),
            status);
  CHECK(status == 0);
  CHECK(out.find("the resume falls back to the durable tier " + durable.string()) != std::string::npos);
  CHECK(out.find("resumed from step 10, from the durable tier (local tier passed over: missing shard: ") != std::string::npos);
  check_resumed_matches(dir / "c.jsonl");
}

TEST_CASE("ckpt-demo --resume auto on node roots a crash left with a step renamed into place everywhere but no latest resumes from it instead of starting fresh") {
  ckpt::test::TempDir dir;
  const fs::path root = dir / "run";
  int status = 0;
  run(kBin + "ckpt-demo --nodes 2 --steps 10 --dir " + root.string(), status);
  REQUIRE(status == 0);
  // A crash after both renames, before the first `latest`: committed, though nothing names it.
  for (int n = 0; n < 2; ++n) fs::remove(fs::path(node(root, n)) / "latest");
  const auto out = run(kBin + "ckpt-demo --nodes 2 --resume auto --dir " + root.string() + " --metrics " + (dir / "c.jsonl").string(), status);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("resume auto: resuming from " + root.string() + "/node-*/step-0000000010 (renamed into place on every node root, no latest names it yet)\n") !=
        std::string::npos);
  CHECK(out.find("resumed from step 10") != std::string::npos);
  check_resumed_matches(dir / "c.jsonl");
}

TEST_CASE("ckpt-demo refuses a node layout that cannot hold the ranks, with exit 2 and the reason") {
  int status = 0;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--nodes 3", "--nodes 3 must divide the world size 4"},
      {"--nodes 4 --redundancy rs:4+1", "rs:4+1 needs at least K + M = 5 nodes (got 4)"},
      {"--nodes 2 --redundancy replicate:3", "replicate:3 needs at least 3 nodes (got 2)"},
      {"--nodes 4 --redundancy replicate:2/4", "replicate:2/4 puts two copies on one node with 4 nodes"},
      {"--nodes 4 --redundancy raid5", "--redundancy: expected none, replicate:F, replicate:F/J or rs:K+M, got 'raid5'"},
      {"--redundancy rs:3+1", "--redundancy requires --nodes"},
  };
  for (const auto& [args, message] : bad) {
    CAPTURE(args);
    const auto out = run(kBin + "ckpt-demo " + args, status);
    CHECK(status == 2);
    CHECK(out.find(message) != std::string::npos);
  }
}
