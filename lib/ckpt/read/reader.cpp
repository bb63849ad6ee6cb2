// SPDX-License-Identifier: Apache-2.0
#include "ckpt/read/reader.hpp"

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <set>

#include "ckpt/core/error.hpp"
#include "ckpt/format/manifest_limits.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/hash/xxh3.hpp"
#include "ckpt/read/shard_header.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/node_layout.hpp"
#include "ckpt/read/chunk_check.hpp"
#include "ckpt/read/range_reader.hpp"

namespace ckpt {


using detail::read_small_file;


std::optional<Verify> parse_verify(std::string_view s) noexcept {
  if (s == "none") return Verify::none;
  if (s == "fast") return Verify::fast;
  if (s == "full") return Verify::full;
  return std::nullopt;
}

std::string_view verify_name(Verify mode) noexcept {
  switch (mode) {
    case Verify::none: return "none";
    case Verify::fast: return "fast";
    case Verify::full: return "full";
  }
  return "?";
}

const LoadedTensor& LoadedShard::tensor(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return t;
  throw Error(Errc::not_found, path_, "no tensor named '" + std::string(name) + "'");
}

namespace {
// A step directory that is a symlink would load whatever it points to (a checkpoint outside
// the root, another step) under this step's name: refused like a symlinked shard, manifest or
// `latest`. lstat of "dir/" follows the link, so trailing slashes are dropped first.
void refuse_symlinked_dir(FileSystem& fs, const std::string& dir) {
  std::string_view d = dir;
  while (d.size() > 1 && d.back() == '/') d.remove_suffix(1);
  if (const auto st = fs.stat(std::string(d)); st && st->type == EntryType::symlink)
    throw Error(Errc::unsafe_path, dir, "step directory is a symlink", "directory", "symlink");
}
}  // namespace

namespace {
constexpr std::size_t kManifestPiece = 1u << 20;

// Decodes manifest.json reading it in kManifestPiece pieces into one reused buffer (the scan
// and the parse each read it once; format/manifest_limits.hpp).
std::shared_ptr<const Manifest> decode_manifest_file(ReadableFile& f, std::uint64_t size, const std::string& mpath) {
  std::string piece(static_cast<std::size_t>(std::min<std::uint64_t>(size, kManifestPiece)), '\0');
  const ManifestTextSource source = [&](std::uint64_t offset) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), size - offset));
    f.read_at(offset, std::as_writable_bytes(std::span(piece.data(), n)));
    return std::string_view(piece.data(), n);
  };
  return std::make_shared<const Manifest>(decode_manifest(size, source, mpath));
}

// The process-wide cache of decoded manifests, so that the N rank threads of a process that
// open one checkpoint decode its manifest once. A committed manifest is never modified in
// place: commit_checkpoint writes it into the step's temporary directory and renames the
// directory into place, and a manifest written again is a new file (a new inode). So a file
// with the same path, device, inode, size and modification time as one decoded before holds
// the same bytes, and (file system, path, device, inode, size, mtime) identifies what was
// decoded. Entries are weak: a manifest lives as long as a reader holds it. A decode under
// way is shared: the threads that ask for it meanwhile wait for its result (or its error).
class ManifestCache {
 public:
  using Ptr = std::shared_ptr<const Manifest>;

  Ptr get(FileSystem& fs, const std::string& mpath, const FileStat& st, const std::function<Ptr()>& decode) {
    if (st.inode == 0) return decode();  // no identity to key on
    const std::string key = std::to_string(reinterpret_cast<std::uintptr_t>(&fs)) + ":" + std::to_string(st.device) + ":" +
                            std::to_string(st.inode) + ":" + std::to_string(st.size) + ":" + std::to_string(st.mtime_ns) + ":" + mpath;
    std::promise<Ptr> mine;
    std::shared_future<Ptr> pending;
    {
      std::lock_guard lk(mu_);
      auto it = entries_.find(key);
      if (it != entries_.end()) {
        if (Ptr hit = it->second.done.lock()) return hit;
        if (it->second.pending.valid()) pending = it->second.pending;
      }
      if (!pending.valid()) {
        prune();
        entries_[key] = Entry{{}, mine.get_future().share()};
      }
    }
    if (pending.valid()) return pending.get();  // another thread decodes it
    Ptr m;
    try {
      m = decode();
    } catch (...) {
      mine.set_exception(std::current_exception());
      std::lock_guard lk(mu_);
      entries_.erase(key);
      throw;
    }
    mine.set_value(m);
    std::lock_guard lk(mu_);
    entries_[key] = Entry{m, {}};
    return m;
  }

