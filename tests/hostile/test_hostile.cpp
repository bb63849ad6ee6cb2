// SPDX-License-Identifier: Apache-2.0
// Every case of the hostile corpus (corpus.hpp) against the reader: refused by
// CheckpointReader::open, or by every read path (load_shard and verify with Verify::fast and
// ::full; the resume path, load_into of every tensor, with none, fast and full, leaving every
// target untouched; read_tensor, ShardRangeReader, stream_shard and MappedShard), with the
// exact Errc, an error that names the damaged file, within a time bound, and afterwards the
// previous checkpoint of the same root still opens, verifies and loads byte-equal, also
// through open_latest's fallback. The last cases replay the corpus on the real file system
// and under an address-space limit.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

#include "ckpt/store/store.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/read/mapped.hpp"
#include "ckpt/read/range_reader.hpp"
#include "ckpt/read/reader.hpp"
#include "hostile/corpus.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::testing;
using hostile::Case;
using hostile::Stage;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif
// Sanitizers slow everything down about tenfold; the bounds are for the plain build, with
// room for a machine shared with parallel tests (2.17 s against 2 s was seen at load 7): they
// catch quadratic work on 100k entries (minutes), not a slow moment.
constexpr double kTimeScale = kSanitized ? 10.0 : 2.5;

const hostile::GoodRoot& good() {
  static const hostile::GoodRoot g = hostile::make_good_root();
  return g;
}

// Where a case is checked: a file system and the root path the corpus's kRoot maps to.
struct Place {
  FileSystem& fs;
  std::string root;
  std::string map(const std::string& corpus_path) const { return root + corpus_path.substr(std::string(hostile::kRoot).size()); }
};

constexpr std::byte kUntouched{0xAB};

// A buffer for every tensor of every rank the manifest indexes (as a resume loads them),
// filled with kUntouched.
struct AllTargets {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::vector<LoadTarget>> per_rank;
  std::vector<RankLoad> ranks;
  explicit AllTargets(const Manifest& m) : per_rank(static_cast<std::size_t>(m.world_size)) {
    bufs.reserve(m.tensors.size());
    for (const auto& t : m.tensors) {
      bufs.emplace_back(static_cast<std::size_t>(t.end - t.begin), kUntouched);
      per_rank[static_cast<std::size_t>(t.rank)].push_back({t.name, bufs.back(), t.dtype, t.shape});
    }
    for (int r = 0; r < m.world_size; ++r) ranks.push_back({r, per_rank[static_cast<std::size_t>(r)]});
  }
  // The targets (of `rank`; -1: of every rank) hold kUntouched still.
  bool untouched(int rank = -1) const {
    for (std::size_t r = 0; r < per_rank.size(); ++r)
      if (rank < 0 || static_cast<std::size_t>(rank) == r)
        for (const auto& t : per_rank[r])
          if (!std::all_of(t.out.begin(), t.out.end(), [](std::byte x) { return x == kUntouched; })) return false;
    return true;
  }
  // Every buffer holds its tensor's bytes of the undamaged checkpoint.
  bool good_bytes(const Manifest& m) const {
    std::size_t i = 0;
    for (const auto& t : m.tensors) {
      const auto file = good().fs.file_bytes(join_path(good().latest_dir, good().latest.shard(t.rank).path)).value();
      if (!std::equal(bufs[i].begin(), bufs[i].end(), file.begin() + static_cast<std::ptrdiff_t>(t.begin))) return false;
      ++i;
    }
    return true;
  }
};

using Refused = std::function<void(const char*, const std::function<void()>&)>;

