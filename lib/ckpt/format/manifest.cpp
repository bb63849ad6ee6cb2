// SPDX-License-Identifier: Apache-2.0
#include "ckpt/format/manifest.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iterator>
#include <limits>
#include <map>
#include <set>

#include "ckpt/core/error.hpp"
#include "ckpt/format/json_util.hpp"
#include "ckpt/format/boost_json.hpp"
#include "ckpt/format/detail/manifest_parse.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/hash/xxh3.hpp"

namespace ckpt {

namespace json = boost::json;

namespace {
constexpr int kMaxWorldSize = 1 << 20;
constexpr int kMaxFileParts = 99999;  // a part's number is five digits in its file name
constexpr std::uint64_t kMaxFileSize = 1ull << 50;  // 1 PiB per shard: beyond it, the number is hostile
constexpr std::uint64_t kMinChunk = 4096, kMaxChunk = 1ull << 30;

bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The tag of a non-finite double in the free-form parts (manifest.hpp, tag_non_finite).
constexpr std::string_view kFloatTag = "__float__";
constexpr std::uint64_t kDefaultNaN = 0x7ff8000000000000ull;

std::string non_finite_spelling(double d) {
  if (!std::isnan(d)) return d > 0 ? "inf" : "-inf";
  const auto bits = std::bit_cast<std::uint64_t>(d);
  if (bits == kDefaultNaN) return "nan";
  char buf[24];
  std::snprintf(buf, sizeof buf, "nan:0x%016llx", static_cast<unsigned long long>(bits));
  return buf;
}

// The double a tag spells, or nullopt if `o` is not a tag.
std::optional<double> tagged_double(const json::object& o) {
  if (o.size() != 1) return std::nullopt;
  const auto* s = o.if_contains(kFloatTag);
  if (!s || !s->is_string()) return std::nullopt;
  const std::string_view v = s->get_string();
  if (v == "inf") return std::numeric_limits<double>::infinity();
  if (v == "-inf") return -std::numeric_limits<double>::infinity();
  if (v == "nan") return std::bit_cast<double>(kDefaultNaN);
  if (v.size() != 22 || !v.starts_with("nan:0x") || !is_lower_hex(v.substr(6))) return std::nullopt;
  const double d = std::bit_cast<double>(std::stoull(std::string(v.substr(6)), nullptr, 16));
  return std::isnan(d) ? std::optional(d) : std::nullopt;
}
}  // namespace

bool all_finite(const json::value& v) {
  if (v.is_double()) return std::isfinite(v.get_double());
  if (const auto* a = v.if_array()) return std::all_of(a->begin(), a->end(), [](const json::value& e) { return all_finite(e); });
  if (const auto* o = v.if_object())
    return std::all_of(o->begin(), o->end(), [](const json::key_value_pair& kv) { return all_finite(kv.value()); });
  return true;
}

json::value tag_non_finite(const json::value& v) {
  if (v.is_double() && !std::isfinite(v.get_double())) return json::object{{kFloatTag, non_finite_spelling(v.get_double())}};
  if (const auto* a = v.if_array()) {
    json::array out;
    out.reserve(a->size());
    for (const auto& e : *a) out.push_back(tag_non_finite(e));
    return out;
  }
  if (const auto* o = v.if_object()) {
    json::object out;
    out.reserve(o->size());
    for (const auto& kv : *o) out.emplace(kv.key(), tag_non_finite(kv.value()));
    return out;
  }
  return v;
}

void untag_non_finite(json::value& v) {
  if (auto* a = v.if_array()) {
    for (auto& e : *a) untag_non_finite(e);
  } else if (auto* o = v.if_object()) {
    if (const auto d = tagged_double(*o)) {
      v = *d;
      return;
    }
    for (auto& kv : *o) untag_non_finite(kv.value());
  }
}

namespace {
// The free-form objects as encode_manifest writes them, and back.
json::object tagged_object(const json::object& o) { return tag_non_finite(o).as_object(); }
void untag_object(json::object& o) {
  for (auto& kv : o) untag_non_finite(kv.value());
}
}  // namespace

bool is_plain_file_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 255 || name.front() == '.') return false;
  return name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos &&
         name.find('\\') == std::string_view::npos;
}

std::span<const ShardRecord> Manifest::files_of(int rank) const noexcept {
  const auto by_rank = [](const ShardRecord& s, int r) { return s.rank < r; };
  const auto lo = std::lower_bound(shards.begin(), shards.end(), rank, by_rank);
  auto hi = lo;
  while (hi != shards.end() && hi->rank == rank) ++hi;
  return {lo, hi};
}

const ShardRecord& Manifest::rank_record(int rank) const {
  check_rank(rank, world_size > 0 ? world_size : static_cast<int>(shards.size()), "shard rank", kManifestName);
  const auto files = files_of(rank);
  if (files.empty() || files.front().part != 0)
    throw Error(Errc::invalid_argument, std::string(kManifestName), "shard file of rank " + std::to_string(rank), "part 0", "none");
  return files.front();
}

const ShardRecord& Manifest::shard(int rank) const {
  const ShardRecord& first = rank_record(rank);
  if (const auto n = files_of(rank).size(); n != 1)
    throw Error(Errc::invalid_argument, std::string(kManifestName), "shard files of rank " + std::to_string(rank) + " (one asked for)", "1",
                std::to_string(n));
  return first;
}

