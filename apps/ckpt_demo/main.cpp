// SPDX-License-Identifier: Apache-2.0
// ckpt-demo: the end-to-end run. Ranks (threads over in-process collectives, or MPI processes
// with --backend mpi) exchange gradients (DDP + ZeRO-1, fp16 parameters, fp32 optimizer
// shards) while training a mini GPT; the async checkpointer saves mid-run without stopping
// training; the run then proves its checkpoint: byte-equal reload, a bit-exact resume, and
// the loader refusing a resume at another world size, a missing shard and a truncated shard.
// The production patterns are flags: two tiers, the loss guard with rollback, gradient
// accumulation, tensor-parallel heads, a failing disk.
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/format/boost_json.hpp"
#include "ckpt/dist/thread_comm.hpp"
#ifdef CKPT_DEMO_MPI
#include "ckpt/dist/mpi/mpi_comm.hpp"
#endif
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/objstore/s3.hpp"
#include "ckpt/store/tiers.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "ckpt/store/recovery.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/runtime/preemption.hpp"
#include "ckpt/runtime/tiering.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "ckpt/train/loop.hpp"
#include "ckpt/train/trainer.hpp"
#ifdef CKPT_DEMO_METRICS
#include "ckpt/metrics/server.hpp"
#endif
#include "cli.hpp"
#include "record.hpp"

namespace fs = std::filesystem;
namespace json = boost::json;
using namespace ckpt;
using namespace ckpt::testing;
using namespace ckpt::train;
using ckpt::demo::RankRecord;
using ckpt::demo::SaveFailure;
using ckpt::demo::StepRow;