 private:
  struct Entry {
    std::weak_ptr<const Manifest> done;
    std::shared_future<Ptr> pending;  // valid while the decode runs
  };
  void prune() {
    for (auto it = entries_.begin(); it != entries_.end();)
      it = !it->second.pending.valid() && it->second.done.expired() ? entries_.erase(it) : std::next(it);
  }
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

ManifestCache& manifest_cache() {
  static ManifestCache cache;
  return cache;
}

std::shared_ptr<const Manifest> read_manifest(FileSystem& fs, const std::string& mpath) {
  const detail::OpenedSmallFile f = detail::open_small_file(fs, mpath, kMaxManifestBytes, Errc::malformed_manifest);
  auto decode = [&] { return decode_manifest_file(*f.file, f.size, mpath); };
  // A file replaced between the stat and the open is decoded without being cached.
  if (!f.stat || f.stat->size != f.size) return decode();
  return manifest_cache().get(fs, mpath, *f.stat, decode);
}
}  // namespace

namespace {
std::shared_ptr<const Manifest> open_manifest(FileSystem& fs, const std::string& dir) {
  refuse_symlinked_dir(fs, dir);
  const std::string mpath = join_path(dir, kManifestName);
  try {
    // A manifest within the limits can still need more memory than there is: the failure
    // names the manifest, not just std::bad_alloc.
    return with_typed_errors(mpath, [&] { return read_manifest(fs, mpath); });
  } catch (const Error& e) {
    if (e.code() == Errc::not_found)
      throw Error(Errc::not_found, mpath, "no manifest: not a complete checkpoint", "manifest.json present", "missing");
    throw;
  }
}

}  // namespace

std::shared_ptr<const Manifest> read_checkpoint_manifest(FileSystem& fs, const std::string& dir) { return open_manifest(fs, dir); }

namespace {
// The XXH3 of manifest copies, by the identity ManifestCache keys on (a committed manifest is
// never modified in place): the ranks of a process that open one node set at once read each
// node's copy once between them, not once each. Bounded; a copy whose identity changed while
// it was read is not kept.
class ManifestDigests {
 public:
  // The digest of `mpath` (its bytes into `*bytes` when they were read for it).
  std::uint64_t get(FileSystem& fs, const std::string& mpath, std::optional<std::string>* bytes) {
    const auto before = fs.stat(mpath);
    if (!before) throw Error(Errc::not_found, mpath, "no manifest: not a complete checkpoint", "manifest.json present", "missing");
    const std::string key = key_of(fs, mpath, *before);
    if (before->inode != 0) {
      std::lock_guard lk(mu_);
      if (const auto it = digests_.find(key); it != digests_.end()) return it->second;
    }
    std::string text = with_typed_errors(mpath, [&] { return detail::read_small_file(fs, mpath, kMaxManifestBytes, Errc::malformed_manifest); });
    const std::uint64_t d = xxh3_64(text.data(), text.size());
    if (const auto after = fs.stat(mpath); before->inode != 0 && after && key_of(fs, mpath, *after) == key && after->size == text.size()) {
      std::lock_guard lk(mu_);
      if (digests_.size() >= 4096) digests_.clear();
      digests_[key] = d;
    }
    *bytes = std::move(text);
    return d;
  }

 private:
  static std::string key_of(FileSystem& fs, const std::string& mpath, const FileStat& st) {
    return std::to_string(reinterpret_cast<std::uintptr_t>(&fs)) + ":" + std::to_string(st.device) + ":" + std::to_string(st.inode) + ":" +
           std::to_string(st.size) + ":" + std::to_string(st.mtime_ns) + ":" + mpath;
  }
  std::mutex mu_;
  std::map<std::string, std::uint64_t> digests_;
};

ManifestDigests& manifest_digests() {
  static ManifestDigests d;
  return d;
}
}  // namespace

