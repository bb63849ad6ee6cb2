// ckpt-demo as a restart loop and a cron job run it: `--resume auto`, a root a crash left
// without a committed checkpoint, and runs whose saves all fail.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "support/test_support.hpp"

namespace fs = std::filesystem;

namespace {
const std::string kDemo = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt-demo";

std::string demo(const std::string& args, int& status) { return ckpt::test::run_command(kDemo + " " + args + " 2>&1", &status); }
bool has(const std::string& out, const std::string& what) { return out.find(what) != std::string::npos; }
}  // namespace

TEST_CASE("ckpt-demo --resume auto starts fresh on a root a crash left without latest, then resumes what it committed") {
  ckpt::test::TempDir dir;
  const std::string root = (dir.path() / "run").string();
  int status = -1;
  demo("--steps 10 --save-every 10 --dir " + root, status);
  REQUIRE(status == 0);
  // A crash between the first checkpoint's rename and its `latest`: a complete step-10 that
  // was never committed.
  fs::remove(dir.path() / "run" / "latest");
  REQUIRE(fs::exists(dir.path() / "run" / "step-0000000010"));
  auto out = demo("--resume --dir " + root, status);
  CHECK(status == 1);  // an explicit --resume still wants a checkpoint
  CHECK(has(out, "nothing committed yet"));
  // The checkpointer, started before the resume, took the uncommitted step-10 away.
  CHECK(has(out, "removing " + root + "/step-0000000010: never committed"));
  CHECK_FALSE(fs::exists(dir.path() / "run" / "step-0000000010"));
  out = demo("--steps 12 --save-every 5 --resume auto --dir " + root, status);
  CHECK(status == 0);
  CHECK(has(out, "resume auto: no committed checkpoint in " + root + ": starting fresh\n"));
  CHECK(has(out, "resume verified"));
  CHECK(fs::exists(dir.path() / "run" / "step-0000000010"));  // saved again by this run, and committed
  out = demo("--resume auto --save-every 5 --dir " + root, status);
  CHECK(status == 0);
  CHECK(has(out, "resume auto: resuming from the checkpoint " + root + "/latest names\n"));
  CHECK(has(out, "resumed from step 10"));
  // A fresh run on a root with a committed checkpoint is still refused (usage error).
  out = demo("--dir " + root, status);
  CHECK(status == 2);
  CHECK(has(out, "already holds committed checkpoints: pass --resume (or --resume auto)"));
}

TEST_CASE("ckpt-demo without --resume takes a root that holds only uncommitted step directories as an empty root") {
  ckpt::test::TempDir dir;
  const std::string root = (dir.path() / "run").string();
  fs::create_directories(dir.path() / "run" / "step-0000000030");
  int status = -1;
  const auto out = demo("--steps 10 --save-every 5 --dir " + root, status);
  CHECK(status == 0);
  CHECK(has(out, "removing " + root + "/step-0000000030: never committed (no latest: the root holds no committed checkpoint)"));
  CHECK_FALSE(fs::exists(dir.path() / "run" / "step-0000000030"));
  CHECK(fs::exists(dir.path() / "run" / "step-0000000010"));
}
