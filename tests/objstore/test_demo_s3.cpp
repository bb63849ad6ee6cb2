// SPDX-License-Identifier: Apache-2.0
// ckpt-demo with an s3:// durable tier on the real RGW: the local root deleted after the
// first half of a run, `--resume --adopt-run` rehydrates it from the object store and
// continues exactly as the uninterrupted run (without --adopt-run the new root refuses the
// store's run); `--resume auto` never starts fresh over a missing bucket or over committed
// steps no `latest` names; a store that stops answering (a proxy that stalls like a stopped
// radosgw) ends the run at --durable-drain-deadline or at a SIGTERM, exit status 5. Skipped
// where the demo is not built (CKPT_BUILD_APPS=OFF).
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <fstream>
#include <map>

#include <cstdio>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/store/run_identity.hpp"
#include "ckpt/objstore/s3.hpp"
#include "objstore/rgw_fixture.hpp"
#include "objstore/stall_proxy.hpp"
#include "support/test_support.hpp"

namespace {

namespace fs = std::filesystem;
using ckpt::test::has;

// How much slower the demo runs here: ~20x under ThreadSanitizer, ~3x under ASan.
#if defined(__SANITIZE_THREAD__)
constexpr double kSlowdown = 20;
#elif defined(__SANITIZE_ADDRESS__)
constexpr double kSlowdown = 3;
#else
constexpr double kSlowdown = 1;
#endif

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

TEST_CASE("ckpt-demo with an s3 durable tier, its local root deleted, resumes with --adopt-run from the object store bit for bit") {
  const std::string kDemo = ckpt::test::demo_program();
  ckpt::test::TempDir dir;
  const std::string s3 = "s3://" + ckpt::test::rgw_env()["CKPT_S3_BUCKET"] + "/" + ckpt::test::unique_prefix("demo");
  const auto [full_rc, full] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "full").string());
  REQUIRE(full_rc == 0);
  const auto [half_rc, half] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "local").string() + " --durable-dir " + s3 + " --steps 10");
  REQUIRE(half_rc == 0);
  CHECK(has(half, "(h) both tiers hold the checkpoints      PASS"));
  CHECK(ckpt::test::last_line(half) == "durable tier: yes, " + s3 + " holds step-0000000010");
  const auto run = ckpt::read_run_identity(ckpt::posix_file_system(), (dir / "local").string());
  REQUIRE(run.has_value());
  fs::remove_all(dir / "local");
  const auto [rc, resumed] =
      ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "local").string() + " --durable-dir " + s3 + " --resume --adopt-run");
  INFO(resumed);
  REQUIRE(rc == 0);
  CHECK(has(resumed, "resume: restored step-0000000010 from " + s3 + "/step-0000000010 into " + (dir / "local").string() + ", adopting run " + *run));
  CHECK(has(resumed, "resumed from step 10, from the local tier (restored from " + s3 + ")\n"));
  CHECK(has(resumed, "(h) both tiers hold the checkpoints      PASS"));
  CHECK(ckpt::read_run_identity(ckpt::posix_file_system(), (dir / "local").string()) == run);
  const auto expect = rows(full, 11, 20);
  CHECK(expect.size() == 10);
  CHECK(rows(resumed, 11, 20) == expect);
}

TEST_CASE("ckpt-demo --resume into a new local root refuses the object store's checkpoint of a recorded run without --adopt-run, naming it, and restores nothing") {
  const std::string kDemo = ckpt::test::demo_program();
  ckpt::test::TempDir dir;
  const std::string s3 = "s3://" + ckpt::test::rgw_env()["CKPT_S3_BUCKET"] + "/" + ckpt::test::unique_prefix("demo-foreign");
  const auto [first_rc, first] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "a").string() + " --durable-dir " + s3 + " --steps 10");
  REQUIRE(first_rc == 0);
  const auto run = ckpt::read_run_identity(ckpt::posix_file_system(), (dir / "a").string());
  REQUIRE(run.has_value());
  const auto [rc, out] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "b").string() + " --durable-dir " + s3 + " --resume");
  INFO(out);
  CHECK(rc == 1);
  CHECK(has(out, "ckpt-demo: conflict: " + s3 + "/step-0000000010/manifest.json: step-0000000010 was committed by run " + *run + "; the local root " +
                     (dir / "b").string() + " has no run of its own (a new root): resume with adopt_run (ckpt-demo --adopt-run) to continue run " +
                     *run + " here: expected a run of the local root, actual run " + *run));
  CHECK(!fs::exists(dir / "b" / "latest"));
  CHECK(!fs::exists(dir / "b" / "step-0000000010"));
}

