// SPDX-License-Identifier: Apache-2.0
#include "hostile/corpus.hpp"

#include "ckpt/format/boost_json.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "ckpt/core/random.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/shard/shard_writer.hpp"
#include "ckpt/fs/layout.hpp"

namespace ckpt::hostile {

namespace json = boost::json;

namespace {

constexpr std::uint64_t kU64Max = UINT64_MAX;
constexpr std::uint64_t k2Pow63 = 1ull << 63;
// N of the good shards: their JSON header padded so that the data starts at 4096.
constexpr std::size_t kHeaderLength = 4096 - 8;

// One rank's tensors: several dtypes, an empty and a scalar tensor, and two 8000-byte tensors
// that span the 4096-byte chunks.
struct Payload {
  std::vector<std::vector<std::byte>> blobs;
  std::vector<TensorView> views;
};

Payload make_payload(int rank, std::uint64_t step, bool small) {
  struct Spec {
    const char* name;
    DType t;
    std::vector<std::uint64_t> shape;
  };
  const std::uint64_t rows = small ? 2 : 40, cols = small ? 3 : 50;
  const std::vector<Spec> specs = {{"weights", DType::F32, {rows, cols}}, {"adam.m", DType::F32, {rows * cols}}, {"step", DType::I64, {1}},
                                   {"half", DType::F16, {3, small ? 1u : 5u}}, {"flags", DType::BOOL, {small ? 2u : 7u}},
                                   {"empty", DType::F32, {0}}, {"scalar", DType::F64, {}}};
  Payload p;
  std::uint64_t seed = step * 1000 + static_cast<std::uint64_t>(rank);
  for (const auto& s : specs) {
    std::uint64_t n = dtype_size(s.t);
    for (auto d : s.shape) n *= d;
    std::vector<std::byte> b(n);
    for (auto& x : b) x = static_cast<std::byte>(splitmix64(seed) & (s.t == DType::BOOL ? 1 : 0xff));
    p.blobs.push_back(std::move(b));
  }
  for (std::size_t i = 0; i < specs.size(); ++i) p.views.push_back({specs[i].name, specs[i].t, specs[i].shape, p.blobs[i], std::nullopt});
  // Schema 2 descriptions, on rank 0 only (so that damage to rank 1's entries stays a matter
  // of rank 1's shard): its weights are the one slice of a global tensor, its step rank-local.
  if (rank == 0) {
    p.views[0].sharding = slice_of("weights.global", {rows, cols}, {0, 0}, {rows, cols});
    p.views[2].sharding = rank_local();
  }
  return p;
}

Manifest save(MemoryFileSystem& fs, std::uint64_t step, bool small) {
  std::vector<Payload> payloads;
  for (int r = 0; r < kWorld; ++r) payloads.push_back(make_payload(r, step, small));
  SaveRequest req;
  req.step = step;
  req.wall_clock_seconds = static_cast<double>(step) * 1.5;
  req.param_numel = 1000u * kWorld;
  req.chunk_size = kChunk;
  json_of(req.training)["lr_schedule"] = json::object{{"kind", "cosine"}, {"base_lr", 3e-4}};
  for (int r = 0; r < kWorld; ++r) {
    RankState rs;
    rs.tensors = payloads[static_cast<std::size_t>(r)].views;
    rs.param_shard_offset = 1000u * static_cast<std::uint64_t>(r);
    rs.param_shard_numel = 1000;
    json_of(rs.metadata)["data_position"] = static_cast<std::int64_t>(step * 4 + static_cast<std::uint64_t>(r));
    req.ranks.push_back(std::move(rs));
  }
  return save_checkpoint_sync(fs, kRoot, req);
}

std::string le64(std::uint64_t n) {
  std::string f(8, '\0');
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return f;
}

std::uint64_t read_le64(std::string_view b) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(b[static_cast<std::size_t>(i)]);
  return n;
}

void write_text(MemoryFileSystem& fs, const std::string& path, std::string_view text) { fs.put_file(path, text); }

// --- case builders ---

struct Builder {
  const GoodRoot& g;
  std::vector<Case> out;
  std::string category;

  void add(std::string name, std::function<void(MemoryFileSystem&)> damage, Errc code, std::string file, Stage stage,
           std::string detail = {}, double max_seconds = 1.0) {
    out.push_back({category, std::move(name), std::move(damage), code, std::move(file), stage, std::move(detail), max_seconds});
  }
  // Edits the latest manifest as a JSON object.
  void manifest(std::string name, std::function<void(json::object&)> edit, Errc code, Stage stage = Stage::open,
                std::string file = {}, double max_seconds = 1.0) {
    const std::string dir = g.latest_dir;
    add(std::move(name),
        [dir, edit](MemoryFileSystem& fs) {
          json::object o = manifest_object(fs, dir);
          edit(o);
          write_manifest_object(fs, dir, o);
        },
        code, file.empty() ? g.manifest_path() : file, stage, {}, max_seconds);
  }
  // Replaces the latest manifest's text.
  void manifest_text(std::string name, std::function<std::string(std::string)> edit, Errc code) {
    const std::string path = g.manifest_path();
    add(std::move(name), [path, edit](MemoryFileSystem& fs) { write_text(fs, path, edit(read_text(fs, path))); }, code, path,
        Stage::open);
  }
  // Replaces rank 1's shard file and reseals the manifest: only the shard checks can refuse it.
  void resealed_shard(std::string name, std::function<std::string(const std::string& json, const std::string& data)> make,
                      Errc code = Errc::malformed_shard, double max_seconds = 1.0) {
    const std::string dir = g.latest_dir, path = g.shard_path(1);
    add(std::move(name),
        [dir, path, make](MemoryFileSystem& fs) {
          write_text(fs, path, make(shard_json(fs, path), shard_data(fs, path)));
          reseal(fs, dir, 1);
        },
        code, path, Stage::load, {}, max_seconds);
  }
  // Rank 1's shard header JSON edited as an object, padded back to its original length when it fits.
  void header(std::string name, std::function<void(json::object&)> edit, Errc code = Errc::malformed_shard) {
    resealed_shard(std::move(name), [edit](const std::string& text, const std::string& data) {
      json::object h = json::parse(text).as_object();
      edit(h);
      std::string j = json::serialize(h);
      if (j.size() < kHeaderLength) j.resize(kHeaderLength, ' ');
      return shard_bytes(j, data);
    }, code);
  }
  // Rank 1's shard header replaced by raw text, space-padded to the original header length when shorter.
  void header_text(std::string name, std::function<std::string(const std::string& json)> make) {
    resealed_shard(std::move(name), [make](const std::string& text, const std::string& data) {
      std::string j = make(text);
      if (j.size() < kHeaderLength) j.resize(kHeaderLength, ' ');
      return shard_bytes(j, data);
    });
  }
};

json::object& shard_entry(json::object& m, int rank) { return m["shards"].as_array().at(static_cast<std::size_t>(rank)).as_object(); }

json::object& tensor_entry(json::object& m, int rank, std::string_view name) {
  for (auto& t : m["tensors"].as_array()) {
    auto& o = t.as_object();
    if (o["rank"].to_number<std::int64_t>() == rank && o["name"].as_string() == name) return o;
  }
  throw std::logic_error("no tensor " + std::string(name));
}

// Values no count, size, offset or rank may take, with a label for the case name.
std::vector<std::pair<std::string, json::value>> bad_unsigned_values() {
  return {{"-1", json::value(-1)},
          {"1.5", json::value(1.5)},
          {"1e300", json::value(1e300)},
          {"-1e300", json::value(-1e300)},
          {"string", json::value("1")},
          {"null", json::value(nullptr)},
          {"true", json::value(true)},
          {"array", json::value(json::array{1})},
          {"object", json::value(json::object{})}};
}

std::string nested(std::size_t depth, char open, char close) { return std::string(depth, open) + std::string(depth, close); }

}  // namespace

// --- GoodRoot ---

std::string GoodRoot::manifest_path() const { return join_path(latest_dir, kManifestName); }
std::string GoodRoot::shard_path(int rank) const { return join_path(latest_dir, latest.shard(rank).path); }
std::string GoodRoot::latest_pointer() const { return join_path(kRoot, kLatestName); }

GoodRoot make_good_root(bool small) {
  GoodRoot g;
  g.previous = save(g.fs, kPreviousStep, small);
  g.latest = save(g.fs, kLatestStep, small);
  g.previous_dir = join_path(kRoot, checkpoint_dir_name(kPreviousStep));
  g.latest_dir = join_path(kRoot, checkpoint_dir_name(kLatestStep));
  return g;
}

// --- building blocks ---

std::string read_text(const MemoryFileSystem& fs, const std::string& path) {
  const auto b = fs.file_bytes(path);
  if (!b) throw std::logic_error("corpus: no file " + path);
  return std::string(reinterpret_cast<const char*>(b->data()), b->size());
}