std::size_t Manifest::file_index(int rank, int part) const {
  const auto files = files_of(rank);
  if (part < 0 || static_cast<std::size_t>(part) >= files.size() || files[static_cast<std::size_t>(part)].part != part)
    throw Error(Errc::invalid_argument, std::string(kManifestName), "shard file of rank " + std::to_string(rank),
                "parts 0.." + std::to_string(files.empty() ? 0 : files.size() - 1), "part " + std::to_string(part));
  return static_cast<std::size_t>(&files[static_cast<std::size_t>(part)] - shards.data());
}

bool Manifest::has_file_parts() const noexcept {
  return std::any_of(shards.begin(), shards.end(), [](const ShardRecord& s) { return s.part != 0; });
}

const TensorRecord* Manifest::find_tensor(std::string_view name, int rank) const noexcept {
  for (const auto& t : tensors)
    if (t.rank == rank && t.name == name) return &t;
  return nullptr;
}

bool TensorRecord::held_by(int r) const noexcept {
  return rank == r || (sharding && sharding->kind == TensorSharding::Kind::replicated &&
                       std::binary_search(sharding->holders.begin(), sharding->holders.end(), r));
}

const TensorRecord* Manifest::find_held_tensor(std::string_view name, int rank) const noexcept {
  for (const auto& t : tensors)
    if (t.name == name && t.held_by(rank)) return &t;
  return nullptr;
}

std::vector<const TensorRecord*> Manifest::held_tensors(int rank) const {
  std::vector<const TensorRecord*> out;
  for (const auto& t : tensors)
    if (t.held_by(rank)) out.push_back(&t);
  return out;
}

std::string utc_now_rfc3339() { return utc_rfc3339(std::chrono::system_clock::now()); }

std::string utc_rfc3339(std::chrono::system_clock::time_point now) {
  const std::time_t secs = std::chrono::system_clock::to_time_t(std::chrono::floor<std::chrono::seconds>(now));
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

std::optional<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view t) noexcept {
  auto num = [&](std::size_t pos, std::size_t len, int& out) {
    if (pos + len > t.size()) return false;
    const auto [p, ec] = std::from_chars(t.data() + pos, t.data() + pos + len, out);
    return ec == std::errc() && p == t.data() + pos + len;
  };
  int y, mo, d, h, mi, s, ms = 0;
  if (t.size() < 20 || t[4] != '-' || t[7] != '-' || t[10] != 'T' || t[13] != ':' || t[16] != ':' || t.back() != 'Z' ||
      !num(0, 4, y) || !num(5, 2, mo) || !num(8, 2, d) || !num(11, 2, h) || !num(14, 2, mi) || !num(17, 2, s))
    return std::nullopt;
  if (t.size() > 20) {  // ".fff...Z": milliseconds kept, finer digits ignored
    if (t[19] != '.' || t.size() < 22) return std::nullopt;
    for (std::size_t i = 20; i + 1 < t.size(); ++i)
      if (t[i] < '0' || t[i] > '9') return std::nullopt;
    for (std::size_t i = 20; i < 23; ++i) ms = ms * 10 + (i + 1 < t.size() ? t[i] - '0' : 0);
  }
  const std::chrono::year_month_day ymd{std::chrono::year(y), std::chrono::month(static_cast<unsigned>(mo)),
                                        std::chrono::day(static_cast<unsigned>(d))};
  if (!ymd.ok() || h > 23 || mi > 59 || s > 60) return std::nullopt;
  return std::chrono::sys_days(ymd) + std::chrono::hours(h) + std::chrono::minutes(mi) + std::chrono::seconds(s) +
         std::chrono::milliseconds(ms);
}

json::object shard_to_json(const ShardRecord& s, bool parts) {
  json::array chunks;
  for (auto c : s.chunk_xxh3) chunks.emplace_back(xxh3_hex(c));
  json::object o{{"rank", s.rank}};
  if (parts) o["part"] = s.part;
  o["path"] = s.path;
  o["size"] = s.size;
  o["sha256"] = s.sha256;
  o["xxh3"] = xxh3_hex(s.xxh3);
  o["chunk_xxh3"] = std::move(chunks);
  if (s.part == 0) {
    o["param_shard_offset"] = s.param_shard_offset;
    o["param_shard_numel"] = s.param_shard_numel;
    o["metadata"] = tagged_object(json_of(s.metadata));
  }
  return o;
}

namespace {
json::array u64_array(std::span<const std::uint64_t> v) {
  json::array a;
  for (auto d : v) a.emplace_back(d);
  return a;
}
}  // namespace

json::object sharding_to_json(const TensorSharding& s) {
  switch (s.kind) {
    case TensorSharding::Kind::slice:
      return json::object{{"slice", json::object{{"global", s.global},
                                                 {"global_shape", u64_array(s.global_shape)},
                                                 {"offsets", u64_array(s.offsets)},
                                                 {"lengths", u64_array(s.lengths)}}}};
    case TensorSharding::Kind::replicated: {
      json::array h;
      for (int r : s.holders) h.emplace_back(r);
      return json::object{{"replicated", json::object{{"holders", std::move(h)}}}};
    }
    case TensorSharding::Kind::rank_local: break;
  }
  return json::object{{"rank_local", true}};
}

json::object tensor_to_json(const TensorRecord& t) {
  json::object o{{"name", t.name}, {"rank", t.rank}};
  if (t.part != 0) o["part"] = t.part;
  o["dtype"] = dtype_name(t.dtype);
  o["shape"] = u64_array(t.shape);
  o["byte_range"] = json::array{t.begin, t.end};
  if (t.sharding)
    for (auto& kv : sharding_to_json(*t.sharding)) o[kv.key()] = kv.value();
  return o;
}

