// SPDX-License-Identifier: Apache-2.0
// A set of node roots as one CheckpointStore: store/nodes/node_commit.hpp's protocol across DIR/node-n
// (each a directory root with its own lock, temporaries and `latest`), the redundancy of
// store/nodes/redundancy_io.hpp written into the step's node temporaries, and CheckpointReader's
// reads across the node roots.
#include <algorithm>
#include <chrono>
#include <thread>
#include <set>

#include "ckpt/core/error.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/store/run_identity.hpp"
#include "ckpt/store/tiers.hpp"
#include "ckpt/store/detail/kinds.hpp"

namespace ckpt {
namespace {

// The blocks every writer wrote, in the order the layout plans them (the manifest's);
// Errc::invalid_argument naming a block nobody wrote (or written twice).
std::vector<RedundancyBlock> blocks_in_plan_order(const Manifest& m, std::vector<RedundancyBlock> got) {
  std::vector<std::uint64_t> sizes;
  for (const auto& s : m.shards) sizes.push_back(s.size);
  std::vector<RedundancyBlock> out;
  for (const auto& want : planned_blocks(*m.nodes, sizes)) {
    const auto same = [&](const RedundancyBlock& b) {
      return b.kind == want.kind && b.node == want.node && b.stripe == want.stripe && b.index == want.index && b.rank == want.rank;
    };
    const auto it = std::find_if(got.begin(), got.end(), same);
    const std::string what = want.kind == RedundancyBlock::Kind::parity
                                 ? "parity " + std::to_string(want.index) + " of stripe " + std::to_string(want.stripe)
                                 : "replica of rank " + std::to_string(want.rank);
    if (it == got.end())
      throw Error(Errc::invalid_argument, want.path, "redundancy block " + what + " on node " + std::to_string(want.node), "written", "missing");
    out.push_back(std::move(*it));
    got.erase(it);
    if (std::find_if(got.begin(), got.end(), same) != got.end())
      throw Error(Errc::invalid_argument, want.path, "redundancy block " + what + " on node " + std::to_string(want.node), "written once", "twice");
  }
  if (!got.empty()) throw Error(Errc::invalid_argument, got.front().path, "redundancy block not in the layout's plan", "none", got.front().path);
  return out;
}

class NodeSetTarget final : public StepTarget {
 public:
  NodeSetTarget(FileSystem& fs, std::vector<std::string> roots, NodeLayout layout, std::uint64_t step, std::vector<std::string> temps, bool lead)
      : fs_(fs), roots_(std::move(roots)), layout_(std::move(layout)), step_(step), temps_(std::move(temps)), lead_(lead) {}
  ~NodeSetTarget() override { abort(); }
  std::uint64_t step() const noexcept override { return step_; }
  const std::string& shard_dir(int rank) const override {
    if (rank < 0 || rank >= layout_.world_size())
      throw Error(Errc::invalid_argument, temps_.front(), "rank", "0.." + std::to_string(layout_.world_size() - 1), std::to_string(rank));
    return temps_[static_cast<std::size_t>(layout_.node_of(rank))];
  }
  FileSystem* file_system() const noexcept override { return &fs_; }
  void write_shard(int rank, const std::string& name, const ReadableFile& source, const PieceCheck& check, PieceSize pieces) override {
    detail::write_file_copy(fs_, shard_dir(rank), name, source, check, pieces);
  }
  bool keeps_blocks_of(const NodeLayout& layout) const noexcept override { return layout == layout_; }
  void write_redundancy_block(const RedundancyBlock& block, const ReadableFile& source, const PieceCheck& check, PieceSize pieces) override {
    if (block.node < 0 || block.node >= layout_.nodes)
      throw Error(Errc::invalid_argument, block.path, "the block's node", "0.." + std::to_string(layout_.nodes - 1), std::to_string(block.node));
    detail::write_file_copy(fs_, temps_[static_cast<std::size_t>(block.node)], block.path, source, check, pieces);
  }
  std::size_t redundancy_units(std::span<const std::uint64_t> sizes) const override { return ckpt::redundancy_units(layout_, sizes); }
  std::vector<RedundancyBlock> write_redundancy_unit(std::span<const std::uint64_t> sizes, std::size_t unit,
                                                     const std::function<void(int, std::uint64_t, std::span<std::byte>)>& data,
                                                     std::uint64_t chunk_size, const std::function<bool()>& stopped) override {
    return ckpt::write_redundancy_unit(fs_, temps_, layout_, sizes, node_bytes_by_rank(layout_, sizes, data), chunk_size, unit, stopped);
  }