NodeManifest read_node_manifest(FileSystem& fs, std::span<const std::string> node_dirs, bool with_bytes) {
  if (node_dirs.empty()) throw Error(Errc::invalid_argument, {}, "node directories of a checkpoint across node roots", "at least one", "none");
  const std::size_t n = node_dirs.size();
  // Every copy's XXH3 (equal digests: the same bytes), or why it has none; the bytes of the
  // copies read for it.
  std::vector<std::optional<std::uint64_t>> digests(n);
  std::vector<std::optional<std::string>> bytes(n);
  std::vector<std::optional<Error>> errors(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::string mpath = join_path(node_dirs[i], kManifestName);
    try {
      refuse_symlinked_dir(fs, node_dirs[i]);
      digests[i] = manifest_digests().get(fs, mpath, &bytes[i]);
    } catch (const Error& e) {
      errors[i] = e;
    }
  }
  // The groups of copies holding the same bytes, most copies first (a tie: the lowest node);
  // the first group whose bytes decode as a checkpoint across these nodes is the manifest.
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < n; ++i)
    if (digests[i]) order.push_back(i);
  const auto copies = [&](std::size_t i) { return std::count(digests.begin(), digests.end(), digests[i]); };
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return copies(a) > copies(b); });
  for (const std::size_t i : order) {
    if (errors[i]) continue;  // its group was refused already
    const std::string mpath = join_path(node_dirs[i], kManifestName);
    try {
      auto m = open_manifest(fs, node_dirs[i]);
      if (!m->nodes)
        throw Error(Errc::malformed_manifest, mpath, "nodes", "a checkpoint across " + std::to_string(n) + " node roots", "a checkpoint of one root");
      if (static_cast<std::size_t>(m->nodes->nodes) != n)
        throw Error(Errc::malformed_manifest, mpath, "nodes.count (the node roots the checkpoint spans)", std::to_string(n),
                    std::to_string(m->nodes->nodes));
      NodeManifest out;
      out.manifest = std::move(m);
      out.node = i;
      out.problems.assign(n, {});
      for (std::size_t j = 0; j < n; ++j)
        if (errors[j]) out.problems[j] = errors[j];
        else if (digests[j] != digests[i])
          out.problems[j] = Error(Errc::checksum_mismatch, join_path(node_dirs[j], kManifestName), "copy of the manifest",
                                  "the bytes most nodes hold (node " + std::to_string(i) + "'s)", "other bytes");
      if (with_bytes)
        out.bytes = bytes[i] ? std::move(*bytes[i])
                             : with_typed_errors(mpath, [&] { return detail::read_small_file(fs, mpath, kMaxManifestBytes, Errc::malformed_manifest); });
      return out;
    } catch (const Error& e) {
      for (std::size_t j = 0; j < n; ++j)
        if (digests[j] && digests[j] == digests[i])
          errors[j] = e.file() == mpath ? Error(e.code(), join_path(node_dirs[j], kManifestName), e.detail(), e.expected(), e.actual()) : e;
    }
  }
  // No copy qualifies. Every copy there but refused: the first one's error (the content's:
  // a malformed or hostile manifest). Some missing: Errc::not_found naming every copy.
  std::string tried;
  bool any_missing = false;
  for (std::size_t i = 0; i < n; ++i) {
    any_missing |= errors[i]->code() == Errc::not_found;
    tried += (tried.empty() ? "" : "; ") + std::string(errors[i]->what());
  }
  if (!any_missing) throw *errors[0];
  throw Error(Errc::not_found, join_path(node_dirs[0], kManifestName),
              "no node root has a manifest of " + std::string(last_component(node_dirs[0])) + " that opens", "a manifest on at least one node", tried);
}