// The read paths beside load_shard and verify, on a case refused at load: the resume path
// (load_into of every tensor of every rank, into memory the caller owns) and the per-tensor,
// ranged, streamed and mapped reads.
void check_read_paths(const Case& c, const CheckpointReader& reader, const std::string& want_file, const Refused& refused,
                      std::vector<std::string>& problems) {
  const Manifest& m = reader.manifest();
  const int world = m.world_size;
  if (c.checksums_only) {
    // Only the checksums can tell, so Verify::none loads it as it is (not checked here).
    // Verify::full reads every chunk: refused. Verify::fast reads the chunks the tensors lie
    // in: refused, unless the damage lies only where no tensor does (the header's own chunk,
    // in a way its parse and the index agreement cannot see: a metadata value), and then
    // what it loaded is the checkpoint's bytes.
    // One file at a time: where both files are damaged (two shards swapped), which of two
    // threads fails first is a race, and the case names the first rank's file.
    const LoadOptions in_order{.threads = 1};
    AllTargets full(m);
    refused("load_into full", [&] { load_into(reader, full.ranks, Verify::full, in_order); });
    AllTargets fast(m);
    try {
      load_into(reader, fast.ranks, Verify::fast, in_order);
      if (!c.detail_contains.starts_with("chunk 0 of")) problems.push_back("load_into fast accepted damage in a chunk it read");
      if (!fast.good_bytes(m)) problems.push_back("load_into fast accepted it and loaded bytes that are not the checkpoint's");
    } catch (const Error& e) {
      if (e.code() != c.code || e.file() != want_file) problems.push_back("load_into fast: " + std::string(errc_name(e.code())) + ": " + e.what());
    }
    return;
  }
  // Structural damage: refused by every path at every verify level, before any target is
  // written.
  for (const Verify mode : {Verify::none, Verify::fast, Verify::full}) {
    const std::string v(verify_name(mode));
    AllTargets all(m);
    refused(("load_into of every rank, verify " + v).c_str(), [&] { load_into(reader, all.ranks, mode); });
    if (!all.untouched()) problems.push_back("load_into verify " + v + " wrote a target before refusing");
  }
  if (c.category == "huge") return;  // each refusal parses 100k entries: the loads above suffice
  AllTargets one(m);
  int at = 0;  // the rank whose load was refused: the ranks before it loaded
  refused("load_into rank by rank, verify none", [&] {
    for (at = 0; at < world; ++at) load_into(reader, at, one.per_rank[static_cast<std::size_t>(at)], Verify::none);
  });
  for (int r = at; r < world; ++r)
    if (!one.untouched(r)) problems.push_back("load_into of rank " + std::to_string(r) + " wrote a target before refusing");
  refused("MappedShard verify none", [&] {
    for (int r = 0; r < world; ++r) (void)MappedShard(reader, r, Verify::none);
  });
  refused("MappedShard verify fast", [&] {
    for (int r = 0; r < world; ++r) (void)MappedShard(reader, r, Verify::fast);
  });
  refused("ShardRangeReader verify none", [&] {
    for (int r = 0; r < world; ++r) (void)ShardRangeReader(reader, r, Verify::none);
  });
  refused("stream_shard verify none", [&] {
    for (int r = 0; r < world; ++r) reader.stream_shard(r, Verify::none, [](std::uint64_t, std::span<const std::byte>) {});
  });
  // read_tensor reads nothing of a rank without tensors: only where every rank has some.
  std::vector<bool> holds(static_cast<std::size_t>(world), false);
  for (const auto& t : m.tensors) holds[static_cast<std::size_t>(t.rank)] = true;
  if (std::find(holds.begin(), holds.end(), false) == holds.end())
    for (const Verify mode : {Verify::none, Verify::fast})
      refused(("read_tensor verify " + std::string(verify_name(mode))).c_str(), [&] {
        for (int r = 0; r < world; ++r)
          for (const auto& t : m.tensors)
            if (t.rank == r) reader.read_tensor(t.name, r, mode);
      });
}

