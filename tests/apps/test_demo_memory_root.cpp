// SPDX-License-Identifier: Apache-2.0
// ckpt-demo on a memory root (mem://NAME, store/memory/memory.hpp): the whole process is
// SIGKILLed at a seeded random instant and started again with --resume auto. It continues
// from the newest generation in shared memory, bit for bit like a run never interrupted;
// with one node's memory gone it rebuilds that node from the other nodes' memory first; with
// all of it gone (a reboot) it resumes from the durable tier on disk and says so.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "ckpt/fs/layout.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "support/demo_metrics.hpp"
#include "support/test_support.hpp"

namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;


const std::string kDemo = ckpt::test::demo_program();

using ckpt::test::read_text;
const auto losses = [](const fs::path& p) { return ckpt::test::metrics_losses(p); };

// The step a root's `latest` names (0 without one).
std::uint64_t latest_step(const fs::path& root) {
  const auto step = ckpt::parse_checkpoint_dir_name(ckpt::test::latest_of(root));
  return step ? *step : 0;
}

std::string joined(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

// Runs `args` (output into `log`) until `committed` holds a `latest`, then for a seeded
// random 0..600 ms more, and SIGKILLs it. Returns its wait status.
int run_and_kill(const std::vector<std::string>& args, const fs::path& committed, const fs::path& log, std::mt19937_64& rng) {
  const pid_t pid = ckpt::test::spawn_logged(args, log);
  const auto t0 = Clock::now();
  while (latest_step(committed) == 0 && Clock::now() - t0 < std::chrono::seconds(30)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 600)(rng)));
  ::kill(pid, SIGKILL);
  int raw = 0;
  ::waitpid(pid, &raw, 0);
  return raw;
}