namespace {

const char* kDescription = "ckpt-demo: data-parallel training of a mini GPT with asynchronous sharded checkpoints";

const char* kChecks = R"(
Checks (exit 1 if any fails; exit 2 on a usage error):
  (a) the loss falls: the mean of the last 5 steps is below the mean of the first 5 by more
      than 1e-3 (float noise is far below that); needs at least 10 steps in this run
  (b) every rank holds the same parameter norm at every step, bit for bit
  (c) optimizer bytes per rank, measured (what its buffers hold), equal 12 P / N (P padded
      to a multiple of N)
  (d) the first checkpoint this run saved reloads byte-equal to the state snapshotted at
      that step (every tensor of every rank, full SHA-256 verification)
  (e) fresh runs only, if a save happened before the last step: a run resumed from that
      checkpoint (in a scratch directory) reproduces the later losses and the final
      parameters bit for bit ("resume verified"); after a rollback, the resumed run has no
      spike and skips the batches the rollback skipped
  (f) resharded resumes only: the optimizer state every rank restored, concatenated, equals
      the source checkpoint's flat state (fp32 master, Adam m and v), the padding zero
  (g) with --fail-save: that save failed with the I/O error on every rank, training reached
      its last step, the next save committed, no temporary is left and every remaining
      checkpoint verifies (full SHA-256)
  (h) with --durable-dir: the durable tier's `latest` names the local tier's, and every
      checkpoint in the durable tier verifies (full SHA-256) and carries its copy record
      (an s3:// tier: every committed step restores with full verification)
  (i) with --nodes and --resume, when a node root was lost or damaged: every file rebuilt
      equals the manifest's SHA-256, and the whole checkpoint verifies afterwards
A fresh run also shows, on scratch copies, the loader refusing a resume at twice the world
size, a missing shard and a truncated shard (with --nodes and redundancy: a lost node rebuilt,
and more lost nodes than the scheme survives refused).

A failed save does not stop training: it is reported at the step that notices it, counted
(consecutive_save_failures in --metrics, 0 again after a commit) and logged, and the next
interval saves again.

Exit status:
  0  every check passed
  1  a check failed, or an error stopped the run
  2  usage error
  4  saves failed and no checkpoint was committed since the first of them (a full or
     unwritable root): the last line says so, naming the step and the last error; this
     takes precedence over 1
  5  with --durable-dir: training finished and its checkpoints are committed locally, but
     the durable tier gave up (--durable-drain-deadline passed, or a signal cut the wait
     short): the last line says `durable tier: no, gave up after N s` and which step is not
     there; takes precedence over 1 (check (h) is then skipped), not over 4
)";

struct Options {
  std::optional<std::string> dir, durable_dir;
  int keep_durable = 10;
  double drain_deadline = 300;  // --durable-drain-deadline: seconds
  std::uint64_t durable_every = 1;  // --durable-every: the durable tier's cadence in steps
  std::uint64_t memory_every = 0;   // --memory-every: a memory level in front of --dir (0: none)
  // With --memory-every and --durable-dir: --dir as the level between them (three levels).
  std::optional<std::string> local_dir;
  std::uint64_t local_every = 1;
  int local_keep = 3;
  std::optional<double> lease_seconds;  // --lease-seconds: an s3 tier's writer lease period
  bool adopt_run = false;  // --adopt-run: a resume may continue another run's checkpoint from the store
  int nodes = 0;  // --nodes: node n's local root is DIR/node-n (0: DIR is the one root)
  RedundancyScheme redundancy{};
  bool mpi = false;
  bool world_given = false;
  int world = 4;
  std::optional<std::uint64_t> steps;  // default: 20, or 10 past the checkpoint resumed from
  std::uint64_t save_every = 10;
  std::optional<double> save_every_seconds;  // a wall-clock cadence instead of save_every
  double grace_seconds = 30;
  int max_consecutive_failures = 0;  // 0: train on whatever fails
  bool deferred_staging = false;
  bool watch_signals = false;  // this run stops on a preemption signal (not check (e)'s resume)
  bool resume = false, reshard = false;
  bool resume_auto = false;  // --resume auto: resume if there is a committed checkpoint, else start fresh
  std::optional<std::string> metrics;
  int metrics_port = 0;  // --metrics-port: serve the Prometheus metrics on 127.0.0.1 (0: off)
  int keep = 3;
  std::optional<std::uint64_t> fail_save;
  std::optional<std::uint64_t> inject_spike;
  std::uint64_t inflate_optimizer = 0;
  std::vector<std::uint64_t> skip_batches;  // internal: check (e)'s run skips what a rollback skipped
  WriterBackend writer = WriterBackend::automatic;
  TrainConfig train;
};

// Under MPI every process checks the options and exits; rank 0 alone says why (the others'
// lines would interleave with its own).
bool g_quiet_usage = false;

[[noreturn]] void usage(const std::string& msg) {
  if (!g_quiet_usage) cli::print_usage_error("ckpt-demo", msg);
  std::exit(cli::kExitUsage);
}

constexpr std::uint64_t kMaxStep = std::uint64_t{1} << 40;
constexpr int kExitNoCommit = 4;  // saves failed and none committed since the first failure
constexpr int kExitDurableGaveUp = 5;  // the durable tier's drain gave up

// --nodes and --redundancy against the world size (threads: --world-size; MPI: -np).
void check_node_options(const Options& o) {
  if (o.nodes == 0) return;
  if (o.world % o.nodes != 0)
    usage("--nodes " + std::to_string(o.nodes) + " must divide the world size " + std::to_string(o.world) + " (ranks split evenly)");
  const NodeLayout layout{o.nodes, o.world / o.nodes, o.redundancy};
  if (const auto problem = layout_problem(layout, o.world)) usage("--nodes/--redundancy: " + *problem);
}

Options parse(int argc, char** argv) {
  Options o;
  o.train.total_steps = 20;
  std::string backend = "threads", writer = "auto", precision = "f16", resume_mode;
  CLI::App app(kDescription, "ckpt-demo");
  cli::setup(app);
  app.footer(kChecks);
  using cli::add_int_option;
  app.add_option("--dir", o.dir, "checkpoint root (default: a fresh temporary directory, removed at the end)")->option_text("DIR");
  app.add_option("--durable-dir", o.durable_dir,
                 "two tiers: every checkpoint committed in --dir is copied in the background\n"
                 "to DIR (its own commit, `latest` and rotation, XXH3 re-verified on the\n"
                 "way); --resume then takes --dir's checkpoint if it opens and verifies,\n"
                 "else DIR's, and says which tier it used. DIR may be s3://bucket/prefix\n"
                 "(endpoint from AWS_ENDPOINT_URL, credentials from AWS_ACCESS_KEY_ID /\n"
                 "AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE or the container\n"
                 "endpoint, docs/object-store.md): a resume then restores the local\n"
                 "root from it when --dir's checkpoint is missing or bad")
      ->option_text("DIR");
  add_int_option(app, "--keep-durable", o.keep_durable, 0, 1 << 20, "K", "keep the last K checkpoints in the durable tier (default 10)");
  add_int_option(app, "--durable-every", o.durable_every, std::uint64_t{1}, kMaxStep, "L",
                 "with --durable-dir: copy only the checkpoints of steps that are multiples of L\n"
                 "(the durable level's own cadence; the last one, and an emergency save's, are\n"
                 "copied whatever their step; default 1: every checkpoint)");
  add_int_option(app, "--memory-every", o.memory_every, std::uint64_t{1}, kMaxStep, "N",
                 "a memory level in front of --dir: save every N steps to shared memory\n"
                 "(mem://NAME, NAME drawn from --dir's path; two generations kept, private to\n"
                 "the user), which outlives the process: --resume auto after a crash or a\n"
                 "SIGKILL continues from it. --dir becomes the disk level, copied from memory\n"
                 "in the background every --save-every steps (docs/memory.md); with\n"
                 "--durable-dir, a third level copied every --durable-every steps");
  app.add_option("--durable-drain-deadline", o.drain_deadline,
                 "with --durable-dir: after training, wait at most S seconds for the durable\n"
                 "tier to catch up (printing what it waits for every 10 s), then give up\n"
                 "the copies not done (exit status 5, last line `durable tier: no, gave up\n"
                 "after N s`); a signal gives up at once (default 300)")
      ->check(cli::number_in(0, 1e12))
      ->option_text("S");
  app.add_option("--lease-seconds", o.lease_seconds,
                 "with an s3:// --durable-dir: the period of the prefix's writer lease (renewed\n"
                 "every S/4; a second job on the prefix is refused while it holds, and takes\n"
                 "it over between S and 2 S after its holder died; default 60)")
      ->check(cli::number_in(0.1, 3600))
      ->option_text("S");
  std::string redundancy;
  auto* nodes = add_int_option(app, "--nodes", o.nodes, 1, 1 << 16, "N",
                               "group the ranks evenly into N nodes, node n's local root DIR/node-n;\n"
                               "each checkpoint is committed across every node root, and a resume\n"
                               "rebuilds what a lost node held from the redundancy (see --redundancy)");
  app.add_option("--redundancy", redundancy,
                 "with --nodes: none, replicate:F (each node's shards also on F-1 other\n"
                 "nodes) or rs:K+M (Reed-Solomon parity: any M lost nodes are rebuilt);\n"
                 "default none")
      ->option_text("SCHEME")
      ->needs(nodes);
  app.add_option("--backend", backend,
                 "threads (default): the ranks are threads of this process; mpi: run under\n"
                 "`mpirun -np N`, one rank per process (the world size is N)")
      ->check(CLI::IsMember({"threads", "mpi"}).description(""))
      ->option_text("B");
  auto* world = add_int_option(app, "--world-size", o.world, 1, 1024, "N", "ranks, run as threads (default 4; with --backend mpi, mpirun's -np)");
  add_int_option(app, "--steps", o.steps, std::uint64_t{0}, kMaxStep, "N",
                 "train up to step N (default 20; with --resume, 10 steps past the\ncheckpoint)");
  add_int_option(app, "--save-every", o.save_every, std::uint64_t{1}, kMaxStep, "N", "save asynchronously every N steps (default 10)");
  app.add_option("--save-every-seconds", o.save_every_seconds,
                 "save on wall-clock time instead: after the first step at least S seconds\n"
                 "after the previous save (or the start), as rank 0's clock says; every rank\n"
                 "saves that step")
      ->check(cli::number_in(1e-9, 1e12))
      ->option_text("S");
  app.add_option("--grace-seconds", o.grace_seconds,
                 "on SIGTERM, SIGINT or SIGUSR1: every rank stops at the next step, saves it\n"
                 "and waits up to S seconds for it to commit (and reach --durable-dir; a\n"
                 "second signal skips that wait), then prints the loss table so far and one\n"
                 "line naming `latest` and exits 0 (default 30)")
      ->check(cli::number_in(0, 1e12))
      ->option_text("S");
  app.add_flag("--deferred-staging", o.deferred_staging,
               "save() returns before the state is copied: the copy runs on ckpt's threads\n"
               "while the next step's forward and backward run, and the optimizer step\n"
               "waits for it (the fence); the stall column then shows save() plus that wait");
  add_int_option(app, "--max-consecutive-failures", o.max_consecutive_failures, 0, 1 << 20, "N",
                 "stop training (exit status 4) when the saves of N checkpoints in a row\n"
                 "have failed (default 0: train on, counting and logging each failure)");
  auto* resume = app.add_option("--resume", resume_mode,
                                "continue from the checkpoint DIR/latest names, up to --steps; with\n"
                                "`auto`: the same if DIR (or --durable-dir) has a `latest`, else start\n"
                                "fresh, saying which in one line (the mode a restart loop uses)")
                     ->expected(0, 1)
                     ->check(CLI::IsMember({"auto"}).description(""))
                     ->option_text("[auto]");
  app.add_flag("--adopt-run", o.adopt_run,
               "with --resume and an s3:// --durable-dir: continue a checkpoint the object\n"
               "store holds from another run than --dir's (or into a new --dir, which has no\n"
               "run yet); --dir then becomes that run's. Without it such a resume is refused\n"
               "naming both runs (two jobs on one prefix)")
      ->needs(resume);
  app.add_flag("--reshard", o.reshard,
               "with --resume: accept a checkpoint written at another world size and\n"
               "re-slice its optimizer state for --world-size (without it such a\n"
               "resume fails with the world-size error)")
      ->needs(resume);
  app.add_option("--metrics", o.metrics,
                 "write one JSON line per step (rank 0): step, loss (9 significant digits\n"
                 "and exact hex), grad norm, parameter norm, step time, save stall, memory\n"
                 "(bytes per category: per rank, and max and mean over ranks) and the\n"
                 "step's event (a failed save noticed, a rollback) if any")
      ->option_text("FILE");
  add_int_option(app, "--metrics-port", o.metrics_port, 0, 65535, "N",
                 "serve the checkpointer's Prometheus metrics at http://127.0.0.1:N/metrics\n"
                 "while the run trains (docs/metrics.md; 0, the default: off). With\n"
                 "--backend mpi, process r serves on N + r. Needs the ckpt::metrics\n"
                 "component (prometheus-cpp)");
  add_int_option(app, "--keep", o.keep, 0, 1 << 20, "K", "keep the last K checkpoints (default 3)");
  add_int_option(app, "--inject-spike", o.inject_spike, std::uint64_t{0}, kMaxStep, "STEP",
                 "multiply the learning rate of step STEP by 1000 (once): the loss spikes,\n"
                 "the guard (non-finite loss or gradient norm, or a loss above 2x the mean of\n"
                 "the last 5 good steps) trips, every rank rolls back to the last committed\n"
                 "checkpoint (from memory while its staged snapshot is intact, else from\n"
                 "disk) and training replays from there, skipping the batch of the step that\n"
                 "tripped; check (e) then compares with a run that never saw the spike and\n"
                 "skipped the same batch. STEP must come after the first save.");
  add_int_option(app, "--accumulate", o.train.accumulate, 1, 4096, "K",
                 "gradient accumulation: each step sums the gradients of K micro-batches of\n"
                 "--batch sequences (the same as one batch of K x --batch) before the\n"
                 "optimizer step (default 1)");
  add_int_option(app, "--tensor-parallel", o.train.tensor_parallel, 1, 1024, "T",
                 "split the attention heads of each replica over T ranks (T divides the\n"
                 "world size and --heads): rank r is head group r % T of data-parallel\n"
                 "replica r / T; the checkpoint records the layout and a resume at another\n"
                 "T is refused (default 1)");
  add_int_option(app, "--fail-save", o.fail_save, std::uint64_t{0}, kMaxStep, "STEP",
                 "make the disk fail during the save at STEP (a multiple of --save-every):\n"
                 "its first write gets EIO, the save fails with its typed error, training\n"
                 "goes on and the next interval saves again (check (g))");
  cli::add_size_option(app, "--inflate-optimizer", o.inflate_optimizer,
                  "make every rank's optimizer hold SIZE more than its state (a buffer it\n"
                  "keeps, as a wasteful optimizer would): the measured memory profile shows\n"
                  "it and check (c) fails");
  app.add_option("--writer", writer, "auto, io_uring or posix (default auto)")
      ->check(CLI::IsMember({"auto", "io_uring", "posix"}).description(""))
      ->option_text("W");
  app.add_option("--precision", precision, "f16 (with dynamic loss scaling) or bf16 (default f16)")
      ->check(CLI::IsMember({"f16", "bf16"}).description(""))
      ->option_text("P");
  auto& m = o.train.model;
  struct SizeOption {
    const char* name;
    int* field;
    const char* description;
  };
  for (const SizeOption& z : {SizeOption{"--layers", &m.layers, "model size: transformer blocks (default 2)"},
                              {"--dim", &m.dim, "model size: width (default 32)"},
                              {"--heads", &m.heads, "model size: attention heads, dividing --dim (default 4)"},
                              {"--seq", &m.seq, "model size: sequence length (default 16)"},
                              {"--batch", &m.batch, "model size: sequences per rank and micro-batch (default 4)"},
                              {"--vocab", &m.vocab, "model size: vocabulary (default 64)"}})
    add_int_option(app, z.name, *z.field, 1, 1 << 20, "N", z.description);
  app.add_option("--lr", o.train.adam.lr, "peak learning rate (default 0.01)")->option_text("X");
  add_int_option(app, "--schedule-steps", o.train.total_steps, std::uint64_t{1}, kMaxStep, "N",
                 "length of the warmup+cosine LR schedule (default 20); part of the\n"
                 "configuration a resume must match, so it does not follow --steps");
  add_int_option(app, "--seed", o.train.seed, std::uint64_t{0}, std::numeric_limits<std::uint64_t>::max(), "N",
                 "seed of parameters, corpus and per-rank RNG (default 1234)");
  if (const auto rc = cli::parse(app, argc, argv)) std::exit(*rc);

  if (!redundancy.empty()) {
    const auto scheme = parse_redundancy(redundancy);
    if (!scheme) usage("--redundancy: expected none, replicate:F, replicate:F/J or rs:K+M, got '" + redundancy + "'");
    o.redundancy = *scheme;
  }
  o.resume = resume->count() > 0;
  o.resume_auto = resume_mode == "auto";
  o.mpi = backend == "mpi";
  o.world_given = world->count() > 0;
  o.writer = writer == "io_uring" ? WriterBackend::io_uring : writer == "posix" ? WriterBackend::posix : WriterBackend::automatic;
  o.train.precision = precision == "bf16" ? Precision::bf16 : Precision::f16;
#ifndef CKPT_DEMO_MPI
  if (o.mpi) usage("this ckpt-demo was built without MPI (install libopenmpi-dev and reconfigure)");
#endif
#ifndef CKPT_DEMO_METRICS
  if (o.metrics_port > 0) usage("this ckpt-demo was built without the metrics endpoint (install prometheus-cpp-dev and reconfigure)");
#endif
  if (o.memory_every) {
    // Memory every N steps, then --dir (the disk) as a tier behind it, copied every
    // --save-every steps, and --durable-dir (if given) every --durable-every. The memory
    // root's name comes from --dir's path, so that a restart with the same --dir finds it.
    if (!o.dir) usage("--memory-every needs --dir (the disk level behind memory)");
    if (is_memory_root(*o.dir)) usage("--memory-every with a mem:// --dir: --dir is the disk level behind memory");
    if (o.save_every_seconds) usage("--memory-every saves on steps: not with --save-every-seconds");
    std::uint64_t h = 14695981039346656037ull;  // FNV-1a of the absolute path
    for (const char c : fs::weakly_canonical(*o.dir).string()) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    char name[32];
    std::snprintf(name, sizeof name, "demo-%016llx", static_cast<unsigned long long>(h));
    if (o.durable_dir) {
      if (fs::weakly_canonical(*o.durable_dir) == fs::weakly_canonical(*o.dir)) usage("--durable-dir must differ from --dir");
      o.local_dir = *o.dir;
      o.local_every = o.save_every;
      o.local_keep = o.keep;
    } else {
      o.durable_dir = *o.dir;
      o.durable_every = o.save_every;
      o.keep_durable = o.keep;
    }
    o.save_every = o.memory_every;
    o.keep = 2;
    o.dir = std::string("mem://") + name;
  } else if (o.durable_every > 1 && !o.durable_dir) {
    usage("--durable-every needs --durable-dir");
  }
  const bool object_tier = o.durable_dir && root_kind(*o.durable_dir) == StoreKind::object_store;
  if (o.durable_dir && o.dir && !object_tier && !is_memory_root(*o.dir) && fs::weakly_canonical(*o.durable_dir) == fs::weakly_canonical(*o.dir))
    usage("--durable-dir must differ from --dir");
  if ((o.lease_seconds || o.adopt_run) && !object_tier)
    usage(std::string(o.adopt_run ? "--adopt-run" : "--lease-seconds") + " needs an s3:// --durable-dir");
  if (!o.mpi) check_node_options(o);  // under MPI once the world size is known
  if (o.inject_spike && *o.inject_spike <= o.save_every)
    usage("--inject-spike must come after the first save (step > --save-every), so there is a checkpoint to roll back to");
  if (o.world % o.train.tensor_parallel != 0 || o.train.model.heads % o.train.tensor_parallel != 0)
    usage("--tensor-parallel must divide --world-size and --heads");
  if (o.fail_save && (*o.fail_save == 0 || *o.fail_save % o.save_every != 0))
    usage("--fail-save must be a step at which the demo saves (a positive multiple of --save-every)");
  try {
    o.train.model.validate();
  } catch (const Error& e) {
    usage(std::string("bad model size: ") + e.what());
  }
  return o;
}

#ifdef CKPT_DEMO_MPI
dist::MpiSession* g_mpi = nullptr;  // set when --backend mpi: this process is one rank
#endif
bool is_mpi() {
#ifdef CKPT_DEMO_MPI
  return g_mpi != nullptr;
#else
  return false;
#endif
}
// This process prints (every rank computes the same checks; rank 0 reports them).
bool printer() {
#ifdef CKPT_DEMO_MPI
  return !g_mpi || g_mpi->rank() == 0;
#else
  return true;
#endif
}
// Waits for every process of the run (a no-op with threads: one process).
void barrier() {
#ifdef CKPT_DEMO_MPI
  if (g_mpi) g_mpi->world().barrier();
#endif
}

// Preemption (--grace-seconds): installed by main around the training run; the outcome of an
// emergency save, the same on every rank, for main to report.
Preemption* g_preemption = nullptr;
struct Preempted {
  PreemptionSave save;
  int signal = 0;
  // The save (one the cancel did not stop in time), or the durable copy, is still running:
  // destroying the checkpointer would wait for it past the budget, so the process leaves
  // without (the root is as after a crash).
  bool exit_now() const { return (save.abandoned && !save.cleaned) || save.durable_skipped; }
};
std::mutex g_preempted_mu;
std::optional<Preempted> g_preempted;

// One rank's part of a run: train, save every --save-every steps (async), notice failed saves
// while training goes on, and record what the checks need. Identical for every backend.
RankRecord train_rank(const Options& o, dist::Communicator& comm, const std::string& root, bool resume, Checkpointer* ckpt,
                      FaultInjectionFileSystem* faults) {
  RankRecord rec;
  rec.rank = comm.rank();
  Trainer trainer(o.train, comm);
  if (o.inflate_optimizer) trainer.optimizer().hold_extra_for_testing(static_cast<std::size_t>(o.inflate_optimizer));
  std::uint64_t start = 0;
  if (resume && o.local_dir) {
    // Three levels: the plan picks the newest step and the cheapest level holding it
    // (an object store's is restored into the disk level).
    const auto r = trainer.resume_planned({root, *o.local_dir, *o.durable_dir}, Verify::full, o.reshard ? Reshard::allow : Reshard::no, *o.local_dir);
    if (!r) throw Error(Errc::not_found, root, "no level holds a committed checkpoint to resume from");
    start = r->step;
    rec.resume_tier = r->root == root ? std::string("memory level") : r->root == *o.local_dir ? "disk level " + *o.local_dir : "durable tier";
  } else if (resume && o.durable_dir) {
    const auto r = trainer.resume_latest_tiered(root, *o.durable_dir, Verify::full, o.reshard ? Reshard::allow : Reshard::no, o.adopt_run);
    start = r.step;
    rec.resume_tier = r.tier + " tier" + (r.local_error.empty() ? "" : " (local tier passed over: " + r.local_error + ")");
  } else if (resume && ckpt && o.nodes > 0 && is_mpi()) {
    // Node roots under MPI: the Checkpointer's construction rebuilt what was lost; each
    // process reads its part through the Checkpointer's file system.
    start = trainer.resume_latest(*ckpt, Verify::full, o.reshard ? Reshard::allow : Reshard::no);
  } else if (resume) {
    start = trainer.resume_latest(root, Verify::full, o.reshard ? Reshard::allow : Reshard::no);
  }
  if (resume) {
    rec.resume_verify_s = std::chrono::duration<double>(trainer.last_resume_timing().verify).count();
    rec.resume_load_s = std::chrono::duration<double>(trainer.last_resume_timing().load).count();
  }
  if (resume && o.reshard)
    for (const auto& t : trainer.checkpoint_tensors())
      if (t.name.starts_with("optim.")) rec.restored[t.name] = std::vector<std::byte>(t.data.begin(), t.data.end());
  const std::uint64_t last = o.steps.value_or(resume ? start + 10 : 20);
  // Saves not known to be finished. A failed one is reported at the step that notices it; the
  // run goes on and the next interval saves again.
  std::vector<SaveHandle> pending;
  auto collect = [&](bool block, StepRow* row) {
    for (auto it = pending.begin(); it != pending.end();) {
      if (!block && !it->ready()) {
        ++it;
        continue;
      }
      try {
        it->wait();
      } catch (const Error& e) {
        rec.save_errors.push_back({it->step(), std::string(errc_name(e.code())), e.what()});
        if (row) {
          const std::uint64_t next = (row->stats.step / o.save_every + 1) * o.save_every;
          row->event = "save of step " + std::to_string(it->step()) + " failed (" + std::string(errc_name(e.code())) + ", " +
                       std::string(ckpt->backend_name()) + " writer): training goes on" +
                       (next <= last ? ", next save at step " + std::to_string(next) : "");
        }
      }
      it = pending.erase(it);
    }
  };
  for (std::uint64_t s : o.skip_batches) trainer.skip_batch_of_step(s);
  // The NaN guard and loss-spike detector: every rank sees the same StepStats, so every rank
  // trips at the same step and rolls back together.
  SpikeGuard guard;
  if (o.inject_spike && ckpt) trainer.set_lr_multiplier_once(*o.inject_spike, 1000.0f);
  int rollbacks_in_a_row = 0;
  std::uint64_t last_trip = 0;
  std::optional<SaveCadence> cadence;
  if (o.save_every_seconds) cadence = SaveCadence::every_seconds(*o.save_every_seconds);
  bool abandoned = false;
  while (trainer.step_count() < last) {
    StepRow row;
    row.stats = trainer.step();
    // A deferred save's copy the step did not hide is part of that save's stall.
    if (row.stats.fence_ms > 0 && !rec.rows.empty() && rec.rows.back().stall_ms > 0) rec.rows.back().stall_ms += row.stats.fence_ms;
    row.memory = trainer.memory();
    const std::uint64_t step = row.stats.step;
    if (ckpt) {
      const double mean = guard.recent_mean();
      if (const Trip trip = guard.check(row.stats); trip != Trip::none) {
        // A spike the last checkpoint already carries would trip again after every rollback.
        if (++rollbacks_in_a_row > 3)
          throw Error(Errc::aborted, root, "the loss guard tripped 4 times in a row; the last checkpoint is not good", "a good step",
                      trip_name(trip));
        collect(true, &row);
        const RollbackResult back = trainer.rollback(*ckpt, step);
        guard.rewind_to(back.step);
        char buf[256];
        std::snprintf(buf, sizeof buf, "%s (loss %.4f, recent mean %.4f): rolled back to step %llu from %s, batch of step %llu skipped",
                      trip_name(trip), static_cast<double>(row.stats.loss), mean, static_cast<unsigned long long>(back.step),
                      back.from_memory ? "memory" : "disk", static_cast<unsigned long long>(back.skipped_step));
        row.event = buf;
        last_trip = step;
        rec.rows.push_back(std::move(row));
        continue;
      }
      if (step > last_trip) rollbacks_in_a_row = 0;
    }
    SaveHandle saved_now;
    if (ckpt && (cadence ? save_due(*cadence, comm, step) : step % o.save_every == 0)) {
      if (faults && o.fail_save == step) {
        // Arm the fault between checkpoints: the previous one is committed, none of this
        // step's writes has started.
        comm.barrier();
        if (comm.rank() == 0) {
          ckpt->wait_all();
          faults->fail_nth(FaultInjectionFileSystem::Op::write, 0, EIO);
        }
        comm.barrier();
      }
      const auto t0 = std::chrono::steady_clock::now();
      try {
        saved_now = start_save(*ckpt, trainer);  // returns once staged; training goes on
      } catch (const Error& e) {
        // --max-consecutive-failures: every rank is refused at the same step (the count is
        // checked after the barrier), and the run ends with exit status 4.
        if (e.code() != Errc::aborted || o.max_consecutive_failures == 0 ||
            ckpt->stats().consecutive_failures < static_cast<std::uint64_t>(o.max_consecutive_failures))
          throw;
        collect(true, &row);
        row.event = "stopped: the saves of " + std::to_string(ckpt->stats().consecutive_failures) +
                    " checkpoints in a row failed (--max-consecutive-failures)";
        row.consecutive_save_failures = ckpt->stats().consecutive_failures;
        rec.rows.push_back(std::move(row));
        break;
      }
      pending.push_back(saved_now);
      row.stall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!rec.snapshot_step && o.fail_save != step) {
        rec.snapshot_step = step;
        for (const auto& t : trainer.checkpoint_tensors()) rec.snapshot.push_back({t.name, std::vector<std::byte>(t.data.begin(), t.data.end())});
        rec.snapshot_meta = ckpt::json_of(trainer.checkpoint_info().metadata);
      }
    }
    collect(false, &row);
    if (ckpt) row.consecutive_save_failures = ckpt->stats().consecutive_failures;
    if (ckpt && o.watch_signals && g_preemption) {
      if (const PreemptionDecision d = g_preemption->agree(comm); d.stop) {
        const PreemptionSave p = save_on_preemption(*ckpt, trainer, comm, saved_now, *g_preemption, d, o.grace_seconds);
        row.event = "preempted by " + signal_name(d.signal) + ": emergency save " + (p.committed ? "committed" : p.abandoned ? "abandoned" : "failed");
        abandoned = p.abandoned && !p.cleaned;
        rec.rows.push_back(std::move(row));
        std::lock_guard lk(g_preempted_mu);  // every rank has the same outcome
        g_preempted = Preempted{p, d.signal};
        break;
      }
    }
    rec.rows.push_back(std::move(row));
  }
  if (!abandoned) collect(true, nullptr);
  const auto p = trainer.optimizer().params16();
  rec.final_params.assign(p.begin(), p.end());
  rec.skipped_batches.assign(trainer.skipped_batches().begin(), trainer.skipped_batches().end());
  rec.memory = trainer.memory();
  rec.num_params = trainer.num_params();
  rec.resumed_from = start;
  rec.last_step = last;
  return rec;
}

