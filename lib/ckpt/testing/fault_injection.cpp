// SPDX-License-Identifier: Apache-2.0
#include "ckpt/testing/fault_injection.hpp"

#include <unistd.h>

#include <cerrno>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"

namespace ckpt::testing {

namespace {
const char* op_name(FaultInjectionFileSystem::Op op) {
  using Op = FaultInjectionFileSystem::Op;
  switch (op) {
    case Op::create: return "create";
    case Op::write: return "write";
    case Op::allocate: return "fallocate";
    case Op::truncate: return "ftruncate";
    case Op::sync: return "fsync";
    case Op::close: return "close";
    case Op::create_dir: return "mkdir";
    case Op::sync_dir: return "fsync directory";
    case Op::rename: return "rename";
    case Op::remove: return "remove";
    default: return "?";
  }
}


class FaultyFile final : public WritableFile {
 public:
  FaultyFile(FaultInjectionFileSystem& fs, std::unique_ptr<WritableFile> f, std::uint64_t id) : fs_(fs), f_(std::move(f)), id_(id) {}
  void write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    fs_.wait_if_writes_held();
    if (fs_.before(FaultInjectionFileSystem::Op::write, f_->path())) {
      f_->write_at(offset, data.first(data.size() / 2));
      throw_errno(EIO, "pwrite (short write, injected)", f_->path());
    }
    f_->write_at(offset, data);
  }
  void allocate(std::uint64_t size) override {
    fs_.before(FaultInjectionFileSystem::Op::allocate, f_->path());
    f_->allocate(size);
  }
  void truncate(std::uint64_t size) override {
    fs_.before(FaultInjectionFileSystem::Op::truncate, f_->path());
    f_->truncate(size);
  }
  void sync() override {
    fs_.before(FaultInjectionFileSystem::Op::sync, f_->path());
    fs_.wait_if_held();
    f_->sync();
    fs_.note_synced(id_);
  }
  void close() override {
    fs_.before(FaultInjectionFileSystem::Op::close, f_->path());
    f_->close();
  }
  // The real descriptor: the io_uring writer drives it, and meets the same faults through
  // before_native_write as the posix writer does through write_at.
  int native_handle() const noexcept override { return f_->native_handle(); }
  std::size_t before_native_write(std::uint64_t, std::size_t len) override {
    fs_.wait_if_writes_held();
    return fs_.before(FaultInjectionFileSystem::Op::write, f_->path()) ? len / 2 : len;
  }
  bool is_direct() const noexcept override { return f_->is_direct(); }
  bool reopen_buffered() override { return f_->reopen_buffered(); }
  const std::string& path() const noexcept override { return f_->path(); }

 private:
  FaultInjectionFileSystem& fs_;
  std::unique_ptr<WritableFile> f_;
  std::uint64_t id_;
};
}  // namespace

void FaultInjectionFileSystem::fail_nth(Op op, std::uint64_t n, int err) {
  std::lock_guard lk(mu_);
  fail_[static_cast<int>(op)] = {true, counts_[static_cast<int>(op)] + n, err};
}

void FaultInjectionFileSystem::short_write_nth(std::uint64_t n) {
  std::lock_guard lk(mu_);
  short_ = {true, counts_[static_cast<int>(Op::write)] + n, EIO};
}

void FaultInjectionFileSystem::crash_after(std::uint64_t n) {
  std::lock_guard lk(mu_);
  crash_at_ = mutations_.load() + n;
}

void FaultInjectionFileSystem::set_hold(Hold& h, bool on) {
  {
    std::lock_guard lk(mu_);
    h.on = on;
  }
  hold_cv_.notify_all();
}

int FaultInjectionFileSystem::waiting(const Hold& h) const {
  std::lock_guard lk(mu_);
  return h.waiting;
}

void FaultInjectionFileSystem::wait_while_held(Hold& h) {
  std::unique_lock lk(mu_);
  if (!h.on) return;
  ++h.waiting;
  hold_cv_.wait(lk, [&] { return !h.on; });
  --h.waiting;
}

void FaultInjectionFileSystem::hold_syncs(bool hold) { set_hold(sync_hold_, hold); }
int FaultInjectionFileSystem::held_syncs() const { return waiting(sync_hold_); }
void FaultInjectionFileSystem::wait_if_held() { wait_while_held(sync_hold_); }
void FaultInjectionFileSystem::hold_writes(bool hold) { set_hold(write_hold_, hold); }
int FaultInjectionFileSystem::held_writes() const { return waiting(write_hold_); }
void FaultInjectionFileSystem::wait_if_writes_held() { wait_while_held(write_hold_); }

void FaultInjectionFileSystem::reset() {
  std::lock_guard lk(mu_);
  for (auto& c : counts_) c = 0;
  for (auto& f : fail_) f = {};
  files_.clear();
  dir_changes_.clear();
  short_ = {};
  mutations_ = 0;
  crash_at_ = UINT64_MAX;
  crashed_ = false;
}

std::uint64_t FaultInjectionFileSystem::count(Op op) const {
  std::lock_guard lk(mu_);
  return counts_[static_cast<int>(op)];
}

