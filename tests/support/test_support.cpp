// SPDX-License-Identifier: Apache-2.0
#include "support/test_support.hpp"

#include <doctest/doctest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "ckpt/core/log.hpp"
#include "ckpt/core/random.hpp"

namespace ckpt::test {

Error error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e;
  }
  FAIL("no ckpt::Error thrown");
  return Error(Errc::aborted, {}, {});
}

LogCapture::LogCapture() {
  previous_ = set_log_sink([this](std::string_view line) {
    std::lock_guard lk(mu_);
    lines_.emplace_back(line);
  });
}

LogCapture::~LogCapture() { set_log_sink(previous_); }

std::vector<std::string> LogCapture::lines() const {
  std::lock_guard lk(mu_);
  return lines_;
}

std::vector<std::string> LogCapture::matching(std::initializer_list<std::string_view> parts) const {
  std::vector<std::string> out;
  for (const auto& l : lines()) {
    bool all = true;
    for (const auto p : parts) all = all && l.find(p) != std::string::npos;
    if (all) out.push_back(l);
  }
  return out;
}

TempDir::TempDir(const std::string& tag) : TempDir(tag, [] {
  const char* base = std::getenv("TMPDIR");
  return std::string(base && *base ? base : "/var/tmp");
}()) {}

TempDir::TempDir(const std::string& tag, const std::string& base) {
  std::string templ = base + "/" + tag + "-XXXXXX";
  if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed: " + templ);
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ec);
  std::filesystem::remove_all(path_, ec);
}

SmallTmpfs::SmallTmpfs(const TempDir& dir, const char* options) : mnt_((dir / "small").string()) {
  if (::geteuid() != 0) {
    MESSAGE("skipped: mounting a small tmpfs needs root");
    std::exit(77);
  }
  std::filesystem::create_directory(mnt_);
  if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, options) != 0) {
    MESSAGE("skipped: cannot mount tmpfs here: " << std::strerror(errno));
    std::exit(77);
  }
}

SmallTmpfs::~SmallTmpfs() { ::umount2(mnt_.c_str(), MNT_DETACH); }

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed) {
  std::vector<std::uint8_t> out(n);
  std::uint64_t s = seed;
  for (std::size_t i = 0; i < n; i += 8) {
    const std::uint64_t z = splitmix64(s);
    for (std::size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<std::uint8_t>(z >> (8 * j));
  }
  return out;
}

std::vector<std::uint8_t> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + p.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void write_all(const std::filesystem::path& p, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

bool limit_address_space(std::uint64_t extra_bytes) {
  long pages = 0;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
    std::fclose(f);
  }
  const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) + static_cast<rlim_t>(extra_bytes);
  const rlimit rl{limit, limit};
  return ::setrlimit(RLIMIT_AS, &rl) == 0;
}

std::string run_command(const std::string& cmd, int* status) {
  std::string out;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + cmd);
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int rc = pclose(pipe);
  if (status) *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
  return out;
}

std::string demo_program() {
  const std::string demo = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt-demo";
  if (!std::filesystem::exists(demo)) {
    MESSAGE("skipped: " << demo << " is not built (CKPT_BUILD_APPS=OFF)");
    std::exit(77);
  }
  return demo;
}

ScopedEnv::ScopedEnv(const std::map<std::string, std::optional<std::string>>& vars) {
  for (const auto& [name, value] : vars) {
    const char* old = std::getenv(name.c_str());
    saved_[name] = old ? std::optional<std::string>(old) : std::nullopt;
    if (value) ::setenv(name.c_str(), value->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
}

ScopedEnv::~ScopedEnv() {
  for (const auto& [name, value] : saved_) value ? ::setenv(name.c_str(), value->c_str(), 1) : ::unsetenv(name.c_str());
}

}  // namespace ckpt::test
