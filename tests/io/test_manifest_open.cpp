// SPDX-License-Identifier: Apache-2.0
// Opening a checkpoint within the manifest limits (format/manifest_limits.hpp): hostile
// manifests refused by CheckpointReader::open before they cost memory, what a legitimate one
// costs (measured), the same refusals at commit, and the process-wide parse-once cache.
#include <doctest/doctest.h>

#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/format/detail/manifest_parse.hpp"
#include "ckpt/format/manifest_limits.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "io_fixture.hpp"

using namespace ckpt;
namespace json = boost::json;
using testing::MemoryFileSystem;

namespace {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// A one-rank checkpoint of `tensors` tensors (2 x F32 each) at DIR = /many/step-0000000001:
// its manifest and a shard file of the right size (open() reads no shard bytes).
struct ManyTensors {
  MemoryFileSystem fs;
  std::string dir = "/many/" + checkpoint_dir_name(1);
  std::string mpath = join_path(dir, kManifestName);
  Manifest m;
  std::string text;

  explicit ManyTensors(std::size_t tensors) {
    m.world_size = 1;
    m.step = 1;
    m.created_at = "2026-11-29T10:00:00.000Z";
    m.chunk_size = 4096;
    m.param_numel = 2 * tensors;
    ShardRecord s;
    s.path = "rank-00000-of-00001.safetensors";
    s.size = 8 * tensors;
    s.sha256 = std::string(64, 'a');
    s.chunk_xxh3.assign(static_cast<std::size_t>(chunk_count(s.size, m.chunk_size)), 0x0123456789abcdefull);
    s.param_shard_numel = 2 * tensors;
    m.shards.push_back(s);
    for (std::size_t i = 0; i < tensors; ++i)
      m.tensors.push_back({"model.layers." + std::to_string(i / 16) + ".mlp.w" + std::to_string(i), 0, DType::F32, {2}, 8 * i, 8 * i + 8});
    text = encode_manifest(m);
    fs.put_file(mpath, text);
    fs.put_file(join_path(dir, s.path), std::string(static_cast<std::size_t>(s.size), '\0'));
  }
};

// The peak growth of this process's resident set while `body` runs, measured in a child
// process: freed heap returned to the system first (so that what body allocates is counted
// and not served from pages already resident), the peak reset (clear_refs 5), then VmHWM
// against VmRSS. 0 where /proc does not allow it.
std::uint64_t status_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(std::strlen(field)));
  return 0;
}
std::uint64_t peak_rss_growth(const std::function<void()>& body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::malloc_trim(0);
    std::uint64_t growth = 0;
    if (std::ofstream("/proc/self/clear_refs") << "5") {
      const std::uint64_t before = status_kib("VmRSS:");
      body();
      growth = (status_kib("VmHWM:") - before) * 1024;
    }
    ::_exit(::write(fds[1], &growth, sizeof growth) == sizeof growth ? 0 : 1);
  }
  ::close(fds[1]);
  std::uint64_t growth = 0;
  const bool got = ::read(fds[0], &growth, sizeof growth) == sizeof growth;
  ::close(fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(got);
  return growth;
}