json::object block_to_json(const RedundancyBlock& b, const Stripe* stripe) {
  json::array chunks;
  for (auto c : b.chunk_xxh3) chunks.emplace_back(xxh3_hex(c));
  json::object o{{"kind", b.kind == RedundancyBlock::Kind::parity ? "parity" : "replica"}, {"node", b.node}};
  if (b.kind == RedundancyBlock::Kind::parity) {
    o["stripe"] = b.stripe;
    o["index"] = b.index;
    json::array members;
    if (stripe)
      for (const auto& p : stripe->data) members.emplace_back(json::array{p.node, p.index, p.offset, p.length});
    o["members"] = std::move(members);
  } else {
    o["rank"] = b.rank;
  }
  o["path"] = b.path;
  o["size"] = b.size;
  o["sha256"] = b.sha256;
  o["xxh3"] = xxh3_hex(b.xxh3);
  o["chunk_xxh3"] = std::move(chunks);
  return o;
}

namespace {
std::vector<std::uint64_t> shard_sizes(const Manifest& m) {
  std::vector<std::uint64_t> v;
  for (const auto& s : m.shards) v.push_back(s.size);
  return v;
}
}  // namespace

std::string encode_manifest(const Manifest& m) {
  json::array shards;
  for (const auto& s : m.shards) shards.emplace_back(shard_to_json(s, m.schema_version >= kFilesPerRankSchemaVersion));
  json::array tensors;
  for (const auto& t : m.tensors) tensors.emplace_back(tensor_to_json(t));
  json::object o{{"schema_version", m.schema_version},
                 {"format", "ckpt"},
                 {"world_size", m.world_size},
                 {"step", m.step},
                 {"wall_clock_seconds", m.wall_clock_seconds},
                 {"created_at", m.created_at},
                 {"chunk_size", m.chunk_size},
                 {"param_numel", m.param_numel},
                 {"shards", std::move(shards)},
                 {"tensors", std::move(tensors)},
                 {"training", tagged_object(json_of(m.training))}};
  if (m.nodes) {
    o["nodes"] = json::object{{"count", m.nodes->nodes},
                              {"ranks_per_node", m.nodes->ranks_per_node},
                              {"redundancy", redundancy_name(m.nodes->scheme)}};
    const auto stripes = rs_stripes(*m.nodes, shard_sizes(m));
    json::array blocks;
    for (const auto& b : m.redundancy)
      blocks.emplace_back(block_to_json(b, b.kind == RedundancyBlock::Kind::parity && b.stripe >= 0 &&
                                                   static_cast<std::size_t>(b.stripe) < stripes.size()
                                               ? &stripes[static_cast<std::size_t>(b.stripe)]
                                               : nullptr));
    o["redundancy_blocks"] = std::move(blocks);
  }
  // One shard or tensor per line keeps the file readable with cat and diff.
  std::string out = "{";
  bool first = true;
  for (const auto& kv : o) {
    out += first ? "\n  " : ",\n  ";
    first = false;
    out += json::serialize(json::string(kv.key())) + ": ";
    if (kv.value().is_array() && !kv.value().get_array().empty()) {
      out += "[";
      bool f2 = true;
      for (const auto& e : kv.value().get_array()) {
        out += f2 ? "\n    " : ",\n    ";
        f2 = false;
        out += json::serialize(e);
      }
      out += "\n  ]";
    } else {
      out += json::serialize(kv.value());
    }
  }
  out += "\n}\n";
  return out;
}

Manifest assemble_manifest(std::uint64_t step, std::uint64_t chunk_size, std::vector<ShardReport> reports) {
  if (reports.empty()) throw_invalid("assemble_manifest: no shard reports");
  Manifest m;
  m.world_size = static_cast<int>(reports.size());
  m.step = step;
  m.chunk_size = chunk_size;
  m.param_numel = reports.front().param_numel;
  m.wall_clock_seconds = reports.front().wall_clock_seconds;
  m.training = std::move(reports.front().training);
  m.created_at = utc_now_rfc3339();
  for (std::size_t r = 0; r < reports.size(); ++r) {
    ShardReport& rep = reports[r];
    if (rep.shard.rank != static_cast<int>(r))
      throw Error(Errc::invalid_argument, {}, "shard report out of rank order", std::to_string(r), std::to_string(rep.shard.rank));
    if (rep.chunk_size != chunk_size)
      throw Error(Errc::invalid_argument, rep.shard.path, "chunk length of the shard's checksums", std::to_string(chunk_size),
                  std::to_string(rep.chunk_size));
    if (rep.shard.part != 0) throw Error(Errc::invalid_argument, rep.shard.path, "part of the rank's first file", "0", std::to_string(rep.shard.part));
    m.shards.push_back(std::move(rep.shard));
    for (std::size_t k = 0; k < rep.more_files.size(); ++k) {
      ShardRecord& f = rep.more_files[k];
      if (f.rank != static_cast<int>(r) || f.part != static_cast<int>(k + 1))
        throw Error(Errc::invalid_argument, f.path, "rank and part of a shard file", std::to_string(r) + " part " + std::to_string(k + 1),
                    std::to_string(f.rank) + " part " + std::to_string(f.part));
      m.shards.push_back(std::move(f));
      m.schema_version = kFilesPerRankSchemaVersion;
    }
    std::move(rep.tensors.begin(), rep.tensors.end(), std::back_inserter(m.tensors));
  }
  return m;
}