CheckpointReader CheckpointReader::checked(FileSystem& fs, std::string dir, std::shared_ptr<const Manifest> manifest,
                                           std::vector<std::string> node_dirs, std::optional<int> expected_world_size) {
  const Manifest& m = *manifest;
  const std::string mpath = join_path(dir, kManifestName);
  // The directory name is the step the commit gave it (docs/format.md): a manifest that says
  // otherwise was moved, copied or edited, and must not pass for this step.
  if (const auto dir_step = parse_checkpoint_dir_name(last_component(dir)); dir_step && *dir_step != m.step)
    throw Error(Errc::malformed_manifest, mpath, "step", std::to_string(*dir_step) + " (the directory's)", std::to_string(m.step));
  if (expected_world_size && *expected_world_size != m.world_size)
    throw Error(Errc::world_size_mismatch, mpath,
                "checkpoint written at world size " + std::to_string(m.world_size) + ", loading at world size " +
                    std::to_string(*expected_world_size) + " (reshard to change the world size)",
                std::to_string(*expected_world_size), std::to_string(m.world_size));
  std::vector<std::string> shard_dirs;
  if (m.nodes) {
    if (node_dirs.size() != static_cast<std::size_t>(m.nodes->nodes))
      throw Error(Errc::malformed_manifest, mpath, "nodes.count (the node roots the checkpoint spans)", std::to_string(node_dirs.size()),
                  std::to_string(m.nodes->nodes));
    for (int r = 0; r < m.world_size; ++r) shard_dirs.push_back(node_dirs[static_cast<std::size_t>(m.nodes->node_of(r))]);
  }
  for (const auto& s : m.shards) {
    const std::string path = join_path(shard_dirs.empty() ? dir : shard_dirs[static_cast<std::size_t>(s.rank)], s.path);
    const auto st = fs.stat(path);
    if (!st)
      throw Error(Errc::missing_shard, path, "shard of rank " + std::to_string(s.rank) + " listed in the manifest", "present",
                  "missing");
    if (st->type == EntryType::symlink) throw Error(Errc::unsafe_path, path, "shard is a symlink", "regular file", "symlink");
    if (st->type != EntryType::file) throw Error(Errc::unsafe_path, path, "shard is not a regular file", "regular file", "other");
    check_size(s.size, st->size, "shard size", path);
  }
  return CheckpointReader(fs, std::move(dir), std::move(manifest), std::move(shard_dirs));
}

CheckpointReader CheckpointReader::open(FileSystem& fs, const std::string& dir, std::optional<int> expected_world_size) {
  auto manifest = open_manifest(fs, dir);
  std::vector<std::string> node_dirs;
  if (manifest->nodes) {
    // DIR/node-n/step-N: the checkpoint across DIR/node-k/step-N, its manifest the one the
    // nodes agree on (read_node_manifest).
    const std::string node_root = parent_dir(dir);
    const std::string set = parent_dir(node_root);
    const std::string name(last_component(dir));
    if (last_component(node_root).starts_with("node-")) {
      for (const auto& r : node_root_paths(set, manifest->nodes->nodes)) node_dirs.push_back(join_path(r, name));
      return open_nodes(fs, node_dirs, expected_world_size);
    }
    for (int n = 0; n < manifest->nodes->nodes; ++n) node_dirs.push_back(dir);
  }
  return checked(fs, dir, std::move(manifest), std::move(node_dirs), expected_world_size);
}

CheckpointReader CheckpointReader::open_nodes(FileSystem& fs, std::span<const std::string> node_dirs, std::optional<int> expected_world_size) {
  NodeManifest m = read_node_manifest(fs, node_dirs);
  return checked(fs, node_dirs[m.node], std::move(m.manifest), std::vector<std::string>(node_dirs.begin(), node_dirs.end()), expected_world_size);
}

std::string CheckpointReader::manifest_path() const { return join_path(dir_, kManifestName); }

std::string CheckpointReader::file_path(const ShardRecord& file) const {
  return join_path(shard_dirs_.empty() ? dir_ : shard_dirs_.at(static_cast<std::size_t>(file.rank)), file.path);
}

std::string CheckpointReader::shard_path(int rank) const { return file_path(manifest_.shard(rank)); }

std::atomic<bool>& CheckpointReader::header_ok(const ShardRecord& file) const {
  return header_ok_[manifest_.file_index(file.rank, file.part)];
}

