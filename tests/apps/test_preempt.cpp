// SPDX-License-Identifier: Apache-2.0
// ckpt-demo preempted: a real process gets SIGTERM at seeded instants (before the first save,
// while a save is in flight, at random, while a durable-tier copy runs), exits 0 within the
// grace budget with one line naming `latest`, and a --resume continues bit-exactly.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "ckpt/fs/layout.hpp"
#include "support/demo_metrics.hpp"
#include "support/test_support.hpp"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
const std::string kBin = std::string(CKPT_TEST_BINARY_DIR) + "/bin/";

using ckpt::test::latest_of;
using ckpt::test::read_text;
const auto losses = [](const fs::path& p) { return ckpt::test::metrics_losses(p); };

bool has_temporary(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (ckpt::is_temporary_name(it->path().filename().string())) return true;
  return false;
}

enum class When { before_first_save, save_in_flight, later_save_in_flight, random, durable_copy };

struct Preempted {
  int status = -1;
  double seconds = 0;  // signal to exit
  std::string out;
  std::string last_line;
};

// Starts `args` (stdout and stderr into `log`), waits until the root exists (the handlers
// are installed before it is created), then for the instant `when` asks, sends `signals`
// SIGTERMs, and waits for the exit.
Preempted preempt(const std::vector<std::string>& args, const fs::path& root, const fs::path& log, When when, std::mt19937_64& rng,
                  int signals = 1, const fs::path& durable = {}) {
  const pid_t pid = ckpt::test::spawn_logged(args, log);
  const auto t0 = Clock::now();
  auto until = [&](auto&& ready, std::chrono::milliseconds limit) {
    while (!ready() && Clock::now() - t0 < limit) std::this_thread::sleep_for(std::chrono::microseconds(200));
  };
  until([&] { return fs::exists(root); }, std::chrono::seconds(20));
  switch (when) {
    case When::before_first_save: break;
    case When::save_in_flight:  // a temporary in the root: staged, writing or committing
      until([&] { return has_temporary(root); }, std::chrono::seconds(20));
      break;
    case When::later_save_in_flight:  // as save_in_flight, once a checkpoint is committed
      until([&] { return !latest_of(root).empty(); }, std::chrono::seconds(20));
      until([&] { return has_temporary(root); }, std::chrono::seconds(20));
      break;
    case When::durable_copy:
      until([&] { return has_temporary(durable); }, std::chrono::seconds(20));
      break;
    case When::random:
      std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 900)(rng)));
      break;
  }
  const auto t_signal = Clock::now();
  for (int i = 0; i < signals; ++i) ::kill(pid, SIGTERM);
  int raw = 0;
  pid_t done = 0;
  while ((done = ::waitpid(pid, &raw, WNOHANG)) == 0 && Clock::now() - t_signal < std::chrono::seconds(60))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &raw, 0);
  }
  Preempted p;
  p.seconds = std::chrono::duration<double>(Clock::now() - t_signal).count();
  p.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  p.out = read_text(log);
  std::string s = p.out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  p.last_line = s.substr(s.rfind('\n') + 1);
  return p;
}