json::object manifest_object(const MemoryFileSystem& fs, const std::string& dir) {
  return json::parse(read_text(fs, join_path(dir, kManifestName))).as_object();
}

void write_manifest_object(MemoryFileSystem& fs, const std::string& dir, const json::object& o) {
  write_text(fs, join_path(dir, kManifestName), json::serialize(o));
}

void reseal(MemoryFileSystem& fs, const std::string& dir, int rank) {
  json::object m = manifest_object(fs, dir);
  json::object& s = shard_entry(m, rank);
  const std::string path = join_path(dir, std::string(s["path"].as_string()));
  const auto bytes = fs.file_bytes(path).value();
  FileHasher h(m["chunk_size"].to_number<std::uint64_t>());
  h.update(bytes);
  const FileDigest d = h.finish();
  s["size"] = d.size;
  s["sha256"] = d.sha256;
  s["xxh3"] = xxh3_hex(d.xxh3);
  json::array chunks;
  for (auto c : d.chunk_xxh3) chunks.emplace_back(xxh3_hex(c));
  s["chunk_xxh3"] = std::move(chunks);
  write_manifest_object(fs, dir, m);
}

std::string shard_bytes(std::string_view json_text, std::string_view data) {
  return le64(json_text.size()) + std::string(json_text) + std::string(data);
}

std::string shard_json(const MemoryFileSystem& fs, const std::string& path) {
  const std::string f = read_text(fs, path);
  const std::uint64_t n = read_le64(f);
  std::string j = f.substr(8, n);
  while (!j.empty() && j.back() == ' ') j.pop_back();
  return j;
}

std::string shard_data(const MemoryFileSystem& fs, const std::string& path) {
  const std::string f = read_text(fs, path);
  return f.substr(8 + read_le64(f));
}

void write_many_tensor_checkpoint(MemoryFileSystem& fs, const std::string& root, std::uint64_t step, std::size_t tensor_count) {
  std::vector<std::byte> data(tensor_count);
  std::vector<TensorView> views;
  views.reserve(tensor_count);
  for (std::size_t i = 0; i < tensor_count; ++i) {
    data[i] = static_cast<std::byte>(i * 31);
    char name[32];
    std::snprintf(name, sizeof name, "t%07zu", i);
    views.push_back({name, DType::U8, {1}, std::span(data).subspan(i, 1)});
  }
  const ShardHeader header = plan_shard(views, {{"ckpt.rank", "0"}});
  std::string file = encode_shard_header(header);
  for (const auto& t : header.tensors) file.push_back(static_cast<char>(data[std::stoul(t.name.substr(1))]));
  FileHasher hasher(kDefaultChunkSize);
  hasher.update(std::as_bytes(std::span(file.data(), file.size())));
  const FileDigest d = hasher.finish();
  Manifest m;
  m.world_size = 1;
  m.step = step;
  m.created_at = utc_now_rfc3339();
  m.param_numel = tensor_count;
  ShardRecord s;
  s.path = shard_file_name(0, 1);
  s.size = d.size;
  s.sha256 = d.sha256;
  s.xxh3 = d.xxh3;
  s.chunk_xxh3 = d.chunk_xxh3;
  s.param_shard_numel = tensor_count;
  m.shards.push_back(s);
  m.tensors = tensor_records(header, 0);
  const std::string dir = join_path(root, checkpoint_dir_name(step));
  fs.put_file(join_path(dir, s.path), file);
  fs.put_file(join_path(dir, kManifestName), encode_manifest(m));
  fs.put_file(join_path(root, kLatestName), checkpoint_dir_name(step) + "\n");
}

// --- the cases ---

