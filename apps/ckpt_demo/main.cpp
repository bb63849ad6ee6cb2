// ckpt-demo: the end-to-end run. Ranks are threads exchanging gradients over in-process
// collectives (DDP + ZeRO-1, fp16 parameters, fp32 optimizer shards) while training a mini
// GPT; the async checkpointer saves mid-run without stopping training; the run then proves
// its checkpoint: byte-equal reload, a bit-exact resume, and the loader refusing a resume at
// another world size, a missing shard and a truncated shard.
#include <unistd.h>

#include <boost/json.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/io/commit.hpp"
#include "ckpt/io/layout.hpp"
#include "ckpt/io/reader.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/train/trainer.hpp"

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace ckpt;
using namespace ckpt::train;

namespace {

const char* kHelp = R"(ckpt-demo: data-parallel training of a mini GPT with asynchronous sharded checkpoints

usage: ckpt-demo [options]

  --dir DIR            checkpoint root (default: a fresh temporary directory, removed at the end)
  --world-size N       ranks, run as threads (default 4)
  --steps N            train up to step N (default 20; with --resume, 10 steps past the
                       checkpoint)
  --save-every N       save asynchronously every N steps (default 10)
  --resume             continue from the checkpoint DIR/latest names, up to --steps
  --reshard            with --resume: accept a checkpoint written at another world size and
                       re-slice its optimizer state for --world-size (without it such a
                       resume fails with the world-size error)
  --metrics FILE       write one JSON line per step (rank 0): step, loss (9 significant digits
                       and exact hex), grad norm, parameter norm, step time, save stall
  --keep K             keep the last K checkpoints (default 3)
  --writer W           auto, io_uring or posix (default auto)
  --precision P        f16 (with dynamic loss scaling) or bf16 (default f16)
  --layers N --dim N --heads N --seq N --batch N --vocab N
                       model size (defaults 2, 32, 4, 16, 4 per rank, 64)
  --lr X               peak learning rate (default 0.01)
  --schedule-steps N   length of the warmup+cosine LR schedule (default 20); part of the
                       configuration a resume must match, so it does not follow --steps
  --seed N             seed of parameters, corpus and per-rank RNG (default 1234)

Checks (exit 1 if any fails; exit 2 on a usage error):
  (a) the loss falls: the mean of the last 5 steps is below the mean of the first 5 by more
      than 1e-3 (float noise is far below that); needs at least 10 steps in this run
  (b) every rank holds the same parameter norm at every step, bit for bit
  (c) optimizer bytes per rank equal 12 P / N (P padded to a multiple of N)
  (d) the first checkpoint this run saved reloads byte-equal to the state snapshotted at
      that step (every tensor of every rank, full SHA-256 verification)
  (e) fresh runs only, if a save happened before the last step: a run resumed from that
      checkpoint (in a scratch directory) reproduces the later losses and the final
      parameters bit for bit ("resume verified")
  (f) resharded resumes only: the optimizer state every rank restored, concatenated, equals
      the source checkpoint's flat state (fp32 master, Adam m and v), the padding zero
A fresh run also shows, on scratch copies, the loader refusing a resume at twice the world
size, a missing shard and a truncated shard.
)";