std::vector<std::string> demo_args(const fs::path& root, const fs::path& metrics, std::vector<std::string> more = {}) {
  std::vector<std::string> a = {kBin + "ckpt-demo", "--steps", "100000", "--save-every", "50", "--dir", root.string(), "--metrics",
                                metrics.string()};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

const std::regex kLine(R"(^preempted by SIGTERM at step (\d+): (.*)latest is (step-\d+)(.*)$)");

// The checks of one preempted run: exit 0 within the budget, the line, `latest` on disk, a
// full verify, the metrics of every step up to the emergency one; returns (emergency step,
// latest step).
std::pair<std::uint64_t, std::uint64_t> check_preempted(const Preempted& p, const fs::path& root, const fs::path& metrics, double budget) {
  CAPTURE(p.out.substr(p.out.size() > 2000 ? p.out.size() - 2000 : 0));
  CHECK(p.status == 0);
  CHECK(p.seconds < budget + 5);
  std::smatch m;
  REQUIRE(std::regex_match(p.last_line, m, kLine));
  const std::uint64_t step = std::stoull(m[1]);
  const std::string latest = m[3];
  const bool abandoned = m[2].str().find("abandoned") != std::string::npos;
  CHECK(latest_of(root) == latest);
  if (!abandoned) CHECK(latest == ckpt::checkpoint_dir_name(step));
  int status = 0;
  const auto verify = ckpt::test::run_command(kBin + "ckpt verify --full " + root.string() + " 2>&1", &status);
  CAPTURE(verify);
  CHECK(status == 0);
  const auto rows = losses(metrics);  // flushed: every step up to the emergency one
  CHECK(rows.size() == step);
  CHECK((!rows.empty() && rows.rbegin()->first == static_cast<std::int64_t>(step)));
  return {step, *ckpt::parse_checkpoint_dir_name(latest)};
}

}  // namespace

TEST_CASE("ckpt-demo on SIGTERM saves the step it stopped at, exits 0 naming latest, and resumes from it bit for bit") {
  ckpt::test::TempDir dir("ckpt-preempt");
  std::mt19937_64 rng(20240614);
  struct Run {
    std::uint64_t latest;
    fs::path resumed;
  };
  std::vector<Run> runs;
  std::uint64_t furthest = 0;
  int i = 0;
  for (const When when : {When::before_first_save, When::save_in_flight, When::random, When::random}) {
    CAPTURE(i);
    const fs::path root = dir / ("r" + std::to_string(i)), metrics = dir / ("m" + std::to_string(i) + ".jsonl");
    const Preempted p = preempt(demo_args(root, metrics), root, dir / "log", when, rng);
    const auto [step, latest] = check_preempted(p, root, metrics, 30);
    CHECK(latest == step);
    // The resume continues from the emergency checkpoint.
    const fs::path resumed = dir / ("resumed" + std::to_string(i) + ".jsonl");
    int status = 0;
    const auto out = ckpt::test::run_command(kBin + "ckpt-demo --save-every 50 --resume --steps " + std::to_string(latest + 5) + " --dir " +
                                                 root.string() + " --metrics " + resumed.string() + " 2>&1",
                                             &status);
    CAPTURE(out);
    CHECK(status == 0);
    CHECK(out.find("resumed from step " + std::to_string(latest) + "\n") != std::string::npos);
    runs.push_back({latest, resumed});
    furthest = std::max(furthest, latest + 5);
    ++i;
  }
  // One uninterrupted run is the reference for every resume, loss for loss (exact hex).
  int status = 0;
  ckpt::test::run_command(kBin + "ckpt-demo --save-every 50 --steps " + std::to_string(furthest) + " --dir " + (dir / "ref").string() +
                              " --metrics " + (dir / "ref.jsonl").string() + " >/dev/null 2>&1",
                          &status);
  REQUIRE(status == 0);
  const auto ref = losses(dir / "ref.jsonl");
  for (const auto& r : runs) {
    CAPTURE(r.latest);
    const auto got = losses(r.resumed);
    CHECK(got.size() == 5);
    for (const auto& [step, hex] : got) CHECK(hex == ref.at(step));
  }
}

