// SPDX-License-Identifier: Apache-2.0
// ckpt-torture: kills a process that saves every step with SIGKILL at random instants and
// checks, after every kill, what a user would find: `latest` names the newest committed
// checkpoint, it passes full verification, its contents are exactly the state of its step,
// no temporary is ever loaded, and the next run resumes from it and cleans up.
//
//   ckpt-torture run --dir D [--kills N] [--seed S] [--writer posix|io_uring] [--max-ms M]
//                    [--redundancy rs:K+M|replicate:F]
//                    [--memory 1]
//   ckpt-torture victim --dir D [--writer W] [--redundancy R]   (started by `run`)
//
// With --memory 1 the checkpoints go to the memory root mem://torture, its shared memory kept
// in D/shm (CKPT_MEMORY_DIR): the same kills, checks and node losses, on the memory level.
//
// With --redundancy the victim saves 4 ranks on 4 node roots (D/node-n) with that scheme;
// after every kill the live checkpoint must also be whole (every shard and redundancy block
// verifies), and then one node root, chosen by the seed, is deleted as a lost node would
// be: the next victim must rebuild it while resuming, and resume from the same step.
//
// Exit: 0 if no bad outcome, 1 otherwise, 2 on a usage error (options parsed with CLI11 as
// every ckpt program does: --help, --version).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/store/memory/memory.hpp"
#include "cli.hpp"  // apps/common: the command-line conventions of every ckpt program
#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/random.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/runtime/checkpointer.hpp"

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

int kWorld = 2;  // 4 with --redundancy (one rank per node)
std::optional<RedundancyScheme> g_redundancy;
bool g_memory = false;
constexpr const char* kMemoryRoot = "mem://torture";

// The root as the library names it: the directory `dir` itself, or the memory root it holds.
std::string store_root(const std::string& dir) { return g_memory ? kMemoryRoot : dir; }
constexpr int kKeep = 3;
constexpr std::size_t kWords = (6u << 20) / 4;  // 6 MiB of state per rank

// The state of `rank` at `step`: every checkpoint's content is predictable, so a loaded
// checkpoint is checked for being the right data, not only for matching its own checksums.
std::uint32_t word(int rank, std::uint64_t step, std::size_t i) {
  return static_cast<std::uint32_t>(step * 2654435761u) ^ static_cast<std::uint32_t>(i * 40503u) ^ static_cast<std::uint32_t>(rank << 28);
}

// Empty if the checkpoint holds exactly the state of its step, else what is wrong.
std::string check_contents(const CheckpointReader& reader) {
  const auto step = reader.manifest().step;
  for (int r = 0; r < kWorld; ++r) {
    const auto shard = reader.load_shard(r, Verify::full);
    const auto& t = shard.tensor("state");
    if (t.data.size() != kWords * 4) return "rank " + std::to_string(r) + ": wrong state size";
    const auto* w = reinterpret_cast<const std::uint32_t*>(t.data.data());
    for (std::size_t i = 0; i < kWords; ++i)
      if (w[i] != word(r, step, i)) return "rank " + std::to_string(r) + ": word " + std::to_string(i) + " is not the state of step " + std::to_string(step);
  }
  return {};
}

WriterBackend parse_writer(const std::string& w) {
  if (w == "posix") return WriterBackend::posix;
  if (w == "io_uring") return WriterBackend::io_uring;
  std::fprintf(stderr, "ckpt-torture: --writer must be posix or io_uring\n");
  std::exit(2);
}

// The directories that hold checkpoints: the root, or its node roots.
std::vector<fs::path> roots_of(const fs::path& root) {
  if (!g_redundancy) return {root};
  std::vector<fs::path> out;
  for (int n = 0; n < kWorld; ++n) out.push_back(root / ("node-" + std::to_string(n)));
  return out;
}