void CheckpointReader::read_verified(const ShardRecord& rec, Verify mode, std::span<std::byte> out, const ProgressFn& progress,
                                     std::uint64_t done_before, std::uint64_t total, const ChunkSink& sink) const {
  // `out` is either the whole file (load) or one chunk of scratch space (verify), reused.
  const std::string path = file_path(rec);
  auto f = fs_->open_read(path);
  check_size(rec.size, f->size(), "shard size", path);
  const std::uint64_t cs = manifest_.chunk_size;
  const std::uint64_t n = chunk_count(rec.size, cs);
  const bool whole = out.size() >= rec.size;
  std::optional<Sha256> sha;
  Xxh3 all;
  if (mode == Verify::full) sha.emplace();
  detail::read_verified_chunks(
      [&](std::uint64_t off, std::span<std::byte> b) { f->read_at(off, b); }, path, rec.chunk_xxh3, cs, rec.size, 0, n, mode != Verify::none,
      [&](std::uint64_t k, std::uint64_t len) { return whole ? out.subspan(k * cs, len) : out.first(len); },
      [&](std::uint64_t, std::uint64_t begin, std::span<const std::byte> piece) {
        if (sha) {
          sha->update(piece);
          all.update(piece);
        }
        if (sink) sink(begin, piece);
        if (progress) progress(done_before + begin + piece.size(), total);
      });
  if (sha) {
    const std::string actual = to_hex(sha->finish());
    if (actual != rec.sha256) throw Error(Errc::checksum_mismatch, path, "sha256 of the whole file", rec.sha256, actual);
    if (all.digest() != rec.xxh3)
      throw Error(Errc::checksum_mismatch, path, "xxh3 of the whole file", xxh3_hex(rec.xxh3), xxh3_hex(all.digest()));
  }
}

CheckedShardHeader CheckpointReader::read_shard_header(const ShardRecord& rec, Verify mode) const {
  const std::string path = file_path(rec);
  std::unique_ptr<ReadableFile> f;
  try {
    f = fs_->open_read(path);
  } catch (const Error& e) {
    // Gone since the checkpoint was opened: missing, as open() calls it.
    if (e.code() != Errc::not_found) throw;
    throw Error(Errc::missing_shard, path, "shard of rank " + std::to_string(rec.rank) + " listed in the manifest", "present", "missing",
                e.sys_errno());
  }
  check_size(rec.size, f->size(), "shard size", path);
  return detail::read_checked_shard_header(
      manifest_, rec, [&](std::uint64_t offset, std::span<std::byte> out) { f->read_at(offset, out); }, path, mode);
}

void CheckpointReader::check_file_header(const ShardRecord& file, Verify mode) const {
  std::atomic<bool>& ok = header_ok(file);
  if (ok.load(std::memory_order_acquire)) return;
  read_shard_header(file, mode);
  ok.store(true, std::memory_order_release);
}

void CheckpointReader::check_shard_header(int rank, Verify mode) const {
  check_rank(rank, manifest_.world_size, "rank", dir_);
  for (const ShardRecord& f : manifest_.files_of(rank)) check_file_header(f, mode);
}

void CheckpointReader::verify(Verify mode, const ProgressFn& progress) const {
  std::uint64_t total = 0, done = 0;
  for (const auto& s : manifest_.shards) total += s.size;
  // One chunk of scratch, but never more than the largest shard: a manifest may declare 1 GiB
  // chunks for files of a few kilobytes.
  std::uint64_t largest = 0;
  for (const auto& s : manifest_.shards) largest = std::max(largest, s.size);
  AlignedBuffer scratch(static_cast<std::size_t>(std::min(manifest_.chunk_size, largest)));
  for (const auto& s : manifest_.shards) {
    verify_one(s, mode, scratch, progress, done, total);
    done += s.size;
  }
}

void CheckpointReader::stream_file(const ShardRecord& file, Verify mode, const ChunkSink& sink) const {
  check_file_header(file, mode);
  AlignedBuffer scratch(static_cast<std::size_t>(std::min(manifest_.chunk_size, file.size)));
  read_verified(file, mode, scratch.span(scratch.capacity()), {}, 0, file.size, sink);
}

void CheckpointReader::stream_shard(int rank, Verify mode, const ChunkSink& sink) const {
  check_rank(rank, manifest_.world_size, "rank", dir_);
  stream_file(manifest_.shard(rank), mode, sink);
}

void CheckpointReader::verify_file(const ShardRecord& file, Verify mode, const ProgressFn& progress) const {
  AlignedBuffer scratch(mode == Verify::none ? 0 : static_cast<std::size_t>(std::min(manifest_.chunk_size, file.size)));
  verify_one(file, mode, scratch, progress, 0, file.size);
}

void CheckpointReader::verify_shard(int rank, Verify mode, const ProgressFn& progress) const {
  check_rank(rank, manifest_.world_size, "rank", dir_);
  for (const ShardRecord& f : manifest_.files_of(rank)) verify_file(f, mode, progress);
}

