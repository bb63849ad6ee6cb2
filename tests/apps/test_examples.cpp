// The example programs, run as a user would: their command lines follow the same conventions
// as the tools (help, --version, exit 2 on a usage error) and write nowhere they were not told.
#include <doctest/doctest.h>

#include <filesystem>

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
