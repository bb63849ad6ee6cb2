#include "ckpt/io/reshard.hpp"

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
#include "ckpt/io/commit.hpp"
#include "ckpt/io/layout.hpp"
#include "ckpt/io/shard_writer.hpp"

namespace ckpt {

namespace json = boost::json;

namespace {

[[noreturn]] void bad_manifest(std::string_view file, std::string detail, std::string expected, std::string actual) {
  throw Error(Errc::malformed_manifest, std::string(file), std::move(detail), std::move(expected), std::move(actual));
}

std::uint64_t json_u64(const json::value& v, std::string_view file, const std::string& field) {
  if (v.is_uint64()) return v.as_uint64();
  if (v.is_int64() && v.as_int64() >= 0) return static_cast<std::uint64_t>(v.as_int64());
  bad_manifest(file, field, "a non-negative integer", json::serialize(v).substr(0, 64));
}

std::string manifest_path(const CheckpointReader& r) { return join_path(r.dir(), kManifestName); }

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

// The directory that holds `path` (for "out" relative to the working directory, ".").
std::string parent_of(const std::string& path) {
  std::filesystem::path p(path);
  if (!p.has_filename()) p = p.parent_path();  // "a/b/" names "a/b"
  const auto parent = p.parent_path();
  return parent.empty() ? std::string(".") : parent.string();
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

float load_as_f32(DType t, const std::byte* p) noexcept {
  switch (t) {
    case DType::F16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return f16_to_f32(h);
    }
    case DType::BF16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    case DType::F64: {
      double d;
      std::memcpy(&d, p, 8);
      return static_cast<float>(d);
    }
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

void store_from_f32(DType t, float f, std::byte* p) noexcept {
  if (t == DType::F16) {
    const std::uint16_t h = f32_to_f16(f);
    std::memcpy(p, &h, 2);
  } else if (t == DType::BF16) {
    const std::uint16_t h = f32_to_bf16(f);
    std::memcpy(p, &h, 2);
  } else {
    std::memcpy(p, &f, 4);
  }
}

}  // namespace

// ---- layout ---------------------------------------------------------------------------

void verify_headers(const CheckpointReader& checkpoint, Verify mode, int first_rank, int rank_stride) {
  if (rank_stride < 1) throw_invalid("verify_headers: rank_stride must be >= 1");
  for (int r = first_rank; r < checkpoint.manifest().world_size; r += rank_stride) {
    if (mode == Verify::full) {
      checkpoint.verify_shard(r, Verify::full);
      continue;
    }
    if (mode == Verify::fast) {
      // The header's chunks are checked first, so a flipped header byte is reported as the
      // checksum mismatch it is, not as whatever the damaged JSON happens to say.
      ShardRangeReader shard(checkpoint, r, Verify::fast);
      const std::uint64_t size = checkpoint.manifest().shard(r).size;
      std::byte prefix[8] = {};
      if (size >= 8) shard.read(0, prefix);
      const std::uint64_t data_start = parse_shard_prefix(std::span(prefix, size >= 8 ? 8 : 0), size, checkpoint.shard_path(r));
      std::vector<std::byte> head(static_cast<std::size_t>(data_start));
      shard.read(0, head);
    }
    checkpoint.verify_shard(r, Verify::none);
  }
}

FlatLayout flat_layout(const Manifest& m, std::string_view file) {
  FlatLayout out;
  const json::value* ft = m.training.if_contains("flat_tensors");
  if (!ft)
    throw Error(Errc::invalid_argument, std::string(file),
                "the checkpoint does not record which tensors are partitioned across ranks (training.flat_tensors): "
                "it cannot be resharded",
                "training.flat_tensors", "absent");
  if (!ft->is_array()) bad_manifest(file, "training.flat_tensors", "an array of tensor names", json::serialize(*ft).substr(0, 64));
  for (const auto& v : ft->as_array()) {
    if (!v.is_string() || v.as_string().empty())
      bad_manifest(file, "training.flat_tensors", "non-empty tensor names", json::serialize(v).substr(0, 64));
    if (contains(out.tensors, v.as_string())) bad_manifest(file, "training.flat_tensors", "unique names", std::string(v.as_string()));
    out.tensors.emplace_back(v.as_string());
  }
  out.num_params = m.param_numel;
  if (const json::value* np = m.training.if_contains("num_params")) out.num_params = json_u64(*np, file, "training.num_params");
  if (out.num_params > m.param_numel)
    bad_manifest(file, "training.num_params", "at most param_numel " + std::to_string(m.param_numel), std::to_string(out.num_params));
  return out;
}

std::uint64_t padded_numel(std::uint64_t num_params, int world) {
  if (world < 1) throw_invalid("world size must be >= 1, got " + std::to_string(world));
  const auto w = static_cast<std::uint64_t>(world);
  std::uint64_t up;
  if (__builtin_add_overflow(num_params, w - 1, &up)) throw_invalid("flat size overflows when padded");
  return up / w * w;
}

dist::ShardRange flat_slice(std::uint64_t num_params, int world, int rank) {
  return dist::shard_range(padded_numel(num_params, world), world, rank);
}

std::vector<ParamSlice> param_layout(const Manifest& m, const FlatLayout& layout, std::string_view fallback_name, std::string_view file) {
  std::vector<ParamSlice> out;
  const json::value* pl = m.training.if_contains("param_layout");
  if (!pl) {
    out.push_back({std::string(fallback_name), {layout.num_params}, 0, layout.num_params});
    return out;
  }
  if (!pl->is_array()) bad_manifest(file, "training.param_layout", "an array", json::serialize(*pl).substr(0, 64));
  std::set<std::string> names;
  for (std::size_t i = 0; i < pl->as_array().size(); ++i) {
    const json::value& v = pl->as_array()[i];
    const std::string where = "training.param_layout[" + std::to_string(i) + "]";
    if (!v.is_object()) bad_manifest(file, where, "an object", json::serialize(v).substr(0, 64));
    const json::object& o = v.as_object();
    ParamSlice s;
    const json::value* name = o.if_contains("name");
    if (!name || !name->is_string()) bad_manifest(file, where + ".name", "a string", name ? json::serialize(*name).substr(0, 64) : "absent");
    s.name = std::string(name->as_string());
    if (s.name.empty() || s.name == "__metadata__" || !names.insert(s.name).second)
      bad_manifest(file, where + ".name", "a unique, non-empty name other than __metadata__", "'" + s.name + "'");
    const json::value* shape = o.if_contains("shape");
    if (!shape || !shape->is_array()) bad_manifest(file, where + ".shape", "an array", shape ? json::serialize(*shape).substr(0, 64) : "absent");
    for (const auto& d : shape->as_array()) s.shape.push_back(json_u64(d, file, where + ".shape"));
    for (const char* f : {"offset", "numel"}) {
      const json::value* x = o.if_contains(f);
      if (!x) bad_manifest(file, where + "." + f, "present", "absent");
    }
    s.offset = json_u64(o.at("offset"), file, where + ".offset");
    s.numel = json_u64(o.at("numel"), file, where + ".numel");
    std::uint64_t numel = 1, end;
    for (auto d : s.shape)
      if (__builtin_mul_overflow(numel, d, &numel)) bad_manifest(file, where + ".shape", "an element count that fits 64 bits", "overflow");
    if (numel != s.numel) bad_manifest(file, where + ".numel", std::to_string(numel) + " (product of shape)", std::to_string(s.numel));
    if (__builtin_add_overflow(s.offset, s.numel, &end) || end > layout.num_params)
      bad_manifest(file, where, "offset + numel <= num_params " + std::to_string(layout.num_params),
                   std::to_string(s.offset) + " + " + std::to_string(s.numel));
    out.push_back(std::move(s));
  }
  return out;
}

// ---- FlatReader -----------------------------------------------------------------------

FlatReader::FlatReader(const CheckpointReader& checkpoint, FlatLayout layout, Verify mode)
    : checkpoint_(&checkpoint), layout_(std::move(layout)), mode_(mode) {
  const Manifest& m = checkpoint.manifest();
  const std::string file = manifest_path(checkpoint);
  if (layout_.num_params > m.param_numel)
    bad_manifest(file, "num_params", "at most param_numel " + std::to_string(m.param_numel), std::to_string(layout_.num_params));
  for (int r = 0; r < m.world_size; ++r) by_offset_.push_back(r);
  std::stable_sort(by_offset_.begin(), by_offset_.end(), [&](int a, int b) {
    return m.shard(a).param_shard_offset < m.shard(b).param_shard_offset;
  });
  // The shards must partition the flat space exactly, or a slice would read a hole or one
  // element twice.
  std::uint64_t expect = 0;
  for (int r : by_offset_) {
    const ShardRecord& s = m.shard(r);
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
      const std::uint64_t numel = m.shard(r).param_shard_numel;
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
  throw Error(Errc::not_found, manifest_path(*checkpoint_), "no flat tensor '" + std::string(name) + "'");
}

ShardRangeReader& FlatReader::shard(int rank) {
  // One source file open at a time: a slice runs through the sources in offset order, so
  // this keeps memory at one chunk however many ranks wrote the checkpoint.
  if (!current_ || current_->rank() != rank) {
    if (current_) closed_bytes_ += current_->bytes_read();
    current_.reset();
    current_.emplace(*checkpoint_, rank, mode_);
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
    return m.shard(r).param_shard_offset + m.shard(r).param_shard_numel <= first;
  });
  for (std::uint64_t pos = first; pos < real_end && it != by_offset_.end(); ++it) {
    const ShardRecord& s = m.shard(*it);
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
    throw Error(Errc::invalid_argument, manifest_path(*checkpoint_), "read of flat tensor '" + std::string(name) + "'",
                "a multiple of " + std::to_string(es) + " bytes", std::to_string(out.size()) + " bytes");
  const std::uint64_t count = out.size() / es;
  std::uint64_t padding_from = 0;
  for (const Piece& p : pieces(name, first, count, padding_from)) {
    const TensorRecord* t = checkpoint_->manifest().find_tensor(name, p.rank);
    shard(p.rank).read(t->begin + p.source_first * es,
                       out.subspan(static_cast<std::size_t>(p.out_first * es), static_cast<std::size_t>(p.count * es)));
  }
  if (padding_from < count)
    std::memset(out.data() + padding_from * es, 0, static_cast<std::size_t>((count - padding_from) * es));
}

// ---- per-rank metadata ----------------------------------------------------------------

std::vector<json::object> remap_rank_metadata(const Manifest& src, int world) {
  if (world < 1) throw_invalid("world size must be >= 1, got " + std::to_string(world));
  std::vector<std::string> keys;
  for (const auto& s : src.shards)
    for (const auto& kv : s.metadata)
      if (!contains(keys, kv.key())) keys.emplace_back(kv.key());
  std::set<std::string> local;
  if (const json::value* rl = src.training.if_contains("rank_local_metadata"); rl && rl->is_array())
    for (const auto& v : rl->as_array())
      if (v.is_string()) local.emplace(v.as_string());
  for (const auto& k : keys) {
    const json::value* v0 = src.shard(0).metadata.if_contains(k);
    for (const auto& s : src.shards) {
      const json::value* v = s.metadata.if_contains(k);
      if (!v0 || !v || *v != *v0) local.insert(k);
    }
  }
  std::vector<json::object> out(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    json::object& o = out[static_cast<std::size_t>(r)];
    for (const auto& k : keys) {
      if (!local.count(k)) {
        o[k] = src.shard(0).metadata.at(k);
      } else if (r < src.world_size) {
        if (const json::value* v = src.shard(r).metadata.if_contains(k)) o[k] = *v;
      }
    }
  }
  return out;
}

// ---- reshard --------------------------------------------------------------------------

ReshardResult reshard_checkpoint(FileSystem& fs, const CheckpointReader& source, const std::string& dst_root,
                                 const ReshardOptions& opt) {
  const Manifest& src = source.manifest();
  const std::string src_file = manifest_path(source);
  if (opt.world_size < 1 || opt.world_size > (1 << 20))
    throw Error(Errc::invalid_argument, dst_root, "target world size", "1.." + std::to_string(1 << 20), std::to_string(opt.world_size));
  if (opt.buffer_bytes < kMinReshardBuffer)
    throw Error(Errc::invalid_argument, dst_root, "buffer size", "at least " + std::to_string(kMinReshardBuffer) + " bytes",
                std::to_string(opt.buffer_bytes) + " bytes");
  const int world = opt.world_size;
  // A tensor-parallel checkpoint (training.parallel.tensor = T) resumes only at a world made
  // of whole groups of T ranks; its layout's data degree follows the new world size.
  std::optional<json::object> parallel;
  if (const json::value* p = src.training.if_contains("parallel"); p && p->is_object()) {
    parallel = p->as_object();
    if (const json::value* t = parallel->if_contains("tensor"); t && t->is_int64() && t->as_int64() > 0) {
      if (world % t->as_int64() != 0)
        throw Error(Errc::invalid_argument, dst_root, "target world size for a tensor-parallel checkpoint (training.parallel.tensor = " +
                    std::to_string(t->as_int64()) + ")", "a multiple of " + std::to_string(t->as_int64()), std::to_string(world));
      (*parallel)["data"] = world / t->as_int64();
    }
  }
  const FlatLayout layout = opt.layout ? *opt.layout : flat_layout(src, src_file);
  FlatReader flat(source, layout, opt.verify);
  for (const auto& t : src.tensors)
    if (t.rank != 0 && !contains(layout.tensors, t.name))
      throw Error(Errc::invalid_argument, src_file,
                  "tensor '" + t.name + "' of rank " + std::to_string(t.rank) +
                      " is neither flat (training.flat_tensors) nor replicated on rank 0: it has no place at another world size");
  verify_headers(source, opt.verify);

  // Every target shard is planned before a byte is written: the progress total, and the
  // manifest's sizes, are known up front.
  const auto order = rank0_tensors(src);
  std::vector<std::vector<TensorSpec>> specs(static_cast<std::size_t>(world));
  std::vector<std::map<std::string, std::string>> header_meta(static_cast<std::size_t>(world));
  std::uint64_t total = 0;
  for (int r = 0; r < world; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    const dist::ShardRange slice = flat_slice(layout.num_params, world, r);
    for (const TensorRecord* t : order) {
      if (contains(layout.tensors, t->name)) specs[ri].push_back({t->name, t->dtype, {slice.numel}});
      else if (r == 0) specs[0].push_back({t->name, t->dtype, t->shape});
    }
    // The header metadata every ckpt writer puts in a shard.
    header_meta[ri] = shard_header_metadata(r, world, src.step);
    total += plan_shard_specs(specs[ri], header_meta[ri]).file_size();
  }
  const auto metadata = remap_rank_metadata(src, world);

  json::object training = src.training;
  json::array names;
  for (const auto& n : layout.tensors) names.emplace_back(n);
  training["flat_tensors"] = std::move(names);
  training["num_params"] = layout.num_params;
  training["resharded_from"] = json::object{{"world_size", src.world_size}, {"param_numel", src.param_numel}};
  if (parallel) training["parallel"] = std::move(*parallel);

  const bool created_root = !fs.stat(dst_root);
  if (created_root) require_dir(fs, parent_of(dst_root), "the parent of the destination root");
  else require_dir(fs, dst_root, "the destination root");
  ReshardResult result;
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
    std::optional<ShardRangeReader> replicated;  // rank 0's non-flat tensors, opened when needed
    std::uint64_t written = 0;
    std::vector<ShardReport> reports;
    auto report = [&](std::uint64_t n) {
      written += n;
      if (opt.progress) opt.progress(written, total);
    };
    for (int r = 0; r < world; ++r) {
      const dist::ShardRange slice = flat_slice(layout.num_params, world, r);
      ShardWriter writer = ShardWriter::stream(fs, temp, shard_file_name(r, world), specs[static_cast<std::size_t>(r)],
                                               header_meta[static_cast<std::size_t>(r)], {.chunk_size = src.chunk_size});
      report(writer.header().data_start);
      for (const auto& t : writer.header().tensors) {
        const std::uint64_t bytes = t.end - t.begin;
        if (contains(layout.tensors, t.name)) {
          const std::uint64_t es = dtype_size(t.dtype), per_piece = opt.buffer_bytes / es;
          for (std::uint64_t done = 0; done < slice.numel;) {
            const std::uint64_t n = std::min(per_piece, slice.numel - done);
            const auto piece = buffer.span(static_cast<std::size_t>(n * es));
            flat.read(t.name, slice.offset + done, piece);
            writer.write(piece);
            report(piece.size());
            done += n;
          }
        } else {
          if (!replicated) replicated.emplace(source, 0, opt.verify);
          const TensorRecord* from = src.find_tensor(t.name, 0);
          for (std::uint64_t done = 0; done < bytes;) {
            const std::uint64_t n = std::min(opt.buffer_bytes, bytes - done);
            const auto piece = buffer.span(static_cast<std::size_t>(n));
            replicated->read(from->begin + done, piece);
            writer.write(piece);
            report(n);
            done += n;
          }
        }
      }
      ShardReport w = writer.finish(r);
      // The flat tensors are 1-D slices of the padded flat space (docs/format.md).
      for (auto& rec : w.tensors)
        if (contains(layout.tensors, rec.name))
          rec.sharding = slice_of(rec.name, {padded_numel(layout.num_params, world)}, {slice.offset}, {slice.numel});
        else if (const TensorRecord* from = src.find_tensor(rec.name, 0); from && from->sharding && from->sharding->kind == TensorSharding::Kind::rank_local)
          rec.sharding = from->sharding;
      w.shard.param_shard_offset = slice.offset;
      w.shard.param_shard_numel = slice.numel;
      w.shard.metadata = metadata[static_cast<std::size_t>(r)];
      result.bytes_written += w.shard.size;
      if (r == 0) {
        w.param_numel = padded_numel(layout.num_params, world);
        w.wall_clock_seconds = src.wall_clock_seconds;
        w.training = std::move(training);
      }
      reports.push_back(std::move(w));
    }
    result.manifest = assemble_manifest(src.step, src.chunk_size, std::move(reports));
    result.dir = commit_checkpoint(fs, dst_root, temp, result.manifest);
    result.bytes_read = flat.bytes_read() + (replicated ? replicated->bytes_read() : 0);
  } catch (...) {
    if (!temp.empty()) abort_checkpoint(fs, dst_root, temp);
    if (created_root && lock) {  // without the lock, DST may be another writer's by now
      try {
        fs.remove_all(dst_root);
        fs.sync_dir(parent_of(dst_root));
      } catch (...) {
        // The error that brought us here is the one to report.
      }
    }
    throw;
  }
  return result;
}

// ---- consolidate ----------------------------------------------------------------------

namespace {

// Removes what killed consolidates into PARENT/out_name left: their temporaries, when made on
// this host by a process that no longer exists.
void remove_abandoned_outputs(FileSystem& fs, const std::string& parent, const std::string& out_name) {
  bool removed = false;
  for (const auto& e : fs.list_dir(parent)) {
    if (!is_abandoned_temporary(e.name, out_name)) continue;
    log_line(join_path(parent, out_name) + ": removing " + e.name + ", left by a consolidate that is gone");
    fs.remove_all(join_path(parent, e.name));
    removed = true;
  }
  if (removed) fs.sync_dir(parent);
}

}  // namespace

ConsolidateResult consolidate_checkpoint(FileSystem& fs, const CheckpointReader& source, const std::string& out_dir,
                                         const ConsolidateOptions& opt) {
  const Manifest& src = source.manifest();
  const std::string src_file = manifest_path(source);
  if (opt.buffer_bytes < kMinReshardBuffer)
    throw Error(Errc::invalid_argument, out_dir, "buffer size", "at least " + std::to_string(kMinReshardBuffer) + " bytes",
                std::to_string(opt.buffer_bytes) + " bytes");
  if (opt.dtype && *opt.dtype != DType::F32 && *opt.dtype != DType::F16 && *opt.dtype != DType::BF16)
    throw Error(Errc::invalid_argument, out_dir, "output dtype", "F32, F16 or BF16", std::string(dtype_name(*opt.dtype)));
  const FlatLayout layout = flat_layout(src, src_file);
  if (!contains(layout.tensors, opt.tensor))
    throw Error(Errc::not_found, src_file, "no flat tensor '" + opt.tensor + "' to consolidate", "one of training.flat_tensors",
                "'" + opt.tensor + "'");
  FlatReader flat(source, layout, opt.verify);
  const DType in_type = flat.dtype(opt.tensor);
  if (in_type != DType::F32 && in_type != DType::F16 && in_type != DType::BF16 && in_type != DType::F64)
    throw Error(Errc::invalid_argument, src_file, "flat tensor '" + opt.tensor + "' dtype", "a float type",
                std::string(dtype_name(in_type)));
  const DType out_type = opt.dtype.value_or(in_type == DType::F64 ? DType::F32 : in_type);
  const auto params = param_layout(src, layout, opt.tensor, src_file);
  verify_headers(source, opt.verify);

  // Files are filled in layout order; a new one starts when the next tensor would pass the
  // limit (a tensor larger than the limit gets a file of its own), as Hugging Face shards.
  const std::uint64_t out_es = dtype_size(out_type), in_es = dtype_size(in_type);
  std::vector<std::vector<std::size_t>> groups(1);
  std::uint64_t in_group = 0, total_size = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::uint64_t bytes = params[i].numel * out_es;
    if (opt.max_file_size && !groups.back().empty() && in_group + bytes > opt.max_file_size) groups.emplace_back(), in_group = 0;
    groups.back().push_back(i);
    in_group += bytes;
    total_size += bytes;
  }
  ConsolidateResult result;
  result.dir = out_dir;
  result.dtype = out_type;
  result.total_size = total_size;
  const std::size_t n_files = groups.size();
  auto file_name = [&](std::size_t k) {
    if (n_files == 1) return std::string("model.safetensors");
    char buf[64];
    std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", k + 1, n_files);
    return std::string(buf);
  };
  std::uint64_t progress_total = 0;
  std::vector<std::vector<TensorSpec>> specs(n_files);
  for (std::size_t k = 0; k < n_files; ++k) {
    for (std::size_t i : groups[k]) specs[k].push_back({params[i].name, out_type, params[i].shape});
    progress_total += plan_shard_specs(specs[k]).data_size;
  }

  const std::string parent = parent_of(out_dir);
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
    const std::uint64_t per_piece = opt.buffer_bytes / (in_es + (in_type == out_type ? 0 : out_es));
    std::uint64_t written = 0;
    for (std::size_t k = 0; k < n_files; ++k) {
      ShardWriter writer =
          ShardWriter::stream(fs, temp, file_name(k), specs[k], {{"format", "pt"}}, {.chunk_size = src.chunk_size, .sha256 = false});
      ConsolidatedFile cf;
      cf.name = file_name(k);
      for (const auto& t : writer.header().tensors) {
        const ParamSlice& p = *std::find_if(params.begin(), params.end(), [&](const ParamSlice& s) { return s.name == t.name; });
        cf.tensors.push_back(p.name);
        for (std::uint64_t done = 0; done < p.numel;) {
          const std::uint64_t n = std::min(per_piece, p.numel - done);
          const auto in = buffer.span(static_cast<std::size_t>(n * in_es));
          flat.read(opt.tensor, p.offset + done, in);
          std::span<const std::byte> piece = in;
          if (in_type != out_type) {
            std::byte* o = buffer.data() + n * in_es;
            for (std::uint64_t i = 0; i < n; ++i) store_from_f32(out_type, load_as_f32(in_type, in.data() + i * in_es), o + i * out_es);
            piece = std::span<const std::byte>(o, static_cast<std::size_t>(n * out_es));
          }
          writer.write(piece);
          written += piece.size();
          if (opt.progress) opt.progress(written, progress_total);
          done += n;
        }
      }
      cf.size = writer.finish(0).shard.size;
      result.files.push_back(std::move(cf));
    }
    if (n_files > 1) {
      json::object weight_map;
      std::vector<std::pair<std::string, std::string>> entries;
      for (const auto& f : result.files)
        for (const auto& t : f.tensors) entries.emplace_back(t, f.name);
      std::sort(entries.begin(), entries.end());
      for (const auto& [t, f] : entries) weight_map[t] = f;
      const std::string text =
          json::serialize(json::object{{"metadata", {{"total_size", total_size}}}, {"weight_map", std::move(weight_map)}}) + "\n";
      result.index = "model.safetensors.index.json";
      auto f = fs.create(join_path(temp, *result.index), {});
      f->write_at(0, std::as_bytes(std::span(text.data(), text.size())));
      f->sync();
      f->close();
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
  result.bytes_read = flat.bytes_read();
  return result;
}

}  // namespace ckpt