void CheckpointReader::verify_one(const ShardRecord& s, Verify mode, AlignedBuffer& scratch, const ProgressFn& progress, std::uint64_t done,
                                  std::uint64_t total) const {
  if (mode != Verify::none) read_verified(s, mode, scratch.span(scratch.capacity()), progress, done, total);
  // The header is checked from its own bytes (verified above when mode != none), every time:
  // verify reads again what an earlier read of this reader checked.
  read_shard_header(s, Verify::none);
  header_ok(s).store(true, std::memory_order_release);
}

LoadedShard CheckpointReader::load_shard(int rank, Verify mode) const {
  check_rank(rank, manifest_.world_size, "rank", dir_);
  LoadedShard out;
  out.rank = rank;
  out.record = manifest_.rank_record(rank);
  out.path_ = file_path(out.record);
  const auto files = manifest_.files_of(rank);
  // The files back to back, each at a 4096-aligned offset of the one buffer.
  std::vector<std::uint64_t> at;
  for (const ShardRecord& f : files) {
    at.push_back(out.size_);
    out.size_ = (out.size_ + f.size + 4095) / 4096 * 4096;
  }
  if (!files.empty()) out.size_ = at.back() + files.back().size;
  out.buffer_ = AlignedBuffer(static_cast<std::size_t>(out.size_));
  for (std::size_t i = 0; i < files.size(); ++i) {
    const ShardRecord& f = files[i];
    const std::span<std::byte> file = out.buffer_.span(static_cast<std::size_t>(out.size_)).subspan(static_cast<std::size_t>(at[i]), static_cast<std::size_t>(f.size));
    read_verified(f, mode, file, {}, 0, f.size);
    // The header is checked from the bytes just read (and verified, unless mode is none).
    const CheckedShardHeader checked = check_shard_head(manifest_, f, file, file_path(f));
    header_ok(f).store(true, std::memory_order_release);
    const ShardHeader& h = checked.header;
    for (std::size_t k = 0; k < h.tensors.size(); ++k) {
      const ShardTensor& t = h.tensors[k];
      out.tensors.push_back({t.name, t.dtype, t.shape, std::span<const std::byte>(file).subspan(h.data_start + t.begin, t.end - t.begin),
                             checked.records[k]->sharding});
    }
    for (const auto& [k, v] : h.metadata) out.header_metadata.emplace(k, v);
  }
  return out;
}

std::vector<std::byte> CheckpointReader::read_tensor(std::string_view name, int held_by, Verify mode) const {
  const TensorRecord* t = manifest_.find_held_tensor(name, held_by);
  if (!t) throw Error(Errc::not_found, manifest_path(), "no tensor '" + std::string(name) + "' on rank " + std::to_string(held_by));
  // A replicated tensor is read from its lowest holder's shard.
  const ShardRecord& rec = manifest_.file_of(*t);
  check_file_header(rec, mode);
  const std::string path = file_path(rec);
  auto f = fs_->open_read(path);
  check_size(rec.size, f->size(), "shard size", path);
  std::vector<std::byte> out(static_cast<std::size_t>(t->end - t->begin));
  if (mode == Verify::none || out.empty()) {
    f->read_at(t->begin, out);
    return out;
  }
  const std::uint64_t cs = manifest_.chunk_size;
  const std::uint64_t k0 = t->begin / cs, k1 = (t->end + cs - 1) / cs;
  std::vector<std::byte> chunk(static_cast<std::size_t>(std::min(cs, rec.size)));
  detail::read_verified_chunks(
      [&](std::uint64_t off, std::span<std::byte> b) { f->read_at(off, b); }, path, rec.chunk_xxh3, cs, rec.size, k0, k1, true,
      [&](std::uint64_t, std::uint64_t len) { return std::span<std::byte>(chunk.data(), static_cast<std::size_t>(len)); },
      [&](std::uint64_t, std::uint64_t begin, std::span<const std::byte> piece) {
        const std::uint64_t from = std::max(begin, t->begin), to = std::min(begin + piece.size(), t->end);
        std::memcpy(out.data() + (from - t->begin), piece.data() + (from - begin), static_cast<std::size_t>(to - from));
      });
  return out;
}

