// SPDX-License-Identifier: Apache-2.0
// ckpt-demo, run as a user would.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <filesystem>
#include <map>
#include <sstream>

#include "cli.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/root_lock.hpp"
#include "support/fuse_mount.hpp"
#include "support/test_support.hpp"

namespace {
const std::string kBin = std::string(CKPT_TEST_BINARY_DIR) + "/bin/";

std::string run(const std::string& cmd, int& status) { return ckpt::test::run_command(cmd + " 2>&1", &status); }

// step -> loss_hex from a --metrics file.
std::map<std::int64_t, std::string> losses(const std::string& path) {
  std::map<std::int64_t, std::string> out;
  std::istringstream in([&] {
    const auto b = ckpt::test::read_all(path);
    return std::string(b.begin(), b.end());
  }());
  std::string line;
  while (std::getline(in, line)) {
    const auto v = boost::json::parse(line).as_object();
    out[v.at("step").as_int64()] = std::string(v.at("loss_hex").as_string());
  }
  return out;
}

// step -> loss_hex from a recorded losses file of tests/data ("STEP HEX" per line).
std::map<std::int64_t, std::string> recorded_losses(const std::string& path) {
  std::map<std::int64_t, std::string> out;
  const auto b = ckpt::test::read_all(path);
  std::istringstream in(std::string(b.begin(), b.end()));
  std::int64_t step = 0;
  std::string hex;
  while (in >> step >> hex) out[step] = hex;
  return out;
}
}  // namespace

TEST_CASE("the default demo passes every check and verifies its resume") {
  int status = 0;
  const auto out = run(kBin + "ckpt-demo", status);
  CHECK(status == 0);
  CHECK(out.find("resume verified") != std::string::npos);
  for (const char* check : {"(a) loss falls", "(b) same parameter norm", "(c) optimizer bytes", "(d) checkpoint reloads", "(e) bit-exact resume"}) {
    const auto at = out.find(check);
    REQUIRE(at != std::string::npos);
    CHECK(out.substr(at, out.find('\n', at) - at).find("PASS") != std::string::npos);
  }
  CHECK(out.find("world size mismatch") != std::string::npos);
  CHECK(out.find("missing shard") != std::string::npos);
  CHECK(out.find("size mismatch") != std::string::npos);
}

TEST_CASE("a run interrupted at step 10 and resumed reproduces the uninterrupted losses bit for bit") {
  ckpt::test::TempDir dir;
  const std::string a = (dir / "a").string(), b = (dir / "b").string();
  int status = 0;
  run(kBin + "ckpt-demo --steps 20 --save-every 10 --dir " + b + " --metrics " + (dir / "full.jsonl").string(), status);
  REQUIRE(status == 0);
  run(kBin + "ckpt-demo --steps 10 --save-every 10 --dir " + a, status);
  REQUIRE(status == 0);
  const auto out = run(kBin + "ckpt-demo --steps 20 --resume --dir " + a + " --metrics " + (dir / "resumed.jsonl").string(), status);
  CHECK(status == 0);
  CHECK(out.find("resumed from step 10") != std::string::npos);
  // Every metrics line carries the memory profile: per rank, and max and mean over ranks.
  {
    const auto b = ckpt::test::read_all((dir / "full.jsonl").string());
    const std::string text(b.begin(), b.end());
    const auto mem = boost::json::parse(text.substr(0, text.find('\n'))).at("memory").as_object();
    REQUIRE(mem.at("per_rank").as_array().size() == 4);
    CHECK(mem.at("max").at("optimizer").as_int64() == 90240);  // 12 x 30080 / 4
    CHECK(mem.at("mean").at("optimizer").to_number<double>() == 90240.0);
    CHECK(mem.at("per_rank").at(3).at("params").as_int64() == 2 * 30080);
  }
  const auto full = losses((dir / "full.jsonl").string()), resumed = losses((dir / "resumed.jsonl").string());
  REQUIRE(resumed.size() == 10);
  for (const auto& [step, hex] : resumed) CHECK(full.at(step) == hex);
  // The demo's checkpoints pass the tool's full verification.
  for (const char* d : {"/step-0000000010", "/step-0000000020"}) {
    run(kBin + "ckpt verify --full " + a + d, status);
    CHECK(status == 0);
  }
}

