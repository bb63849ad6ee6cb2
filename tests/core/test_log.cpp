// SPDX-License-Identifier: Apache-2.0
// Log levels and the JSON format (core/log.hpp): what an operator's log collector reads.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json/parse.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/core/log.hpp"
#include "support/test_support.hpp"

namespace {

using ckpt::LogFormat;
using ckpt::LogLevel;

// Restores the level and format a test changed.
struct LogSettings {
  LogLevel level = ckpt::log_level();
  LogFormat format = ckpt::log_format();
  ~LogSettings() {
    ckpt::set_log_level(level);
    ckpt::set_log_format(format);
  }
};

// What `body` writes to stderr, run in a child process whose environment has `env` set
// (the settings are read from the environment once per process, so each case forks).
std::string stderr_of_child(const std::vector<std::pair<const char*, const char*>>& env, void (*body)()) {
  char path[] = "/tmp/ckpt-test-log-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(fd, 2);
    for (const auto& [k, v] : env) ::setenv(k, v, 1);
    body();
    std::fflush(stderr);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(fd);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  ::unlink(path);
  CHECK(WIFEXITED(status));
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

void log_one_of_each() {
  ckpt::log_event(LogLevel::error, "save_failed", "save of step 7 failed", {.rank = 2, .step = 7});
  ckpt::log_event(LogLevel::warn, "writer_fallback", "io_uring unavailable");
  ckpt::log_line("a line that states no level");
  ckpt::log_event(LogLevel::debug, "save_committed", "step 7 committed", {.step = 7});
}

}  // namespace

TEST_CASE("CKPT_LOG_FORMAT=json writes every line as a JSON object with time, level, event and message") {
  const std::string out = stderr_of_child({{"CKPT_LOG_FORMAT", "json"}, {"CKPT_LOG", "debug"}}, log_one_of_each);
  const auto lines = lines_of(out);
  CAPTURE(out);
  REQUIRE(lines.size() == 4);
  const std::regex rfc3339(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$)");
  const char* levels[] = {"error", "warn", "info", "debug"};
  const char* events[] = {"save_failed", "writer_fallback", "message", "save_committed"};
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const auto v = boost::json::parse(lines[i]);
    const auto& o = v.as_object();
    CHECK(std::regex_match(std::string(o.at("time").as_string()), rfc3339));
    CHECK(o.at("level").as_string() == levels[i]);
    CHECK(o.at("event").as_string() == events[i]);
    CHECK(o.contains("message"));
  }
  const auto first = boost::json::parse(lines[0]).as_object();
  CHECK(first.at("rank").as_int64() == 2);
  CHECK(first.at("step").as_int64() == 7);
  CHECK(first.at("message").as_string() == "save of step 7 failed");
  const auto second = boost::json::parse(lines[1]).as_object();
  CHECK_FALSE(second.contains("rank"));  // unknown: left out, not null
  CHECK_FALSE(second.contains("step"));
}

TEST_CASE("the text format stays ckpt: and the message, with no level prefix") {
  const std::string out = stderr_of_child({}, log_one_of_each);
  CHECK(out == "ckpt: save of step 7 failed\nckpt: io_uring unavailable\nckpt: a line that states no level\n");
}

TEST_CASE("CKPT_LOG=error silences info and warn lines and keeps errors") {
  const std::string out = stderr_of_child({{"CKPT_LOG", "error"}}, log_one_of_each);
  CHECK(out == "ckpt: save of step 7 failed\n");
}

TEST_CASE("an unknown CKPT_LOG value is reported once and info is used") {
  const std::string out = stderr_of_child({{"CKPT_LOG", "verbose"}}, [] {
    log_one_of_each();
    log_one_of_each();
  });
  const auto lines = lines_of(out);
  CAPTURE(out);
  REQUIRE(lines.size() == 7);  // the complaint, then error, warn and info twice (no debug)
  CHECK(lines[0] == "ckpt: CKPT_LOG=verbose is not a level (error, warn, info or debug): using info");
  CHECK(lines[3] == "ckpt: a line that states no level");
}

TEST_CASE("set_log_level filters what a log sink receives") {
  LogSettings restore;
  ckpt::test::LogCapture capture;
  ckpt::set_log_level(LogLevel::warn);
  CHECK_FALSE(ckpt::log_enabled(LogLevel::info));
  log_one_of_each();
  CHECK(capture.lines() == std::vector<std::string>{"save of step 7 failed", "io_uring unavailable"});
}

TEST_CASE("a JSON log line escapes a path with a quote, a backslash, a newline and invalid UTF-8") {
  const std::string path = "/ckpt/a\"b\\c\nd\te\x01\xff\xc3\x28 caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xed\xa0\x80";
  const std::string message = "removing " + path;  // the record holds views
  const ckpt::LogRecord record{std::chrono::system_clock::time_point{}, LogLevel::warn, "disk_nearly_full", message, {}};
  const std::string line = ckpt::format_log_record(record, LogFormat::json);
  CAPTURE(line);
  CHECK(line.find('\n') == std::string::npos);
  CHECK(line.find(R"(a\"b\\c\nd\te\u0001\ufffd\ufffd( café € 😀 \ufffd\ufffd\ufffd)") != std::string::npos);
  const auto v = boost::json::parse(line).as_object();  // parses: valid JSON, valid UTF-8
  CHECK(v.at("message").as_string() == "removing /ckpt/a\"b\\c\nd\te\x01\xef\xbf\xbd\xef\xbf\xbd( caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 "
                                       "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
  CHECK(v.at("time").as_string() == "1970-01-01T00:00:00.000000Z");
}

TEST_CASE("json_escape refuses overlong forms and code points past U+10FFFF") {
  CHECK(ckpt::json_escape("\xc0\xaf") == "\\ufffd\\ufffd");            // overlong '/'
  CHECK(ckpt::json_escape("\xe0\x80\xaf") == "\\ufffd\\ufffd\\ufffd");  // overlong, 3 bytes
  CHECK(ckpt::json_escape("\xf4\x90\x80\x80") == "\\ufffd\\ufffd\\ufffd\\ufffd");
  CHECK(ckpt::json_escape("\xf4\x8f\xbf\xbf") == "\xf4\x8f\xbf\xbf");  // U+10FFFF itself
  CHECK(ckpt::json_escape("\x7f") == "\\u007f");
  CHECK(ckpt::json_escape("\xe2\x82") == "\\ufffd\\ufffd");  // cut short
}

TEST_CASE("parse_log_level knows the four levels and nothing else") {
  CHECK(ckpt::parse_log_level("error") == LogLevel::error);
  CHECK(ckpt::parse_log_level("warn") == LogLevel::warn);
  CHECK(ckpt::parse_log_level("info") == LogLevel::info);
  CHECK(ckpt::parse_log_level("debug") == LogLevel::debug);
  CHECK_FALSE(ckpt::parse_log_level("INFO"));
  CHECK_FALSE(ckpt::parse_log_level("warning"));
}
