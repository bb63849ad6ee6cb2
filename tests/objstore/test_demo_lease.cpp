// SPDX-License-Identifier: Apache-2.0
// Two ckpt-demo jobs on one s3:// prefix, against the real RGW, with a writer lease of 2 s
// (--lease-seconds): the second is refused naming the first's run while the first lives and
// commits on unharmed; with the first SIGKILLed, the second takes the prefix over once the
// lease expired and continues the first's run bit for bit (--adopt-run); and a first job
// stopped (SIGSTOP) long enough to be taken over commits nothing more once it runs again.
// Skipped where the demo is not built (CKPT_BUILD_APPS=OFF).
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "ckpt/format/manifest.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/store/object/object_lease.hpp"
#include "ckpt/store/run_identity.hpp"
#include "ckpt/objstore/s3.hpp"
#include "objstore/rgw_fixture.hpp"
#include "support/test_support.hpp"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ckpt::test::has;

// One job's prefix on the RGW: its s3:// root and a client of it.
struct Prefix {
  std::string name = ckpt::test::unique_prefix("two-jobs");
  std::string root = "s3://" + ckpt::test::rgw_env()["CKPT_S3_BUCKET"] + "/" + name;
  std::unique_ptr<ckpt::ObjectStore> store = ckpt::open_s3(ckpt::test::rgw_options(name));  // retries: a read racing a job's write may meet a 500

  std::uint64_t latest() const {
    const auto l = ckpt::read_object_latest(*store);
    return l ? l->step : 0;
  }
  // Polls until `latest` names `step` or a later one (or `limit` passed); returns what it names.
  std::uint64_t wait_latest(std::uint64_t step, std::chrono::milliseconds limit = 60s) const {
    const auto until = Clock::now() + limit;
    std::uint64_t now = latest();
    for (; now < step && Clock::now() < until; now = latest()) std::this_thread::sleep_for(10ms);
    return now;
  }
  // Sleeps until the lease's expires_at has passed by this host's clock.
  void wait_lease_expired() const {
    const auto lease = ckpt::read_object_lease(*store);
    REQUIRE(lease.has_value());
    const auto expires = ckpt::parse_rfc3339(lease->record.expires_at);
    REQUIRE(expires.has_value());
    std::this_thread::sleep_until(*expires + 100ms);
  }
};

// step -> loss_hex of a --metrics file.
std::map<std::int64_t, std::string> losses(const fs::path& path) {
  std::map<std::int64_t, std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto v = boost::json::parse(line).as_object();
    out[v.at("step").as_int64()] = std::string(v.at("loss_hex").as_string());
  }
  return out;
}

// Under ThreadSanitizer the demo runs ~20x slower: these runs would take minutes each, and a
// 2 s lease is then no longer short against a step; the lease's threads run under TSan in
// test_object_lease.cpp and test_durable_s3.cpp, the Release and ASan suites run these.
void skip_under_tsan() {
#if defined(__SANITIZE_THREAD__)
  MESSAGE("skipped under ThreadSanitizer: minutes of demo runs, timed against a 2 s lease");
  std::exit(77);
#endif
}

std::vector<std::string> demo_args(const fs::path& dir, const Prefix& p, std::vector<std::string> more) {
  std::vector<std::string> a = {ckpt::test::demo_program(), "--dir", dir.string(), "--durable-dir", p.root, "--lease-seconds", "2", "--keep-durable", "0"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

// A successor job: `--resume --adopt-run` into `dir` on the prefix, up to step `last`, saving
// every 5 steps; its exit status and output.
std::pair<int, std::string> successor(const fs::path& dir, const Prefix& p, std::uint64_t last, const std::string& more = {}) {
  return ckpt::test::run_with_rgw_env(ckpt::test::demo_program() + " --dir " + dir.string() + " --durable-dir " + p.root +
                                      " --lease-seconds 2 --keep-durable 0 --resume --adopt-run --steps " + std::to_string(last) +
                                      " --save-every 5" + more);
}

std::string run_of(const fs::path& root) {
  const auto run = ckpt::read_run_identity(ckpt::posix_file_system(), root.string());
  REQUIRE(run.has_value());
  return *run;
}

}  // namespace

TEST_CASE("a second ckpt-demo on a running one's s3 prefix is refused naming both runs, and the first commits on unharmed") {
  skip_under_tsan();
  const std::string kDemo = ckpt::test::demo_program();
  ckpt::test::TempDir dir;
  const Prefix p;
  ckpt::test::Background first(demo_args(dir / "a", p, {"--steps", "100000", "--save-every", "20"}), dir / "a.log");
  REQUIRE(p.wait_latest(40) >= 40);
  const std::string run_a = run_of(dir / "a");

  const auto [rc, out] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "b").string() + " --durable-dir " + p.root + " --lease-seconds 2 --steps 20");
  INFO(out);
  CHECK(rc == 1);
  const std::string run_b = run_of(dir / "b");
  CHECK(has(out, "ckpt-demo: busy: " + p.root + "/lease: another writer holds the lease of " + p.root + "/: this writer, run " + run_b +
                     " (holder "));
  CHECK(has(out, "is refused: expected no other live writer (a lease released, or expired and left unrenewed for one period), actual run " +
                     run_a + " (holder "));
  CHECK(!has(out, "grad norm"));  // refused before the first step
  CHECK(!fs::exists(dir / "b" / "latest"));
  // Nor does it restore the first's checkpoints to continue them while the first writes.
  const auto [rrc, rout] = successor(dir / "c", p, 1000);
  INFO(rout);
  CHECK(rrc == 1);
  CHECK(has(rout, "ckpt-demo: busy: " + p.root + "/lease: another writer holds the lease of " + p.root + "/ and writes there now: a resume into " +
                      (dir / "c").string() + " (run none yet) does not restore its checkpoints: expected no live writer of another run, actual run " +
                      run_a + " (holder "));
  CHECK(!fs::exists(dir / "c" / "latest"));

  // The first job is unharmed: it lives and its commits go on, as its own run.
  const std::uint64_t before = p.latest();
  CHECK(first.running());
  CHECK(p.wait_latest(before + 20) >= before + 20);
  CHECK(ckpt::read_object_latest(*p.store)->run == run_a);
  CHECK(ckpt::read_object_lease(*p.store)->record.run == run_a);
}