TEST_CASE("resuming the 4-rank checkpoint at 8 ranks fails with the world-size error") {
  ckpt::test::TempDir dir;
  int status = 0;
  run(kBin + "ckpt-demo --steps 10 --dir " + dir.path().string(), status);
  REQUIRE(status == 0);
  const auto out = run(kBin + "ckpt-demo --world-size 8 --steps 20 --resume --dir " + dir.path().string(), status);
  CHECK(status == 1);
  CHECK(out.find("world size mismatch") != std::string::npos);
  CHECK(out.find("expected 8, actual 4") != std::string::npos);
}

TEST_CASE("a second ckpt-demo on the root of a running one is refused with busy naming it, and the first's checkpoints all verify") {
  ckpt::test::TempDir dir;
  const std::string root = (dir / "run").string(), log = (dir / "first.log").string();
  const pid_t first = ::fork();
  REQUIRE(first >= 0);
  if (first == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ::dup2(fd, 1) < 0 || ::dup2(fd, 2) < 0) ::_exit(126);
    const std::string bin = kBin + "ckpt-demo";
    ::execl(bin.c_str(), bin.c_str(), "--steps", "100", "--save-every", "2", "--dir", root.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Once it holds the root's lock, it is stopped in the middle of its run (a save may be in
  // flight), so that it is surely still running, and costs no CPU, while the second starts.
  const std::string lock = ckpt::join_path(root, ckpt::kLockName);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    const auto h = ckpt::read_lock_holder(ckpt::posix_file_system(), lock);
    if (h && h->pid == first) break;
    if (std::chrono::steady_clock::now() > deadline || ::waitpid(first, nullptr, WNOHANG) == first) FAIL("the first run never took the lock");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  REQUIRE(::kill(first, SIGSTOP) == 0);
  int first_status = 0;
  REQUIRE(::waitpid(first, &first_status, WUNTRACED) == first);
  REQUIRE(WIFSTOPPED(first_status));
  int status = 0;
  const auto out = run(kBin + "ckpt-demo --resume --dir " + root, status);
  CHECK(status == 1);
  CHECK(out.find("busy: " + root + ": another writer holds its lock " + lock) != std::string::npos);
  CHECK(out.find("actual pid " + std::to_string(first) + " (ckpt-demo) on host ") != std::string::npos);
  REQUIRE(::kill(first, SIGCONT) == 0);
  REQUIRE(::waitpid(first, &first_status, 0) == first);
  CHECK(WIFEXITED(first_status));
  CHECK(WEXITSTATUS(first_status) == 0);  // its own checks passed
  // Its checkpoints (the last three: 96, 98, 100) all verify in full; nothing else is left.
  CHECK(run("LC_ALL=C ls -A " + root, status) == ".lock\nlatest\nstep-0000000096\nstep-0000000098\nstep-0000000100\n");
  for (std::uint64_t step : {96, 98, 100}) {
    run(kBin + "ckpt verify --full " + root + "/" + ckpt::checkpoint_dir_name(step), status);
    CHECK(status == 0);
  }
}

TEST_CASE("ckpt-demo refuses bad usage with exit 2") {
  int status = 0;
  run(kBin + "ckpt-demo --steps", status);
  CHECK(status == 2);
  run(kBin + "ckpt-demo --world-size 0", status);
  CHECK(status == 2);
  run(kBin + "ckpt-demo --resume", status);
  CHECK(status == 2);
  run(kBin + "ckpt-demo --heads 5", status);
  CHECK(status == 2);
}

TEST_CASE("ckpt-demo --world-size 8 --resume --reshard continues the 4-rank checkpoint and the loss keeps falling") {
  ckpt::test::TempDir dir;
  const std::string root = dir.path().string();
  int status = 0;
  run(kBin + "ckpt-demo --steps 10 --dir " + root + " --metrics " + (dir / "four.jsonl").string(), status);
  REQUIRE(status == 0);
  const auto out = run(kBin + "ckpt-demo --world-size 8 --resume --reshard --dir " + root + " --metrics " + (dir / "eight.jsonl").string(), status);
  CHECK(status == 0);
  CHECK(out.find("resumed from step 10 (resharded from world size 4 to 8)") != std::string::npos);
  for (const char* check : {"(a) loss falls", "(b) same parameter norm", "(c) optimizer bytes", "(d) checkpoint reloads", "(f) resharded state"}) {
    const auto at = out.find(check);
    REQUIRE(at != std::string::npos);
    CHECK(out.substr(at, out.find('\n', at) - at).find("PASS") != std::string::npos);
  }
  // Steps 11..20 ran at 8 ranks, and the loss at step 20 is below the loss at the resume point.
  auto loss_of = [&](const std::string& file) {
    std::map<std::int64_t, double> m;
    std::istringstream in([&] {
      const auto b = ckpt::test::read_all(file);
      return std::string(b.begin(), b.end());
    }());
    std::string line;
    while (std::getline(in, line)) {
      const auto v = boost::json::parse(line).as_object();
      m[v.at("step").as_int64()] = v.at("loss").to_number<double>();
    }
    return m;
  };
  const auto four = loss_of((dir / "four.jsonl").string()), eight = loss_of((dir / "eight.jsonl").string());
  REQUIRE(eight.size() == 10);
  CHECK(eight.begin()->first == 11);
  CHECK(eight.at(20) < four.at(10));
  // The step-20 checkpoint it wrote is an 8-rank checkpoint that verifies.
  const auto verify = run(kBin + "ckpt verify --full --json " + root, status);
  CHECK(status == 0);
  CHECK(boost::json::parse(verify).at("shards").as_int64() == 8);
}

TEST_CASE("ckpt-demo --fail-save: the failed save is reported, training goes on and the next interval saves again") {
  ckpt::test::TempDir dir;
  const std::string root = (dir / "run").string();
  int status = 0;
  const auto out = run(kBin + "ckpt-demo --steps 30 --save-every 10 --fail-save 20 --dir " + root + " --metrics " + (dir / "m.jsonl").string(), status);
  CHECK(status == 0);
  const auto b = ckpt::test::read_all((dir / "m.jsonl").string());
  // The writer named is the one the run uses (io_uring here, unless the kernel forbids it):
  // fault injection reaches it through the real descriptor.
  const std::string writer = out.find("writer io_uring") != std::string::npos ? "io_uring" : "posix";
  const std::string line = "save of step 20 failed (I/O error, " + writer + " writer): training goes on, next save at step 30";
  CHECK(std::string(b.begin(), b.end()).find("\"event\":\"" + line + "\"") != std::string::npos);
  CHECK(out.find(line) != std::string::npos);
  CHECK(out.find("save of step 20 failed on 4 rank(s): I/O error: ") != std::string::npos);
  const auto g = out.find("(g) a failed save does not stop training");
  REQUIRE(g != std::string::npos);
  CHECK(out.substr(g, out.find('\n', g) - g).find("PASS: save of step 20 failed with \"I/O error\" on 4 of 4 ranks; trained to step 30; latest step-0000000030") != std::string::npos);
  CHECK(out.find("resume verified") != std::string::npos);
  // Nothing was lost: the checkpoints before and after the failure verify, the failed one is not there.
  CHECK(!std::filesystem::exists(root + "/step-0000000020"));
  for (const char* d : {"/step-0000000010", "/step-0000000030"}) {
    run(kBin + "ckpt verify --full " + root + d, status);
    CHECK(status == 0);
  }
  run(kBin + "ckpt-demo --fail-save 15", status);
  CHECK(status == 2);
}

TEST_CASE("ckpt-demo --inject-spike 12: the guard trips, every rank rolls back, and the run matches one that skipped the batch") {
  int status = 0;
  const auto out = run(kBin + "ckpt-demo --inject-spike 12", status);
  CHECK(status == 0);
  // The x1000 learning rate of step 12 shows in the loss of step 13; the guard rolls back to
  // the step-10 checkpoint still staged in memory, and steps 11.. replay without the batch of 13.
  CHECK(out.find("loss spike (loss ") != std::string::npos);
  CHECK(out.find("rolled back to step 10 from memory, batch of step 13 skipped") != std::string::npos);
  for (const char* check : {"(a) loss falls", "(b) same parameter norm", "(d) checkpoint reloads", "(e) bit-exact resume"}) {
    const auto at = out.find(check);
    REQUIRE(at != std::string::npos);
    CHECK(out.substr(at, out.find('\n', at) - at).find("PASS") != std::string::npos);
  }
  CHECK(out.find("resume verified") != std::string::npos);
  run(kBin + "ckpt-demo --inject-spike 5", status);  // before the first checkpoint: nothing to roll back to
  CHECK(status == 2);
}

TEST_CASE("ckpt-demo --accumulate 2 trains on micro-batches and resumes bit-exactly") {
  int status = 0;
  const auto out = run(kBin + "ckpt-demo --accumulate 2 --world-size 2", status);
  CHECK(status == 0);
  CHECK(out.find("resume verified") != std::string::npos);
  run(kBin + "ckpt-demo --accumulate 0", status);
  CHECK(status == 2);
}

TEST_CASE("ckpt-demo --deferred-staging reloads byte-equal, resumes bit-exactly, and trains exactly as with the copy before return") {
  ckpt::test::TempDir dir;
  int status = 0;
  const std::string deferred = (dir / "d.jsonl").string(), copied = (dir / "c.jsonl").string();
  const auto out = run(kBin + "ckpt-demo --deferred-staging --save-every 5 --keep 0 --metrics " + deferred, status);
  CAPTURE(out);
  CHECK(status == 0);
  for (const char* check : {"(d) checkpoint reloads", "(e) bit-exact resume"}) {
    const auto at = out.find(check);
    REQUIRE(at != std::string::npos);
    CHECK(out.substr(at, out.find('\n', at) - at).find("PASS") != std::string::npos);
  }
  CHECK(out.find("resume verified") != std::string::npos);
  run(kBin + "ckpt-demo --save-every 5 --keep 0 --metrics " + copied, status);
  REQUIRE(status == 0);
  const auto a = losses(deferred), b = losses(copied);
  CHECK(a.size() == 20);
  CHECK(a == b);
}

TEST_CASE("ckpt-demo --tensor-parallel 2 splits the heads, records the layout, and a resume at another layout is refused") {
  ckpt::test::TempDir dir;
  const std::string root = (dir / "tp").string();
  int status = 0;
  auto out = run(kBin + "ckpt-demo --tensor-parallel 2 --dir " + root, status);
  CHECK(status == 0);
  CHECK(out.find("4 ranks as threads (tensor 2 x data 2: attention heads split)") != std::string::npos);
  CHECK(out.find("resume verified") != std::string::npos);
  const auto m = ckpt::test::read_all(root + "/step-0000000020/manifest.json");
  CHECK(std::string(m.begin(), m.end()).find("\"parallel\":{\"tensor\":2,\"data\":2,\"tp_split\":\"attention heads\"}") != std::string::npos);
  out = run(kBin + "ckpt-demo --resume --dir " + root, status);
  CHECK(status == 1);
  CHECK(out.find("tensor-parallel layout differs") != std::string::npos);
  CHECK(out.find("expected tensor 1 x data 4, actual tensor 2 x data 2") != std::string::npos);
  out = run(kBin + "ckpt-demo --resume --tensor-parallel 2 --dir " + root, status);
  CHECK(status == 0);
  CHECK(out.find("resumed from step 20") != std::string::npos);
  run(kBin + "ckpt-demo --tensor-parallel 3", status);
  CHECK(status == 2);
}

TEST_CASE("ckpt-demo --durable-dir: both tiers hold the checkpoints, and with the local root gone the resume continues from the durable tier bit-exactly") {
  ckpt::test::TempDir dir;
  const std::string ref = (dir / "ref").string(), local = (dir / "local").string(), durable = (dir / "durable").string();
  int status = 0;
  run(kBin + "ckpt-demo --steps 20 --dir " + ref + " --metrics " + (dir / "full.jsonl").string(), status);
  REQUIRE(status == 0);
  auto out = run(kBin + "ckpt-demo --steps 10 --save-every 5 --dir " + local + " --durable-dir " + durable + " --keep 1 --keep-durable 2", status);
  CHECK(status == 0);
  const auto h = out.find("(h) both tiers hold the checkpoints");
  REQUIRE(h != std::string::npos);
  CHECK(out.substr(h, out.find('\n', h) - h).find("PASS: 2 checkpoints in the durable tier verify full with their copy records; latest step-0000000010 (local tier: step-0000000010)") != std::string::npos);
  CHECK(out.find("copied from " + local + "/step-0000000005") != std::string::npos);
  // Separate rotation: one local checkpoint (two if step 5 was still being copied when step 10
  // committed: local rotation keeps a step the durable tier still needs), two durable ones.
  CHECK(std::filesystem::exists(local + "/step-0000000010"));
  int local_steps = 0;
  for (const auto& e : std::filesystem::directory_iterator(local)) local_steps += e.path().filename().string().starts_with("step-");
  CHECK(local_steps <= 2);
  CHECK(std::filesystem::exists(durable + "/step-0000000005/tier.json"));
  std::filesystem::remove_all(local);
  out = run(kBin + "ckpt-demo --steps 20 --resume --dir " + local + " --durable-dir " + durable + " --metrics " + (dir / "resumed.jsonl").string(), status);
  CHECK(status == 0);
  CHECK(out.find("resumed from step 10, from the durable tier (local tier passed over: not found: ") != std::string::npos);
  const auto full = losses((dir / "full.jsonl").string()), resumed = losses((dir / "resumed.jsonl").string());
  REQUIRE(resumed.size() == 10);
  for (const auto& [step, hex] : resumed) CHECK(full.at(step) == hex);
  // The resumed run saved again into both tiers.
  run(kBin + "ckpt verify --full " + local + "/step-0000000020", status);
  CHECK(status == 0);
  run(kBin + "ckpt verify --full " + durable + "/step-0000000020", status);
  CHECK(status == 0);
  run(kBin + "ckpt-demo --dir " + (dir / "same").string() + " --durable-dir " + (dir / "same").string(), status);
  CHECK(status == 2);
}

TEST_CASE("ckpt-demo names a wrong flag or value with exit 2, and prints its version") {
  int status = 0;
  for (const std::string bad : {"--no-such-flag", "--steps -1", "--writer floppy", "--lr fast", "--reshard"}) {
    CAPTURE(bad);
    const auto out = run(kBin + "ckpt-demo " + bad, status);
    CHECK(status == 2);
    CHECK(out.find(bad.substr(0, bad.find(' '))) != std::string::npos);
    CHECK(out.find("run 'ckpt-demo --help' for usage") != std::string::npos);
  }
  const auto out = run(kBin + "ckpt-demo --version", status);
  CHECK(status == 0);
  CHECK(out == "ckpt-demo " + std::string(ckpt::cli::version()) + "\n");
}

TEST_CASE("ckpt-demo --help lists every option it parses, with the checks in order") {
  int status = 0;
  const auto out = run(kBin + "ckpt-demo --help", status);
  CHECK(status == 0);
  CHECK(out.find("usage: ckpt-demo") == 0);
  for (const char* flag : {"--dir", "--durable-dir", "--keep-durable", "--backend", "--world-size", "--steps", "--save-every", "--resume",
                           "--reshard", "--metrics", "--keep", "--inject-spike", "--accumulate", "--tensor-parallel", "--fail-save",
                           "--writer", "--precision", "--layers", "--dim", "--heads", "--seq", "--batch", "--vocab", "--lr",
                           "--schedule-steps", "--seed", "--version", "--deferred-staging", "--max-consecutive-failures",
                           "--grace-seconds", "--save-every-seconds", "--nodes", "--redundancy"}) {
    CAPTURE(flag);
    CHECK(out.find(std::string("  ") + flag + " ") != std::string::npos);
  }
  std::size_t at = 0;
  for (const char* check : {"(a) ", "(b) ", "(c) ", "(d) ", "(e) ", "(f) ", "(g) ", "(h) "}) {
    CAPTURE(check);
    const auto next = out.find(check, at);
    CHECK(next != std::string::npos);
    at = next;
  }
}

TEST_CASE("a schema 1 checkpoint of ckpt 0.1.0 resumes at another world size through the slice planner") {
  // No sharding descriptions: its flat tensors are read as 1-D slices (training.flat_tensors).
  const std::string data = std::string(CKPT_SOURCE_DIR) + "/tests/data/";
  ckpt::test::TempDir dir;
  const auto root = dir / "root";
  std::filesystem::copy(data + "v0.1-demo-root", root, std::filesystem::copy_options::recursive);
  int status = 0;
  const auto out = run(kBin + "ckpt-demo --world-size 3 --steps 12 --resume --reshard --dir " + root.string(), status);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("resumed from step 10") != std::string::npos);
}

