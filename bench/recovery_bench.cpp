// SPDX-License-Identifier: Apache-2.0
// ckpt-recovery-bench: what a failure costs, per level, measured side by side in one run
// (the machine is shared and its disk varies between runs):
//
//   - time to recover the state (4 ranks, 1 GiB by default) into memory the caller owns,
//     from each level: own memory (mem://), memory with one node rebuilt from rs:3+1 parity,
//     the local disk with its page cache dropped, a durable directory, and an object store
//     (--s3 s3://bucket/prefix, with AWS_ENDPOINT_URL and the keys in the environment). Each
//     is the planner's survey (discover), the fetch or rebuild the plan names, the open
//     (verify) and load_into with every chunk's XXH3 checked (load), and each is given as a
//     ratio to the same round's memcpy of the state and raw O_DIRECT read of its bytes;
//   - memory held per byte of state by one generation in memory: rs:3+1 and replicate:2;
//   - the step overhead of memory saves at the shortest interval at which each save
//     completes within it, for an accelerator-like step (the CPU idle while the step runs)
//     and a CPU step (every core busy);
//   - steps lost over --kills SIGKILLs of a training process saving every step to memory,
//     at random instants, each restart continuing from what memory holds, and how many
//     restarts found a generation that does not verify or holds other bytes (bad resumes);
//   - a Young/Daly table: per level, the optimal interval and the expected waste at MTBFs of
//     3 h, 1.8 h and 15 min, from the measured save cost and time to recover (Daly, "A higher
//     order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), 2006).
//
//   ckpt-recovery-bench [--size BYTES] [--rounds N] [--dir D] [--quick] [--json FILE]
//                       [--markdown FILE] [--s3 s3://bucket/prefix] [--kills N] [--step-ms MS]
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_support.hpp"
#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/store/copy.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "ckpt/store/recovery.hpp"
#include "ckpt/store/store.hpp"

namespace fs = std::filesystem;
using namespace ckpt;
using namespace ckpt::bench;

namespace {

constexpr int kRanks = 4;

std::uint64_t cpu_jiffies_busy() {  // all CPUs, busy (not idle or iowait), from /proc/stat
  std::ifstream in("/proc/stat");
  std::string cpu;
  std::uint64_t v[10] = {};
  in >> cpu;
  for (auto& x : v) in >> x;
  return v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
}

// One checkpoint of `state` at `step` through a Checkpointer on `root`; returns the median
// time a rank's save() blocked (the staging copy).
double save_state(const std::string& root, std::uint64_t step, const std::vector<std::vector<std::byte>>& state,
                  const std::optional<RedundancyScheme>& scheme = std::nullopt, int keep = 2) {
  CheckpointerOptions o{.root = root, .world_size = kRanks, .keep_last = keep};
  o.staging_bytes_per_rank = state[0].size() + (1u << 20);
  if (scheme) o.nodes = NodeOptions{.ranks_per_node = 1, .redundancy = *scheme};
  o.allow_older_than_latest = true;
  Checkpointer c(std::move(o));
  std::vector<double> blocked(kRanks);
  std::vector<SaveHandle> handles(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      std::vector<TensorView> t{{"state", DType::U8, {state[static_cast<std::size_t>(r)].size()}, std::span(state[static_cast<std::size_t>(r)])}};
      const auto t0 = Clock::now();
      handles[static_cast<std::size_t>(r)] = c.save(r, step, t, {});
      blocked[static_cast<std::size_t>(r)] = seconds_since(t0);
    });
  for (auto& t : ranks) t.join();
  for (auto& h : handles) h.wait();
  return median(blocked);
}

struct Phases {
  double discover = 0, fetch = 0, rebuild = 0, verify = 0, load = 0;
  double total() const { return discover + fetch + rebuild + verify + load; }
  std::string how;  // the plan's summary
};

