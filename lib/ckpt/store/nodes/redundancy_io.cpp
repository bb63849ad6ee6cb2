// SPDX-License-Identifier: Apache-2.0
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/store/nodes/erasure.hpp"
#include "ckpt/read/chunk_check.hpp"

#include <algorithm>
#include <mutex>
#include <cstring>
#include <map>
#include <set>

#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/hash/xxh3.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/shard/shard_writer.hpp"

namespace ckpt {

namespace {
// Each rank's byte range in its node's data: [start, start + size).
struct NodeSpans {
  std::vector<std::uint64_t> start;  // per rank
  std::vector<std::uint64_t> size;   // per rank
};
NodeSpans node_spans(const NodeLayout& l, std::span<const std::uint64_t> sizes) {
  NodeSpans s;
  std::vector<std::uint64_t> at(static_cast<std::size_t>(l.nodes), 0);
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    auto& a = at[static_cast<std::size_t>(l.node_of(static_cast<int>(r)))];
    s.start.push_back(a);
    s.size.push_back(sizes[r]);
    a += sizes[r];
  }
  return s;
}

// The ranks' pieces of bytes [offset, offset + len) of `node`'s data, in rank order:
// piece(rank, offset in its file, offset in the range, length) for each non-empty overlap.
template <typename Piece>
void for_each_rank_piece(const NodeLayout& l, const NodeSpans& s, int node, std::uint64_t offset, std::uint64_t len, Piece&& piece) {
  const std::uint64_t end = offset + len;
  for (int r = node * l.ranks_per_node; r < (node + 1) * l.ranks_per_node; ++r) {
    const std::uint64_t b = s.start[static_cast<std::size_t>(r)], e = b + s.size[static_cast<std::size_t>(r)];
    const std::uint64_t lo = std::max(b, offset), hi = std::min(e, end);
    if (lo < hi) piece(r, lo - b, lo - offset, hi - lo);
  }
}

// Fills `out` from the ranks of `node`, `read(rank, offset in its file, piece)` reading each
// overlap; zeros where no rank's bytes are.
template <typename Read>
void gather(const NodeLayout& l, const NodeSpans& s, int node, std::uint64_t offset, std::span<std::byte> out, Read&& read) {
  std::memset(out.data(), 0, out.size());
  for_each_rank_piece(l, s, node, offset, out.size(), [&](int r, std::uint64_t at, std::uint64_t into, std::uint64_t n) {
    read(r, at, out.subspan(static_cast<std::size_t>(into), static_cast<std::size_t>(n)));
  });
}

std::vector<std::uint64_t> sizes_of(const Manifest& m) {
  std::vector<std::uint64_t> v;
  for (const auto& s : m.shards) v.push_back(s.size);
  return v;
}

void stop_check(const std::function<bool()>& stopped, const std::string& path) {
  if (stopped && stopped()) throw Error(Errc::aborted, path, "redundancy write stopped (the save was cancelled or failed)");
}
}  // namespace

NodeBytes node_bytes_by_rank(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes, RankBytes read) {
  return [layout, spans = node_spans(layout, shard_sizes), read = std::move(read)](int node, std::uint64_t offset, std::span<std::byte> out) {
    gather(layout, spans, node, offset, out, read);
  };
}

NodeBytes node_bytes_from_images(const NodeLayout& layout, std::vector<std::span<const std::byte>> images) {
  std::vector<std::uint64_t> sizes;
  for (const auto& i : images) sizes.push_back(i.size());
  return node_bytes_by_rank(layout, sizes, [images = std::move(images)](int r, std::uint64_t at, std::span<std::byte> piece) {
    std::memcpy(piece.data(), images[static_cast<std::size_t>(r)].data() + at, piece.size());
  });
}

ShardRecord write_file_from(FileSystem& fs, const std::string& dir, const std::string& name, std::uint64_t size, const FileBytes& source,
                            std::uint64_t chunk_size, const std::function<bool()>& stopped) {
  ShardWriter w = ShardWriter::copy(fs, dir, name, size, {.chunk_size = chunk_size});
  AlignedBuffer buf(static_cast<std::size_t>(std::min<std::uint64_t>(std::max<std::uint64_t>(size, 1), chunk_size)));
  for (std::uint64_t off = 0; off < size; off += chunk_size) {
    stop_check(stopped, w.path());
    const auto n = static_cast<std::size_t>(std::min(chunk_size, size - off));
    source(off, buf.span(n));
    w.write(buf.span(n));
  }
  w.mark_written(size);
  return w.finish(0).shard;
}