namespace {
std::vector<std::uint64_t> dims_field(const detail::JsonContext& c, const json::object& o, std::string_view key, const std::string& where) {
  const std::string field = where + "." + std::string(key);
  const auto& a = detail::json_arr(c, detail::json_field(c, o, key, where + "."), field);
  if (a.size() > 64) c.fail(field, "at most 64 dimensions", std::to_string(a.size()));
  std::vector<std::uint64_t> out;
  out.reserve(a.size());
  for (const auto& d : a) out.push_back(detail::json_u64(c, d, field));
  return out;
}

// The sharding field of a tensor entry on its own (what does not depend on the entry or the
// other entries): at most one of `slice`, `replicated`, `rank_local`, each well-formed.
std::optional<TensorSharding> parse_sharding(const detail::JsonContext& c, const json::object& to, const std::string& where) {
  const auto* slice = to.if_contains("slice");
  const auto* rep = to.if_contains("replicated");
  const auto* local = to.if_contains("rank_local");
  const int given = (slice != nullptr) + (rep != nullptr) + (local != nullptr);
  if (given == 0) return std::nullopt;
  if (given > 1) c.fail(where, "at most one of slice, replicated, rank_local", std::to_string(given) + " given");
  TensorSharding s;
  if (slice) {
    const std::string w = where + ".slice";
    const json::object& so = detail::json_obj(c, *slice, w);
    s.kind = TensorSharding::Kind::slice;
    s.global = std::string(detail::json_str(c, detail::json_field(c, so, "global", w + "."), w + ".global"));
    if (s.global.empty() || s.global == "__metadata__") c.fail(w + ".global", "a non-empty name, not __metadata__", "'" + s.global + "'");
    s.global_shape = dims_field(c, so, "global_shape", w);
    s.offsets = dims_field(c, so, "offsets", w);
    s.lengths = dims_field(c, so, "lengths", w);
    if (s.offsets.size() != s.global_shape.size() || s.lengths.size() != s.global_shape.size())
      c.fail(w, std::to_string(s.global_shape.size()) + " offsets and lengths (global_shape's dimensions)",
             std::to_string(s.offsets.size()) + " offsets, " + std::to_string(s.lengths.size()) + " lengths");
  } else if (rep) {
    const std::string w = where + ".replicated";
    const json::object& ro = detail::json_obj(c, *rep, w);
    s.kind = TensorSharding::Kind::replicated;
    const auto& h = detail::json_arr(c, detail::json_field(c, ro, "holders", w + "."), w + ".holders");
    if (h.empty()) c.fail(w + ".holders", "at least one rank", "none");
    for (const auto& r : h) {
      const auto v = detail::json_u64(c, r, w + ".holders", static_cast<std::uint64_t>(kMaxWorldSize - 1));
      if (!s.holders.empty() && static_cast<int>(v) <= s.holders.back())
        c.fail(w + ".holders", "ascending ranks, each once", "rank " + std::to_string(v) + " after " + std::to_string(s.holders.back()));
      s.holders.push_back(static_cast<int>(v));
    }
  } else {
    if (!local->is_bool() || !local->get_bool()) c.fail(where + ".rank_local", "true", detail::json_kind(*local));
    s.kind = TensorSharding::Kind::rank_local;
  }
  return s;
}

// A tensor entry's optional sharding description (schema 2), checked against its entry and
// the manifest; the tiling of slices is checked across entries afterwards (check_slices).
void decode_sharding(const detail::JsonContext& c, const json::object& to, const std::string& where, const Manifest& m, TensorRecord& t) {
  const bool any = to.contains("slice") || to.contains("replicated") || to.contains("rank_local");
  if (any && m.schema_version < 2)
    c.fail(where + "." + (to.contains("slice") ? "slice" : to.contains("replicated") ? "replicated" : "rank_local"),
           "no sharding description in schema_version 1", "one given");
  auto s = parse_sharding(c, to, where);
  if (!s) return;
  if (s->kind == TensorSharding::Kind::slice) {
    const std::string w = where + ".slice";
    if (s->lengths != t.shape) c.fail(w + ".lengths", "the tensor's shape " + format_index(t.shape), format_index(s->lengths));
    std::uint64_t numel = 1;
    for (std::size_t d = 0; d < s->global_shape.size(); ++d) {
      std::uint64_t end;
      if (__builtin_add_overflow(s->offsets[d], s->lengths[d], &end) || end > s->global_shape[d])
        c.fail(w, "offsets + lengths within global_shape " + format_index(s->global_shape),
               "offsets " + format_index(s->offsets) + ", lengths " + format_index(s->lengths) + " on rank " + std::to_string(t.rank));
      if (__builtin_mul_overflow(numel, s->global_shape[d], &numel)) c.fail(w + ".global_shape", "element count within 64 bits", "overflow");
    }
    std::uint64_t gbytes;
    if (__builtin_mul_overflow(numel, dtype_size(t.dtype), &gbytes)) c.fail(w + ".global_shape", "byte size within 64 bits", "overflow");
  } else if (s->kind == TensorSharding::Kind::replicated) {
    const std::string w = where + ".replicated.holders";
    if (s->holders.back() > m.world_size - 1) c.fail(w, "at most " + std::to_string(m.world_size - 1), std::to_string(s->holders.back()));
    if (s->holders.front() != t.rank)
      c.fail(w, "the lowest holder is the entry's rank " + std::to_string(t.rank), "rank " + std::to_string(s->holders.front()));
  }
  t.sharding = std::move(s);
}

// The slices of each global tensor: one dtype and global shape, tiling it exactly.
void check_slices(const detail::JsonContext& c, const Manifest& m) {
  std::map<std::string_view, std::vector<const TensorRecord*>> by_global;
  for (const auto& t : m.tensors)
    if (t.sharding && t.sharding->kind == TensorSharding::Kind::slice) by_global[t.sharding->global].push_back(&t);
  for (const auto& [global, parts] : by_global) {
    const std::string what = "slices of global tensor '" + std::string(global) + "'";
    const TensorRecord& first = *parts.front();
    std::vector<SliceBox> boxes;
    boxes.reserve(parts.size());
    for (const TensorRecord* p : parts) {
      if (p->dtype != first.dtype)
        c.fail(what, std::string("one dtype (") + std::string(dtype_name(first.dtype)) + " on rank " + std::to_string(first.rank) + ")",
               std::string(dtype_name(p->dtype)) + " on rank " + std::to_string(p->rank));
      if (p->sharding->global_shape != first.sharding->global_shape)
        c.fail(what, "one global_shape (" + format_index(first.sharding->global_shape) + " on rank " + std::to_string(first.rank) + ")",
               format_index(p->sharding->global_shape) + " on rank " + std::to_string(p->rank));
      boxes.push_back({p->rank, p->sharding->offsets, p->sharding->lengths});
    }
    if (auto problem = tiling_problem(first.sharding->global_shape, boxes))
      c.fail(what, "slices that tile " + format_index(first.sharding->global_shape) + " exactly (no gap, no overlap)", *problem);
  }
}

// The checksums of a file entry (a shard's or a block's).
void decode_checksums(const detail::JsonContext& c, const json::object& so, const std::string& where, std::uint64_t size,
                      std::uint64_t chunk_size, std::string& sha256, std::uint64_t& xxh3, std::vector<std::uint64_t>& chunk_xxh3) {
  sha256 = std::string(detail::json_str(c, detail::json_field(c, so, "sha256", where + "."), where + ".sha256"));
  if (sha256.size() != 64 || !is_lower_hex(sha256)) c.fail(where + ".sha256", "64 lower-case hex digits", "'" + sha256 + "'");
  const auto xx = detail::json_str(c, detail::json_field(c, so, "xxh3", where + "."), where + ".xxh3");
  if (!parse_xxh3_hex(xx, xxh3)) c.fail(where + ".xxh3", "16 lower-case hex digits", "'" + std::string(xx) + "'");
  const auto& chunks = detail::json_arr(c, detail::json_field(c, so, "chunk_xxh3", where + "."), where + ".chunk_xxh3");
  const auto nchunks = chunk_count(size, chunk_size);
  if (chunks.size() != nchunks)
    c.fail(where + ".chunk_xxh3", std::to_string(nchunks) + " entries (size / chunk_size)", std::to_string(chunks.size()));
  chunk_xxh3.resize(chunks.size());
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    const auto h = detail::json_str(c, chunks[k], where + ".chunk_xxh3");
    if (!parse_xxh3_hex(h, chunk_xxh3[k])) c.fail(where + ".chunk_xxh3[" + std::to_string(k) + "]", "16 lower-case hex digits", "'" + std::string(h) + "'");
  }
}