// A memory root of this test process, removed at the end.
struct MemRoot {
  std::string root;
  fs::path dir;
  explicit MemRoot(const std::string& tag) : root("mem://demo-" + tag + "-" + std::to_string(::getpid())), dir(ckpt::memory_root_dir(root)) {
    fs::remove_all(dir);
  }
  ~MemRoot() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

// The losses of steps from+1..end in `resumed` (a --metrics file) equal, bit for bit, those of
// a run never interrupted (on disk under `tmp`, to step `end`).
void same_as_uninterrupted(const ckpt::test::TempDir& tmp, const fs::path& resumed_metrics, std::uint64_t from, std::uint64_t end) {
  int status = -1;
  const std::string ref = ckpt::test::run_command(kDemo + " --dir " + (tmp / "ref").string() + " --save-every 1 --steps " + std::to_string(end) +
                                                      " --metrics " + (tmp / "ref.jsonl").string() + " 2>&1",
                                                  &status);
  CAPTURE(ref);
  CHECK(status == 0);
  const auto resumed = losses(resumed_metrics);
  const auto reference = losses(tmp / "ref.jsonl");
  CHECK(resumed.size() == end - from);
  for (const auto& [step, hex] : resumed) {
    INFO("step " << step);
    REQUIRE(reference.count(step) == 1);
    CHECK(hex == reference.at(step));
  }
}

enum class Loss { none, one_node, all_memory };

// Kills a run on a memory root (with `nodes` and parity, and a durable tier on disk), takes
// away what `loss` says, resumes with --resume auto, and checks the resumed steps' losses
// against an uninterrupted run's, bit for bit. Returns the resumed run's output.
std::string kill_and_resume(Loss loss, std::uint64_t seed) {
  ckpt::test::TempDir tmp;
  MemRoot mem(std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<std::string> common = {"--save-every", "1", "--keep", "2", "--nodes", "4", "--redundancy", "rs:3+1",
                                           "--durable-dir", (tmp / "durable").string(), "--keep-durable", "2"};
  std::vector<std::string> first = {kDemo, "--dir", mem.root, "--steps", "100000"};
  first.insert(first.end(), common.begin(), common.end());
  const int raw = run_and_kill(first, mem.dir / "node-0", tmp / "killed.log", rng);
  CAPTURE(read_text(tmp / "killed.log"));
  REQUIRE(WIFSIGNALED(raw));
  const std::uint64_t in_memory = latest_step(mem.dir / "node-0");
  REQUIRE(in_memory > 0);
  std::uint64_t expected = in_memory;
  if (loss == Loss::one_node) fs::remove_all(mem.dir / "node-2");
  if (loss == Loss::all_memory) {
    fs::remove_all(mem.dir);
    expected = latest_step(tmp / "durable");
    REQUIRE(expected > 0);
  }
  const std::uint64_t end = expected + 6;
  std::vector<std::string> again = {kDemo, "--dir", mem.root, "--resume", "auto", "--steps", std::to_string(end), "--metrics", (tmp / "resumed.jsonl").string()};
  again.insert(again.end(), common.begin(), common.end());
  int status = -1;
  const std::string out = ckpt::test::run_command(joined(again) + " 2>&1", &status);
  CAPTURE(out);
  CHECK(status == 0);
  CHECK(out.find("resumed from step " + std::to_string(expected)) != std::string::npos);
  // The plan said where it would resume from, and the resume how long each phase took.
  const std::string level = loss == Loss::all_memory ? "disk " + (tmp / "durable").string() : "memory " + mem.root;
  CHECK(out.find("recovery plan: step " + std::to_string(expected) + " from " + level) != std::string::npos);
  CHECK(std::regex_search(out, std::regex(R"(time to recover: [0-9.]+ s \(discover [0-9.]+, fetch [0-9.]+, rebuild [0-9.]+, verify [0-9.]+, load [0-9.]+\))")));
  const auto first_row = boost::json::parse(read_text(tmp / "resumed.jsonl").substr(0, read_text(tmp / "resumed.jsonl").find('\n'))).as_object();
  REQUIRE(first_row.contains("time_to_recover"));
  const auto& ttr = first_row.at("time_to_recover").as_object();
  CHECK(ttr.at("seconds").as_double() > 0);
  CHECK(ttr.at("load").as_double() > 0);
  if (loss == Loss::one_node) CHECK(ttr.at("rebuild").as_double() > 0);
  same_as_uninterrupted(tmp, tmp / "resumed.jsonl", expected, end);
  return out;
}

}  // namespace

TEST_CASE("ckpt-demo on a memory root, SIGKILLed at random and started again with --resume auto, continues from the newest memory generation bit for bit") {
  for (std::uint64_t seed : {11u, 12u}) {
    const std::string out = kill_and_resume(Loss::none, seed);
    CHECK(out.find("rebuilt") == std::string::npos);
    CHECK(out.find("from the durable tier") == std::string::npos);
  }
}

TEST_CASE("ckpt-demo on a memory root whose node lost its memory rebuilds that node from the other nodes' memory, then resumes bit for bit") {
  const std::string out = kill_and_resume(Loss::one_node, 21);
  CHECK(out.find("node-2/step-") != std::string::npos);
  CHECK(out.find("rebuilt from parity") != std::string::npos);
  CHECK(out.find("(its lost files rebuilt from the other nodes' redundancy first)") != std::string::npos);
  CHECK(out.find("from the durable tier") == std::string::npos);
}

TEST_CASE("ckpt-demo on a memory root all of whose memory is gone (a reboot) resumes from the durable tier on disk, says so, and goes on bit for bit") {
  const std::string out = kill_and_resume(Loss::all_memory, 31);
  CHECK(out.find("from the durable tier (local tier passed over: not found") != std::string::npos);
  CHECK(out.find("; not used: mem://demo-31-") != std::string::npos);  // the cheaper level, and why
  CHECK(out.find("holds no committed checkpoint") != std::string::npos);
}

TEST_CASE("ckpt-demo --memory-every 1 --save-every 5: memory every step, the disk every 5th, and killed with its memory gone it resumes from the disk's newest and goes on bit for bit") {
  ckpt::test::TempDir tmp;
  const fs::path disk = tmp / "run";
  std::mt19937_64 rng(41);
  const std::vector<std::string> levels = {"--memory-every", "1", "--save-every", "5", "--nodes", "4", "--redundancy", "rs:3+1"};
  std::vector<std::string> first = {kDemo, "--dir", disk.string(), "--steps", "100000", "--resume", "auto"};
  first.insert(first.end(), levels.begin(), levels.end());
  // Killed once the disk level holds a checkpoint.
  const int raw = run_and_kill(first, disk, tmp / "killed.log", rng);
  CAPTURE(read_text(tmp / "killed.log"));
  REQUIRE(WIFSIGNALED(raw));
  const std::uint64_t on_disk = latest_step(disk);
  REQUIRE(on_disk > 0);
  CHECK(on_disk % 5 == 0);
  for (const auto& e : fs::directory_iterator(disk))
    if (const auto s = ckpt::parse_checkpoint_dir_name(e.path().filename().string())) CHECK(*s % 5 == 0);
  // The memory level is named after --dir: the killed run's line says which.
  const std::string log = read_text(tmp / "killed.log");
  const auto at = log.find("levels: memory mem://");
  REQUIRE(at != std::string::npos);
  const std::string mem = log.substr(at + 15, log.find(' ', at + 15) - at - 15);
  CHECK(log.find(" every 1 steps, then the disk " + disk.string() + " every 5") != std::string::npos);
  const fs::path mem_dir = ckpt::memory_root_dir(mem);
  REQUIRE(fs::exists(mem_dir));
  const std::uint64_t in_memory = latest_step(mem_dir / "node-0");
  CHECK(in_memory >= on_disk);
  fs::remove_all(mem_dir);  // a reboot
  const std::uint64_t end = on_disk + 7;
  std::vector<std::string> again = {kDemo, "--dir", disk.string(), "--resume", "auto", "--steps", std::to_string(end), "--metrics", (tmp / "resumed.jsonl").string()};
  again.insert(again.end(), levels.begin(), levels.end());
  int status = -1;
  const std::string out = ckpt::test::run_command(joined(again) + " 2>&1", &status);
  CAPTURE(out);
  CHECK(status == 0);
  CHECK(out.find("recovery plan: step " + std::to_string(on_disk) + " from disk " + disk.string()) != std::string::npos);
  CHECK(out.find("resumed from step " + std::to_string(on_disk) + ", from the durable tier") != std::string::npos);
  // The last step reached the disk although it is no multiple of 5.
  CHECK(latest_step(disk) == end);
  same_as_uninterrupted(tmp, tmp / "resumed.jsonl", on_disk, end);
  fs::remove_all(mem_dir);
}

TEST_CASE("ckpt-demo --memory-every on SIGTERM saves the step to memory first, then copies it to the disk level within the grace period, and its last line says both") {
  ckpt::test::TempDir tmp;
  const fs::path disk = tmp / "run";
  std::mt19937_64 rng(51);
  const std::vector<std::string> args = {kDemo, "--dir", disk.string(), "--memory-every", "1", "--save-every", "10", "--steps", "100000"};
  const pid_t pid = ckpt::test::spawn_logged(args, tmp / "out.log");
  const auto t0 = Clock::now();
  while (latest_step(disk) == 0 && Clock::now() - t0 < std::chrono::seconds(30)) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 300)(rng)));
  ::kill(pid, SIGTERM);
  int raw = 0;
  ::waitpid(pid, &raw, 0);
  const std::string out = read_text(tmp / "out.log");
  CAPTURE(out);
  REQUIRE(WIFEXITED(raw));
  CHECK(WEXITSTATUS(raw) == 0);
  const std::regex last(R"(preempted by SIGTERM at step (\d+): latest is (step-\d+) in memory \(durable tier ([^:]+): yes\)\n$)");
  std::smatch m;
  REQUIRE(std::regex_search(out, m, last));
  CHECK(m[2].str() == ckpt::checkpoint_dir_name(std::stoull(m[1].str())));
  CHECK(m[3].str() == disk.string());
  CHECK(latest_step(disk) == std::stoull(m[1].str()));  // the emergency step, off the disk's cadence
  const auto at = out.find("levels: memory mem://");
  REQUIRE(at != std::string::npos);
  fs::remove_all(ckpt::memory_root_dir(out.substr(at + 15, out.find(' ', at + 15) - at - 15)));
}

