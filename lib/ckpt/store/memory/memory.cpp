// SPDX-License-Identifier: Apache-2.0
// The memory store (store/memory/memory.hpp): a directory or node set in shared memory, served
// through the store of that kind (over the file system given: the POSIX one, or under MPI the
// one that routes other nodes' roots to their processes; either creates what is in the memory
// directory private and syncs nothing there, fs/file_system.hpp's in_memory_dir), with the
// memory root's private directories checked first and its bound checked at commit.
#include "ckpt/store/memory/memory.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/detail/kinds.hpp"
#include "ckpt/store/store.hpp"

namespace ckpt {

namespace {
constexpr std::string_view kScheme = "mem://";

std::string octal_mode(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0%03o", static_cast<unsigned>(m & 07777));
  return buf;
}

std::string private_dir_wanted() { return "a directory owned by uid " + std::to_string(::geteuid()) + ", mode 0700"; }

// Makes `dir` (one level; its parent exists) with mode 0700 unless it exists, then checks it.
void make_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) throw_errno(errno, "mkdir", dir);
  check_private_dir(dir);
}

class MemoryTarget final : public StepTarget {
 public:
  MemoryTarget(std::unique_ptr<StepTarget> inner, std::string name, std::uint64_t limit)
      : inner_(std::move(inner)), name_(std::move(name)), limit_(limit) {}
  ~MemoryTarget() override { abort(); }
  std::uint64_t step() const noexcept override { return inner_->step(); }
  const std::string& shard_dir(int rank) const override { return inner_->shard_dir(rank); }
  FileSystem* file_system() const noexcept override { return inner_->file_system(); }
  void write_shard(int rank, const std::string& name, const ReadableFile& source, const PieceCheck& check, PieceSize pieces) override {
    inner_->write_shard(rank, name, source, check, pieces);
  }
  bool keeps_blocks_of(const NodeLayout& layout) const noexcept override { return inner_->keeps_blocks_of(layout); }
  void write_redundancy_block(const RedundancyBlock& block, const ReadableFile& source, const PieceCheck& check, PieceSize pieces) override {
    inner_->write_redundancy_block(block, source, check, pieces);
  }
  int shards_at_once() const noexcept override { return inner_->shards_at_once(); }
  std::size_t redundancy_units(std::span<const std::uint64_t> sizes) const override { return inner_->redundancy_units(sizes); }
  std::vector<RedundancyBlock> write_redundancy_unit(std::span<const std::uint64_t> sizes, std::size_t unit,
                                                     const std::function<void(int, std::uint64_t, std::span<std::byte>)>& data,
                                                     std::uint64_t chunk_size, const std::function<bool()>& stopped) override {
    return inner_->write_redundancy_unit(sizes, unit, data, chunk_size, stopped);
  }

 protected:
  std::string commit_step(Manifest manifest, std::vector<RedundancyBlock> blocks, std::string text) override {
    std::uint64_t bytes = 0;
    for (const auto& s : manifest.shards) bytes += s.size;
    for (const auto& b : blocks) bytes += b.size;
    if (limit_ != 0 && memory_needed(bytes) > limit_)
      throw Error(Errc::no_space, name_,
                  "a memory generation of " + std::to_string(bytes) + " bytes (shards and redundancy) is kept beside the previous one",
                  "at most " + std::to_string(limit_) + " bytes (StoreOptions::memory_limit)", std::to_string(memory_needed(bytes)) + " bytes");
    return inner_->commit(std::move(manifest), std::move(blocks), std::move(text));
  }
  void abort_step() noexcept override { inner_->abort(); }

 private:
  std::unique_ptr<StepTarget> inner_;
  std::string name_;
  std::uint64_t limit_;
};

class MemoryWriter final : public StoreWriter {
 public:
  MemoryWriter(std::unique_ptr<StoreWriter> inner, const CheckpointStore& store, std::uint64_t limit)
      : inner_(std::move(inner)), store_(store), limit_(limit) {}
  const std::vector<std::string>& cleaned_up() const noexcept override { return inner_->cleaned_up(); }
  std::unique_ptr<StepTarget> begin(std::uint64_t step, const StepOptions& options) override {
    return std::make_unique<MemoryTarget>(inner_->begin(step, options), store_.name_of(step), limit_);
  }
  std::string establish_run_identity() override { return inner_->establish_run_identity(); }
  std::vector<RepairReport> repair(std::optional<std::uint64_t> step, Verify verify) override { return inner_->repair(step, verify); }
  std::vector<std::uint64_t> rotate(int keep_last, std::uint64_t committed, const KeepStep& keep) override {
    return inner_->rotate(keep_last, committed, keep);
  }
  std::vector<std::uint64_t> make_room(std::uint64_t needed, const KeepStep& keep) override { return inner_->make_room(needed, keep); }
  void remove(std::uint64_t step) override { inner_->remove(step); }

 private:
  std::unique_ptr<StoreWriter> inner_;
  const CheckpointStore& store_;
  std::uint64_t limit_;
};