void write_parity(FileSystem& fs, std::span<const std::string> node_dirs, const ReedSolomon& code, const Stripe& stripe,
                  std::span<RedundancyBlock* const> blocks, const NodeBytes& data, std::uint64_t chunk_size,
                  const std::function<bool()>& stopped) {
  const auto k = static_cast<std::size_t>(code.k());
  const auto c = static_cast<std::size_t>(std::min<std::uint64_t>(std::max<std::uint64_t>(stripe.length, 1), chunk_size));
  // Only the parity rows of `blocks` are computed: K input chunks, one output chunk per block.
  AlignedBuffer in(k * c), par(std::max<std::size_t>(blocks.size(), 1) * c);
  std::vector<const std::byte*> in_ptr(k);
  for (std::size_t i = 0; i < k; ++i) in_ptr[i] = in.data() + i * c;
  std::vector<ShardWriter> writers;
  for (auto* b : blocks) writers.push_back(ShardWriter::copy(fs, node_dirs[static_cast<std::size_t>(b->node)], b->path, stripe.length, {.chunk_size = chunk_size}));
  // The reads of one stripe chunk, in the order unit_reads lists them.
  for (std::uint64_t off = 0; off < stripe.length; off += c) {
    stop_check(stopped, writers.empty() ? std::string() : writers.front().path());
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(c, stripe.length - off));
    for (std::size_t i = 0; i < k; ++i) {
      const auto& piece = stripe.data[i];
      std::span<std::byte> dst(in.data() + i * c, n);
      std::memset(dst.data(), 0, n);
      if (off < piece.length) data(piece.node, piece.offset + off, dst.first(static_cast<std::size_t>(std::min<std::uint64_t>(n, piece.length - off))));
    }
    for (std::size_t w = 0; w < writers.size(); ++w) {
      std::byte* out = par.data() + w * c;
      code.encode_one(blocks[w]->index, in_ptr, out, n);
      writers[w].write(std::span<const std::byte>(out, n));
    }
  }
  for (std::size_t w = 0; w < writers.size(); ++w) {
    writers[w].mark_written(stripe.length);
    const ShardRecord r = writers[w].finish(0).shard;
    blocks[w]->sha256 = r.sha256;
    blocks[w]->xxh3 = r.xxh3;
    blocks[w]->chunk_xxh3 = r.chunk_xxh3;
  }
}

std::size_t redundancy_units(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes) {
  return planned_blocks(layout, shard_sizes).size();
}

int redundancy_unit_rank(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes, std::size_t unit) {
  const RedundancyBlock b = planned_blocks(layout, shard_sizes).at(unit);
  return b.node * layout.ranks_per_node + static_cast<int>(unit % static_cast<std::size_t>(layout.ranks_per_node));
}

std::vector<RankRead> unit_reads(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes, std::size_t unit,
                                 std::uint64_t chunk_size) {
  const auto all = planned_blocks(layout, shard_sizes);
  const RedundancyBlock& b = all.at(unit);
  const auto spans = node_spans(layout, shard_sizes);
  std::vector<RankRead> out;
  const auto node_read = [&](int node, std::uint64_t offset, std::uint64_t len) {
    for_each_rank_piece(layout, spans, node, offset, len,
                        [&](int r, std::uint64_t at, std::uint64_t, std::uint64_t n) { out.push_back({r, at, n}); });
  };
  if (b.kind == RedundancyBlock::Kind::parity) {
    // write_parity's loop: stripe chunk by chunk, data piece by data piece.
    const Stripe st = rs_stripes(layout, shard_sizes).at(static_cast<std::size_t>(b.stripe));
    const std::uint64_t c = std::min<std::uint64_t>(std::max<std::uint64_t>(st.length, 1), chunk_size);
    for (std::uint64_t off = 0; off < st.length; off += c) {
      const std::uint64_t n = std::min(c, st.length - off);
      for (const auto& piece : st.data)
        if (off < piece.length) node_read(piece.node, piece.offset + off, std::min(n, piece.length - off));
    }
  } else {
    // write_file_from's loop over the copied shard's bytes in its node's data.
    const int node = layout.node_of(b.rank);
    const std::uint64_t start = spans.start[static_cast<std::size_t>(b.rank)];
    for (std::uint64_t off = 0; off < b.size; off += chunk_size) node_read(node, start + off, std::min(chunk_size, b.size - off));
  }
  return out;
}