std::vector<std::byte> CheckpointReader::read_tensor_range(std::string_view name, int held_by, std::uint64_t first, std::uint64_t count,
                                                          Verify mode) const {
  const TensorRecord* t = manifest_.find_held_tensor(name, held_by);
  if (!t) throw Error(Errc::not_found, manifest_path(), "no tensor '" + std::string(name) + "' on rank " + std::to_string(held_by));
  const ShardRecord& rec = manifest_.file_of(*t);
  const std::uint64_t esize = dtype_size(t->dtype), numel = (t->end - t->begin) / esize;
  if (first > numel || count > numel - first)
    throw Error(Errc::invalid_argument, file_path(rec), "element range of tensor '" + std::string(name) + "'",
                "within " + std::to_string(numel) + " elements", std::to_string(first) + "+" + std::to_string(count));
  std::vector<std::byte> out(static_cast<std::size_t>(count * esize));
  ShardRangeReader(*this, rec, mode).read(t->begin + first * esize, out);
  return out;
}

std::optional<std::string> read_latest(FileSystem& fs, const std::string& root) {
  const std::string path = join_path(root, kLatestName);
  if (!fs.stat(path)) return std::nullopt;
  std::string text = read_small_file(fs, path, 4096, Errc::malformed_manifest);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  return text;
}

bool rotated_away(FileSystem& fs, const std::string& root, const std::string& name) noexcept {
  try {
    const auto step = parse_checkpoint_dir_name(name);
    // A node set keeps its steps in its node roots and its `latest` files there: not a plain root.
    if (!step || fs.stat(join_path(root, name)) || !fs.stat(join_path(root, kLatestName))) return false;
    const auto latest = read_latest(fs, root);
    const auto live = latest ? parse_checkpoint_dir_name(*latest) : std::nullopt;
    return live && *live > *step;
  } catch (...) {
    return false;
  }
}

CheckpointReader open_step(FileSystem& fs, const std::string& root, std::uint64_t step, std::optional<int> expected_world_size) {
  return CheckpointReader::open(fs, join_path(root, checkpoint_dir_name(step)), expected_world_size);
}

std::string_view checkpoint_state_name(CheckpointState s) noexcept {
  switch (s) {
    case CheckpointState::complete: return "complete";
    case CheckpointState::in_progress: return "in progress";
    case CheckpointState::corrupt: return "corrupt";
    case CheckpointState::degraded: return "degraded";
  }
  return "?";
}

std::vector<CheckpointInfo> list_checkpoints(FileSystem& fs, const std::string& root, Verify verify) {
  std::vector<CheckpointInfo> out;
  const auto latest = read_latest(fs, root);
  for (const auto& e : fs.list_dir(root)) {
    const auto step = parse_checkpoint_dir_name(e.name);
    const bool temp = is_temporary_name(e.name);
    // A symlink with a checkpoint's name is listed, as the unsafe path open() calls it.
    if (e.type != EntryType::directory && !(step && e.type == EntryType::symlink)) continue;
    if (!step && !temp) continue;
    CheckpointInfo info;
    info.name = e.name;
    info.step = step;
    info.is_latest = latest && *latest == e.name;
    const std::string dir = join_path(root, e.name);
    // A save running meanwhile renames temporaries into place and rotates old checkpoints away
    // (renamed to a temporary, then removed): an entry gone since list_dir is no longer there
    // to report, and what failed while it went is not damage.
    auto vanished = [&] {
      const auto st = fs.stat(dir);
      return !st || st->type != e.type;
    };
    if (temp) {
      info.state = CheckpointState::in_progress;
      try {
        for (const auto& f : fs.list_dir(dir))
          if (auto st = fs.stat(join_path(dir, f.name)); st && st->type == EntryType::file) info.bytes += st->size;
      } catch (const Error& err) {
        if (err.code() == Errc::not_found || vanished()) continue;
        throw;
      }
    } else {
      try {
        auto reader = CheckpointReader::open(fs, dir);
        info.world_size = reader.manifest().world_size;
        for (const auto& s : reader.manifest().shards) info.bytes += s.size;
        if (verify != Verify::none) reader.verify(verify);
      } catch (const Error& err) {
        if (vanished()) continue;
        info.state = CheckpointState::corrupt;
        info.error = err.what();
      }
    }
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace ckpt
