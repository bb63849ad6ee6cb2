// SPDX-License-Identifier: Apache-2.0
// An object-store prefix as a CheckpointStore: store/object/object_commit.hpp's protocol (shards and the
// checkpoint's manifest under step-N/<attempt>/, the tier manifest created last as the commit,
// `latest` moved forward by compare-and-swap), the writer lease of store/object/object_lease.hpp as its
// writer's right, and a read-only file-system view of a committed step so that
// CheckpointReader reads it as it reads a directory (each read a ranged GET).
#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/store/object/object_lease.hpp"
#include "ckpt/objstore/object_transfer.hpp"
#include "ckpt/store/run_identity.hpp"
#include "ckpt/store/tiers.hpp"
#include "ckpt/store/detail/kinds.hpp"

namespace ckpt {
namespace {

// An object read in ranges.
class ObjectFile final : public ReadableFile {
 public:
  ObjectFile(ObjectStore& client, std::string key, std::uint64_t size, std::string path)
      : client_(client), key_(std::move(key)), size_(size), path_(std::move(path)) {}
  std::uint64_t size() const override { return size_; }
  void read_at(std::uint64_t offset, std::span<std::byte> data) const override {
    if (offset > size_ || data.size() > size_ - offset)
      throw Error(Errc::size_mismatch, path_, "read past the end", "at most " + std::to_string(size_) + " bytes",
                  std::to_string(offset + data.size()));
    if (!data.empty()) client_.get_range(key_, offset, data);
  }
  const std::string& path() const noexcept override { return path_; }

 private:
  ObjectStore& client_;
  std::string key_;
  std::uint64_t size_;
  std::string path_;
};

// Bytes held in memory (the checkpoint manifest, read and checked once).
class MemoryFile final : public ReadableFile {
 public:
  MemoryFile(std::string bytes, std::string path) : bytes_(std::move(bytes)), path_(std::move(path)) {}
  std::uint64_t size() const override { return bytes_.size(); }
  void read_at(std::uint64_t offset, std::span<std::byte> data) const override {
    if (offset > bytes_.size() || data.size() > bytes_.size() - offset)
      throw Error(Errc::size_mismatch, path_, "read past the end", std::to_string(bytes_.size()), std::to_string(offset + data.size()));
    std::memcpy(data.data(), bytes_.data() + offset, data.size());
  }
  const std::string& path() const noexcept override { return path_; }

 private:
  std::string bytes_;
  std::string path_;
};

// The committed steps of a store seen as ROOT/step-N/<file>: manifest.json is the checkpoint
// manifest the tier manifest commits (its SHA-256 checked when the step was opened), every
// other file the object of that name under the step's data prefix. Read-only.
class StepFiles final : public FileSystem {
 public:
  StepFiles(ObjectStore& client, std::string root) : client_(client), root_(std::move(root)) {}

  // Reads and checks step's manifests (open_object_checkpoint); later reads of the step use them.
  std::shared_ptr<const ObjectCheckpoint> open_step(std::uint64_t step) {
    auto ck = std::make_shared<const ObjectCheckpoint>(open_object_checkpoint(client_, step));
    std::lock_guard lk(mu_);
    steps_[step] = ck;
    return ck;
  }

