// SPDX-License-Identifier: Apache-2.0
// A FileSystem wrapper that timestamps every call the checkpointer makes (create, allocate,
// fsync, close, rename, directory fsync, removal), so the timeline shows when each shard's
// fsync and each commit step really ran, not only how long they took. The io_uring writer
// still drives the real descriptor (native_handle passes through), so the writes themselves
// are not slowed; the posix writer's pwrites are timestamped too.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "bench.hpp"
#include "ckpt/fs/file_system.hpp"

namespace bench {

struct FsEvent {
  std::string op;    // "create", "allocate", "write", "truncate", "sync", "close", "sync_dir", "rename", ...
  std::string path;  // for rename: the source
  Clock::time_point t0, t1;
};

class TimedFileSystem final : public ckpt::FileSystem {
 public:
  explicit TimedFileSystem(ckpt::FileSystem& inner) : inner_(inner) {}

  /// Takes the events recorded so far (and forgets them).
  std::vector<FsEvent> take();
  void record(std::string op, const std::string& path, Clock::time_point t0);

  std::unique_ptr<ckpt::WritableFile> create(const std::string& path, const ckpt::WriteOptions& opts) override;
  std::unique_ptr<ckpt::ReadableFile> open_read(const std::string& path) override;
  void create_dir(const std::string& path) override;
  void create_dirs(const std::string& path) override;
  void sync_dir(const std::string& path) override;
  void rename(const std::string& from, const std::string& to) override;
  void remove_all(const std::string& path) override;
  std::vector<ckpt::DirEntry> list_dir(const std::string& path) override;
  std::optional<ckpt::FileStat> stat(const std::string& path) override;
  std::unique_ptr<ckpt::FileLock> try_lock(const std::string& path, std::string_view record) override {
    return inner_.try_lock(path, record);
  }

 private:
  ckpt::FileSystem& inner_;
  std::mutex mu_;
  std::vector<FsEvent> events_;
};

}  // namespace bench