 protected:
  std::string commit_step(Manifest manifest, std::vector<RedundancyBlock> blocks, std::string text) override {
    if (!lead_) detail::refuse_participant(roots_.front(), "a commit");
    if (manifest.nodes != layout_ || manifest.redundancy.size() != blocks.size()) text.clear();  // bytes of another layout: re-encoded
    manifest.nodes = layout_;
    manifest.redundancy = blocks_in_plan_order(manifest, std::move(blocks));
    return commit_node_checkpoint(fs_, roots_, temps_, manifest, text);
  }
  void abort_step() noexcept override { abort_node_checkpoint(fs_, roots_, temps_); }

 private:
  FileSystem& fs_;
  std::vector<std::string> roots_;
  NodeLayout layout_;
  std::uint64_t step_;
  std::vector<std::string> temps_;
  bool lead_;
};

class NodeSetWriter final : public StoreWriter {
 public:
  // The lead: every node root's lock, in node order, then the crash cleanup across them. A
  // node root that does not exist is made (a replaced node's fresh disk); if it still holds
  // nothing but its lock file when the writer is released (a refused repair, a prune), it is
  // removed again, so that a writer that wrote nothing there leaves the set as it found it.
  NodeSetWriter(FileSystem& fs, std::string dir, std::vector<std::string> roots, std::optional<NodeLayout> layout, const WriterOptions& options)
      : fs_(fs), dir_(std::move(dir)), roots_(std::move(roots)), layout_(std::move(layout)), lead_(options.lead) {
    fs_.create_dirs(dir_);
    if (!lead_) return;
    try {
      for (const auto& r : roots_) {
        if (!fs_.stat(r)) made_.push_back(r);
        locks_.emplace_back(fs_, r);  // Errc::busy: a writer (a training run, a repair) holds it
      }
      if (options.clean_up) cleaned_ = prepare_node_roots(fs_, locks_);
    } catch (...) {
      remove_made_roots();
      throw;
    }
  }
  ~NodeSetWriter() override { remove_made_roots(); }
  const std::vector<std::string>& cleaned_up() const noexcept override { return cleaned_; }
  std::unique_ptr<StepTarget> begin(std::uint64_t step, const StepOptions& options) override {
    if (!layout_)
      throw Error(Errc::invalid_argument, dir_, "a save into a node set needs its layout (StoreOptions::nodes)", "a layout", "none");
    if (!options.shared) {
      if (!lead_) detail::refuse_participant(dir_, "a step begun without its shared run");
      return std::make_unique<NodeSetTarget>(fs_, roots_, *layout_, step, begin_node_checkpoint(fs_, roots_, step, options.begin), true);
    }
    // Ranks in several processes: each makes its own node's temporary (the node's first rank
    // checks and clears the step, as a committer), and names the others'.
    const SharedRun& run = *options.shared;
    const int node = layout_->node_of(run.first_local_rank);
    std::vector<std::string> temps;
    for (int n = 0; n < layout_->nodes; ++n) {
      const std::string& r = roots_[static_cast<std::size_t>(n)];
      temps.push_back(n == node ? begin_shared_checkpoint(fs_, r, step, run.run_id, run.first_local_rank % layout_->ranks_per_node == 0, options.begin)
                                : shared_temporary_dir(r, step, run.run_id));
    }
    return std::make_unique<NodeSetTarget>(fs_, roots_, *layout_, step, std::move(temps), lead_);
  }
  std::string establish_run_identity() override {
    if (!lead_) detail::refuse_participant(dir_, "the run identity's record");
    return ckpt::establish_run_identity(fs_, locks_.front());
  }
  std::vector<RepairReport> repair(std::optional<std::uint64_t> step, Verify verify) override {
    if (!lead_) detail::refuse_participant(dir_, "a repair");
    if (!step) return repair_node_roots(fs_, roots_);
    return {repair_node_checkpoint(fs_, roots_, checkpoint_dir_name(*step), verify)};
  }
  std::vector<std::uint64_t> rotate(int keep_last, std::uint64_t committed, const KeepStep& keep) override {
    if (!lead_) detail::refuse_participant(dir_, "rotation");
    return detail::steps_of(rotate_node_checkpoints(fs_, roots_, keep_last, checkpoint_dir_name(committed), detail::keep_by_name(keep)));
  }
  // No free-space rule across node roots (yet): each node's disk would need its own.
  std::vector<std::uint64_t> make_room(std::uint64_t, const KeepStep&) override {
    if (!lead_) detail::refuse_participant(dir_, "a pre-save rotation");
    return {};
  }
  void remove(std::uint64_t step) override {
    if (!lead_) detail::refuse_participant(dir_, "a removal");
    const std::string name = checkpoint_dir_name(step);
    if (read_latest_nodes(fs_, roots_) == name)
      throw Error(Errc::invalid_argument, join_path(dir_, "node-*/" + name), "the checkpoint `latest` names is never removed");
    bool any = false;
    for (const auto& r : roots_) any |= fs_.stat(join_path(r, name)).has_value();
    if (!any) detail::throw_not_committed(join_path(dir_, "node-*/" + name), step);
    remove_node_step(fs_, roots_, name);
  }

