// SPDX-License-Identifier: Apache-2.0
#include "ckpt/format/boost_json.hpp"
#include "ckpt/ops/reshard.hpp"
#include "ckpt/read/slice_load.hpp"

#include <algorithm>
#include <boost/json.hpp>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/shard/shard_writer.hpp"

namespace ckpt {

namespace json = boost::json;
using detail::write_small_file;

namespace {

[[noreturn]] void bad_manifest(std::string_view file, std::string detail, std::string expected, std::string actual) {
  throw Error(Errc::malformed_manifest, std::string(file), std::move(detail), std::move(expected), std::move(actual));
}

bool contains(const std::vector<std::string>& v, std::string_view s) { return std::find(v.begin(), v.end(), s) != v.end(); }

// Rank 0's tensors in file order: the order every resharded shard keeps, so that a round
// trip N -> M -> N writes byte-identical shards.
std::vector<const TensorRecord*> rank0_tensors(const Manifest& m) {
  std::vector<const TensorRecord*> out;
  for (const auto& t : m.tensors)
    if (t.rank == 0) out.push_back(&t);
  std::stable_sort(out.begin(), out.end(), [](const TensorRecord* a, const TensorRecord* b) { return a->begin < b->begin; });
  return out;
}


std::string base_name(const std::string& path) {
  std::filesystem::path p(path);
  if (!p.has_filename()) p = p.parent_path();
  return p.filename().string();
}

void require_dir(FileSystem& fs, const std::string& dir, std::string_view what) {
  const auto st = fs.stat(dir);
  if (!st) throw Error(Errc::not_found, dir, std::string(what) + " does not exist");
  if (st->type != EntryType::directory) throw Error(Errc::invalid_argument, dir, std::string(what) + " is not a directory");
}

}  // namespace

// ---- layout ---------------------------------------------------------------------------

void verify_headers(const CheckpointReader& checkpoint, Verify mode, int first_rank, int rank_stride) {
  if (rank_stride < 1) throw_invalid("verify_headers: rank_stride must be >= 1");
  for (int r = first_rank; r < checkpoint.manifest().world_size; r += rank_stride)
    for (const ShardRecord& f : checkpoint.manifest().files_of(r)) {
      if (mode == Verify::full) {
        checkpoint.verify_file(f, Verify::full);
        continue;
      }
      if (mode == Verify::fast) {
        // The header's chunks are checked first, so a flipped header byte is reported as the
        // checksum mismatch it is, not as whatever the damaged JSON happens to say.
        ShardRangeReader shard(checkpoint, f, Verify::fast);
        std::byte prefix[8] = {};
        if (f.size >= 8) shard.read(0, prefix);
        const std::uint64_t data_start = parse_shard_prefix(std::span(prefix, f.size >= 8 ? 8 : 0), f.size, checkpoint.file_path(f));
        std::vector<std::byte> head(static_cast<std::size_t>(data_start));
        shard.read(0, head);
      }
      checkpoint.verify_file(f, Verify::none);
    }
}

std::optional<Verify> resharded_source_verify(const Manifest& m, std::string_view file) {
  const json::value* from = json_of(m.training).if_contains("resharded_from");
  if (!from || !from->is_object()) return std::nullopt;
  const json::value* v = from->as_object().if_contains("source_verify");
  if (!v) return std::nullopt;
  const auto mode = v->is_string() ? parse_verify(v->as_string()) : std::nullopt;
  if (!mode) bad_manifest(file, "training.resharded_from.source_verify", "\"none\", \"fast\" or \"full\"", json::serialize(*v).substr(0, 64));
  return mode;
}

namespace {
// How the bytes read from `source` with `mode` were checked since a job saved them: `mode`,
// or the source's recorded source_verify when that is weaker. `what` (reshard, consolidate)
// logs a read with Verify::none, the one that copies bytes unchecked.
Verify checked_since_saved(const CheckpointReader& source, Verify mode, std::string_view what) {
  if (mode == Verify::none)
    log_event(LogLevel::warn, "verify_none", source.dir() + ": " + std::string(what) +
             " with verify none: the source's checksums are not checked, so damage in it is copied as it is; the output records "
             "source_verify \"none\"");
  const auto recorded = resharded_source_verify(source.manifest(), source.manifest_path());
  return recorded ? std::min(mode, *recorded) : mode;
}
}  // namespace

// ---- FlatReader -----------------------------------------------------------------------

FlatReader::FlatReader(const CheckpointReader& checkpoint, FlatLayout layout, Verify mode)
    : checkpoint_(&checkpoint), layout_(std::move(layout)), mode_(mode) {
  const Manifest& m = checkpoint.manifest();
  const std::string file = checkpoint.manifest_path();
  if (layout_.num_params > m.param_numel)
    bad_manifest(file, "num_params", "at most param_numel " + std::to_string(m.param_numel), std::to_string(layout_.num_params));
  for (int r = 0; r < m.world_size; ++r) by_offset_.push_back(r);
  std::stable_sort(by_offset_.begin(), by_offset_.end(), [&](int a, int b) {
    return m.rank_record(a).param_shard_offset < m.rank_record(b).param_shard_offset;
  });
  // The shards must partition the flat space exactly, or a slice would read a hole or one
  // element twice.
  std::uint64_t expect = 0;
  for (int r : by_offset_) {
    const ShardRecord& s = m.rank_record(r);
    if (s.param_shard_offset != expect)
      bad_manifest(file, "shards[" + std::to_string(r) + "].param_shard_offset", std::to_string(expect) + " (shards tile the flat space)",
                   std::to_string(s.param_shard_offset));
    expect += s.param_shard_numel;
  }
  if (expect != m.param_numel)
    bad_manifest(file, "sum of param_shard_numel", "param_numel " + std::to_string(m.param_numel), std::to_string(expect));
  for (const auto& name : layout_.tensors) {
    std::optional<DType> type;
    for (int r = 0; r < m.world_size; ++r) {
      const TensorRecord* t = m.find_tensor(name, r);
      const std::string where = "flat tensor '" + name + "' of rank " + std::to_string(r);
      const std::uint64_t numel = m.rank_record(r).param_shard_numel;
      if (!t) bad_manifest(file, where, "present", "absent");
      if (t->shape != std::vector<std::uint64_t>{numel})
        bad_manifest(file, where + " shape", "[" + std::to_string(numel) + "] (param_shard_numel)",
                     std::to_string(t->shape.size()) + "-d tensor");
      if (type && *type != t->dtype) bad_manifest(file, where + " dtype", std::string(dtype_name(*type)), std::string(dtype_name(t->dtype)));
      type = t->dtype;
    }
    dtypes_.push_back(type.value_or(DType::F32));
  }
}

DType FlatReader::dtype(std::string_view name) const {
  for (std::size_t i = 0; i < layout_.tensors.size(); ++i)
    if (layout_.tensors[i] == name) return dtypes_[i];
  throw Error(Errc::not_found, checkpoint_->manifest_path(), "no flat tensor '" + std::string(name) + "'");
}

ShardRangeReader& FlatReader::shard(const ShardRecord& file) {
  // One source file open at a time: a slice runs through the sources in offset order, so
  // this keeps memory at one chunk however many ranks wrote the checkpoint.
  if (!current_ || current_file_ != &file) {
    if (current_) closed_bytes_ += current_->bytes_read();
    current_.reset();
    current_.emplace(*checkpoint_, file, mode_);
    current_file_ = &file;
  }
  return *current_;
}

std::uint64_t FlatReader::bytes_read() const noexcept { return closed_bytes_ + (current_ ? current_->bytes_read() : 0); }

std::vector<FlatReader::Piece> FlatReader::pieces(std::string_view name, std::uint64_t first, std::uint64_t count,
                                                  std::uint64_t& padding_from) const {
  (void)dtype(name);  // Errc::not_found unless a flat tensor
  std::uint64_t end;
  if (__builtin_add_overflow(first, count, &end)) throw_invalid("flat range overflows");
  const Manifest& m = checkpoint_->manifest();
  const std::uint64_t real_end = std::min(end, layout_.num_params);
  std::vector<Piece> out;
  // First source shard whose range ends after `first`.
  auto it = std::partition_point(by_offset_.begin(), by_offset_.end(), [&](int r) {
    return m.rank_record(r).param_shard_offset + m.rank_record(r).param_shard_numel <= first;
  });
  for (std::uint64_t pos = first; pos < real_end && it != by_offset_.end(); ++it) {
    const ShardRecord& s = m.rank_record(*it);
    const std::uint64_t lo = std::max(pos, s.param_shard_offset), hi = std::min(real_end, s.param_shard_offset + s.param_shard_numel);
    if (lo >= hi) continue;
    out.push_back({*it, lo - s.param_shard_offset, hi - lo, lo - first});
    pos = hi;
  }
  // Padding is zero by definition: it is never read (a source may pad less than the target).
  padding_from = std::max(first, std::min(end, layout_.num_params)) - first;
  return out;
}

void FlatReader::read(std::string_view name, std::uint64_t first, std::span<std::byte> out) {
  const DType type = dtype(name);
  const std::uint64_t es = dtype_size(type);
  if (out.size() % es != 0)
    throw Error(Errc::invalid_argument, checkpoint_->manifest_path(), "read of flat tensor '" + std::string(name) + "'",
                "a multiple of " + std::to_string(es) + " bytes", std::to_string(out.size()) + " bytes");
  const std::uint64_t count = out.size() / es;
  std::uint64_t padding_from = 0;
  for (const Piece& p : pieces(name, first, count, padding_from)) {
    const TensorRecord* t = checkpoint_->manifest().find_tensor(name, p.rank);
    shard(checkpoint_->manifest().file_of(*t)).read(t->begin + p.source_first * es,
                       out.subspan(static_cast<std::size_t>(p.out_first * es), static_cast<std::size_t>(p.count * es)));
  }
  if (padding_from < count)
    std::memset(out.data() + padding_from * es, 0, static_cast<std::size_t>((count - padding_from) * es));
}

// ---- per-rank metadata ----------------------------------------------------------------

std::vector<JsonObject> remap_rank_metadata(const Manifest& src, int world) {
  if (world < 1) throw_invalid("world size must be >= 1, got " + std::to_string(world));
  std::vector<std::string> keys;
  // A rank's metadata is its first file's (part 0).
  for (const auto& s : src.shards)
    for (const auto& kv : json_of(s.metadata))
      if (!contains(keys, kv.key())) keys.emplace_back(kv.key());
  std::set<std::string> local;
  if (const json::value* rl = json_of(src.training).if_contains("rank_local_metadata"); rl && rl->is_array())
    for (const auto& v : rl->as_array())
      if (v.is_string()) local.emplace(v.as_string());
  for (const auto& k : keys) {
    const json::value* v0 = json_of(src.rank_record(0).metadata).if_contains(k);
    for (const auto& s : src.shards) {
      if (s.part != 0) continue;
      const json::value* v = json_of(s.metadata).if_contains(k);
      if (!v0 || !v || *v != *v0) local.insert(k);
    }
  }
  std::vector<JsonObject> out(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    json::object& o = json_of(out[static_cast<std::size_t>(r)]);
    for (const auto& k : keys) {
      if (!local.count(k)) {
        o[k] = json_of(src.rank_record(0).metadata).at(k);
      } else if (r < src.world_size) {
        if (const json::value* v = json_of(src.rank_record(r).metadata).if_contains(k)) o[k] = *v;
      }
    }
  }
  return out;
}

// ---- reshard --------------------------------------------------------------------------

ReshardResult reshard_checkpoint(FileSystem& fs, const CheckpointReader& source, const std::string& dst_root,
                                 const ReshardOptions& opt) {
  const Manifest& src = source.manifest();
  const std::string src_file = source.manifest_path();
  if (opt.world_size < 1 || opt.world_size > (1 << 20))
    throw Error(Errc::invalid_argument, dst_root, "target world size", "1.." + std::to_string(1 << 20), std::to_string(opt.world_size));
  if (opt.buffer_bytes < kMinReshardBuffer)
    throw Error(Errc::invalid_argument, dst_root, "buffer size", "at least " + std::to_string(kMinReshardBuffer) + " bytes",
                std::to_string(opt.buffer_bytes) + " bytes");
  const int world = opt.world_size;
  // A tensor-parallel checkpoint (training.parallel.tensor = T) resumes only at a world made
  // of whole groups of T ranks; its layout's data degree follows the new world size.
  std::optional<json::object> parallel;
  if (const json::value* p = json_of(src.training).if_contains("parallel"); p && p->is_object()) {
    parallel = p->as_object();
    if (const json::value* t = parallel->if_contains("tensor"); t && t->is_int64() && t->as_int64() > 0) {
      if (world % t->as_int64() != 0)
        throw Error(Errc::invalid_argument, dst_root, "target world size for a tensor-parallel checkpoint (training.parallel.tensor = " +
                    std::to_string(t->as_int64()) + ")", "a multiple of " + std::to_string(t->as_int64()), std::to_string(world));
      (*parallel)["data"] = world / t->as_int64();
    }
  }
  // The plan: every target rank's tensors, each with where its bytes come from.
  struct Planned {
    TensorSpec spec;
    std::optional<TensorSharding> sharding;
    bool flat = false;                       // a slice of a flat tensor (trainer checkpoints)
    const TensorRecord* copy = nullptr;      // a stored tensor, copied as it is
    const GlobalTensor* global = nullptr;    // a box of a global tensor, at `offsets`
    std::vector<std::uint64_t> offsets;
  };
  struct PlannedRank {
    std::vector<Planned> tensors;
    std::uint64_t param_offset = 0, param_numel = 0;
  };
  std::vector<PlannedRank> plan(static_cast<std::size_t>(world));
  std::optional<FlatReader> flat;
  std::vector<GlobalTensor> globals;
  std::uint64_t target_param_numel = src.param_numel;
  json::object training = json_of(src.training);
  const Verify piece_mode = opt.verify == Verify::none ? Verify::none : Verify::fast;
  if (opt.layout || src.training.contains("flat_tensors")) {
    // A trainer checkpoint: the flat ZeRO space re-sliced with ZeRO's padding, rank 0's other
    // tensors copied to the new rank 0.
    const FlatLayout layout = opt.layout ? *opt.layout : flat_layout(src, src_file);
    flat.emplace(source, layout, opt.verify);
    for (const auto& t : src.tensors)
      if (t.rank != 0 && !contains(layout.tensors, t.name))
        throw Error(Errc::invalid_argument, src_file,
                    "tensor '" + t.name + "' of rank " + std::to_string(t.rank) +
                        " is neither flat (training.flat_tensors) nor replicated on rank 0: it has no place at another world size");
    const auto order = rank0_tensors(src);
    target_param_numel = padded_numel(layout.num_params, world);
    for (int r = 0; r < world; ++r) {
      PlannedRank& pr = plan[static_cast<std::size_t>(r)];
      const dist::ShardRange slice = flat_slice(layout.num_params, world, r);
      pr.param_offset = slice.offset;
      pr.param_numel = slice.numel;
      for (const TensorRecord* t : order) {
        if (contains(layout.tensors, t->name)) {
          Planned p{{t->name, t->dtype, {slice.numel}}, slice_of(t->name, {target_param_numel}, {slice.offset}, {slice.numel}), true, nullptr, nullptr, {}};
          pr.tensors.push_back(std::move(p));
        } else if (r == 0) {
          std::optional<TensorSharding> keep;
          if (t->sharding && t->sharding->kind == TensorSharding::Kind::rank_local) keep = t->sharding;
          pr.tensors.push_back({{t->name, t->dtype, t->shape}, keep, false, t, nullptr, {}});
        }
      }
    }
    json::array names;
    for (const auto& n : layout.tensors) names.emplace_back(n);
    training["flat_tensors"] = std::move(names);
    training["num_params"] = layout.num_params;
  } else {
    // Any other checkpoint: every global tensor re-split over the new ranks along the first
    // dimension it was split on (dimension 0 for one stored whole), replicated tensors kept
    // replicated, rank-local and per-rank tensors kept on their rank while it exists.
    globals = global_tensors(src, src_file);
    std::set<const TensorRecord*> in_globals;
    for (const GlobalTensor& g : globals) {
      for (const auto& p : g.pieces) in_globals.insert(p.record);
      if (g.origin == GlobalTensor::Origin::replicated) {
        const TensorRecord* rec = g.pieces.front().record;
        std::vector<int> holders;
        if (rec->sharding->holders.size() == static_cast<std::size_t>(src.world_size)) {
          for (int r = 0; r < world; ++r) holders.push_back(r);
        } else {
          for (int h : rec->sharding->holders)
            if (h < world) holders.push_back(h);
          if (holders.empty()) holders.push_back(0);
        }
        plan[static_cast<std::size_t>(holders.front())].tensors.push_back(
            {{rec->name, rec->dtype, rec->shape}, replicated(holders), false, rec, nullptr, {}});
        continue;
      }
      if (g.origin == GlobalTensor::Origin::single || g.shape.empty()) {
        const TensorRecord* rec = g.pieces.front().record;
        const int to = rec->rank < world ? rec->rank : 0;
        plan[static_cast<std::size_t>(to)].tensors.push_back({{rec->name, rec->dtype, rec->shape}, rec->sharding, false, rec, nullptr, {}});
        continue;
      }
      const auto dims = g.split_dims();
      const std::size_t d = dims.empty() ? 0 : dims.front();
      const std::string& name = g.pieces.front().record->name;
      for (int r = 0; r < world; ++r) {
        const SplitRange part = split_range(g.shape[d], r, world);
        std::vector<std::uint64_t> offsets(g.shape.size(), 0), lengths = g.shape;
        offsets[d] = part.first;
        lengths[d] = part.count;
        plan[static_cast<std::size_t>(r)].tensors.push_back(
            {{name, g.dtype, lengths}, slice_of(g.name, g.shape, offsets, lengths), false, nullptr, &g, offsets});
      }
    }
    for (const auto& t : src.tensors) {
      if (in_globals.count(&t)) continue;
      if (!t.sharding)  // one name on several ranks, saying nothing of what it is
        throw Error(Errc::invalid_argument, src_file,
                    "tensor '" + t.name + "' of rank " + std::to_string(t.rank) +
                        " has its name on several ranks and no sharding description (slice, replicated or rank_local): it has no "
                        "place at another world size",
                    "a sharding description, or training.flat_tensors", "none");
      if (t.rank < world)  // rank-local: stays with its rank while it exists
        plan[static_cast<std::size_t>(t.rank)].tensors.push_back({{t.name, t.dtype, t.shape}, t.sharding, false, &t, nullptr, {}});
    }
    for (int r = 0; r < world; ++r)
      if (src.param_numel > 0) {
        const SplitRange part = split_range(src.param_numel, r, world);
        plan[static_cast<std::size_t>(r)].param_offset = part.first;
        plan[static_cast<std::size_t>(r)].param_numel = part.count;
      }
  }
  verify_headers(source, opt.verify);

  // Every target shard is planned before a byte is written: the progress total, and the
  // manifest's sizes, are known up front.
  std::vector<std::vector<TensorSpec>> specs(static_cast<std::size_t>(world));
  std::vector<std::map<std::string, std::string>> header_meta(static_cast<std::size_t>(world));
  std::uint64_t total = 0;
  for (int r = 0; r < world; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    for (const Planned& p : plan[ri].tensors) specs[ri].push_back(p.spec);
    // The header metadata every ckpt writer puts in a shard.
    header_meta[ri] = shard_header_metadata(r, world, src.step);
    total += plan_shard_specs(specs[ri], header_meta[ri]).file_size();
  }
  const auto metadata = remap_rank_metadata(src, world);
  const Verify checked = checked_since_saved(source, opt.verify, "reshard");
  training["resharded_from"] =
      json::object{{"world_size", src.world_size}, {"param_numel", src.param_numel}, {"source_verify", verify_name(checked)}};
  if (parallel) training["parallel"] = std::move(*parallel);

  const bool created_root = !fs.stat(dst_root);
  if (created_root) require_dir(fs, parent_dir(dst_root), "the parent of the destination root");
  else require_dir(fs, dst_root, "the destination root");
  ReshardResult result;
  result.source_verify = checked;
  std::string temp;
  std::optional<RootLock> lock;
  try {
    // One writer per root: a job saving to DST, a prune or another reshard holds its lock,
    // and this fails with Errc::busy before anything is touched.
    lock.emplace(fs, dst_root);
    // Committing moves DST's `latest` to this step: over a newer checkpoint that would demote
    // it to "never committed" (begin_checkpoint replaces such steps), so that is refused.
    if (const auto latest = created_root ? std::optional<std::string>() : read_latest(fs, dst_root))
      if (const auto live = parse_checkpoint_dir_name(*latest); live && *live > src.step)
        throw Error(Errc::invalid_argument, dst_root,
                    "the destination's latest names a newer checkpoint: reshard into another root",
                    "latest at or before step " + std::to_string(src.step), *latest);
    prepare_root(fs, *lock);
    temp = begin_checkpoint(fs, dst_root, src.step);
    AlignedBuffer buffer(static_cast<std::size_t>(opt.buffer_bytes));
    std::optional<ShardRangeReader> copier;  // stored tensors copied as they are, one source file at a time
    const ShardRecord* copier_file = nullptr;
    std::uint64_t written = 0, copied_bytes = 0, global_bytes = 0;
    std::vector<ShardReport> reports;
    auto report = [&](std::uint64_t n) {
      written += n;
      if (opt.progress) opt.progress(written, total);
    };
    for (int r = 0; r < world; ++r) {
      const PlannedRank& pr = plan[static_cast<std::size_t>(r)];
      ShardWriter writer = ShardWriter::stream(fs, temp, shard_file_name(r, world), specs[static_cast<std::size_t>(r)],
                                               header_meta[static_cast<std::size_t>(r)], {.chunk_size = src.chunk_size});
      report(writer.header().data_start);
      for (const auto& t : writer.header().tensors) {
        const Planned& p = *std::find_if(pr.tensors.begin(), pr.tensors.end(), [&](const Planned& q) { return q.spec.name == t.name; });
        const std::uint64_t bytes = t.end - t.begin, es = dtype_size(t.dtype);
        const std::uint64_t per_piece = std::max<std::uint64_t>(1, opt.buffer_bytes / es);
        for (std::uint64_t done = 0; done < bytes / es;) {
          const std::uint64_t n = std::min(per_piece, bytes / es - done);
          const auto piece = buffer.span(static_cast<std::size_t>(n * es));
          if (p.flat) {
            flat->read(t.name, pr.param_offset + done, piece);
          } else if (p.global) {
            // Elements [done, done + n) of the target box, as boxes of the global tensor.
            std::vector<SliceTarget> targets;
            std::uint64_t at = 0;
            for (auto& b : boxes_of_range(p.spec.shape, done, n)) {
              for (std::size_t d = 0; d < b.offsets.size(); ++d) b.offsets[d] += p.offsets[d];
              const std::uint64_t nb = shape_numel(b.lengths) * es;
              targets.push_back({p.global->name, p.global->dtype, std::move(b.offsets), std::move(b.lengths),
                                 piece.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(nb))});
              at += nb;
            }
            global_bytes += load_slices(source, globals, targets, piece_mode).bytes_read;
          } else {
            const ShardRecord& from = source.manifest().file_of(*p.copy);
            if (!copier || copier_file != &from) {
              if (copier) copied_bytes += copier->bytes_read();
              copier.emplace(source, from, opt.verify);
              copier_file = &from;
            }
            copier->read(p.copy->begin + done * es, piece);
          }
          writer.write(piece);
          report(piece.size());
          done += n;
        }
      }
      ShardReport w = writer.finish(r);
      for (auto& rec : w.tensors) {
        const auto it = std::find_if(pr.tensors.begin(), pr.tensors.end(), [&](const Planned& q) { return q.spec.name == rec.name; });
        if (it != pr.tensors.end()) rec.sharding = it->sharding;
      }
      w.shard.param_shard_offset = pr.param_offset;
      w.shard.param_shard_numel = pr.param_numel;
      w.shard.metadata = metadata[static_cast<std::size_t>(r)];
      result.bytes_written += w.shard.size;
      if (r == 0) {
        w.param_numel = target_param_numel;
        w.wall_clock_seconds = src.wall_clock_seconds;
        w.training = to_json_object(std::move(training));
      }
      reports.push_back(std::move(w));
    }
    if (copier) copied_bytes += copier->bytes_read();
    result.manifest = assemble_manifest(src.step, src.chunk_size, std::move(reports));
    result.dir = commit_checkpoint(fs, dst_root, temp, result.manifest);
    result.bytes_read = (flat ? flat->bytes_read() : 0) + copied_bytes + global_bytes;
  } catch (...) {
    if (!temp.empty()) abort_checkpoint(fs, dst_root, temp);
    if (created_root && lock) {  // without the lock, DST may be another writer's by now
      try {
        fs.remove_all(dst_root);
        fs.sync_dir(parent_dir(dst_root));
      } catch (...) {
        // The error that brought us here is the one to report.
      }
    }
    throw;
  }
  return result;
}