// Runs `body` in a child process whose address space may grow by `extra` bytes only; the
// child's exit status (0: body returned true).
int in_child_with_address_budget(std::uint64_t extra, const std::function<bool()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (!test::limit_address_space(extra)) ::_exit(4);
    try {
      ::_exit(body() ? 0 : 1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "unexpected: %s\n", e.what());
      ::_exit(3);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

// A saved two-rank checkpoint on disk whose manifest a test replaces.
struct OnDisk {
  test::TempDir dir{"ckpt-manifest"};
  test::Fixture fx{2, 10};
  Manifest m;
  std::string ckpt, mpath, text;
  OnDisk() {
    m = save_checkpoint_sync(posix_file_system(), dir.path().string(), fx.request);
    ckpt = (dir / checkpoint_dir_name(10)).string();
    mpath = join_path(ckpt, kManifestName);
    std::ifstream in(mpath);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  // Replaces the manifest as a writer would: a new file renamed over it.
  void replace(const std::string& t) const {
    const std::string tmp = mpath + ".new";
    std::ofstream(tmp, std::ios::binary) << t;
    std::filesystem::rename(tmp, mpath);
  }
  std::uint64_t allowance() const {
    (void)decode_manifest(text, mpath);
    return detail::last_manifest_parse().allowance;
  }
};

std::string before_last_brace(const std::string& text, const std::string& insert) {
  std::string t = text;
  t.insert(t.rfind('}'), insert);
  return t;
}

Error open_error(const OnDisk& d) {
  return test::expect_error([&] { (void)CheckpointReader::open(posix_file_system(), d.ckpt); });
}

// True if opening d's checkpoint in a child with 64 MiB of address space to spare fails with
// `e` again (not std::bad_alloc); true without checking under sanitizers (they reserve
// terabytes of address space).
bool refused_alike_in_64_mib(const OnDisk& d, const Error& e) {
  if (kSanitized) return true;
  return in_child_with_address_budget(64ull << 20, [&] {
           try {
             (void)CheckpointReader::open(posix_file_system(), d.ckpt);
           } catch (const Error& err) {
             return err.code() == e.code() && err.detail() == e.detail() && err.expected() == e.expected();
           }
           return false;
         }) == 0;
}
}  // namespace

TEST_CASE("a 48 MB manifest padded past its allowance is refused by open, naming it, the allowance and the size") {
  OnDisk d;
  const std::uint64_t allowance = d.allowance();
  const std::string padded = before_last_brace(d.text, std::string(48u << 20, ' '));
  d.replace(padded);
  const Error e = open_error(d);
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == d.mpath);
  CHECK(e.detail().find("file size against what its content needs") != std::string::npos);
  CHECK(e.expected() == "at most " + std::to_string(allowance) + " bytes");
  CHECK(e.actual() == std::to_string(padded.size()) + " bytes");
  // It costs no memory: refused the same in a process with 64 MiB of address space to spare.
  CHECK(refused_alike_in_64_mib(d, e));
}

TEST_CASE("a manifest of 5M keys in training, or of 40M numbers outside the schema, is refused by open without the memory") {
  OnDisk d;
  std::string keys = ",\"many\":{";
  keys.reserve(64u << 20);
  for (std::size_t i = 0; i < 5'000'000; ++i) keys += (i ? ",\"" : "\"") + std::to_string(i) + "\":0";
  keys += "}";
  // training is the last member: its object gets the extra member.
  std::string t = d.text;
  t.insert(t.rfind('}', t.rfind('}') - 1), keys);
  d.replace(t);
  const Error e = open_error(d);
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == d.mpath);
  CHECK(e.detail() == "values in the free-form parts (training and the shards' metadata), at training");
  CHECK(refused_alike_in_64_mib(d, e));

  std::string zeros = ",\"bulk\":[0";
  zeros.reserve(80u << 20);
  for (int i = 1; i < 40'000'000; ++i) zeros += ",0";
  d.replace(before_last_brace(d.text, zeros + "]"));
  const Error b = open_error(d);
  CHECK(b.code() == Errc::malformed_manifest);
  CHECK(b.file() == d.mpath);
  CHECK(b.detail().find("outside the manifest schema") != std::string::npos);
  CHECK(b.expected() == "at most 65536 bytes");
  CHECK(refused_alike_in_64_mib(d, b));
}

TEST_CASE("a 40 MB string in a shard's metadata is refused by open at 1 MiB, naming the shard entry") {
  OnDisk d;
  std::string t = d.text;
  const auto at = t.find("\"metadata\":{") + 12;
  t.insert(at, "\"blob\":\"" + std::string(40u << 20, 'x') + "\",");
  d.replace(t);
  const Error e = open_error(d);
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == d.mpath);
  CHECK(e.detail() == "length of the string at shards[0].metadata");
  CHECK(e.expected() == "at most 1048576 bytes");
  CHECK(refused_alike_in_64_mib(d, e));
}

