// SPDX-License-Identifier: Apache-2.0
// The writer lock; the contract and what it cannot guarantee are in root_lock.hpp.
#include "ckpt/store/root_lock.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/fs/layout.hpp"

namespace ckpt {

namespace {

// A lock record is a few short lines; anything longer is not one.
constexpr std::uint64_t kMaxRecord = 4096;

// errno values of a file system that has no locks: the writer goes on unprotected.
bool locks_unsupported(int err) noexcept { return err == ENOSYS || err == EOPNOTSUPP || err == ENOLCK; }

// ROOT/.lock, once ROOT exists.
std::string root_lock_path(FileSystem& fs, const std::string& root) {
  fs.create_dirs(root);
  return join_path(root, kLockName);
}

}  // namespace

std::string LockHolder::describe() const {
  if (pid == 0) return "an unknown process (its lock file has no record yet)";
  std::string out = "pid " + std::to_string(pid);
  if (!program.empty()) out += " (" + program + ")";
  if (!host.empty()) out += " on host " + host;
  if (!since.empty()) out += " since " + since;
  return out;
}

std::string lock_record() {
  return "pid " + std::to_string(::getpid()) + "\nhost " + host_name() + "\nprogram " + program_invocation_short_name +
         "\nsince " + utc_now_rfc3339() + "\n";
}

LockHolder parse_lock_record(std::string_view text) noexcept {
  LockHolder h;
  try {
    while (!text.empty()) {
      const std::size_t eol = std::min(text.find('\n'), text.size());
      const std::string_view line = text.substr(0, eol);
      text.remove_prefix(std::min(eol + 1, text.size()));
      const std::size_t sp = line.find(' ');
      if (sp == std::string_view::npos) continue;
      const std::string_view key = line.substr(0, sp), value = line.substr(sp + 1);
      if (key == "pid") {
        long v = 0;
        bool ok = !value.empty() && value.size() <= 10;
        for (char c : value) ok = ok && c >= '0' && c <= '9';
        if (!ok) continue;
        for (char c : value) v = v * 10 + (c - '0');
        h.pid = v;
      } else if (key == "host") {
        h.host = value;
      } else if (key == "program") {
        h.program = value;
      } else if (key == "since") {
        h.since = value;
      }
    }
  } catch (...) {
    // bad_alloc: what was parsed so far
  }
  return h;
}

std::optional<LockHolder> read_lock_holder(FileSystem& fs, const std::string& lock_path) noexcept {
  try {
    if (!fs.stat(lock_path)) return std::nullopt;
    return parse_lock_record(detail::read_small_file(fs, lock_path, kMaxRecord, Errc::malformed_manifest));
  } catch (...) {
    return std::nullopt;
  }
}

RootLock::RootLock(FileSystem& fs, std::string root) : root_(std::move(root)), lock_path_(root_lock_path(fs, root_)) {
  try {
    lock_ = fs.try_lock(lock_path_, lock_record());
  } catch (const Error& e) {
    if (e.code() != Errc::io_error || !locks_unsupported(e.sys_errno())) throw;
    log_event(LogLevel::warn, "lock_unsupported", root_ + ": the file system refuses locks (" + e.what() + "): this writer is not protected against a second one");
    held_ = true;
    return;
  }
  if (!lock_) {
    const auto holder = read_lock_holder(fs, lock_path_);
    std::string who = holder ? holder->describe() : LockHolder{}.describe();
    // The record names the last ckpt writer; a program that locks without writing one (or a
    // holder still writing its record) leaves an older record behind.
    const bool exited = holder && holder->pid != 0 && holder->host == host_name() &&
                        ::kill(static_cast<pid_t>(holder->pid), 0) != 0 && errno == ESRCH;
    if (exited)
      who = "a process that left no record (the record names pid " + std::to_string(holder->pid) + ", which has exited)";
    throw Error(Errc::busy, root_, "another writer holds its lock " + lock_path_, "no other writer", who);
  }
  held_ = true;
}

RootLock::RootLock(RootLock&& other) noexcept
    : root_(std::move(other.root_)),
      lock_path_(std::move(other.lock_path_)),
      lock_(std::move(other.lock_)),
      held_(std::exchange(other.held_, false)) {}

RootLock& RootLock::operator=(RootLock&& other) noexcept {
  if (this != &other) {
    release();
    root_ = std::move(other.root_);
    lock_path_ = std::move(other.lock_path_);
    lock_ = std::move(other.lock_);
    held_ = std::exchange(other.held_, false);
  }
  return *this;
}

RootLock::~RootLock() { release(); }

void RootLock::release() noexcept {
  lock_.reset();
  held_ = false;
}

}  // namespace ckpt
