#include "ckpt/io/fault_injection.hpp"

#include <cerrno>

#include "ckpt/core/error.hpp"

namespace ckpt {

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
  FaultyFile(FaultInjectionFileSystem& fs, std::unique_ptr<WritableFile> f) : fs_(fs), f_(std::move(f)) {}
  void write_at(std::uint64_t offset, std::span<const std::byte> data) override {
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
  }
  void close() override {
    fs_.before(FaultInjectionFileSystem::Op::close, f_->path());
    f_->close();
  }
  // The descriptor is hidden so that writers which drive descriptors themselves (io_uring)
  // fall back to write_at, where the faults are.
  int native_handle() const noexcept override { return -1; }
  bool is_direct() const noexcept override { return f_->is_direct(); }
  const std::string& path() const noexcept override { return f_->path(); }

 private:
  FaultInjectionFileSystem& fs_;
  std::unique_ptr<WritableFile> f_;
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

void FaultInjectionFileSystem::hold_syncs(bool hold) {
  {
    std::lock_guard lk(mu_);
    hold_ = hold;
  }
  hold_cv_.notify_all();
}

int FaultInjectionFileSystem::held_syncs() const {
  std::lock_guard lk(mu_);
  return held_;
}

void FaultInjectionFileSystem::wait_if_held() {
  std::unique_lock lk(mu_);
  ++held_;
  hold_cv_.wait(lk, [&] { return !hold_; });
  --held_;
}

void FaultInjectionFileSystem::reset() {
  std::lock_guard lk(mu_);
  for (auto& c : counts_) c = 0;
  for (auto& f : fail_) f = {};
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

std::unique_ptr<WritableFile> FaultInjectionFileSystem::create(const std::string& path, const WriteOptions& opts) {
  before(Op::create, path);
  return std::make_unique<FaultyFile>(*this, base_.create(path, opts));
}
void FaultInjectionFileSystem::create_dir(const std::string& path) {
  before(Op::create_dir, path);
  base_.create_dir(path);
}
void FaultInjectionFileSystem::create_dirs(const std::string& path) {
  before(Op::create_dir, path);
  base_.create_dirs(path);
}
void FaultInjectionFileSystem::sync_dir(const std::string& path) {
  before(Op::sync_dir, path);
  base_.sync_dir(path);
}
void FaultInjectionFileSystem::rename(const std::string& from, const std::string& to) {
  before(Op::rename, from);
  base_.rename(from, to);
}
void FaultInjectionFileSystem::remove_all(const std::string& path) {
  before(Op::remove, path);
  base_.remove_all(path);
}

}  // namespace ckpt