struct Options {
  std::optional<std::string> dir;
  int world = 4;
  std::optional<std::uint64_t> steps;  // default: 20, or 10 past the checkpoint resumed from
  std::uint64_t save_every = 10;
  bool resume = false, reshard = false;
  std::optional<std::string> metrics;
  int keep = 3;
  WriterBackend writer = WriterBackend::automatic;
  TrainConfig train;
};

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "ckpt-demo: " << msg << "\nrun 'ckpt-demo --help' for usage\n";
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  o.train.total_steps = 20;
  auto need = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto num = [&](int& i) -> long long {
    const std::string v = need(i);
    try {
      std::size_t pos = 0;
      const long long n = std::stoll(v, &pos);
      if (pos != v.size() || n < 0) throw std::invalid_argument(v);
      return n;
    } catch (...) {
      usage(std::string(argv[i - 1]) + " needs a non-negative integer, got '" + v + "'");
    }
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kHelp;
      std::exit(0);
    } else if (a == "--dir") o.dir = need(i);
    else if (a == "--world-size") o.world = static_cast<int>(num(i));
    else if (a == "--steps") o.steps = static_cast<std::uint64_t>(num(i));
    else if (a == "--save-every") o.save_every = static_cast<std::uint64_t>(num(i));
    else if (a == "--resume") o.resume = true;
    else if (a == "--reshard") o.reshard = true;
    else if (a == "--metrics") o.metrics = need(i);
    else if (a == "--keep") o.keep = static_cast<int>(num(i));
    else if (a == "--writer") {
      const std::string w = need(i);
      if (w == "auto") o.writer = WriterBackend::automatic;
      else if (w == "io_uring") o.writer = WriterBackend::io_uring;
      else if (w == "posix") o.writer = WriterBackend::posix;
      else usage("--writer must be auto, io_uring or posix");
    } else if (a == "--precision") {
      const std::string p = need(i);
      if (p == "f16") o.train.precision = Precision::f16;
      else if (p == "bf16") o.train.precision = Precision::bf16;
      else usage("--precision must be f16 or bf16");
    } else if (a == "--layers") o.train.model.layers = static_cast<int>(num(i));
    else if (a == "--dim") o.train.model.dim = static_cast<int>(num(i));
    else if (a == "--heads") o.train.model.heads = static_cast<int>(num(i));
    else if (a == "--seq") o.train.model.seq = static_cast<int>(num(i));
    else if (a == "--batch") o.train.model.batch = static_cast<int>(num(i));
    else if (a == "--vocab") o.train.model.vocab = static_cast<int>(num(i));
    else if (a == "--schedule-steps") o.train.total_steps = static_cast<std::uint64_t>(num(i));
    else if (a == "--seed") o.train.seed = static_cast<std::uint64_t>(num(i));
    else if (a == "--lr") {
      const std::string v = need(i);
      try {
        o.train.adam.lr = std::stof(v);
      } catch (...) {
        usage("--lr needs a number");
      }
    } else usage("unknown option " + a);
  }
  if (o.world < 1 || o.world > 1024) usage("--world-size must be 1..1024");
  if (o.save_every == 0) usage("--save-every must be >= 1");
  if (o.reshard && !o.resume) usage("--reshard needs --resume");
  try {
    o.train.model.validate();
  } catch (const Error& e) {
    usage(std::string("bad model size: ") + e.what());
  }
  return o;
}

// What one run produced, per step (rank 0's view, plus every rank's parameter norm).
struct RunRecord {
  std::map<std::uint64_t, StepStats> stats;                       // rank 0
  std::map<std::uint64_t, std::vector<double>> norms;             // per rank
  std::map<std::uint64_t, double> stall_ms;                       // rank 0
  std::vector<std::vector<std::uint16_t>> final_params;           // per rank
  std::vector<MemoryProfile> memory;                              // per rank
  std::optional<std::uint64_t> snapshot_step;                     // first save of the run
  std::vector<std::vector<std::pair<std::string, std::vector<std::byte>>>> snapshot;  // per rank
  std::vector<json::object> snapshot_meta;                        // per rank
  std::vector<std::string> save_errors;
  std::uint64_t resumed_from = 0, last_step = 0;
  std::vector<std::map<std::string, std::vector<std::byte>>> restored;  // per rank, optim.* right after the resume
  std::size_t num_params = 0;
  std::string backend;
};