std::vector<RedundancyBlock> write_redundancy_unit(FileSystem& fs, std::span<const std::string> node_dirs, const NodeLayout& layout,
                                                   std::span<const std::uint64_t> shard_sizes, const NodeBytes& data,
                                                   std::uint64_t chunk_size, std::size_t unit, const std::function<bool()>& stopped) {
  RedundancyBlock b = planned_blocks(layout, shard_sizes).at(unit);
  if (b.kind == RedundancyBlock::Kind::parity) {
    const ReedSolomon code(layout.scheme.k, layout.scheme.m);
    const Stripe st = rs_stripes(layout, shard_sizes).at(static_cast<std::size_t>(b.stripe));
    RedundancyBlock* mine[] = {&b};
    write_parity(fs, node_dirs, code, st, mine, data, chunk_size, stopped);
  } else {
    const auto spans = node_spans(layout, shard_sizes);
    const int node = layout.node_of(b.rank);
    const std::uint64_t start = spans.start[static_cast<std::size_t>(b.rank)];
    const ShardRecord r = write_file_from(
        fs, node_dirs[static_cast<std::size_t>(b.node)], b.path, b.size,
        [&](std::uint64_t off, std::span<std::byte> out) { data(node, start + off, out); }, chunk_size, stopped);
    b.sha256 = r.sha256;
    b.xxh3 = r.xxh3;
    b.chunk_xxh3 = r.chunk_xxh3;
  }
  return {std::move(b)};
}

std::vector<RedundancyBlock> write_redundancy(FileSystem& fs, std::span<const std::string> node_dirs, const NodeLayout& layout,
                                              std::span<const std::uint64_t> shard_sizes, const NodeBytes& data, std::uint64_t chunk_size,
                                              const std::function<bool()>& stopped) {
  std::vector<RedundancyBlock> out;
  for (std::size_t u = 0; u < redundancy_units(layout, shard_sizes); ++u)
    for (auto& b : write_redundancy_unit(fs, node_dirs, layout, shard_sizes, data, chunk_size, u, stopped)) out.push_back(std::move(b));
  return out;
}

// ---- health ------------------------------------------------------------------------------

int NodeCheckpointHealth::min_margin() const noexcept {
  if (margins.empty()) return 0;
  return *std::min_element(margins.begin(), margins.end());
}

namespace {
// Checks one file against its size and checksums (per `verify`); the error message if bad.
std::optional<Error> file_problem(FileSystem& fs, const std::string& path, std::uint64_t size, const std::string& sha256,
                                        std::uint64_t xxh3, const std::vector<std::uint64_t>& chunks, std::uint64_t chunk_size,
                                        Verify verify, AlignedBuffer& scratch) {
  try {
    const auto st = fs.stat(path);
    if (!st) throw Error(Errc::missing_shard, path, "listed in the manifest", "present", "missing");
    if (st->type != EntryType::file) throw Error(Errc::unsafe_path, path, "not a regular file", "regular file", "other");
    check_size(size, st->size, "file size", path);
    if (verify == Verify::none) return std::nullopt;
    auto f = fs.open_read(path);
    FileHasher h(chunk_size, verify == Verify::full);
    if (scratch.capacity() < chunk_size) scratch = AlignedBuffer(static_cast<std::size_t>(chunk_size));
    detail::read_verified_chunks(
        [&](std::uint64_t off, std::span<std::byte> b) { f->read_at(off, b); }, path, chunks, chunk_size, size, 0, (size + chunk_size - 1) / chunk_size, true,
        [&](std::uint64_t, std::uint64_t n) { return scratch.span(static_cast<std::size_t>(n)); },
        [&](std::uint64_t, std::uint64_t, std::span<const std::byte> piece) {
          if (verify == Verify::full) h.update(piece);
        });
    if (verify == Verify::full) {
      const FileDigest d = h.finish();
      if (d.sha256 != sha256) throw Error(Errc::checksum_mismatch, path, "SHA-256 of the file", sha256, d.sha256);
      if (d.xxh3 != xxh3) throw Error(Errc::checksum_mismatch, path, "XXH3 of the file", xxh3_hex(xxh3), xxh3_hex(d.xxh3));
    }
    return std::nullopt;
  } catch (const Error& e) {
    return e;
  }
}

// A stripe member is bad when a bad shard of its node overlaps its piece (the health check
// counts it; the repair decodes without it). Other pieces of that node are good members.
bool stripe_piece_bad(const NodeLayout& l, const NodeSpans& spans, const std::vector<MemberHealth>& shards, const StripePiece& p) {
  for (int r = p.node * l.ranks_per_node; r < (p.node + 1) * l.ranks_per_node; ++r) {
    const auto b = spans.start[static_cast<std::size_t>(r)], e = b + spans.size[static_cast<std::size_t>(r)];
    if (!shards[static_cast<std::size_t>(r)].ok && b < p.offset + p.length && p.offset < e && p.length > 0) return true;
  }
  return false;
}

}  // namespace

std::vector<const MemberHealth*> NodeCheckpointHealth::bad_files() const {
  std::vector<const MemberHealth*> out;
  for (const auto* list : {&shards, &blocks, &manifests})
    for (const auto& f : *list)
      if (!f.ok) out.push_back(&f);
  return out;
}