TEST_CASE("a checkpoint written by ckpt 0.1.0's callback writer still verifies and resumes bit for bit") {
  // tests/data/v0.1-demo-root: `ckpt-demo --world-size 2 --steps 10 --save-every 10` of the
  // release before the save path became coroutines; the .txt beside it holds the losses of
  // steps 11..20 of that release's uninterrupted 20-step run.
  const std::string data = std::string(CKPT_SOURCE_DIR) + "/tests/data/";
  int status = 0;
  const auto verified = run(kBin + "ckpt verify --verify full " + data + "v0.1-demo-root", status);
  CHECK(status == 0);
  CHECK(verified.find("step-0000000010") != std::string::npos);
  ckpt::test::TempDir dir;
  const auto root = dir / "root";
  std::filesystem::copy(data + "v0.1-demo-root", root, std::filesystem::copy_options::recursive);
  const auto out = run(kBin + "ckpt-demo --world-size 2 --steps 20 --resume --dir " + root.string() + " --metrics " +
                           (dir / "resumed.jsonl").string(), status);
  CHECK(status == 0);
  CHECK(out.find("resumed from step 10") != std::string::npos);
  const auto expected = recorded_losses(data + "v0.1-demo-root.losses-11-20.txt");
  REQUIRE(expected.size() == 10);
  CHECK(losses((dir / "resumed.jsonl").string()) == expected);
}

