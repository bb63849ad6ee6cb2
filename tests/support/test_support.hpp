// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the test executables.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/core/error.hpp"

namespace ckpt::test {

/// The ckpt::Error `fn` throws; a test failure if it throws none.
Error error_of(const std::function<void()>& fn);

/// A fresh directory under $TMPDIR (or /var/tmp, on the same disk as the build), removed
/// with its contents when the object goes out of scope.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "ckpt-test");
  /// The same under `base` (e.g. /dev/shm, a tmpfs).
  TempDir(const std::string& tag, const std::string& base);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// A small tmpfs mounted at DIR/small for the object's lifetime (`options`: mount(8)'s, e.g.
/// "size=64k"): a disk that fills up. Exits the test process with 77 (ctest's skip) when not
/// root or when tmpfs cannot be mounted here. Unmounted (detached) on destruction.
class SmallTmpfs {
 public:
  SmallTmpfs(const TempDir& dir, const char* options);
  ~SmallTmpfs();
  SmallTmpfs(const SmallTmpfs&) = delete;
  SmallTmpfs& operator=(const SmallTmpfs&) = delete;
  const std::string& path() const { return mnt_; }

 private:
  std::string mnt_;
};

/// Deterministic pseudo-random bytes (splitmix64), for test payloads.
std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed);

/// Whole file as bytes / write bytes to a file (plain, no durability).
std::vector<std::uint8_t> read_all(const std::filesystem::path& p);
void write_all(const std::filesystem::path& p, const std::vector<std::uint8_t>& bytes);

/// Caps this process's address space (RLIMIT_AS) at what it maps now plus `extra_bytes`, so
/// that an allocation past the budget fails with std::bad_alloc. For forked children only
/// (it cannot be raised again). Returns false if the limit could not be set.
bool limit_address_space(std::uint64_t extra_bytes);
/// The names of the entries of `dir`, sorted.
std::vector<std::string> names_in(const std::filesystem::path& dir);

/// Runs a shell command and returns its stdout; sets *status to the exit status.
std::string run_command(const std::string& cmd, int* status = nullptr);

/// ckpt-demo in this build tree; a test that runs it exits 77 (skipped), saying why, where it
/// is not built (CKPT_BUILD_APPS=OFF).
std::string demo_program();

/// Collects the messages ckpt logs (log_event, log_line: those that pass the level) while it
/// lives (from any thread), instead of printing them; restores the previous sink when destroyed.
class LogCapture {
 public:
  LogCapture();
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;
  std::vector<std::string> lines() const;
  /// The lines that contain every one of `parts`.
  std::vector<std::string> matching(std::initializer_list<std::string_view> parts) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
  std::function<void(std::string_view)> previous_;
};

/// The ckpt::Error that f() throws, for checks of its code and context; a test failure if it
/// returns normally.
template <class F>
Error expect_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no ckpt::Error thrown");
  return Error(Errc::invalid_argument, {}, "unreachable");
}

/// Environment variables set (a value) or unset (nullopt) while the object lives; their old
/// values come back when it goes.
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::optional<std::string>>& vars);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

}  // namespace ckpt::test
