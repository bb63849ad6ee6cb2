// SPDX-License-Identifier: Apache-2.0
// The two passes of a bounded manifest parse (manifest_limits.hpp): the scan, a SAX handler
// that classifies every value by where the schema puts it and counts it, and the parse into
// a document whose memory resource keeps to the budget the scan's counts allow.
#include "ckpt/format/manifest_limits.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/memory_resource.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/stream_parser.hpp>
#include <cstring>
#include <functional>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/format/detail/manifest_parse.hpp"

namespace ckpt {

namespace json = boost::json;

std::uint64_t manifest_allowance(const ManifestCounts& c) noexcept {
  return kAllowanceBase + c.shards * kAllowancePerShard + c.chunks * kAllowancePerChunk + c.tensors * kAllowancePerTensor +
         c.dims * kAllowancePerDim + c.shardings * kAllowancePerSharding + c.holders * kAllowancePerHolder +
         2 * (c.schema_string_bytes + c.free_form_bytes + c.outside_schema_bytes);
}

std::uint64_t manifest_memory_budget(const ManifestCounts& c) noexcept {
  return kBudgetBase + c.values * kBudgetPerValue + c.members * kBudgetPerMember + c.long_strings * kBudgetPerLongString +
         c.string_bytes * kBudgetPerStringByte;
}

namespace detail {

namespace {

std::atomic<std::uint64_t> g_decodes{0};
thread_local ManifestParseStats t_last;

json::parse_options manifest_parse_options() {
  json::parse_options opt;
  opt.max_depth = kMaxManifestDepth;
  return opt;
}

[[noreturn]] void fail(std::string_view file, std::string detail, std::string expected, std::string actual) {
  throw Error(Errc::malformed_manifest, std::string(file), std::move(detail), std::move(expected), std::move(actual));
}

[[noreturn]] void fail_json(std::string_view file, const boost::system::error_code& ec) {
  if (ec == json::error::too_deep)
    fail(file, "nesting of objects and arrays", "at most " + std::to_string(kMaxManifestDepth) + " levels", "more");
  fail(file, "manifest JSON", "valid JSON", ec.message());
}

// Where the schema puts a value. free_form and outside are regions: every value below one is
// of the same role.
enum class Role : std::uint8_t {
  root, shards, shard, chunks, tensors, tensor, shape, byte_range, slice, replicated, holders, scalar, free_form, outside
};

constexpr std::array<std::string_view, 11> kRootKeys = {"schema_version", "format",    "world_size", "step",
                                                         "wall_clock_seconds", "created_at", "chunk_size", "param_numel",
                                                         "shards",         "tensors",   "training"};
constexpr std::array<std::string_view, 9> kShardKeys = {"rank", "path", "size", "sha256", "xxh3", "chunk_xxh3",
                                                        "param_shard_offset", "param_shard_numel", "metadata"};
constexpr std::array<std::string_view, 8> kTensorKeys = {"name", "rank", "dtype", "shape", "byte_range", "slice", "replicated", "rank_local"};
constexpr int kFirstShardingKey = 5;  // slice, replicated, rank_local: one sharding description each
constexpr std::array<std::string_view, 4> kSliceKeys = {"global", "global_shape", "offsets", "lengths"};
constexpr std::array<std::string_view, 1> kReplicatedKeys = {"holders"};
constexpr std::size_t kMaxKnownKey = 18;  // "wall_clock_seconds", "param_shard_offset"
constexpr std::uint32_t kMaxDims = 64;    // decode_manifest's limit
constexpr std::size_t kInlineString = 14;  // Boost.JSON's small-string buffer (64-bit)

enum class Kind { object, array, scalar };

// The members of the top level, a shard entry and a tensor entry that hold a container (the
// key names are unique across the three); every other known member holds a scalar.
struct Container {
  std::string_view key;
  Kind kind;
  Role role;
};
constexpr std::array<Container, 13> kContainers = {{{"shards", Kind::array, Role::shards},
                                                   {"tensors", Kind::array, Role::tensors},
                                                   {"training", Kind::object, Role::free_form},
                                                   {"chunk_xxh3", Kind::array, Role::chunks},
                                                   {"metadata", Kind::object, Role::free_form},
                                                   {"shape", Kind::array, Role::shape},
                                                   {"byte_range", Kind::array, Role::byte_range},
                                                   {"slice", Kind::object, Role::slice},
                                                   {"replicated", Kind::object, Role::replicated},
                                                   {"global_shape", Kind::array, Role::shape},
                                                   {"offsets", Kind::array, Role::shape},
                                                   {"lengths", Kind::array, Role::shape},
                                                   {"holders", Kind::array, Role::holders}}};

// The scan's SAX handler (Boost.JSON's basic_parser requirements). It allocates nothing per
// value: a frame per open container (at most kMaxManifestDepth) and the current key's first
// bytes.
class ScanHandler {
 public:
  static constexpr std::size_t max_array_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_object_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_string_size = static_cast<std::size_t>(-1);
  static constexpr std::size_t max_key_size = static_cast<std::size_t>(-1);

