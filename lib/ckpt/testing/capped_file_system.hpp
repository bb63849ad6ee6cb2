// SPDX-License-Identifier: Apache-2.0
// A FileSystem wrapper whose files refuse to grow past a cap (Errc::no_space naming the file),
// for tests and fuzzers that hand a file system requests they did not write themselves (a
// changed or random file request naming a huge offset or size): such a request fails fast
// instead of filling memory. Everything else is forwarded unchanged.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/file_system.hpp"

namespace ckpt::testing {

class CappedFileSystem final : public FileSystemWrapper {
 public:
  /// Wraps `target` (which must outlive this object); files may hold at most `cap` bytes.
  explicit CappedFileSystem(FileSystem& target, std::uint64_t cap = 1 << 20) : FileSystemWrapper(target), cap_(cap) {}
  std::unique_ptr<WritableFile> create(const std::string& path, const WriteOptions& opts) override {
    return std::make_unique<Capped>(target().create(path, opts), cap_);
  }

 private:
  class Capped final : public WritableFile {
   public:
    Capped(std::unique_ptr<WritableFile> f, std::uint64_t cap) : f_(std::move(f)), cap_(cap) {}
    void write_at(std::uint64_t offset, std::span<const std::byte> data) override {
      check(offset, data.size());
      f_->write_at(offset, data);
    }
    void allocate(std::uint64_t size) override {
      check(size, 0);
      f_->allocate(size);
    }
    void truncate(std::uint64_t size) override {
      check(size, 0);
      f_->truncate(size);
    }
    void sync() override { f_->sync(); }
    void close() override { f_->close(); }
    int native_handle() const noexcept override { return f_->native_handle(); }
    bool is_direct() const noexcept override { return f_->is_direct(); }
    bool reopen_buffered() override { return f_->reopen_buffered(); }
    const std::string& path() const noexcept override { return f_->path(); }

   private:
    void check(std::uint64_t offset, std::uint64_t len) const {
      if (offset > cap_ || len > cap_ - offset)
        throw Error(Errc::no_space, path(), "past the file size cap", "at most " + std::to_string(cap_) + " bytes", std::to_string(offset));
    }
    std::unique_ptr<WritableFile> f_;
    std::uint64_t cap_;
  };
  std::uint64_t cap_;
};

}  // namespace ckpt::testing