// Recovers the newest checkpoint over `levels` (cheapest first) as a restarted job would: the
// plan, then what it names (a rebuild from the other nodes' redundancy, or a restore from an
// object store into `restore_into`), the open and the load of every rank into `dest`, each
// chunk's XXH3 checked; then checks `dest` holds `state`.
Phases recover(const std::vector<std::string>& levels, const std::string& restore_into, std::vector<AlignedBuffer>& dest,
               const std::vector<std::vector<std::byte>>& state) {
  Phases p;
  const RecoveryPlan plan = plan_recovery(levels, {.expected_world_size = kRanks});
  p.discover = std::chrono::duration<double>(plan.discover).count();
  p.how = plan.summary();
  const Recovered got = recover_planned(plan, {.expected_world_size = kRanks}, restore_into);
  const RecoveryCandidate& c = got.from;
  const CheckpointReader& reader = got.reader;
  p.fetch = std::chrono::duration<double>(got.fetch).count();
  p.rebuild = std::chrono::duration<double>(got.rebuild).count();
  p.verify = std::chrono::duration<double>(got.verify).count();
  const auto t0 = Clock::now();
  std::vector<std::vector<LoadTarget>> targets(kRanks);
  std::vector<RankLoad> loads;
  for (int r = 0; r < kRanks; ++r) {
    const std::uint64_t n = state[static_cast<std::size_t>(r)].size();
    targets[static_cast<std::size_t>(r)].push_back({"state", dest[static_cast<std::size_t>(r)].span(n), DType::U8, {n}});
    loads.push_back({r, targets[static_cast<std::size_t>(r)]});
  }
  load_into(reader, loads, Verify::fast);
  p.load = seconds_since(t0);
  for (int r = 0; r < kRanks; ++r)
    if (std::memcmp(dest[static_cast<std::size_t>(r)].data(), state[static_cast<std::size_t>(r)].data(), state[static_cast<std::size_t>(r)].size()) != 0)
      throw Error(Errc::checksum_mismatch, c.root, "recovered state of rank " + std::to_string(r) + " differs from the saved one");
  for (auto& d : dest) std::memset(d.data(), 0, 4096);  // the next recovery must write it again
  return p;
}

// The same round's references: memcpy of the state into the destination (warm), and a raw
// O_DIRECT read of the state's bytes (one file per rank, read by a thread each) into it.
double memcpy_state(std::vector<AlignedBuffer>& dest, const std::vector<std::vector<std::byte>>& state) {
  const auto t0 = Clock::now();
  for (int r = 0; r < kRanks; ++r) std::memcpy(dest[static_cast<std::size_t>(r)].data(), state[static_cast<std::size_t>(r)].data(), state[0].size());
  return seconds_since(t0);
}
double raw_read(const fs::path& dir, std::vector<AlignedBuffer>& dest, std::uint64_t per_rank) {
  fs::create_directories(dir);
  for (int r = 0; r < kRanks; ++r) {
    const std::string path = (dir / ("raw-" + std::to_string(r))).string();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    if (fd < 0) throw_errno(errno, "open", path);
    for (std::uint64_t off = 0; off < per_rank; off += 4u << 20)
      if (::pwrite(fd, dest[static_cast<std::size_t>(r)].data() + off, std::min<std::uint64_t>(4u << 20, per_rank - off), static_cast<off_t>(off)) < 0)
        throw_errno(errno, "pwrite", path);
    ::fsync(fd);
    ::close(fd);
  }
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int r = 0; r < kRanks; ++r)
    ts.emplace_back([&, r] {
      const std::string path = (dir / ("raw-" + std::to_string(r))).string();
      const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
      for (std::uint64_t off = 0; fd >= 0 && off < per_rank; off += 4u << 20)
        if (::pread(fd, dest[static_cast<std::size_t>(r)].data() + off, std::min<std::uint64_t>(4u << 20, per_rank - off), static_cast<off_t>(off)) <= 0) break;
      if (fd >= 0) ::close(fd);
    });
  for (auto& t : ts) t.join();
  const double s = seconds_since(t0);
  fs::remove_all(dir);
  return s;
}

// Bytes of one generation's files (shards and redundancy blocks; manifests left out).
std::uint64_t held_bytes(const fs::path& root, std::uint64_t step) {
  std::uint64_t sum = 0;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file() && e.path().parent_path().filename() == checkpoint_dir_name(step) && e.path().filename() != kManifestName)
      sum += e.file_size();
  return sum;
}

// ---- the step overhead of memory saves ----

struct Overhead {
  int interval = 0;           // steps between saves
  double interval_s = 0;
  double overhead = 0;        // (time with saves - without) / without
  double blocked_ms = 0;      // median per save, save() on the training thread
  bool sustainable = false;   // each save was complete before the next began
};