 private:
  // The roots this writer made that hold nothing but the lock file: removed while it still
  // holds their locks.
  void remove_made_roots() noexcept {
    for (const auto& r : made_) try {
        const auto entries = fs_.list_dir(r);
        if (entries.size() == 1 && entries[0].name == kLockName) fs_.remove_all(r);
      } catch (...) {
      }
  }

  FileSystem& fs_;
  std::string dir_;
  std::vector<std::string> roots_;
  std::optional<NodeLayout> layout_;
  bool lead_;
  std::vector<std::string> made_;
  std::vector<RootLock> locks_;
  std::vector<std::string> cleaned_;
};

class NodeSetStore final : public CheckpointStore {
 public:
  NodeSetStore(std::string dir, FileSystem& fs, int nodes, std::optional<NodeLayout> layout)
      : CheckpointStore(std::move(dir)), fs_(fs), layout_(std::move(layout)), roots_(node_root_paths(root(), nodes)) {}
  StoreKind kind() const noexcept override { return StoreKind::node_set; }
  std::string name_of(std::uint64_t step) const override { return join_path(root(), "node-*/" + checkpoint_dir_name(step)); }

  std::optional<std::uint64_t> latest() override {
    const auto name = read_latest_nodes(fs_, roots_);
    if (!name) return std::nullopt;
    return parse_checkpoint_dir_name(*name);
  }

  std::vector<std::uint64_t> steps() override {
    const auto last = latest();
    std::vector<std::uint64_t> out;
    if (!last) return out;
    for (const auto& name : step_names())
      if (const auto s = parse_checkpoint_dir_name(name); *s <= *last) out.push_back(*s);
    return out;
  }

  // Any node root's `latest`, or else a step renamed into place on every node root that holds
  // checkpoints (store/tiers.hpp, find_committed_checkpoint).
  std::optional<std::string> committed_evidence() override {
    for (const auto& r : roots_)
      if (fs_.stat(r) && fs_.stat(join_path(r, kLatestName))) return join_path(r, kLatestName);
    if (const auto step = newest_node_checkpoint(fs_, roots_))
      return name_of(*parse_checkpoint_dir_name(*step)) + " (renamed into place on every node root, no latest names it yet)";
    return std::nullopt;
  }