  explicit ScanHandler(std::string_view file) : file_(file) { frames_.reserve(kMaxManifestDepth + 1); }

  ManifestCounts counts;

  bool on_document_begin(boost::system::error_code&) { return true; }
  bool on_document_end(boost::system::error_code&) { return true; }
  bool on_object_begin(boost::system::error_code&) { return open(Kind::object); }
  bool on_object_end(std::size_t, boost::system::error_code&) { return close(); }
  bool on_array_begin(boost::system::error_code&) { return open(Kind::array); }
  bool on_array_end(std::size_t, boost::system::error_code&) { return close(); }
  bool on_string_part(json::string_view, std::size_t n, boost::system::error_code&) {
    check_string(n);
    return true;
  }
  bool on_string(json::string_view, std::size_t n, boost::system::error_code&) {
    check_string(n);
    counts.string_bytes += n;
    counts.long_strings += n > kInlineString;
    scalar(n + 2, n);
    return true;
  }
  bool on_key_part(json::string_view s, std::size_t n, boost::system::error_code&) {
    check_key(n);
    take_key(s);
    return true;
  }
  bool on_key(json::string_view s, std::size_t n, boost::system::error_code&) {
    check_key(n);
    take_key(s);
    end_key(n);
    return true;
  }
  bool on_number_part(json::string_view s, boost::system::error_code&) {
    number_bytes_ += s.size();
    return true;
  }
  bool on_int64(std::int64_t, json::string_view s, boost::system::error_code&) { return number(s); }
  bool on_uint64(std::uint64_t, json::string_view s, boost::system::error_code&) { return number(s); }
  bool on_double(double, json::string_view s, boost::system::error_code&) { return number(s); }
  bool on_bool(bool b, boost::system::error_code&) {
    scalar(b ? 4 : 5, 0);
    return true;
  }
  bool on_null(boost::system::error_code&) {
    scalar(4, 0);
    return true;
  }
  bool on_comment_part(json::string_view, boost::system::error_code&) { return true; }
  bool on_comment(json::string_view, boost::system::error_code&) { return true; }

 private:
  struct Frame {
    Role role;
    std::uint32_t seen = 0;      // known keys met so far (bit per key), for root, shard and tensor
    std::uint32_t elements = 0;  // values so far, for arrays
    int key = -1;                // the current member's known key, or -1 (unknown or repeated)
    bool object = false;
  };

  std::string_view file_;
  std::vector<Frame> frames_;
  std::array<char, kMaxKnownKey + 1> key_{};
  std::size_t key_len_ = 0;
  std::uint64_t number_bytes_ = 0;
  std::string first_outside_;  // where the first value outside the schema was met

  static std::span<const std::string_view> known_keys(Role r) {
    switch (r) {
      case Role::root: return kRootKeys;
      case Role::shard: return kShardKeys;
      case Role::tensor: return kTensorKeys;
      case Role::slice: return kSliceKeys;
      case Role::replicated: return kReplicatedKeys;
      default: return {};
    }
  }

