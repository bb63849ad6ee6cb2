// SPDX-License-Identifier: Apache-2.0
// The ckpt command-line tool, run as a user would run it.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cstring>
#include <filesystem>
#include <map>

#include "ckpt/format/boost_json.hpp"
#include "../io/io_fixture.hpp"
#include "../io/test_reshard_safetensors.hpp"
#include "ckpt/dist/communicator.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/read/range_reader.hpp"
#include "ckpt/shard/shard_writer.hpp"
#include "apps/ckpt_tool_fixture.hpp"
#include "cli.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
using test::ckpt_run;
using test::kTool;
using test::Saved;

void flip(const fs::path& p, std::size_t at) {
  auto b = test::read_all(p);
  b.at(at) ^= 1;
  test::write_all(p, b);
}
}  // namespace

TEST_CASE("ckpt verify accepts a checkpoint the library wrote, fast and full") {
  Saved s;
  auto r = ckpt_run("verify " + s.ckpt_dir().string());
  CHECK(r.status == 0);
  CHECK(r.out.find("OK ") == 0);
  r = ckpt_run("verify --full " + s.dir.path().string());  // a root: verifies its latest
  CHECK(r.status == 0);
  CHECK(r.out.find("sha256") != std::string::npos);
}

TEST_CASE("ckpt verify rejects each corrupted variant with its typed error") {
  struct Case {
    const char* what;
    std::function<void(Saved&)> damage;
    const char* error;
  };
  const std::vector<Case> cases = {
      {"flipped data byte", [](Saved& s) { flip(s.shard(1), s.m.tensors.back().begin); }, "checksum mismatch"},
      {"flipped header byte", [](Saved& s) { flip(s.shard(0), 20); }, "checksum mismatch"},
      {"truncated shard", [](Saved& s) { fs::resize_file(s.shard(0), 4096); }, "size mismatch"},
      {"missing shard", [](Saved& s) { fs::remove(s.shard(1)); }, "missing shard"},
      {"missing manifest", [](Saved& s) { fs::remove(s.ckpt_dir() / "manifest.json"); }, "not found"},
      {"garbage manifest", [](Saved& s) { test::write_all(s.ckpt_dir() / "manifest.json", {'{', 'x'}); }, "malformed manifest"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    Saved s;
    c.damage(s);
    const auto r = ckpt_run("verify " + s.ckpt_dir().string());
    CHECK(r.status == 1);
    CHECK(r.out.find(c.error) != std::string::npos);
    CHECK(r.out.find(s.ckpt_dir().string()) != std::string::npos);  // names the file
  }
}

TEST_CASE("ckpt verify of a 48 MB manifest past its allowance exits 1 with the typed error naming the manifest") {
  Saved s;
  const fs::path mpath = s.ckpt_dir() / "manifest.json";
  auto text = test::read_all(mpath);
  text.insert(text.begin() + static_cast<std::ptrdiff_t>(text.size() - 2), 48u << 20, ' ');
  test::write_all(mpath, text);
  const auto r = ckpt_run("verify " + s.ckpt_dir().string());
  CHECK(r.status == 1);
  CHECK(r.out.find("malformed manifest") != std::string::npos);
  CHECK(r.out.find(mpath.string()) != std::string::npos);
  CHECK(r.out.find("file size against what its content needs") != std::string::npos);
  CHECK(r.out.find("bad_alloc") == std::string::npos);
}

TEST_CASE("ckpt verify --full catches what only SHA-256 sees and reports JSON") {
  Saved s;
  flip(s.shard(0), s.m.tensors.back().begin);
  const auto r = ckpt_run("verify --full --json " + s.ckpt_dir().string());
  CHECK(r.status == 1);
  const auto line = r.out.substr(0, r.out.find('\n'));
  const auto v = boost::json::parse(line).as_object();
  CHECK(v.at("ok").as_bool() == false);
  CHECK(v.at("error").at("code").as_string() == "checksum_mismatch");
  CHECK(v.at("error").at("file").as_string() == s.shard(0).string());
}

TEST_CASE("ckpt ls shows each checkpoint's state and inspect shows the tensor table") {
  Saved s;
  fs::create_directory(s.dir / ".tmp-step-0000000011-1-0");
  auto r = ckpt_run("ls " + s.dir.path().string());
  CHECK(r.status == 0);
  CHECK(r.out.find("complete (latest)") != std::string::npos);
  CHECK(r.out.find("in progress") != std::string::npos);
  fs::resize_file(s.shard(0), 100);
  r = ckpt_run("ls --json " + s.dir.path().string());
  CHECK(r.status == 1);
  const auto v = boost::json::parse(r.out).as_object();
  CHECK(v.at("checkpoints").as_array().size() == 2);
  CHECK(v.at("checkpoints").as_array()[1].at("state").as_string() == "corrupt");
  Saved t;
  r = ckpt_run("inspect " + t.ckpt_dir().string());
  CHECK(r.status == 0);
  CHECK(r.out.find("world size  2") != std::string::npos);
  CHECK(r.out.find("f32") != std::string::npos);
  CHECK(r.out.find("[33, 31]") != std::string::npos);
}

TEST_CASE("ckpt usage errors exit 2 and help exits 0") {
  CHECK(ckpt_run("").status == 2);
  CHECK(ckpt_run("frobnicate x").status == 2);
  CHECK(ckpt_run("verify").status == 2);
  CHECK(ckpt_run("ls --verify sometimes /tmp").status == 2);
  const auto r = ckpt_run("--help");
  CHECK(r.status == 0);
  CHECK(r.out.find("exit codes") != std::string::npos);
}

// ---- reshard, consolidate, prune, diff ------------------------------------------------

namespace {
const std::string kDemo = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt-demo";

// A root holding the 4-rank demo's checkpoints of steps 10 and 20 (latest).
struct DemoRun {
  test::TempDir dir;
  std::string root = (dir / "run").string();
  DemoRun() {
    int status = 0;
    test::run_command(kDemo + " --dir " + root + " > /dev/null 2>&1", &status);
    REQUIRE(status == 0);
  }
  std::string step(std::uint64_t s) const { return root + "/" + checkpoint_dir_name(s); }
};

boost::json::object json_of(const std::string& out) {
  return boost::json::parse(out.substr(0, out.find('\n'))).as_object();
}

std::vector<std::string> shard_hashes(const std::string& dir) {
  std::vector<std::string> out;
  const auto reader = CheckpointReader::open(posix_file_system(), dir);
  for (const auto& s : reader.manifest().shards) out.push_back(s.sha256);
  return out;
}

using ckpt::test::names_in;
}  // namespace

TEST_CASE("ckpt reshard takes the demo checkpoint from 4 ranks to 8, to 3 and back to 4 byte for byte") {
  DemoRun demo;
  const std::string r8 = (demo.dir / "r8").string(), r3 = (demo.dir / "r3").string(), r4 = (demo.dir / "r4").string();
  auto r = ckpt_run("reshard " + demo.root + " " + r8 + " --world-size 8");
  REQUIRE(r.status == 0);
  CHECK(r.out.find("from world size 4 to 8") != std::string::npos);
  r = ckpt_run("reshard " + r8 + " " + r3 + " --world-size 3 --buffer-mb 1");
  REQUIRE(r.status == 0);
  r = ckpt_run("reshard " + r3 + " " + r4 + " --world-size=4 --verify full --json");
  REQUIRE(r.status == 0);
  const auto v = json_of(r.out);
  CHECK(v.at("ok").as_bool());
  CHECK(v.at("from_world_size").as_int64() == 3);
  CHECK(v.at("world_size").as_int64() == 4);
  CHECK(v.at("shards").as_array().size() == 4);
  for (const auto& root : {r8, r3, r4}) {
    CAPTURE(root);
    CHECK(ckpt_run("verify --full " + root).status == 0);
  }
  CHECK(shard_hashes(demo.root + "/step-0000000020") == shard_hashes(r4 + "/step-0000000020"));
}

TEST_CASE("ckpt consolidate writes the demo model as safetensors with a weight-map index") {
  DemoRun demo;
  const std::string out = (demo.dir / "model").string();
  const auto r = ckpt_run("consolidate " + demo.root + " " + out + " --max-file-size 40K --json");
  REQUIRE(r.status == 0);
  const auto v = json_of(r.out);
  CHECK(v.at("index").as_string() == "model.safetensors.index.json");
  CHECK(v.at("dtype").as_string() == "F32");
  CHECK(v.at("config").as_string() == "config.json");
  {
    const auto b = test::read_all(fs::path(out) / "config.json");
    const auto reader = CheckpointReader::open(posix_file_system(), demo.step(20));
    CHECK(boost::json::parse(std::string(b.begin(), b.end())) == json_of(reader.manifest().training).at("config"));
  }
  const auto index = boost::json::parse([&] {
                       const auto b = test::read_all(fs::path(out) / "model.safetensors.index.json");
                       return std::string(b.begin(), b.end());
                     }()).as_object();
  const auto reader = CheckpointReader::open(posix_file_system(), demo.step(20));
  const auto& layout = json_of(reader.manifest().training).at("param_layout").as_array();
  const auto& wm = index.at("weight_map").as_object();
  CHECK(wm.size() == layout.size());
  // Each tensor equals its range of the concatenated master shards.
  std::vector<std::byte> master;
  for (int rank = 0; rank < 4; ++rank) {
    const auto b = reader.read_tensor("optim.master", rank);
    master.insert(master.end(), b.begin(), b.end());
  }
  std::map<std::string, test::StFile> files;
  for (const auto& p : layout) {
    const std::string name(p.at("name").as_string());
    CAPTURE(name);
    const std::string file(wm.at(name).as_string());
    if (!files.count(file)) files[file] = test::parse_safetensors_independently(test::read_all(fs::path(out) / file));
    const auto& t = files[file].tensors.at(name);
    const auto off = p.at("offset").to_number<std::uint64_t>(), n = p.at("numel").to_number<std::uint64_t>();
    REQUIRE(t.bytes.size() == n * 4);
    CHECK(std::memcmp(t.bytes.data(), master.data() + off * 4, n * 4) == 0);
  }
  CHECK(files.size() > 1);
  CHECK(ckpt_run("consolidate " + demo.step(10) + " " + (demo.dir / "bf16").string() + " --dtype bf16").status == 0);
  CHECK(fs::exists(demo.dir / "bf16" / "model.safetensors"));
}

TEST_CASE("ckpt reshard and consolidate of a corrupt source fail with the typed error and leave no output") {
  DemoRun demo;
  const auto m = CheckpointReader::open(posix_file_system(), demo.step(20)).manifest();
  const fs::path shard = fs::path(demo.step(20)) / m.shards[3].path;
  flip(shard, m.find_tensor("optim.v", 3)->begin + 17);
  const auto before = names_in(demo.dir.path());
  for (const std::string& cmd : {"reshard " + demo.root + " " + (demo.dir / "r8").string() + " --world-size 8 --json",
                                "consolidate " + demo.root + " " + (demo.dir / "model").string() + " --json"}) {
    CAPTURE(cmd);
    const auto r = ckpt_run(cmd);
    CHECK(r.status == 1);
    const auto v = json_of(r.out);
    CHECK(v.at("ok").as_bool() == false);
    CHECK(v.at("error").at("code").as_string() == "checksum_mismatch");
    CHECK(v.at("error").at("file").as_string() == shard.string());
    CHECK(names_in(demo.dir.path()) == before);  // no output, no temporary
  }
}

TEST_CASE("ckpt reshard --verify none copies a corrupt source only when asked, says so, and inspect and verify of the copy show it") {
  DemoRun demo;
  const auto m = CheckpointReader::open(posix_file_system(), demo.step(20)).manifest();
  const fs::path shard = fs::path(demo.step(20)) / m.shards[3].path;
  flip(shard, m.find_tensor("optim.v", 3)->begin + 17);
  const std::string copy = (demo.dir / "r2").string(), err = (demo.dir / "err").string();
  for (const char* mode : {"fast", "full"}) {  // refused at every level but none
    CAPTURE(mode);
    const auto r = ckpt_run("reshard " + demo.root + " " + copy + " --world-size 2 --json --verify " + mode);
    CHECK(r.status == 1);
    CHECK(json_of(r.out).at("error").at("code").as_string() == "checksum_mismatch");
    CHECK(!fs::exists(copy));
  }
  int status = -1;
  const std::string out = test::run_command(kTool + " reshard " + demo.root + " " + copy + " --world-size 2 --json --verify none 2>" + err, &status);
  REQUIRE(status == 0);
  CHECK(json_of(out).at("source_verify").as_string() == "none");
  const auto logged = test::read_all(err);
  CHECK(std::string(logged.begin(), logged.end()).find("reshard with verify none: the source's checksums are not checked") != std::string::npos);
  // The copy's own checksums hold (they are of what was copied): verify passes and says the
  // source was not checked; inspect shows it.
  auto r = ckpt_run("verify --full " + copy);
  CHECK(r.status == 0);
  CHECK(r.out.find("\nwarning: resharded from world size 4, its source read with --verify none: its bytes were copied unchecked") !=
        std::string::npos);
  r = ckpt_run("verify --full --json " + copy);
  CHECK(json_of(r.out).at("source_verify").as_string() == "none");
  r = ckpt_run("inspect " + copy);
  CHECK(r.out.find("\norigin      resharded from world size 4, its source read with --verify none") != std::string::npos);
  // A fully checked reshard of the copy keeps the mark: its bytes were never checked against the job's.
  r = ckpt_run("reshard " + copy + " " + (demo.dir / "r4").string() + " --world-size 4 --verify full");
  CHECK(r.status == 0);
  CHECK(r.out.find("source checked: full (xxh3 per chunk + sha256); the source is itself a reshard whose source was checked only as none") !=
        std::string::npos);
  r = ckpt_run("verify --json " + (demo.dir / "r4").string());
  CHECK(json_of(r.out).at("source_verify").as_string() == "none");
  // A checkpoint the job wrote records nothing: null in --json, no line in the text.
  flip(shard, m.find_tensor("optim.v", 3)->begin + 17);
  r = ckpt_run("verify --json " + demo.root);
  CHECK(json_of(r.out).at("source_verify").is_null());
  CHECK(ckpt_run("inspect " + demo.root).out.find("origin ") == std::string::npos);
}

namespace {
// A 2-rank checkpoint of 3 x 16 Mi fp32 values (192 MiB), written through the streaming
// writer so that the test itself stays small.
constexpr std::uint64_t kBigParams = 16ull << 20;
void write_big_checkpoint(const std::string& root) {
  FileSystem& fs = posix_file_system();
  const RootLock lock(fs, root);
  prepare_root(fs, lock);
  const std::string temp = begin_checkpoint(fs, root, 1);
  std::vector<ShardReport> reports;
  std::vector<float> piece(1 << 18);
  for (int r = 0; r < 2; ++r) {
    const auto range = dist::shard_range(kBigParams, 2, r);
    std::vector<TensorSpec> specs;
    for (const char* n : {"optim.master", "optim.m", "optim.v"}) specs.push_back({n, DType::F32, {range.numel}});
    ShardWriter w = ShardWriter::stream(fs, temp, shard_file_name(r, 2), specs, {});
    for (std::size_t k = 0; k < specs.size(); ++k)
      for (std::uint64_t done = 0; done < range.numel; done += piece.size()) {
        for (std::size_t i = 0; i < piece.size(); ++i) piece[i] = static_cast<float>((range.offset + done + i) % 4099) + static_cast<float>(k);
        w.write(std::as_bytes(std::span(piece)));
      }
    ShardReport ws = w.finish(r);
    ws.shard.param_shard_offset = range.offset;
    ws.shard.param_shard_numel = range.numel;
    if (r == 0) {
      ws.param_numel = kBigParams;
      json_of(ws.training) = {{"flat_tensors", boost::json::array{"optim.master", "optim.m", "optim.v"}}, {"num_params", kBigParams}};
    }
    reports.push_back(std::move(ws));
  }
  commit_checkpoint(fs, root, temp, assemble_manifest(1, kDefaultChunkSize, std::move(reports)));
}

// Peak resident memory of `ckpt args...` in KiB, from the kernel (wait4's rusage).
std::uint64_t peak_rss_kib(std::vector<std::string> args) {
  args.insert(args.begin(), kTool);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(kTool.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  rusage ru{};
  REQUIRE(::wait4(pid, &status, 0, &ru) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  return static_cast<std::uint64_t>(ru.ru_maxrss);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// The cap for a 16 MiB buffer: the buffer, two 4 MiB verification chunks, 8 MiB of slack,
// above what the tool takes to start (measured, not assumed).
void check_under_cap(const std::string& what, std::uint64_t peak, std::uint64_t base) {
  const std::uint64_t checkpoint_kib = 3 * kBigParams * 4 / 1024;
  MESSAGE(what << ": checkpoint " << checkpoint_kib / 1024 << " MiB, peak RSS " << peak / 1024 << " MiB (the tool alone "
               << base / 1024 << " MiB)");
  // Shadow memory and the quarantine of freed blocks make a sanitized binary's RSS say
  // nothing about the code's own use: the bound is checked in plain builds only.
  if (kSanitized) return;
  CHECK(peak < base + (16 + 8 + 8) * 1024);
  CHECK(peak * 4 < checkpoint_kib);
}
}  // namespace

TEST_CASE("ckpt reshard of a checkpoint larger than its buffer stays under the memory cap") {
  test::TempDir dir;
  const std::string src = (dir / "src").string();
  write_big_checkpoint(src);
  const std::uint64_t base = peak_rss_kib({"inspect", src});
  const std::uint64_t peak = peak_rss_kib({"reshard", src, (dir / "dst").string(), "--world-size", "3", "--buffer-mb", "16"});
  check_under_cap("reshard 2 -> 3", peak, base);
  CHECK(ckpt_run("verify " + (dir / "dst").string()).status == 0);
}

TEST_CASE("ckpt consolidate of a checkpoint larger than its buffer stays under the memory cap") {
  test::TempDir dir;
  const std::string src = (dir / "src").string();
  write_big_checkpoint(src);
  const std::uint64_t base = peak_rss_kib({"inspect", src});
  // No param_layout recorded: the master weights come out as one 64 MiB tensor, cast to bf16.
  const std::uint64_t peak = peak_rss_kib({"consolidate", src, (dir / "model").string(), "--dtype", "bf16", "--buffer-mb", "16"});
  check_under_cap("consolidate", peak, base);
  const auto st = test::parse_safetensors_independently(test::read_all(dir / "model" / "model.safetensors"));
  CHECK(st.tensors.at("optim.master").shape == std::vector<std::uint64_t>{kBigParams});
}

TEST_CASE("ckpt prune keeps the newest K checkpoints and the one latest names") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  for (std::uint64_t step : {1, 2, 3, 4, 5}) {
    test::Fixture fx(1, step);
    save_checkpoint_sync(posix_file_system(), root, fx.request);
  }
  write_latest(posix_file_system(), root, checkpoint_dir_name(1));  // latest may be an old one
  fs::create_directory(dir / ".tmp-step-0000000006-1-0");           // a save in progress: untouched
  auto r = ckpt_run("prune " + root + " --keep 2 --dry-run");
  CHECK(r.status == 0);
  CHECK(r.out.find("would remove step-0000000002") != std::string::npos);
  CHECK(names_in(dir.path()).size() == 8);  // with the root's .lock
  r = ckpt_run("prune " + root + " --keep 2 --json");
  REQUIRE(r.status == 0);
  const auto v = json_of(r.out);
  CHECK(v.at("removed").as_array().size() == 2);
  CHECK(names_in(dir.path()) == std::vector<std::string>{".lock", ".tmp-step-0000000006-1-0", "latest", "step-0000000001",
                                                        "step-0000000004", "step-0000000005"});
  CHECK(ckpt_run("prune " + root + " --keep 0").status == 2);
  CHECK(ckpt_run("prune " + root).status == 2);
}

TEST_CASE("ckpt prune and ckpt reshard into a root a writer holds exit 1 with busy and change nothing, readers go on") {
  DemoRun demo;
  test::TempDir dir;
  const std::string root = (dir / "eight").string();
  REQUIRE(ckpt_run("reshard " + demo.step(10) + " " + root + " --world-size 8").status == 0);
  REQUIRE(ckpt_run("reshard " + demo.step(20) + " " + root + " --world-size 8").status == 0);
  const auto before = names_in(root);
  const RootLock job(posix_file_system(), root);  // a job saving to the root
  const std::string pid = "pid " + std::to_string(::getpid()) + " ";
  for (const std::string& cmd : {"prune " + root + " --keep 1", "reshard " + demo.step(20) + " " + root + " --world-size 2"}) {
    CAPTURE(cmd);
    auto r = ckpt_run(cmd);
    CHECK(r.status == 1);
    CHECK(r.out.find("busy: " + root + ": another writer holds its lock " + root + "/.lock") != std::string::npos);
    CHECK(r.out.find(pid) != std::string::npos);
    r = ckpt_run(cmd + " --json");
    CHECK(r.status == 1);
    const auto v = json_of(r.out);
    CHECK(v.at("error").at("code").as_string() == "busy");
    CHECK(v.at("error").at("file").as_string() == root);
    CHECK(std::string(v.at("error").at("actual").as_string()).starts_with(pid));
    CHECK(names_in(root) == before);
  }
  // Readers take no lock.
  CHECK(ckpt_run("prune " + root + " --keep 1 --dry-run").status == 0);
  CHECK(ckpt_run("ls " + root).status == 0);
  CHECK(ckpt_run("verify --full " + root).status == 0);
  CHECK(ckpt_run("inspect " + root).status == 0);
  CHECK(ckpt_run("diff " + root + " " + root).status == 0);
  CHECK(names_in(root) == before);
}

TEST_CASE("ckpt diff reports equal tensors, the largest difference, and mismatches") {
  DemoRun demo;
  const std::string r8 = (demo.dir / "r8").string();
  REQUIRE(ckpt_run("reshard " + demo.root + " " + r8 + " --world-size 8").status == 0);
  // A checkpoint and its reshard are equal, flat tensors compared across world sizes.
  auto r = ckpt_run("diff " + demo.root + " " + r8);
  CHECK(r.status == 0);
  CHECK(r.out.find("the checkpoints are equal") != std::string::npos);
  // Two steps of training differ; the JSON gives the largest absolute difference.
  r = ckpt_run("diff " + demo.step(10) + " " + demo.step(20) + " --json");
  CHECK(r.status == 3);
  const auto v = json_of(r.out);
  CHECK(v.at("equal").as_bool() == false);
  const auto& first = v.at("tensors").as_array()[0].as_object();
  CHECK(first.at("name").as_string() == "optim.master");
  CHECK(first.at("flat").as_bool());
  CHECK(first.at("status").as_string() == "differs");
  CHECK(first.at("max_abs_diff").as_double() > 0);
  // Shape and dtype mismatches and one-sided tensors are named.
  test::TempDir other;
  std::vector<float> x4(4, 1.0f), x5(5, 1.0f);
  std::vector<std::uint16_t> y(4);
  for (int k = 0; k < 2; ++k) {
    SaveRequest req;
    req.step = 1;
    RankState rs;
    rs.tensors = {{"x", DType::F32, {k ? 5u : 4u}, std::as_bytes(std::span(k ? x5 : x4))},
                  {k ? "only_b" : "y", k ? DType::F16 : DType::F32, {k ? 4u : 2u}, std::as_bytes(std::span(y))}};
    req.ranks.push_back(rs);
    save_checkpoint_sync(posix_file_system(), (other / (k ? "b" : "a")).string(), req);
  }
  r = ckpt_run("diff " + (other / "a").string() + " " + (other / "b").string());
  CHECK(r.status == 3);
  CHECK(r.out.find("shape mismatch") != std::string::npos);
  CHECK(r.out.find("[4] vs [5]") != std::string::npos);
  CHECK(r.out.find("only in A") != std::string::npos);
  CHECK(r.out.find("only in B") != std::string::npos);
  // A flipped byte in A: refused by the default --verify fast (the checksum of the chunk
  // read), compared as it is with --verify none.
  const auto ra = CheckpointReader::open(posix_file_system(), (other / "a" / checkpoint_dir_name(1)).string());
  auto bytes = test::read_all(ra.shard_path(0));
  bytes[ra.manifest().find_tensor("x", 0)->begin] ^= 0x40;
  test::write_all(ra.shard_path(0), bytes);
  r = ckpt_run("diff " + (other / "a").string() + " " + (other / "b").string());
  CHECK(r.status == 1);
  CHECK_MESSAGE(r.out.find("checksum mismatch: " + ra.shard_path(0)) != std::string::npos, r.out);
  r = ckpt_run("diff --verify none " + (other / "a").string() + " " + (other / "b").string());
  CHECK(r.status == 3);
  CHECK(r.out.find("shape mismatch") != std::string::npos);
}

TEST_CASE("every ckpt command answers --json with one JSON object") {
  DemoRun demo;
  const std::vector<std::string> cmds = {"ls " + demo.root,
                                         "inspect " + demo.root,
                                         "verify " + demo.root,
                                         "reshard " + demo.root + " " + (demo.dir / "r2").string() + " --world-size 2",
                                         "consolidate " + demo.root + " " + (demo.dir / "m").string(),
                                         "diff " + demo.root + " " + (demo.dir / "r2").string(),
                                         "get " + demo.root + " optim.master --out " + (demo.dir / "m.npy").string(),
                                         "prune " + demo.root + " --keep 1"};
  for (const auto& c : cmds) {
    CAPTURE(c);
    const auto r = ckpt_run(c + " --json");
    CHECK(r.status == 0);
    CHECK(r.out.find('\n') == r.out.size() - 1);  // one line, nothing else (no progress bar in a pipe)
    CHECK(json_of(r.out).at("ok").as_bool());
  }
}

TEST_CASE("ckpt --help documents every command and exit code, and each command has its own help") {
  const auto top = ckpt_run("--help");
  CHECK(top.status == 0);
  for (const char* cmd : {"ls", "inspect", "verify", "reshard", "consolidate", "prune", "diff", "get"}) {
    CAPTURE(cmd);
    CHECK(top.out.find(std::string("  ") + cmd + " ") != std::string::npos);
    for (const std::string& form : {std::string(cmd) + " --help", std::string("help ") + cmd}) {
      const auto r = ckpt_run(form);
      CHECK(r.status == 0);
      CHECK(r.out.find(std::string("usage: ckpt ") + cmd) == 0);
      CHECK(r.out.find("example:") != std::string::npos);
    }
  }
  for (const char* code : {"  0  ", "  1  ", "  2  ", "  3  ", "  4  "}) CHECK(top.out.find(code) != std::string::npos);
  CHECK(top.out.find("  4  verify, inspect, get, diff, reshard, consolidate: the checkpoint being read was\n     rotated away") !=
        std::string::npos);
  CHECK(ckpt_run("verify --help").out.find("exit: 0 verified, 1 damaged or unreadable, 4 rotated away while it was read") != std::string::npos);
  CHECK(ckpt_run("reshard a b").status == 2);                     // --world-size missing
  CHECK(ckpt_run("reshard a b --world-size 0").status == 2);
  CHECK(ckpt_run("consolidate a b --dtype f64").status == 2);
  CHECK(ckpt_run("consolidate a b --max-file-size 5Q").status == 2);
  CHECK(ckpt_run("diff a b --full").status == 2);                  // an option of another command
}

// ---- the command line ------------------------------------------------------------------

TEST_CASE("a wrong flag is a usage error of every command: exit 2, the flag named, nothing on stdout") {
  test::TempDir dir;
  const std::string d = dir.path().string();
  for (const std::string& cmd : {"ls " + d, "inspect " + d, "verify " + d, "reshard " + d + " " + d + "/x --world-size 2",
                                 "consolidate " + d + " " + d + "/x", "prune " + d + " --keep 1", "diff " + d + " " + d,
                                 "get " + d + " t --out " + d + "/t.npy"}) {
    CAPTURE(cmd);
    int status = 0;
    const std::string out = test::run_command(kTool + " " + cmd + " --no-such-flag 2>/dev/null", &status);
    CHECK(status == 2);
    CHECK(out.empty());
    const auto r = ckpt_run(cmd + " --no-such-flag");
    CHECK(r.out.find("--no-such-flag") != std::string::npos);
    CHECK(r.out.find("run 'ckpt " + cmd.substr(0, cmd.find(' ')) + " --help' for usage") != std::string::npos);
  }
  CHECK(names_in(dir.path()).empty());  // nothing ran
  const auto r = ckpt_run("frobnicate x");
  CHECK(r.status == 2);
  CHECK(r.out.find("unknown command 'frobnicate'") != std::string::npos);
  CHECK(ckpt_run("help frobnicate").status == 2);
}

TEST_CASE("with --json a usage error is one JSON object on stdout with the usage code and the message") {
  for (const std::string cmd : {"ls /tmp --verify sometimes --json", "verify --json --no-such-flag /tmp", "reshard a b --json",
                                 "consolidate a b --max-file-size 5Q --json", "prune /tmp --keep 0 --json", "--json frobnicate"}) {
    CAPTURE(cmd);
    int status = 0;
    const std::string out = test::run_command(kTool + " " + cmd + " 2>/dev/null", &status);
    CHECK(status == 2);
    REQUIRE(out.find('\n') == out.size() - 1);  // one line
    const auto v = boost::json::parse(out).as_object();
    CHECK(v.at("ok").as_bool() == false);
    CHECK(v.at("error").at("code").as_string() == "usage");
    CHECK(!v.at("error").at("message").as_string().empty());
  }
  const auto v = boost::json::parse(test::run_command(kTool + " reshard a b --json 2>/dev/null")).as_object();
  CHECK(v.at("error").at("message").as_string() == "--world-size is required");
}

TEST_CASE("ckpt --version prints the project version") {
  const auto r = ckpt_run("--version");
  CHECK(r.status == 0);
  CHECK(r.out == "ckpt " + std::string(cli::version()) + "\n");
}

TEST_CASE("ckpt ls of a directory that is not a checkpoint root fails with not_found naming it") {
  test::TempDir dir;
  fs::create_directory(dir / "notes");  // neither latest, nor step-N, nor a temporary
  test::write_all(dir / "README", {'x'});
  for (const auto& path : {dir.path(), dir / "notes", dir / "missing"}) {
    CAPTURE(path);
    auto r = ckpt_run("ls " + path.string());
    CHECK(r.status == 1);
    CHECK(r.out.find("not found: " + path.string()) != std::string::npos);
    CHECK(r.out.find("NAME") == std::string::npos);  // no empty table
    r = ckpt_run("ls --json " + path.string());
    CHECK(r.status == 1);
    const auto v = json_of(r.out);
    CHECK(v.at("ok").as_bool() == false);
    CHECK(v.at("error").at("code").as_string() == "not_found");
    CHECK(v.at("error").at("file").as_string() == path.string());
  }
  // A root whose only entry is a save in progress is a root: listed, exit 0.
  fs::create_directory(dir / ".tmp-step-0000000001-1-0");
  const auto r = ckpt_run("ls " + dir.path().string());
  CHECK(r.status == 0);
  CHECK(r.out.find("in progress") != std::string::npos);
}

TEST_CASE("the verify option is spelled --verify none|fast|full everywhere, and verify keeps --full") {
  Saved s;
  const std::string dir = s.ckpt_dir().string();
  for (const char* mode : {"none", "fast", "full"}) {
    CAPTURE(mode);
    const auto r = ckpt_run("verify --json --verify " + std::string(mode) + " " + dir);
    CHECK(r.status == 0);
    CHECK(json_of(r.out).at("mode").as_string() == mode);
    CHECK(ckpt_run("ls --verify " + std::string(mode) + " " + s.dir.path().string()).status == 0);
  }
  CHECK(json_of(ckpt_run("verify --json --full " + dir).out).at("mode").as_string() == "full");
  // The SHA-256 of the whole file sees a flipped data byte; chunk XXH3 sees it too, none does not read data.
  flip(s.shard(0), s.m.tensors.back().begin);
  CHECK(ckpt_run("verify --verify none " + dir).status == 0);
  CHECK(ckpt_run("verify --verify fast " + dir).status == 1);
  CHECK(ckpt_run("verify --verify full " + dir).status == 1);
  CHECK(ckpt_run("verify --full --verify fast " + dir).status == 2);  // two answers to one question
  CHECK(ckpt_run("verify --verify sometimes " + dir).status == 2);
}

TEST_CASE("ckpt consolidate creates OUT's missing parent, and removes it again when it fails") {
  DemoRun demo;
  const fs::path out = demo.dir / "models" / "new" / "run1";
  auto r = ckpt_run("consolidate " + demo.root + " " + out.string() + " --max-file-size 1.5G --json");
  REQUIRE(r.status == 0);
  CHECK(json_of(r.out).at("files").as_array().size() == 1);  // 1.5G: one file for this small model
  CHECK(fs::exists(out / "model.safetensors"));
  // A corrupt source: the parents this run made are gone again, nothing else changed.
  const auto m = CheckpointReader::open(posix_file_system(), demo.step(20)).manifest();
  flip(fs::path(demo.step(20)) / m.shards[1].path, m.find_tensor("optim.master", 1)->begin + 5);
  const auto before = names_in(demo.dir.path());
  r = ckpt_run("consolidate " + demo.root + " " + (demo.dir / "made" / "for" / "it").string() + " --json");
  CHECK(r.status == 1);
  CHECK(json_of(r.out).at("error").at("code").as_string() == "checksum_mismatch");
  CHECK(names_in(demo.dir.path()) == before);
}

TEST_CASE("sizes are accepted alike by every size option: 1.5G, 500M, 64K and plain bytes, a fraction of a byte is not") {
  DemoRun demo;
  std::vector<std::string> files;
  for (const char* size : {"40K", "40960", "0.0390625M", "40KiB"}) {
    CAPTURE(size);
    const auto r = ckpt_run("consolidate " + demo.root + " " + (demo.dir / ("m-" + std::string(size))).string() + " --max-file-size " +
                            size + " --json");
    REQUIRE(r.status == 0);
    const std::string listing = boost::json::serialize(json_of(r.out).at("files"));
    if (files.empty()) CHECK(json_of(r.out).at("files").as_array().size() > 1);
    files.push_back(listing);
  }
  CHECK(std::all_of(files.begin(), files.end(), [&](const std::string& f) { return f == files.front(); }));
  for (const char* bad : {"1.5", "0", "-1K", "5Q", "1.5 G"}) {
    CAPTURE(bad);
    const auto r = ckpt_run("consolidate " + demo.root + " " + (demo.dir / "bad").string() + " --max-file-size '" + bad + "'");
    CHECK(r.status == 2);
    CHECK(r.out.find("--max-file-size") != std::string::npos);
  }
  CHECK(!fs::exists(demo.dir / "bad"));
}

namespace {
// The column of `title` in the header line of a table in `out`, and the column at which
// `cell` starts in the line holding `row`.
std::pair<std::size_t, std::size_t> columns(const std::string& out, const std::string& header_start, const std::string& title,
                                            const std::string& row, const std::string& cell) {
  auto line_of = [&](const std::string& needle) {
    const auto at = out.find(needle);
    REQUIRE(at != std::string::npos);
    const auto begin = out.rfind('\n', at) + 1;
    return out.substr(begin, out.find('\n', at) - begin);
  };
  const std::string header = line_of(header_start), line = line_of(row);
  const auto name_end = line.find(row) + row.size();
  return {header.find(title), line.find(cell, name_end)};
}
}  // namespace

TEST_CASE("name columns are as wide as the longest name, so a Hugging Face tensor name keeps the table aligned") {
  test::TempDir dir;
  const std::string name = "model.layers.23.self_attn.q_proj.weight";
  std::vector<float> w(6, 1.0f), w2(6, 2.0f);
  for (int k = 0; k < 2; ++k) {
    SaveRequest req;
    req.step = 1;
    RankState rs;
    rs.tensors = {{name, DType::F32, {2, 3}, std::as_bytes(std::span(k ? w2 : w))}, {"lm_head.bias", DType::F32, {1}, std::as_bytes(std::span(w).first(1))}};
    req.ranks.push_back(rs);
    save_checkpoint_sync(posix_file_system(), (dir / (k ? "b" : "a")).string(), req);
  }
  const auto inspect = ckpt_run("inspect " + (dir / "a").string());
  REQUIRE(inspect.status == 0);
  auto [title, cell] = columns(inspect.out, "RANK  TENSOR", "DTYPE", name, "F32");
  CHECK(title == cell);
  std::tie(title, cell) = columns(inspect.out, "RANK  TENSOR", "SHAPE", name, "[2, 3]");
  CHECK(title == cell);
  const auto diff = ckpt_run("diff " + (dir / "a").string() + " " + (dir / "b").string());
  REQUIRE(diff.status == 3);
  std::tie(title, cell) = columns(diff.out, "TENSOR", "STATUS", name, "differs");
  CHECK(title == cell);
  std::tie(title, cell) = columns(diff.out, "TENSOR", "STATUS", "lm_head.bias", "equal");
  CHECK(title == cell);
}