std::vector<Case> bit_flip_cases(const GoodRoot& g) {
  Builder b{g, {}, "flip"};
  const std::string path = g.shard_path(1);
  const std::string file = read_text(g.fs, path);
  const std::uint64_t size = file.size(), data_start = 8 + read_le64(file);
  const std::uint64_t json_end = 8 + shard_json(g.fs, path).size();
  // Every region: header length, JSON, padding, tensor data; positions spread over each,
  // chunk boundaries and both ends included; bits vary with the position.
  std::vector<std::pair<std::string, std::uint64_t>> at;
  for (std::uint64_t i = 0; i < 8; ++i) at.push_back({"length", i});
  for (std::uint64_t i = 8; i < json_end; i += 29) at.push_back({"json", i});
  at.push_back({"json", json_end - 1});
  for (std::uint64_t i = json_end; i < data_start; i += 331) at.push_back({"padding", i});
  at.push_back({"padding", data_start - 1});
  for (std::uint64_t i = data_start; i < size; i += 257) at.push_back({"data", i});
  for (std::uint64_t k = 1; k * kChunk < size; ++k)
    for (std::uint64_t i : {k * kChunk - 1, k * kChunk}) at.push_back({"data", i});
  at.push_back({"data", size - 1});
  std::sort(at.begin(), at.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
  at.erase(std::unique(at.begin(), at.end(), [](const auto& x, const auto& y) { return x.second == y.second; }), at.end());
  for (const auto& [region, pos] : at) {
    for (int bit : {static_cast<int>(pos % 8), static_cast<int>((pos + 5) % 8)}) {
      const std::uint64_t p = pos;
      const std::string detail = "chunk " + std::to_string(p / kChunk) + " of";
      b.add("shard1 " + region + " byte " + std::to_string(p) + " bit " + std::to_string(bit),
            [path, p, bit](MemoryFileSystem& fs) {
              std::string f = read_text(fs, path);
              f[p] = static_cast<char>(f[p] ^ (1 << bit));
              fs.put_file(path, f);
            },
            Errc::checksum_mismatch, path, Stage::load, detail);
      b.out.back().checksums_only = true;
      if (region != "length") break;  // every bit of the length prefix, two per position elsewhere
    }
  }
  // Every bit of the header length, resealed: the checksums agree, the header cannot.
  for (int byte = 0; byte < 8; ++byte)
    for (int bit = 0; bit < 8; ++bit)
      b.resealed_shard("resealed length byte " + std::to_string(byte) + " bit " + std::to_string(bit),
                       [byte, bit](const std::string& j, const std::string& data) {
                         std::string j2 = j;
                         j2.resize(kHeaderLength, ' ');
                         std::string f = shard_bytes(j2, data);
                         f[static_cast<std::size_t>(byte)] = static_cast<char>(f[static_cast<std::size_t>(byte)] ^ (1 << bit));
                         return f;
                       });
  // A flipped bit in the padding, resealed: the JSON then has trailing garbage.
  for (std::uint64_t i = json_end; i < data_start; i += 509)
    b.resealed_shard("resealed padding byte " + std::to_string(i), [i](const std::string& j, const std::string& data) {
      std::string j2 = j;
      j2.resize(kHeaderLength, ' ');
      j2[i - 8] = static_cast<char>(j2[i - 8] ^ 0x01);
      return shard_bytes(j2, data);
    });
  return std::move(b.out);
}

std::vector<Case> truncation_cases(const GoodRoot& g) {
  Builder b{g, {}, "truncate"};
  const std::string path = g.shard_path(1), dir = g.latest_dir;
  const std::uint64_t size = g.latest.shard(1).size, json_end = 8 + shard_json(g.fs, path).size();
  std::vector<std::uint64_t> cuts = {0, 1, 4, 7, 8, 9, 16, 100, json_end - 1, json_end, 4095, 4096, 4097};
  for (std::uint64_t i = 4096 + 97; i < size; i += 997) cuts.push_back(i);
  for (std::uint64_t k = 2; k * kChunk < size; ++k) cuts.push_back(k * kChunk);
  cuts.push_back(size - 1);
  for (std::uint64_t keep : cuts) {
    b.add("shard1 cut to " + std::to_string(keep) + " bytes",
          [path, keep](MemoryFileSystem& fs) { fs.put_file(path, read_text(fs, path).substr(0, keep)); }, Errc::size_mismatch, path,
          Stage::open, "shard size");
    // Resealed, and the index trimmed of the tensors past the cut: a consistent manifest for a
    // cut shard, so only the shard's own header can tell.
    b.add("shard1 cut to " + std::to_string(keep) + " bytes, resealed",
          [path, dir, keep](MemoryFileSystem& fs) {
            fs.put_file(path, read_text(fs, path).substr(0, keep));
            reseal(fs, dir, 1);
            json::object m = manifest_object(fs, dir);
            json::array kept;
            for (auto& t : m["tensors"].as_array())
              if (t.as_object()["rank"].to_number<int>() != 1 || t.as_object()["byte_range"].as_array()[1].to_number<std::uint64_t>() <= keep)
                kept.push_back(t);
            m["tensors"] = std::move(kept);
            write_manifest_object(fs, dir, m);
          },
          Errc::malformed_shard, path, Stage::load);
  }
  // The manifest cut anywhere before its closing brace.
  const std::string mtext = read_text(g.fs, g.manifest_path());
  const std::size_t last = mtext.rfind('}');
  for (std::size_t keep = 0; keep < last; keep += (keep < 16 ? 1 : 23))
    b.manifest_text("manifest cut to " + std::to_string(keep) + " bytes", [keep](std::string t) { return t.substr(0, keep); },
                    Errc::malformed_manifest);
  b.manifest_text("manifest cut before its last brace", [last](std::string t) { return t.substr(0, last); }, Errc::malformed_manifest);
  return std::move(b.out);
}

std::vector<Case> shard_set_cases(const GoodRoot& g) {
  Builder b{g, {}, "shards"};
  const std::string dir = g.latest_dir;
  for (int r = 0; r < kWorld; ++r) {
    const std::string p = g.shard_path(r);
    b.add("shard" + std::to_string(r) + " missing", [p](MemoryFileSystem& fs) { fs.remove_all(p); }, Errc::missing_shard, p, Stage::open);
  }
  const std::string s0 = g.shard_path(0), s1 = g.shard_path(1);
  b.add("shard1 renamed", [s1](MemoryFileSystem& fs) { fs.rename(s1, s1 + ".bak"); }, Errc::missing_shard, s1, Stage::open);
  b.add("shard1 renamed to a hidden name", [s1, dir](MemoryFileSystem& fs) { fs.rename(s1, join_path(dir, ".rank1")); },
        Errc::missing_shard, s1, Stage::open);
  b.add("shard0 and shard1 swapped",
        [s0, s1, dir](MemoryFileSystem& fs) {
          fs.rename(s0, join_path(dir, "x"));
          fs.rename(s1, s0);
          fs.rename(join_path(dir, "x"), s1);
        },
        Errc::checksum_mismatch, s0, Stage::load);
  b.out.back().checksums_only = true;  // the two shards' headers are alike
  const std::string old1 = join_path(g.previous_dir, g.previous.shard(1).path);
  b.add("shard1 replaced by the previous checkpoint's shard1",
        [s1, old1](MemoryFileSystem& fs) { fs.put_file(s1, read_text(fs, old1)); }, Errc::checksum_mismatch, s1, Stage::load);
  b.out.back().checksums_only = true;
  b.add("shard1 is a directory", [s1](MemoryFileSystem& fs) {
    fs.remove_all(s1);
    fs.create_dir(s1);
  }, Errc::unsafe_path, s1, Stage::open);
  b.add("shard1 is a special file", [s1](MemoryFileSystem& fs) { fs.put_special(s1); }, Errc::unsafe_path, s1, Stage::open);
  b.add("manifest missing", [m = g.manifest_path()](MemoryFileSystem& fs) { fs.remove_all(m); }, Errc::not_found, g.manifest_path(),
        Stage::open);
  b.add("manifest is a directory", [m = g.manifest_path()](MemoryFileSystem& fs) {
    fs.remove_all(m);
    fs.create_dir(m);
  }, Errc::unsafe_path, g.manifest_path(), Stage::open);
  b.add("manifest is a special file", [m = g.manifest_path()](MemoryFileSystem& fs) { fs.put_special(m); }, Errc::unsafe_path,
        g.manifest_path(), Stage::open);
  b.add("manifest is a symlink to the previous manifest",
        [m = g.manifest_path(), prev = join_path(g.previous_dir, kManifestName)](MemoryFileSystem& fs) { fs.put_symlink(m, prev); },
        Errc::unsafe_path, g.manifest_path(), Stage::open);
  b.manifest("a third shard listed at world size 2", [](json::object& m) {
    json::object extra = shard_entry(m, 1);
    extra["rank"] = 2;
    m["shards"].as_array().push_back(extra);
  }, Errc::malformed_manifest);
  b.manifest("one shard listed at world size 2", [](json::object& m) { m["shards"].as_array().pop_back(); }, Errc::malformed_manifest);
  b.manifest("no shards listed", [](json::object& m) { m["shards"] = json::array{}; }, Errc::malformed_manifest);
  b.manifest("duplicate rank 0", [](json::object& m) { shard_entry(m, 1)["rank"] = 0; }, Errc::malformed_manifest);
  b.manifest("duplicate path", [](json::object& m) { shard_entry(m, 1)["path"] = shard_entry(m, 0)["path"]; }, Errc::malformed_manifest);
  // World size 3 with a third shard whose file is absent, then present but unindexed.
  const std::string s2 = join_path(dir, shard_file_name(2, 2));
  auto third = [](json::object& m) {
    m["world_size"] = 3;
    m["param_numel"] = 3000;
    json::object extra = shard_entry(m, 1);
    extra["rank"] = 2;
    extra["path"] = shard_file_name(2, 2);
    extra["param_shard_offset"] = 2000;
    m["shards"].as_array().push_back(extra);
  };
  b.manifest("a third shard listed, its file absent", third, Errc::missing_shard, Stage::open, s2);
  b.add("a third shard listed, its file a copy of shard1 with no index entries",
        [dir, third, s1, s2](MemoryFileSystem& fs) {
          json::object m = manifest_object(fs, dir);
          third(m);
          write_manifest_object(fs, dir, m);
          fs.put_file(s2, read_text(fs, s1));
        },
        Errc::malformed_shard, s2, Stage::load);
  return std::move(b.out);
}

std::vector<Case> path_cases(const GoodRoot& g) {
  Builder b{g, {}, "paths"};
  const std::string s1 = g.shard_path(1);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"absolute", "/etc/passwd"},
      {"absolute into the root", join_path(g.previous_dir, g.previous.shard(1).path)},
      {"dot dot", ".."},
      {"dot", "."},
      {"dot dot slash", "../step-0000000010/" + g.previous.shard(1).path},
      {"deep dot dot", "../../../../../../etc/shadow"},
      {"subdirectory", "sub/" + g.latest.shard(1).path},
      {"backslash", "..\\..\\x.safetensors"},
      {"hidden", ".rank-00001-of-00002.safetensors"},
      {"empty", ""},
      {"embedded NUL", std::string("rank-00001\0/../../x", 19)},
      {"256 bytes", std::string(256, 'a')},
  };
  for (const auto& [label, value] : bad)
    b.manifest("shard path " + label, [value = value](json::object& m) { shard_entry(m, 1)["path"] = value; }, Errc::unsafe_path);
  b.manifest("shard path a number", [](json::object& m) { shard_entry(m, 1)["path"] = 1; }, Errc::malformed_manifest);
  // Symlinks where the shard should be: to a copy outside the root, back into the previous
  // checkpoint, dangling, and looping.
  b.add("shard1 symlink to a copy outside the root",
        [s1](MemoryFileSystem& fs) {
          fs.put_file("/outside/rank1.safetensors", read_text(fs, s1));
          fs.put_symlink(s1, "/outside/rank1.safetensors");
        },
        Errc::unsafe_path, s1, Stage::open);
  b.add("shard1 relative symlink into the previous checkpoint",
        [s1, name = g.previous.shard(1).path](MemoryFileSystem& fs) { fs.put_symlink(s1, "../step-0000000010/" + name); },
        Errc::unsafe_path, s1, Stage::open);
  b.add("shard1 dangling symlink", [s1](MemoryFileSystem& fs) { fs.put_symlink(s1, "/nowhere/x"); }, Errc::unsafe_path, s1, Stage::open);
  b.add("shard1 symlink loop", [s1](MemoryFileSystem& fs) { fs.put_symlink(s1, s1); }, Errc::unsafe_path, s1, Stage::open);
  // The step directory `latest` names is itself a symlink: to a whole checkpoint outside the
  // root (its manifest and shards all regular files there), or to the previous checkpoint.
  b.add("step directory a symlink to a checkpoint outside the root",
        [dir = g.latest_dir](MemoryFileSystem& fs) {
          fs.create_dirs("/outside");
          fs.rename(dir, "/outside/step-0000000020");
          fs.put_symlink(dir, "/outside/step-0000000020");
        },
        Errc::unsafe_path, g.latest_dir, Stage::open, "step directory is a symlink");
  b.add("step directory a relative symlink to the previous checkpoint",
        [dir = g.latest_dir](MemoryFileSystem& fs) {
          fs.remove_all(dir);
          fs.put_symlink(dir, "step-0000000010");
        },
        Errc::unsafe_path, g.latest_dir, Stage::open, "step directory is a symlink");
  return std::move(b.out);
}