TEST_CASE("opening a checkpoint holds memory per tensor within the documented bound, and none for padding") {
  for (std::size_t n : {1000, 10000, 100000}) {
    ManyTensors c(n);
    // Padding within the allowance: accepted, and costs nothing.
    (void)decode_manifest(c.text, c.mpath);
    const auto base = detail::last_manifest_parse();
    std::string padded = c.text;
    padded.insert(padded.size() - 2, static_cast<std::size_t>(base.allowance - padded.size()), ' ');
    MemoryFileSystem pfs = c.fs.clone();
    pfs.put_file(c.mpath, padded);

    auto open_and_hold = [&](FileSystem& fs) {
      const auto r = CheckpointReader::open(fs, c.dir);
      if (r.manifest().tensors.size() != n) ::_exit(2);
    };
    std::uint64_t dom = 0, dom_padded = 0;
    {
      const auto r = CheckpointReader::open(c.fs, c.dir);
      CHECK(r.manifest().tensors.size() == n);
      dom = detail::last_manifest_parse().peak;
    }
    {
      const auto r = CheckpointReader::open(pfs, c.dir);
      dom_padded = detail::last_manifest_parse().peak;
    }
    // The document: at most 1 KiB per tensor (docs/format.md), the same with padding.
    CHECK(dom <= 1024 * n + (64u << 10));
    CHECK(dom_padded == dom);
    if (kSanitized) {
      MESSAGE(n << " tensors: document peak " << dom << " bytes (" << dom / n << " per tensor); RSS not measured under sanitizers");
      continue;
    }
    // The whole open, as the kernel sees it (document, Manifest, read buffer): at most
    // 2 KiB per tensor plus 8 MiB, and padding (3 times the text) adds under 2 MiB.
    const std::uint64_t rss = peak_rss_growth([&] { open_and_hold(c.fs); });
    const std::uint64_t rss_padded = peak_rss_growth([&] { open_and_hold(pfs); });
    MESSAGE(n << " tensors, manifest " << c.text.size() << " bytes (padded " << padded.size() << "): document peak " << dom << " bytes ("
              << dom / n << " per tensor); peak RSS growth " << rss << " bytes (" << rss / n << " per tensor), padded " << rss_padded);
    CHECK(rss <= 2048 * n + (8u << 20));
    CHECK(rss_padded <= rss + (2u << 20));
  }
}

TEST_CASE("commit refuses a manifest the loader would refuse, with the loader's error, and commits nothing") {
  test::TempDir dir("ckpt-manifest");
  test::Fixture fx(2, 10);
  json_of(fx.request.training)["note"] = std::string(kMaxManifestStringBytes + 1, 'x');
  const Error e = test::expect_error([&] { (void)save_checkpoint_sync(posix_file_system(), dir.path().string(), fx.request); });
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file().ends_with(std::string(kManifestName)));
  CHECK(e.detail() == "length of the string at training");
  CHECK(e.expected() == "at most 1048576 bytes");
  CHECK(test::names_in(dir.path()) == std::vector<std::string>{".lock"});  // no step directory, no latest, no temporary

  // The loader, given a manifest that says the same, refuses it with the same error.
  ManyTensors c(2);
  Manifest m = c.m;
  json_of(m.training)["note"] = std::string(kMaxManifestStringBytes + 1, 'x');
  c.fs.put_file(c.mpath, encode_manifest(m));
  const Error l = test::expect_error([&] { (void)CheckpointReader::open(c.fs, c.dir); });
  CHECK(l.code() == e.code());
  CHECK(l.detail() == e.detail());
  CHECK(l.expected() == e.expected());
  CHECK(l.actual() == e.actual());
  CHECK(l.file() == c.mpath);
}

