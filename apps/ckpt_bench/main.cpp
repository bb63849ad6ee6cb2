// SPDX-License-Identifier: Apache-2.0
// ckpt-bench: a simulated training job (rank threads, real compute per step, a checkpoint every
// k steps) run in every save mode, interleaved over repeats, beside reference figures measured
// in the same run (raw O_DIRECT disk bandwidth, memcpy, single-core XXH3 and SHA-256), so that
// every figure that matters is a ratio immune to this machine's drift. See bench/README.md.
#include <algorithm>
#include <boost/json.hpp>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli.hpp"
#include "json_output.hpp"
#include "runner.hpp"

namespace json = boost::json;
namespace cli = ckpt::cli;
using namespace bench;

namespace {

const char* kDescription = R"(ckpt-bench: sync versus async checkpoint saves, against the raw disk

A simulated training job: RANKS threads each hold 1/RANKS of the state (a mix of large bf16 /
fp32 matrices and many small tensors), run a memory-bound compute kernel per step and save a
checkpoint every EVERY steps. Modes run interleaved over REPEATS rounds: none (no checkpoint),
sync (save_sync), async_io_uring and async_posix (save(), the two writers). References in the
same run: raw O_DIRECT write/read of the directory's disk (own io_uring loop), memcpy of the
state, single-core XXH3 and SHA-256, and the hashing bound (SHA-256 x the cores a save can hash
on). Also: saves with deferred staging (blocked time against the memcpy), loads with verify
none / fast / full, into owned memory (load_into) and through MappedShard (one small tensor,
and everything).)";

const char* kFooter = R"(
SIZE is a byte count: 1024, 64K, 500M, 1.5G (binary units, K = 1024).
Targets are printed as PASS/FAIL; they do not change the exit code (0 unless an error).
)";

struct Cli {
  Options o;
  std::string render;
};

// A number above `lo` (strictly) or at least `lo`.
CLI::Validator at_least(double lo, bool strictly) {
  return CLI::Validator(
      [lo, strictly](std::string& v) -> std::string {
        double d = 0;
        if (CLI::detail::lexical_cast(v, d) && (strictly ? d > lo : d >= lo)) return {};
        return "needs a number " + std::string(strictly ? "> " : ">= ") + CLI::detail::to_string(lo) + ", got '" + v + "'";
      },
      "");
}

// What --quick sets, unless the command line gives the option itself.
struct QuickDefault {
  CLI::Option* option;
  std::function<void()> apply;
};