std::vector<Case> number_cases(const GoodRoot& g) {
  Builder b{g, {}, "numbers"};
  const std::string s1 = g.shard_path(1);
  const std::uint64_t size1 = g.latest.shard(1).size;
  using Edit = std::function<json::value&(json::object&)>;
  auto field = [](std::string k) -> Edit { return [k](json::object& m) -> json::value& { return m[k]; }; };
  auto shard_field = [](std::string k) -> Edit { return [k](json::object& m) -> json::value& { return shard_entry(m, 1)[k]; }; };
  auto tensor_field = [](std::string k) -> Edit { return [k](json::object& m) -> json::value& { return tensor_entry(m, 1, "weights")[k]; }; };
  auto tensor_item = [](std::string k, std::size_t i) -> Edit {
    return [k, i](json::object& m) -> json::value& { return tensor_entry(m, 1, "weights")[k].as_array().at(i); };
  };
  auto set = [&](const std::string& label, Edit where, json::value v, Errc code, Stage stage = Stage::open, std::string file = {}) {
    b.manifest(label, [where, v](json::object& m) { where(m) = v; }, code, stage, std::move(file));
  };
  // Every unsigned field refuses every non-unsigned value.
  const std::vector<std::pair<std::string, Edit>> unsigned_fields = {
      {"world_size", field("world_size")},
      {"step", field("step")},
      {"chunk_size", field("chunk_size")},
      {"param_numel", field("param_numel")},
      {"shards.rank", shard_field("rank")},
      {"shards.size", shard_field("size")},
      {"shards.param_shard_offset", shard_field("param_shard_offset")},
      {"shards.param_shard_numel", shard_field("param_shard_numel")},
      {"tensors.rank", tensor_field("rank")},
      {"tensors.shape.0", tensor_item("shape", 0)},
      {"tensors.byte_range.0", tensor_item("byte_range", 0)},
      {"tensors.byte_range.1", tensor_item("byte_range", 1)},
  };
  for (const auto& [label, where] : unsigned_fields)
    for (const auto& [vlabel, v] : bad_unsigned_values()) set(label + " = " + vlabel, where, v, Errc::malformed_manifest);
  // Out of range, overflowing, or beyond the file.
  const std::vector<std::tuple<std::string, Edit, json::value, Errc, std::string>> ranged = {
      {"world_size = 0", field("world_size"), json::value(0), Errc::malformed_manifest, ""},
      {"world_size = 3", field("world_size"), json::value(3), Errc::malformed_manifest, ""},
      {"world_size = 2^20 + 1", field("world_size"), json::value((1 << 20) + 1), Errc::malformed_manifest, ""},
      {"world_size = 2^63", field("world_size"), json::value(k2Pow63), Errc::malformed_manifest, ""},
      {"world_size = 2^64 - 1", field("world_size"), json::value(kU64Max), Errc::malformed_manifest, ""},
      {"step = 2^64 - 1", field("step"), json::value(kU64Max), Errc::malformed_manifest, ""},
      {"step = 10, the previous directory's", field("step"), json::value(10), Errc::malformed_manifest, ""},
      {"chunk_size = 0", field("chunk_size"), json::value(0), Errc::malformed_manifest, ""},
      {"chunk_size = 4095", field("chunk_size"), json::value(4095), Errc::malformed_manifest, ""},
      {"chunk_size = 4097", field("chunk_size"), json::value(4097), Errc::malformed_manifest, ""},
      {"chunk_size = 2^31", field("chunk_size"), json::value(1ull << 31), Errc::malformed_manifest, ""},
      {"chunk_size = 2^64 - 1", field("chunk_size"), json::value(kU64Max), Errc::malformed_manifest, ""},
      {"chunk_size = 8192, chunk digests for 4096", field("chunk_size"), json::value(8192), Errc::malformed_manifest, ""},
      {"param_numel = 1999, below the shards' ranges", field("param_numel"), json::value(1999), Errc::malformed_manifest, ""},
      {"shards.rank = 2", shard_field("rank"), json::value(2), Errc::malformed_manifest, ""},
      {"shards.rank = 2^64 - 1", shard_field("rank"), json::value(kU64Max), Errc::malformed_manifest, ""},
      {"shards.size = 2^64 - 1", shard_field("size"), json::value(kU64Max), Errc::malformed_manifest, ""},
      {"shards.size = 2^63", shard_field("size"), json::value(k2Pow63), Errc::malformed_manifest, ""},
      {"shards.size = 2^50 + 1", shard_field("size"), json::value((1ull << 50) + 1), Errc::malformed_manifest, ""},
      {"shards.size = 0", shard_field("size"), json::value(0), Errc::malformed_manifest, ""},
      {"shards.size = one chunk more", shard_field("size"), json::value(size1 + kChunk), Errc::malformed_manifest, ""},
      {"shards.size = one byte beyond the file", shard_field("size"), json::value(size1 + 1), Errc::size_mismatch, s1},
      {"shards.size = one byte short of the file, the last tensor past it", shard_field("size"), json::value(size1 - 1), Errc::malformed_manifest, ""},
      {"shards.param_shard_offset = 2^64 - 1", shard_field("param_shard_offset"), json::value(kU64Max), Errc::malformed_manifest, ""},
      {"shards.param_shard_offset = 1001", shard_field("param_shard_offset"), json::value(1001), Errc::malformed_manifest, ""},
      {"shards.param_shard_numel = 2^64 - 1", shard_field("param_shard_numel"), json::value(kU64Max), Errc::malformed_manifest, ""},
      {"tensors.rank = 2", tensor_field("rank"), json::value(2), Errc::malformed_manifest, ""},
      {"tensors.shape.0 = 2^63", tensor_item("shape", 0), json::value(k2Pow63), Errc::malformed_manifest, ""},
      {"tensors.shape.0 = 2^64 - 1", tensor_item("shape", 0), json::value(kU64Max), Errc::malformed_manifest, ""},
      {"tensors.byte_range.0 = 2^64 - 1", tensor_item("byte_range", 0), json::value(kU64Max), Errc::malformed_manifest, ""},
      {"tensors.byte_range.1 = 2^64 - 1", tensor_item("byte_range", 1), json::value(kU64Max), Errc::malformed_manifest, ""},
      {"tensors.byte_range.1 beyond the file end", tensor_item("byte_range", 1), json::value(size1 + 4), Errc::malformed_manifest, ""},
  };
  for (const auto& [label, where, v, code, file] : ranged)
    set(label, where, v, code, Stage::open, file);
  b.manifest("tensors.shape with 65 dimensions", [](json::object& m) {
    json::array s;
    for (int i = 0; i < 65; ++i) s.push_back(1);
    tensor_entry(m, 1, "weights")["shape"] = s;
  }, Errc::malformed_manifest);
  b.manifest("tensors.shape overflowing the byte count", [](json::object& m) {
    tensor_entry(m, 1, "weights")["shape"] = json::array{1ull << 32, 1ull << 32};
  }, Errc::malformed_manifest);
  b.manifest("tensors.byte_range with 3 entries", [](json::object& m) { tensor_entry(m, 1, "weights")["byte_range"].as_array().push_back(0); },
             Errc::malformed_manifest);
  b.manifest("tensors.byte_range reversed", [](json::object& m) {
    auto& br = tensor_entry(m, 1, "weights")["byte_range"].as_array();
    std::swap(br[0], br[1]);
  }, Errc::malformed_manifest);
  b.manifest("wall_clock_seconds = -1", [](json::object& m) { m["wall_clock_seconds"] = -1.0; }, Errc::malformed_manifest);
  b.manifest("wall_clock_seconds = string", [](json::object& m) { m["wall_clock_seconds"] = "1"; }, Errc::malformed_manifest);
  // schema_version: any other integer is a version this build cannot read; anything else is malformed.
  for (const auto& [label, v] : std::vector<std::pair<std::string, json::value>>{{"0", json::value(0)},
                                                                                  {"4", json::value(4)},
                                                                                  {"99", json::value(99)},
                                                                                  {"-1", json::value(-1)},
                                                                                  {"2^63", json::value(k2Pow63)},
                                                                                  {"2^64 - 1", json::value(kU64Max)}})
    set("future schema_version " + label, field("schema_version"), v, Errc::unsupported_schema);
  for (const auto& [label, v] : std::vector<std::pair<std::string, json::value>>{{"1.0", json::value(1.0)},
                                                                                  {"string", json::value("1")},
                                                                                  {"null", json::value(nullptr)},
                                                                                  {"array", json::value(json::array{1})}})
    set("schema_version = " + label, field("schema_version"), v, Errc::malformed_manifest);
  return std::move(b.out);
}