// The whole run, as every rank's record (rank order), the same on every rank.
struct RunRecord {
  std::vector<RankRecord> ranks;
  std::string backend;
  std::optional<DurableStats> durable;  // with --durable-dir, after the copies drained
  std::optional<DurableDrain> drain;    // how that drain ended
  std::vector<RepairReport> repairs;     // what the Checkpointer's construction rebuilt (rank 0's)
  // A resume of node roots under MPI: the Checkpointer's start-up (its crash cleanup and the
  // rebuild of what a lost node held), and the survey of the plan after it (rank 0's).
  double startup_s = 0, discover_s = 0;
  bool repairs_whole = false;  // every checkpoint repaired verifies in full right after (check (i))
  const RankRecord& first() const { return ranks.at(0); }
  /// Rank 0's rows by step; a step trained twice (replayed after a rollback) keeps its last row.
  std::map<std::uint64_t, StepStats> final_trajectory() const {
    std::map<std::uint64_t, StepStats> out;
    for (const auto& row : first().rows) out[row.stats.step] = row.stats;
    return out;
  }
  std::vector<SaveFailure> save_errors() const {
    std::vector<SaveFailure> out;
    for (const auto& r : ranks) out.insert(out.end(), r.save_errors.begin(), r.save_errors.end());
    return out;
  }
};

