// SPDX-License-Identifier: Apache-2.0
// A FileSystem wrapper that injects faults into the one it wraps (RocksDB's
// FaultInjectionFileSystem is the model): fail the n-th operation of a kind with an errno,
// make the n-th write short (part of the data reaches the file, then the call fails), or
// "crash" after the n-th mutating operation, after which nothing more reaches the disk, which
// is what a killed process leaves behind. Tests use it to walk a save through every write and
// every step of the commit sequence.
//
// It also simulates a power loss: it remembers what has not been made durable (file data
// written since the file's last fsync, directory entries created or renamed since their
// parent directory's last fsync) and simulate_power_loss() takes exactly that away on the
// disk underneath, in reverse order: unsynced renames are undone, unsynced new entries are
// removed, and files are cut back to the size they had at their last fsync. Removals are
// treated as durable at once (the simulation does not resurrect deleted entries).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/fs/file_system.hpp"

namespace ckpt::testing {

class FaultInjectionFileSystem final : public FileSystem {
 public:
  enum class Op { create, write, allocate, truncate, sync, close, create_dir, sync_dir, rename, remove, kCount };

  /// Wraps `base`, which must outlive this object. Thread-safe.
  explicit FaultInjectionFileSystem(FileSystem& base) : base_(base) {}

  /// The n-th (0-based, counted from this call) `op` fails with `err` (EIO, ENOSPC, ...).
  void fail_nth(Op op, std::uint64_t n, int err);
  /// The n-th write writes only its first half, then fails with EIO.
  void short_write_nth(std::uint64_t n);
  /// Mutating operations after the first n succeed never: each throws Errc::aborted
  /// ("simulated crash") and changes nothing on disk.
  void crash_after(std::uint64_t n_mutations);
  /// While held, every file fsync blocks (a slow disk, deterministic): tests use it to keep
  /// a save in flight. Releasing wakes them.
  void hold_syncs(bool hold);
  /// fsyncs currently blocked by hold_syncs.
  int held_syncs() const;
  /// The same for writes (write_at, and the io_uring writer's before_native_write, which
  /// then blocks the writer's thread): tests use it to stop a save mid-write.
  void hold_writes(bool hold);
  /// Writes currently blocked by hold_writes.
  int held_writes() const;
  /// Stops every further operation (as crash_after) and rolls the disk back to what had been
  /// made durable, as a power cut would. Returns a line per undone change, for test logs.
  std::vector<std::string> simulate_power_loss();
  /// Clears all armed faults and counters.
  void reset();

  /// Operations of a kind seen since the last reset (failed ones included).
  std::uint64_t count(Op op) const;
  /// Mutating operations (everything but reads and listing) seen since the last reset.
  std::uint64_t mutations() const { return mutations_.load(); }
  bool crashed() const { return crashed_.load(); }

  std::unique_ptr<WritableFile> create(const std::string& path, const WriteOptions& opts) override;
  std::unique_ptr<ReadableFile> open_read(const std::string& path) override { return base_.open_read(path); }
  void create_dir(const std::string& path) override;
  void create_dirs(const std::string& path) override;
  void sync_dir(const std::string& path) override;
  void rename(const std::string& from, const std::string& to) override;
  void remove_all(const std::string& path) override;
  std::vector<DirEntry> list_dir(const std::string& path) override { return base_.list_dir(path); }
  std::optional<FileStat> stat(const std::string& path) override { return base_.stat(path); }
  /// Passed through, neither counted nor faulted: the lock is not part of a save.
  std::unique_ptr<FileLock> try_lock(const std::string& path, std::string_view record) override { return base_.try_lock(path, record); }
  std::optional<std::uint64_t> free_space(const std::string& path) noexcept override { return base_.free_space(path); }

  /// Called by the wrapped files: counts the op, throws if a fault is armed for it.
  /// Returns true when the op is a write that must be shortened.
  bool before(Op op, const std::string& path);
  /// Called by a wrapped file after a successful fsync: its current size is durable.
  void note_synced(std::uint64_t file_id);

 private:
  FileSystem& base_;
  mutable std::mutex mu_;
  std::uint64_t counts_[static_cast<int>(Op::kCount)] = {};
  struct Armed {
    bool on = false;
    std::uint64_t at = 0;
    int err = 0;
  } fail_[static_cast<int>(Op::kCount)];
  Armed short_;
  std::atomic<std::uint64_t> mutations_{0};
  std::uint64_t crash_at_ = UINT64_MAX;
  std::atomic<bool> crashed_{false};
  // Durability tracking, for simulate_power_loss.
  struct TrackedFile {
    std::string path;  // current path (follows renames of the file and of its directories)
    std::uint64_t synced_size = 0;
  };
  struct DirChange {
    enum Kind { created, renamed } kind;
    std::string parent;  // directory whose fsync makes the change durable
    std::string path, from;
    std::optional<std::string> replaced;  // bytes of the file a rename replaced (e.g. `latest`)
  };
  std::vector<TrackedFile> files_;
  std::vector<DirChange> dir_changes_;
  void log_created(const std::string& path);
  // A hold of one kind of operation: while `on`, they block; `waiting` are blocked now.
  struct Hold {
    bool on = false;
    int waiting = 0;
  };
  Hold sync_hold_, write_hold_;
  std::condition_variable hold_cv_;
  void set_hold(Hold& h, bool on);
  int waiting(const Hold& h) const;
  void wait_while_held(Hold& h);
 public:
  /// Used by the wrapped files: blocks while syncs are held.
  void wait_if_held();
  /// Used by the wrapped files: blocks while writes are held.
  void wait_if_writes_held();
};

}  // namespace ckpt::testing