  // The path of the current position, for messages (built only when one is needed): down
  // the schema's containers, stopping at a region.
  std::string where() const {
    std::string out;
    for (const Frame& f : frames_) {
      if (f.role == Role::free_form || f.role == Role::outside) break;
      if (!f.object) {
        out.push_back('[');
        out.append(std::to_string(f.elements ? f.elements - 1 : 0));
        out.push_back(']');
      } else if (f.key >= 0) {
        if (!out.empty()) out.push_back('.');
        out.append(known_keys(f.role)[static_cast<std::size_t>(f.key)]);
      } else {
        break;
      }
    }
    return out.empty() ? "the top level" : out;
  }

  void check_string(std::size_t n) const {
    if (n > kMaxManifestStringBytes)
      fail(file_, "length of the string at " + where(), "at most " + std::to_string(kMaxManifestStringBytes) + " bytes",
           "more than " + std::to_string(kMaxManifestStringBytes) + " bytes");
  }
  void check_key(std::size_t n) {
    frames_.back().key = -1;  // a new member begins: the previous one's key no longer applies
    if (n > kMaxManifestKeyBytes)
      fail(file_, "length of a key in " + where(), "at most " + std::to_string(kMaxManifestKeyBytes) + " bytes",
           "more than " + std::to_string(kMaxManifestKeyBytes) + " bytes");
  }

  void take_key(json::string_view s) {
    const std::size_t n = std::min(s.size(), key_.size() - key_len_);
    std::memcpy(key_.data() + key_len_, s.data(), n);
    key_len_ += n;
  }

  Role region() const { return frames_.empty() ? Role::root : frames_.back().role; }

  void end_key(std::size_t n) {
    ++counts.members;
    counts.string_bytes += n;
    Frame& f = frames_.back();
    f.key = -1;
    const auto keys = known_keys(f.role);
    if (n <= kMaxKnownKey)
      for (std::size_t i = 0; i < keys.size(); ++i)
        if (keys[i] == std::string_view(key_.data(), key_len_)) {
          if ((f.seen >> i) & 1u) break;  // repeated: the parser keeps one, the other is outside
          f.seen |= 1u << i;
          f.key = static_cast<int>(i);
        }
    if (f.role == Role::free_form) {
      add_free_form(n + 3, 0);
    } else if (f.role == Role::outside || f.key < 0) {
      if (first_outside_.empty() && f.role != Role::outside) {
        const std::string at = where();
        first_outside_ = (at == "the top level" ? "" : at + ".") + "\"" + std::string(key_.data(), std::min(key_len_, kMaxKnownKey)) +
                         (n > kMaxKnownKey ? "...\"" : "\"");
      }
      add_outside(n + 3);
    }
    key_len_ = 0;
  }

  // The role of a value about to start inside the current container.
  Role classify(Kind k) {
    if (frames_.empty()) return k == Kind::object ? Role::root : Role::outside;
    Frame& p = frames_.back();
    const std::uint32_t index = p.elements++;
    switch (p.role) {
      case Role::free_form:
      case Role::outside: return p.role;
      case Role::root:
      case Role::shard:
      case Role::tensor:
      case Role::slice:
      case Role::replicated: {
        if (p.key < 0) return Role::outside;
        if (p.role == Role::tensor && p.key >= kFirstShardingKey) ++counts.shardings;
        const std::string_view key = known_keys(p.role)[static_cast<std::size_t>(p.key)];
        for (const auto& c : kContainers)
          if (c.key == key) return k == c.kind ? c.role : Role::outside;
        return k == Kind::scalar ? Role::scalar : Role::outside;
      }
      case Role::shards: return k == Kind::object ? Role::shard : Role::outside;
      case Role::chunks:
        if (k != Kind::scalar) return Role::outside;
        ++counts.chunks;
        return Role::scalar;
      case Role::tensors: return k == Kind::object ? Role::tensor : Role::outside;
      case Role::shape:
        if (k != Kind::scalar || index >= kMaxDims) return Role::outside;
        ++counts.dims;
        return Role::scalar;
      case Role::byte_range: return k == Kind::scalar && index < 2 ? Role::scalar : Role::outside;
      case Role::holders:
        if (k != Kind::scalar) return Role::outside;
        ++counts.holders;
        return Role::scalar;
      case Role::scalar: break;
    }
    return Role::outside;
  }