  std::unique_ptr<ReadableFile> open_read(const std::string& path) override {
    const auto [ck, file] = locate(path);
    if (!ck || file.empty()) throw Error(Errc::not_found, path, "no such object");
    if (file == kManifestName) return std::make_unique<MemoryFile>(ck->manifest_bytes, path);
    const std::string key = ck->tier.data_prefix + file;
    return std::make_unique<ObjectFile>(client_, key, client_.head(key).size, client_.name_of(key));
  }
  std::optional<FileStat> stat(const std::string& path) override {
    const auto [ck, file] = locate(path);
    if (!ck) return std::nullopt;
    if (file.empty()) return FileStat{EntryType::directory, 0};
    if (file == kManifestName) return FileStat{EntryType::file, ck->manifest_bytes.size()};
    try {
      return FileStat{EntryType::file, client_.head(ck->tier.data_prefix + file).size};
    } catch (const Error& e) {
      if (e.code() == Errc::not_found) return std::nullopt;
      throw;
    }
  }
  std::vector<DirEntry> list_dir(const std::string& path) override {
    const auto [ck, file] = locate(path);
    if (!ck || !file.empty()) throw Error(Errc::not_found, path, "no such checkpoint");
    std::vector<DirEntry> out{{std::string(kManifestName), EntryType::file}};
    for (const auto& s : ck->manifest.shards) out.push_back({s.path, EntryType::file});
    return out;
  }
  std::unique_ptr<WritableFile> create(const std::string& path, const WriteOptions&) override { read_only(path); }
  void create_dir(const std::string& path) override { read_only(path); }
  void create_dirs(const std::string& path) override { read_only(path); }
  void sync_dir(const std::string& path) override { read_only(path); }
  void rename(const std::string& from, const std::string&) override { read_only(from); }
  void remove_all(const std::string& path) override { read_only(path); }
  std::unique_ptr<FileLock> try_lock(const std::string& path, std::string_view) override { read_only(path); }

 private:
  [[noreturn]] static void read_only(const std::string& path) {
    throw Error(Errc::invalid_argument, path, "a read-only view of an object store's checkpoint: write through its StoreWriter");
  }
  // ROOT/step-N[/file], or ROOT/step-N/<run_id>[/file] (the data prefix the tier manifest
  // names, as the store's readers are opened: their errors then name each object's real
  // key): the opened step and the file name ("" for the step itself).
  std::pair<std::shared_ptr<const ObjectCheckpoint>, std::string> locate(const std::string& path) {
    if (!path.starts_with(root_ + "/")) return {};
    const std::string rest = path.substr(root_.size() + 1);
    const auto slash = rest.find('/');
    const auto step = parse_checkpoint_dir_name(rest.substr(0, slash));
    if (!step) return {};
    std::lock_guard lk(mu_);
    const auto it = steps_.find(*step);
    if (it == steps_.end()) return {};
    std::string file = slash == std::string::npos ? std::string() : rest.substr(slash + 1);
    if (const std::string& run = it->second->tier.run_id; !run.empty() && (file == run || file.starts_with(run + "/")))
      file = file.size() == run.size() ? std::string() : file.substr(run.size() + 1);
    return {it->second, file};
  }

  ObjectStore& client_;
  std::string root_;
  std::mutex mu_;
  std::map<std::uint64_t, std::shared_ptr<const ObjectCheckpoint>> steps_;
};

// One commit attempt: its shards uploaded under step-N/<attempt>/, then commit_object_step and
// `latest` (ObjectCommitOptions: the run and holder recorded, the fence checked before every
// write that commits).
class ObjectTarget final : public detail::ObjectCommitTarget {
 public:
  ObjectTarget(ObjectStore& client, std::uint64_t step, ObjectCommitOptions options)
      : client_(client), step_(step), options_(std::move(options)) {
    if (options_.run_id.empty()) options_.run_id = random_id();
    prefix_ = checkpoint_dir_name(step) + "/" + options_.run_id + "/";
  }
  ~ObjectTarget() override { abort(); }
  std::uint64_t step() const noexcept override { return step_; }
  const std::string& shard_dir(int) const override {
    throw Error(Errc::invalid_argument, client_.name_of(prefix_), "an object store keeps no files: write shards with write_shard");
  }
  FileSystem* file_system() const noexcept override { return nullptr; }
  int shards_at_once() const noexcept override { return 1; }
  // Each part a whole number of pieces.multiple (the chunks a copy checks).
  void write_shard(int, const std::string& name, const ReadableFile& source, const PieceCheck& check, PieceSize pieces) override {
    fence();
    const std::string key = prefix_ + name;
    {
      std::lock_guard lk(mu_);
      keys_.push_back(key);
    }
    UploadOptions upload = options_.upload;
    const std::uint64_t m = std::max<std::uint64_t>(pieces.multiple, 1);
    upload.part_size = (upload.part_size + m - 1) / m * m;
    const UploadReport r = upload_object(client_, source, key, upload, check);
    std::lock_guard lk(mu_);
    bytes_ += r.bytes;
  }
  const std::string& run_id() const noexcept override { return options_.run_id; }
  const std::string& data_prefix() const noexcept override { return prefix_; }
  bool latest_moved() const noexcept override { return latest_moved_; }