std::string describe_block(const RedundancyBlock& b) {
  return b.kind == RedundancyBlock::Kind::parity
             ? "parity " + std::to_string(b.index) + " of stripe " + std::to_string(b.stripe) + " on node " + std::to_string(b.node) + " ('" + b.path + "', " + std::to_string(b.size) + " bytes)"
             : "replica of rank " + std::to_string(b.rank) + " on node " + std::to_string(b.node) + " ('" + b.path + "', " + std::to_string(b.size) + " bytes)";
}

std::string describe_members(const std::vector<StripePiece>& v) {
  std::string out = "[";
  for (const auto& p : v)
    out += (out.size() > 1 ? ", " : "") + std::string("[") + std::to_string(p.node) + ", " + std::to_string(p.index) + ", " +
           std::to_string(p.offset) + ", " + std::to_string(p.length) + "]";
  return out + "]";
}

// "nodes" and "redundancy_blocks": a layout that holds the world size, and exactly the
// blocks its scheme plans, each with its geometry; a replica's checksums are its shard's.
void decode_nodes(const detail::JsonContext& c, const json::object& o, Manifest& m) {
  const auto* nv = o.if_contains("nodes");
  const auto* bv = o.if_contains("redundancy_blocks");
  if (!nv) {
    if (bv) c.fail("redundancy_blocks", "absent without \"nodes\"", "present");
    return;
  }
  const json::object& no = detail::json_obj(c, *nv, "nodes");
  NodeLayout l;
  l.nodes = static_cast<int>(detail::json_u64(c, detail::json_field(c, no, "count", "nodes."), "nodes.count", kMaxWorldSize));
  l.ranks_per_node =
      static_cast<int>(detail::json_u64(c, detail::json_field(c, no, "ranks_per_node", "nodes."), "nodes.ranks_per_node", kMaxWorldSize));
  const auto scheme_text = detail::json_str(c, detail::json_field(c, no, "redundancy", "nodes."), "nodes.redundancy");
  const auto scheme = parse_redundancy(scheme_text);
  if (!scheme) c.fail("nodes.redundancy", "none, replicate:F, replicate:F/J or rs:K+M", "'" + std::string(scheme_text) + "'");
  l.scheme = *scheme;
  if (const auto problem = layout_problem(l, m.world_size)) c.fail("nodes", "a layout for world_size " + std::to_string(m.world_size), *problem);
  const auto sizes = shard_sizes(m);
  auto planned = planned_blocks(l, sizes);
  const auto stripes = rs_stripes(l, sizes);
  const json::array empty;
  const json::array& blocks = bv ? detail::json_arr(c, *bv, "redundancy_blocks") : empty;
  if (blocks.size() != planned.size())
    c.fail("redundancy_blocks", std::to_string(planned.size()) + " blocks (" + redundancy_name(l.scheme) + " over " + std::to_string(l.nodes) + " nodes)",
           std::to_string(blocks.size()));
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::string where = "redundancy_blocks[" + std::to_string(i) + "]";
    const json::object& bo = detail::json_obj(c, blocks[i], where);
    RedundancyBlock& want = planned[i];
    RedundancyBlock got;
    const auto kind = detail::json_str(c, detail::json_field(c, bo, "kind", where + "."), where + ".kind");
    if (kind != "parity" && kind != "replica") c.fail(where + ".kind", "parity or replica", "'" + std::string(kind) + "'");
    got.kind = kind == "parity" ? RedundancyBlock::Kind::parity : RedundancyBlock::Kind::replica;
    got.node = static_cast<int>(detail::json_u64(c, detail::json_field(c, bo, "node", where + "."), where + ".node", kMaxWorldSize));
    if (got.kind == RedundancyBlock::Kind::parity) {
      got.stripe = static_cast<int>(detail::json_u64(c, detail::json_field(c, bo, "stripe", where + "."), where + ".stripe", kMaxWorldSize));
      got.index = static_cast<int>(detail::json_u64(c, detail::json_field(c, bo, "index", where + "."), where + ".index", 255));
    } else {
      got.rank = static_cast<int>(detail::json_u64(c, detail::json_field(c, bo, "rank", where + "."), where + ".rank", kMaxWorldSize));
    }
    got.path = std::string(detail::json_str(c, detail::json_field(c, bo, "path", where + "."), where + ".path"));
    if (!is_plain_file_name(got.path))
      throw Error(Errc::unsafe_path, std::string(c.file), where + ".path", "a plain file name inside the checkpoint directory", "'" + got.path + "'");
    got.size = detail::json_u64(c, detail::json_field(c, bo, "size", where + "."), where + ".size", kMaxFileSize);
    if (got.kind != want.kind || got.node != want.node || got.stripe != want.stripe || got.index != want.index || got.rank != want.rank ||
        got.path != want.path || got.size != want.size)
      c.fail(where, describe_block(want), describe_block(got));
    if (got.kind == RedundancyBlock::Kind::parity) {
      const auto& ma = detail::json_arr(c, detail::json_field(c, bo, "members", where + "."), where + ".members");
      std::vector<StripePiece> members;
      for (std::size_t j = 0; j < ma.size() && j <= 255; ++j) {
        const auto& e = detail::json_arr(c, ma[j], where + ".members[" + std::to_string(j) + "]");
        if (e.size() != 4) c.fail(where + ".members[" + std::to_string(j) + "]", "[node, piece, offset, length]", std::to_string(e.size()) + " entries");
        members.push_back({static_cast<int>(detail::json_u64(c, e[0], where + ".members", kMaxWorldSize)),
                           static_cast<int>(detail::json_u64(c, e[1], where + ".members", 255)), detail::json_u64(c, e[2], where + ".members"),
                           detail::json_u64(c, e[3], where + ".members")});
      }
      const auto& geometry = stripes[static_cast<std::size_t>(got.stripe)].data;
      if (members != geometry) c.fail(where + ".members", describe_members(geometry) + " (the stripe geometry of the shard sizes)", describe_members(members));
    }
    decode_checksums(c, bo, where, got.size, m.chunk_size, got.sha256, got.xxh3, got.chunk_xxh3);
    if (got.kind == RedundancyBlock::Kind::replica) {
      const ShardRecord& s = m.shards[static_cast<std::size_t>(got.rank)];
      if (got.sha256 != s.sha256 || got.xxh3 != s.xxh3 || got.chunk_xxh3 != s.chunk_xxh3)
        c.fail(where, "the checksums of rank " + std::to_string(got.rank) + "'s shard (sha256 " + s.sha256 + ")", "sha256 " + got.sha256);
    }
    m.redundancy.push_back(std::move(got));
  }
  m.nodes = l;
}