bool FaultInjectionFileSystem::before(Op op, const std::string& path) {
  std::lock_guard lk(mu_);
  const std::uint64_t index = counts_[static_cast<int>(op)]++;
  const std::uint64_t m = mutations_++;
  if (m >= crash_at_) {
    crashed_ = true;
    throw Error(Errc::aborted, path, std::string("simulated crash before ") + op_name(op));
  }
  Armed& f = fail_[static_cast<int>(op)];
  if (f.on && index == f.at) {
    f.on = false;
    throw_errno(f.err, std::string(op_name(op)) + " (injected)", path);
  }
  if (op == Op::write && short_.on && index == short_.at) {
    short_.on = false;
    return true;
  }
  return false;
}

void FaultInjectionFileSystem::log_created(const std::string& path) {
  std::lock_guard lk(mu_);
  dir_changes_.push_back({DirChange::created, parent_dir(path), path, {}, std::nullopt});
}

std::unique_ptr<WritableFile> FaultInjectionFileSystem::create(const std::string& path, const WriteOptions& opts) {
  before(Op::create, path);
  auto f = base_.create(path, opts);
  std::uint64_t id;
  {
    std::lock_guard lk(mu_);
    id = files_.size();
    files_.push_back({path, 0});
  }
  log_created(path);
  return std::make_unique<FaultyFile>(*this, std::move(f), id);
}
void FaultInjectionFileSystem::create_dir(const std::string& path) {
  before(Op::create_dir, path);
  base_.create_dir(path);
  log_created(path);
}
void FaultInjectionFileSystem::create_dirs(const std::string& path) {
  before(Op::create_dir, path);
  const bool existed = base_.stat(path).has_value();
  base_.create_dirs(path);
  if (!existed) log_created(path);  // (missing parents are not tracked: tests create roots themselves)
}
void FaultInjectionFileSystem::sync_dir(const std::string& path) {
  before(Op::sync_dir, path);
  base_.sync_dir(path);
  std::lock_guard lk(mu_);
  std::erase_if(dir_changes_, [&](const DirChange& c) { return c.parent == path; });
}
void FaultInjectionFileSystem::rename(const std::string& from, const std::string& to) {
  before(Op::rename, from);
  // A rename over a file replaces it; until the directory is synced, a power cut brings the
  // old file back, so keep its bytes (only small files such as `latest` are replaced).
  std::optional<std::string> replaced;
  if (auto st = base_.stat(to); st && st->type == EntryType::file && st->size <= (1u << 20)) {
    auto f = base_.open_read(to);
    replaced.emplace(static_cast<std::size_t>(f->size()), '\0');
    f->read_at(0, std::as_writable_bytes(std::span(replaced->data(), replaced->size())));
  }
  base_.rename(from, to);
  std::lock_guard lk(mu_);
  for (auto& f : files_) {
    if (f.path == from) f.path = to;
    else if (f.path.starts_with(from + "/")) f.path = to + f.path.substr(from.size());
  }
  // Earlier changes keep the paths they were made under: the undo runs in reverse order, so
  // by the time it reaches them, this rename has been undone and those paths are right again.
  dir_changes_.push_back({DirChange::renamed, parent_dir(to), to, from, std::move(replaced)});
}

void FaultInjectionFileSystem::note_synced(std::uint64_t id) {
  std::lock_guard lk(mu_);
  auto& f = files_.at(id);
  if (auto st = base_.stat(f.path)) f.synced_size = st->size;
}

std::vector<std::string> FaultInjectionFileSystem::simulate_power_loss() {
  std::vector<std::string> undone;
  std::lock_guard lk(mu_);
  crash_at_ = 0;  // nothing after the cut reaches the disk
  crashed_ = true;
  for (auto it = dir_changes_.rbegin(); it != dir_changes_.rend(); ++it) {
    try {
      if (it->kind == DirChange::renamed) {
        if (!base_.stat(it->path)) continue;
        base_.rename(it->path, it->from);
        for (auto& f : files_) {
          if (f.path == it->path) f.path = it->from;
          else if (f.path.starts_with(it->path + "/")) f.path = it->from + f.path.substr(it->path.size());
        }
        if (it->replaced) {
          auto f = base_.create(it->path, {});
          f->write_at(0, std::as_bytes(std::span(it->replaced->data(), it->replaced->size())));
          f->sync();
          f->close();
        }
        undone.push_back("rename undone: " + it->path + " -> " + it->from + (it->replaced ? " (old file restored)" : ""));
      } else if (base_.stat(it->path)) {
        base_.remove_all(it->path);
        undone.push_back("entry lost: " + it->path);
      }
    } catch (const Error& e) {
      undone.push_back(std::string("could not undo: ") + e.what());
    }
  }
  dir_changes_.clear();
  for (const auto& f : files_) {
    const auto st = base_.stat(f.path);
    if (!st || st->type != EntryType::file || st->size <= f.synced_size) continue;
    if (::truncate(f.path.c_str(), static_cast<off_t>(f.synced_size)) == 0)
      undone.push_back("unsynced data lost: " + f.path + " cut to " + std::to_string(f.synced_size) + " bytes");
  }
  return undone;
}
void FaultInjectionFileSystem::remove_all(const std::string& path) {
  before(Op::remove, path);
  base_.remove_all(path);
}

}  // namespace ckpt::testing
