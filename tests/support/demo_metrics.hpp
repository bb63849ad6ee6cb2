// SPDX-License-Identifier: Apache-2.0
// What the tests of ckpt-demo do with a run: start it in the background with its output in a
// file, read its text files back, the losses of its --metrics file, and what a root's
// `latest` names.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/types.h>

#include <boost/json.hpp>
#include <cstdint>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "support/test_support.hpp"

extern "C" char** environ;

namespace ckpt::test {

/// Starts `args` (args[0] a program's path) with stdout and stderr into the file `log`;
/// returns its pid (the caller waits for it).
inline pid_t spawn_logged(const std::vector<std::string>& args, const std::filesystem::path& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  return pid;
}

/// The whole file as text.
inline std::string read_text(const std::filesystem::path& p) {
  const auto b = read_all(p);
  return std::string(b.begin(), b.end());
}

/// step -> loss_hex (the loss's exact bits) of a --metrics file.
inline std::map<std::int64_t, std::string> metrics_losses(const std::filesystem::path& path) {
  std::map<std::int64_t, std::string> out;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);) {
    const auto v = boost::json::parse(line).as_object();
    out[v.at("step").as_int64()] = std::string(v.at("loss_hex").as_string());
  }
  return out;
}

/// What a root's `latest` names ("" without one).
inline std::string latest_of(const std::filesystem::path& root) {
  if (!std::filesystem::exists(root / "latest")) return {};
  std::string s = read_text(root / "latest");
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace ckpt::test