// The drain of the durable tier after training: at most --durable-drain-deadline, saying
// what it waits for every 10 s, and given up at once on a signal (the main run's).
DurableDrainOptions drain_options(const Options& o) {
  DurableDrainOptions d;
  d.deadline = std::chrono::milliseconds(static_cast<std::int64_t>(o.drain_deadline * 1000));
  const std::string root = o.durable_dir.value_or("");
  d.progress = [root](const DurableDrainStatus& st) {
    if (!printer()) return;
    const auto step = st.running ? st.running : st.pending;
    std::printf("durable tier: waiting for step %s to reach %s (attempt %d of %d): %.0f s of %.0f s%s%s\n",
                step ? std::to_string(*step).c_str() : "?", root.c_str(), st.attempt, st.max_attempts,
                std::chrono::duration<double>(st.waited).count(), std::chrono::duration<double>(st.deadline).count(),
                st.last_error.empty() ? "" : "; the last error: ", st.last_error.c_str());
    std::fflush(stdout);
  };
  if (o.watch_signals)
    d.stop = [] { return g_preemption && g_preemption->count() > 0 ? signal_name(g_preemption->first_signal()) : std::string(); };
  return d;
}

RunRecord run(const Options& o, const std::string& root, bool resume, bool saves) {
  RunRecord rec;
  auto faults = std::make_unique<FaultInjectionFileSystem>(posix_file_system());
  std::unique_ptr<CommitCoordinator> coordinator;  // default (threads): in-process
#ifdef CKPT_DEMO_MPI
  if (g_mpi && saves) coordinator = dist::make_mpi_coordinator();  // its own communicator: never meets the training's
#endif
  std::unique_ptr<Checkpointer> ckpt;
  if (saves) {
    CheckpointerOptions opt{.root = root, .world_size = o.world, .keep_last = o.keep, .backend = o.writer,
                            .fs = o.fail_save ? faults.get() : nullptr, .coordinator = coordinator.get()};
    opt.max_consecutive_failures = o.max_consecutive_failures;
    opt.staging = o.deferred_staging ? Staging::deferred : Staging::copy;
    if (o.durable_dir) {
      opt.durable = DurableTierOptions{.root = *o.durable_dir, .keep_last = o.keep_durable, .every = o.durable_every};
      if (o.local_dir) opt.local_tier = DurableTierOptions{.root = *o.local_dir, .keep_last = o.local_keep, .every = o.local_every};
      opt.durable->drain_deadline = std::chrono::milliseconds(static_cast<std::int64_t>(o.drain_deadline * 1000));
      if (o.lease_seconds) {
        const auto period = std::chrono::milliseconds(static_cast<std::int64_t>(*o.lease_seconds * 1000));
        opt.durable->lease = {.period = period, .renew_every = std::max(std::chrono::milliseconds(1), period / 4)};
      }
    }
    if (o.nodes > 0) opt.nodes = NodeOptions{.ranks_per_node = o.world / o.nodes, .redundancy = o.redundancy};
    // A tiered resume may continue from the durable tier, older than what the local `latest`
    // names when that one is corrupt: its saves may then move `latest` back (logged).
    opt.allow_older_than_latest = resume && o.durable_dir;
    const auto t_startup = std::chrono::steady_clock::now();
    ckpt = std::make_unique<Checkpointer>(std::move(opt));
    rec.startup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_startup).count();
    rec.repairs = ckpt->repairs();
    if (is_mpi() && o.nodes > 0 && printer() && !rec.repairs.empty()) {
      // Check (i) now, through the Checkpointer's file system (each process sees only its
      // node's root), before this run's saves rotate the rebuilt checkpoints away.
      const auto roots = node_root_paths(root_directory(root), o.nodes);
      rec.repairs_whole = true;
      for (const auto& rep : rec.repairs) rec.repairs_whole &= check_node_checkpoint(ckpt->file_system(), roots, rep.name, Verify::full).healthy();
    }
    if (resume && is_mpi() && o.nodes > 0 && printer()) {
      // Each process sees only its node's root: the plan surveys them all through the
      // Checkpointer's file system, after its start-up rebuilt what a lost node held.
      RecoveryOptions survey;
      survey.fs = &ckpt->file_system();
      const RecoveryPlan plan = plan_recovery({root}, survey);
      rec.discover_s = std::chrono::duration<double>(plan.discover).count();
      std::printf("recovery plan (after the checkpointer's start-up): %s\n", plan.summary().c_str());
    }
  }
#ifdef CKPT_DEMO_METRICS
  // The main run's checkpointer, scraped while it trains; destroyed before it (declared after).
  std::unique_ptr<MetricsServer> metrics_server;
  if (ckpt && o.watch_signals && o.metrics_port > 0) {
    int port = o.metrics_port;
#ifdef CKPT_DEMO_MPI
    if (g_mpi) port += g_mpi->rank();
#endif
    metrics_server = std::make_unique<MetricsServer>(*ckpt, MetricsServerOptions{.port = port});
    std::printf("metrics: serving %s\n", metrics_server->url().c_str());
    std::fflush(stdout);
  }
#endif
  rec.backend = ckpt ? std::string(ckpt->backend_name()) : "none";
  std::mutex mu;
  auto rank_main = [&](dist::Communicator& comm) {
    const RankRecord mine = train_rank(o, comm, root, resume, ckpt.get(), o.fail_save ? faults.get() : nullptr);
    // Every rank's record reaches every rank: through the same communicator for threads and
    // processes.
    const auto blobs = comm.all_gather_bytes(demo::encode(mine));
    if (!is_mpi() && comm.rank() != 0) return;
    std::lock_guard lk(mu);
    for (const auto& b : blobs) rec.ranks.push_back(demo::decode(b));
  };
#ifdef CKPT_DEMO_MPI
  if (g_mpi) rank_main(g_mpi->world());
  else
#endif
    dist::run_ranks(o.world, rank_main);
  if (g_preempted && g_preempted->exit_now() && !is_mpi()) {
    // main exits with std::_Exit once its output is out: what the save still uses stays.
    (void)ckpt.release(), (void)coordinator.release(), (void)faults.release();
    return rec;
  }
  if (ckpt && o.durable_dir && !g_preempted) {
    ckpt->wait_all();
    // The last checkpoint reaches the durable tier whatever its cadence (--durable-every).
    if (printer())
      if (const auto last = open_store(root)->latest()) ckpt->copy_to_durable(*last);  // each tier that its cadence passed over
    rec.drain = ckpt->drain_durable(drain_options(o));
    rec.durable = ckpt->stats().durable;
  }
  barrier();  // under MPI only rank 0 commits and copies: its work is on disk before anyone checks
  return rec;
}

