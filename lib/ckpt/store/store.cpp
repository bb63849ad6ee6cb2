// SPDX-License-Identifier: Apache-2.0
#include "ckpt/store/store.hpp"

#include <algorithm>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/objstore/s3.hpp"
#include "ckpt/store/detail/kinds.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "ckpt/shard/shard_writer.hpp"

namespace ckpt {

std::string_view store_kind_name(StoreKind kind) noexcept {
  switch (kind) {
    case StoreKind::directory: return "directory";
    case StoreKind::node_set: return "node set";
    case StoreKind::object_store: return "object store";
    case StoreKind::memory: return "memory";
  }
  return "?";
}

std::string CheckpointStore::name_of(std::uint64_t step) const { return join_path(root(), checkpoint_dir_name(step)); }

std::vector<RedundancyBlock> StepTarget::write_redundancy_unit(std::span<const std::uint64_t>, std::size_t unit,
                                                               const std::function<void(int, std::uint64_t, std::span<std::byte>)>&,
                                                               std::uint64_t, const std::function<bool()>&) {
  throw Error(Errc::invalid_argument, "redundancy unit " + std::to_string(unit), "this store keeps no redundancy");
}

std::string StepTarget::commit(Manifest manifest, std::vector<RedundancyBlock> blocks, std::string manifest_text) {
  if (finished_) throw Error(Errc::invalid_argument, "step " + std::to_string(step()), "committed or aborted already");
  try {
    std::string where = commit_step(std::move(manifest), std::move(blocks), std::move(manifest_text));
    finished_ = true;
    return where;
  } catch (...) {
    abort();
    throw;
  }
}

void StepTarget::abort() noexcept {
  if (finished_) return;
  finished_ = true;
  abort_step();
}

void StepTarget::write_redundancy_block(const RedundancyBlock& block, const ReadableFile&, const PieceCheck&, PieceSize) {
  throw Error(Errc::invalid_argument, block.path, "this store keeps no redundancy blocks");
}

std::unique_ptr<ReadableFile> CheckpointStore::redundancy_block(std::uint64_t step, std::size_t index) {
  throw Error(Errc::invalid_argument, name_of(step), "redundancy block " + std::to_string(index) + ": this store keeps no redundancy blocks");
}

std::string CheckpointStore::manifest_text(std::uint64_t step) { return encode_manifest(*manifest(step)); }

Error CheckpointStore::no_latest_error() { return Error(Errc::not_found, root(), "no latest pointer: nothing committed yet"); }

OpenedCheckpoint CheckpointStore::open_latest(const OpenLatestOptions& opt) {
  std::optional<std::uint64_t> tried;
  std::string note;
  for (int attempt = 1;; ++attempt) {
    try {
      tried = latest();
      if (!tried) throw no_latest_error();
      auto reader = open(*tried, opt.expected_world_size);
      if (opt.fallback) reader.verify(opt.verify);
      return {std::move(reader), checkpoint_dir_name(*tried), false, {}};
    } catch (const Error& e) {
      // A save committed newer checkpoints and rotated this one away since `latest` was
      // read: what `latest` names now is the live checkpoint.
      if (attempt < kOpenLatestAttempts && tried && e.code() != Errc::world_size_mismatch && rotated_away(*tried)) continue;
      if (!opt.fallback || e.code() == Errc::world_size_mismatch) throw;
      note = e.what();
      break;
    }
  }
  std::vector<std::uint64_t> others = fallback_steps();
  std::sort(others.rbegin(), others.rend());
  for (const std::uint64_t step : others) {
    if (step == tried) continue;
    try {
      auto reader = open(step, opt.expected_world_size);
      reader.verify(opt.verify);
      return {std::move(reader), checkpoint_dir_name(step), true, note};
    } catch (const Error& e) {
      if (e.code() == Errc::world_size_mismatch) throw;
    }
  }
  throw Error(Errc::not_found, root(), "no checkpoint that opens and verifies", "a good checkpoint", note.empty() ? "none" : note);
}

OpenedCheckpoint open_latest(FileSystem& fs, const std::string& root, const OpenLatestOptions& options) {
  return open_store(root, {.fs = &fs})->open_latest(options);
}

namespace {
// "DIR/" -> "DIR", "mem://NAME/" -> "mem://NAME"; "/" and a bare scheme ("mem://") stay.
void strip_trailing_slashes(std::string& root) {
  while (root.size() > 1 && root.back() == '/' && !root.ends_with("://")) root.pop_back();
}
}  // namespace

StoreKind root_kind(const std::string& root, const StoreOptions& options) {
  // The one place a root's kind is decided (docs/architecture.md, "Stores").
  if (is_s3_root(root)) return StoreKind::object_store;
  if (is_memory_root(root)) return StoreKind::memory;
  if (options.nodes) return StoreKind::node_set;
  return is_node_set(options.fs ? *options.fs : posix_file_system(), root) ? StoreKind::node_set : StoreKind::directory;
}

std::unique_ptr<CheckpointStore> open_store(const std::string& given, const StoreOptions& options) {
  std::string root = given;
  strip_trailing_slashes(root);
  if (root.empty()) throw Error(Errc::invalid_argument, "checkpoint root", "empty", "a directory or s3://bucket/prefix", "\"\"");
  const StoreKind kind = root_kind(root, options);
  if (kind == StoreKind::memory) return detail::make_memory_store(root, options);  // its own file system, whatever options.fs
  if (kind == StoreKind::object_store) {
    if (options.nodes) throw Error(Errc::invalid_argument, root, "StoreOptions.nodes (a node layout) for an object store");
    if (options.object_store) return detail::make_object_store(root, *options.object_store, nullptr, options.run, options.lease);
    auto client = open_object_store(root);  // the s3:// client of ckpt::s3, when the program links it
    ObjectStore& ref = *client;
    return detail::make_object_store(root, ref, std::move(client), options.run, options.lease);
  }
  FileSystem& fs = options.fs ? *options.fs : posix_file_system();
  if (options.nodes) {
    if (const auto problem = layout_problem(*options.nodes, options.nodes->nodes * options.nodes->ranks_per_node))
      throw Error(Errc::invalid_argument, root, "StoreOptions.nodes: " + *problem);
    return detail::make_node_set_store(root, fs, options.nodes->nodes, options.nodes);
  }
  if (kind == StoreKind::node_set) return detail::make_node_set_store(root, fs, count_node_roots(fs, root), std::nullopt);
  return detail::make_directory_store(root, fs);
}

namespace {
// DIR, when `root` is one node root DIR/node-n of a node set.
std::optional<std::string> node_set_above(FileSystem& fs, const std::string& root) {
  if (node_root_index(last_component(root)) < 0) return std::nullopt;
  const std::string dir = parent_dir(root);
  return root_kind(dir, {.fs = &fs}) == StoreKind::node_set ? std::optional<std::string>(dir) : std::nullopt;  // false when unreadable
}
// Whether the checkpoint directory `dir` holds a manifest of a checkpoint across node roots.
bool across_nodes(FileSystem& fs, const std::string& dir) {
  try {
    return fs.stat(join_path(dir, kManifestName)) && read_checkpoint_manifest(fs, dir)->nodes.has_value();
  } catch (const Error&) {
    return false;
  }
}
}  // namespace

LocatedCheckpoint locate_checkpoint(const std::string& given, const StoreOptions& options) {
  std::string p = given;
  strip_trailing_slashes(p);
  LocatedCheckpoint out;
  const StoreKind kind = root_kind(p, options);
  if (kind == StoreKind::object_store || kind == StoreKind::memory) {
    // s3://bucket/prefix/step-N, mem://NAME/step-N: that step of the root above it.
    const std::size_t scheme = p.find("://") + 3;
    if (const auto slash = p.rfind('/'); slash != std::string::npos && slash > scheme)
      if ((out.step = parse_checkpoint_dir_name(std::string_view(p).substr(slash + 1)))) p.resize(slash);
    out.store = open_store(p, options);
    return out;
  }
  FileSystem& fs = options.fs ? *options.fs : posix_file_system();
  if (kind == StoreKind::node_set) {
    out.store = open_store(p, options);
    return out;
  }
  // DIR/node-n whose `latest` is a checkpoint across nodes: the node set's latest.
  if (const auto set = node_set_above(fs, p)) {
    std::optional<std::string> latest;
    try {
      latest = read_latest(fs, p);
    } catch (const Error&) {
    }
    if (latest && across_nodes(fs, join_path(p, *latest))) {
      out.store = open_store(*set, options);
      out.node_root = true;
      return out;
    }
  }
  if (const auto step = parse_checkpoint_dir_name(last_component(p))) {
    // DIR/node-n/step-N of a checkpoint across nodes: that step of the node set; else
    // ROOT/step-N: that step of the root.
    const std::string parent = parent_dir(p);
    const auto set = node_set_above(fs, parent);
    out.store = open_store(set && across_nodes(fs, p) ? *set : parent, options);
    out.step = step;
    return out;
  }
  if (!fs.stat(join_path(p, kManifestName))) {
    out.store = open_store(p, options);  // a root: its latest
    return out;
  }
  out.dir = p;  // a checkpoint directory of another name
  return out;
}

std::optional<LeftoverReport> StoreWriter::collect_leftovers(std::chrono::seconds older_than) {
  (void)older_than;
  return std::nullopt;
}

namespace detail {

std::vector<std::uint64_t> steps_of(const std::vector<std::string>& names) {
  std::vector<std::uint64_t> out;
  for (const auto& n : names)
    if (const auto s = parse_checkpoint_dir_name(n)) out.push_back(*s);
  return out;
}

std::function<bool(const std::string&)> keep_by_name(const KeepStep& keep) {
  if (!keep) return {};
  return [keep](const std::string& name) {
    const auto s = parse_checkpoint_dir_name(name);
    return s && keep(*s);
  };
}

void write_file_copy(FileSystem& fs, const std::string& dir, const std::string& name, const ReadableFile& source, const PieceCheck& check,
                     PieceSize pieces) {
  const std::string path = join_path(dir, name);
  try {
    const std::uint64_t size = source.size();
    // Pieces of pieces.bytes, rounded up to whole multiples, through the one shard writer (its
    // space reserved up front, fsynced at the end); its own hashes, per chunk of the
    // multiple, are not what is checked: `check` is.
    const std::uint64_t m = std::max<std::uint64_t>(pieces.multiple, 1);
    const std::uint64_t per_piece = (std::max<std::uint64_t>(pieces.bytes, 1) + m - 1) / m * m;
    ShardWriter out = ShardWriter::copy(fs, dir, name, size, {.chunk_size = m > 1 ? m : kDefaultChunkSize, .sha256 = false});
    std::vector<std::byte> piece(static_cast<std::size_t>(std::min<std::uint64_t>(size, per_piece)));
    for (std::uint64_t at = 0; at < size; at += piece.size()) {
      const std::span<std::byte> part = std::span(piece).first(static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), size - at)));
      source.read_at(at, part);
      if (check) check(at, part);
      out.write(part);
    }
    (void)out.finish(0);
  } catch (...) {
    try {
      fs.remove_all(path);
    } catch (const Error&) {  // the step's abort removes its directory anyway
    }
    throw;
  }
}

void refuse_participant(const std::string& root, const char* what) {
  throw Error(Errc::invalid_argument, root, std::string(what) + " by a participant of a shared run: only the lead process (rank 0's) does it");
}

StoredCheckpoint described(std::uint64_t step, std::shared_ptr<const Manifest> m, bool is_latest) {
  StoredCheckpoint c;
  c.name = checkpoint_dir_name(step);
  c.step = step;
  c.is_latest = is_latest;
  c.world_size = m->world_size;
  for (const auto& s : m->shards) c.bytes += s.size;
  c.manifest = std::move(m);
  return c;
}

void throw_not_committed(const std::string& where, std::uint64_t step) {
  throw Error(Errc::not_found, where, "no committed checkpoint of step " + std::to_string(step));
}

}  // namespace detail
}  // namespace ckpt
