// SPDX-License-Identifier: Apache-2.0
#include "support/fuse_mount.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace ckpt::test {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool mounted_at(const fs::path& mnt) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    if (fields >> id >> parent >> dev >> root >> point && point == mnt.string()) return true;
  }
  return false;
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs argv[0] (a full path) with `args`, its output to `log` (appended); returns the exit
// status (128 + signal when killed). For the short commands of the teardown.
int run_quietly(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string find_program(const std::string& name) {
  for (const char* dir : {"/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin"}) {
    const std::string p = std::string(dir) + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return name;  // execv fails: the log says which program is missing
}

}  // namespace

const char* kind_name(FuseMount::Kind kind) {
  switch (kind) {
    case FuseMount::Kind::refuse_direct_io: return "refuse-direct-io";
    case FuseMount::Kind::short_direct_reads: return "short-direct-reads";
    case FuseMount::Kind::refuse_direct_open: return "refuse-direct-open";
    case FuseMount::Kind::bindfs: return "bindfs";
  }
  return "?";
}

FuseMount::FuseMount(const fs::path& source, const fs::path& mountpoint, Kind kind, std::uint64_t from) {
  if (::access("/dev/fuse", F_OK) != 0) {
    MESSAGE("skipped: /dev/fuse is missing, so no FUSE file system can be mounted here");
    std::exit(77);
  }
  fs::create_directories(mountpoint);
  mnt_ = fs::canonical(mountpoint);
  log_ = mnt_.string() + ".log";
  std::vector<std::string> args;
  if (kind == Kind::bindfs) args = {find_program("bindfs"), "-f", "--no-allow-other", fs::canonical(source).string(), mnt_.string()};
  else
    args = {std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt-test-fuse", kind_name(kind), fs::canonical(source).string(), mnt_.string(),
            std::to_string(from)};
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int log_fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw std::runtime_error("cannot create " + log_);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls until exec: the test process may have threads.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(log_fd);
  if (pid < 0) throw std::runtime_error("fork failed");
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  for (;;) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      const std::string said = text_of(log_);
      if (code == 77) {
        MESSAGE("skipped: FUSE mounting is not possible here: " << said);
        std::exit(77);
      }
      throw std::runtime_error(args[0] + " " + kind_name(kind) + " exited with " + std::to_string(code) + " before mounting " + mnt_.string() +
                               ": " + said);
    }
    if (mounted_at(mnt_)) break;
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      throw std::runtime_error(args[0] + " did not mount " + mnt_.string() + " within 20 s: " + text_of(log_));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = pid;
}

FuseMount::~FuseMount() {
  if (pid_ <= 0) return;
  const std::string fusermount = find_program("fusermount3");
  if (run_quietly({fusermount, "-u", mnt_.string()}, log_) != 0) run_quietly({fusermount, "-u", "-z", mnt_.string()}, log_);
  // Unmounted, the daemon's loop ends; one that does not is stopped.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (mounted_at(mnt_)) run_quietly({fusermount, "-u", "-z", mnt_.string()}, log_);
}

}  // namespace ckpt::test