TEST_CASE("a node set written before io/ was split into modules verifies, is repaired byte for byte and resumes bit for bit") {
  // tests/data/1c4b95d-demo-nodes-rs3-1: `ckpt-demo --world-size 4 --nodes 4 --redundancy
  // rs:3+1 --steps 10 --save-every 10` built from commit 1c4b95d, the last before the split;
  // the .txt beside it holds the losses of steps 11..20 of that build's uninterrupted 20-step
  // run with the same flags.
  namespace fs = std::filesystem;
  const std::string data = std::string(CKPT_SOURCE_DIR) + "/tests/data/1c4b95d-demo-nodes-rs3-1";
  int status = 0;
  const auto verified = run(kBin + "ckpt verify --verify full " + data, status);
  INFO(verified);
  CHECK(status == 0);
  ckpt::test::TempDir dir;
  const auto root = dir / "nodes";
  fs::copy(data, root, fs::copy_options::recursive);
  // Node 2 is lost: ckpt repair rebuilds its files from the other nodes' shards and parity,
  // each the very bytes the old build wrote (its manifest copy too).
  fs::remove_all(root / "node-2");
  const auto repaired = run(kBin + "ckpt repair " + root.string(), status);
  INFO(repaired);
  CHECK(status == 0);
  for (const char* name : {"manifest.json", "rank-00002-of-00004.safetensors", "parity-s00003-p0.rs"}) {
    const auto rel = fs::path("node-2") / "step-0000000010" / name;
    CAPTURE(rel.string());
    CHECK(ckpt::test::read_all((root / rel).string()) == ckpt::test::read_all((fs::path(data) / rel).string()));
  }
  // And node 1 lost before a resume: the trainer's start-up rebuilds it and resumes.
  fs::remove_all(root / "node-1");
  const auto out = run(kBin + "ckpt-demo --world-size 4 --nodes 4 --redundancy rs:3+1 --steps 20 --save-every 10 --resume --dir " +
                           root.string() + " --metrics " + (dir / "resumed.jsonl").string(), status);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("resumed from step 10") != std::string::npos);
  const auto expected = recorded_losses(data + ".losses-11-20.txt");
  REQUIRE(expected.size() == 10);
  CHECK(losses((dir / "resumed.jsonl").string()) == expected);
}