TEST_CASE("ckpt-demo with three levels (memory every step, --dir every 5, --durable-dir every 10) resumes from the cheapest level holding the newest step, bit for bit") {
  ckpt::test::TempDir tmp;
  const fs::path disk = tmp / "run", durable = tmp / "durable";
  const std::vector<std::string> levels = {"--memory-every", "1", "--save-every", "5", "--durable-dir", durable.string(), "--durable-every", "10",
                                           "--nodes", "4", "--redundancy", "rs:3+1", "--resume", "auto"};
  const auto run_to = [&](std::uint64_t end, const std::string& metrics) {
    std::vector<std::string> a = {kDemo, "--dir", disk.string(), "--steps", std::to_string(end), "--metrics", (tmp / metrics).string()};
    a.insert(a.end(), levels.begin(), levels.end());
    int status = -1;
    const std::string out = ckpt::test::run_command(joined(a) + " 2>&1", &status);
    CAPTURE(out);
    CHECK(status == 0);
    return out;
  };
  const std::string first = run_to(23, "a.jsonl");
  const auto at = first.find("levels: memory mem://");
  REQUIRE(at != std::string::npos);
  const fs::path mem_dir = ckpt::memory_root_dir(first.substr(at + 15, first.find(' ', at + 15) - at - 15));
  CHECK(first.find("then the disk " + disk.string() + " every 5, then " + durable.string() + " every 10") != std::string::npos);
  // Each level's own cadence (a copy still pending when the next due step commits is
  // replaced by it, so which multiples remain depends on speed), the run's last step on every one.
  const auto steps_in = [](const fs::path& root) {
    std::vector<std::uint64_t> out;
    for (const auto& e : fs::directory_iterator(root))
      if (const auto s = ckpt::parse_checkpoint_dir_name(e.path().filename().string())) out.push_back(*s);
    std::sort(out.begin(), out.end());
    return out;
  };
  for (const auto& [level, every] : {std::pair{disk, 5u}, std::pair{durable, 10u}}) {
    const auto steps = steps_in(level);
    CAPTURE(level);
    REQUIRE_FALSE(steps.empty());
    CHECK(steps.back() == 23);
    for (const auto s : steps) CHECK((s % every == 0 || s == 23));
  }
  // Memory gone: the disk level holds step 23, as the durable tier does; the cheaper is read.
  fs::remove_all(mem_dir);
  const std::string second = run_to(27, "b.jsonl");
  CHECK(second.find("recovery plan: step 23 from disk " + disk.string() + " (read in place)") != std::string::npos);
  CHECK(second.find("resumed from step 23, from the disk level " + disk.string()) != std::string::npos);
  same_as_uninterrupted(tmp, tmp / "b.jsonl", 23, 27);
  // Memory and the disk level gone: the durable tier's newest.
  fs::remove_all(mem_dir);
  fs::remove_all(disk);
  const std::string third = run_to(31, "c.jsonl");
  CHECK(third.find("recovery plan: step 27 from disk " + durable.string() + " (read in place)") != std::string::npos);
  CHECK(third.find("resumed from step 27, from the durable tier") != std::string::npos);
  fs::remove_all(tmp / "ref");
  same_as_uninterrupted(tmp, tmp / "c.jsonl", 27, 31);
  fs::remove_all(mem_dir);
}