// ---- consolidate ----------------------------------------------------------------------

bool is_optimizer_state(std::string_view name) noexcept { return name.starts_with("optim.") || name.starts_with("optimizer."); }

namespace {


// Removes what killed consolidates into PARENT/out_name left: their temporaries, when made on
// this host by a process that no longer exists.
void remove_abandoned_outputs(FileSystem& fs, const std::string& parent, const std::string& out_name) {
  bool removed = false;
  for (const auto& e : fs.list_dir(parent)) {
    if (!is_abandoned_temporary(e.name, out_name)) continue;
    log_event(LogLevel::info, "leftover_removed", join_path(parent, out_name) + ": removing " + e.name + ", left by a consolidate that is gone");
    fs.remove_all(join_path(parent, e.name));
    removed = true;
  }
  if (removed) fs.sync_dir(parent);
}

}  // namespace

ConsolidateResult consolidate_checkpoint(FileSystem& fs, const CheckpointReader& source, const std::string& out_dir,
                                         const ConsolidateOptions& opt) {
  const Manifest& src = source.manifest();
  const std::string src_file = source.manifest_path();
  if (opt.buffer_bytes < kMinReshardBuffer)
    throw Error(Errc::invalid_argument, out_dir, "buffer size", "at least " + std::to_string(kMinReshardBuffer) + " bytes",
                std::to_string(opt.buffer_bytes) + " bytes");
  if (opt.dtype && *opt.dtype != DType::F32 && *opt.dtype != DType::F16 && *opt.dtype != DType::BF16)
    throw Error(Errc::invalid_argument, out_dir, "output dtype", "F32, F16 or BF16", std::string(dtype_name(*opt.dtype)));
  // What is exported: a trainer checkpoint's model tensors, cut out of the flat tensor
  // opt.tensor by training.param_layout; any other checkpoint's global tensors
  // (slice_load.hpp: sliced, replicated, single and flat ones), each under its global name.
  // Optimizer state (the trainer's other flat tensors; global tensors named "optim.*") is
  // left out, or, with opt.with_optimizer, written into files of its own.
  struct Export {
    std::string name;
    std::vector<std::uint64_t> shape;
    std::uint64_t numel = 0;
    DType in_type = DType::F32, out_type = DType::F32;
    std::string flat_tensor;                 // flat path: the flat tensor it is cut out of
    std::uint64_t flat_offset = 0;           //   and where it lies in it
    const GlobalTensor* global = nullptr;    // global path
  };
  std::vector<Export> weights, optimizer;
  std::optional<FlatReader> flat;
  std::vector<GlobalTensor> globals;
  const auto out_of = [&](DType in) { return dtype_is_float(in) ? opt.dtype.value_or(in == DType::F64 ? DType::F32 : in) : in; };
  std::size_t left_out = 0;
  if (src.training.contains("flat_tensors")) {
    const FlatLayout layout = flat_layout(src, src_file);
    if (!contains(layout.tensors, opt.tensor))
      throw Error(Errc::not_found, src_file, "no flat tensor '" + opt.tensor + "' to consolidate", "one of training.flat_tensors",
                  "'" + opt.tensor + "'");
    flat.emplace(source, layout, opt.verify);
    const DType in_type = flat->dtype(opt.tensor);
    if (!dtype_is_float(in_type))
      throw Error(Errc::invalid_argument, src_file, "flat tensor '" + opt.tensor + "' dtype", "a float type",
                  std::string(dtype_name(in_type)));
    const std::vector<ParamSlice> params = param_layout(src, layout, opt.tensor, src_file);
    for (const ParamSlice& p : params) weights.push_back({p.name, p.shape, p.numel, in_type, out_of(in_type), opt.tensor, p.offset, nullptr});
    // The other flat tensors (the optimizer's moments), per model tensor, in their own dtype.
    for (const std::string& t : layout.tensors) {
      if (t == opt.tensor) continue;
      if (!opt.with_optimizer) {
        left_out += params.size();
        continue;
      }
      const DType type = flat->dtype(t);
      for (const ParamSlice& p : params) optimizer.push_back({t + "." + p.name, p.shape, p.numel, type, type, t, p.offset, nullptr});
    }
  } else {
    globals = global_tensors(src, src_file);
    for (const GlobalTensor& g : globals) {
      const bool is_optimizer = is_optimizer_state(g.name);
      if (is_optimizer && !opt.with_optimizer) {
        ++left_out;
        continue;
      }
      (is_optimizer ? optimizer : weights)
          .push_back({g.name, g.shape, shape_numel(g.shape), g.dtype, is_optimizer ? g.dtype : out_of(g.dtype), {}, 0, &g});
    }
  }
  if (weights.empty() && optimizer.empty())
    throw Error(Errc::not_found, src_file,
                left_out ? "no weight tensor to consolidate (only optimizer state, left out without --with-optimizer)"
                         : "no global tensor to consolidate (every tensor is rank-local, or per-rank without a sharding description)",
                "at least one", "none");
  verify_headers(source, opt.verify);
  // With full, verify_headers checked every file's SHA-256: the pieces are then read chunk-checked.
  const Verify piece_mode = opt.verify == Verify::none ? Verify::none : Verify::fast;
  const Verify checked = checked_since_saved(source, opt.verify, "consolidate");
  const std::map<std::string, std::string> file_metadata{{"format", "pt"}, {"ckpt.source_verify", std::string(verify_name(checked))}};

  // One set of files per kind ("model", "optimizer"): filled in export order; a new file
  // starts when the next tensor would pass the limit (a tensor larger than the limit gets a
  // file of its own), as Hugging Face shards; an index when a set has several files.
  struct Set {
    std::string prefix;
    const std::vector<Export>* exports;
    std::vector<std::vector<TensorSpec>> specs;
    std::uint64_t total_size = 0;
    std::string file_name(std::size_t k) const {
      if (specs.size() == 1) return prefix + ".safetensors";
      char buf[64];
      std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", k + 1, specs.size());
      return prefix + buf;
    }
  };
  std::vector<Set> sets;
  std::uint64_t progress_total = 0;
  for (const auto& [prefix, exports] : {std::pair{"model", &weights}, std::pair{"optimizer", &optimizer}}) {
    if (exports->empty()) continue;
    Set set{prefix, exports, std::vector<std::vector<TensorSpec>>(1), 0};
    std::uint64_t in_file = 0;
    for (const Export& e : *exports) {
      const std::uint64_t bytes = e.numel * dtype_size(e.out_type);
      if (opt.max_file_size && !set.specs.back().empty() && in_file + bytes > opt.max_file_size) set.specs.emplace_back(), in_file = 0;
      set.specs.back().push_back({e.name, e.out_type, e.shape});
      in_file += bytes;
      set.total_size += bytes;
    }
    for (const auto& f : set.specs) progress_total += plan_shard_specs(f).data_size;
    sets.push_back(std::move(set));
  }
  ConsolidateResult result;
  result.dir = out_dir;
  result.dtype = weights.empty() ? opt.dtype.value_or(DType::F32) : weights.front().out_type;
  for (const Set& set : sets) (set.exports == &weights ? result.total_size : result.optimizer_size) = set.total_size;
  result.left_out = left_out;
  result.source_verify = checked;

  const std::string parent = parent_dir(out_dir);
  require_dir(fs, parent, "the parent of the output directory");
  // Leftovers of killed consolidates into OUT are removed first: only those made on this host
  // by a process that is gone (is_abandoned_temporary), never a live one's.
  const std::string out_name = base_name(out_dir);
  remove_abandoned_outputs(fs, parent, out_name);
  if (fs.stat(out_dir)) throw Error(Errc::invalid_argument, out_dir, "output directory already exists", "absent", "present");
  const std::string temp = join_path(parent, host_temporary_name(out_name));
  bool renamed = false;
  try {
    fs.create_dir(temp);
    // Source and converted elements share the buffer: [source piece | output piece].
    AlignedBuffer buffer(static_cast<std::size_t>(opt.buffer_bytes));
    std::uint64_t written = 0, global_bytes_read = 0;
    for (const Set& set : sets) {
      std::vector<ConsolidatedFile> files;
      for (std::size_t k = 0; k < set.specs.size(); ++k) {
        ShardWriter writer = ShardWriter::stream(fs, temp, set.file_name(k), set.specs[k], file_metadata,
                                                 {.chunk_size = src.chunk_size, .sha256 = false});
        ConsolidatedFile cf;
        cf.name = set.file_name(k);
        for (const auto& t : writer.header().tensors) {
          const Export& p = *std::find_if(set.exports->begin(), set.exports->end(), [&](const Export& e) { return e.name == t.name; });
          cf.tensors.push_back(p.name);
          const std::uint64_t in_es = dtype_size(p.in_type), out_es = dtype_size(p.out_type);
          const std::uint64_t per_piece = opt.buffer_bytes / (in_es + (p.in_type == p.out_type ? 0 : out_es));
          for (std::uint64_t done = 0; done < p.numel;) {
            const std::uint64_t n = std::min(per_piece, p.numel - done);
            const auto in = buffer.span(static_cast<std::size_t>(n * in_es));
            if (p.global) {
              // Elements [done, done + n) of the global tensor, as a few boxes, back to back.
              std::vector<SliceTarget> targets;
              std::uint64_t at = 0;
              for (auto& b : boxes_of_range(p.shape, done, n)) {
                const std::uint64_t bytes = shape_numel(b.lengths) * in_es;
                targets.push_back({p.name, p.in_type, std::move(b.offsets), std::move(b.lengths),
                                   in.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(bytes))});
                at += bytes;
              }
              global_bytes_read += load_slices(source, globals, targets, piece_mode).bytes_read;
            } else {
              flat->read(p.flat_tensor, p.flat_offset + done, in);
            }
            std::span<const std::byte> piece = in;
            if (p.in_type != p.out_type) {
              std::byte* o = buffer.data() + n * in_es;
              convert_floats(p.in_type, in, p.out_type, std::span<std::byte>(o, static_cast<std::size_t>(n * out_es)));
              piece = std::span<const std::byte>(o, static_cast<std::size_t>(n * out_es));
            }
            writer.write(piece);
            written += piece.size();
            if (opt.progress) opt.progress(written, progress_total);
            done += n;
          }
        }
        cf.size = writer.finish(0).shard.size;
        files.push_back(std::move(cf));
      }
      std::optional<std::string> index;
      if (files.size() > 1) {
        json::object weight_map;
        std::vector<std::pair<std::string, std::string>> entries;
        for (const auto& f : files)
          for (const auto& t : f.tensors) entries.emplace_back(t, f.name);
        std::sort(entries.begin(), entries.end());
        for (const auto& [t, f] : entries) weight_map[t] = f;
        const std::string text =
            json::serialize(json::object{{"metadata", {{"total_size", set.total_size}}}, {"weight_map", std::move(weight_map)}}) + "\n";
        index = set.prefix + ".safetensors.index.json";
        write_small_file(fs, join_path(temp, *index), text);
      }
      if (set.exports == &weights) {
        result.files = std::move(files);
        result.index = std::move(index);
      } else {
        result.optimizer_files = std::move(files);
        result.optimizer_index = std::move(index);
      }
    }
    result.bytes_read = global_bytes_read;
    // The model's configuration, when the training metadata carries one (the trainer's).
    if (const auto* cfg = json_of(src.training).if_contains("config"); cfg && cfg->is_object()) {
      result.config = "config.json";
      write_small_file(fs, join_path(temp, *result.config), json::serialize(*cfg) + "\n");
    }
    fs.sync_dir(temp);
    fs.rename(temp, out_dir);
    renamed = true;
    fs.sync_dir(parent);
  } catch (...) {
    try {
      fs.remove_all(renamed ? out_dir : temp);
      fs.sync_dir(parent);
    } catch (...) {
      // The error that brought us here is the one to report.
    }
    throw;
  }
  if (flat) result.bytes_read = flat->bytes_read();
  return result;
}

}  // namespace ckpt