RunRecord run(const Options& o, const std::string& root, bool resume, bool saves) {
  RunRecord rec;
  rec.norms.clear();
  rec.final_params.resize(static_cast<std::size_t>(o.world));
  rec.memory.resize(static_cast<std::size_t>(o.world));
  rec.snapshot.resize(static_cast<std::size_t>(o.world));
  rec.snapshot_meta.resize(static_cast<std::size_t>(o.world));
  rec.restored.resize(static_cast<std::size_t>(o.world));
  std::mutex mu;
  std::optional<Checkpointer> ckpt;
  if (saves) ckpt.emplace(CheckpointerOptions{.root = root, .world_size = o.world, .keep_last = o.keep, .backend = o.writer});
  rec.backend = ckpt ? std::string(ckpt->backend_name()) : "none";
  dist::run_ranks(o.world, [&](dist::Communicator& comm) {
    const int rank = comm.rank();
    Trainer trainer(o.train, comm);
    std::uint64_t start = 0;
    if (resume) start = trainer.resume_latest(root, Verify::full, o.reshard ? Reshard::allow : Reshard::no);
    if (resume && o.reshard) {
      std::lock_guard lk(mu);
      for (const auto& t : trainer.checkpoint_tensors())
        if (t.name.starts_with("optim."))
          rec.restored[static_cast<std::size_t>(rank)][t.name] = std::vector<std::byte>(t.data.begin(), t.data.end());
    }
    const std::uint64_t last = o.steps.value_or(resume ? start + 10 : 20);
    std::vector<SaveHandle> handles;
    for (std::uint64_t step = start + 1; step <= last; ++step) {
      const StepStats s = trainer.step();
      double stall = 0;
      if (ckpt && step % o.save_every == 0) {
        const auto t0 = std::chrono::steady_clock::now();
        handles.push_back(save_checkpoint(*ckpt, trainer));  // returns once staged; training goes on
        stall = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard lk(mu);
        if (!rec.snapshot_step || *rec.snapshot_step == step) {
          rec.snapshot_step = step;
          for (const auto& t : trainer.checkpoint_tensors())
            rec.snapshot[static_cast<std::size_t>(rank)].push_back({t.name, std::vector<std::byte>(t.data.begin(), t.data.end())});
          rec.snapshot_meta[static_cast<std::size_t>(rank)] = trainer.checkpoint_info().metadata;
        }
      }
      std::lock_guard lk(mu);
      auto& norms = rec.norms[step];
      norms.resize(static_cast<std::size_t>(o.world));
      norms[static_cast<std::size_t>(rank)] = s.param_norm;
      if (rank == 0) {
        rec.stats[step] = s;
        rec.stall_ms[step] = stall;
      }
    }
    for (auto& h : handles) {
      try {
        h.wait();
      } catch (const Error& e) {
        std::lock_guard lk(mu);
        rec.save_errors.push_back("rank " + std::to_string(rank) + ": " + e.what());
      }
    }
    std::lock_guard lk(mu);
    const auto p = trainer.optimizer().params16();
    rec.final_params[static_cast<std::size_t>(rank)].assign(p.begin(), p.end());
    rec.memory[static_cast<std::size_t>(rank)] = trainer.memory();
    rec.num_params = trainer.num_params();
    if (rank == 0) rec.resumed_from = start, rec.last_step = last;
  });
  return rec;
}

std::string fmt_bytes(std::uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(b));
  return buf;
}