// `steps` steps of `step_ms` each on every rank (cpu: spinning, else sleeping), saving the
// state to `root` every `every` steps (0: never); returns the time until every rank finished
// its steps (the last save may still run), whether each save was complete when the next was
// due, and the blocked times.
struct LoopResult {
  double wall = 0;
  bool sustainable = true;
  std::vector<double> blocked;
};
LoopResult train_loop(const std::string& root, const std::vector<std::vector<std::byte>>& state, int steps, double step_ms, bool cpu, int every) {
  CheckpointerOptions o{.root = root, .world_size = kRanks, .keep_last = 2};
  o.staging_bytes_per_rank = state[0].size() + (1u << 20);
  o.allow_older_than_latest = true;
  Checkpointer c(std::move(o));
  LoopResult out;
  std::mutex mu;
  // Steps only move forward on a root: each loop's start after the last one's.
  static std::uint64_t next_base = 1000;
  const std::uint64_t base = next_base;
  next_base += static_cast<std::uint64_t>(steps) + 1;
  const auto t0 = Clock::now();
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      SaveHandle pending;
      for (int s = 1; s <= steps; ++s) {
        const auto until = Clock::now() + std::chrono::microseconds(static_cast<std::int64_t>(step_ms * 1000));
        if (cpu && r < static_cast<int>(std::thread::hardware_concurrency())) {
          volatile std::uint64_t x = 0;
          while (Clock::now() < until) x = x + 1;
        } else {
          std::this_thread::sleep_until(until);
        }
        if (every > 0 && s % every == 0) {
          if (pending.valid() && !pending.ready()) {
            std::lock_guard lk(mu);
            out.sustainable = false;
          }
          std::vector<TensorView> t{{"state", DType::U8, {state[static_cast<std::size_t>(r)].size()}, std::span(state[static_cast<std::size_t>(r)])}};
          const auto b0 = Clock::now();
          pending = c.save(r, base + static_cast<std::uint64_t>(s), t, {});
          const double b = seconds_since(b0);
          std::lock_guard lk(mu);
          out.blocked.push_back(b);
        }
      }
      // The steps are done: the last save finishing after them is not the steps' time.
      {
        std::lock_guard lk(mu);
        out.wall = std::max(out.wall, seconds_since(t0));
      }
      if (pending.valid()) pending.wait();
    });
  for (auto& t : ranks) t.join();
  return out;
}

// The shortest interval (from `candidates`) at which every memory save completes within it,
// and what saving at it adds to the steps.
Overhead step_overhead(const std::string& root, const std::vector<std::vector<std::byte>>& state, double step_ms, bool cpu, const std::vector<int>& candidates) {
  Overhead best;
  for (const int every : candidates) {
    const int steps = std::max(3 * every, 12);
    const LoopResult without = train_loop(root, state, steps, step_ms, cpu, 0);
    const LoopResult with = train_loop(root, state, steps, step_ms, cpu, every);
    best = {every, every * step_ms / 1000, (with.wall - without.wall) / without.wall, median(with.blocked) * 1000, with.sustainable};
    if (with.sustainable) break;
  }
  return best;
}

// ---- steps lost over kills ----

struct KillResult {
  int kills = 0, bad = 0;
  std::vector<double> lost;  // steps completed minus the step resumed from, per kill
};

// The bytes rank r holds at step s: a pattern of (s, r), so a resume can check it has exactly
// the step it names.
void fill_step(std::vector<std::byte>& b, std::uint64_t s, int r) {
  std::uint64_t x = s * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(r);
  for (std::size_t i = 0; i + 8 <= b.size(); i += 4096) std::memcpy(b.data() + i, &x, 8), ++x;
}

// A training process (forked): from the step memory holds (checked), steps of ~2 ms, a save
// to `root` every step; `done` (shared) is the last step completed.
[[noreturn]] void kill_child(const std::string& root, volatile std::uint64_t* done) {
  try {
    std::uint64_t start = 0;
    if (const auto l = open_store(root)->latest()) start = *l;
    CheckpointerOptions o{.root = root, .world_size = 2, .keep_last = 2};
    Checkpointer c(std::move(o));
    std::vector<std::vector<std::byte>> st(2, std::vector<std::byte>(4u << 20));
    for (std::uint64_t s = start + 1;; ++s) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      for (int r = 0; r < 2; ++r) fill_step(st[static_cast<std::size_t>(r)], s, r);
      std::vector<SaveHandle> h;
      for (int r = 0; r < 2; ++r) {
        std::vector<TensorView> t{{"state", DType::U8, {st[static_cast<std::size_t>(r)].size()}, std::span(st[static_cast<std::size_t>(r)])}};
        h.push_back(c.save(r, s, t, {}));
      }
      *done = s;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-recovery-bench: kill child: %s\n", e.what());
  }
  std::_Exit(3);
}

