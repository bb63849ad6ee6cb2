// SPDX-License-Identifier: Apache-2.0
// The example programs, run as a user would: their command lines follow the same conventions
// as the tools (help, --version, exit 2 on a usage error) and write nowhere they were not told;
// what they save says what every tensor is, so ckpt reshard and consolidate work on it.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>

#include "ckpt/ckpt.hpp"
#include "cli.hpp"
#include "support/test_support.hpp"

namespace fs = std::filesystem;

namespace {
const std::string kBin = std::string(CKPT_TEST_BINARY_DIR) + "/bin/";

// Runs `cmd` with `cwd` as its working directory, stderr merged.
std::string run_in(const fs::path& cwd, const std::string& cmd, int& status) {
  return ckpt::test::run_command("cd '" + cwd.string() + "' && " + cmd + " 2>&1", &status);
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}
}  // namespace

TEST_CASE("ckpt-training-loop --help and ckpt-quickstart --help print help, exit 0 and create nothing") {
  for (const char* prog : {"ckpt-training-loop", "ckpt-quickstart"}) {
    CAPTURE(prog);
    ckpt::test::TempDir cwd;
    for (const char* help : {"--help", "-h"}) {
      int status = -1;
      const auto out = run_in(cwd.path(), kBin + prog + " " + help, status);
      CHECK(status == 0);
      CHECK(out.find(std::string("usage: ") + prog) == 0);
      CHECK(out.find("--dir") != std::string::npos);
    }
    CHECK(entries(cwd.path()).empty());  // no directory named --help, nothing else either
  }
}

TEST_CASE("the examples print their version and refuse a wrong flag with exit 2 naming it, creating nothing") {
  for (const char* prog : {"ckpt-training-loop", "ckpt-quickstart"}) {
    CAPTURE(prog);
    ckpt::test::TempDir cwd;
    int status = -1;
    auto out = run_in(cwd.path(), kBin + prog + " --version", status);
    CHECK(status == 0);
    CHECK(out == std::string(prog) + " " + std::string(ckpt::cli::version()) + "\n");
    out = run_in(cwd.path(), kBin + prog + " --frobnicate", status);
    CHECK(status == 2);
    CHECK(out.find("--frobnicate") != std::string::npos);
    CHECK(entries(cwd.path()).empty());
  }
  ckpt::test::TempDir cwd;
  int status = -1;
  const auto out = run_in(cwd.path(), kBin + "ckpt-training-loop --steps 0", status);
  CHECK(status == 2);
  CHECK(out.find("--steps") != std::string::npos);
  CHECK(entries(cwd.path()).empty());
}

TEST_CASE("ckpt-training-loop takes its root, steps and cadence as options or positionally") {
  ckpt::test::TempDir dir;
  int status = -1;
  auto out = run_in(dir.path(), kBin + "ckpt-training-loop --dir " + (dir / "a").string() + " --steps 6 --every 3", status);
  CHECK(status == 0);
  CHECK(out.find("6 steps, saved every 3: 2 commits per rank, 0 failures") != std::string::npos);
  CHECK(fs::exists(dir / "a" / "step-0000000006"));
  out = run_in(dir.path(), kBin + "ckpt-training-loop " + (dir / "b").string() + " 4 2", status);
  CHECK(status == 0);
  CHECK(out.find("4 steps, saved every 2: 2 commits per rank, 0 failures") != std::string::npos);
  CHECK(fs::exists(dir / "b" / "step-0000000004"));
}

TEST_CASE("ckpt-quickstart --dir keeps the checkpoint it verified where it was told") {
  ckpt::test::TempDir dir;
  int status = -1;
  const auto out = run_in(dir.path(), kBin + "ckpt-quickstart --dir " + (dir / "q").string(), status);
  CHECK(status == 0);
  CHECK(out.find("quickstart verified") != std::string::npos);
  CHECK(fs::exists(dir / "q" / "step-0000000010" / "manifest.json"));
  CHECK(entries(dir.path()) == std::vector<std::string>{"q"});
}

namespace {
// Every tensor of the checkpoint at `dir` carries a sharding description (slice, replicated
// or rank_local): what ckpt reshard and consolidate need to place it at any world size.
void check_described(const fs::path& dir) {
  const auto reader = ckpt::CheckpointReader::open(ckpt::posix_file_system(), dir.string());
  for (const auto& t : reader.manifest().tensors) {
    CAPTURE(t.name);
    CAPTURE(t.rank);
    CHECK(t.sharding.has_value());
  }
}

// ckpt reshard to 3 ranks, consolidate and diff of the example's checkpoint under `root`.
void check_reshard_and_consolidate(const fs::path& root, const fs::path& scratch) {
  const std::string tool = kBin + "ckpt ";
  int status = -1;
  auto out = ckpt::test::run_command(tool + "reshard " + root.string() + " " + (scratch / "at3").string() + " --world-size 3 2>&1", &status);
  INFO(out);
  CHECK(status == 0);
  out = ckpt::test::run_command(tool + "diff " + root.string() + " " + (scratch / "at3").string() + " 2>&1", &status);
  CHECK(status == 0);  // the same global tensors at 3 ranks
  CHECK(out.find("the checkpoints are equal") != std::string::npos);
  out = ckpt::test::run_command(tool + "reshard " + (scratch / "at3").string() + " " + (scratch / "back").string() + " --world-size 4 2>&1", &status);
  CHECK(status == 0);
  out = ckpt::test::run_command(tool + "consolidate " + root.string() + " " + (scratch / "model").string() + " 2>&1", &status);
  CHECK(status == 0);
  CHECK(fs::exists(scratch / "model" / "model.safetensors"));
}
}  // namespace

TEST_CASE("the quick-start checkpoint describes every tensor (the step counter replicated), so ckpt reshard and consolidate work on it") {
  ckpt::test::TempDir dir;
  int status = -1;
  run_in(dir.path(), kBin + "ckpt-quickstart --dir " + (dir / "q").string(), status);
  REQUIRE(status == 0);
  const auto ckpt_dir = dir / "q" / "step-0000000010";
  check_described(ckpt_dir);
  const auto reader = ckpt::CheckpointReader::open(ckpt::posix_file_system(), ckpt_dir.string());
  const ckpt::TensorRecord* step = reader.manifest().find_tensor("step", 0);
  REQUIRE(step);
  CHECK(step->sharding == ckpt::replicated({0, 1, 2, 3}));
  CHECK(reader.manifest().find_tensor("step", 1) == nullptr);  // written once, by rank 0
  check_reshard_and_consolidate(dir / "q", dir.path());
  // The step counter, at 3 ranks, is still replicated and still 10.
  const auto at3 = ckpt::open_latest(ckpt::posix_file_system(), (dir / "at3").string()).reader;
  const auto counter = at3.read_tensor("step", 0);
  std::int64_t value = 0;
  REQUIRE(counter.size() == sizeof value);
  std::memcpy(&value, counter.data(), sizeof value);
  CHECK(value == 10);
  CHECK(at3.manifest().find_tensor("step", 0)->sharding == ckpt::replicated({0, 1, 2}));
}

TEST_CASE("the training-loop example's checkpoint describes its tensors, so ckpt reshard and consolidate work on it") {
  ckpt::test::TempDir dir;
  int status = -1;
  run_in(dir.path(), kBin + "ckpt-training-loop --dir " + (dir / "loop").string() + " --steps 4 --every 2", status);
  REQUIRE(status == 0);
  check_described(dir / "loop" / "step-0000000004");
  check_reshard_and_consolidate(dir / "loop", dir.path());
}