// The field checks, on a document parse_manifest_json bounded.
Manifest decode_manifest_value(const json::value& root, std::string_view file) {
  const detail::JsonContext c{Errc::malformed_manifest, file};
  const json::object& o = detail::json_obj(c, root, "manifest");
  Manifest m;

  const auto& sv = detail::json_field(c, o, "schema_version", "");
  if (!sv.is_int64() && !sv.is_uint64()) c.fail("schema_version", "integer", detail::json_kind(sv));
  if (!(sv.is_int64() && sv.get_int64() >= kOldestSchemaVersion && sv.get_int64() <= kFilesPerRankSchemaVersion))
    throw Error(Errc::unsupported_schema, std::string(file), "schema_version",
                std::to_string(kOldestSchemaVersion) + " to " + std::to_string(kFilesPerRankSchemaVersion),
                sv.is_int64() ? std::to_string(sv.get_int64()) : std::to_string(sv.get_uint64()));
  m.schema_version = static_cast<int>(sv.get_int64());

  m.world_size = static_cast<int>(detail::json_u64(c, detail::json_field(c, o, "world_size", ""), "world_size", kMaxWorldSize));
  if (m.world_size < 1) c.fail("world_size", "at least 1", "0");
  m.step = detail::json_u64(c, detail::json_field(c, o, "step", ""), "step");
  const auto& wc = detail::json_field(c, o, "wall_clock_seconds", "");
  if (!wc.is_number()) c.fail("wall_clock_seconds", "number", detail::json_kind(wc));
  m.wall_clock_seconds = wc.to_number<double>();
  if (!std::isfinite(m.wall_clock_seconds) || m.wall_clock_seconds < 0)
    c.fail("wall_clock_seconds", "finite non-negative number", json::serialize(wc));
  m.created_at = std::string(detail::json_str(c, detail::json_field(c, o, "created_at", ""), "created_at"));
  m.chunk_size = detail::json_u64(c, detail::json_field(c, o, "chunk_size", ""), "chunk_size", kMaxChunk);
  if (m.chunk_size < kMinChunk || (m.chunk_size & (m.chunk_size - 1)) != 0)
    c.fail("chunk_size", "a power of two from 4096 to 2^30", std::to_string(m.chunk_size));
  m.param_numel = detail::json_u64(c, detail::json_field(c, o, "param_numel", ""), "param_numel");
  if (const auto* t = o.if_contains("training")) json_of(m.training) = detail::json_obj(c, *t, "training");
  if (!all_finite(json_of(m.training))) c.fail("training", "finite numbers", "a number beyond the double range");
  untag_object(json_of(m.training));

  // The shard table: one file per rank below schema 3, placed by rank; from schema 3 each
  // entry names its (rank, part), and the table is sorted into (rank, part) order and must
  // hold parts 0..n-1 of every rank.
  const bool parts = m.schema_version >= kFilesPerRankSchemaVersion;
  const auto& shards = detail::json_arr(c, detail::json_field(c, o, "shards", ""), "shards");
  if (!parts && shards.size() != static_cast<std::size_t>(m.world_size))
    c.fail("shards", std::to_string(m.world_size) + " entries (world_size)", std::to_string(shards.size()));
  if (parts && shards.size() < static_cast<std::size_t>(m.world_size))
    c.fail("shards", "at least " + std::to_string(m.world_size) + " entries (world_size)", std::to_string(shards.size()));
  m.shards.resize(shards.size());
  std::vector<bool> seen(static_cast<std::size_t>(m.world_size), false);
  std::set<std::pair<int, int>> seen_parts;
  std::set<std::string_view> paths;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const std::string where = "shards[" + std::to_string(i) + "]";
    const json::object& so = detail::json_obj(c, shards[i], where);
    const auto rank = detail::json_u64(c, detail::json_field(c, so, "rank", where + "."), where + ".rank",
                                       static_cast<std::uint64_t>(m.world_size - 1));
    int part = 0;
    if (parts) {
      part = static_cast<int>(detail::json_u64(c, detail::json_field(c, so, "part", where + "."), where + ".part", kMaxFileParts - 1));
      if (!seen_parts.insert({static_cast<int>(rank), part}).second)
        c.fail(where, "each (rank, part) once", "rank " + std::to_string(rank) + " part " + std::to_string(part) + " repeated");
    } else {
      if (so.contains("part")) c.fail(where + ".part", "absent below schema_version 3", "present");
      if (seen[rank]) c.fail(where + ".rank", "each rank once", "rank " + std::to_string(rank) + " repeated");
    }
    seen[rank] = true;
    ShardRecord& s = m.shards[parts ? i : rank];
    s.rank = static_cast<int>(rank);
    s.part = part;
    s.path = std::string(detail::json_str(c, detail::json_field(c, so, "path", where + "."), where + ".path"));
    if (!is_plain_file_name(s.path))
      throw Error(Errc::unsafe_path, std::string(file), where + ".path", "a plain file name inside the checkpoint directory",
                  "'" + s.path + "'");
    s.size = detail::json_u64(c, detail::json_field(c, so, "size", where + "."), where + ".size", kMaxFileSize);
    decode_checksums(c, so, where, s.size, m.chunk_size, s.sha256, s.xxh3, s.chunk_xxh3);
    if (part != 0) {
      // The rank's param range and metadata are its part 0's alone.
      for (const char* f : {"param_shard_offset", "param_shard_numel", "metadata"})
        if (so.contains(f)) c.fail(where + "." + f, "absent from a part other than 0 (part 0 carries the rank's)", "present");
      continue;
    }
    s.param_shard_offset = detail::json_u64(c, detail::json_field(c, so, "param_shard_offset", where + "."), where + ".param_shard_offset");
    s.param_shard_numel = detail::json_u64(c, detail::json_field(c, so, "param_shard_numel", where + "."), where + ".param_shard_numel");
    std::uint64_t end;
    if (__builtin_add_overflow(s.param_shard_offset, s.param_shard_numel, &end) || end > m.param_numel)
      c.fail(where + ".param_shard_offset + param_shard_numel", "at most param_numel " + std::to_string(m.param_numel),
             std::to_string(s.param_shard_offset) + " + " + std::to_string(s.param_shard_numel));
    if (const auto* md = so.if_contains("metadata")) json_of(s.metadata) = detail::json_obj(c, *md, where + ".metadata");
    if (!all_finite(json_of(s.metadata))) c.fail(where + ".metadata", "finite numbers", "a number beyond the double range");
    untag_object(json_of(s.metadata));
  }
  if (parts) {
    std::sort(m.shards.begin(), m.shards.end(), [](const ShardRecord& a, const ShardRecord& b) {
      return std::pair(a.rank, a.part) < std::pair(b.rank, b.part);
    });
    for (std::size_t i = 0; i < m.shards.size(); ++i) {
      const int want = i > 0 && m.shards[i - 1].rank == m.shards[i].rank ? m.shards[i - 1].part + 1 : 0;
      if (m.shards[i].part != want)
        c.fail("shards[rank " + std::to_string(m.shards[i].rank) + "].part", "parts 0..n-1 of each rank: part " + std::to_string(want),
               "part " + std::to_string(m.shards[i].part));
    }
    for (int r = 0; r < m.world_size; ++r)
      if (!seen[static_cast<std::size_t>(r)]) c.fail("shards", "a file for every rank", "none for rank " + std::to_string(r));
  }
  for (const auto& s : m.shards)
    if (!paths.insert(s.path).second)
      c.fail("shards[rank " + std::to_string(s.rank) + (parts ? " part " + std::to_string(s.part) : std::string()) + "].path", "a path used once",
             "'" + s.path + "' repeated");

  const auto& tensors = detail::json_arr(c, detail::json_field(c, o, "tensors", ""), "tensors");
  m.tensors.reserve(tensors.size());
  std::set<std::pair<int, std::string_view>> names;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::string where = "tensors[" + std::to_string(i) + "]";
    const json::object& to = detail::json_obj(c, tensors[i], where);
    TensorRecord t;
    t.name = std::string(detail::json_str(c, detail::json_field(c, to, "name", where + "."), where + ".name"));
    t.rank = static_cast<int>(detail::json_u64(c, detail::json_field(c, to, "rank", where + "."), where + ".rank",
                                               static_cast<std::uint64_t>(m.world_size - 1)));
    auto type = detail::json_tensor_type(c, to, where);
    t.dtype = type.dtype;
    t.shape = std::move(type.shape);
    const std::uint64_t bytes = type.bytes;
    const auto& br = detail::json_arr(c, detail::json_field(c, to, "byte_range", where + "."), where + ".byte_range");
    if (br.size() != 2) c.fail(where + ".byte_range", "2 entries", std::to_string(br.size()));
    t.begin = detail::json_u64(c, br[0], where + ".byte_range[0]");
    t.end = detail::json_u64(c, br[1], where + ".byte_range[1]");
    if (const auto* pv = to.if_contains("part")) {
      if (!parts) c.fail(where + ".part", "absent below schema_version 3", "present");
      t.part = static_cast<int>(detail::json_u64(c, *pv, where + ".part", kMaxFileParts - 1));
    }
    const auto files = m.files_of(t.rank);
    if (static_cast<std::size_t>(t.part) >= files.size())
      c.fail(where + ".part", "a part of rank " + std::to_string(t.rank) + "'s shard (0.." + std::to_string(files.size() - 1) + ")",
             std::to_string(t.part));
    const auto fsize = files[static_cast<std::size_t>(t.part)].size;
    if (t.begin > t.end || t.end > fsize)
      c.fail(where + ".byte_range", "begin <= end <= shard size " + std::to_string(fsize),
             "[" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "]");
    if (t.end - t.begin != bytes)
      c.fail(where + ".byte_range", std::to_string(bytes) + " bytes (shape x dtype)", std::to_string(t.end - t.begin) + " bytes");
    decode_sharding(c, to, where, m, t);
    m.tensors.push_back(std::move(t));
  }
  for (const auto& t : m.tensors) {
    if (!names.insert({t.rank, t.name}).second)
      c.fail("tensors", "unique names per rank", "'" + t.name + "' repeated on rank " + std::to_string(t.rank));
  }
  // A replicated tensor is the tensor of each holder: no holder may hold another of its name.
  for (const auto& t : m.tensors)
    if (t.sharding && t.sharding->kind == TensorSharding::Kind::replicated)
      for (std::size_t k = 1; k < t.sharding->holders.size(); ++k)
        if (!names.insert({t.sharding->holders[k], t.name}).second)
          c.fail("tensors", "unique names per rank (a replicated tensor counts on each holder)",
                 "'" + t.name + "' repeated on rank " + std::to_string(t.sharding->holders[k]));
  check_slices(c, m);
  if (parts && o.contains("nodes") && m.has_file_parts())
    c.fail("nodes", "one file per rank (a node set's redundancy is planned over each rank's one file)", "a rank in several files");
  decode_nodes(c, o, m);
  return m;
}

}  // namespace

TensorSharding sharding_from_json(const json::object& entry, std::string_view file, std::string_view where) {
  const detail::JsonContext c{Errc::malformed_manifest, file};
  auto s = parse_sharding(c, entry, std::string(where));
  if (!s) c.fail(where, "one of slice, replicated, rank_local", "none");
  return *s;
}

Manifest decode_manifest(std::uint64_t size, const ManifestTextSource& source, std::string_view file) {
  Manifest m;
  detail::parse_manifest_json(size, source, file, [&](const json::value& root) { m = decode_manifest_value(root, file); });
  return m;
}

Manifest decode_manifest(std::string_view text, std::string_view file) {
  return decode_manifest(text.size(), [text](std::uint64_t offset) { return text.substr(static_cast<std::size_t>(offset)); }, file);
}

}  // namespace ckpt