 protected:
  std::string commit_step(Manifest manifest, std::vector<RedundancyBlock> blocks, std::string text) override {
    if (!blocks.empty() || manifest.nodes)
      throw Error(Errc::invalid_argument, client_.name_of(prefix_), "a checkpoint across node roots cannot be committed to an object store yet");
    if (manifest.step != step_)
      throw Error(Errc::invalid_argument, client_.name_of(prefix_), "the manifest's step", std::to_string(step_), std::to_string(manifest.step));
    if (text.empty()) text = encode_manifest(manifest);
    else if (const Manifest decoded = decode_manifest(text, client_.name_of(prefix_ + std::string(kManifestName))); decoded.step != step_)
      throw Error(Errc::invalid_argument, client_.name_of(prefix_), "the manifest text's step", std::to_string(step_), std::to_string(decoded.step));
    ObjectCommitOptions o = options_;
    o.move_latest = false;
    {
      std::lock_guard lk(mu_);
      keys_.push_back(prefix_ + std::string(kManifestName));
    }
    commit_object_step(client_, step_, options_.run_id, std::as_bytes(std::span(text)), bytes_, o);
    {
      // Committed (the tier manifest exists): from here a failure must not remove its data.
      std::lock_guard lk(mu_);
      keys_.clear();
    }
    if (options_.move_latest) {
      fence();
      latest_moved_ = move_object_latest(client_, step_, options_.run, options_.holder);
    }
    return client_.name_of(checkpoint_dir_name(step_));
  }
  // What this attempt uploaded is removed (best effort: what stays is a leftover no tier
  // manifest commits, which collect_object_leftovers removes later).
  void abort_step() noexcept override {
    std::lock_guard lk(mu_);
    for (const auto& k : keys_) {
      try {
        client_.remove(k);
      } catch (...) {
      }
    }
  }