class MemoryStore final : public CheckpointStore {
 public:
  MemoryStore(std::string root, std::string dir, StoreOptions options)
      : CheckpointStore(std::move(root)), dir_(std::move(dir)), options_(std::move(options)), fs_(options_.fs ? *options_.fs : posix_file_system()) {
    check_private_dir(memory_user_dir());
    check_private_dir(dir_);
    inner_ = inner_store();
  }
  StoreKind kind() const noexcept override { return StoreKind::memory; }
  std::string name_of(std::uint64_t step) const override { return join_path(root(), checkpoint_dir_name(step)); }
  std::optional<std::uint64_t> latest() override { return inner_->latest(); }
  std::vector<std::uint64_t> steps() override { return inner_->steps(); }
  std::optional<std::string> committed_evidence() override { return inner_->committed_evidence(); }
  std::vector<StoredCheckpoint> list(Verify verify) override {
    if (!fs_.stat(dir_)) throw Error(Errc::not_found, root(), "no such memory root", "its directory " + dir_, "missing");
    return inner_->list(verify);
  }
  std::shared_ptr<const Manifest> manifest(std::uint64_t step) override { return inner_->manifest(step); }
  StoredCheckpoint describe(std::uint64_t step) override { return inner_->describe(step); }
  CheckpointReader open(std::uint64_t step, std::optional<int> world) override { return inner_->open(step, world); }
  std::unique_ptr<ReadableFile> shard(std::uint64_t step, const ShardRecord& file) override { return inner_->shard(step, file); }
  std::unique_ptr<ReadableFile> redundancy_block(std::uint64_t step, std::size_t index) override { return inner_->redundancy_block(step, index); }
  void verify(std::uint64_t step, Verify mode, const ProgressFn& progress) override { inner_->verify(step, mode, progress); }
  std::shared_ptr<const NodeCheckpointHealth> health(std::uint64_t step, Verify mode) override { return inner_->health(step, mode); }
  bool rotated_away(std::uint64_t step) noexcept override { return inner_->rotated_away(step); }
  std::string manifest_text(std::uint64_t step) override { return inner_->manifest_text(step); }
  std::unique_ptr<StoreWriter> writer(const WriterOptions& options) override {
    // The private directories first (a participant of a shared run finds them made by the
    // lead's process, or makes them itself: mkdir is atomic).
    make_private_dir(memory_user_dir());
    make_private_dir(dir_);
    return std::make_unique<MemoryWriter>(inner_->writer(options), *this, options_.memory_limit);
  }

 protected:
  Error no_latest_error() override { return no_latest_error_of(*inner_); }
  std::vector<std::uint64_t> fallback_steps() override { return fallback_steps_of(*inner_); }

 private:
  std::unique_ptr<CheckpointStore> inner_store() {
    StoreOptions o;
    o.fs = &fs_;
    o.nodes = options_.nodes;
    return open_store(dir_, o);
  }

  std::string dir_;
  StoreOptions options_;
  FileSystem& fs_;
  std::unique_ptr<CheckpointStore> inner_;
};

}  // namespace

bool is_memory_root(std::string_view root) noexcept { return root.starts_with(kScheme); }

std::string memory_root_name(std::string_view root) {
  if (!is_memory_root(root)) throw Error(Errc::invalid_argument, std::string(root), "not a memory root", "mem://NAME", std::string(root));
  std::string_view name = root.substr(kScheme.size());
  while (!name.empty() && name.back() == '/') name.remove_suffix(1);
  bool ok = !name.empty() && name.size() <= 64 && name.front() != '.';
  for (const char c : name)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-');
  if (!ok)
    throw Error(Errc::invalid_argument, std::string(root), "a memory root's name", "1..64 of [A-Za-z0-9._-], not starting with '.'",
                "'" + std::string(name.substr(0, 80)) + "'");
  return std::string(name);
}

std::string memory_root_dir(std::string_view root) { return memory_user_dir() + "/" + memory_root_name(root); }

std::string root_directory(std::string_view root) { return is_memory_root(root) ? memory_root_dir(root) : std::string(root); }

void check_private_dir(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw_errno(errno, "lstat", dir);
  }
  if (S_ISLNK(st.st_mode)) throw Error(Errc::unsafe_path, dir, "a memory root's directory is a symlink", private_dir_wanted(), "a symlink");
  if (!S_ISDIR(st.st_mode)) throw Error(Errc::unsafe_path, dir, "a memory root's directory is not a directory", private_dir_wanted(), "another file type");
  if (st.st_uid != ::geteuid())
    throw Error(Errc::unsafe_path, dir, "a memory root's directory belongs to another user", private_dir_wanted(),
                "owned by uid " + std::to_string(st.st_uid));
  if ((st.st_mode & 077) != 0)
    throw Error(Errc::unsafe_path, dir, "a memory root's directory is open to other users", private_dir_wanted(), "mode " + octal_mode(st.st_mode));
}

namespace detail {
std::unique_ptr<CheckpointStore> make_memory_store(std::string root, const StoreOptions& options) {
  std::string dir = memory_root_dir(root);
  return std::make_unique<MemoryStore>(std::move(root), std::move(dir), options);
}
}  // namespace detail

}  // namespace ckpt