std::vector<Case> index_cases(const GoodRoot& g) {
  Builder b{g, {}, "index"};
  const std::string s0 = g.shard_path(0), s1 = g.shard_path(1);
  auto at_load = [&](const std::string& label, std::function<void(json::object&)> edit, const std::string& file) {
    b.manifest(label, std::move(edit), Errc::malformed_shard, Stage::load, file);
  };
  at_load("adam.m overlapping weights", [](json::object& m) {
    tensor_entry(m, 1, "adam.m")["byte_range"] = tensor_entry(m, 1, "weights")["byte_range"];
  }, s1);
  at_load("weights shifted 4 bytes up, a hole before it", [](json::object& m) {
    auto& br = tensor_entry(m, 1, "weights")["byte_range"].as_array();
    br[0] = br[0].to_number<std::uint64_t>() + 4;
    br[1] = br[1].to_number<std::uint64_t>() + 4;
  }, s1);
  at_load("weights shifted 4 bytes down, overlapping its neighbour", [](json::object& m) {
    auto& br = tensor_entry(m, 1, "weights")["byte_range"].as_array();
    br[0] = br[0].to_number<std::uint64_t>() - 4;
    br[1] = br[1].to_number<std::uint64_t>() - 4;
  }, s1);
  at_load("empty moved to the file end", [size = g.latest.shard(1).size](json::object& m) {
    tensor_entry(m, 1, "empty")["byte_range"] = json::array{size, size};
  }, s1);
  at_load("weights dtype F32 to I32", [](json::object& m) { tensor_entry(m, 1, "weights")["dtype"] = "I32"; }, s1);
  at_load("weights shape 40x50 to 2000", [](json::object& m) { tensor_entry(m, 1, "weights")["shape"] = json::array{2000}; }, s1);
  at_load("weights renamed", [](json::object& m) { tensor_entry(m, 1, "weights")["name"] = "weightz"; }, s1);
  at_load("weights entry removed", [](json::object& m) {
    auto& ts = m["tensors"].as_array();
    for (auto it = ts.begin(); it != ts.end(); ++it)
      if (it->as_object()["rank"].to_number<int>() == 1 && it->as_object()["name"] == "weights") {
        ts.erase(it);
        break;
      }
  }, s1);
  at_load("a stray entry on rank 1", [](json::object& m) {
    m["tensors"].as_array().push_back(json::object{{"name", "ghost"}, {"rank", 1}, {"dtype", "U8"}, {"shape", json::array{0}}, {"byte_range", json::array{4096, 4096}}});
  }, s1);
  at_load("a rank 1 entry moved to rank 0", [](json::object& m) {
    auto& t = tensor_entry(m, 1, "half");
    t["rank"] = 0;
    t["name"] = "half1";
  }, s0);
  b.manifest("a duplicate name on rank 1", [](json::object& m) { m["tensors"].as_array().push_back(tensor_entry(m, 1, "weights")); },
             Errc::malformed_manifest);
  b.manifest("no index at all", [](json::object& m) { m["tensors"] = json::array{}; }, Errc::malformed_shard, Stage::load, s0);
  return std::move(b.out);
}

std::vector<Case> header_cases(const GoodRoot& g) {
  Builder b{g, {}, "header"};
  auto offs = [](json::object& h, const char* name) -> json::array& { return h[name].as_object()["data_offsets"].as_array(); };
  // Tensor ranges in the header: overlap, hole, past the end, reversed, absurd.
  b.header("adam.m overlapping weights by 4 bytes", [offs](json::object& h) {
    auto& o = offs(h, "adam.m");
    o[0] = o[0].to_number<std::uint64_t>() - 4;
    o[1] = o[1].to_number<std::uint64_t>() - 4;
  });
  b.header("weights shifted 4 bytes up, a hole", [offs](json::object& h) {
    auto& o = offs(h, "weights");
    o[0] = o[0].to_number<std::uint64_t>() + 4;
    o[1] = o[1].to_number<std::uint64_t>() + 4;
  });
  b.header("two tensors at the same offset", [offs](json::object& h) { offs(h, "adam.m") = offs(h, "weights"); });
  b.header("flags removed, bytes after the last tensor", [](json::object& h) { h.erase("flags"); });
  b.header("flags reversed", [offs](json::object& h) {
    auto& o = offs(h, "flags");
    std::swap(o[0], o[1]);
  });
  b.header("flags ending at 2^64 - 1", [offs](json::object& h) { offs(h, "flags")[1] = kU64Max; });
  b.header("empty at 2^64 - 1", [offs](json::object& h) { offs(h, "empty") = json::array{kU64Max, kU64Max}; });
  b.header("flags far beyond the file end", [offs](json::object& h) { offs(h, "flags") = json::array{1ull << 40, (1ull << 40) + 7}; });
  b.resealed_shard("16 bytes after the last tensor", [](const std::string& j, const std::string& data) {
    std::string j2 = j;
    j2.resize(kHeaderLength, ' ');
    return shard_bytes(j2, data + std::string(16, '\0'));
  });
  // Wrong types and shapes of every field of a tensor entry.
  const std::vector<std::pair<std::string, json::value>> bad_offsets = {
      {"negative", json::array{-8, 0}},  {"floats", json::array{0.0, 8.0}}, {"strings", json::array{"0", "8"}},
      {"3 entries", json::array{0, 8, 16}}, {"1 entry", json::array{0}}, {"object", json::object{}}, {"null", nullptr}};
  for (const auto& [label, v] : bad_offsets) b.header("step data_offsets " + label, [v = v](json::object& h) { h["step"].as_object()["data_offsets"] = v; });
  const std::vector<std::pair<std::string, json::value>> bad_shapes = {
      {"negative", json::array{-1}},
      {"float", json::array{1.5}},
      {"string", json::array{"8"}},
      {"element count overflowing", json::array{1ull << 32, 1ull << 32, 1ull << 32}},
      {"byte count overflowing", json::array{1ull << 62}},
      {"a number", json::value(8)},
      {"null", nullptr}};
  for (const auto& [label, v] : bad_shapes) b.header("weights shape " + label, [v = v](json::object& h) { h["weights"].as_object()["shape"] = v; });
  b.header("weights shape with 65 dimensions", [](json::object& h) {
    json::array s;
    for (int i = 0; i < 65; ++i) s.push_back(1);
    h["weights"].as_object()["shape"] = s;
  });
  for (const auto& [label, v] : std::vector<std::pair<std::string, json::value>>{
           {"F99", "F99"}, {"lower case", "f32"}, {"empty", ""}, {"a number", 5}, {"null", nullptr}})
    b.header("weights dtype " + label, [v = v](json::object& h) { h["weights"].as_object()["dtype"] = v; });
  b.header("weights dtype missing", [](json::object& h) { h["weights"].as_object().erase("dtype"); });
  b.header("weights shape missing", [](json::object& h) { h["weights"].as_object().erase("shape"); });
  b.header("weights data_offsets missing", [](json::object& h) { h["weights"].as_object().erase("data_offsets"); });
  b.header("weights with an extra field", [](json::object& h) { h["weights"].as_object()["extra"] = 1; });
  for (const auto& [label, v] : std::vector<std::pair<std::string, json::value>>{
           {"an array", json::array{}}, {"a number", 1}, {"a string", "x"}, {"null", nullptr}})
    b.header("weights entry " + label, [v = v](json::object& h) { h["weights"] = v; });
  b.header("an entry with an empty name", [](json::object& h) { h[""] = h["empty"]; });
  for (const auto& [label, v] : std::vector<std::pair<std::string, json::value>>{{"a number value", json::object{{"k", 1}}},
                                                                                  {"an array", json::array{}},
                                                                                  {"a string", "x"},
                                                                                  {"a nested object", json::object{{"k", json::object{}}}},
                                                                                  {"a null value", json::object{{"k", nullptr}}}})
    b.header("__metadata__ " + label, [v = v](json::object& h) { h["__metadata__"] = v; });
  // Tensors that agree with themselves but not with the manifest index.
  b.header("weights as I32 in the header only", [](json::object& h) { h["weights"].as_object()["dtype"] = "I32"; });
  b.header("weights as 2000 in the header only", [](json::object& h) { h["weights"].as_object()["shape"] = json::array{2000}; });
  b.header("weights renamed in the header only", [](json::object& h) {
    h["weightz"] = h["weights"];
    h.erase("weights");
  });
  // Text that is not the JSON object a header must be.
  for (const auto& [label, text] : std::vector<std::pair<std::string, std::string>>{
           {"an array", "[]"}, {"a string", "\"x\""}, {"a number", "1"}, {"null", "null"}, {"an empty object", "{}"},
           {"empty", ""}, {"an open brace", "{"}, {"all spaces", "    "}})
    b.header_text("header " + label, [text = text](const std::string&) { return text; });
  b.header_text("header with trailing garbage", [](const std::string& j) { return j + "x"; });
  b.header_text("header with a second object", [](const std::string& j) { return j + "{}"; });
  b.header_text("header padded with NUL", [](const std::string& j) { return j + std::string(64, '\0'); });
  b.header_text("header with a byte order mark", [](const std::string& j) { return "\xef\xbb\xbf" + j; });
  b.header_text("header with invalid UTF-8 in a name", [](const std::string& j) {
    std::string t = j;
    t.replace(t.find("\"weights\""), 9, "\"weig\xff\xfes\"");
    return t;
  });
  b.header_text("header with a duplicate key", [](const std::string& j) {
    return j.substr(0, j.size() - 1) + ",\"step\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[8,16]}}";
  });
  b.header_text("header nested 40 levels in __metadata__", [](const std::string& j) {
    return "{\"__metadata__\":{\"k\":" + nested(38, '[', ']') + "}," + j.substr(1);
  });
  b.header_text("header nested 10000 levels", [](const std::string&) { return nested(10000, '[', ']'); });
  // The length prefix against the file: past its end, at its end, huge, zero, cutting the JSON,
  // eating into the data.
  auto prefix = [&](const std::string& label, std::function<std::uint64_t(std::uint64_t json_len, std::uint64_t file_size)> n) {
    b.resealed_shard("length prefix " + label, [n](const std::string& j, const std::string& data) {
      std::string j2 = j;
      j2.resize(kHeaderLength, ' ');
      std::string f = shard_bytes(j2, data);
      const std::string p = le64(n(j.size(), f.size()));
      return p + f.substr(8);
    });
  };
  prefix("one byte past the file", [](std::uint64_t, std::uint64_t fs) { return fs - 8 + 1; });
  prefix("equal to the file size", [](std::uint64_t, std::uint64_t fs) { return fs; });
  prefix("2^64 - 1", [](std::uint64_t, std::uint64_t) { return kU64Max; });
  prefix("2^63", [](std::uint64_t, std::uint64_t) { return k2Pow63; });
  prefix("100 MiB + 1", [](std::uint64_t, std::uint64_t) { return (100ull << 20) + 1; });
  prefix("0", [](std::uint64_t, std::uint64_t) { return 0; });
  prefix("1", [](std::uint64_t, std::uint64_t) { return 1; });
  prefix("cutting the JSON", [](std::uint64_t jl, std::uint64_t) { return jl - 1; });
  prefix("eating 16 data bytes", [](std::uint64_t, std::uint64_t) { return 4096 - 8 + 16; });
  prefix("leaving 8 padding bytes in the data", [](std::uint64_t, std::uint64_t) { return 4096 - 8 - 8; });
  return std::move(b.out);
}

