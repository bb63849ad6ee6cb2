// SPDX-License-Identifier: Apache-2.0
// Writes the fuzzers' seed corpus: tests/fuzz/corpus/{manifest,shard_header,checkpoint,wire,
// node_set}/ (s3_xml's seeds are real S3 answers: tools/capture_s3_answers.py).
//   fuzz_make_seeds OUT_DIR
// From a small good checkpoint root (tests/hostile/corpus.hpp, make_good_root(small)) it
// writes the good manifest, shard files and whole checkpoint, then the same for a selection
// of hostile cases (one in kStride of each category but the 100k ones, whose inputs exceed
// the fuzzers' max_len; one in kBundleStride for whole checkpoints, which are larger). Shard headers are written compact (unpadded) as well, and as
// header-only inputs for the JSON mode of fuzz_shard_header. The wire seeds are what the
// encoders write (reports, outcomes, errors, shard sizes) and what a routed file system and
// its FileService send each other; the node-set seeds are checkpoints across node roots
// written as a save writes them (rs and replicate schemes), whole and damaged.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "ckpt/format/redundancy.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/fs/remote_file_system.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/runtime/wire.hpp"
#include "fuzz/support/bundle.hpp"
#include "fuzz/support/file_calls.hpp"
#include "hostile/corpus.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {
constexpr std::size_t kStride = 4, kBundleStride = 12;

void write(const fs::path& p, std::string_view bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return out.substr(0, 80);
}

// The compact form of a shard: the JSON without its padding, the data unchanged.
std::string compact(const std::string& file) {
  if (file.size() < 8) return file;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<std::size_t>(i)]);
  if (n > file.size() - 8) return file;
  std::string json = file.substr(8, n);
  while (!json.empty() && json.back() == ' ') json.pop_back();
  return hostile::shard_bytes(json, file.substr(8 + n));
}

// The fuzz_checkpoint input for the latest checkpoint directory of `mem`.
std::string bundle(MemoryFileSystem& mem, const std::string& dir, unsigned char flags, bool compact_shards) {
  std::string out(1, static_cast<char>(flags));
  const std::string mpath = join_path(dir, kManifestName);
  if (const auto m = mem.file_bytes(mpath)) out.append(reinterpret_cast<const char*>(m->data()), m->size());
  for (const auto& e : mem.list_dir(dir)) {
    if (e.name == kManifestName) continue;
    const std::string p = join_path(dir, e.name);
    if (e.type == EntryType::symlink) {
      out += fuzz::bundle_entry(e.name + " -> " + *mem.symlink_target(p), "");
    } else if (const auto b = mem.file_bytes(p)) {
      const std::string bytes(reinterpret_cast<const char*>(b->data()), b->size());
      out += fuzz::bundle_entry(e.name, compact_shards ? compact(bytes) : bytes);
    }
  }
  return out;
}

// ---- wire ----

std::string mode(int m, std::string_view body) { return std::string(1, static_cast<char>(m)) + std::string(body); }

std::string u16_framed(std::string_view bytes) {
  std::string out(2, '\0');
  out[0] = static_cast<char>(bytes.size() & 0xff);
  out[1] = static_cast<char>(bytes.size() >> 8);
  return out + std::string(bytes.substr(0, 0xffff));
}

// Records what crosses the transport: the requests, and the replies.
class RecordingTransport final : public FileTransport {
 public:
  explicit RecordingTransport(FileTransport& next) : next_(next) {}
  std::string call(int peer, std::string request) override {
    requests.push_back(request);
    replies.push_back(next_.call(peer, std::move(request)));
    return replies.back();
  }
  std::vector<std::string> requests, replies;

 private:
  FileTransport& next_;
};