KillResult kill_loop(const std::string& root, int kills, std::uint64_t seed) {
  KillResult out;
  auto* done = static_cast<volatile std::uint64_t*>(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (done == MAP_FAILED) throw_errno(errno, "mmap", "shared counter");
  std::mt19937_64 rng(seed);
  for (int k = 0; k < kills; ++k) {
    *done = 0;
    const pid_t pid = ::fork();
    if (pid < 0) throw_errno(errno, "fork", "kill child");
    if (pid == 0) kill_child(root, done);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(150, 600)(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ++out.kills;
    const std::uint64_t completed = *done;
    // The restart: what memory holds must verify and hold exactly its step's bytes.
    try {
      auto store = open_store(root);
      const auto opened = store->open_latest({.expected_world_size = 2});
      opened.reader.verify(Verify::full);
      const std::uint64_t step = opened.reader.manifest().step;
      for (int r = 0; r < 2; ++r) {
        std::vector<std::byte> want(4u << 20), got(4u << 20);
        fill_step(want, step, r);
        const LoadTarget t{"state", std::span(got), DType::U8, {got.size()}};
        load_into(opened.reader, r, std::span(&t, 1), Verify::fast);
        if (want != got) throw Error(Errc::checksum_mismatch, opened.reader.dir(), "rank " + std::to_string(r) + " holds other bytes than its step's");
      }
      if (completed > 0) out.lost.push_back(static_cast<double>(completed > step ? completed - step : 0));
    } catch (const Error& e) {
      bool committed = true;
      try {
        committed = open_store(root)->committed_evidence().has_value();
      } catch (const Error&) {
      }
      if (!committed) {
        // Killed before its first save committed: the restart starts fresh, every step lost.
        out.lost.push_back(static_cast<double>(completed));
      } else if (completed > 0) {
        ++out.bad;
        std::fprintf(stderr, "ckpt-recovery-bench: bad resume after kill %d: %s\n", k + 1, e.what());
      }
    }
  }
  ::munmap(const_cast<std::uint64_t*>(done), 4096);
  return out;
}

// ---- Young/Daly ----

// Daly's higher-order optimum (FGCS 2006, eq. 37) for a checkpoint cost C and an MTBF M
// (C < 2M); the expected fraction of time wasted at interval tau with restart R (first order:
// checkpoints, half an interval lost per failure, and the restart).
double daly_interval(double c, double m) {
  if (c >= 2 * m) return m;
  return std::sqrt(2 * c * m) * (1 + std::sqrt(c / (2 * m)) / 3 + c / (9 * 2 * m)) - c;
}
double waste(double tau, double c, double r, double m) { return c / (tau + c) + (tau / 2 + r) / m; }

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

int run(const BenchArgs& a, const fs::path& dir) {
  const std::uint64_t per_rank = a.size / kRanks;
  const std::string tag = std::to_string(::getpid());
  const std::string s3 = a.extra.at("--s3");
  const int kills = std::stoi(a.extra.at("--kills"));
  const double step_ms = std::stod(a.extra.at("--step-ms"));
  const std::string mem = "mem://recovery-bench-" + tag, mem_rs = "mem://recovery-bench-rs-" + tag, mem_rep = "mem://recovery-bench-rep-" + tag,
                    mem_kill = "mem://recovery-bench-kill-" + tag;
  const auto cleanup = [&] {
    std::error_code ec;
    for (const auto& m : {mem, mem_rs, mem_rep, mem_kill}) fs::remove_all(memory_root_dir(m), ec);
  };
  cleanup();
  std::printf("ckpt-recovery-bench: %llu bytes of state, %d ranks, %d rounds, under %s and %s%s\n", static_cast<unsigned long long>(a.size), kRanks,
              a.rounds, dir.c_str(), memory_user_dir().c_str(), s3.empty() ? "" : (", and " + s3).c_str());
  const std::uint64_t busy0 = cpu_jiffies_busy();
  const auto wall0 = Clock::now();

  // Kills first: forking wants no other threads in this process.
  KillResult kr;
  if (kills > 0) {
    kr = kill_loop(mem_kill, kills, 29);
    std::printf("%d SIGKILLs of a process saving every step to memory: steps lost median %.0f, max %.0f; bad resumes %d\n", kr.kills, median(kr.lost),
                kr.lost.empty() ? 0.0 : *std::max_element(kr.lost.begin(), kr.lost.end()), kr.bad);
  }

  const auto state = make_state(kRanks, per_rank);
  std::vector<AlignedBuffer> dest;
  for (int r = 0; r < kRanks; ++r) dest.emplace_back(static_cast<std::size_t>(per_rank), /*prefault=*/true);
  const auto rs = *parse_redundancy("rs:3+1");
  const auto rep = *parse_redundancy("replicate:2");

  std::map<std::string, std::vector<double>> t, ratio_memcpy, ratio_raw;
  std::map<std::string, Phases> last;
  std::vector<double> memcpy_s, raw_s, save_mem, save_disk;
  const std::vector<std::string> levels = {"memory", "memory, one node rebuilt (rs:3+1)", "local disk, page cache dropped", "durable directory",
                                           "object store"};
  double held_rs = 0, held_rep = 0;
  for (int round = 0; round < a.rounds; ++round) {
    const std::uint64_t step = 10 + static_cast<std::uint64_t>(round);
    memcpy_s.push_back(memcpy_state(dest, state));
    raw_s.push_back(raw_read(dir / "raw", dest, per_rank));
    const fs::path local = dir / ("local-" + std::to_string(round)), durable = dir / ("durable-" + std::to_string(round));
    std::map<std::string, Phases> p;
    // Own memory.
    save_mem.push_back(save_state(mem, step, state));
    p[levels[0]] = recover({mem}, "", dest, state);
    // Memory across 4 nodes with rs:3+1, node 1's memory gone.
    save_state(mem_rs, step, state, rs);
    held_rs = static_cast<double>(held_bytes(memory_root_dir(mem_rs), step)) / static_cast<double>(a.size);
    fs::remove_all(fs::path(memory_root_dir(mem_rs)) / "node-1");
    p[levels[1]] = recover({mem_rs}, "", dest, state);
    if (round == 0) {
      save_state(mem_rep, step, state, rep);
      held_rep = static_cast<double>(held_bytes(memory_root_dir(mem_rep), step)) / static_cast<double>(a.size);
      fs::remove_all(memory_root_dir(mem_rep));
    }
    // The local disk, its page cache dropped.
    save_disk.push_back(save_state(local.string(), step, state));
    drop_cache(local);
    p[levels[2]] = recover({local.string()}, "", dest, state);
    // A durable directory, the memory and local levels gone.
    {
      auto src = open_store(local.string());
      copy_checkpoint(*src, step, *open_store(durable.string())->writer(), {.verify = Verify::fast, .copy_record = false});
    }
    fs::remove_all(local);
    drop_cache(durable);
    p[levels[3]] = recover({(dir / "gone").string(), durable.string()}, "", dest, state);
    // The object store: restored into a fresh local root, then loaded.
    if (!s3.empty()) {
      {
        auto src = open_store(durable.string());
        auto dst = open_store(s3);
        copy_checkpoint(*src, step, *dst->writer(), {.verify = Verify::fast, .parallel_shards = 4, .copy_record = false});
      }
      p[levels[4]] = recover({local.string(), s3}, local.string(), dest, state);
      fs::remove_all(local);
    }
    fs::remove_all(durable);
    for (const auto& [lvl, ph] : p) {
      t[lvl].push_back(ph.total());
      ratio_memcpy[lvl].push_back(ph.total() / memcpy_s.back());
      ratio_raw[lvl].push_back(ph.total() / raw_s.back());
      last[lvl] = ph;
    }
  }
  fs::remove_all(memory_root_dir(mem_rs));

  // The step overhead of memory saves.
  const std::vector<int> candidates = {1, 2, 5, 10, 20, 50};
  const Overhead accel = step_overhead(mem, state, step_ms, false, candidates);
  const Overhead cpu = step_overhead(mem, state, step_ms, true, candidates);
  cleanup();
  const double other_cpu = [&] {
    const double wall = seconds_since(wall0);
    const double busy = static_cast<double>(cpu_jiffies_busy() - busy0) / static_cast<double>(::sysconf(_SC_CLK_TCK));
    return busy / (wall * std::thread::hardware_concurrency());
  }();

  // ---- report ----
  std::string md;
  const auto line = [&](const std::string& s) {
    std::printf("%s\n", s.c_str());
    md += s + "\n";
  };
  line("");
  line("State: " + std::to_string(kRanks) + " ranks x " + fmt("%.1f", static_cast<double>(per_rank) / (1 << 20)) + " MiB = " +
       fmt("%.2f", static_cast<double>(a.size) / (1 << 30)) + " GiB, " + std::to_string(a.rounds) + " rounds (medians). The machine was " +
       fmt("%.0f", other_cpu * 100) + "% busy over the run (this bench included).");
  line("");
  line("| reference (same rounds) | value |");
  line("|---|---|");
  line("| memcpy of the state into memory the caller owns (warm) | " + fmt("%.3f s", median(memcpy_s)) + " |");
  line("| raw O_DIRECT read of the state's bytes, a thread per rank | " + fmt("%.3f s", median(raw_s)) + " |");
  line("");
  line("| time to recover from | total s | discover | fetch | rebuild | verify | load | x memcpy | x raw read |");
  line("|---|---|---|---|---|---|---|---|---|");
  for (const auto& lvl : levels) {
    if (!t.count(lvl)) continue;
    const Phases& ph = last[lvl];
    line("| " + lvl + " | " + fmt("%.3f", median(t[lvl])) + " | " + fmt("%.3f", ph.discover) + " | " + fmt("%.3f", ph.fetch) + " | " +
         fmt("%.3f", ph.rebuild) + " | " + fmt("%.3f", ph.verify) + " | " + fmt("%.3f", ph.load) + " | " + fmt("%.2f", median(ratio_memcpy[lvl])) + " | " +
         fmt("%.2f", median(ratio_raw[lvl])) + " |");
  }
  const double r_mem = median(t[levels[0]]), r_rs = median(t[levels[1]]), r_disk = median(t[levels[2]]);
  line("");
  line("| target | measured | |");
  line("|---|---|---|");
  line("| memory / local disk <= 0.2 | " + fmt("%.3f", r_mem / r_disk) + " | " + (r_mem / r_disk <= 0.2 ? "met" : "MISSED") + " |");
  line("| memory with a node rebuilt / local disk <= 0.5 | " + fmt("%.3f", r_rs / r_disk) + " | " + (r_rs / r_disk <= 0.5 ? "met" : "MISSED") + " |");
  line("| memory held per byte of state, rs:3+1 <= 1.4 | " + fmt("%.4f", held_rs) + " | " + (held_rs <= 1.4 ? "met" : "MISSED") + " |");
  line("| memory held per byte of state, replicate:2 (2) | " + fmt("%.4f", held_rep) + " | |");
  line("| memory saves, accelerator-like step of " + fmt("%.0f", step_ms) + " ms: overhead <= 5% at the shortest sustainable interval | " +
       fmt("%.2f%%", accel.overhead * 100) + " every " + std::to_string(accel.interval) + " steps (" + fmt("%.1f", accel.interval_s) + " s), " +
       fmt("%.1f", accel.blocked_ms) + " ms blocked per save" + (accel.sustainable ? "" : ", none sustainable") + " | " +
       (accel.sustainable && accel.overhead <= 0.05 ? "met" : "MISSED") + " |");
  line("| memory saves, CPU step of " + fmt("%.0f", step_ms) + " ms (every core busy) | " + fmt("%.2f%%", cpu.overhead * 100) + " every " +
       std::to_string(cpu.interval) + " steps (" + fmt("%.1f", cpu.interval_s) + " s), " + fmt("%.1f", cpu.blocked_ms) + " ms blocked per save" +
       (cpu.sustainable ? "" : ", none sustainable") + " | |");
  if (kills > 0)
    line("| bad resumes over " + std::to_string(kr.kills) + " SIGKILLs (saving every step to memory) = 0 | " + std::to_string(kr.bad) + "; steps lost median " +
         fmt("%.0f", median(kr.lost)) + ", max " + fmt("%.0f", kr.lost.empty() ? 0.0 : *std::max_element(kr.lost.begin(), kr.lost.end())) + " | " +
         (kr.bad == 0 ? "met" : "MISSED") + " |");
  // Young/Daly: C per level is what a save to it blocks the step for (a memory or a disk
  // save blocks for its staging copy; the durable tier is copied from the disk's checkpoint in
  // the background, so its saves cost what the disk's do), R its time to recover.
  line("");
  line("| level | save cost C s | recover R s | MTBF 3 h: interval, waste | MTBF 1.8 h | MTBF 15 min |");
  line("|---|---|---|---|---|---|");
  const std::vector<std::pair<std::string, std::pair<double, double>>> yd = {
      {levels[0], {median(save_mem), r_mem}}, {levels[1], {median(save_mem), r_rs}}, {levels[2], {median(save_disk), r_disk}},
      {levels[3], {median(save_disk), median(t[levels[3]])}}};
  boost::json::array ydj;
  for (const auto& [lvl, cr] : yd) {
    const auto [c, r] = cr;
    std::string row = "| " + lvl + " | " + fmt("%.3f", c) + " | " + fmt("%.3f", r) + " |";
    boost::json::object o{{"level", lvl}, {"save_cost_s", c}, {"recover_s", r}};
    for (const double m : {3 * 3600.0, 1.8 * 3600.0, 15 * 60.0}) {
      const double tau = daly_interval(std::max(c, 1e-4), m);
      row += " " + fmt("%.0f s", tau) + ", " + fmt("%.3f%%", waste(tau, c, r, m) * 100) + " |";
      o["mtbf_" + std::to_string(static_cast<int>(m))] = boost::json::object{{"interval_s", tau}, {"waste", waste(tau, c, r, m)}};
    }
    line(row);
    ydj.push_back(o);
  }
  if (!a.json.empty()) {
    boost::json::object levels_json;
    for (const auto& [lvl, v] : t)
      levels_json[lvl] = boost::json::object{{"seconds", json_figures(v)},
                                             {"x_memcpy", json_figures(ratio_memcpy[lvl])},
                                             {"x_raw_read", json_figures(ratio_raw[lvl])},
                                             {"plan", last[lvl].how},
                                             {"phases", boost::json::object{{"discover", last[lvl].discover},
                                                                            {"fetch", last[lvl].fetch},
                                                                            {"rebuild", last[lvl].rebuild},
                                                                            {"verify", last[lvl].verify},
                                                                            {"load", last[lvl].load}}}};
    write_json(a.json, "ckpt-recovery-bench", 1, {
                                 {"state_bytes", a.size},
                                 {"rounds", a.rounds},
                                 {"memcpy_s", json_figures(memcpy_s)},
                                 {"raw_read_s", json_figures(raw_s)},
                                 {"levels", levels_json},
                                 {"held_per_byte", boost::json::object{{"rs:3+1", held_rs}, {"replicate:2", held_rep}}},
                                 {"overhead", boost::json::object{{"accelerator", {{"interval_steps", accel.interval}, {"interval_s", accel.interval_s},
                                                                                  {"overhead", accel.overhead}, {"blocked_ms", accel.blocked_ms},
                                                                                  {"sustainable", accel.sustainable}}},
                                                                  {"cpu", {{"interval_steps", cpu.interval}, {"interval_s", cpu.interval_s},
                                                                           {"overhead", cpu.overhead}, {"blocked_ms", cpu.blocked_ms},
                                                                           {"sustainable", cpu.sustainable}}}}},
                                 {"kills", boost::json::object{{"kills", kr.kills}, {"bad_resumes", kr.bad}, {"steps_lost", json_figures(kr.lost)}}},
                                 {"young_daly", ydj},
                                 {"machine_busy", other_cpu}});
  }
  if (!a.extra.at("--markdown").empty()) std::ofstream(a.extra.at("--markdown")) << md;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* name = "ckpt-recovery-bench";
  return cli::guarded_main(name, [&] {
    BenchArgs a{.size = 1ull << 30};
    a.extra = {{"--s3", ""}, {"--kills", "50"}, {"--step-ms", "100"}, {"--markdown", ""}};
    if (const auto rc = parse_bench_args(argc, argv, name,
                                         "Time to recover per level (memory, memory with a node rebuilt, local disk, durable directory, object store), "
                                         "memory held, the step overhead of memory saves, steps lost over SIGKILLs and a Young/Daly table",
                                         a,
                                         {{"--s3", "s3://BUCKET/PREFIX", "also recover from this object store"},
                                          {"--kills", "N", "SIGKILLs of a process saving to memory", BenchOption::Kind::count},
                                          {"--step-ms", "MS", "the simulated step", BenchOption::Kind::number},
                                          {"--markdown", "FILE", "also write the tables as Markdown"}}))
      return *rc;
    return run_in_scratch(name, a, [&](const fs::path& dir) { return run(a, dir); });
  });
}