// Checks one damaged root; returns what went wrong (empty: the case holds).
std::vector<std::string> check_case(const Case& c, const Place& at) {
  std::vector<std::string> problems;
  const std::string latest_dir = at.map(good().latest_dir), previous_dir = at.map(good().previous_dir);
  const std::string want_file = c.file.starts_with(hostile::kRoot) ? at.map(c.file) : c.file;
  const double limit = c.max_seconds * kTimeScale;
  auto refused = [&](const char* call, const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      f();
      problems.push_back(std::string(call) + " accepted it");
    } catch (const Error& e) {
      if (e.code() != c.code)
        problems.push_back(std::string(call) + ": " + std::string(errc_name(e.code())) + " instead of " + std::string(errc_name(c.code)) +
                           ": " + e.what());
      if (e.file() != want_file) problems.push_back(std::string(call) + ": names " + e.file() + " instead of " + want_file);
      if (std::string(e.what()).find(want_file) == std::string::npos) problems.push_back(std::string(call) + ": message lacks the file");
      if (!c.detail_contains.empty() && e.detail().find(c.detail_contains) == std::string::npos)
        problems.push_back(std::string(call) + ": detail '" + e.detail() + "' lacks '" + c.detail_contains + "'");
    } catch (const std::exception& e) {
      problems.push_back(std::string(call) + " threw a non-ckpt exception: " + e.what());
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > limit) problems.push_back(std::string(call) + " took " + std::to_string(s) + " s, bound " + std::to_string(limit));
  };
  try {
    if (c.stage == Stage::root) {
      refused("open_latest", [&] { open_latest(at.fs, at.root); });
    } else if (c.stage == Stage::open) {
      refused("CheckpointReader::open", [&] { CheckpointReader::open(at.fs, latest_dir); });
      refused("open_latest", [&] { open_latest(at.fs, at.root); });
    } else {
      const CheckpointReader reader = CheckpointReader::open(at.fs, latest_dir);
      for (Verify mode : {Verify::fast, Verify::full}) {
        const std::string m = mode == Verify::fast ? " fast" : " full";
        refused(("load_shard" + m).c_str(), [&] {
          for (int r = 0; r < reader.manifest().world_size; ++r) reader.load_shard(r, mode);
        });
        refused(("verify" + m).c_str(), [&] { reader.verify(mode); });
      }
      check_read_paths(c, reader, want_file, refused, problems);
    }
    // The root still yields a good checkpoint: open_latest's fallback finds the newest one that
    // verifies (step 20 itself when only `latest` is bad), and step 10 loads byte-equal.
    const auto fallback = open_latest(at.fs, at.root, {.fallback = true});
    const std::string want_name = c.stage == Stage::root ? checkpoint_dir_name(hostile::kLatestStep) : checkpoint_dir_name(hostile::kPreviousStep);
    if (fallback.name != want_name) problems.push_back("fallback chose " + fallback.name + " instead of " + want_name);
    if (!fallback.fell_back) problems.push_back("fallback did not report falling back");
    const CheckpointReader previous = open_step(at.fs, at.root, hostile::kPreviousStep, hostile::kWorld);
    previous.verify(Verify::full);
    for (int r = 0; r < hostile::kWorld; ++r) {
      const auto shard = previous.load_shard(r, Verify::full);
      const auto want = good().fs.file_bytes(join_path(good().previous_dir, good().previous.shard(r).path)).value();
      if (!std::equal(shard.file_bytes().begin(), shard.file_bytes().end(), want.begin(), want.end()))
        problems.push_back("previous checkpoint's shard " + std::to_string(r) + " changed");
    }
  } catch (const std::exception& e) {
    problems.push_back(std::string("the good checkpoint no longer loads: ") + e.what());
  }
  return problems;
}

std::vector<std::string> check_in_memory(const Case& c) {
  MemoryFileSystem fs = good().fs.clone();
  c.damage(fs);
  return check_case(c, {fs, hostile::kRoot});
}

void check_all(const std::vector<Case>& cases, std::size_t at_least) {
  CHECK(cases.size() >= at_least);
  std::set<std::string> names;
  for (const auto& c : cases) {
    INFO(c.category << ": " << c.name);
    CHECK_MESSAGE(names.insert(c.name).second, "duplicate case name");
    const auto problems = check_in_memory(c);
    for (const auto& p : problems) FAIL_CHECK(p);
  }
}

// Writes the memory tree under `from` to the real directory `to` (files, directories,
// symlinks with their targets unchanged, FIFOs for special files).
void materialize(const MemoryFileSystem& mem, const std::string& from, const std::filesystem::path& to) {
  std::filesystem::create_directories(to);
  auto& m = const_cast<MemoryFileSystem&>(mem);  // list_dir and stat are logically const
  for (const auto& e : m.list_dir(from)) {
    const std::string src = join_path(from, e.name);
    const auto dst = to / e.name;
    switch (e.type) {
      case EntryType::directory: materialize(mem, src, dst); break;
      case EntryType::symlink: std::filesystem::create_symlink(*mem.symlink_target(src), dst); break;
      case EntryType::file: {
        std::ofstream out(dst, std::ios::binary);
        const auto b = *mem.file_bytes(src);
        out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
        break;
      }
      case EntryType::other: REQUIRE(::mkfifo(dst.c_str(), 0644) == 0); break;
    }
  }
}

}  // namespace

TEST_CASE("a bit flipped in any region of a shard is a checksum mismatch naming the shard and the chunk") {
  check_all(hostile::bit_flip_cases(good()), 150);
}

TEST_CASE("a shard or manifest cut at any offset is refused, plain or resealed") {
  check_all(hostile::truncation_cases(good()), 80);
}

TEST_CASE("missing, renamed, swapped, extra and duplicate shards are refused") {
  check_all(hostile::shard_set_cases(good()), 15);
}

TEST_CASE("absolute, dot-dot, hidden and symlinked shard paths are refused as unsafe") {
  check_all(hostile::path_cases(good()), 15);
}

TEST_CASE("absurd sizes, offsets, counts and schema versions in the manifest are refused") {
  check_all(hostile::number_cases(good()), 100);
}