void wire_seeds(const fs::path& out, const Manifest& good) {
  // Reports: rank 1's part of the good checkpoint, with blocks, and a failed rank's.
  RankReport r;
  r.rank = 1;
  r.shard.shard = good.shard(1);
  for (const auto& t : good.tensors)
    if (t.rank == 1) r.shard.tensors.push_back(t);
  r.shard.chunk_size = good.chunk_size;
  r.shard.param_numel = good.param_numel;
  r.shard.wall_clock_seconds = good.wall_clock_seconds;
  r.shard.training = good.training;
  r.blocks = {{RedundancyBlock::Kind::parity, 2, 3, 1, -1, "parity-s00003-p1.rs", 8193, std::string(64, 'c'), 0x0123456789abcdefull, {5, 6, 7}},
              {RedundancyBlock::Kind::replica, 0, -1, -1, 1, "replica-rank-00001-of-00002.safetensors", 4096, std::string(64, 'd'), 42, {9}}};
  write(out / "wire/report", mode(0, detail::encode_rank_report(20, r)));
  r.error = Error(Errc::no_space, "/ckpt/step-0000000020.tmp/rank-00001-of-00002.safetensors", "pwrite failed", {}, {}, 28);
  write(out / "wire/report_failed", mode(0, detail::encode_rank_report(20, r)));
  CommitOutcome o;
  o.dir = "/ckpt/step-0000000020";
  o.commit = std::chrono::nanoseconds(1234567);
  write(out / "wire/outcome", mode(1, detail::encode_outcome(o)));
  o.error = Error(Errc::aborted, {}, "rank 1 failed: no space");
  write(out / "wire/outcome_failed", mode(1, detail::encode_outcome(o)));
  r.error.reset();
  const std::string report = detail::encode_rank_report(20, r);
  write(out / "wire/vote", mode(7, detail::encode_vote(20, std::span(&report, 1))));
  write(out / "wire/run_start", mode(7, detail::encode_run_start("run1a2b3c4d")));
  write(out / "wire/run_start_failed", mode(7, detail::encode_run_start_failure(Error(Errc::busy, "/ckpt", "held by pid 7"))));
  write(out / "wire/error_conflict",
        mode(2, error_to_json(Error(Errc::conflict, "s3://b/p/latest", "PUT", "no object under the key", "HTTP 412 PreconditionFailed"))));
  write(out / "wire/error_io", mode(2, error_to_json(Error(Errc::io_error, "/ckpt/x", "fsync failed: Input/output error", {}, {}, 5))));
  const std::vector<std::pair<int, std::uint64_t>> a{{0, 8192}, {2, 4096}}, b{{1, 12288}};
  write(out / "wire/sizes", mode(3, "\x03" + detail::encode_shard_sizes(a) + "\n" + detail::encode_shard_sizes(b)));
  write(out / "wire/sizes_failed", mode(3, "\x02" + detail::encode_shard_sizes(a) + "\n" + detail::encode_sizes_failure("rank 1 failed to stage its shard")));

  // The file calls of fuzz_wire's mode 5 against a real service: its requests (mode 4) and
  // replies (mode 5).
  MemoryFileSystem served, elsewhere;
  served.create_dirs("/r/d");
  served.put_file("/r/d/f", std::string_view("payload"));
  FileService service(served);
  LoopbackFileTransport loop({nullptr, &service});
  RecordingTransport rec(loop);
  {
    const auto routed = make_routed_file_system(elsewhere, rec, {{"/r", 1}});
    fuzz::fixed_file_calls(*routed);
  }
  std::string requests, replies;
  for (const auto& q : rec.requests) requests += std::string(1, '\0') + u16_framed(q);
  for (const auto& q : rec.replies) replies += u16_framed(q);
  write(out / "wire/file_requests", mode(4, requests));
  write(out / "wire/file_replies", mode(5, replies));
  // Mode 6: [op, a, b, length, data] per call (fuzz_wire.cpp's run_call: op % 16, paths
  // kPaths[a % 8]).
  const unsigned char calls[] = {3, 5, 0, 0,  0, 6, 0, 0,  9, 0, 3, 5, 'h', 'e', 'l', 'l', 'o',  12, 0, 0, 0,  1, 6, 0, 0,
                                 14, 0, 0, 0,  13, 0, 4, 1, 'x',  6, 5, 0, 0,  7, 6, 0, 0,  8, 1, 0, 3, 'r', 'e', 'c',
                                 8, 1, 0, 0,  4, 6, 7, 0,  15, 0, 0, 0,  15, 1, 0, 0,  5, 5, 0, 0,  6, 0, 0, 0};
  write(out / "wire/file_calls", mode(6, std::string_view(reinterpret_cast<const char*>(calls), sizeof calls)));
}

// ---- node sets ----

const std::string kSetDir = "/fz/set";