Cli parse(int argc, char** argv) {
  Cli c;
  Options& o = c.o;
  CLI::App app(kDescription, "ckpt-bench");
  cli::setup(app);
  app.footer(kFooter);
  using cli::add_int_option;
  app.add_option("--dir", o.dir,
                 "where checkpoints go (default: a fresh directory under $TMPDIR or\n"
                 "/var/tmp, removed at the end); measures that directory's disk")
      ->option_text("DIR");
  auto* size = cli::add_size_option(app, "--size", o.size, "training state of all ranks together (default 1G)");
  add_int_option(app, "--ranks", o.ranks, 1, 1024, "N", "rank threads (default 4)");
  auto* repeats = add_int_option(app, "--repeats", o.repeats, 1, 1 << 20, "N", "interleaved rounds of all modes (default 3)");
  auto* saves = add_int_option(app, "--saves", o.saves, 1, 1 << 20, "N", "checkpoints per mode per round (default 3)");
  auto* every = add_int_option(app, "--every", o.every, 1, 1 << 20, "K", "a checkpoint every K steps (default 20)");
  auto* step_ms = app.add_option("--step-ms", o.step_ms,
                                 "compute per step with all ranks running (default 100; calibrated\n"
                                 "as a fixed number of kernel passes; 0: no compute)")
                      ->check(at_least(0, false))
                      ->option_text("MS");
  auto* compute_mb = app.add_option("--compute-mb", o.compute_mb, "per-rank buffer the kernel streams over (default 16)")
                         ->check(at_least(0, true))
                         ->option_text("MB");
  app.add_option("--modes", o.modes, "comma-separated subset of none,sync,async_io_uring,async_posix")
      ->delimiter(',')
      ->check(CLI::IsMember(kAllModes).description(""))
      ->option_text("LIST");
  app.add_flag_callback("--no-load", [&o] { o.loads = false; }, "skip the load measurements");
  app.add_flag_callback("--no-cold-pool", [&o] { o.cold_pool = false; }, "skip the first-save-with-unallocated-pool demonstration");
  auto* soak = add_int_option(app, "--soak", o.soak_saves, 0, 1 << 20, "N", "back-to-back async saves for the memory check (default 50; 0: skip)");
  auto* settle = add_int_option(app, "--load-settle-ms", o.load_settle_ms, 0, 1 << 30, "MS",
                                "idle time before each load (default 3000): this VM takes freed memory\n"
                                "back after ~2 s, so every load starts like a fresh resume process");
  add_int_option(app, "--queue-depth", o.queue_depth, 1, 1024, "N", "ckpt writes in flight per shard (default 4)");
  cli::add_size_option(app, "--chunk-size", o.chunk_size, "ckpt chunk size (default 4M)");
  add_int_option(app, "--raw-qd", o.raw_queue_depth, 1, 1024, "N", "raw reference queue depth (default 8)");
  cli::add_size_option(app, "--raw-piece", o.raw_piece, "raw reference piece size, a multiple of 4096 (default 4M)");
  add_int_option(app, "--load-qd", o.load_queue_depth, 1, 4096, "N", "load_into's reads in flight per file (default: LoadOptions')");
  cli::add_size_option(app, "--load-io", o.load_io_size, "load_into's bytes per read, a multiple of 4096 (default: LoadOptions')");
  add_int_option(app, "--load-threads", o.load_threads, 0, 1024, "N", "load_into's threads (default 0: one per rank; see LoadOptions::threads)");
  app.add_option("--json", o.json_path, "every figure as JSON")->option_text("FILE");
  app.add_option("--plot", o.plot_path, "timeline of sync and async saves, and the ratio bars")->option_text("FILE.svg");
  app.add_option("--markdown", o.markdown_path, "the result tables as markdown")->option_text("FILE");
  app.add_option("--layout", o.layout_path, "the tensor layout as JSON (the peers script rebuilds it)")->option_text("FILE");
  app.add_option("--render", c.render,
                 "do not run: print the table of a saved --json file (and write\n"
                 "--plot / --markdown from it)")
      ->option_text("FILE.json");
  app.add_flag("--keep", o.keep, "keep the checkpoints");
  app.add_flag("--quick", o.quick,
               "small and short (32M, 2 repeats, 2 saves, every 8 steps of 10 ms,\n"
               "soak 10, no load settling): a smoke run in seconds; options given\n"
               "with it override it");
  if (const auto rc = cli::parse(app, argc, argv)) std::exit(*rc);
  if (o.quick) {
    const std::vector<QuickDefault> quick = {{size, [&] { o.size = 32ull << 20; }},     {repeats, [&] { o.repeats = 2; }},
                                             {saves, [&] { o.saves = 2; }},             {every, [&] { o.every = 8; }},
                                             {step_ms, [&] { o.step_ms = 10; }},        {compute_mb, [&] { o.compute_mb = 2; }},
                                             {soak, [&] { o.soak_saves = 10; }},        {settle, [&] { o.load_settle_ms = 0; }}};
    for (const auto& q : quick)
      if (q.option->count() == 0) q.apply();
  }
  auto usage = [](const std::string& msg) {
    cli::print_usage_error("ckpt-bench", msg);
    std::exit(cli::kExitUsage);
  };
  if (o.modes.empty()) usage("--modes is empty");
  if (o.raw_piece % 4096) usage("--raw-piece must be a multiple of 4096");
  if (o.load_io_size == 0 || o.load_io_size % 4096) usage("--load-io must be a positive multiple of 4096");
  return c;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

}  // namespace

namespace {
int program_main(int argc, char** argv) {
  const Cli cli = parse(argc, argv);
  try {
    json::object res;
    if (!cli.render.empty()) {
      std::ifstream in(cli.render);
      std::stringstream ss;
      ss << in.rdbuf();
      if (!in) throw std::runtime_error("cannot read " + cli.render);
      res = json::parse(ss.str()).as_object();
      // Figures of another format read under this one's meaning would be wrong without a word.
      const json::value* schema = res.if_contains(ckpt::cli::kSchemaField);
      const std::string want = ckpt::cli::schema_id(kJsonName, kJsonVersion);
      if (!schema || *schema != json::value(want))
        throw std::runtime_error(cli.render + ": schema " + (schema ? json::serialize(*schema) : std::string("missing")) + ", expected \"" + want + "\"");
    } else {
      res = Runner(cli.o).run();
      if (!cli.o.json_path.empty()) write_file(cli.o.json_path, pretty_json(res));
    }
    std::cout << render_table(res) << std::flush;
    if (!cli.o.plot_path.empty()) write_file(cli.o.plot_path, render_svg(res));
    if (!cli.o.markdown_path.empty()) write_file(cli.o.markdown_path, render_markdown(res));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-bench: %s\n", ckpt::to_error(std::current_exception()).what());
    return ckpt::cli::kExitError;
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  return ckpt::cli::guarded_main("ckpt-bench", [&] { return program_main(argc, argv); });
}