namespace {
std::vector<std::string> checkpoint_dirs(std::span<const std::string> roots, const std::string& name) {
  std::vector<std::string> dirs;
  for (const auto& r : roots) dirs.push_back(join_path(r, name));
  return dirs;
}
}  // namespace

NodeCheckpointHealth check_node_checkpoint(FileSystem& fs, std::span<const std::string> roots, const std::string& name, Verify verify) {
  NodeCheckpointHealth h;
  h.name = name;
  const auto dirs = checkpoint_dirs(roots, name);
  NodeManifest nm = read_node_manifest(fs, dirs, /*with_bytes=*/true);
  h.manifest = *nm.manifest;
  h.manifest_bytes = std::move(nm.bytes);
  for (std::size_t n = 0; n < dirs.size(); ++n)
    h.manifests.push_back(MemberHealth{"manifest copy", static_cast<int>(n), join_path(dirs[n], kManifestName), !nm.problems[n],
                                       nm.problems[n] ? nm.problems[n]->what() : std::string(),
                                       nm.problems[n] ? nm.problems[n]->code() : Errc::io_error});
  const Manifest& m = h.manifest;
  const NodeLayout& l = *m.nodes;
  AlignedBuffer scratch;
  std::vector<bool> node_bad(static_cast<std::size_t>(l.nodes), false);
  for (const auto& s : m.shards) {
    MemberHealth mh{"shard of rank " + std::to_string(s.rank), l.node_of(s.rank),
                    join_path(join_path(roots[static_cast<std::size_t>(l.node_of(s.rank))], name), s.path), true, {}};
    if (auto p = file_problem(fs, mh.path, s.size, s.sha256, s.xxh3, s.chunk_xxh3, m.chunk_size, verify, scratch)) {
      mh.ok = false;
      mh.error = p->what();
      mh.code = p->code();
      h.bad_ranks.push_back(s.rank);
    }
    h.shards.push_back(std::move(mh));
  }
  for (const auto& b : m.redundancy) {
    MemberHealth mh{b.kind == RedundancyBlock::Kind::parity ? "parity " + std::to_string(b.index) + " of stripe " + std::to_string(b.stripe)
                                                            : "replica of rank " + std::to_string(b.rank),
                    b.node, join_path(join_path(roots[static_cast<std::size_t>(b.node)], name), b.path), true, {}};
    if (auto p = file_problem(fs, mh.path, b.size, b.sha256, b.xxh3, b.chunk_xxh3, m.chunk_size, verify, scratch)) {
      mh.ok = false;
      mh.error = p->what();
      mh.code = p->code();
    }
    h.blocks.push_back(std::move(mh));
  }
  // Margins, and the shards that cannot be rebuilt.
  std::set<int> lost;
  if (l.scheme.kind == RedundancyScheme::Kind::reed_solomon) {
    // A data member is bad when any shard of its node overlapping its piece is bad.
    const auto sizes = sizes_of(m);
    const auto spans = node_spans(l, sizes);
    const auto piece_bad = [&](const StripePiece& p) { return stripe_piece_bad(l, spans, h.shards, p); };
    for (const auto& st : rs_stripes(l, sizes)) {
      int bad = 0;
      std::vector<int> bad_nodes;
      for (const auto& p : st.data)
        if (piece_bad(p)) ++bad, bad_nodes.push_back(p.node);
      for (std::size_t i = 0; i < m.redundancy.size(); ++i)
        if (m.redundancy[i].stripe == st.index && !h.blocks[i].ok) ++bad;
      h.margins.push_back(l.scheme.m - bad);
      if (bad > l.scheme.m)
        for (int n : bad_nodes)
          for (int r = n * l.ranks_per_node; r < (n + 1) * l.ranks_per_node; ++r)
            if (!h.shards[static_cast<std::size_t>(r)].ok) lost.insert(r);
    }
  } else {
    for (const auto& s : m.shards) {
      int good = h.shards[static_cast<std::size_t>(s.rank)].ok ? 1 : 0;
      for (std::size_t i = 0; i < m.redundancy.size(); ++i)
        if (m.redundancy[i].rank == s.rank && h.blocks[i].ok) ++good;
      h.margins.push_back(good - 1);
      if (good == 0) lost.insert(s.rank);
    }
  }
  h.lost_ranks.assign(lost.begin(), lost.end());
  return h;
}

// ---- repair ------------------------------------------------------------------------------