  std::vector<StoredCheckpoint> list(Verify verify) override {
    if (!fs_.stat(root())) throw Error(Errc::not_found, root(), "no such checkpoint root");
    const auto last = read_latest_nodes(fs_, roots_);
    std::vector<StoredCheckpoint> out;
    for (const auto& name : step_names()) {
      const std::uint64_t step = *parse_checkpoint_dir_name(name);
      StoredCheckpoint c;
      c.name = name;
      c.step = step;
      c.is_latest = last == name;
      const auto holders = holding(name);
      try {
        const auto m = manifest(step);
        c.health = health(step, verify);
        const NodeCheckpointHealth& h = *c.health;
        c.manifest = m;
        c.world_size = m->world_size;
        for (const auto& s : m->shards) c.bytes += s.size;
        for (const auto& b : m->redundancy) c.redundancy_bytes += b.size;
        c.state = h.healthy() ? CheckpointState::complete : h.recoverable() ? CheckpointState::degraded : CheckpointState::corrupt;
        if (!h.healthy() && being_rotated(step, holders)) continue;
        if (const auto bad = h.bad_files(); !bad.empty()) c.error = bad.front()->what + " on node " + std::to_string(bad.front()->node) + ": " + bad.front()->error;
      } catch (const Error& e) {
        if (being_rotated(step, holders)) continue;  // removed by a rotation while it was listed: no damage
        c.state = CheckpointState::corrupt;
        c.error = e.what();
      }
      out.push_back(std::move(c));
    }
    // Temporaries of a save in progress (or of a crashed one, which the next writer removes).
    for (std::size_t n = 0; n < roots_.size(); ++n) {
      try {
        if (!fs_.stat(roots_[n])) continue;
        for (const auto& e : fs_.list_dir(roots_[n])) {
          if (e.type != EntryType::directory || !is_temporary_name(e.name)) continue;
          StoredCheckpoint c;
          c.name = "node-" + std::to_string(n) + "/" + e.name;
          c.state = CheckpointState::in_progress;
          out.push_back(std::move(c));
        }
      } catch (const Error& e) {
        if (e.code() != Errc::not_found) throw;
      }
    }
    return out;
  }

  // The manifest the node roots agree on (read_node_manifest); a step no node root holds is
  // not committed.
  std::shared_ptr<const Manifest> manifest(std::uint64_t step) override {
    const std::string name = checkpoint_dir_name(step);
    if (std::none_of(roots_.begin(), roots_.end(), [&](const std::string& r) { return fs_.stat(join_path(r, name)).has_value(); }))
      detail::throw_not_committed(name_of(step), step);
    std::vector<std::string> dirs;
    for (const auto& r : roots_) dirs.push_back(join_path(r, name));
    return read_node_manifest(fs_, dirs).manifest;
  }

  CheckpointReader open(std::uint64_t step, std::optional<int> expected_world_size) override {
    const auto m = manifest(step);
    std::vector<std::string> dirs;
    for (const auto& r : node_root_paths(root(), m->nodes->nodes)) dirs.push_back(join_path(r, checkpoint_dir_name(step)));
    return CheckpointReader::open_nodes(fs_, dirs, expected_world_size);
  }
  std::unique_ptr<ReadableFile> shard(std::uint64_t step, const ShardRecord& file) override {
    return fs_.open_read(open(step, std::nullopt).file_path(file));
  }
  // The bytes the node roots agree on (read_node_manifest).
  std::string manifest_text(std::uint64_t step) override {
    const std::string name = checkpoint_dir_name(step);
    std::vector<std::string> dirs;
    for (const auto& r : roots_) dirs.push_back(join_path(r, name));
    return read_node_manifest(fs_, dirs, true).bytes;
  }
  std::unique_ptr<ReadableFile> redundancy_block(std::uint64_t step, std::size_t index) override {
    const auto m = manifest(step);
    if (index >= m->redundancy.size())
      throw Error(Errc::invalid_argument, name_of(step), "redundancy block", "< " + std::to_string(m->redundancy.size()), std::to_string(index));
    const RedundancyBlock& b = m->redundancy[index];
    const auto roots = node_root_paths(root(), m->nodes->nodes);
    if (b.node < 0 || static_cast<std::size_t>(b.node) >= roots.size())
      throw Error(Errc::malformed_manifest, name_of(step), "a redundancy block's node", "0.." + std::to_string(roots.size() - 1), std::to_string(b.node));
    return fs_.open_read(join_path(join_path(roots[static_cast<std::size_t>(b.node)], checkpoint_dir_name(step)), b.path));
  }
  StoredCheckpoint describe(std::uint64_t step) override {
    StoredCheckpoint c = detail::described(step, manifest(step), latest() == step);
    c.health = health(step, Verify::none);
    for (const auto& b : c.manifest->redundancy) c.redundancy_bytes += b.size;
    c.state = c.health->healthy() ? CheckpointState::complete : c.health->recoverable() ? CheckpointState::degraded : CheckpointState::corrupt;
    return c;
  }
  std::shared_ptr<const NodeCheckpointHealth> health(std::uint64_t step, Verify mode) override {
    const auto m = manifest(step);
    return std::make_shared<const NodeCheckpointHealth>(check_node_checkpoint(fs_, node_root_paths(root(), m->nodes->nodes), checkpoint_dir_name(step), mode));
  }
  void verify(std::uint64_t step, Verify mode, const ProgressFn& progress) override { open(step, std::nullopt).verify(mode, progress); }
  bool rotated_away(std::uint64_t step) noexcept override {
    const std::string name = checkpoint_dir_name(step);
    try {
      const auto last = latest();
      if (!last || *last <= step) return false;
      for (const auto& r : roots_)
        if (fs_.stat(join_path(r, name))) return false;
      return true;
    } catch (...) {
      return false;
    }
  }
  std::unique_ptr<StoreWriter> writer(const WriterOptions& options) override {
    const int nodes = layout_ ? layout_->nodes : static_cast<int>(roots_.size());
    return std::make_unique<NodeSetWriter>(fs_, root(), node_root_paths(root(), nodes), layout_, options);
  }