TEST_CASE("a checkpoint whose training holds a trainer's param_layout of 100k tensors commits and opens, within the free-form budget") {
  test::TempDir dir("ckpt-manifest");
  test::Fixture fx(2, 10);
  json::array layout;
  for (int i = 0; i < 100000; ++i)
    layout.push_back(json::object{{"name", "model.layers." + std::to_string(i / 16) + ".attn.w" + std::to_string(i)},
                                  {"shape", json::array{4096, 4096}},
                                  {"offset", 16777216ull * static_cast<std::uint64_t>(i)},
                                  {"numel", 16777216}});
  json_of(fx.request.training)["param_layout"] = layout;
  save_checkpoint_sync(posix_file_system(), dir.path().string(), fx.request);
  const auto opened = open_latest(posix_file_system(), dir.path().string(), {.expected_world_size = 2});
  CHECK(json_of(opened.reader.manifest().training).at("param_layout").as_array() == layout);
  // With room to spare: a quarter of the free-form bytes, under three quarters of its values.
  const auto st = detail::last_manifest_parse();
  MESSAGE("param_layout of 100k tensors: " << st.counts.free_form_bytes << " bytes, " << st.counts.free_form_values << " values");
  CHECK(st.counts.free_form_bytes * 4 < kFreeFormBytes);
  CHECK(st.counts.free_form_values < kFreeFormValues * 3 / 4);
}

TEST_CASE("readers of one manifest share one decode, threads opening it at once wait for it") {
  ManyTensors c(2000);
  const std::uint64_t before = detail::manifest_decode_count();
  std::vector<std::optional<CheckpointReader>> readers(8);
  {
    std::vector<std::thread> ts;
    for (auto& r : readers) ts.emplace_back([&] { r.emplace(CheckpointReader::open(c.fs, c.dir)); });
    for (auto& t : ts) t.join();
  }
  CHECK(detail::manifest_decode_count() - before == 1);
  for (const auto& r : readers) CHECK(&r->manifest() == &readers[0]->manifest());
  // More opens while one reader holds it: no decode; open_latest-style checks still run.
  for (int i = 0; i < 5; ++i) CHECK(CheckpointReader::open(c.fs, c.dir).manifest().tensors.size() == 2000);
  CHECK(detail::manifest_decode_count() - before == 1);
  const Error wrong = test::expect_error([&] { (void)CheckpointReader::open(c.fs, c.dir, 4); });
  CHECK(wrong.code() == Errc::world_size_mismatch);
  // Another file system holding the same path is another file.
  MemoryFileSystem other = c.fs.clone();
  CHECK(&CheckpointReader::open(other, c.dir).manifest() != &readers[0]->manifest());
  CHECK(detail::manifest_decode_count() - before == 2);
}

TEST_CASE("a rewritten manifest is parsed again, in memory and on disk") {
  ManyTensors c(10);
  const auto r1 = CheckpointReader::open(c.fs, c.dir);
  Manifest m = c.m;
  json_of(m.training)["lr"] = 0.5;
  c.fs.put_file(c.mpath, encode_manifest(m));
  const std::uint64_t before = detail::manifest_decode_count();
  const auto r2 = CheckpointReader::open(c.fs, c.dir);
  CHECK(detail::manifest_decode_count() - before == 1);
  CHECK(json_of(r2.manifest().training).at("lr").as_double() == 0.5);
  CHECK_FALSE(r1.manifest().training.contains("lr"));

  OnDisk d;
  const auto p1 = CheckpointReader::open(posix_file_system(), d.ckpt);
  json::value v = json::parse(d.text);
  v.as_object()["training"].as_object()["lr"] = 0.25;
  d.replace(encode_manifest(decode_manifest(json::serialize(v), d.mpath)));
  const auto p2 = CheckpointReader::open(posix_file_system(), d.ckpt);
  CHECK(json_of(p1.manifest().training).at("lr").as_double() == 0.001);
  CHECK(json_of(p2.manifest().training).at("lr").as_double() == 0.25);
}

TEST_CASE("a manifest decoded by no reader any more is decoded again by the next open") {
  ManyTensors c(10);
  (void)CheckpointReader::open(c.fs, c.dir);
  const std::uint64_t before = detail::manifest_decode_count();
  (void)CheckpointReader::open(c.fs, c.dir);
  CHECK(detail::manifest_decode_count() - before == 1);
}

TEST_CASE("a failed decode is not cached: every open reports the error") {
  ManyTensors c(10);
  c.fs.put_file(c.mpath, c.text.substr(0, c.text.size() / 2));
  for (int i = 0; i < 3; ++i) {
    const Error e = test::expect_error([&] { (void)CheckpointReader::open(c.fs, c.dir); });
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.file() == c.mpath);
  }
}
