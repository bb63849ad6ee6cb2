// SPDX-License-Identifier: Apache-2.0
// Shared by the object-store tests: the real S3 server (a Ceph RADOS Gateway) that ctest's
// fixture objstore/rgw_start started with scripts/rgw in $CKPT_RGW_DIR, and a client for it
// under a prefix of the test's own (so tests running at once never see each other's keys).
#pragma once

#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/objstore/object_store.hpp"
#include "ckpt/objstore/s3.hpp"
#include "support/test_support.hpp"

namespace ckpt::test {

/// DIR/env of the running RGW as a map (AWS_ENDPOINT_URL, ..., CKPT_S3_BUCKET). Exits the
/// test with 77 (ctest's skip), saying why, if there is none: scripts/rgw could not start one
/// here (the packages are missing; its reason is in DIR/skipped), or the test runs outside
/// ctest without CKPT_RGW_DIR.
inline std::map<std::string, std::string> rgw_env() {
  const char* dir = std::getenv("CKPT_RGW_DIR");
  if (!dir || !*dir) {
    MESSAGE("skipped: CKPT_RGW_DIR is not set (run through ctest, or `scripts/rgw start DIR` and set CKPT_RGW_DIR=DIR)");
    std::exit(77);
  }
  std::ifstream in(std::string(dir) + "/env");
  if (!in) {
    std::ifstream why(std::string(dir) + "/skipped");
    std::string reason;
    std::getline(why, reason);
    MESSAGE("skipped: no RGW in " << dir << ": " << (reason.empty() ? "scripts/rgw start did not run or failed" : reason));
    std::exit(77);
  }
  std::map<std::string, std::string> env;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("export ")) line.erase(0, 7);
    const auto eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

/// Runs the shell command `cmd` with the RGW's environment (rgw_env()) set; returns its exit
/// status (128+N for signal N) and its stdout and stderr together.
inline std::pair<int, std::string> run_with_rgw_env(const std::string& cmd) {
  std::string vars;
  for (const auto& [k, v] : rgw_env()) vars += k + "=" + v + " ";
  int status = 0;
  std::string out = run_command("env " + vars + cmd + " 2>&1", &status);
  return {status, std::move(out)};
}

/// A program started in the background with the RGW's environment (rgw_env()) and then
/// `overrides` set, its stdout and stderr both into `log`; killed (SIGKILL) by the
/// destructor if it still runs.
class Background {
 public:
  Background(const std::vector<std::string>& argv, std::filesystem::path log, std::map<std::string, std::string> overrides = {})
      : log_(std::move(log)) {
    std::map<std::string, std::string> vars;
    for (char** e = ::environ; *e; ++e) {
      const std::string kv(*e);
      vars[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
    }
    for (auto& [k, v] : rgw_env()) vars[k] = v;
    for (auto& [k, v] : overrides) vars[k] = v;
    std::vector<std::string> env;
    for (auto& [k, v] : vars) env.push_back(k + "=" + v);
    std::vector<char*> envp, args;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& a : argv_copy) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    const int rc = posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    REQUIRE(rc == 0);
  }
  ~Background() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int sig) const { ::kill(pid_, sig); }
  /// Waits up to `limit` for the program to exit: its exit status (128+N for signal N), or -1
  /// if it still ran (it is then killed).
  int wait(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    int raw = 0;
    pid_t done = 0;
    while ((done = ::waitpid(pid_, &raw, WNOHANG)) == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (done == 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &raw, 0);
      pid_ = -1;
      return -1;
    }
    pid_ = -1;
    return WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  }
  /// True while it runs (not exited; a stopped program runs).
  bool running() const {
    siginfo_t info{};
    return pid_ > 0 && ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
  }
  std::string output() const {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  pid_t pid_ = -1;
  std::filesystem::path log_;
};

/// True if `text` holds `what`.
inline bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

/// The last non-empty line of `text`.
inline std::string last_line(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);
}

/// A fresh key prefix ("t-<random>/" under `tag`), so each test has keys of its own.
inline std::string unique_prefix(const std::string& tag) {
  std::random_device rd;
  return tag + "-" + std::to_string(rd()) + std::to_string(rd());
}

/// `attempts` tries with millisecond delays, for tests that retry injected faults.
inline RetryPolicy fast_retries(int attempts) {
  return {.max_attempts = attempts, .base_delay = std::chrono::milliseconds(1), .max_delay = std::chrono::milliseconds(5)};
}

/// Options for the RGW, rooted at s3://BUCKET/`prefix`, with short retry delays.
inline S3Options rgw_options(const std::string& prefix) {
  auto env = rgw_env();
  S3Options o;
  o.root = "s3://" + env["CKPT_S3_BUCKET"] + "/" + prefix;
  o.endpoint = env["AWS_ENDPOINT_URL"];
  o.access_key = env["AWS_ACCESS_KEY_ID"];
  o.secret_key = env["AWS_SECRET_ACCESS_KEY"];
  o.region = env["AWS_REGION"];
  o.retry = {.max_attempts = 4, .base_delay = std::chrono::milliseconds(5), .max_delay = std::chrono::milliseconds(50)};
  return o;
}

/// The raw client (no retries) for s3://BUCKET/<a unique prefix under `tag`>.
inline std::unique_ptr<ObjectStore> rgw_store(const std::string& tag) {
  return make_s3_object_store(rgw_options(unique_prefix(tag)));
}

inline std::span<const std::byte> bytes_of(std::string_view s) { return std::as_bytes(std::span(s)); }
inline std::string text_of(const std::vector<std::byte>& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

}  // namespace ckpt::test