 private:
  void fence() const {
    if (options_.fence) options_.fence();
  }
  ObjectStore& client_;
  std::uint64_t step_;
  ObjectCommitOptions options_;
  std::string prefix_;
  std::mutex mu_;
  std::vector<std::string> keys_;
  std::uint64_t bytes_ = 0;
  bool latest_moved_ = false;
};

class ObjectWriter final : public StoreWriter {
 public:
  ObjectWriter(ObjectStore& client, std::string run, const ObjectLeaseOptions& lease)
      : client_(client), lease_(client, run.empty() ? random_id() : std::move(run), lease) {}
  const std::vector<std::string>& cleaned_up() const noexcept override { return cleaned_; }
  std::unique_ptr<StepTarget> begin(std::uint64_t step, const StepOptions& step_options) override {
    const BeginOptions& options = step_options.begin;
    if (step_options.shared)
      throw Error(Errc::invalid_argument, client_.name_of(checkpoint_dir_name(step)), "ranks in several processes writing straight to an object store");
    lease_.check();
    const std::string name = client_.name_of(checkpoint_dir_name(step));
    try {
      (void)read_object_manifest(client_, step);
      throw Error(Errc::invalid_argument, name, "step " + std::to_string(step) + " is committed already", "a new step", checkpoint_dir_name(step));
    } catch (const Error& e) {
      if (e.code() != Errc::not_found) throw;
    }
    if (const auto latest = read_object_latest(client_); latest && latest->step >= step && !options.allow_older_than_latest)
      throw Error(Errc::invalid_argument, name, "a step after the one `latest` names (its commit would move `latest` back)",
                  "after " + std::to_string(latest->step), std::to_string(step));
    ObjectCommitOptions o;
    o.run = lease_.run();
    o.holder = lease_.holder();
    o.fence = [this] { lease_.check(); };
    return std::make_unique<ObjectTarget>(client_, step, std::move(o));
  }
  std::vector<std::uint64_t> rotate(int keep_last, std::uint64_t committed, const KeepStep& keep) override {
    std::vector<std::uint64_t> removed;
    if (keep_last <= 0) return removed;
    // As rotate_checkpoints counts: the committed step is one of the keep_last, `latest`'s
    // is kept besides them, and a kept step is skipped where it stands.
    const auto latest = read_object_latest(client_);
    std::vector<std::uint64_t> others;
    for (const std::uint64_t s : list_object_checkpoints(client_))
      if (s != committed && !(latest && latest->step == s)) others.push_back(s);
    std::sort(others.rbegin(), others.rend());
    std::vector<std::uint64_t> doomed;
    for (std::size_t i = static_cast<std::size_t>(keep_last - 1); i < others.size(); ++i)
      if (!(keep && keep(others[i]))) doomed.push_back(others[i]);
    std::sort(doomed.begin(), doomed.end());
    for (const std::uint64_t s : doomed) {
      lease_.check();
      remove_object_checkpoint(client_, s);
      removed.push_back(s);
    }
    return removed;
  }
  std::string establish_run_identity() override { return lease_.run(); }
  // An object store's free space is not known: nothing to make room in.
  std::vector<std::uint64_t> make_room(std::uint64_t, const KeepStep&) override { return {}; }
  void remove(std::uint64_t step) override {
    lease_.check();
    remove_object_checkpoint(client_, step);
  }
  std::optional<LeftoverReport> collect_leftovers(std::chrono::seconds older_than) override {
    lease_.check();
    return collect_object_leftovers(client_, older_than);
  }
  bool lost() const noexcept override { return lease_.lost(); }

 private:
  ObjectStore& client_;
  ObjectLease lease_;
  std::vector<std::string> cleaned_;
};

class ObjectCheckpointStore final : public CheckpointStore {
 public:
  ObjectCheckpointStore(std::string root, ObjectStore& client, std::unique_ptr<ObjectStore> owned, std::string run, ObjectLeaseOptions lease)
      : CheckpointStore(std::move(root)), owned_(std::move(owned)), client_(client), run_(std::move(run)), lease_(lease), files_(client, this->root()) {}
  StoreKind kind() const noexcept override { return StoreKind::object_store; }

  std::optional<std::uint64_t> latest() override {
    const auto l = read_object_latest(client_);
    if (!l) return std::nullopt;
    return l->step;
  }
  std::vector<std::uint64_t> steps() override { return list_object_checkpoints(client_); }
  std::optional<std::string> committed_evidence() override { return find_committed_checkpoint(client_); }

  std::vector<StoredCheckpoint> list(Verify verify) override {
    const auto last = read_object_latest(client_);
    const auto all = list_object_checkpoints(client_);
    if (all.empty() && !last)
      throw Error(Errc::not_found, root(), "not a checkpoint root", "a `latest` object or step-N/manifest.json objects", "none of them");
    std::vector<StoredCheckpoint> out;
    for (const std::uint64_t step : all) {
      StoredCheckpoint c;
      c.name = checkpoint_dir_name(step);
      c.step = step;
      c.is_latest = last && last->step == step;
      try {
        ObjectCheckpoint ck = verify_object_checkpoint(client_, step, verify);
        c.run = ck.tier.run;
        c.run_id = ck.tier.run_id;
        c.world_size = ck.manifest.world_size;
        for (const auto& s : ck.manifest.shards) c.bytes += s.size;
        c.manifest = std::make_shared<const Manifest>(std::move(ck.manifest));
      } catch (const Error& e) {
        if (rotated_away(step)) continue;  // removed by a rotation while it was listed: no damage
        c.state = CheckpointState::corrupt;
        c.error = e.what();
      }
      out.push_back(std::move(c));
    }
    return out;
  }