TEST_CASE("ckpt-demo preempted while copying to the durable tier waits for the copy, and a second signal cuts that wait short") {
  ckpt::test::TempDir dir("ckpt-preempt");
  std::mt19937_64 rng(7);
  for (const int signals : {1, 2}) {
    CAPTURE(signals);
    const fs::path root = dir / ("r" + std::to_string(signals)), durable = dir / ("d" + std::to_string(signals));
    const fs::path metrics = dir / "m.jsonl";
    const Preempted p = preempt(demo_args(root, metrics, {"--durable-dir", durable.string()}), root, dir / "log", When::durable_copy, rng,
                                signals, durable);
    const auto [step, latest] = check_preempted(p, root, metrics, 30);
    CHECK(latest == step);
    std::smatch m;
    REQUIRE(std::regex_match(p.last_line, m, kLine));
    const bool durable_has_it = latest_of(durable) == ckpt::checkpoint_dir_name(step);
    if (signals == 1) {
      // The budget (30 s) is ample for a copy of a few hundred KiB.
      CHECK(m[4].str() == " (durable tier: yes)");
      CHECK(durable_has_it);
    } else {
      // Hurried: the line says what the durable tier holds, whichever it is.
      CHECK(m[4].str() == (durable_has_it ? " (durable tier: yes)" : " (durable tier: no, its copy was cut short)"));
    }
  }
}

TEST_CASE("ckpt-demo --grace-seconds 0: a save that cannot finish in the budget is abandoned and the previous latest stays") {
#if defined(__SANITIZE_THREAD__)
  // Under ThreadSanitizer the demo runs ~20x slower and the instant the signal lands relative
  // to the save is no longer the one this case aims at (seen once: the exit line did not
  // match); the Release suite runs it.
  MESSAGE("skipped under ThreadSanitizer: timing-dependent");
  std::exit(77);
#endif
  ckpt::test::TempDir dir("ckpt-preempt");
  std::mt19937_64 rng(3);
  const fs::path root = dir / "r", metrics = dir / "m.jsonl";
  // Signalled while a save of the cadence is in flight, with no time to wait for anything.
  const Preempted p = preempt(demo_args(root, metrics, {"--grace-seconds", "0"}), root, dir / "log", When::later_save_in_flight, rng);
  const auto [step, latest] = check_preempted(p, root, metrics, 0);
  std::smatch m;
  REQUIRE(std::regex_match(p.last_line, m, kLine));
  if (m[2].str().empty()) {
    CHECK(latest == step);  // it was committed by the time the ranks agreed: no need to abandon
  } else {
    CHECK(m[2].str() == "the save of step " + std::to_string(step) + " did not finish within the 0 s grace budget and was abandoned; ");
    // Cancelled on every rank: its temporary is gone before the process exits, and `latest`
    // still names the previous checkpoint.
    CHECK(latest < step);
    CHECK_FALSE(has_temporary(root));
  }
  // The next run starts from `latest`, whatever the abandoned save left behind.
  int status = 0;
  const auto out = ckpt::test::run_command(kBin + "ckpt-demo --resume --steps " + std::to_string(latest + 2) + " --dir " + root.string() + " 2>&1",
                                           &status);
  CAPTURE(out);
  CHECK(status == 0);
  CHECK(out.find("resumed from step " + std::to_string(latest) + "\n") != std::string::npos);
  CHECK_FALSE(has_temporary(root));
}

TEST_CASE("ckpt-demo --save-every-seconds saves on rank 0's clock, and the run still verifies its resume") {
  ckpt::test::TempDir dir("ckpt-preempt");
  int status = 0;
  const auto out = ckpt::test::run_command(kBin + "ckpt-demo --steps 30 --save-every-seconds 0.05 --keep 0 --dir " + (dir / "r").string() + " 2>&1",
                                           &status);
  CAPTURE(out);
  CHECK(status == 0);
  CHECK(out.find("resume verified") != std::string::npos);
  std::size_t checkpoints = 0;
  for (const auto& e : fs::directory_iterator(dir / "r")) checkpoints += ckpt::parse_checkpoint_dir_name(e.path().filename().string()).has_value();
  CHECK(checkpoints >= 1);
  const auto help = ckpt::test::run_command(kBin + "ckpt-demo --help", &status);
  CHECK(help.find("  --save-every-seconds S") != std::string::npos);
  CHECK(help.find("  --grace-seconds S") != std::string::npos);
}
