// SPDX-License-Identifier: Apache-2.0
#include "timed_fs.hpp"

namespace bench {

namespace {

class TimedFile final : public ckpt::WritableFile {
 public:
  TimedFile(TimedFileSystem& fs, std::unique_ptr<ckpt::WritableFile> inner) : fs_(fs), inner_(std::move(inner)) {}
  void write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    const auto t0 = Clock::now();
    inner_->write_at(offset, data);
    fs_.record("write", inner_->path(), t0);
  }
  void allocate(std::uint64_t size) override {
    const auto t0 = Clock::now();
    inner_->allocate(size);
    fs_.record("allocate", inner_->path(), t0);
  }
  void truncate(std::uint64_t size) override {
    const auto t0 = Clock::now();
    inner_->truncate(size);
    fs_.record("truncate", inner_->path(), t0);
  }
  void sync() override {
    const auto t0 = Clock::now();
    inner_->sync();
    fs_.record("sync", inner_->path(), t0);
  }
  void close() override {
    const auto t0 = Clock::now();
    inner_->close();
    fs_.record("close", inner_->path(), t0);
  }
  int native_handle() const noexcept override { return inner_->native_handle(); }
  std::size_t before_native_write(std::uint64_t offset, std::size_t len) override { return inner_->before_native_write(offset, len); }
  bool is_direct() const noexcept override { return inner_->is_direct(); }
  const std::string& path() const noexcept override { return inner_->path(); }

 private:
  TimedFileSystem& fs_;
  std::unique_ptr<ckpt::WritableFile> inner_;
};

}  // namespace

std::vector<FsEvent> TimedFileSystem::take() {
  std::lock_guard lk(mu_);
  std::vector<FsEvent> out;
  out.swap(events_);
  return out;
}

void TimedFileSystem::record(std::string op, const std::string& path, Clock::time_point t0) {
  const auto t1 = Clock::now();
  std::lock_guard lk(mu_);
  events_.push_back({std::move(op), path, t0, t1});
}

std::unique_ptr<ckpt::WritableFile> TimedFileSystem::create(const std::string& path, const ckpt::WriteOptions& opts) {
  const auto t0 = Clock::now();
  auto f = std::make_unique<TimedFile>(*this, inner_.create(path, opts));
  record("create", path, t0);
  return f;
}

std::unique_ptr<ckpt::ReadableFile> TimedFileSystem::open_read(const std::string& path) {
  const auto t0 = Clock::now();
  auto f = inner_.open_read(path);
  record("open_read", path, t0);
  return f;
}

void TimedFileSystem::create_dir(const std::string& path) {
  const auto t0 = Clock::now();
  inner_.create_dir(path);
  record("create_dir", path, t0);
}

void TimedFileSystem::create_dirs(const std::string& path) {
  const auto t0 = Clock::now();
  inner_.create_dirs(path);
  record("create_dirs", path, t0);
}

void TimedFileSystem::sync_dir(const std::string& path) {
  const auto t0 = Clock::now();
  inner_.sync_dir(path);
  record("sync_dir", path, t0);
}

void TimedFileSystem::rename(const std::string& from, const std::string& to) {
  const auto t0 = Clock::now();
  inner_.rename(from, to);
  record("rename", from, t0);
}

void TimedFileSystem::remove_all(const std::string& path) {
  const auto t0 = Clock::now();
  inner_.remove_all(path);
  record("remove_all", path, t0);
}

std::vector<ckpt::DirEntry> TimedFileSystem::list_dir(const std::string& path) {
  const auto t0 = Clock::now();
  auto v = inner_.list_dir(path);
  record("list_dir", path, t0);
  return v;
}

std::optional<ckpt::FileStat> TimedFileSystem::stat(const std::string& path) {
  const auto t0 = Clock::now();
  auto s = inner_.stat(path);
  record("stat", path, t0);
  return s;
}

}  // namespace bench