int victim(const std::string& root, WriterBackend writer) {
  // The writer first: its start-up takes the root, cleans up after the killed one and (node
  // roots) rebuilds what a lost node held; opening a checkpoint never writes.
  CheckpointerOptions options{.root = store_root(root), .world_size = kWorld, .keep_last = kKeep, .backend = writer};
  if (g_redundancy) options.nodes = NodeOptions{.ranks_per_node = 1, .redundancy = *g_redundancy};
  Checkpointer ckpt(std::move(options));
  for (const auto& r : roots_of(root))
    for (const auto& e : fs::directory_iterator(r))
      if (is_temporary_name(e.path().filename().string())) {
        std::printf("BAD temporary left after open: %s\n", e.path().c_str());
        return 3;
      }
  std::uint64_t start = 0;
  if (open_store(store_root(root))->latest()) {
    try {
      auto opened = open_latest(posix_file_system(), store_root(root), {.expected_world_size = kWorld});
      const std::string bad = check_contents(opened.reader);
      if (!bad.empty()) {
        std::printf("BAD %s\n", bad.c_str());
        return 3;
      }
      start = opened.reader.manifest().step;
    } catch (const Error& e) {
      std::printf("BAD cannot resume: %s\n", e.what());
      return 3;
    }
  }
  std::printf("resumed %llu\n", static_cast<unsigned long long>(start));
  std::fflush(stdout);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r)
    ranks.emplace_back([&, r] {
      std::vector<std::uint32_t> state(kWords);
      for (std::uint64_t step = start + 1;; ++step) {
        for (std::size_t i = 0; i < kWords; ++i) state[i] = word(r, step, i);  // the "training"
        std::vector<TensorView> t{{"state", DType::U32, {kWords}, std::as_bytes(std::span(state))}};
        SaveInfo info;
        info.param_shard_offset = static_cast<std::uint64_t>(r) * kWords;
        info.param_shard_numel = kWords;
        info.param_numel = kWorld * kWords;
        ckpt.save(r, step, t, info);
      }
    });
  for (auto& t : ranks) t.join();  // never: the process is killed
  return 0;
}

// What was going on at the instant of the kill, read from what it left on disk.
std::string phase_of(const fs::path& given) {
  const fs::path root = roots_of(given).front();  // node 0's view, with node roots
  if (!fs::exists(root)) return "node 0 lost";
  std::vector<std::string> temps, steps;
  bool latest_tmp = false;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with(".latest.tmp-")) latest_tmp = true;
    else if (is_temporary_name(n)) temps.push_back(n);
    else if (parse_checkpoint_dir_name(n)) steps.push_back(n);
  }
  std::sort(steps.begin(), steps.end());
  const auto latest = read_latest(posix_file_system(), root.string());
  if (latest_tmp) return "latest update";
  if (g_redundancy && !temps.empty()) {
    const fs::path t = root / temps.front();
    std::size_t blocks = 0;
    for (const auto& e : fs::directory_iterator(t)) blocks += e.path().extension() == ".rs" || e.path().filename().string().starts_with("replica-");
    if (!fs::exists(t / "manifest.json")) return blocks ? "writing shards and redundancy blocks" : "writing shards (no redundancy block yet)";
  }
  if (!temps.empty()) {
    const fs::path t = root / temps.front();
    if (fs::exists(t / "manifest.json")) return "commit: manifest written, before rename";
    std::size_t shards = 0;
    for (const auto& e : fs::directory_iterator(t)) shards += e.path().extension() == ".safetensors";
    return shards < kWorld ? "writing shards (some not created yet)" : "writing, hashing or fsync of shards";
  }
  if (!steps.empty() && (!latest || steps.back() != *latest)) return "renamed, latest not yet updated";
  if (steps.size() > static_cast<std::size_t>(kKeep)) return "rotation";
  return "staging or training (no save on disk in flight)";
}

struct Child {
  pid_t pid;
  int out;
};

Child spawn_victim(const std::string& self, const std::string& root, const std::string& writer, const std::string& redundancy) {
  int p[2];
  if (pipe(p) != 0) std::exit(2);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(p[1], STDOUT_FILENO);
    close(p[0]);
    close(p[1]);
    const char* mem = g_memory ? "1" : "0";
    if (redundancy.empty()) execl(self.c_str(), self.c_str(), "victim", "--dir", root.c_str(), "--writer", writer.c_str(), "--memory", mem, nullptr);
    else execl(self.c_str(), self.c_str(), "victim", "--dir", root.c_str(), "--writer", writer.c_str(), "--redundancy", redundancy.c_str(), "--memory", mem, nullptr);
    _exit(127);
  }
  close(p[1]);
  return {pid, p[0]};
}