TEST_CASE("an overlapping, holed or stray manifest tensor index is refused against the shard header") {
  check_all(hostile::index_cases(good()), 10);
}

TEST_CASE("overlapping, gapped and out-of-range slices and bad replicated holders are refused before any shard is read") {
  check_all(hostile::sharding_cases(good()), 19);
}

TEST_CASE("hostile safetensors headers behind valid checksums are refused as malformed shards") {
  check_all(hostile::header_cases(good()), 60);
}

TEST_CASE("wrong stripe geometry, a parity block named as a shard and replicas unlike their shards are refused naming the field") {
  check_all(hostile::redundancy_cases(good()), 25);
}

TEST_CASE("wrong JSON types, missing fields, bad text and deep nesting in the manifest are refused") {
  check_all(hostile::manifest_cases(good()), 80);
}

TEST_CASE("a bad latest pointer is refused and fallback still finds the newest good checkpoint") {
  check_all(hostile::latest_cases(good()), 10);
}

TEST_CASE("100k-entry headers, indexes and shard tables and a million brackets are refused in bounded time") {
  check_all(hostile::huge_cases(good()), 6);
}

TEST_CASE("a valid checkpoint with 100k tensors opens, verifies and loads in bounded time") {
  MemoryFileSystem fs;
  hostile::write_many_tensor_checkpoint(fs, "/many", 1, 100000);
  // Each call within the bound the 100k refusals get.
  auto timed = [](const char* what, const auto& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(std::string(what) << ": " << s << " s");
    CHECK(s < 2.0 * kTimeScale);
  };
  std::optional<OpenedCheckpoint> opened;
  timed("open_latest", [&] { opened.emplace(open_latest(fs, "/many", {.expected_world_size = 1})); });
  timed("verify full", [&] { opened->reader.verify(Verify::full); });
  timed("load_shard full", [&] { CHECK(opened->reader.load_shard(0, Verify::full).tensors.size() == 100000); });
  timed("read_tensor", [&] { CHECK(opened->reader.read_tensor("t0099999", 0).at(0) == static_cast<std::byte>(99999 * 31)); });
  // The header is checked once per reader, not once per read: 200 reads of single tensors
  // (each parsing the 100k-entry header again would take well over the bound), and load_into
  // of all of them.
  timed("read_tensor x 200", [&] {
    for (std::size_t i = 0; i < 100000; i += 500) {
      char name[32];
      std::snprintf(name, sizeof name, "t%07zu", i);
      if (opened->reader.read_tensor(name, 0, Verify::none).at(0) != static_cast<std::byte>(i * 31)) FAIL_CHECK(name);
    }
  });
  timed("load_into of 100k tensors", [&] {
    std::vector<std::byte> bytes(100000, std::byte{0});
    std::vector<LoadTarget> targets;
    targets.reserve(bytes.size());
    for (const auto& t : opened->reader.manifest().tensors) targets.push_back({t.name, std::span(bytes).subspan(std::stoul(t.name.substr(1)), 1), t.dtype, t.shape});
    load_into(opened->reader, 0, targets, Verify::fast);
    for (std::size_t i = 0; i < bytes.size(); ++i)
      if (bytes[i] != static_cast<std::byte>(i * 31)) FAIL_CHECK("tensor " << i);
  });
}

