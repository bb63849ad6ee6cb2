// SPDX-License-Identifier: Apache-2.0
// A directory as a CheckpointStore: store/local/commit.hpp's protocol (ROOT/latest, ROOT/step-N,
// ROOT/.lock), the reader of read/reader.hpp, nothing else.
#include <algorithm>

#include "ckpt/format/manifest_limits.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/store/run_identity.hpp"
#include "ckpt/store/copy.hpp"
#include "ckpt/store/tiers.hpp"
#include "ckpt/store/detail/kinds.hpp"

namespace ckpt {
namespace {

class DirectoryTarget final : public StepTarget {
 public:
  DirectoryTarget(FileSystem& fs, std::string root, std::uint64_t step, std::string temp, bool lead)
      : fs_(fs), root_(std::move(root)), step_(step), temp_(std::move(temp)), lead_(lead) {}
  ~DirectoryTarget() override { abort(); }
  std::uint64_t step() const noexcept override { return step_; }
  const std::string& shard_dir(int) const override { return temp_; }
  FileSystem* file_system() const noexcept override { return &fs_; }
  void write_shard(int, const std::string& name, const ReadableFile& source, const PieceCheck& check, PieceSize pieces) override {
    detail::write_file_copy(fs_, temp_, name, source, check, pieces);
  }

 protected:
  std::string commit_step(Manifest manifest, std::vector<RedundancyBlock> blocks, std::string text) override {
    if (!lead_) detail::refuse_participant(root_, "a commit");
    if (!blocks.empty()) throw Error(Errc::invalid_argument, temp_, "redundancy blocks for a directory", "none", std::to_string(blocks.size()));
    return commit_checkpoint(fs_, root_, temp_, manifest, text);
  }
  void abort_step() noexcept override { abort_checkpoint(fs_, root_, temp_); }

 private:
  FileSystem& fs_;
  std::string root_;
  std::uint64_t step_;
  std::string temp_;
  bool lead_;
};

class DirectoryWriter final : public StoreWriter {
 public:
  DirectoryWriter(FileSystem& fs, const std::string& root, const WriterOptions& options) : fs_(fs), root_(root) {
    if (!options.lead) fs_.create_dirs(root);
    else if (options.clean_up) cleaned_ = prepare_root(fs_, lock_.emplace(fs_, root));
    else lock_.emplace(fs_, root);
  }
  const std::vector<std::string>& cleaned_up() const noexcept override { return cleaned_; }
  std::unique_ptr<StepTarget> begin(std::uint64_t step, const StepOptions& options) override {
    const bool lead = lock_.has_value();
    if (options.shared)
      return std::make_unique<DirectoryTarget>(fs_, root_, step, begin_shared_checkpoint(fs_, root_, step, options.shared->run_id, lead, options.begin), lead);
    if (!lead) detail::refuse_participant(root_, "a step begun without its shared run");
    return std::make_unique<DirectoryTarget>(fs_, root_, step, begin_checkpoint(fs_, root_, step, options.begin), true);
  }
  std::string establish_run_identity() override {
    if (!lock_) detail::refuse_participant(root_, "the run identity's record");
    return ckpt::establish_run_identity(fs_, *lock_);
  }
  std::vector<std::uint64_t> rotate(int keep_last, std::uint64_t committed, const KeepStep& keep) override {
    if (!lock_) detail::refuse_participant(root_, "rotation");
    return detail::steps_of(rotate_checkpoints(fs_, root_, keep_last, checkpoint_dir_name(committed), detail::keep_by_name(keep)));
  }
  std::vector<std::uint64_t> make_room(std::uint64_t needed, const KeepStep& keep) override {
    if (!lock_) detail::refuse_participant(root_, "a pre-save rotation");
    return detail::steps_of(ckpt::make_room(fs_, root_, needed, detail::keep_by_name(keep)));
  }
  void remove(std::uint64_t step) override {
    if (!lock_) detail::refuse_participant(root_, "a removal");
    remove_checkpoint(fs_, root_, checkpoint_dir_name(step));
  }

 private:
  FileSystem& fs_;
  std::string root_;
  std::optional<RootLock> lock_;  // the lead's
  std::vector<std::string> cleaned_;
};

class DirectoryStore final : public CheckpointStore {
 public:
  DirectoryStore(std::string root, FileSystem& fs) : CheckpointStore(std::move(root)), fs_(fs) {}
  StoreKind kind() const noexcept override { return StoreKind::directory; }

  std::optional<std::uint64_t> latest() override {
    const auto name = read_latest(fs_, root());
    if (!name) return std::nullopt;
    const auto step = parse_checkpoint_dir_name(*name);
    if (!step) throw Error(Errc::malformed_manifest, join_path(root(), kLatestName), "content", "step-NNNNNNNNNN", "'" + name->substr(0, 64) + "'");
    return step;
  }

  std::vector<std::uint64_t> steps() override {
    std::vector<std::uint64_t> out;
    if (!fs_.stat(root())) return out;
    const auto last = latest();
    if (!last) return out;  // no `latest`: nothing was committed (store/local/commit.hpp)
    for (const auto& e : fs_.list_dir(root()))
      if (const auto s = parse_checkpoint_dir_name(e.name); s && e.type == EntryType::directory && *s <= *last) out.push_back(*s);
    std::sort(out.begin(), out.end());
    return out;
  }

