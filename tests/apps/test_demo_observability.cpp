// SPDX-License-Identifier: Apache-2.0
// ckpt-demo as an operator watches it: its Prometheus endpoint (--metrics-port) fetched with
// curl while it trains, and the library's log lines under CKPT_LOG and CKPT_LOG_FORMAT.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>

#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../metrics/exposition.hpp"
#include "support/demo_metrics.hpp"
#include "support/test_support.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The shell's single-quoted form of `s` (any bytes, newlines included).
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A run whose library log holds an info line (an uncommitted step directory removed) and an
// error line (the save of step 10 failed), with `env` before the command; its stderr alone.
std::string stderr_of_demo(const std::string& env, const std::string& root, int& status) {
  fs::create_directories(fs::path(root) / "step-0000000005");  // never committed: removed, logged at info
  return ckpt::test::run_command(env + " " + ckpt::test::demo_program() + " --steps 20 --fail-save 10 --dir " + quoted(root) +
                                     " 2>&1 >/dev/null",
                                 &status);
}

}  // namespace

#ifdef CKPT_TEST_METRICS_SERVER
TEST_CASE("ckpt-demo --metrics-port serves every documented metric to curl while it trains") {
  const std::string demo = ckpt::test::demo_program();
  ckpt::test::TempDir dir;
  const int port = ckpt::test::free_local_port();
  const fs::path log = dir / "demo.log";
  const pid_t pid = ckpt::test::spawn_logged(
      {demo, "--steps", "100000", "--save-every", "5", "--dir", (dir / "run").string(), "--metrics-port", std::to_string(port)}, log);
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/metrics";
  // Scraped until a checkpoint is committed (the first scrapes may come before the server is up).
  ckpt::test::Exposition e;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = -1;
    const std::string body = ckpt::test::run_command("curl -sS --max-time 5 " + url + " 2>/dev/null", &status);
    if (status == 0) {
      e = ckpt::test::parse_exposition(body);
      if (e.count("ckpt_last_committed_step") == 1 && e.value("ckpt_checkpoints_committed_total") >= 2) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGTERM);  // the demo saves the step it stopped at and exits 0
  int raw = 0;
  ::waitpid(pid, &raw, 0);
  const std::string out = ckpt::test::read_text(log);
  CAPTURE(out.substr(0, 2000));
  CHECK(out.find("metrics: serving " + url + "\n") != std::string::npos);
  CHECK((WIFEXITED(raw) && WEXITSTATUS(raw) == 0));
  ckpt::test::check_documented(e);
  REQUIRE(e.count("ckpt_checkpoints_committed_total") == 1);
  CHECK(e.value("ckpt_checkpoints_committed_total") >= 2);
  CHECK(e.value("ckpt_saves_total") >= 8);  // 4 ranks
  CHECK(static_cast<std::uint64_t>(e.value("ckpt_last_committed_step")) % 5 == 0);
  CHECK(e.value("ckpt_committed_bytes_total") > 0);
  CHECK(e.value("ckpt_save_phase_seconds_count", {{"phase", "total"}}) >= 8);
  CHECK(e.value("ckpt_save_failures_total") == 0);
}
#endif

TEST_CASE("ckpt-demo under CKPT_LOG_FORMAT=json writes each log line as JSON, escaping a root path of any bytes") {
  ckpt::test::TempDir dir;
  const std::string root = (dir.path() / "a\"b\\c\nd\xff").string();  // a quote, a backslash, a newline, invalid UTF-8
  int status = -1;
  const std::string err = stderr_of_demo("CKPT_LOG_FORMAT=json", root, status);
  CAPTURE(err);
  CHECK(status == 0);
  const auto lines = lines_of(err);
  REQUIRE(lines.size() == 2);
  std::vector<std::string> events;
  for (const auto& line : lines) {
    const auto v = boost::json::parse(line).as_object();  // each line alone is one JSON object
    for (const char* field : {"time", "level", "event", "message"}) CHECK(v.contains(field));
    events.emplace_back(v.at("event").as_string());
    CHECK(std::string(v.at("message").as_string()).find("a\"b\\c\nd\xef\xbf\xbd") != std::string::npos);  // \ufffd
  }
  CHECK(events == std::vector<std::string>{"uncommitted_removed", "save_failed"});
  const auto failed = boost::json::parse(lines[1]).as_object();
  CHECK(failed.at("level").as_string() == "error");
  CHECK(failed.at("step").as_int64() == 10);
  CHECK(err.find("a\\\"b\\\\c\\nd\\ufffd") != std::string::npos);
}

TEST_CASE("ckpt-demo under CKPT_LOG=error drops the info line and keeps the failed save") {
  ckpt::test::TempDir dir;
  int status = -1;
  const std::string text = stderr_of_demo("", (dir.path() / "run").string(), status);
  CHECK(lines_of(text).size() == 2);  // the default (info) shows both
  fs::remove_all(dir.path() / "run");
  const std::string err = stderr_of_demo("CKPT_LOG=error", (dir.path() / "run").string(), status);
  CAPTURE(err);
  CHECK(status == 0);
  const auto lines = lines_of(err);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0].starts_with("ckpt: save of step 10 failed (1 in a row since the last commit): "));
}