namespace {
std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// Where a rebuilt file goes: into its node's checkpoint directory, or, when that is gone,
// into a temporary directory renamed into place at the end (with the manifest).
struct NodeTarget {
  std::string root, final_dir, dir;  // dir: where files are written now
  bool fresh = false;                // the checkpoint directory is being recreated
  std::vector<std::pair<std::string, std::string>> renames;  // file temporaries -> final names
};

// Reads a good file of the checkpoint by offset.
FileBytes file_reader(FileSystem& fs, const std::string& path) {
  auto f = std::shared_ptr<ReadableFile>(fs.open_read(path));
  return [f](std::uint64_t off, std::span<std::byte> out) { f->read_at(off, out); };
}

void check_rebuilt(const ShardRecord& got, const std::string& path, const std::string& sha256, const std::vector<std::uint64_t>& chunks) {
  if (got.sha256 != sha256) throw Error(Errc::checksum_mismatch, path, "SHA-256 of the rebuilt file", sha256, got.sha256);
  if (got.chunk_xxh3 != chunks) throw Error(Errc::checksum_mismatch, path, "XXH3 chunks of the rebuilt file", "the manifest's", "others");
}
}  // namespace

RepairReport repair_node_checkpoint(FileSystem& fs, std::span<const std::string> roots, const std::string& name, Verify verify) {
  RepairReport rep;
  rep.name = name;
  NodeCheckpointHealth h = check_node_checkpoint(fs, roots, name, verify);
  const Manifest& m = h.manifest;
  const NodeLayout& l = *m.nodes;
  if (!h.recoverable()) {
    std::string where;
    for (int r : h.lost_ranks)
      where += (where.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " (node " + std::to_string(l.node_of(r)) + ")";
    throw Error(Errc::missing_shard, join_path(roots[0], name),
                "checkpoint " + name + " cannot be rebuilt: shards of " + where + " are lost beyond what " + redundancy_name(l.scheme) +
                    " restores",
                "at most " + std::to_string(tolerated_node_losses(l.scheme)) + " lost node(s) per " +
                    (l.scheme.kind == RedundancyScheme::Kind::reed_solomon ? "stripe" : "shard"),
                std::to_string(h.bad_ranks.size()) + " bad shard(s): ranks " + join_ints(h.bad_ranks));
  }
  // A node that holds the checkpoint but whose `latest` names none or an older one: a repair
  // cut after it renamed a recreated directory into place, or a commit cut between its
  // `latest` updates. It is moved forward at the end, even when every file is good.
  const auto latest_lags = [&](const std::string& root) {
    try {
      if (const auto n = read_latest(fs, root))
        if (const auto step = parse_checkpoint_dir_name(*n)) return *step < m.step;
    } catch (const Error&) {
    }
    return true;
  };
  const auto holds = [&](int n) {
    const auto st = fs.stat(join_path(roots[static_cast<std::size_t>(n)], name));
    return st && st->type == EntryType::directory;
  };
  bool lagging = false;
  for (int n = 0; n < l.nodes; ++n) lagging |= holds(n) && latest_lags(roots[static_cast<std::size_t>(n)]);
  if (h.healthy() && !lagging) return rep;

  // Targets per node: the checkpoint directory, recreated through a temporary when gone.
  std::vector<NodeTarget> targets(static_cast<std::size_t>(l.nodes));
  for (int n = 0; n < l.nodes; ++n) {
    auto& t = targets[static_cast<std::size_t>(n)];
    t.root = roots[static_cast<std::size_t>(n)];
    t.final_dir = join_path(t.root, name);
    const auto st = fs.stat(t.final_dir);
    t.dir = t.final_dir;
    if (!st || st->type != EntryType::directory) {
      bool needed = false;
      for (const auto& f : h.bad_files()) needed |= f->node == n;
      if (!needed) continue;
      if (!fs.stat(t.root)) {
        // A lost node's root: recreated, and its entry made durable in the parent (the
        // checkpoint directory renamed into it is fsynced through the root below).
        fs.create_dirs(t.root);
        fs.sync_dir(parent_dir(t.root));
      }
      t.fresh = true;
      t.dir = join_path(t.root, temporary_name(name));
      fs.create_dir(t.dir);
    }
  }
  const auto write_target = [&](int node, const std::string& file) -> std::pair<std::string, std::string> {
    auto& t = targets[static_cast<std::size_t>(node)];
    if (t.fresh) return {t.dir, file};
    const std::string tmp = temporary_name(file);
    fs.remove_all(join_path(t.dir, file));  // a damaged file is replaced
    t.renames.push_back({tmp, file});
    return {t.dir, tmp};
  };
  try {
    const auto sizes = sizes_of(m);
    const auto spans = node_spans(l, sizes);
    // Good shard files, read on demand.
    std::map<int, FileBytes> readers;
    const auto shard_bytes = [&](int r) -> const FileBytes& {
      auto it = readers.find(r);
      if (it == readers.end()) it = readers.emplace(r, file_reader(fs, h.shards[static_cast<std::size_t>(r)].path)).first;
      return it->second;
    };
    std::vector<bool> shard_ok;
    for (const auto& s : h.shards) shard_ok.push_back(s.ok);

    if (l.scheme.kind == RedundancyScheme::Kind::replicate) {
      for (int r : h.bad_ranks) {
        const ShardRecord& s = m.shards[static_cast<std::size_t>(r)];
        std::size_t from = 0;
        while (from < m.redundancy.size() && !(m.redundancy[from].rank == r && h.blocks[from].ok)) ++from;
        const auto [dir, file] = write_target(l.node_of(r), s.path);
        const auto got = write_file_from(fs, dir, file, s.size, file_reader(fs, h.blocks[from].path), m.chunk_size);
        check_rebuilt(got, join_path(dir, file), s.sha256, s.chunk_xxh3);
        rep.rebuilt_ranks.push_back(r);
        rep.lines.push_back("rank " + std::to_string(r) + " (node-" + std::to_string(l.node_of(r)) + "/" + name + "/" + s.path +
                            ") rebuilt from its replica on node " + std::to_string(m.redundancy[from].node));
        shard_ok[static_cast<std::size_t>(r)] = true;
      }
      for (std::size_t i = 0; i < m.redundancy.size(); ++i) {
        if (h.blocks[i].ok) continue;
        const auto& b = m.redundancy[i];
        // From the shard if it was good, else from a good replica (a shard rebuilt above is not
        // at its final path yet).
        std::string source = h.shards[static_cast<std::size_t>(b.rank)].path, from_what = "the shard";
        if (!h.shards[static_cast<std::size_t>(b.rank)].ok) {
          std::size_t from = 0;
          while (from < m.redundancy.size() && !(m.redundancy[from].rank == b.rank && h.blocks[from].ok)) ++from;
          source = h.blocks[from].path;
          from_what = "its replica on node " + std::to_string(m.redundancy[from].node);
        }
        const auto [dir, file] = write_target(b.node, b.path);
        const auto got = write_file_from(fs, dir, file, b.size, file_reader(fs, source), m.chunk_size);
        check_rebuilt(got, join_path(dir, file), b.sha256, b.chunk_xxh3);
        rep.lines.push_back("replica of rank " + std::to_string(b.rank) + " on node " + std::to_string(b.node) + " rewritten from " + from_what);
      }
    } else if (l.scheme.kind == RedundancyScheme::Kind::reed_solomon) {
      const ReedSolomon code(l.scheme.k, l.scheme.m);
      const auto stripes = rs_stripes(l, sizes);
      // The bytes of a good node's data (all of its shards good).
      const auto good_node_bytes = [&](int node, std::uint64_t off, std::span<std::byte> out) {
        gather(l, spans, node, off, out, [&](int r, std::uint64_t at, std::span<std::byte> piece) { shard_bytes(r)(at, piece); });
      };
      std::vector<bool> node_ok(static_cast<std::size_t>(l.nodes), true);
      for (int r : h.bad_ranks) node_ok[static_cast<std::size_t>(l.node_of(r))] = false;
      // Rebuild each bad node's data piece by piece, in its data order, into its shard files.
      for (int n = 0; n < l.nodes; ++n) {
        if (node_ok[static_cast<std::size_t>(n)]) continue;
        const std::uint64_t chunk = m.chunk_size;
        // The node's data, produced in order: piece i comes from stripe (n - i) mod nodes.
        // K input buffers of one chunk, allocated (and first touched) once for the node.
        std::vector<AlignedBuffer> bufs;
        for (int i = 0; i < code.k(); ++i) bufs.emplace_back(static_cast<std::size_t>(chunk), /*prefault=*/true);
        std::map<std::size_t, FileBytes> parity_readers;
        const auto decode_piece = [&](int i, std::uint64_t off_in_piece, std::span<std::byte> out) {
          const Stripe& st = stripes[static_cast<std::size_t>(((n - i) % l.nodes + l.nodes) % l.nodes)];
          std::vector<int> have;
          std::vector<const std::byte*> ptrs;
          const auto len = out.size();
          for (int row = 0; row < code.k() + code.m() && static_cast<int>(have.size()) < code.k(); ++row) {
            AlignedBuffer& buf = bufs[have.size()];
            if (row < code.k()) {
              const auto& p = st.data[static_cast<std::size_t>(row)];
              // A node with a bad shard elsewhere still gives this piece (the health check counted
              // only the pieces a bad shard overlaps).
              if (stripe_piece_bad(l, spans, h.shards, p)) continue;
              std::memset(buf.data(), 0, len);
              if (off_in_piece < p.length)
                good_node_bytes(p.node, p.offset + off_in_piece, buf.span(static_cast<std::size_t>(std::min<std::uint64_t>(len, p.length - off_in_piece))));
            } else {
              std::size_t bi = 0;
              while (bi < m.redundancy.size() && !(m.redundancy[bi].stripe == st.index && m.redundancy[bi].index == row - code.k())) ++bi;
              if (bi == m.redundancy.size() || !h.blocks[bi].ok) continue;
              auto it = parity_readers.find(bi);
              if (it == parity_readers.end()) it = parity_readers.emplace(bi, file_reader(fs, h.blocks[bi].path)).first;
              it->second(off_in_piece, buf.span(len));
            }
            ptrs.push_back(buf.data());
            have.push_back(row);
          }
          const int want = i;
          std::byte* outp = out.data();
          code.reconstruct(have, ptrs, std::span<const int>(&want, 1), std::span<std::byte* const>(&outp, 1), len);
        };
        const std::uint64_t d = node_data_bytes(l, sizes)[static_cast<std::size_t>(n)];
        const std::uint64_t piece = (d + static_cast<std::uint64_t>(l.scheme.k) - 1) / static_cast<std::uint64_t>(l.scheme.k);
        const auto node_data = [&](std::uint64_t off, std::span<std::byte> out) {
          // Split by piece boundaries, each decoded from its stripe.
          std::size_t done = 0;
          while (done < out.size()) {
            const std::uint64_t at = off + done;
            const int i = static_cast<int>(at / piece);
            const std::uint64_t in_piece = at - static_cast<std::uint64_t>(i) * piece;
            const auto n2 = static_cast<std::size_t>(std::min<std::uint64_t>(out.size() - done, piece - in_piece));
            decode_piece(i, in_piece, out.subspan(done, n2));
            done += n2;
          }
        };
        std::vector<std::string> used;
        for (const auto& st : stripes)
          for (const auto& p : st.data)
            if (p.node == n) {
              // The members the decoding can use: good pieces and good parity blocks.
              std::vector<int> from, parity;
              for (const auto& q : st.data)
                if (!stripe_piece_bad(l, spans, h.shards, q)) from.push_back(q.node);
              for (std::size_t bi = 0; bi < m.redundancy.size(); ++bi)
                if (m.redundancy[bi].stripe == st.index && h.blocks[bi].ok) parity.push_back(m.redundancy[bi].node);
              used.push_back("stripe " + std::to_string(st.index) + " (" + (from.empty() ? "" : "data of nodes " + join_ints(from) + ", ") +
                             "parity on nodes " + join_ints(parity) + ")");
            }
        for (int r = n * l.ranks_per_node; r < (n + 1) * l.ranks_per_node; ++r) {
          if (h.shards[static_cast<std::size_t>(r)].ok) continue;
          const ShardRecord& s = m.shards[static_cast<std::size_t>(r)];
          const std::uint64_t start = spans.start[static_cast<std::size_t>(r)];
          const auto [dir, file] = write_target(n, s.path);
          const auto got = write_file_from(
              fs, dir, file, s.size, [&](std::uint64_t off, std::span<std::byte> out) { node_data(start + off, out); }, chunk);
          check_rebuilt(got, join_path(dir, file), s.sha256, s.chunk_xxh3);
          rep.rebuilt_ranks.push_back(r);
          std::string from;
          for (const auto& u : used) from += (from.empty() ? "" : "; ") + u;
          rep.lines.push_back("rank " + std::to_string(r) + " (node-" + std::to_string(n) + "/" + name + "/" + s.path +
                              ") rebuilt from parity: " + from);
        }
        // Its data is whole again (the rebuilt files are checked against the manifest).
      }
      for (int r : rep.rebuilt_ranks) shard_ok[static_cast<std::size_t>(r)] = true;
      // Lost parity blocks: re-encoded from the data, now whole. The rebuilt shards are read
      // from where they were just written.
      std::map<int, std::string> rebuilt_path;
      for (int r : rep.rebuilt_ranks) {
        const int n = l.node_of(r);
        auto& t = targets[static_cast<std::size_t>(n)];
        const std::string& file = m.shards[static_cast<std::size_t>(r)].path;
        std::string p = join_path(t.dir, file);
        for (const auto& [tmp, fin] : t.renames)
          if (fin == file) p = join_path(t.dir, tmp);
        rebuilt_path[r] = p;
      }
      const auto any_bytes = [&](int node, std::uint64_t off, std::span<std::byte> out) {
        gather(l, spans, node, off, out, [&](int r, std::uint64_t at, std::span<std::byte> piece) {
          if (auto it = rebuilt_path.find(r); it != rebuilt_path.end()) file_reader(fs, it->second)(at, piece);
          else shard_bytes(r)(at, piece);
        });
      };
      std::vector<std::string> node_dirs;
      for (const auto& st : stripes) {
        std::vector<RedundancyBlock> fixed;
        std::vector<std::size_t> which;
        for (std::size_t i = 0; i < m.redundancy.size(); ++i)
          if (m.redundancy[i].stripe == st.index && !h.blocks[i].ok) fixed.push_back(m.redundancy[i]), which.push_back(i);
        if (fixed.empty()) continue;
        std::vector<std::string> dirs(static_cast<std::size_t>(l.nodes));
        std::vector<RedundancyBlock*> ptrs;
        for (auto& b : fixed) {
          const auto [dir, file] = write_target(b.node, b.path);
          dirs[static_cast<std::size_t>(b.node)] = dir;
          b.path = file;
          ptrs.push_back(&b);
        }
        write_parity(fs, dirs, code, st, ptrs, any_bytes, m.chunk_size);
        for (std::size_t j = 0; j < fixed.size(); ++j) {
          const auto& want = m.redundancy[which[j]];
          if (fixed[j].sha256 != want.sha256)
            throw Error(Errc::checksum_mismatch, h.blocks[which[j]].path, "SHA-256 of the re-encoded parity block", want.sha256, fixed[j].sha256);
          rep.lines.push_back("parity " + std::to_string(want.index) + " of stripe " + std::to_string(st.index) + " on node " +
                              std::to_string(want.node) + " re-encoded from the stripe's data");
        }
      }
    } else {
      // No redundancy: only the health check's verdict (lost) reaches here with bad shards.
    }
    // A node's bad manifest copy: the bytes most nodes hold (never re-encoded: a decode and
    // encode need not give the same bytes back), written beside it and renamed over it.
    for (const auto& mh : h.manifests) {
      auto& t = targets[static_cast<std::size_t>(mh.node)];
      if (mh.ok || t.fresh) continue;
      const auto [dir, file] = write_target(mh.node, std::string(kManifestName));
      detail::write_small_file(fs, join_path(dir, file), h.manifest_bytes);
      rep.lines.push_back("node " + std::to_string(mh.node) + ": " + std::string(kManifestName) + " restored as the copy the other nodes hold (it was: " +
                          mh.error + ")");
    }
    // Into place: files renamed over their names, recreated directories with the manifest.
    for (std::size_t n = 0; n < targets.size(); ++n) {
      auto& t = targets[n];
      for (const auto& [tmp, fin] : t.renames) fs.rename(join_path(t.dir, tmp), join_path(t.dir, fin));
      if (!t.renames.empty()) fs.sync_dir(t.dir);
      const bool recreated = t.fresh;
      if (t.fresh) {
        detail::write_small_file(fs, join_path(t.dir, kManifestName), h.manifest_bytes);
        fs.sync_dir(t.dir);
        fs.rename(t.dir, t.final_dir);
        fs.sync_dir(t.root);
        t.fresh = false;
      }
      if (!holds(static_cast<int>(n)) || !latest_lags(t.root)) continue;
      write_latest(fs, t.root, name);
      if (!recreated) rep.lines.push_back("node " + std::to_string(n) + ": latest moved forward to " + name);
    }
  } catch (...) {
    for (auto& t : targets) {
      try {
        if (t.fresh) fs.remove_all(t.dir);
        for (const auto& [tmp, fin] : t.renames) fs.remove_all(join_path(t.dir, tmp));
      } catch (...) {
      }
    }
    throw;
  }
  for (const auto& line : rep.lines) log_event(LogLevel::info, "node_repaired", name + ": " + line);
  return rep;
}

std::vector<RepairReport> repair_node_roots(FileSystem& fs, std::span<const std::string> roots) {
  std::vector<RepairReport> out;
  const auto latest = read_latest_nodes(fs, roots);
  if (!latest) return out;
  std::set<std::string> names;
  for (const auto& r : roots) {
    if (!fs.stat(r)) continue;
    for (const auto& e : fs.list_dir(r))
      if (e.type == EntryType::directory && parse_checkpoint_dir_name(e.name) && e.name <= *latest) names.insert(e.name);
  }
  for (const auto& name : names) {
    try {
      const auto h = check_node_checkpoint(fs, roots, name, Verify::none);
      if (h.healthy()) continue;
      auto rep = repair_node_checkpoint(fs, roots, name, Verify::none);
      if (!rep.nothing_to_do()) out.push_back(std::move(rep));
    } catch (const Error& e) {
      log_event(LogLevel::error, "node_repair_failed", name + " is not rebuilt: " + e.what());
    }
  }
  return out;
}

}  // namespace ckpt