// A checkpoint at step 20 of `world` ranks (one U8 tensor each, of uneven sizes) across `nodes`
// node roots under kSetDir with `scheme`, written as a save across nodes writes it.
Manifest save_node_set(MemoryFileSystem& mem, int world, int nodes, std::string_view scheme) {
  std::vector<std::vector<std::byte>> data;
  SaveRequest req;
  req.step = 20;
  req.chunk_size = hostile::kChunk;
  for (int r = 0; r < world; ++r) {
    data.emplace_back(static_cast<std::size_t>(r % 2 == 0 ? 100 + 37 * r : 3000 + 511 * r));
    for (std::size_t i = 0; i < data.back().size(); ++i) data.back()[i] = static_cast<std::byte>((i * 131 + static_cast<std::size_t>(r)) & 0xff);
  }
  for (int r = 0; r < world; ++r)
    req.ranks.push_back({{{"extra", DType::U8, {data[static_cast<std::size_t>(r)].size()}, data[static_cast<std::size_t>(r)], std::nullopt}}, 0, 0, {}});
  Manifest m = save_checkpoint_sync(mem, "/scratch", req);
  std::vector<std::vector<std::byte>> files;
  for (const auto& s : m.shards) files.push_back(*mem.file_bytes(join_path(join_path("/scratch", checkpoint_dir_name(m.step)), s.path)));
  mem.remove_all("/scratch");
  const NodeLayout layout{nodes, world / nodes, *parse_redundancy(scheme)};
  const auto roots = node_root_paths(kSetDir, nodes);
  std::vector<RootLock> locks;
  for (const auto& r : roots) locks.emplace_back(mem, r);
  prepare_node_roots(mem, locks);
  const auto temps = begin_node_checkpoint(mem, roots, m.step);
  std::vector<std::span<const std::byte>> spans;
  std::vector<std::uint64_t> sizes;
  for (const auto& f : files) spans.push_back(f), sizes.push_back(f.size());
  for (int r = 0; r < world; ++r) {
    const auto& bytes = files[static_cast<std::size_t>(r)];
    write_file_from(
        mem, temps[static_cast<std::size_t>(layout.node_of(r))], m.shards[static_cast<std::size_t>(r)].path, bytes.size(),
        [&](std::uint64_t off, std::span<std::byte> o) { std::memcpy(o.data(), bytes.data() + off, o.size()); }, m.chunk_size);
  }
  m.nodes = layout;
  m.redundancy = write_redundancy(mem, temps, layout, sizes, node_bytes_from_images(layout, spans), m.chunk_size);
  commit_node_checkpoint(mem, roots, temps, m);
  return m;
}

// The fuzz_node_set input for the node set in `mem`.
std::string node_bundle(MemoryFileSystem& mem, int nodes, unsigned char flags) {
  const std::string name = checkpoint_dir_name(20);
  const auto roots = node_root_paths(kSetDir, nodes);
  std::string out(1, static_cast<char>(flags));
  out += hostile::read_text(mem, join_path(join_path(roots[0], name), kManifestName));
  for (int n = 0; n < nodes; ++n) {
    const std::string dir = join_path(roots[static_cast<std::size_t>(n)], name);
    if (!mem.stat(dir)) continue;
    for (const auto& e : mem.list_dir(dir)) {
      if (e.name == kManifestName) continue;
      const auto b = mem.file_bytes(join_path(dir, e.name));
      out += fuzz::bundle_entry("node-" + std::to_string(n) + "/" + e.name, std::string_view(reinterpret_cast<const char*>(b->data()), b->size()));
    }
  }
  return out;
}

void flip_byte(MemoryFileSystem& mem, const std::string& path, std::size_t at) {
  auto b = *mem.file_bytes(path);
  b[at % b.size()] ^= std::byte{0x10};
  mem.put_file(path, b);
}