  // Its `latest`, whatever it holds (store/tiers.hpp, find_committed_checkpoint).
  std::optional<std::string> committed_evidence() override {
    const std::string latest = join_path(root(), kLatestName);
    if (fs_.stat(root()) && fs_.stat(latest)) return latest;
    return std::nullopt;
  }

  std::vector<StoredCheckpoint> list(Verify verify) override {
    if (!fs_.stat(root())) throw Error(Errc::not_found, root(), "no such checkpoint root");
    const auto infos = list_checkpoints(fs_, root(), verify);
    if (infos.empty() && !fs_.stat(join_path(root(), kLatestName)))
      throw Error(Errc::not_found, root(), "not a checkpoint root", "a `latest` file, step-N directories or .tmp-* temporaries", "none of them");
    std::vector<StoredCheckpoint> out;
    for (const auto& c : infos) {
      StoredCheckpoint s;
      s.name = c.name;
      s.step = c.step;
      s.state = c.state;
      s.is_latest = c.is_latest;
      s.world_size = c.world_size;
      s.bytes = c.bytes;
      s.error = c.error;
      if (c.step && c.state == CheckpointState::complete) s.copy = copy_record(*c.step);
      out.push_back(std::move(s));
    }
    return out;
  }

  std::shared_ptr<const Manifest> manifest(std::uint64_t step) override {
    return read_checkpoint_manifest(fs_, committed_dir(step));
  }
  std::string manifest_text(std::uint64_t step) override {
    return detail::read_small_file(fs_, join_path(committed_dir(step), kManifestName), kMaxManifestBytes, Errc::malformed_manifest);
  }
  // A step that is not there is the reader's Errc::not_found naming ROOT/step-N/manifest.json,
  // the file a reader of the format looks for.
  CheckpointReader open(std::uint64_t step, std::optional<int> expected_world_size) override {
    return CheckpointReader::open(fs_, name_of(step), expected_world_size);
  }
  StoredCheckpoint describe(std::uint64_t step) override {
    (void)open(step, std::nullopt);  // the manifest, and every shard there at its size
    StoredCheckpoint c = detail::described(step, manifest(step), latest() == step);
    c.copy = copy_record(step);
    return c;
  }
  std::unique_ptr<ReadableFile> shard(std::uint64_t step, const ShardRecord& file) override {
    return fs_.open_read(open(step, std::nullopt).file_path(file));
  }
  void verify(std::uint64_t step, Verify mode, const ProgressFn& progress) override { open(step, std::nullopt).verify(mode, progress); }
  bool rotated_away(std::uint64_t step) noexcept override { return ckpt::rotated_away(fs_, root(), checkpoint_dir_name(step)); }
  std::unique_ptr<StoreWriter> writer(const WriterOptions& options) override { return std::make_unique<DirectoryWriter>(fs_, root(), options); }

 protected:
  Error no_latest_error() override {
    if (!fs_.stat(root())) return Error(Errc::not_found, root(), "no such checkpoint root");
    return Error(Errc::not_found, join_path(root(), kLatestName), "no latest pointer: nothing committed yet");
  }
  // Every step-N directory, `latest` or not: one renamed into place by a commit that died
  // before its `latest` is whole.
  std::vector<std::uint64_t> fallback_steps() override {
    std::vector<std::uint64_t> out;
    if (!fs_.stat(root())) return out;
    for (const auto& e : fs_.list_dir(root()))
      if (const auto s = parse_checkpoint_dir_name(e.name); s && e.type == EntryType::directory) out.push_back(*s);
    return out;
  }

 private:
  // ROOT/step-N, when it exists (Errc::not_found naming it otherwise). Under a root that is
  // missing, no directory or unreadable, the reader's open names what is wrong with the path.
  std::string committed_dir(std::uint64_t step) {
    const std::string dir = name_of(step);
    try {
      if (const auto r = fs_.stat(root()); r && r->type == EntryType::directory && !fs_.stat(dir)) detail::throw_not_committed(dir, step);
    } catch (const Error& e) {
      if (e.code() == Errc::not_found) throw;
    }
    return dir;
  }

  // Its copy record (tier.json), if it was copied here from another store; null otherwise, and
  // for a record that does not parse (a copy record is what the copy said of itself: the
  // checkpoint's checks are its manifest's).
  std::shared_ptr<const CopyRecord> copy_record(std::uint64_t step) {
    try {
      const std::string dir = name_of(step);
      if (!fs_.stat(join_path(dir, kCopyRecordName))) return nullptr;
      return std::make_shared<const CopyRecord>(read_copy_record(fs_, dir));
    } catch (const Error&) {
      return nullptr;
    }
  }

  FileSystem& fs_;
};

}  // namespace

namespace detail {
std::unique_ptr<CheckpointStore> make_directory_store(std::string root, FileSystem& fs) {
  return std::make_unique<DirectoryStore>(std::move(root), fs);
}
}  // namespace detail
}  // namespace ckpt
