// ckpt-demo with an s3:// durable tier on the real RGW: the local root deleted after the
// first half of a run, `--resume` rehydrates it from the object store and continues exactly
// as the uninterrupted run. Skipped where the demo is not built (CKPT_BUILD_APPS=OFF).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "objstore/rgw_fixture.hpp"
#include "support/test_support.hpp"

namespace {

const std::string kDemo = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt-demo";

// The loss table's rows of steps `first`..`last`, without the step-time column.
std::vector<std::string> rows(const std::string& out, int first, int last) {
  std::vector<std::string> got;
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) {
    std::istringstream f(l);
    int step = 0;
    std::string loss, grad, norm, lr;
    if (!(f >> step >> loss >> grad >> norm >> lr) || step < first || step > last || loss.find('.') == std::string::npos) continue;
    got.push_back(std::to_string(step) + " " + loss + " " + grad + " " + norm + " " + lr);
  }
  return got;
}

}  // namespace

TEST_CASE("ckpt-demo with an s3 durable tier, its local root deleted, resumes from the object store bit for bit") {
  if (!std::filesystem::exists(kDemo)) {
    MESSAGE("skipped: " << kDemo << " is not built (CKPT_BUILD_APPS=OFF)");
    std::exit(77);
  }
  ckpt::test::TempDir dir;
  const std::string s3 = "s3://" + ckpt::test::rgw_env()["CKPT_S3_BUCKET"] + "/" + ckpt::test::unique_prefix("demo");
  const auto [full_rc, full] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "full").string());
  REQUIRE(full_rc == 0);
  const auto [half_rc, half] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "local").string() + " --durable-dir " + s3 + " --steps 10");
  REQUIRE(half_rc == 0);
  CHECK(half.find("(h) both tiers hold the checkpoints      PASS") != std::string::npos);
  std::filesystem::remove_all(dir / "local");
  const auto [rc, resumed] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "local").string() + " --durable-dir " + s3 + " --resume");
  INFO(resumed);
  REQUIRE(rc == 0);
  CHECK(resumed.find("resume: restored step-0000000010 from " + s3 + "/step-0000000010 into") != std::string::npos);
  CHECK(resumed.find("resumed from step 10, from the local tier (restored from " + s3 + ")\n") != std::string::npos);
  CHECK(resumed.find("(h) both tiers hold the checkpoints      PASS") != std::string::npos);
  const auto expect = rows(full, 11, 20);
  CHECK(expect.size() == 10);
  CHECK(rows(resumed, 11, 20) == expect);
}