TEST_CASE("ckpt-demo resumes bit for bit through FUSE file systems that refuse O_DIRECT reads and writes, through bindfs, and from tmpfs") {
  using Kind = ckpt::test::FuseMount::Kind;
  namespace fs = std::filesystem;
  ckpt::test::TempDir dir;
  int status = 0;
  // 14 steps, a checkpoint at step 10, resumed to 14 saving at 12 (through the file system):
  // the LR schedule does not follow --steps (--schedule-steps), so the rows match.
  run(kBin + "ckpt-demo --steps 14 --save-every 10 --dir " + (dir / "full").string() + " --metrics " + (dir / "full.jsonl").string(), status);
  REQUIRE(status == 0);
  const auto full = losses((dir / "full.jsonl").string());
  run(kBin + "ckpt-demo --steps 10 --save-every 10 --dir " + (dir / "step10").string(), status);
  REQUIRE(status == 0);
  // The lines of `out` that hold every one of `parts`.
  const auto count = [](const std::string& out, std::initializer_list<std::string> parts) {
    std::istringstream in(out);
    std::size_t n = 0;
    for (std::string line; std::getline(in, line);) {
      bool all = true;
      for (const auto& p : parts) all = all && line.find(p) != std::string::npos;
      n += all ? 1 : 0;
    }
    return n;
  };
  // A copy of the step-10 root in `src`, resumed from `root` (src seen through a file system)
  // to step 14: the same losses, and `loads` / `writes` log lines per shard saying it was
  // read / written (the step-12 save) buffered.
  const auto resume_through = [&](const fs::path& root, const std::string& name, std::size_t loads, std::size_t writes) {
    CAPTURE(name);
    const auto out = run(kBin + "ckpt-demo --steps 14 --save-every 4 --resume --dir " + root.string() + " --metrics " +
                             (dir / (name + ".jsonl")).string(), status);
    CHECK(status == 0);
    CHECK(out.find("resumed from step 10") != std::string::npos);
    CHECK(fs::is_directory(root / "step-0000000012"));
    const auto resumed = losses((dir / (name + ".jsonl")).string());
    REQUIRE(resumed.size() == 4);
    for (const auto& [step, hex] : resumed) CHECK(full.at(step) == hex);
    for (int r = 0; r < 4; ++r) {
      const std::string shard = "rank-0000" + std::to_string(r) + "-of-00004.safetensors";
      CHECK(count(out, {"ckpt: load_into: " + (root / "step-0000000010" / shard).string() + ": "}) == loads);
      CHECK(count(out, {"ckpt: write: " + root.string() + "/", shard + ": the file system took O_DIRECT at open but refused a write"}) == writes);
    }
  };
  // True where an O_DIRECT read of the root's first shard works (a file system left alone).
  const auto direct_reads_work = [](const fs::path& root) {
    const int fd = ::open((root / "step-0000000010" / "rank-00000-of-00004.safetensors").c_str(), O_RDONLY | O_DIRECT);
    if (fd < 0) return false;
    void* block = std::aligned_alloc(4096, 4096);
    const bool ok = ::pread(fd, block, 4096, 0) == 4096;
    std::free(block);
    ::close(fd);
    return ok;
  };
  // Sanitizer builds run the demo several times slower: there, the reported failure and tmpfs.
  std::vector<Kind> kinds{Kind::refuse_direct_io};
  if (const char* san = std::getenv("CKPT_SANITIZE"); !san || !*san) kinds = {Kind::refuse_direct_io, Kind::short_direct_reads, Kind::refuse_direct_open, Kind::bindfs};
  for (const Kind kind : kinds) {
    const std::string name = ckpt::test::kind_name(kind);
    fs::copy(dir / "step10", dir / name, fs::copy_options::recursive);
    const ckpt::test::FuseMount mnt(dir / name, dir / (name + "-mnt"), kind);
    // bindfs hands O_DIRECT to the directory below, which takes it or refuses it at open.
    const std::size_t loads = kind == Kind::bindfs && direct_reads_work(mnt.path()) ? 0 : 1;
    resume_through(mnt.path(), name, loads, kind == Kind::refuse_direct_io ? 1 : 0);
  }
  if (fs::is_directory("/dev/shm")) {
    const ckpt::test::TempDir shm("ckpt-demo", "/dev/shm");
    fs::copy(dir / "step10", shm / "root", fs::copy_options::recursive);
    resume_through(shm / "root", "tmpfs", direct_reads_work(shm / "root") ? 0 : 1, 0);  // direct since Linux 6.6
  }
}