TEST_CASE("ckpt-demo --resume auto with an s3 durable tier whose bucket does not exist fails naming the bucket instead of starting fresh") {
  const std::string kDemo = ckpt::test::demo_program();
  ckpt::test::TempDir dir;
  const auto [rc, out] =
      ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "a").string() + " --durable-dir s3://ckpt-no-such-bucket/run --resume auto");
  INFO(out);
  CHECK(rc == 1);
  CHECK(has(out, "ckpt-demo: invalid argument: s3://ckpt-no-such-bucket: HEAD: the bucket of s3://ckpt-no-such-bucket/run does not exist "
                 "(a typo in the root, or the bucket was deleted): expected an existing bucket, actual HTTP 404 NoSuchBucket"));
  CHECK(!has(out, "starting fresh"));
  CHECK(!has(out, "loss"));  // no step trained
}

TEST_CASE("ckpt-demo --resume auto resumes from committed steps on the store that no latest names, as --resume does, and continues bit for bit") {
  const std::string kDemo = ckpt::test::demo_program();
  ckpt::test::TempDir dir;
  const std::string prefix = ckpt::test::unique_prefix("demo-no-latest");
  const std::string s3 = "s3://" + ckpt::test::rgw_env()["CKPT_S3_BUCKET"] + "/" + prefix;
  const auto [full_rc, full] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "full").string());
  REQUIRE(full_rc == 0);
  const std::string local = (dir / "local").string();
  const auto [half_rc, half] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + local + " --durable-dir " + s3 + " --steps 10 --save-every 5");
  REQUIRE(half_rc == 0);
  // What a crash between a commit's tier manifest and its `latest` leaves, the local tier
  // lost too (the root keeps its run identity).
  auto store = ckpt::open_s3(ckpt::test::rgw_options(prefix));
  store->remove("latest");
  REQUIRE(ckpt::list_object_checkpoints(*store) == std::vector<std::uint64_t>{5, 10});
  for (const auto& e : fs::directory_iterator(local))
    if (e.path().filename() != ".run") fs::remove_all(e.path());
  const auto [rc, out] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + local + " --durable-dir " + s3 + " --resume auto");
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(has(out, "resume auto: resuming from " + s3 + "/step-0000000010/manifest.json (committed, no latest names it)\n"));
  CHECK(has(out, "resumed from step 10, from the local tier (restored from " + s3 + ")\n"));
  const auto expect = rows(full, 11, 20);
  CHECK(expect.size() == 10);
  CHECK(rows(out, 11, 20) == expect);
  CHECK(ckpt::read_object_latest(*store)->step == 20);
}

TEST_CASE("ckpt-demo whose object store stops answering gives up draining at --durable-drain-deadline, says so in its last line and exits 5") {
  const std::string kDemo = ckpt::test::demo_program();
  ckpt::test::TempDir dir;
  const std::string s3 = "s3://" + ckpt::test::rgw_env()["CKPT_S3_BUCKET"] + "/" + ckpt::test::unique_prefix("demo-hung");
  ckpt::test::StallProxy proxy(ckpt::test::rgw_env()["AWS_ENDPOINT_URL"]);
  proxy.stall_on("/step-0000000020/");  // the store stops answering at the last step's first upload
  ckpt::test::Background demo({kDemo, "--dir", (dir / "a").string(), "--durable-dir", s3, "--steps", "20", "--durable-drain-deadline", "3"},
                              dir / "log", {{"AWS_ENDPOINT_URL", proxy.url()}});
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = demo.wait(std::chrono::minutes(2));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string out = demo.output();
  INFO(out);
  CHECK(proxy.stalled());
  CHECK(rc == 5);
  CHECK(took < kSlowdown * 40);  // 20 steps, a 3 s drain, the checks: not 4 copy attempts of minutes each
  CHECK(has(out, "durable tier: waiting for step 20 to reach " + s3 + " (attempt 1 of 3): "));
  CHECK(has(out, " s of 3 s\n"));
  CHECK(has(out, "(h) both tiers hold the checkpoints      skipped"));
  // The seconds are the wait measured when it ended: 3 on a quiet machine, more when the
  // machine is so busy the waiting thread wakes late (never fewer than the deadline).
  const std::string last = ckpt::test::last_line(out);
  const std::string lead = "durable tier: no, gave up after ";
  REQUIRE(last.starts_with(lead));
  std::size_t used = 0;
  const int secs = std::stoi(last.substr(lead.size()), &used);
  CHECK(secs >= 3);
  CHECK(secs < kSlowdown * 10);
  CHECK(last.substr(lead.size() + used).starts_with(" s (--durable-drain-deadline 3): step 20 did not reach " + s3));
}