// Every category of the memory profile: its JSON key, its column in the table, its field.
struct MemoryCategory {
  const char* key;
  const char* column;
  std::uint64_t MemoryProfile::*field;
};
constexpr MemoryCategory kMemoryCategories[] = {
    {"params", "params (16b)", &MemoryProfile::params},          {"grads", "grads (16b)", &MemoryProfile::grads},
    {"params32", "params (fp32)", &MemoryProfile::params32},     {"grads32", "grads (fp32)", &MemoryProfile::grads32},
    {"optimizer", "optimizer", &MemoryProfile::optimizer},       {"activations", "activations", &MemoryProfile::activations},
};

json::object memory_json(const MemoryProfile& m) {
  json::object o;
  for (const auto& c : kMemoryCategories) o[c.key] = m.*c.field;
  o["total"] = m.total();
  return o;
}

// The max and the sum over ranks of each memory category.
struct MemorySpread {
  MemoryProfile max{}, sum{};
  void add(const MemoryProfile& m) {
    for (const auto& c : kMemoryCategories) max.*c.field = std::max(max.*c.field, m.*c.field), sum.*c.field += m.*c.field;
  }
};

// Memory after row i of the run: per rank, and max and mean over ranks of each category.
json::object memory_json(const RunRecord& rec, std::size_t i) {
  json::array per_rank;
  MemorySpread spread;
  for (const auto& rr : rec.ranks) {
    const MemoryProfile& m = rr.rows.at(i).memory;
    per_rank.push_back(memory_json(m));
    spread.add(m);
  }
  const double n = static_cast<double>(rec.ranks.size());
  json::object mean;
  for (const auto& c : kMemoryCategories) mean[c.key] = static_cast<double>(spread.sum.*c.field) / n;
  mean["total"] = static_cast<double>(spread.sum.total()) / n;
  return {{"max", memory_json(spread.max)}, {"mean", std::move(mean)}, {"per_rank", std::move(per_rank)}};
}

std::string fmt_bytes(std::uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(b));
  return buf;
}

// What in `root` (--dir, or a --durable-dir of either kind) may be a committed checkpoint, as
// its kind's commit protocol says (store/tiers.hpp): nullopt only for an empty root. A missing
// bucket is an error naming it, never "empty".
std::optional<std::string> committed_in(const std::string& root) { return open_store(root)->committed_evidence(); }

// Checkpoint `step` of `from` copied, verified, into a fresh root `to` of the same layout (a
// node set's with its redundancy blocks), committed there as its only checkpoint.
void copy_to_scratch(CheckpointStore& from, std::uint64_t step, const fs::path& to) {
  fs::remove_all(to);
  const auto scratch = open_store(to.string(), {.nodes = from.manifest(step)->nodes});
  copy_checkpoint(from, step, *scratch->writer(), {.copy_record = false});
}

// The step the live checkpoint of `root` has, or nullopt.
std::optional<std::uint64_t> latest_of(const std::string& root) { return open_store(root)->latest(); }
std::string latest_name(const std::optional<std::uint64_t>& step) { return step ? checkpoint_dir_name(*step) : std::string("none"); }

// With --nodes and --resume: what a lost or damaged node root held is rebuilt before the
// resume reads it (the store's explicit repair, under its writer: every node root's lock),
// and every rebuilt file is named. Returns, when something was rebuilt, the line of check (i).
std::optional<std::string> repair_before_resume(const Options& o, const std::string& root) {
  const auto store = open_store(root);
  const auto step = store->latest();
  if (!step) return std::nullopt;  // the resume reports it
  const std::string name = checkpoint_dir_name(*step);
  const auto writer = store->writer();
  const auto h = store->health(*step, Verify::full);
  if (!h || h->healthy()) {
    std::printf("%s: every shard and redundancy block verifies (%s)\n", name.c_str(), redundancy_name(o.redundancy).c_str());
    return std::nullopt;
  }
  for (const auto& s : h->shards)
    if (!s.ok) std::printf("%s: %s on node %d is bad: %s\n", name.c_str(), s.what.c_str(), s.node, s.error.c_str());
  const auto reports = writer->repair(*step, Verify::full);
  std::size_t files = 0, shards = 0;
  for (const auto& rep : reports) {
    for (const auto& line : rep.lines) std::printf("%s: %s\n", name.c_str(), line.c_str());
    files += rep.lines.size();
    shards += rep.rebuilt_ranks.size();
  }
  // Every rebuilt file was checked against the manifest's SHA-256 before it was renamed in;
  // the whole checkpoint is checked again here, as the resume will read it.
  const auto after = store->health(*step, Verify::full);
  return std::to_string(files) + " file(s) of " + name + " rebuilt (" + std::to_string(shards) +
         " shard(s)), each equal to the manifest's SHA-256; afterwards " + (after->healthy() ? "every shard and block verifies" : "STILL DAMAGED");
}

// The line a run with --durable-dir ends with: whether the durable tier holds the run's
// newest checkpoint, and if not, why.
std::string durable_tier_line(const Options& o, const std::string& local_root, const RunRecord& rec, bool gave_up) {
  const DurableStats& d = *rec.durable;
  const std::string root = *o.durable_dir;
  const std::string last_error = d.last_error.empty() ? "" : "; the last error: " + d.last_error;
  if (gave_up) {
    const DurableDrain& g = *rec.drain;
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.0f", std::chrono::duration<double>(g.waited).count());
    char deadline[32];
    std::snprintf(deadline, sizeof deadline, "%g", o.drain_deadline);
    const std::string why = g.gave_up_on == "the deadline" ? "--durable-drain-deadline " + std::string(deadline) : g.gave_up_on;
    return "durable tier: no, gave up after " + std::string(secs) + " s (" + why + "): step " +
           (g.step ? std::to_string(*g.step) : std::string("?")) + " did not reach " + root +
           (g.last_error.empty() ? "" : "; the last error: " + g.last_error);
  }
  if (d.lease_lost) return "durable tier: no, this run's writer lease on " + root + " was taken over by another writer, which commits there now" + last_error;
  const auto local_step = latest_of(local_root);
  if (local_step && d.last_step != local_step)
    return "durable tier: no, step " + std::to_string(*local_step) + " did not reach " + root + last_error;
  return "durable tier: yes" + (d.last_step ? ", " + root + " holds " + checkpoint_dir_name(*d.last_step) : std::string());
}

}  // namespace