void copy_checkpoint(const std::string& from_root, const std::string& name, const fs::path& to_root) {
  fs::remove_all(to_root);
  fs::create_directories(to_root);
  fs::copy(fs::path(from_root) / name, to_root / name, fs::copy_options::recursive);
  write_latest(posix_file_system(), to_root.string(), name);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const bool temp_root = !o.dir;
  const std::string root = o.dir ? *o.dir : (fs::temp_directory_path() / ("ckpt-demo-" + std::to_string(::getpid()))).string();
  if (o.resume && temp_root) usage("--resume needs --dir");
  if (!o.resume && fs::exists(root))
    for (const auto& e : fs::directory_iterator(root))
      if (parse_checkpoint_dir_name(e.path().filename().string()))
        usage(root + " already holds checkpoints: pass --resume to continue them, or another --dir");
  const fs::path scratch = fs::temp_directory_path() / ("ckpt-demo-scratch-" + std::to_string(::getpid()));
  std::map<char, std::pair<bool, std::string>> checks;
  int exit_code = 0;

  try {
    const auto& m = o.train.model;
    std::printf("ckpt-demo: mini GPT, %zu parameters (%d layers, dim %d, %d heads, vocab %d, seq %d, batch %d per rank)\n",
                num_params(m), m.layers, m.dim, m.heads, m.vocab, m.seq, m.batch);
    // The checkpoint a resume starts from, read before this run's saves can rotate it away.
    std::optional<std::string> source_dir;
    int source_world = o.world;
    if (o.resume) {
      if (const auto name = read_latest(posix_file_system(), root)) {
        source_dir = join_path(root, *name);
        try {
          source_world = CheckpointReader::open(posix_file_system(), *source_dir).manifest().world_size;
        } catch (const Error&) {
          // The resume itself reports what is wrong with it.
        }
      }
    }
    RunRecord rec = run(o, root, o.resume, true);
    std::printf("%d ranks as threads, DDP + ZeRO-1, %s parameters, writer %s, checkpoints in %s\n", o.world,
                o.train.precision == Precision::f16 ? "fp16" : "bf16", rec.backend.c_str(), root.c_str());
    if (o.resume)
      std::printf("resumed from step %llu%s\n", static_cast<unsigned long long>(rec.resumed_from),
                  source_world != o.world
                      ? (" (resharded from world size " + std::to_string(source_world) + " to " + std::to_string(o.world) + ")").c_str()
                      : "");

    // ---- the loss table ----
    std::printf("\n%5s %10s %10s %11s %9s %9s %13s\n", "step", "loss", "grad norm", "param norm", "lr", "step ms", "save stall ms");
    std::ofstream metrics;
    if (o.metrics) {
      metrics.open(*o.metrics, std::ios::trunc);
      if (!metrics) throw Error(Errc::io_error, *o.metrics, "cannot open metrics file");
    }
    for (const auto& [step, s] : rec.stats) {
      const double stall = rec.stall_ms[step];
      std::printf("%5llu %10.6f %10.5f %11.5f %9.6f %9.3f %13s%s\n", static_cast<unsigned long long>(step), s.loss, s.grad_norm,
                  s.param_norm, s.lr, s.step_ms, stall > 0 ? std::to_string(stall).substr(0, 6).c_str() : "",
                  s.skipped ? "  (overflow: skipped, loss scale halved)" : "");
      if (metrics) {
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"step\":%llu,\"loss\":%.9g,\"loss_hex\":\"%a\",\"grad_norm\":%.17g,\"param_norm\":%.17g,\"step_ms\":%.3f,"
                      "\"save_stall_ms\":%.3f,\"skipped\":%s}\n",
                      static_cast<unsigned long long>(step), static_cast<double>(s.loss), static_cast<double>(s.loss), s.grad_norm,
                      s.param_norm, s.step_ms, stall, s.skipped ? "true" : "false");
        metrics << line;
      }
    }

    // ---- memory profile ----
    std::printf("\nmemory per rank (bytes)\n%6s %14s %13s %18s %12s %13s\n", "rank", "params (16b)", "grads (16b)", "optimizer (fp32x3)",
                "12 P / N", "activations");
    MemoryProfile mx{}, sum{};
    for (int r = 0; r < o.world; ++r) {
      const auto& mp = rec.memory[static_cast<std::size_t>(r)];
      std::printf("%6d %14s %13s %18s %12s %13s\n", r, fmt_bytes(mp.params).c_str(), fmt_bytes(mp.grads).c_str(),
                  fmt_bytes(mp.optimizer).c_str(), fmt_bytes(mp.expected_optimizer).c_str(), fmt_bytes(mp.activations).c_str());
      mx.params = std::max(mx.params, mp.params), sum.params += mp.params;
      mx.grads = std::max(mx.grads, mp.grads), sum.grads += mp.grads;
      mx.optimizer = std::max(mx.optimizer, mp.optimizer), sum.optimizer += mp.optimizer;
      mx.activations = std::max(mx.activations, mp.activations), sum.activations += mp.activations;
    }
    const auto w = static_cast<std::uint64_t>(o.world);
    std::printf("%6s %14s %13s %18s %12s %13s\n%6s %14s %13s %18s %12s %13s\n", "max", fmt_bytes(mx.params).c_str(),
                fmt_bytes(mx.grads).c_str(), fmt_bytes(mx.optimizer).c_str(), "", fmt_bytes(mx.activations).c_str(), "mean",
                fmt_bytes(sum.params / w).c_str(), fmt_bytes(sum.grads / w).c_str(), fmt_bytes(sum.optimizer / w).c_str(), "",
                fmt_bytes(sum.activations / w).c_str());

    // ---- the manifest of the first checkpoint of this run ----
    for (const auto& e : rec.save_errors) std::printf("save failed: %s\n", e.c_str());
    std::string snap_dir;
    if (rec.snapshot_step) {
      snap_dir = join_path(root, checkpoint_dir_name(*rec.snapshot_step));
      std::ifstream in(join_path(snap_dir, kManifestName));
      std::printf("\nmanifest of %s\n%s", snap_dir.c_str(), std::string(std::istreambuf_iterator<char>(in), {}).c_str());
    }

    // ---- checks ----
    if (rec.stats.size() >= 10) {
      double first = 0, last = 0;
      auto it = rec.stats.begin();
      for (int i = 0; i < 5; ++i, ++it) first += it->second.loss / 5;
      auto rit = rec.stats.rbegin();
      for (int i = 0; i < 5; ++i, ++rit) last += rit->second.loss / 5;
      char buf[128];
      std::snprintf(buf, sizeof buf, "mean loss of the first 5 steps %.4f, of the last 5 %.4f", first, last);
      checks['a'] = {last < first - 1e-3, buf};
    }
    {
      bool same = true;
      for (const auto& [step, norms] : rec.norms)
        for (double n : norms) same &= std::memcmp(&n, &norms[0], sizeof n) == 0;
      checks['b'] = {same, std::to_string(rec.norms.size()) + " steps x " + std::to_string(o.world) + " ranks, bitwise"};
    }
    {
      bool ok = true;
      for (const auto& mp : rec.memory) ok &= mp.optimizer == mp.expected_optimizer;
      checks['c'] = {ok, fmt_bytes(rec.memory[0].optimizer) + " bytes per rank = 12 x " + std::to_string(rec.num_params) +
                             " (padded to a multiple of " + std::to_string(o.world) + ") / " + std::to_string(o.world)};
    }
    if (rec.snapshot_step && rec.save_errors.empty()) {
      bool equal = true;
      std::size_t tensors = 0;
      const auto reader = CheckpointReader::open(posix_file_system(), snap_dir, o.world);
      for (int r = 0; r < o.world; ++r) {
        const auto shard = reader.load_shard(r, Verify::full);
        for (const auto& [name, bytes] : rec.snapshot[static_cast<std::size_t>(r)]) {
          const auto& t = shard.tensor(name);
          equal &= t.data.size() == bytes.size() && std::equal(bytes.begin(), bytes.end(), t.data.begin());
          ++tensors;
        }
        equal &= shard.record.metadata == rec.snapshot_meta[static_cast<std::size_t>(r)];
      }
      checks['d'] = {equal, std::to_string(tensors) + " tensors of " + checkpoint_dir_name(*rec.snapshot_step) + ", SHA-256 verified"};
    }
    if (o.reshard && source_dir) {
      // (f): the flat state the ranks restored, in rank order, against the source's.
      const auto src = CheckpointReader::open(posix_file_system(), *source_dir);
      bool equal = true;
      const std::uint64_t real = rec.num_params * sizeof(float);
      for (const char* name : {"optim.master", "optim.m", "optim.v"}) {
        std::vector<std::byte> from, to;
        for (int r = 0; r < src.manifest().world_size; ++r) {
          const auto b = src.read_tensor(name, r, Verify::full);
          from.insert(from.end(), b.begin(), b.end());
        }
        for (const auto& per_rank : rec.restored) {
          const auto& b = per_rank.at(name);
          to.insert(to.end(), b.begin(), b.end());
        }
        equal &= from.size() >= real && to.size() >= real && std::equal(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(real), to.begin());
        equal &= std::all_of(to.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(real, to.size())), to.end(),
                             [](std::byte b) { return b == std::byte{0}; });
      }
      checks['f'] = {equal, "optim.master, optim.m, optim.v of " + std::to_string(o.world) + " ranks = the " +
                                std::to_string(src.manifest().world_size) + "-rank flat state of " + *source_dir + ", bitwise"};
    }
    if (!o.resume && rec.snapshot_step && *rec.snapshot_step < rec.last_step && rec.save_errors.empty()) {
      const std::string name = checkpoint_dir_name(*rec.snapshot_step);
      copy_checkpoint(root, name, scratch / "resume");
      RunRecord again = run(o, (scratch / "resume").string(), true, false);
      bool same = again.final_params == rec.final_params;
      std::size_t compared = 0;
      for (const auto& [step, s] : again.stats) {
        const auto& orig = rec.stats.at(step);
        same &= std::memcmp(&s.loss, &orig.loss, sizeof s.loss) == 0 && std::memcmp(&s.grad_norm, &orig.grad_norm, sizeof s.grad_norm) == 0;
        ++compared;
      }
      checks['e'] = {same && compared == rec.last_step - *rec.snapshot_step,
                     "resumed from " + name + ": losses of steps " + std::to_string(*rec.snapshot_step + 1) + ".." +
                         std::to_string(rec.last_step) + " and final parameters of every rank, bitwise"};

      // The loader's defences, on scratch copies so DIR holds only this run's checkpoints.
      std::printf("\nthe loader refuses bad resumes (scratch copies of %s):\n", name.c_str());
      auto refuse = [&](const char* what, auto&& damage, int world) {
        copy_checkpoint(root, name, scratch / "bad");
        damage(scratch / "bad" / name);
        try {
          auto opened = open_latest(posix_file_system(), (scratch / "bad").string(), {.expected_world_size = world});
          for (int r = 0; r < world; ++r) opened.reader.load_shard(r);
          std::printf("  %-24s NOT refused\n", what);
          exit_code = 1;
        } catch (const Error& e) {
          std::printf("  %-24s %s\n", what, e.what());
        }
      };
      const auto shards = CheckpointReader::open(posix_file_system(), join_path(root, name)).manifest().shards;
      refuse(("world size " + std::to_string(2 * o.world) + ":").c_str(), [](const fs::path&) {}, 2 * o.world);
      refuse("missing shard:", [&](const fs::path& d) { fs::remove(d / shards.back().path); }, o.world);
      refuse("truncated shard:", [&](const fs::path& d) { fs::resize_file(d / shards.front().path, shards.front().size / 2); }, o.world);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "ckpt-demo: %s\n", e.what());
    exit_code = 1;
  }
  fs::remove_all(scratch);

  std::printf("\nchecks\n");
  const std::map<char, const char*> names = {{'a', "loss falls"},
                                             {'b', "same parameter norm on every rank"},
                                             {'c', "optimizer bytes = 12 P / N"},
                                             {'d', "checkpoint reloads byte-equal"},
                                             {'e', "bit-exact resume"},
                                             {'f', "resharded state = source state"}};
  for (const auto& [c, name] : names) {
    const auto it = checks.find(c);
    if (it == checks.end() && c == 'f' && !o.reshard) continue;  // only a resharded resume has it
    if (it == checks.end()) {
      std::printf("  (%c) %-34s skipped (see --help)\n", c, name);
      continue;
    }
    std::printf("  (%c) %-34s %s: %s\n", c, name, it->second.first ? "PASS" : "FAIL", it->second.second.c_str());
    if (!it->second.first) exit_code = 1;
  }
  if (checks.count('e') && checks['e'].first) std::printf("resume verified\n");
  if (temp_root) fs::remove_all(root);
  return exit_code;
}