TEST_CASE("with the first ckpt-demo SIGKILLed, a second one takes its s3 prefix over once the lease expired and continues its run bit for bit") {
  skip_under_tsan();
  const std::string kDemo = ckpt::test::demo_program();
  ckpt::test::TempDir dir;
  const Prefix p;
  {
    ckpt::test::Background first(demo_args(dir / "a", p, {"--steps", "100000", "--save-every", "20"}), dir / "a.log");
    REQUIRE(p.wait_latest(40) >= 40);
    first.signal(SIGKILL);
    CHECK(first.wait(10s) == 128 + SIGKILL);
  }
  const std::string run_a = run_of(dir / "a");
  const std::uint64_t from = p.latest();
  // A successor started before the lease expired is refused (as a second job would be); a
  // restart loop simply tries again.
  p.wait_lease_expired();
  const auto t0 = Clock::now();
  const auto [rc, out] = successor(dir / "b", p, from + 10, " --metrics " + (dir / "b.jsonl").string());
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(Clock::now() - t0 >= 2s);  // it watched the expired lease for one period first
  CHECK(has(out, "/lease: the lease of run " + run_a + " (holder "));
  CHECK(has(out, "took the lease over, unrenewed for 2 s since "));
  CHECK(has(out, "resumed from step " + std::to_string(from) + ", from the local tier (restored from " + p.root + ")\n"));
  CHECK(has(out, "adopting run " + run_a));
  CHECK(has(out, "(h) both tiers hold the checkpoints      PASS"));
  CHECK(ckpt::test::last_line(out) == "durable tier: yes, " + p.root + " holds " + ckpt::checkpoint_dir_name(from + 10));
  CHECK(run_of(dir / "b") == run_a);
  const auto latest = ckpt::read_object_latest(*p.store);
  CHECK(latest->step == from + 10);
  CHECK(latest->run == run_a);
  CHECK(latest->holder == ckpt::read_object_lease(*p.store)->record.holder);  // the successor's, released at its exit
  CHECK(ckpt::read_object_lease(*p.store)->record.released);

  // Its steps are those of one uninterrupted run.
  const auto [ref_rc, ref] = ckpt::test::run_with_rgw_env(kDemo + " --dir " + (dir / "ref").string() + " --steps " + std::to_string(from + 10) +
                                                          " --save-every 1000 --metrics " + (dir / "ref.jsonl").string());
  REQUIRE(ref_rc == 0);
  const auto want = losses(dir / "ref.jsonl"), got = losses(dir / "b.jsonl");
  CHECK(got.size() == 10);
  for (const auto& [step, hex] : got) {
    CAPTURE(step);
    CHECK(hex == want.at(step));
  }
}

TEST_CASE("a ckpt-demo stopped until its s3 prefix was taken over commits nothing more there once it runs again, and says so") {
  skip_under_tsan();
  (void)ckpt::test::demo_program();  // skips where it is not built
  ckpt::test::TempDir dir;
  const Prefix p;
  ckpt::test::Background zombie(demo_args(dir / "a", p, {"--steps", "200", "--save-every", "100"}), dir / "a.log");
  // Stopped right after a commit moved `latest` (its next commit is 100 steps away).
  REQUIRE(p.wait_latest(100) >= 100);
  zombie.signal(SIGSTOP);
  const std::uint64_t from = p.latest();
  p.wait_lease_expired();
  const auto [rc, out] = successor(dir / "b", p, from + 10);
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(has(out, "took the lease over"));
  const std::string successor = ckpt::read_object_lease(*p.store)->record.holder;

  zombie.signal(SIGCONT);
  const int zrc = zombie.wait(2min);
  const std::string zout = zombie.output();
  INFO(zout);
  CHECK(zrc == 1);  // check (h) fails: the store's latest is the successor's
  CHECK(has(zout, "/lease: the lease was taken over: this writer, run " + run_of(dir / "a")));
  CHECK(has(zout, "(h) both tiers hold the checkpoints      FAIL"));
  CHECK(ckpt::test::last_line(zout).starts_with("durable tier: no, this run's writer lease on " + p.root +
                                                " was taken over by another writer, which commits there now; the last error: busy: "));
  // Nothing of the zombie's after the takeover: the successor's steps are the newest.
  const auto latest = ckpt::read_object_latest(*p.store);
  CHECK(latest->step == from + 10);
  CHECK(latest->holder == successor);
  CHECK(ckpt::list_object_checkpoints(*p.store).back() == from + 10);
}