// The victim's first line, or empty after 30 s.
std::string first_line(int fd) {
  std::string line;
  char c;
  pollfd pfd{fd, POLLIN, 0};
  while (poll(&pfd, 1, 30000) > 0 && read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

int run(const std::string& self, const std::string& root, int kills, std::uint64_t seed, const std::string& writer, int max_ms,
        const std::string& redundancy) {
  if (!g_memory) fs::create_directories(root);  // a memory root is made private by its store
  std::map<std::string, int> phases;
  int bad = 0;
  std::optional<std::uint64_t> expected_resume;  // what the next victim must resume from
  // Across node roots, the next step may be renamed into place on the nodes while the kill cut
  // its `latest` updates: the next writer's start-up commits it (prepare_node_roots moves
  // `latest` forward to a step every node root holds), and the victim resumes from it.
  bool next_may_be_committed = false;
  std::uint64_t rng = seed;
  for (int k = 1; k <= kills; ++k) {
    Child c = spawn_victim(self, root, writer, redundancy);
    const std::string hello = first_line(c.out);
    const std::string want = "resumed " + std::to_string(expected_resume.value_or(0));
    const std::string or_next = "resumed " + std::to_string(expected_resume.value_or(0) + 1);
    if (hello != want && !(next_may_be_committed && hello == or_next)) {
      ++bad;
      std::printf("kill %d: BAD start: expected '%s', got '%s'\n", k, want.c_str(), hello.c_str());
    }
    const int delay_us = static_cast<int>(splitmix64(rng) % static_cast<std::uint64_t>(max_ms * 1000 + 1));
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    kill(c.pid, SIGKILL);
    int status = 0;
    waitpid(c.pid, &status, 0);
    close(c.out);
    ++phases[phase_of(root)];
    // Across node roots, a step renamed into place on the nodes is committed by the next
    // writer's start-up even when no `latest` names it yet (the kill cut the first commit's
    // `latest` updates too): so judged before this kill's node loss, and with nothing loadable.
    next_may_be_committed = false;
    for (const auto& r : roots_of(root))
      next_may_be_committed |= g_redundancy && fs::exists(r / checkpoint_dir_name(expected_resume.value_or(0) + 1));
    // Open the root as a user would after the crash.
    try {
      auto opened = open_latest(posix_file_system(), store_root(root), {.expected_world_size = kWorld});
      if (!parse_checkpoint_dir_name(opened.name)) throw Error(Errc::malformed_manifest, root, "latest names a temporary", "step-N", opened.name);
      opened.reader.verify(Verify::full);
      const std::string wrong = check_contents(opened.reader);
      if (!wrong.empty()) throw Error(Errc::checksum_mismatch, opened.reader.dir(), wrong);
      // The newest complete checkpoint is the one `latest` names, or one step newer (killed
      // between the rename and the `latest` update); anything else means `latest` lags.
      for (const auto& info : open_store(store_root(root))->list(Verify::none)) {
        if (info.state != CheckpointState::corrupt) continue;
        // Across node roots, a checkpoint that had shards on the node lost after the last kill
        // is damaged until the next writer's start-up rebuilds it; it must be rebuildable.
        if (g_redundancy) {
          std::vector<std::string> nodes;
          for (const auto& r : roots_of(root)) nodes.push_back(r.string());
          if (check_node_checkpoint(posix_file_system(), nodes, info.name, Verify::fast).recoverable()) continue;
        }
        throw Error(Errc::malformed_manifest, info.name, "a complete-named checkpoint is corrupt: " + info.error);
      }
      expected_resume = opened.reader.manifest().step;
      next_may_be_committed = false;
      for (const auto& r : roots_of(root))
        next_may_be_committed |= g_redundancy && fs::exists(r / checkpoint_dir_name(*expected_resume + 1));
      if (g_redundancy) {
        // Whole: every shard and block of the live checkpoint verifies. Then a node is lost.
        std::vector<std::string> nodes;
        for (const auto& r : roots_of(root)) nodes.push_back(r.string());
        const auto health = check_node_checkpoint(posix_file_system(), nodes, opened.name, Verify::full);
        for (const auto& m : health.shards)
          if (!m.ok) throw Error(Errc::checksum_mismatch, m.path, "the live checkpoint is not whole after a kill: " + m.error);
        for (const auto& m : health.blocks)
          if (!m.ok) throw Error(Errc::checksum_mismatch, m.path, "the live checkpoint is not whole after a kill: " + m.error);
        const int lost = static_cast<int>(splitmix64(rng) % static_cast<std::uint64_t>(kWorld));
        fs::remove_all(nodes[static_cast<std::size_t>(lost)]);
        ++phases["(then node " + std::to_string(lost) + " lost)"];
      }
    } catch (const Error& e) {
      // Before the first commit there is no `latest` (a complete step-N may exist if the kill
      // hit between its rename and the first `latest`): nothing is committed, nothing to load.
      if (!(e.code() == Errc::not_found && !fs::exists(fs::path(root) / "latest") && !expected_resume)) {
        ++bad;
        std::printf("kill %d: BAD after kill: %s\n", k, e.what());
      }
    }
  }
  std::printf("ckpt-torture (%s writer%s%s, seed %llu): %d kills, %d bad outcomes; latest resumed step %llu\n", writer.c_str(),
              redundancy.empty() ? "" : (", " + std::to_string(kWorld) + " nodes, " + redundancy).c_str(), g_memory ? ", memory root" : "",
              static_cast<unsigned long long>(seed), kills, bad, static_cast<unsigned long long>(expected_resume.value_or(0)));
  std::printf("phases hit (inferred from what each kill left on disk):\n");
  for (const auto& [p, n] : phases) std::printf("  %5d  %s\n", n, p.c_str());
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const char* name = "ckpt-torture";
  return cli::guarded_main(name, [&] {
    CLI::App app("Kills a process that saves every step with SIGKILL at random instants (seeded) and checks, after every kill, "
                 "what a user would find: latest names the newest committed checkpoint, it verifies fully and holds exactly the "
                 "state of its step, and the next run resumes from it. Exit 0 if no bad outcome, 1 otherwise, 2 on a usage error.",
                 name);
    cli::setup(app);
    std::string mode, dir, writer = "io_uring", redundancy;
    int kills = 200, max_ms = 400, memory = 0;
    std::uint64_t seed = 1;
    app.add_option("mode", mode, "run: the driver; victim: the saving process it starts and kills")
        ->required()
        ->check(CLI::IsMember({"run", "victim"}))
        ->option_text("run|victim");
    app.add_option("--dir", dir, "the checkpoint root (with --memory 1: where the shared memory is kept)")->required()->option_text("DIR");
    cli::add_int_option(app, "--kills", kills, 1, 1000000, "N", "kills (default 200)");
    cli::add_int_option(app, "--seed", seed, std::uint64_t{0}, std::uint64_t{1} << 62, "S", "the seed of the kill instants and node losses (default 1)");
    app.add_option("--writer", writer, "the writer backend (default io_uring)")->check(CLI::IsMember({"posix", "io_uring"}))->option_text("posix|io_uring");
    cli::add_int_option(app, "--max-ms", max_ms, 1, 3600000, "MS", "the longest a victim lives before its kill (default 400)");
    app.add_option("--redundancy", redundancy, "4 ranks on 4 node roots with this scheme; a node root is deleted after each kill")
        ->option_text("rs:K+M|replicate:F");
    cli::add_int_option(app, "--memory", memory, 0, 1, "0|1", "1: save to the memory root mem://torture, its shared memory kept in DIR/shm");
    if (const auto rc = cli::parse(app, argc, argv)) return *rc;
    g_memory = memory == 1;
    if (!redundancy.empty()) {
      g_redundancy = parse_redundancy(redundancy);
      if (!g_redundancy) {
        cli::print_usage_error(name, "--redundancy: expected rs:K+M or replicate:F, got '" + redundancy + "'");
        return cli::kExitUsage;
      }
      kWorld = 4;
    }
    if (g_memory && mode == "run") {
      // The memory directory must be private (0700) or the store refuses it.
      const fs::path shm = fs::path(dir) / "shm";
      fs::create_directories(shm);
      fs::permissions(shm, fs::perms::owner_all, fs::perm_options::replace);
      ::setenv("CKPT_MEMORY_DIR", shm.c_str(), 1);
      dir = root_directory(kMemoryRoot);
    }
    if (mode == "victim") return victim(dir, parse_writer(writer));
    return run(fs::read_symlink("/proc/self/exe").string(), dir, kills, seed, writer, max_ms, redundancy);
  });
}