void node_set_seeds(const fs::path& out) {
  struct Set {
    const char* name;
    int world, nodes;
    const char* scheme;
  };
  const std::string step = checkpoint_dir_name(20);
  for (const Set& s : {Set{"rs_2_1", 3, 3, "rs:2+1"}, Set{"rs_1_1_two_ranks_per_node", 4, 2, "rs:1+1"}, Set{"replicate_2", 4, 2, "replicate:2"},
                       Set{"replicate_3_jump_2", 3, 3, "replicate:3/2"}, Set{"none", 2, 2, "none"}}) {
    MemoryFileSystem mem;
    const Manifest m = save_node_set(mem, s.world, s.nodes, s.scheme);
    const auto roots = node_root_paths(kSetDir, s.nodes);
    const std::string base = std::string("node_set/") + s.name;
    // The manifest alone for fuzz_manifest: its node layout and redundancy block records.
    write(out / "manifest" / (std::string("node_set_") + s.name),
          hostile::read_text(mem, join_path(join_path(roots[0], step), kManifestName)));
    write(out / (base + "_good"), node_bundle(mem, s.nodes, 1 | 8));
    write(out / (base + "_good_full"), node_bundle(mem, s.nodes, 2));
    write(out / (base + "_lost_node_1"), node_bundle(mem, s.nodes, 1 | 8 | (2 << 4)));
    {
      MemoryFileSystem d = mem.clone();
      flip_byte(d, join_path(join_path(roots[0], step), m.shards[0].path), 5000);
      write(out / (base + "_shard0_flipped"), node_bundle(d, s.nodes, 1 | 8));
    }
    if (!m.redundancy.empty()) {
      const RedundancyBlock& b = m.redundancy.front();
      MemoryFileSystem d = mem.clone();
      flip_byte(d, join_path(join_path(roots[static_cast<std::size_t>(b.node)], step), b.path), 77);
      // Resealed: the damaged block passes its checksums, and a node is lost, so the repair
      // decodes from it.
      write(out / (base + "_block_flipped_resealed_lost_node_0"), node_bundle(d, s.nodes, 2 | 4 | (1 << 4)));
      write(out / (base + "_block_flipped"), node_bundle(d, s.nodes, 1));
    }
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const hostile::GoodRoot good = hostile::make_good_root(/*small=*/true);
  MemoryFileSystem pristine = good.fs.clone();
  const std::string shard1 = good.shard_path(1);
  const std::string good_shard = hostile::read_text(pristine, shard1);

  write(out / "manifest/good", hostile::read_text(pristine, good.manifest_path()));
  write(out / "manifest/good_previous", hostile::read_text(pristine, join_path(good.previous_dir, kManifestName)));
  write(out / "shard_header/good", good_shard);
  write(out / "shard_header/good_compact", compact(good_shard));
  write(out / "shard_header/json_two_tensors", std::string(R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[],"data_offsets":[8,9]}})") + '\x09');
  write(out / "shard_header/json_empty_tensor", std::string(R"({"e":{"dtype":"BF16","shape":[0,3],"data_offsets":[0,0]}})") + '\x00');
  write(out / "checkpoint/good", bundle(pristine, good.latest_dir, 0, false));
  write(out / "checkpoint/good_resealed_compact", bundle(pristine, good.latest_dir, 1, true));
  write(out / "checkpoint/good_all_calls", bundle(pristine, good.latest_dir, 0x1e, false));

  // Inputs behind the fixes this corpus led to (see the report of issue 7), always kept.
  const std::set<std::string> always = {"training holding 1e400", "step = 10, the previous directory's",
                                        "manifest is a special file", "latest a special file"};
  std::map<std::string, std::size_t> seen;
  std::size_t written = 0;
  for (const auto& c : hostile::all_cases(good)) {
    const std::size_t index = seen[c.category]++;
    const bool keep = always.count(c.name) > 0;
    if (c.category == "huge" || (index % kStride != 0 && !keep)) continue;
    MemoryFileSystem mem = good.fs.clone();
    try {
      c.damage(mem);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "skipped %s: %s: %s\n", c.category.c_str(), c.name.c_str(), e.what());
      continue;
    }
    const std::string name = slug(c.category + "_" + c.name);
    const auto manifest = mem.file_bytes(good.manifest_path());
    const std::string mtext = manifest ? std::string(reinterpret_cast<const char*>(manifest->data()), manifest->size()) : "";
    if (manifest && mtext != hostile::read_text(pristine, good.manifest_path()) && mtext.size() < 65536)
      write(out / "manifest" / name, mtext);
    if (const auto shard = mem.file_bytes(shard1)) {
      const std::string s(reinterpret_cast<const char*>(shard->data()), shard->size());
      if (s != good_shard && s.size() < 65536) write(out / "shard_header" / name, c.category == "header" ? compact(s) : s);
    }
    if (c.category != "latest" && (index % kBundleStride == 0 || keep)) {
      // Resealed where the case is about structure; the calls vary from seed to seed.
      const unsigned char calls = static_cast<unsigned char>((written % 16) << 1);
      const std::string b = bundle(mem, good.latest_dir, (c.category == "header" || c.category == "index" ? 1 : 0) | calls, false);
      if (b.size() < 131072) write(out / "checkpoint" / name, b);
    }
    ++written;
  }
  // A 2^30 chunk size with valid checksums: verify() used to allocate a whole chunk of scratch.
  {
    MemoryFileSystem mem = good.fs.clone();
    auto m = hostile::manifest_object(mem, good.latest_dir);
    m["chunk_size"] = 1u << 30;
    hostile::write_manifest_object(mem, good.latest_dir, m);
    for (int r = 0; r < hostile::kWorld; ++r) hostile::reseal(mem, good.latest_dir, r);
    write(out / "checkpoint/finding_chunk_size_2_30", bundle(mem, good.latest_dir, 0, false));
    write(out / "manifest/finding_chunk_size_2_30", hostile::read_text(mem, good.manifest_path()));
  }
  wire_seeds(out, good.latest);
  node_set_seeds(out);
  std::printf("seeds from %zu hostile cases, and the wire and node-set seeds, written under %s\n", written, out.c_str());
  return 0;
}