TEST_CASE("a SIGTERM while ckpt-demo waits for an object store that stopped answering ends the wait at once, exit status 5, not killed") {
  const std::string kDemo = ckpt::test::demo_program();
  ckpt::test::TempDir dir;
  const std::string s3 = "s3://" + ckpt::test::rgw_env()["CKPT_S3_BUCKET"] + "/" + ckpt::test::unique_prefix("demo-hung-term");
  ckpt::test::StallProxy proxy(ckpt::test::rgw_env()["AWS_ENDPOINT_URL"]);
  proxy.stall_on("/step-0000000020/");
  ckpt::test::Background demo({kDemo, "--dir", (dir / "a").string(), "--durable-dir", s3, "--steps", "20", "--durable-drain-deadline", "600"},
                              dir / "log", {{"AWS_ENDPOINT_URL", proxy.url()}});
  const auto start = std::chrono::steady_clock::now();
  while (!has(demo.output(), "durable tier: waiting for step 20") && std::chrono::steady_clock::now() - start < std::chrono::minutes(1))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(has(demo.output(), "durable tier: waiting for step 20"));
  const auto t0 = std::chrono::steady_clock::now();
  demo.signal(SIGTERM);
  const int rc = demo.wait(std::chrono::minutes(1));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string out = demo.output();
  INFO(out);
  CHECK(rc == 5);
  CHECK(took < kSlowdown * 15);  // the abort (about a second), the checks that need no store
  CHECK(ckpt::test::last_line(out).starts_with("durable tier: no, gave up after "));
  CHECK(has(ckpt::test::last_line(out), " s (SIGTERM): step 20 did not reach " + s3));
}

TEST_CASE("an object store written before the copy between stores verifies, restores and resumes bit for bit") {
  // tests/data/6a37a75-demo-s3: every object of `ckpt-demo --world-size 2 --steps 10
  // --save-every 10 --durable-dir s3://BUCKET/PREFIX`, built from commit 6a37a75 (the last
  // with three copies between tiers), one file per key under PREFIX; the .txt beside it holds
  // the losses of steps 11..20 of that build's uninterrupted 20-step run with the same flags.
  namespace fs = std::filesystem;
  const std::string kDemo = ckpt::test::demo_program();
  const std::string kTool = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt";
  const fs::path data = fs::path(CKPT_SOURCE_DIR) / "tests/data/6a37a75-demo-s3";
  const ckpt::S3Options options = ckpt::test::rgw_options(ckpt::test::unique_prefix("fixture"));
  const auto client = ckpt::open_s3(options);
  std::size_t objects = 0;
  for (const auto& e : fs::recursive_directory_iterator(data)) {
    if (!e.is_regular_file()) continue;
    const auto bytes = ckpt::test::read_all(e.path());
    client->put(fs::relative(e.path(), data).generic_string(), std::as_bytes(std::span(bytes)));
    ++objects;
  }
  REQUIRE(objects >= 5);  // latest, the lease, the tier manifest, the checkpoint's manifest, 2 shards
  const auto [vrc, verified] = ckpt::test::run_with_rgw_env(kTool + " verify --verify full " + options.root);
  INFO(verified);
  CHECK(vrc == 0);
  CHECK(has(verified, "step-0000000010"));
  ckpt::test::TempDir dir;
  const auto [rc, resumed] = ckpt::test::run_with_rgw_env(kDemo + " --world-size 2 --steps 20 --save-every 10 --resume --adopt-run --dir " +
                                                          (dir / "local").string() + " --durable-dir " + options.root + " --metrics " +
                                                          (dir / "resumed.jsonl").string());
  INFO(resumed);
  REQUIRE(rc == 0);
  CHECK(has(resumed, "resume: restored step-0000000010 from " + options.root + "/step-0000000010 into " + (dir / "local").string()));
  CHECK(has(resumed, "resumed from step 10"));
  // Bit for bit: each step's loss as its hex float, against the old build's.
  std::map<std::int64_t, std::string> expect, got;
  {
    std::ifstream in(data.string() + ".losses-11-20.txt");
    std::int64_t step = 0;
    for (std::string hex; in >> step >> hex;) expect[step] = hex;
  }
  std::ifstream metrics(dir / "resumed.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto v = boost::json::parse(line).as_object();
    got[v.at("step").as_int64()] = std::string(v.at("loss_hex").as_string());
  }
  REQUIRE(expect.size() == 10);
  CHECK(got == expect);
}