std::vector<Case> manifest_cases(const GoodRoot& g) {
  Builder b{g, {}, "manifest"};
  // Wrong JSON types of every field.
  const std::vector<std::pair<std::string, json::value>> kinds = {{"null", nullptr},     {"true", true},    {"1.5", 1.5},
                                                                  {"-1", -1},            {"string", "x"},   {"array", json::array{}},
                                                                  {"object", json::object{}}};
  const auto good = manifest_object(g.fs, g.latest_dir);
  for (const auto& kv : good) {
    const std::string key(kv.key());
    if (key == "format") continue;  // informative only
    for (const auto& [label, v] : kinds) {
      if (kv.value().kind() == v.kind()) continue;
      if (key == "wall_clock_seconds" && v.is_double()) continue;  // a number is fine
      if (key == "training" && v.is_object()) continue;
      const bool version = key == "schema_version" && v.is_int64();
      b.manifest(key + " as " + label, [key, v = v](json::object& m) { m[key] = v; },
                 version ? Errc::unsupported_schema : Errc::malformed_manifest);
    }
    if (key != "training")  // optional: its absence is fine
      b.manifest(key + " missing", [key](json::object& m) { m.erase(key); }, Errc::malformed_manifest);
  }
  const json::object shard = good.at("shards").as_array().at(1).as_object();
  for (const auto& kv : shard) {
    const std::string key(kv.key());
    for (const auto& [label, v] : kinds) {
      if (kv.value().kind() == v.kind() || (key == "metadata" && v.is_object())) continue;
      b.manifest("shards." + key + " as " + label, [key, v = v](json::object& m) { shard_entry(m, 1)[key] = v; }, Errc::malformed_manifest);
    }
    if (key != "metadata")
      b.manifest("shards." + key + " missing", [key](json::object& m) { shard_entry(m, 1).erase(key); }, Errc::malformed_manifest);
  }
  const json::object tensor = good.at("tensors").as_array().at(0).as_object();
  for (const auto& kv : tensor) {
    const std::string key(kv.key());
    if (key == "slice" || key == "replicated" || key == "rank_local") continue;  // optional: sharding_cases
    for (const auto& [label, v] : kinds) {
      if (kv.value().kind() == v.kind()) continue;
      b.manifest("tensors." + key + " as " + label, [key, v = v](json::object& m) { tensor_entry(m, 1, "weights")[key] = v; },
                 Errc::malformed_manifest);
    }
    b.manifest("tensors." + key + " missing", [key](json::object& m) { tensor_entry(m, 1, "weights").erase(key); }, Errc::malformed_manifest);
  }
  b.manifest("shards entry as an array", [](json::object& m) { m["shards"].as_array()[1] = json::array{}; }, Errc::malformed_manifest);
  b.manifest("tensors entry as a string", [](json::object& m) { m["tensors"].as_array()[0] = "x"; }, Errc::malformed_manifest);
  b.manifest("dtype unknown", [](json::object& m) { tensor_entry(m, 1, "weights")["dtype"] = "F8"; }, Errc::malformed_manifest);
  // Checksum fields that are not what they claim.
  const std::vector<std::tuple<std::string, std::string, std::string>> digests = {
      {"sha256", "upper case", std::string(64, 'A')}, {"sha256", "63 digits", std::string(63, 'a')},
      {"sha256", "not hex", std::string(64, 'g')},     {"xxh3", "upper case", std::string(16, 'A')},
      {"xxh3", "15 digits", std::string(15, 'a')},     {"xxh3", "not hex", std::string(16, 'z')}};
  for (const auto& [key, label, v] : digests)
    b.manifest("shards." + key + " " + label, [key = key, v = v](json::object& m) { shard_entry(m, 1)[key] = v; }, Errc::malformed_manifest);
  b.manifest("shards.chunk_xxh3 entry not hex", [](json::object& m) { shard_entry(m, 1)["chunk_xxh3"].as_array()[0] = "zz"; }, Errc::malformed_manifest);
  b.manifest("shards.chunk_xxh3 entry a number", [](json::object& m) { shard_entry(m, 1)["chunk_xxh3"].as_array()[0] = 1; }, Errc::malformed_manifest);
  b.manifest("shards.chunk_xxh3 one entry short", [](json::object& m) { shard_entry(m, 1)["chunk_xxh3"].as_array().pop_back(); }, Errc::malformed_manifest);
  b.manifest("shards.chunk_xxh3 one entry too many", [](json::object& m) { shard_entry(m, 1)["chunk_xxh3"].as_array().push_back("0000000000000000"); },
             Errc::malformed_manifest);
  // Text that is not a manifest object.
  for (const auto& [label, text] : std::vector<std::pair<std::string, std::string>>{
           {"empty", ""}, {"an array", "[]"}, {"a string", "\"x\""}, {"a number", "1"}, {"null", "null"},
           {"an empty object", "{}"}, {"an open brace", "{"}, {"NUL bytes", std::string(16, '\0')}})
    b.manifest_text("manifest " + label, [text = text](std::string) { return text; }, Errc::malformed_manifest);
  b.manifest_text("manifest with trailing garbage", [](std::string t) { return t + "x"; }, Errc::malformed_manifest);
  b.manifest_text("manifest with a second object", [](std::string t) { return t + "{}"; }, Errc::malformed_manifest);
  b.manifest_text("manifest with a byte order mark", [](std::string t) { return "\xef\xbb\xbf" + t; }, Errc::malformed_manifest);
  b.manifest_text("manifest with invalid UTF-8", [](std::string t) {
    t.replace(t.find("\"created_at\""), 12, "\"creat\xc0\xaf" "d_at\"");
    return t;
  }, Errc::malformed_manifest);
  b.manifest_text("manifest with a NUL inside", [](std::string t) {
    t[t.find("\"step\"") + 1] = '\0';
    return t;
  }, Errc::malformed_manifest);
  // Duplicate keys: the parser keeps the last, which must then be checked like any other.
  b.manifest_text("manifest with world_size twice, 3 last", [](std::string t) { return "{\"world_size\":2," + t.substr(t.find('{') + 1, t.rfind('}') - t.find('{') - 1) + ",\"world_size\":3}"; },
                  Errc::malformed_manifest);
  b.manifest_text("manifest with schema_version twice, 4 last", [](std::string t) { return t.substr(0, t.rfind('}')) + ",\"schema_version\":4}"; },
                  Errc::unsupported_schema);
  // Schema 3 (a rank in several files) names each file's part: a schema 2 table under it is malformed.
  b.manifest("schema_version 3 over a table without parts", [](json::object& m) { m["schema_version"] = 3; }, Errc::malformed_manifest);
  // Deep nesting in the free-form objects and at the top.
  b.manifest("training nested 40 levels", [](json::object& m) {
    json::value v = 1;
    for (int i = 0; i < 40; ++i) v = json::object{{"k", v}};
    m["training"] = v;
  }, Errc::malformed_manifest);
  b.manifest("shard metadata nested 40 levels", [](json::object& m) {
    json::value v = 1;
    for (int i = 0; i < 40; ++i) v = json::array{v};
    shard_entry(m, 1)["metadata"] = json::object{{"k", v}};
  }, Errc::malformed_manifest);
  b.manifest_text("manifest nested 100000 levels", [](std::string) { return nested(100000, '[', ']'); }, Errc::malformed_manifest);
  // Numbers JSON can spell but no manifest may hold.
  b.manifest_text("wall_clock_seconds 1e400", [](std::string t) {
    const auto p = t.find("\"wall_clock_seconds\":");
    const auto e = t.find_first_of(",\n}", p);
    return t.substr(0, p) + "\"wall_clock_seconds\":1e400" + t.substr(e);
  }, Errc::malformed_manifest);
  b.manifest_text("training holding 1e400", [](std::string t) {
    const auto p = t.find("\"training\":");
    const auto e = t.rfind('}');
    return t.substr(0, p) + "\"training\":{\"lr\":1e400}" + t.substr(e);
  }, Errc::malformed_manifest);
  return std::move(b.out);
}