namespace {
int program_main(int argc, char** argv) {
  Options o = parse(argc, argv);
  // Names of this run's temporary directories: this process's id, or rank 0's under MPI so
  // every process names the same directories.
  std::uint64_t run_id = static_cast<std::uint64_t>(::getpid());
#ifdef CKPT_DEMO_MPI
  std::optional<dist::MpiSession> mpi;
  if (o.mpi) {
    try {
      mpi.emplace(&argc, &argv);
    } catch (const Error& e) {
      std::fprintf(stderr, "ckpt-demo: %s\n", e.what());
      return 1;
    }
    g_mpi = &*mpi;
    g_quiet_usage = mpi->rank() != 0;
    if (o.world_given && o.world != mpi->size())
      usage("--world-size " + std::to_string(o.world) + " differs from the " + std::to_string(mpi->size()) +
            " MPI processes (with --backend mpi the world size is mpirun's -np)");
    o.world = mpi->size();
    if (o.train.tensor_parallel < 1 || o.world % o.train.tensor_parallel != 0) usage("--tensor-parallel must divide the world size");
    check_node_options(o);
    const auto ids = mpi->world().all_gather_bytes(std::as_bytes(std::span(&run_id, 1)));
    std::memcpy(&run_id, ids.at(0).data(), sizeof run_id);
    if (mpi->rank() != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;  // rank 0 reports
  }
#endif
  const bool temp_root = !o.dir;
  const std::string root = o.dir ? *o.dir : (fs::temp_directory_path() / ("ckpt-demo-" + std::to_string(run_id))).string();
  if (o.resume && temp_root) usage("--resume needs --dir");
  // Only a committed checkpoint makes a root non-empty, as each kind's commit protocol says
  // (a `latest`; on a node set also a step renamed into place on every node root; on an
  // object store a tier manifest): step directories no `latest` named were never committed,
  // and the checkpointer removes them (with a log line). --resume auto never starts fresh
  // while either tier may hold one.
  std::string auto_line;
  std::optional<std::string> local_committed;
  try {
    local_committed = committed_in(root);
    if (o.resume_auto) {
      std::optional<std::string> from = local_committed;
      if (!from && o.local_dir) from = committed_in(*o.local_dir);
      if (!from && o.durable_dir) from = committed_in(*o.durable_dir);
      o.resume = from.has_value();
      auto_line = !from                         ? "resume auto: no committed checkpoint in " + root + (o.durable_dir ? " or " + *o.durable_dir : "") +
                                                      ": starting fresh"
                  : from->ends_with(kLatestName) ? "resume auto: resuming from the checkpoint " + *from + " names"
                                                 : "resume auto: resuming from " + *from;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "ckpt-demo: %s\n", e.what());
    return cli::kExitError;
  }
#ifdef CKPT_DEMO_MPI
  if (mpi) {
    // Each process sees its own node's root (a process on its own machine): the run resumes
    // if any of them holds a committed checkpoint, and every process decides alike (a
    // replaced node's empty root must not start fresh while the others resume).
    const char mine[2] = {static_cast<char>(o.resume), static_cast<char>(local_committed.has_value())};
    bool any_resume = false, any_committed = false;
    for (const auto& b : mpi->world().all_gather_bytes(std::as_bytes(std::span(mine, 2)))) {
      any_resume |= static_cast<char>(b.at(0)) != 0;
      any_committed |= static_cast<char>(b.at(1)) != 0;
    }
    if (o.resume_auto && any_resume && !o.resume) auto_line = "resume auto: resuming: another process's node root holds a committed checkpoint";
    if (o.resume_auto) o.resume = any_resume;
    if (any_committed && !local_committed) local_committed = "another process's node root";
  }
#endif
  if (!o.resume && local_committed)
    usage(root + " already holds committed checkpoints: pass --resume (or --resume auto) to continue them, or another --dir");
  const fs::path scratch = fs::temp_directory_path() / ("ckpt-demo-scratch-" + std::to_string(run_id));
  // SIGTERM, SIGINT and SIGUSR1 are handled from here to the end of the process: while
  // training they stop it at a step boundary (an emergency save), while the durable tier
  // drains they cut the wait short, afterwards they are counted and the checks finish.
  Preemption preemption;
  g_preemption = &preemption;
  std::map<char, std::pair<bool, std::string>> checks;
  int exit_code = 0;
  std::string no_commit_line;  // set when the run ends with exit status 4
  std::string durable_line;    // with --durable-dir: the line that says what the durable tier holds
  bool durable_gave_up = false;  // exit status 5

  try {
    const auto& m = o.train.model;
    std::printf("ckpt-demo: mini GPT, %zu parameters (%d layers, dim %d, %d heads, vocab %d, seq %d, batch %d per rank)\n",
                num_params(m), m.layers, m.dim, m.heads, m.vocab, m.seq, m.batch);
    if (!auto_line.empty()) std::printf("%s\n", auto_line.c_str());
    if (o.memory_every && o.local_dir)
      std::printf("levels: memory %s every %llu steps, then the disk %s every %llu, then %s every %llu\n", root.c_str(),
                  static_cast<unsigned long long>(o.save_every), o.local_dir->c_str(), static_cast<unsigned long long>(o.local_every),
                  o.durable_dir->c_str(), static_cast<unsigned long long>(o.durable_every));
    else if (o.memory_every)
      std::printf("levels: memory %s every %llu steps, then the disk %s every %llu\n", root.c_str(), static_cast<unsigned long long>(o.save_every),
                  o.durable_dir->c_str(), static_cast<unsigned long long>(o.durable_every));
    std::fflush(stdout);  // what a run killed later said about where it keeps its checkpoints
    // The checkpoint a resume starts from, read before this run's saves can rotate it away.
    std::unique_ptr<CheckpointStore> source;  // and its step
    std::optional<std::uint64_t> source_step;
    int source_world = o.world;
    const bool object_tier = o.durable_dir && root_kind(*o.durable_dir) == StoreKind::object_store;
    // Time to recover (docs/memory.md): the plan over the levels (this root, then the durable
    // tier), then what the resume spends fetching, rebuilding, verifying and loading.
    double ttr_discover = 0, ttr_fetch = 0, ttr_rebuild = 0;
    using Clock = std::chrono::steady_clock;
    const auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
    if (o.resume && printer() && !(is_mpi() && o.nodes > 0)) {  // (under MPI with node roots: in run)
      std::vector<std::string> levels{root};
      if (o.local_dir) levels.push_back(*o.local_dir);
      if (o.durable_dir) levels.push_back(*o.durable_dir);
      const RecoveryPlan plan = plan_recovery(levels);
      ttr_discover = std::chrono::duration<double>(plan.discover).count();
      std::printf("recovery plan: %s\n", plan.summary().c_str());
    }
    if (o.resume && o.nodes > 0 && !is_mpi()) {
      const auto t_rebuild = Clock::now();
      try {
        if (const auto line = repair_before_resume(o, root)) checks['i'] = {line->find("STILL DAMAGED") == std::string::npos, *line};
        ttr_rebuild = seconds_since(t_rebuild);
      } catch (const Error& e) {
        if (!o.durable_dir) throw;
        std::printf("%s\nthe resume falls back to the durable tier %s\n", e.what(), o.durable_dir->c_str());
      }
    }
    std::string rehydrated_from;  // the object store a resume restored the local root from
    if (o.resume && object_tier && !o.local_dir) {  // (three levels: the planned resume restores into the disk level)
      // An object-store tier is not read in place: a local root whose checkpoint is missing or
      // bad is rehydrated from it (verified, committed locally) now, before this run's
      // checkpointer takes the local root's lock; the resume then finds it locally.
      if (printer()) {
        OpenLatestOptions full;
        full.verify = Verify::full;
        const auto t_fetch = Clock::now();
        const TieredCheckpoint t = open_latest_tiered(posix_file_system(), root, posix_file_system(), *o.durable_dir, full, o.adopt_run);
        if (t.restored) ttr_fetch = seconds_since(t_fetch);
        if (t.restored) {
          std::printf("resume: %s (the local tier: %s)\n", t.opened.note.c_str(), t.local_error.c_str());
          rehydrated_from = *o.durable_dir;
        }
      }
      barrier();
    }
    if (o.resume) {
      try {
        // The local tier's, else a durable tier read in place (an object store's was restored above).
        source = open_store(root);
        source_step = source->latest();
        if (!source_step && o.local_dir) {
          source = open_store(*o.local_dir);
          source_step = source->latest();
        }
        if (!source_step && o.durable_dir && !object_tier) {
          source = open_store(*o.durable_dir);
          source_step = source->latest();
        }
        if (source_step) source_world = source->manifest(*source_step)->world_size;
      } catch (const Error&) {
        // The resume itself reports what is wrong with it.
      }
      if (!source_step) source.reset();
    }
    // The signals are watched while this run trains and while it drains the durable tier;
    // the handlers stay until the process ends, so a signal during the checks does not kill
    // it either.
    Options main_run = o;
    main_run.watch_signals = true;
    const RunRecord rec = run(main_run, root, o.resume, true);
    const RankRecord& r0 = rec.first();
    if (is_mpi() && o.resume && o.nodes > 0 && printer()) {
      // Under MPI the Checkpointer's construction (rank 0's process) rebuilt what a lost or
      // damaged node root held, over the coordinator, before any process resumed.
      std::size_t files = 0, shards = 0;
      for (const auto& rep : rec.repairs) {
        for (const auto& line : rep.lines) std::printf("%s: %s\n", rep.name.c_str(), line.c_str());
        files += rep.lines.size();
        shards += rep.rebuilt_ranks.size();
      }
      if (files > 0) {
        const bool whole = rec.repairs_whole;
        checks['i'] = {whole, std::to_string(files) + " file(s) of " + std::to_string(rec.repairs.size()) + " checkpoint(s) rebuilt (" +
                                  std::to_string(shards) + " shard(s)) over the MPI coordinator, each equal to the manifest's SHA-256; afterwards " +
                                  (whole ? "every shard and block verifies" : "STILL DAMAGED")};
      }
    }
    const std::string layout = o.train.tensor_parallel > 1 ? " (tensor " + std::to_string(o.train.tensor_parallel) + " x data " +
                                                                  std::to_string(o.world / o.train.tensor_parallel) + ": attention heads split)"
                                                            : "";
    std::printf("%d ranks as %s%s, DDP + ZeRO-1%s, %s parameters, writer %s, checkpoints in %s\n", o.world, is_mpi() ? "MPI processes" : "threads", layout.c_str(),
                o.train.accumulate > 1 ? (", " + std::to_string(o.train.accumulate) + " micro-batches per step").c_str() : "",
                o.train.precision == Precision::f16 ? "fp16" : "bf16", rec.backend.c_str(), root.c_str());
    if (o.durable_dir) std::printf("durable tier %s: checkpoints are copied there in the background\n", o.durable_dir->c_str());
    if (is_mpi() && o.nodes > 0) ttr_discover = rec.discover_s, ttr_rebuild = rec.startup_s;  // the start-up rebuilt, then the plan
    const double ttr_total = ttr_discover + ttr_fetch + ttr_rebuild + r0.resume_verify_s + r0.resume_load_s;
    if (o.resume)
      std::printf("time to recover: %.3f s (discover %.3f, fetch %.3f, rebuild %.3f, verify %.3f, load %.3f)\n", ttr_total, ttr_discover,
                  ttr_fetch, ttr_rebuild, r0.resume_verify_s, r0.resume_load_s);
    if (o.resume)
      std::printf("resumed from step %llu%s%s\n", static_cast<unsigned long long>(r0.resumed_from),
                  source_world != o.world
                      ? (" (resharded from world size " + std::to_string(source_world) + " to " + std::to_string(o.world) + ")").c_str()
                      : "",
                  r0.resume_tier.empty() ? ""
                  : rehydrated_from.empty() ? (", from the " + r0.resume_tier).c_str()
                                            : (", from the " + r0.resume_tier + " (restored from " + rehydrated_from + ")").c_str());

    // ---- the loss table ----
    std::printf("\n%5s %10s %10s %11s %9s %9s %13s\n", "step", "loss", "grad norm", "param norm", "lr", "step ms", "save stall ms");
    std::ofstream metrics;
    if (o.metrics) {
      metrics.open(*o.metrics, std::ios::trunc);
      if (!metrics) throw Error(Errc::io_error, *o.metrics, "cannot open metrics file");
    }
    for (const auto& row : r0.rows) {
      const StepStats& s = row.stats;
      std::printf("%5llu %10.6f %10.5f %11.5f %9.6f %9.3f %13s%s%s%s\n", static_cast<unsigned long long>(s.step), s.loss, s.grad_norm,
                  s.param_norm, s.lr, s.step_ms, row.stall_ms > 0 ? std::to_string(row.stall_ms).substr(0, 6).c_str() : "",
                  s.skipped ? "  (overflow: skipped, loss scale halved)" : "", row.event.empty() ? "" : "  ", row.event.c_str());
      if (metrics) {
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"step\":%llu,\"loss\":%.9g,\"loss_hex\":\"%a\",\"grad_norm\":%.17g,\"param_norm\":%.17g,\"step_ms\":%.3f,"
                      "\"save_stall_ms\":%.3f,\"skipped\":%s,",
                      static_cast<unsigned long long>(s.step), static_cast<double>(s.loss), static_cast<double>(s.loss), s.grad_norm,
                      s.param_norm, s.step_ms, row.stall_ms, s.skipped ? "true" : "false");
        metrics << line << "\"memory\":" << json::serialize(memory_json(rec, static_cast<std::size_t>(&row - r0.rows.data())));
        metrics << ",\"consecutive_save_failures\":" << row.consecutive_save_failures;
        if (o.resume && &row == &r0.rows.front())
          metrics << ",\"time_to_recover\":"
                  << json::serialize(json::object{{"seconds", ttr_total}, {"discover", ttr_discover}, {"fetch", ttr_fetch}, {"rebuild", ttr_rebuild},
                                                  {"verify", r0.resume_verify_s}, {"load", r0.resume_load_s}});
        if (!row.event.empty()) metrics << ",\"event\":" << json::serialize(json::value(row.event));
        metrics << "}\n";
      }
    }
    if (g_preempted) {
      // The loss table and the metrics so far are the run's output; then the one line, exit 0.
      if (metrics) metrics.close();
      PreemptionSave& p = g_preempted->save;
      const bool exit_now = g_preempted->exit_now() && !is_mpi();
      if (exit_now && p.abandoned && !p.cleaned) {
        // The abandoned save runs on until the process ends: read `latest` again at the last
        // moment, so the line names what the root holds (it may have committed meanwhile).
        std::fflush(stdout);
        p.latest = latest_of(root);
        if (p.latest == p.step) p.abandoned = false, p.committed = true;
      }
      std::printf("\n%s\n", preemption_line(p, g_preempted->signal).c_str());
      std::fflush(stdout);
      if (exit_now) std::_Exit(0);
      barrier();
      return 0;
    }

    // ---- memory profile ----
    // Measured: what each buffer holds (capacity x element size). Check (c) compares the
    // optimizer column with 12 P / N.
    std::printf("\nmemory per rank (bytes, measured)\n%6s", "rank");
    for (const auto& c : kMemoryCategories) std::printf(" %14s", c.column);
    std::printf(" %14s %12s\n", "total", "12 P / N");
    auto memory_row = [](const char* label, const MemoryProfile& mp, std::uint64_t divide, const std::string& expected) {
      std::printf("%6s", label);
      for (const auto& c : kMemoryCategories) std::printf(" %14s", fmt_bytes(mp.*c.field / divide).c_str());
      std::printf(" %14s %12s\n", fmt_bytes(mp.total() / divide).c_str(), expected.c_str());
    };
    MemorySpread spread;
    for (const auto& rr : rec.ranks) {
      memory_row(std::to_string(rr.rank).c_str(), rr.memory, 1, fmt_bytes(rr.memory.expected_optimizer));
      spread.add(rr.memory);
    }
    memory_row("max", spread.max, 1, "");
    memory_row("mean", spread.sum, static_cast<std::uint64_t>(o.world), "");

    // ---- the manifest of the first checkpoint of this run ----
    const auto save_errors = rec.save_errors();
    {
      std::map<std::pair<std::uint64_t, std::string>, int> seen;  // a failed checkpoint fails every rank's save
      for (const auto& e : save_errors) ++seen[{e.step, e.message}];
      for (const auto& [key, ranks] : seen)
        std::printf("save of step %llu failed on %d rank(s): %s\n", static_cast<unsigned long long>(key.first), ranks, key.second.c_str());
    }
    // Exit status 4: saves failed and none committed since the first of them (`latest`, if
    // any, is older than the first failed step): the run has nothing newer to resume from.
    if (!save_errors.empty()) {
      const auto first_failed = std::min_element(save_errors.begin(), save_errors.end(),
                                                 [](const SaveFailure& a, const SaveFailure& b) { return a.step < b.step; });
      const auto live = latest_of(root);
      std::set<std::uint64_t> failed_steps;
      for (const auto& e : save_errors) failed_steps.insert(e.step);
      if (!live || *live < first_failed->step)
        no_commit_line = "ckpt-demo: no checkpoint committed since the save of step " + std::to_string(first_failed->step) + " failed (" +
                         std::to_string(failed_steps.size()) + " failed saves; latest " + latest_name(live) +
                         "; the last error: " + save_errors.back().message + "): exit status " + std::to_string(kExitNoCommit);
    }
    // Failures other than the one --fail-save asked for make checks (d) and (e) meaningless.
    const bool unexpected_failures =
        std::any_of(save_errors.begin(), save_errors.end(), [&](const SaveFailure& e) { return o.fail_save != e.step; });
    // The first checkpoint of the run, where it still is: rotation (--keep) may have removed it
    // from the local tier while the durable tier keeps it; with neither, (d) and (e) skip.
    // (An object-store tier is not read for these checks: (h) verifies it.)
    std::unique_ptr<CheckpointStore> snap;
    if (r0.snapshot_step)
      for (const std::string& r : {root, object_tier ? std::string() : o.durable_dir.value_or("")}) {
        if (snap || r.empty()) continue;
        try {
          auto store = open_store(r);
          (void)store->manifest(*r0.snapshot_step);
          snap = std::move(store);
        } catch (const Error&) {
        }
      }
    if (snap) std::printf("\nmanifest of %s\n%s", snap->name_of(*r0.snapshot_step).c_str(), snap->manifest_text(*r0.snapshot_step).c_str());

    // ---- checks ----
    const auto trajectory = rec.final_trajectory();
    if (r0.rows.size() >= 10) {
      double first = 0, last = 0;
      for (std::size_t i = 0; i < 5; ++i) first += r0.rows[i].stats.loss / 5;
      for (std::size_t i = r0.rows.size() - 5; i < r0.rows.size(); ++i) last += r0.rows[i].stats.loss / 5;
      char buf[128];
      std::snprintf(buf, sizeof buf, "mean loss of the first 5 steps %.4f, of the last 5 %.4f", first, last);
      checks['a'] = {last < first - 1e-3, buf};
    }
    {
      bool same = true;
      for (const auto& rr : rec.ranks) {
        same &= rr.rows.size() == r0.rows.size();
        for (std::size_t i = 0; same && i < rr.rows.size(); ++i)
          same &= std::memcmp(&rr.rows[i].stats.param_norm, &r0.rows[i].stats.param_norm, sizeof(double)) == 0;
      }
      checks['b'] = {same, std::to_string(r0.rows.size()) + " steps x " + std::to_string(o.world) + " ranks, bitwise"};
    }
    {
      // The optimizer's buffers as measured, against what ZeRO-1 promises: 12 P / N.
      const auto off = std::find_if(rec.ranks.begin(), rec.ranks.end(),
                                    [](const RankRecord& rr) { return rr.memory.optimizer != rr.memory.expected_optimizer; });
      const RankRecord* worst = off == rec.ranks.end() ? &r0 : &*off;
      const bool ok = worst->memory.optimizer == worst->memory.expected_optimizer;
      const std::string formula = "12 x " + std::to_string(r0.num_params) + " (padded to a multiple of " + std::to_string(o.world) + ") / " +
                                  std::to_string(o.world);
      checks['c'] = {ok, ok ? fmt_bytes(r0.memory.optimizer) + " bytes measured per rank = " + formula
                            : "rank " + std::to_string(worst->rank) + " holds " + fmt_bytes(worst->memory.optimizer) +
                                  " optimizer bytes, expected " + fmt_bytes(worst->memory.expected_optimizer) + " = " + formula};
    }
    if (snap && !unexpected_failures) {
      bool equal = true;
      std::size_t tensors = 0;
      const auto reader = snap->open(*r0.snapshot_step, o.world);
      for (const auto& rr : rec.ranks) {
        const auto shard = reader.load_shard(rr.rank, Verify::full);
        for (const auto& [name, bytes] : rr.snapshot) {
          const auto& t = shard.tensor(name);
          equal &= t.data.size() == bytes.size() && std::equal(bytes.begin(), bytes.end(), t.data.begin());
          ++tensors;
        }
        equal &= ckpt::json_of(shard.record.metadata) == rr.snapshot_meta;
      }
      checks['d'] = {equal, std::to_string(tensors) + " tensors of " + checkpoint_dir_name(*r0.snapshot_step) + ", SHA-256 verified"};
    }
    if (o.reshard && source) {
      // (f): the flat state the ranks restored, in rank order, against the source's.
      const auto src = source->open(*source_step);
      bool equal = true;
      const std::uint64_t real = r0.num_params * sizeof(float);
      for (const char* name : {"optim.master", "optim.m", "optim.v"}) {
        std::vector<std::byte> from, to;
        for (int r = 0; r < src.manifest().world_size; ++r) {
          const auto b = src.read_tensor(name, r, Verify::full);
          from.insert(from.end(), b.begin(), b.end());
        }
        for (const auto& rr : rec.ranks) {
          const auto& b = rr.restored.at(name);
          to.insert(to.end(), b.begin(), b.end());
        }
        equal &= from.size() >= real && to.size() >= real && std::equal(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(real), to.begin());
        equal &= std::all_of(to.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(real, to.size())), to.end(),
                             [](std::byte b) { return b == std::byte{0}; });
      }
      checks['f'] = {equal, "optim.master, optim.m, optim.v of " + std::to_string(o.world) + " ranks = the " +
                                std::to_string(src.manifest().world_size) + "-rank flat state of " + source->name_of(*source_step) + ", bitwise"};
    }
    const bool gave_up = rec.drain && !rec.drain->complete;  // nothing more may touch the durable tier
    durable_gave_up = gave_up;
    if (o.durable_dir && rec.durable) durable_line = durable_tier_line(o, root, rec, gave_up);
    if (o.durable_dir && rec.durable && !gave_up) {
      // (h): the durable tier holds what the local tier committed: its latest names the local
      // tier's, and every checkpoint there verifies in full (each shard's SHA-256 read back,
      // over the network for an object store), with what its store records of it (a copy
      // record where it keeps files, the committing run on an object store).
      const DurableStats& d = *rec.durable;
      std::printf("\ndurable tier %s: %llu copies (%llu MiB, XXH3 re-verified), %llu superseded, %llu failed attempts%s%s\n",
                  o.durable_dir->c_str(), static_cast<unsigned long long>(d.copies), static_cast<unsigned long long>(d.bytes >> 20),
                  static_cast<unsigned long long>(d.superseded), static_cast<unsigned long long>(d.failures),
                  d.last_error.empty() ? "" : ", last error: ", d.last_error.c_str());
      const auto durable = open_store(*o.durable_dir);
      const auto local_latest = latest_of(root);
      const auto durable_latest = durable->latest();
      bool ok = local_latest.has_value() && durable_latest == local_latest;
      std::size_t verified = 0, records = 0;
      for (const auto& c : durable->list(Verify::full)) {
        if (!c.step) continue;
        if (c.state != CheckpointState::complete) {
          std::printf("  %s  %s: %s\n", c.name.c_str(), std::string(checkpoint_state_name(c.state)).c_str(), c.error.c_str());
          ok = false;
          continue;
        }
        if (c.copy) {
          std::printf("  %s  copied from %s at %s, %llu XXH3 chunks verified\n", c.name.c_str(),
                      join_path(c.copy->source_root, c.copy->source_dir).c_str(), c.copy->copied_at.c_str(),
                      static_cast<unsigned long long>(c.copy->xxh3_chunks_verified));
          ok &= c.copy->step == *c.step;
          ++records;
        } else {
          std::printf("  %s  committed by run %s%s, every XXH3 chunk and SHA-256 verified\n", c.name.c_str(),
                      c.run.empty() ? "(not recorded)" : c.run.c_str(), c.tier ? (" at " + c.tier->committed_at).c_str() : "");
        }
        ++verified;
      }
      ok &= verified > 0;
      checks['h'] = {ok, std::to_string(verified) + " checkpoints in the durable tier verify full" + (records == verified ? " with their copy records" : "") +
                             "; latest " + latest_name(durable_latest) + " (local tier: " + latest_name(local_latest) + ")"};
    }
    if (o.fail_save) {
      // (g): the failing disk failed one save, not the run.
      const std::uint64_t at = *o.fail_save;
      std::size_t ranks_failed = 0;
      for (const auto& e : save_errors) ranks_failed += e.step == at && e.code == errc_name(Errc::io_error);
      bool ok = ranks_failed == static_cast<std::size_t>(o.world) && !unexpected_failures && r0.rows.back().stats.step == r0.last_step;
      bool temporaries = false;
      for (const auto& e : fs::directory_iterator(root_directory(root))) temporaries |= is_temporary_name(e.path().filename().string());
      ok &= !temporaries && !fs::exists(join_path(root_directory(root), checkpoint_dir_name(at)));
      std::size_t verified = 0;
      std::vector<StoredCheckpoint> listed;
      try {
        listed = open_store(root)->list(Verify::full);
      } catch (const Error& e) {
        if (e.code() != Errc::not_found) throw;  // nothing committed, nothing in progress: nothing to verify
      }
      for (const auto& c : listed) {
        if (!c.step) continue;  // a temporary: counted above
        ok &= c.state == CheckpointState::complete;
        verified += c.state == CheckpointState::complete;
      }
      // `latest` names the last save of the run, or the one before it if that was the failed one.
      std::uint64_t expect = r0.last_step / o.save_every * o.save_every;
      if (expect == at) expect -= o.save_every;
      const auto latest = latest_of(root);
      ok &= expect == 0 ? !latest.has_value() : latest == expect;
      checks['g'] = {ok, "save of step " + std::to_string(at) + " failed with \"" + std::string(errc_name(Errc::io_error)) + "\" on " +
                             std::to_string(ranks_failed) + " of " + std::to_string(o.world) + " ranks; trained to step " +
                             std::to_string(r0.rows.back().stats.step) + "; latest " + latest_name(latest) + "; " +
                             std::to_string(verified) + " checkpoints verify full; " + (temporaries ? "temporaries LEFT" : "no temporaries")};
    }
    if (!o.resume && snap && *r0.snapshot_step < r0.last_step && !unexpected_failures) {
      const std::string name = checkpoint_dir_name(*r0.snapshot_step);
      if (printer()) copy_to_scratch(*snap, *r0.snapshot_step, scratch / "resume");
      barrier();  // the copy is there for every process
      Options again_opts = o;
      again_opts.fail_save.reset();
      again_opts.durable_dir.reset();  // the scratch copy is the only tier of that run
      again_opts.inject_spike.reset();
      again_opts.skip_batches = r0.skipped_batches;
      again_opts.steps = r0.last_step;  // a resume without --steps would stop 10 steps past its checkpoint
      const RunRecord again = run(again_opts, (scratch / "resume").string(), true, false);
      bool same = true;
      for (std::size_t r = 0; r < rec.ranks.size(); ++r) same &= again.ranks.at(r).final_params == rec.ranks[r].final_params;
      std::size_t compared = 0;
      for (const auto& [step, s] : again.final_trajectory()) {
        const auto& orig = trajectory.at(step);
        same &= std::memcmp(&s.loss, &orig.loss, sizeof s.loss) == 0 && std::memcmp(&s.grad_norm, &orig.grad_norm, sizeof s.grad_norm) == 0;
        ++compared;
      }
      checks['e'] = {same && compared == r0.last_step - *r0.snapshot_step,
                     "resumed from " + name + ": losses of steps " + std::to_string(*r0.snapshot_step + 1) + ".." +
                         std::to_string(r0.last_step) + " and final parameters of every rank, bitwise"};

      // The loader's defences, on scratch copies so DIR holds only this run's checkpoints.
      // One process shows them (the others' output is not shown anyway).
    }
    if (printer() && !o.resume && snap && *r0.snapshot_step < r0.last_step && !unexpected_failures) {
      const std::string name = checkpoint_dir_name(*r0.snapshot_step);
      std::printf("\nthe loader refuses bad resumes (scratch copies of %s):\n", name.c_str());
      // A resume: what the store's redundancy rebuilds is rebuilt first (the explicit repair a
      // Checkpointer's start-up runs; opening never writes), then the live checkpoint opens.
      const auto resume_open = [&](const std::string& root, int world) {
        std::string rebuilt;
        const auto store = open_store(root);
        if (const auto step = store->latest())
          for (const auto& rep : store->writer()->repair(*step, Verify::fast))
            for (const auto& line : rep.lines) rebuilt += (rebuilt.empty() ? "rebuilt: " : "; ") + line;
        auto opened = store->open_latest({.expected_world_size = world});
        opened.note = rebuilt;
        return opened;
      };
      auto refuse = [&](const char* what, auto&& damage, int world) {
        copy_to_scratch(*snap, *r0.snapshot_step, scratch / "bad");
        damage(scratch / "bad" / name);
        try {
          auto opened = resume_open((scratch / "bad").string(), world);
          for (int r = 0; r < world; ++r) opened.reader.load_shard(r);
          std::printf("  %-24s NOT refused\n", what);
          exit_code = 1;
        } catch (const Error& e) {
          std::printf("  %-24s %s\n", what, e.what());
        }
      };
      const auto shards = snap->manifest(*r0.snapshot_step)->shards;
      refuse(("world size " + std::to_string(2 * o.world) + ":").c_str(), [](const fs::path&) {}, 2 * o.world);
      if (o.nodes == 0) {
        refuse("missing shard:", [&](const fs::path& d) { fs::remove(d / shards.back().path); }, o.world);
        refuse("truncated shard:", [&](const fs::path& d) { fs::resize_file(d / shards.front().path, shards.front().size / 2); }, o.world);
      } else {
        // Node roots: d is scratch/bad/step-N, which does not exist; the node roots are the
        // node set's (node_root_paths). What the scheme survives is rebuilt, one more is refused.
        const int tolerated = tolerated_node_losses(o.redundancy);
        const auto lose = [&](int count) {
          return [&, count](const fs::path& d) {
            const auto roots = node_root_paths(d.parent_path().string(), o.nodes);
            for (int n = 0; n < count; ++n) fs::remove_all(roots[static_cast<std::size_t>(n)]);
          };
        };
        if (tolerated > 0) {
          copy_to_scratch(*snap, *r0.snapshot_step, scratch / "bad");
          lose(tolerated)(scratch / "bad" / name);
          try {
            auto opened = resume_open((scratch / "bad").string(), o.world);
            for (int r = 0; r < o.world; ++r) opened.reader.load_shard(r, Verify::full);
            std::printf("  %-24s rebuilt, not refused: %s\n", (std::to_string(tolerated) + " node(s) lost:").c_str(), opened.note.c_str());
          } catch (const Error& e) {
            std::printf("  %-24s NOT rebuilt: %s\n", (std::to_string(tolerated) + " node(s) lost:").c_str(), e.what());
            exit_code = 1;
          }
        }
        refuse((std::to_string(tolerated + 1) + " node(s) lost:").c_str(), lose(tolerated + 1), o.world);
      }
    }
  } catch (...) {  // a ckpt::Error, or a std::filesystem / std::bad_alloc failure, typed
    std::fprintf(stderr, "ckpt-demo: %s\n", to_error(std::current_exception()).what());
    exit_code = 1;
  }
  barrier();  // every process is done reading before the scratch and temporary roots go
  if (printer()) fs::remove_all(scratch);

