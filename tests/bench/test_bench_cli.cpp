// SPDX-License-Identifier: Apache-2.0
// The other benchmark programs and the torture driver parse their command line as every ckpt
// program does (apps/common/cli.hpp): --version and --help exit 0, and a malformed value, a
// missing or unknown option is a usage error (exit 2) whose message names the option and the
// form expected, before anything runs.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "cli.hpp"
#include "support/test_support.hpp"

namespace fs = std::filesystem;

namespace {
std::string bin(const std::string& name) { return std::string(CKPT_TEST_BINARY_DIR) + "/bin/" + name; }
}  // namespace

TEST_CASE("every benchmark program and the torture driver answer --version and --help with exit 0") {
  int checked = 0;
  for (const std::string name : {"ckpt-redundancy-bench", "ckpt-recovery-bench", "ckpt-object-store-bench", "ckpt-torture"}) {
    if (!fs::exists(bin(name))) continue;  // ckpt-object-store-bench: only with the S3 client
    CAPTURE(name);
    int status = -1;
    CHECK(ckpt::test::run_command(bin(name) + " --version", &status) == name + " " + std::string(ckpt::cli::version()) + "\n");
    CHECK(status == 0);
    const std::string help = ckpt::test::run_command(bin(name) + " --help", &status);
    CHECK(status == 0);
    CHECK(help.find("usage: " + name) == 0);
    ++checked;
  }
  CHECK(checked >= 3);
}

TEST_CASE("a malformed or missing value is a usage error naming the option and the form expected, and nothing runs") {
  ckpt::test::TempDir dir{"ckpt-bench-cli"};
  const std::string d = dir.path().string() + "/run";
  struct Case {
    std::string program, args, message;
  };
  const std::vector<Case> cases = {
      {"ckpt-redundancy-bench", "--dir " + d + " --rounds abc", "--rounds: expected an integer from 1 to 1048576, got 'abc'"},
      {"ckpt-redundancy-bench", "--dir " + d + " --size 10", "--size must be at least 1M (1048576 bytes), got 10"},
      {"ckpt-redundancy-bench", "--dir " + d + " --size 1.5Q", "'1.5Q' is not a size"},
      {"ckpt-redundancy-bench", "--dir " + d + " --no-such-flag", "--no-such-flag"},
      {"ckpt-recovery-bench", "--dir " + d + " --kills many", "--kills: expected an integer from 0 to 1000000000, got 'many'"},
      {"ckpt-recovery-bench", "--dir " + d + " --step-ms -3", "--step-ms: expected a number from 0 to 1000000000, got '-3'"},
      {"ckpt-torture", "run", "--dir is required"},
      {"ckpt-torture", "fly --dir " + d, "mode: fly not in {run,victim}"},
      {"ckpt-torture", "run --dir " + d + " --kills 0", "--kills: expected an integer from 1 to 1000000, got '0'"},
      {"ckpt-torture", "run --dir " + d + " --redundancy rs:9", "--redundancy: expected rs:K+M or replicate:F, got 'rs:9'"},
      {"ckpt-torture", "run --dir " + d + " --writer tape", "--writer"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.program);
    CAPTURE(c.args);
    int status = -1;
    const std::string out = ckpt::test::run_command(bin(c.program) + " " + c.args + " 2>&1", &status);
    CHECK(status == 2);
    CHECK(out.find(c.message) != std::string::npos);
    CHECK(out.find("run '" + c.program + " --help' for usage") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(d));
}