namespace {

// Changes that are not damage: each must still load (and, in the address-space test, without
// allocating what a field merely claims).
std::vector<std::pair<std::string, std::function<void(MemoryFileSystem&)>>> harmless_changes() {
  const auto& g = good();
  return {
      {"an unlisted file", [&g](MemoryFileSystem& fs) {
         fs.put_file(join_path(g.latest_dir, "rank-00002-of-00002.safetensors"), std::string_view("stray"));
       }},
      {"tab padding", [&g](MemoryFileSystem& fs) {  // JSON whitespace other than spaces pads a header as well
         const std::string path = g.shard_path(1);
         std::string j = hostile::shard_json(fs, path);
         j.resize(4096 - 8, '\t');
         fs.put_file(path, hostile::shard_bytes(j, hostile::shard_data(fs, path)));
         hostile::reseal(fs, g.latest_dir, 1);
       }},
      {"a node layout with the blocks its scheme plans (rs:1+1)", [&g](MemoryFileSystem& fs) {
         hostile::write_manifest_object(fs, g.latest_dir, hostile::manifest_with_nodes(g, "rs:1+1"));
       }},
      {"a node layout with the blocks its scheme plans (replicate:2)", [&g](MemoryFileSystem& fs) {
         hostile::write_manifest_object(fs, g.latest_dir, hostile::manifest_with_nodes(g, "replicate:2"));
       }},
      {"a 2^30 chunk size", [&g](MemoryFileSystem& fs) {  // one chunk per shard; verify() must not allocate 1 GiB
         auto m = hostile::manifest_object(fs, g.latest_dir);
         m["chunk_size"] = 1u << 30;
         hostile::write_manifest_object(fs, g.latest_dir, m);
         for (int r = 0; r < hostile::kWorld; ++r) hostile::reseal(fs, g.latest_dir, r);
       }},
  };
}

void load_changed(const std::function<void(MemoryFileSystem&)>& change) {
  MemoryFileSystem fs = good().fs.clone();
  change(fs);
  const auto opened = open_latest(fs, hostile::kRoot, {.expected_world_size = hostile::kWorld});
  if (opened.name != checkpoint_dir_name(hostile::kLatestStep)) throw std::runtime_error("opened " + opened.name);
  opened.reader.verify(Verify::full);
  for (int r = 0; r < hostile::kWorld; ++r)
    if (opened.reader.load_shard(r, Verify::full).tensors.size() != 7) throw std::runtime_error("tensors lost");
}

}  // namespace

TEST_CASE("what is not damage loads: an unlisted file, tab padding, a 2^30 chunk size") {
  for (const auto& change : harmless_changes()) {
    INFO(change.first);
    CHECK_NOTHROW(load_changed(change.second));
  }
}

TEST_CASE("the hostile corpus gets the same refusals from the POSIX file system") {
  // Every case about files and links (shards, paths, latest, index), one in seven of the
  // others, none of the 100k ones: written to a real directory, FIFOs and symlinks included.
  test::TempDir dir("ckpt-hostile");
  std::size_t n = 0;
  for (const auto& c : hostile::all_cases(good())) {
    const bool all = c.category == "shards" || c.category == "paths" || c.category == "latest" || c.category == "index";
    if (c.category == "huge" || (!all && n % 7 != 0)) {
      ++n;
      continue;
    }
    INFO(c.category << ": " << c.name);
    MemoryFileSystem fs = good().fs.clone();
    c.damage(fs);
    const auto root = dir / std::to_string(n++);
    materialize(fs, "/", root);
    const auto problems = check_case(c, {posix_file_system(), (root / "ckpt").string()});
    for (const auto& p : problems) FAIL_CHECK(p);
  }
}

TEST_CASE("every hostile case is refused within a 768 MiB address-space budget") {
  if (kSanitized) {
    MESSAGE("skipped: sanitizers reserve terabytes of address space");
    return;
  }
  const auto cases = hostile::all_cases(good());
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Child: the budget is over what the process already maps; a case that allocates past it
    // gets std::bad_alloc (a non-ckpt exception, reported) or dies.
    if (!test::limit_address_space(768ull << 20)) ::_exit(3);
    int bad = 0;
    for (const auto& [name, change] : harmless_changes()) {
      try {
        load_changed(change);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(), e.what());
        ++bad;
      }
    }
    for (const auto& c : cases) {
      try {
        const auto problems = check_in_memory(c);
        for (const auto& p : problems) std::fprintf(stderr, "%s: %s: %s\n", c.category.c_str(), c.name.c_str(), p.c_str());
        bad += !problems.empty();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s: %s\n", c.category.c_str(), c.name.c_str(), e.what());
        ++bad;
      }
    }
    ::_exit(bad == 0 ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("the corpus has every category") {
  std::map<std::string, std::size_t> per;
  std::map<std::pair<std::string, std::string>, std::size_t> codes;
  for (const auto& c : hostile::all_cases(good())) {
    ++per[c.category];
    ++codes[{c.category, std::string(errc_name(c.code))}];
    // What only checksums catch is exactly what is refused at load as a checksum mismatch:
    // every other load-stage case must be refused with Verify::none too.
    CHECK_MESSAGE(c.checksums_only == (c.stage == Stage::load && c.code == Errc::checksum_mismatch), c.name);
  }
  for (const auto& [key, k] : codes) MESSAGE(key.first << " / " << key.second << ": " << k);
  for (const char* cat : {"flip", "truncate", "shards", "paths", "numbers", "index", "header", "manifest", "latest", "huge", "sharding", "redundancy"})
    CHECK_MESSAGE(per[cat] > 0, cat);
  std::size_t total = 0;
  for (const auto& [cat, k] : per) total += k;
  MESSAGE("hostile corpus: " << total << " cases");
}