std::vector<Case> latest_cases(const GoodRoot& g) {
  Builder b{g, {}, "latest"};
  const std::string latest = g.latest_pointer();
  auto content = [&](const std::string& label, const std::string& text, Errc code, std::string file = {}) {
    b.add("latest " + label, [latest, text](MemoryFileSystem& fs) { fs.put_file(latest, text); }, code, file.empty() ? latest : file,
          Stage::root);
  };
  b.add("latest missing", [latest](MemoryFileSystem& fs) { fs.remove_all(latest); }, Errc::not_found, latest, Stage::root);
  content("empty", "", Errc::malformed_manifest);
  content("garbage", "garbage\n", Errc::malformed_manifest);
  content("cut", "step-00000", Errc::malformed_manifest);
  content("dot dot", "../step-0000000020\n", Errc::malformed_manifest);
  content("absolute", "/ckpt/step-0000000020\n", Errc::malformed_manifest);
  content("with a NUL", std::string("step-0000000020\0", 16), Errc::malformed_manifest);
  content("naming a temporary", ".tmp-step-0000000020-1-0\n", Errc::malformed_manifest);
  content("4097 bytes", std::string(4097, 's'), Errc::malformed_manifest);
  content("naming an absent checkpoint", "step-0000000099\n", Errc::not_found, join_path(join_path(kRoot, "step-0000000099"), kManifestName));
  b.add("latest a symlink", [latest](MemoryFileSystem& fs) {
    fs.put_file("/outside/latest", "step-0000000020\n");
    fs.put_symlink(latest, "/outside/latest");
  }, Errc::unsafe_path, latest, Stage::root);
  b.add("latest a directory", [latest](MemoryFileSystem& fs) {
    fs.remove_all(latest);
    fs.create_dir(latest);
  }, Errc::unsafe_path, latest, Stage::root);
  b.add("latest a special file", [latest](MemoryFileSystem& fs) { fs.put_special(latest); }, Errc::unsafe_path, latest, Stage::root);
  return std::move(b.out);
}

std::vector<Case> huge_cases(const GoodRoot& g) {
  Builder b{g, {}, "huge"};
  constexpr int kEntries = 100000;
  const std::string dir = g.latest_dir, s1 = g.shard_path(1);
  const std::uint64_t size1 = g.latest.shard(1).size;
  // 100k zero-sized entries added to the shard header: the header tiles, the index disagrees.
  b.resealed_shard("100k extra zero-sized tensors in the shard header", [](const std::string& j, const std::string& data) {
    std::string t = j.substr(0, j.size() - 1);
    const std::string end = std::to_string(data.size());
    for (int i = 0; i < kEntries; ++i)
      t += ",\"z" + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[" + end + "," + end + "]}";
    return shard_bytes(t + "}", data);
  }, Errc::malformed_shard, 2.0);
  // 100k one-byte tensors replacing the header: the index disagrees on the count.
  b.resealed_shard("100k one-byte tensors in the shard header", [](const std::string&, const std::string&) {
    std::string t = "{";
    for (int i = 0; i < kEntries; ++i)
      t += (i ? ",\"t" : "\"t") + std::to_string(i) + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[" + std::to_string(i) + "," +
           std::to_string(i + 1) + "]}";
    return shard_bytes(t + "}", std::string(kEntries, 'x'));
  }, Errc::malformed_shard, 2.0);
  // 100k stray zero-sized entries in the manifest index on rank 1.
  b.manifest("100k extra entries in the manifest index", [size1](json::object& m) {
    auto& ts = m["tensors"].as_array();
    for (int i = 0; i < kEntries; ++i)
      ts.push_back(json::object{{"name", "z" + std::to_string(i)}, {"rank", 1}, {"dtype", "U8"}, {"shape", json::array{0}}, {"byte_range", json::array{size1, size1}}});
  }, Errc::malformed_shard, Stage::load, s1, 2.0);
  // 100k shards at world size 100000: every entry well-formed, the third file absent.
  b.manifest("100k shards in the shard table", [](json::object& m) {
    m["world_size"] = kEntries;
    auto& ss = m["shards"].as_array();
    for (int r = kWorld; r < kEntries; ++r)
      ss.push_back(json::object{{"rank", r}, {"path", shard_file_name(r, kEntries)}, {"size", 0}, {"sha256", std::string(64, '0')},
                                {"xxh3", std::string(16, '0')}, {"chunk_xxh3", json::array{}}, {"param_shard_offset", 0},
                                {"param_shard_numel", 0}});
  }, Errc::missing_shard, Stage::open, join_path(dir, shard_file_name(kWorld, kEntries)), 2.0);
  // A million brackets: the depth limit, not the stack, ends it.
  b.resealed_shard("shard header of a million brackets", [](const std::string&, const std::string& data) {
    return shard_bytes(nested(1000000, '[', ']'), data);
  }, Errc::malformed_shard, 2.0);
  b.manifest_text("manifest of a million brackets", [](std::string) { return nested(1000000, '[', ']'); }, Errc::malformed_manifest);
  b.out.back().max_seconds = 2.0;
  return std::move(b.out);
}