  std::printf("\nchecks\n");
  const std::map<char, const char*> names = {{'a', "loss falls"},
                                             {'b', "same parameter norm on every rank"},
                                             {'c', "optimizer bytes = 12 P / N"},
                                             {'d', "checkpoint reloads byte-equal"},
                                             {'e', "bit-exact resume"},
                                             {'f', "resharded state = source state"},
                                             {'g', "a failed save does not stop training"},
                                             {'h', "both tiers hold the checkpoints"},
                                             {'i', "lost shards rebuilt bit-exactly"}};
  for (const auto& [c, name] : names) {
    const auto it = checks.find(c);
    if (it == checks.end() && ((c == 'f' && !o.reshard) || (c == 'g' && !o.fail_save) || (c == 'h' && !o.durable_dir) || c == 'i'))
      continue;  // only runs that ask have them
    if (it == checks.end()) {
      std::printf("  (%c) %-36s skipped (see --help)\n", c, name);
      continue;
    }
    std::printf("  (%c) %-36s %s: %s\n", c, name, it->second.first ? "PASS" : "FAIL", it->second.second.c_str());
    if (!it->second.first) exit_code = 1;
  }
  if (checks.count('e') && checks['e'].first) std::printf("resume verified\n");
  if (temp_root && printer()) fs::remove_all(root);
  if (!durable_line.empty()) std::printf("%s\n", durable_line.c_str());
  if (!no_commit_line.empty()) {
    std::printf("%s\n", no_commit_line.c_str());
    return kExitNoCommit;
  }
  if (durable_gave_up) return kExitDurableGaveUp;
  return exit_code;
}
}  // namespace

int main(int argc, char** argv) {
  return ckpt::cli::guarded_main("ckpt-demo", [&] { return program_main(argc, argv); });
}