  void add_free_form(std::uint64_t bytes, std::uint64_t values) {
    counts.free_form_bytes += bytes;
    counts.free_form_values += values;
    const std::uint64_t max_bytes = kFreeFormBytes + kFreeFormBytesPerShard * counts.shards;
    const std::uint64_t max_values = kFreeFormValues + kFreeFormValuesPerShard * counts.shards;
    if (counts.free_form_bytes > max_bytes)
      fail(file_, "size of the free-form parts (training and the shards' metadata), at " + where(),
           "at most " + std::to_string(max_bytes) + " bytes", "more than " + std::to_string(max_bytes) + " bytes");
    if (counts.free_form_values > max_values)
      fail(file_, "values in the free-form parts (training and the shards' metadata), at " + where(),
           "at most " + std::to_string(max_values) + " values", "more than " + std::to_string(max_values) + " values");
  }

  void add_outside(std::uint64_t bytes) {
    if (first_outside_.empty()) first_outside_ = where();
    counts.outside_schema_bytes += bytes;
    if (counts.outside_schema_bytes > kOutsideSchemaBytes)
      fail(file_, "content outside the manifest schema (unknown or repeated fields, or values of the wrong kind; the first at " +
                      first_outside_ + ")",
           "at most " + std::to_string(kOutsideSchemaBytes) + " bytes", "more than " + std::to_string(kOutsideSchemaBytes) + " bytes");
  }

  // One value: `text` compact bytes, with its separator added here.
  void account(Role r, std::uint64_t text, std::uint64_t string_bytes) {
    ++counts.values;
    if (r == Role::free_form) add_free_form(text + 1, 1);
    else if (r == Role::outside) add_outside(text + 1);
    else counts.schema_string_bytes += string_bytes;
  }

  void scalar(std::uint64_t text, std::uint64_t string_bytes) { account(classify(Kind::scalar), text, string_bytes); }

  bool number(json::string_view s) {
    const std::uint64_t text = number_bytes_ + s.size();
    number_bytes_ = 0;
    scalar(text, 0);
    return true;
  }

  bool open(Kind k) {
    const Role r = classify(k);
    account(r, 2, 0);
    if (r == Role::shard) ++counts.shards;
    if (r == Role::tensor) ++counts.tensors;
    frames_.push_back(Frame{.role = r, .object = k == Kind::object});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }
};

bool all_whitespace(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; });
}

// Feeds the `size` bytes of `source` to `feed(piece, last)`, piece by piece (one empty last
// piece for empty text).
void for_each_piece(std::uint64_t size, const ManifestTextSource& source, std::string_view file,
                    const std::function<void(std::string_view, bool)>& feed) {
  if (size == 0) feed({}, true);
  for (std::uint64_t offset = 0; offset < size;) {
    const std::string_view piece = source(offset);
    if (piece.empty()) fail(file, "manifest text", std::to_string(size) + " bytes", std::to_string(offset) + " bytes");
    const std::string_view part = piece.substr(0, static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), size - offset)));
    offset += part.size();
    feed(part, offset == size);
  }
}

ManifestCounts scan(std::uint64_t size, const ManifestTextSource& source, std::string_view file) {
  json::basic_parser<ScanHandler> p(manifest_parse_options(), file);
  boost::system::error_code ec;
  bool done = false;
  for_each_piece(size, source, file, [&](std::string_view part, bool last) {
    // After the document only whitespace may follow (as the parse of pass 2 requires).
    if (done) {
      if (!all_whitespace(part)) fail_json(file, json::error::extra_data);
      return;
    }
    const std::size_t used = p.write_some(!last, part.data(), part.size(), ec);
    if (ec) fail_json(file, ec);
    done = p.done();
    if (used < part.size() && !all_whitespace(part.substr(used))) fail_json(file, json::error::extra_data);
    if (last && !done) fail_json(file, json::error::incomplete);
  });
  return p.handler().counts;
}

// Counts what the parser and the document hold, as glibc's malloc reserves it (a chunk: the
// request plus an 8-byte header, rounded to 16, at least 32), and refuses past the budget.
class BudgetResource final : public json::memory_resource {
 public:
  BudgetResource(std::uint64_t budget, std::string file) : budget_(budget), file_(std::move(file)) {}
  std::uint64_t peak() const noexcept { return peak_; }

