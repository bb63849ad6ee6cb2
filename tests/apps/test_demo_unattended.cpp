// SPDX-License-Identifier: Apache-2.0
// ckpt-demo as a restart loop and a cron job run it: `--resume auto`, a root a crash left
// without a committed checkpoint, and runs whose saves all fail.
#include <doctest/doctest.h>

#include <unistd.h>

#include <boost/json.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
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

TEST_CASE("ckpt-demo on a full root trains on, counts the failed saves in its metrics, and exits 4 with a last line saying so") {
  ckpt::test::TempDir dir;
  const ckpt::test::SmallTmpfs full(dir, "size=64k");
  const std::string& mnt = full.path();
  int status = -1;
  const std::string metrics = (dir / "m.jsonl").string();
  const auto out = demo("--steps 30 --save-every 10 --dir " + mnt + "/root --metrics " + metrics, status);
  CHECK(status == 4);
  // The last line names the first failed step and the last error.
  const auto last = out.substr(out.rfind('\n', out.size() - 2) + 1);
  CHECK(last.find("ckpt-demo: no checkpoint committed since the save of step 10 failed (3 failed saves; latest none; the last error: no space left: ") == 0);
  CHECK(last.find("): exit status 4\n") != std::string::npos);
  // Each failure was logged with its count.
  CHECK(has(out, "save of step 30 failed (3 in a row since the last commit): no space left"));
  // Training went on to the last step; the metrics count the failures in a row.
  const auto bytes = ckpt::test::read_all(metrics);
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::string line;
  std::int64_t last_step = 0, max_count = 0;
  while (std::getline(in, line)) {
    const auto v = boost::json::parse(line).as_object();
    last_step = v.at("step").as_int64();
    max_count = std::max<std::int64_t>(max_count, v.at("consecutive_save_failures").as_int64());
    if (last_step < 10) CHECK(v.at("consecutive_save_failures").as_int64() == 0);
  }
  CHECK(last_step == 30);
  CHECK(max_count >= 2);
}

TEST_CASE("ckpt-demo --max-consecutive-failures 2 on a full root stops at the save after the second failure and exits 4") {
  ckpt::test::TempDir dir;
  const ckpt::test::SmallTmpfs full(dir, "size=64k");
  const std::string& mnt = full.path();
  int status = -1;
  const std::string metrics = (dir / "m.jsonl").string();
  const auto out = demo("--steps 30 --save-every 5 --max-consecutive-failures 2 --dir " + mnt + "/root --metrics " + metrics, status);
  CAPTURE(out);
  CHECK(status == 4);
  const auto last = out.substr(out.rfind('\n', out.size() - 2) + 1);
  CHECK(last.find("ckpt-demo: no checkpoint committed since the save of step 5 failed (2 failed saves; latest none; the last error: no space left: ") == 0);
  // Steps 5 and 10 failed; the save of step 15 was refused and training stopped there.
  const auto bytes = ckpt::test::read_all(metrics);
  std::istringstream in(std::string(bytes.begin(), bytes.end()));
  std::string line;
  boost::json::object final_row;
  while (std::getline(in, line)) final_row = boost::json::parse(line).as_object();
  CHECK(final_row.at("step").as_int64() == 15);
  CHECK(final_row.at("event").as_string() == "stopped: the saves of 2 checkpoints in a row failed (--max-consecutive-failures)");
  CHECK(final_row.at("consecutive_save_failures").as_int64() == 2);
}

TEST_CASE("ckpt-demo --help documents --resume auto and the exit statuses") {
  int status = -1;
  const auto out = demo("--help", status);
  CHECK(status == 0);
  CHECK(has(out, "--resume [auto]"));
  CHECK(has(out, "Exit status:\n  0  every check passed\n  1  a check failed, or an error stopped the run\n  2  usage error\n  4  saves failed"));
}