  std::shared_ptr<const Manifest> manifest(std::uint64_t step) override {
    return std::make_shared<const Manifest>(open_object_checkpoint(client_, step).manifest);
  }
  StoredCheckpoint describe(std::uint64_t step) override {
    ObjectCheckpoint ck = open_object_checkpoint(client_, step);
    const auto last = read_object_latest(client_);
    StoredCheckpoint c = detail::described(step, std::make_shared<const Manifest>(std::move(ck.manifest)), last && last->step == step);
    c.run = ck.tier.run;
    c.run_id = ck.tier.run_id;
    c.tier = std::make_shared<const ObjectManifest>(std::move(ck.tier));
    return c;
  }
  // The reader's directory is the step's data prefix (step-N/<run_id>), so that what it
  // reports names the objects it read.
  CheckpointReader open(std::uint64_t step, std::optional<int> expected_world_size) override {
    const auto ck = files_.open_step(step);
    std::string dir = root() + "/" + ck->tier.data_prefix;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    return CheckpointReader::open(files_, dir, expected_world_size);
  }
  std::unique_ptr<ReadableFile> shard(std::uint64_t step, const ShardRecord& s) override {
    const auto ck = files_.open_step(step);
    const std::string key = ck->tier.data_prefix + s.path;
    return std::make_unique<ObjectFile>(client_, key, client_.head(key).size, client_.name_of(key));
  }
  void verify(std::uint64_t step, Verify mode, const ProgressFn& progress) override { verify_object_checkpoint(client_, step, mode, progress); }
  bool rotated_away(std::uint64_t step) noexcept override {
    try {
      const auto l = read_object_latest(client_);
      if (!l || l->step <= step) return false;
      (void)read_object_manifest(client_, step);
      return false;
    } catch (const Error& e) {
      return e.code() == Errc::not_found;
    } catch (...) {
      return false;
    }
  }
  std::unique_ptr<StoreWriter> writer(const WriterOptions& options) override {
    if (!options.lead) throw Error(Errc::invalid_argument, root(), "a participant writer: an object store has no shared runs");
    return std::make_unique<ObjectWriter>(client_, options.run.empty() ? run_ : options.run, lease_);
  }
  WriterTenure writer_tenure() const noexcept override { return WriterTenure::per_run; }
  ObjectStore& client() noexcept { return client_; }
  std::string run_of(std::uint64_t step) override {
    if (const auto l = read_object_latest(client_); l && l->step == step && !l->run.empty()) return l->run;
    return read_object_manifest(client_, step).run;
  }
  std::string manifest_text(std::uint64_t step) override { return files_.open_step(step)->manifest_bytes; }
  void abort_calls() noexcept override { client_.abort_calls(); }

 private:
  std::unique_ptr<ObjectStore> owned_;
  ObjectStore& client_;
  std::string run_;
  ObjectLeaseOptions lease_;
  StepFiles files_;
};

}  // namespace

namespace detail {
std::unique_ptr<CheckpointStore> make_object_store(std::string root, ObjectStore& client, std::unique_ptr<ObjectStore> owned, std::string run,
                                                   const ObjectLeaseOptions& lease) {
  return std::make_unique<ObjectCheckpointStore>(std::move(root), client, std::move(owned), std::move(run), lease);
}
ObjectStore* object_client(CheckpointStore& store) noexcept {
  auto* object = dynamic_cast<ObjectCheckpointStore*>(&store);
  return object ? &object->client() : nullptr;
}
std::unique_ptr<ObjectCommitTarget> make_object_target(ObjectStore& client, std::uint64_t step, ObjectCommitOptions options) {
  return std::make_unique<ObjectTarget>(client, step, std::move(options));
}
}  // namespace detail
}  // namespace ckpt