std::vector<Case> sharding_cases(const GoodRoot& g) {
  Builder b{g, {}, "sharding"};
  // Rank 1's weights become the second row slice of the global tensor: [80, 50] in all.
  const auto slice = [](json::object& m, int rank) -> json::object& {
    for (int r = 0; r < kWorld; ++r)
      tensor_entry(m, r, "weights")["slice"] = json::object{{"global", "weights.global"},
                                                            {"global_shape", json::array{40 * kWorld, 50}},
                                                            {"offsets", json::array{40 * r, 0}},
                                                            {"lengths", json::array{40, 50}}};
    return tensor_entry(m, rank, "weights")["slice"].as_object();
  };
  const auto bad = [&](const std::string& label, std::function<void(json::object&)> edit) {
    b.manifest(label, std::move(edit), Errc::malformed_manifest);
  };
  bad("weights slices overlapping", [=](json::object& m) { slice(m, 1)["offsets"] = json::array{20, 0}; });
  bad("weights slices with a gap at the end", [=](json::object& m) {
    slice(m, 0)["global_shape"] = json::array{40 * kWorld + 1, 50};
    slice(m, 1)["global_shape"] = json::array{40 * kWorld + 1, 50};
  });
  bad("weights slices with a gap between them", [=](json::object& m) {
    slice(m, 0)["global_shape"] = json::array{40 * kWorld + 1, 50};
    slice(m, 1)["global_shape"] = json::array{40 * kWorld + 1, 50};
    slice(m, 1)["offsets"] = json::array{41, 0};
  });
  bad("weights slice outside the global shape", [=](json::object& m) { slice(m, 1)["offsets"] = json::array{41, 0}; });
  bad("weights slice offset near 2^64", [=](json::object& m) { slice(m, 1)["offsets"] = json::array{kU64Max - 10, 0}; });
  bad("weights slices of two global shapes", [=](json::object& m) { slice(m, 1)["global_shape"] = json::array{80, 51}; });
  bad("weights slices of two dtypes", [=](json::object& m) {
    slice(m, 1);
    tensor_entry(m, 1, "weights")["dtype"] = "I32";
  });
  bad("weights slice lengths not its shape", [=](json::object& m) { slice(m, 1)["lengths"] = json::array{40, 49}; });
  bad("weights slice with 3 offsets", [=](json::object& m) { slice(m, 1)["offsets"] = json::array{40, 0, 0}; });
  bad("weights slice with an empty global name", [=](json::object& m) { slice(m, 1)["global"] = ""; });
  bad("weights slice without global_shape", [=](json::object& m) { slice(m, 1).erase("global_shape"); });
  bad("weights slice as a string", [](json::object& m) { tensor_entry(m, 0, "weights")["slice"] = "rows"; });
  bad("weights slice and rank_local at once", [](json::object& m) { tensor_entry(m, 0, "weights")["rank_local"] = true; });
  bad("rank_local false", [](json::object& m) { tensor_entry(m, 0, "step")["rank_local"] = false; });
  bad("replicated holders beyond the world size", [](json::object& m) {
    tensor_entry(m, 0, "scalar")["replicated"] = json::object{{"holders", json::array{0, kWorld}}};
  });
  bad("replicated holders not led by the entry's rank", [](json::object& m) {
    tensor_entry(m, 1, "scalar")["replicated"] = json::object{{"holders", json::array{0, 1}}};
  });
  bad("replicated holders repeated", [](json::object& m) {
    tensor_entry(m, 0, "scalar")["replicated"] = json::object{{"holders", json::array{0, 0}}};
  });
  bad("replicated tensor also saved by another holder", [](json::object& m) {
    tensor_entry(m, 0, "scalar")["replicated"] = json::object{{"holders", json::array{0, 1}}};
  });
  bad("a slice in a schema_version 1 manifest", [](json::object& m) { m["schema_version"] = 1; });
  return std::move(b.out);
}

json::object manifest_with_nodes(const GoodRoot& g, std::string_view scheme) {
  Manifest m = g.latest;
  m.nodes = NodeLayout{kWorld, 1, parse_redundancy(scheme).value()};
  std::vector<std::uint64_t> sizes;
  for (const auto& s : m.shards) sizes.push_back(s.size);
  m.redundancy = planned_blocks(*m.nodes, sizes);
  for (auto& blk : m.redundancy) {
    if (blk.kind == RedundancyBlock::Kind::replica) {
      const auto& s = m.shards[static_cast<std::size_t>(blk.rank)];
      blk.sha256 = s.sha256, blk.xxh3 = s.xxh3, blk.chunk_xxh3 = s.chunk_xxh3;
    } else {
      blk.sha256 = std::string(64, 'c');
      blk.xxh3 = 0x5eed;
      blk.chunk_xxh3.assign(chunk_count(blk.size, m.chunk_size), 0x5eed);
    }
  }
  return json::parse(encode_manifest(m)).as_object();
}

std::vector<Case> redundancy_cases(const GoodRoot& g) {
  Builder b{g, {}, "redundancy"};
  const json::object rs = manifest_with_nodes(g, "rs:1+1"), rep = manifest_with_nodes(g, "replicate:2");
  // Each case: a valid manifest with nodes, then one edit; refused on opening, naming the field.
  const auto bad = [&](std::string name, const json::object& base, std::function<void(json::object&)> edit, std::string field,
                       Errc code = Errc::malformed_manifest) {
    b.add(std::move(name),
          [dir = g.latest_dir, base, edit](MemoryFileSystem& fs) {
            json::object o = base;
            edit(o);
            write_manifest_object(fs, dir, o);
          },
          code, g.manifest_path(), Stage::open, std::move(field));
  };
  const auto blk = [](json::object& o, std::size_t i) -> json::object& { return o["redundancy_blocks"].as_array()[i].as_object(); };
  bad("rs parity members with another length (wrong stripe geometry)", rs,
      [blk](json::object& o) { blk(o, 0)["members"].as_array()[0].as_array()[3] = 1; }, "redundancy_blocks[0].members");
  bad("rs parity members of another node", rs, [blk](json::object& o) { blk(o, 1)["members"].as_array()[0].as_array()[0] = 0; },
      "redundancy_blocks[1].members");
  bad("rs parity members empty", rs, [blk](json::object& o) { blk(o, 0)["members"] = json::array{}; }, "redundancy_blocks[0].members");
  bad("rs parity block named as a shard", rs, [blk](json::object& o) { blk(o, 1)["path"] = "rank-00001-of-00002.safetensors"; },
      "redundancy_blocks[1]");
  bad("rs parity block on the node of its stripe's data", rs, [blk](json::object& o) { blk(o, 0)["node"] = 0; }, "redundancy_blocks[0]");
  bad("rs parity block of another stripe", rs, [blk](json::object& o) { blk(o, 0)["stripe"] = 1; }, "redundancy_blocks[0]");
  bad("rs parity block a byte longer", rs, [blk](json::object& o) { blk(o, 0)["size"] = blk(o, 0)["size"].to_number<std::uint64_t>() + 1; },
      "redundancy_blocks[0]");
  bad("rs parity checksum not hex", rs, [blk](json::object& o) { blk(o, 0)["sha256"] = std::string(64, 'G'); }, "redundancy_blocks[0].sha256");
  bad("rs parity chunk checksums one short", rs, [blk](json::object& o) { blk(o, 0)["chunk_xxh3"].as_array().pop_back(); },
      "redundancy_blocks[0].chunk_xxh3");
  bad("rs parity block path absolute", rs, [blk](json::object& o) { blk(o, 0)["path"] = "/etc/passwd"; }, "redundancy_blocks[0].path",
      Errc::unsafe_path);
  bad("rs one parity block missing", rs, [](json::object& o) { o["redundancy_blocks"].as_array().pop_back(); }, "redundancy_blocks");
  bad("rs a parity block listed twice", rs,
      [](json::object& o) {
        auto& a = o["redundancy_blocks"].as_array();
        a[1] = a[0];
      },
      "redundancy_blocks[1]");
  bad("rs block kind unknown", rs, [blk](json::object& o) { blk(o, 0)["kind"] = "xor"; }, "redundancy_blocks[0].kind");
  bad("replica sha256 not its shard's", rep, [blk](json::object& o) { blk(o, 1)["sha256"] = std::string(64, 'd'); }, "redundancy_blocks[1]");
  bad("replica chunk checksums not its shard's", rep, [blk](json::object& o) { blk(o, 0)["chunk_xxh3"].as_array()[0] = "00000000deadbeef"; },
      "redundancy_blocks[0]");
  bad("replica of the wrong rank", rep, [blk](json::object& o) { blk(o, 0)["rank"] = 1; }, "redundancy_blocks[0]");
  bad("replica on its shard's own node", rep, [blk](json::object& o) { blk(o, 0)["node"] = 0; }, "redundancy_blocks[0]");
  bad("replica named as the shard it copies", rep, [blk](json::object& o) { blk(o, 0)["path"] = "rank-00000-of-00002.safetensors"; },
      "redundancy_blocks[0]");
  bad("redundancy_blocks without nodes", rs, [](json::object& o) { o.erase("nodes"); }, "redundancy_blocks");
  bad("nodes count not matching world_size", rs, [](json::object& o) { o["nodes"].as_object()["count"] = 3; }, "nodes");
  bad("nodes of two ranks each with world_size 2", rs, [](json::object& o) { o["nodes"].as_object()["ranks_per_node"] = 2; }, "nodes");
  bad("rs needing more nodes than there are", rs, [](json::object& o) { o["nodes"].as_object()["redundancy"] = "rs:2+1"; }, "nodes");
  bad("redundancy scheme unknown", rs, [](json::object& o) { o["nodes"].as_object()["redundancy"] = "raid6"; }, "nodes.redundancy");
  bad("scheme changed under the blocks", rs, [](json::object& o) { o["nodes"].as_object()["redundancy"] = "replicate:2"; },
      "redundancy_blocks[0]");
  bad("redundancy_blocks an object", rs, [](json::object& o) { o["redundancy_blocks"] = json::object{}; }, "redundancy_blocks");
  return std::move(b.out);
}

std::vector<Case> all_cases(const GoodRoot& g) {
  std::vector<Case> out;
  for (auto* make : {bit_flip_cases, truncation_cases, shard_set_cases, path_cases, number_cases, index_cases, header_cases,
                     manifest_cases, latest_cases, huge_cases, sharding_cases, redundancy_cases}) {
    auto part = make(g);
    std::move(part.begin(), part.end(), std::back_inserter(out));
  }
  return out;
}

}  // namespace ckpt::hostile