 protected:
  Error no_latest_error() override {
    return Error(Errc::not_found, root(), "no latest pointer on any of the " + std::to_string(roots_.size()) + " node roots: nothing committed yet");
  }
  std::vector<std::uint64_t> fallback_steps() override {
    std::vector<std::uint64_t> out;
    for (const auto& name : step_names()) out.push_back(*parse_checkpoint_dir_name(name));
    return out;
  }

 private:
  // Which node roots hold directory `name` now.
  std::vector<bool> holding(const std::string& name) {
    std::vector<bool> out;
    for (const auto& r : roots_) {
      std::optional<FileStat> st;
      try {
        st = fs_.stat(join_path(r, name));
      } catch (const Error&) {
      }
      out.push_back(st && st->type == EntryType::directory);
    }
    return out;
  }

  // A check of `step` failed or found files missing: is a rotation removing it (which is no
  // damage)? Rotation removes only steps older than `latest`, and renames a step to a removal
  // temporary on every node root before it deletes any (remove_node_step); a removal a kill
  // cut leaves its temporaries until the next writer finishes it. So: `latest` names a newer
  // step, and the step is gone from every node root, or a removal's temporary of it is on
  // one, or a node root that held it when the check began no longer does. A rename can fall
  // between two of these looks: looked at again for up to 100 ms before calling it damage.
  bool being_rotated(std::uint64_t step, const std::vector<bool>& before) {
    const std::string name = checkpoint_dir_name(step);
    try {
      const auto last = latest();
      if (!last || *last <= step) return false;
    } catch (const Error&) {
      return false;
    }
    for (int look = 0; look < 20; ++look) {
      if (look) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const auto now = holding(name);
      bool shrank = false, none = true;
      for (std::size_t n = 0; n < now.size(); ++n) {
        shrank |= before[n] && !now[n];
        none &= !now[n];
      }
      if (shrank || none) return true;
      for (const auto& r : roots_) {
        try {
          if (!fs_.stat(r)) continue;
          for (const auto& e : fs_.list_dir(r))
            if (const auto t = parse_temporary_name(e.name); t && t->final_name == name) return true;
        } catch (const Error&) {
        }
      }
    }
    return false;
  }

  // The step-N directories on any node root, in step order.
  std::vector<std::string> step_names() {
    std::set<std::string> names;
    for (const auto& r : roots_) {
      if (!fs_.stat(r)) continue;
      for (const auto& e : fs_.list_dir(r))
        if (e.type == EntryType::directory && parse_checkpoint_dir_name(e.name)) names.insert(e.name);
    }
    return {names.begin(), names.end()};
  }

  FileSystem& fs_;
  std::optional<NodeLayout> layout_;
  std::vector<std::string> roots_;
};

}  // namespace

namespace detail {
std::unique_ptr<CheckpointStore> make_node_set_store(std::string dir, FileSystem& fs, int nodes, std::optional<NodeLayout> layout) {
  return std::make_unique<NodeSetStore>(std::move(dir), fs, nodes, std::move(layout));
}
}  // namespace detail
}  // namespace ckpt