 private:
  static std::uint64_t charge(std::size_t n) noexcept { return std::max<std::uint64_t>(32, (n + 8 + 15) & ~std::uint64_t{15}); }

  void* do_allocate(std::size_t n, std::size_t align) override {
    const std::uint64_t c = charge(n);
    if (held_ + c > budget_)
      throw Error(Errc::malformed_manifest, file_, "memory of the parsed manifest (the budget of its counted content)",
                  "at most " + std::to_string(budget_) + " bytes", "more than " + std::to_string(budget_) + " bytes");
    void* p = align > __STDCPP_DEFAULT_NEW_ALIGNMENT__ ? ::operator new(n, std::align_val_t(align)) : ::operator new(n);
    held_ += c;
    peak_ = std::max(peak_, held_);
    return p;
  }
  void do_deallocate(void* p, std::size_t n, std::size_t align) override {
    if (align > __STDCPP_DEFAULT_NEW_ALIGNMENT__) ::operator delete(p, std::align_val_t(align));
    else ::operator delete(p);
    held_ -= charge(n);
  }
  bool do_is_equal(const json::memory_resource& other) const noexcept override { return this == &other; }

  std::uint64_t budget_, held_ = 0, peak_ = 0;
  std::string file_;
};

}  // namespace

}  // namespace detail

void check_free_form(const JsonObject& metadata, const JsonObject& training, std::string_view what) {
  // Where the manifest puts them, so that the scan classifies them as it does there.
  const std::string text = R"({"shards":[{"metadata":)" + metadata.dump() + R"(}],"training":)" + training.dump() + "}";
  try {
    detail::scan(text.size(), [&text](std::uint64_t offset) { return std::string_view(text).substr(static_cast<std::size_t>(offset)); }, "");
  } catch (const Error& e) {
    throw Error(Errc::invalid_argument, {}, std::string(what) + " cannot be held by a manifest: " + e.detail(), e.expected(), e.actual());
  }
}

namespace detail {

void parse_manifest_json(std::uint64_t size, const ManifestTextSource& source, std::string_view file,
                         const std::function<void(const json::value&)>& use, ManifestParseStats* stats_out) {
  if (size > kMaxManifestBytes)
    fail(file, "file size", "at most " + std::to_string(kMaxManifestBytes) + " bytes", std::to_string(size) + " bytes");
  ManifestParseStats stats;
  stats.size = size;
  stats.counts = scan(size, source, file);
  stats.allowance = manifest_allowance(stats.counts);
  const ManifestCounts& c = stats.counts;
  if (size > stats.allowance)
    fail(file,
         "file size against what its content needs (" + std::to_string(c.shards) + " shards, " + std::to_string(c.chunks) +
             " chunk checksums, " + std::to_string(c.tensors) + " tensors, " + std::to_string(c.free_form_bytes) +
             " bytes of training and metadata; docs/format.md)",
         "at most " + std::to_string(stats.allowance) + " bytes", std::to_string(size) + " bytes");
  stats.budget = manifest_memory_budget(c);
  // The resource outlives the parser and the document (declared first, destroyed last).
  BudgetResource resource(stats.budget, std::string(file));
  {
    const json::storage_ptr sp(&resource);
    json::value root;
    {
      json::stream_parser p(sp, manifest_parse_options());
      p.reset(sp);
      boost::system::error_code ec;
      for_each_piece(size, source, file, [&](std::string_view part, bool) {
        p.write(part.data(), part.size(), ec);
        if (ec) fail_json(file, ec);
      });
      p.finish(ec);
      if (ec) fail_json(file, ec);
      root = p.release();
    }
    stats.peak = resource.peak();
    g_decodes.fetch_add(1, std::memory_order_relaxed);
    t_last = stats;
    if (stats_out) *stats_out = stats;
    use(root);
  }
}

ManifestParseStats last_manifest_parse() noexcept { return t_last; }
std::uint64_t manifest_decode_count() noexcept { return g_decodes.load(std::memory_order_relaxed); }

}  // namespace detail
}  // namespace ckpt
