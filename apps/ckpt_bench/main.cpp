// ckpt-bench: a simulated training job (rank threads, real compute per step, a checkpoint every
// k steps) run in every save mode, interleaved over repeats, beside reference figures measured
// in the same run (raw O_DIRECT disk bandwidth, memcpy, single-core XXH3 and SHA-256), so that
// every figure that matters is a ratio immune to this machine's drift. See bench/README.md.
#include <algorithm>
#include <boost/json.hpp>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "runner.hpp"

namespace json = boost::json;
using namespace bench;

namespace {

const char* kHelp = R"(ckpt-bench: sync versus async checkpoint saves, against the raw disk

usage: ckpt-bench [options]

A simulated training job: RANKS threads each hold 1/RANKS of the state (a mix of large bf16 /
fp32 matrices and many small tensors), run a memory-bound compute kernel per step and save a
checkpoint every EVERY steps. Modes run interleaved over REPEATS rounds: none (no checkpoint),
sync (save_sync), async_io_uring and async_posix (save(), the two writers). References in the
same run: raw O_DIRECT write/read of the directory's disk (own io_uring loop), memcpy of the
state, single-core XXH3 and SHA-256. Loads are measured with verify none / fast / full.

options:
  --dir DIR           where checkpoints go (default: a fresh directory under $TMPDIR or
                      /var/tmp, removed at the end); measures that directory's disk
  --size BYTES        training state of all ranks together (default 1G; K/M/G suffixes)
  --ranks N           rank threads (default 4)
  --repeats N         interleaved rounds of all modes (default 3)
  --saves N           checkpoints per mode per round (default 3)
  --every K           a checkpoint every K steps (default 20)
  --step-ms MS        compute per step with all ranks running (default 100; calibrated
                      as a fixed number of kernel passes; 0: no compute)
  --compute-mb MB     per-rank buffer the kernel streams over (default 16)
  --modes LIST        comma-separated subset of none,sync,async_io_uring,async_posix
  --no-load           skip the load measurements
  --no-cold-pool      skip the first-save-with-unallocated-pool demonstration
  --soak N            back-to-back async saves for the memory check (default 50; 0: skip)
  --load-settle-ms MS idle time before each load (default 3000): this VM takes freed memory
                      back after ~2 s, so every load starts like a fresh resume process
  --queue-depth N     ckpt writes in flight per shard (default 4)
  --chunk-size BYTES  ckpt chunk size (default 4M)
  --raw-qd N          raw reference queue depth (default 8)
  --raw-piece BYTES   raw reference piece size (default 4M)
  --json FILE         every figure as JSON
  --plot FILE.svg     timeline of sync and async saves, and the ratio bars
  --markdown FILE     the result tables as markdown
  --layout FILE       the tensor layout as JSON (the peers script rebuilds it)
  --render FILE.json  do not run: print the table of a saved --json file (and write
                      --plot / --markdown from it)
  --keep              keep the checkpoints
  --quick             small and short (32M, 2 repeats, 2 saves, every 8 steps of 10 ms,
                      soak 10, no load settling): a smoke run in seconds; later options
                      override it
  --help              this text

Targets are printed as PASS/FAIL; they do not change the exit code (0 unless an error).
)";

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "ckpt-bench: " << msg << "\nrun 'ckpt-bench --help' for usage\n";
  std::exit(2);
}

std::uint64_t parse_bytes(const std::string& s) {
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    usage("not a size: " + s);
  }
  std::string unit = s.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double mult = 1;
  if (unit == "" || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else usage("unknown size unit in " + s);
  if (!(v > 0)) usage("size must be positive: " + s);
  return static_cast<std::uint64_t>(v * mult);
}

struct Cli {
  Options o;
  std::string render;
};

Cli parse(int argc, char** argv) {
  Cli c;
  Options& o = c.o;
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--quick") {
      o.quick = true;
      o.size = 32ull << 20;
      o.repeats = 2;
      o.saves = 2;
      o.every = 8;
      o.step_ms = 10;
      o.compute_mb = 2;
      o.soak_saves = 10;
      o.load_settle_ms = 0;
    }
  auto need = [&](int& i) -> std::string {
    if (i + 1 >= argc) usage(std::string(argv[i]) + " needs a value");
    return argv[++i];
  };
  auto need_int = [&](int& i, int lo) {
    const std::string s = need(i);
    try {
      const int v = std::stoi(s);
      if (v < lo) usage(std::string(argv[i - 1]) + " must be >= " + std::to_string(lo));
      return v;
    } catch (const std::logic_error&) {
      usage("not a number: " + s);
    }
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kHelp;
      std::exit(0);
    } else if (a == "--quick") {
    } else if (a == "--dir") o.dir = need(i);
    else if (a == "--size") o.size = parse_bytes(need(i));
    else if (a == "--ranks") o.ranks = need_int(i, 1);
    else if (a == "--repeats") o.repeats = need_int(i, 1);
    else if (a == "--saves") o.saves = need_int(i, 1);
    else if (a == "--every") o.every = need_int(i, 1);
    else if (a == "--step-ms") o.step_ms = std::atof(need(i).c_str());
    else if (a == "--compute-mb") o.compute_mb = std::atof(need(i).c_str());
    else if (a == "--modes") {
      o.modes.clear();
      std::stringstream ss(need(i));
      for (std::string m; std::getline(ss, m, ',');) {
        if (std::find(kAllModes.begin(), kAllModes.end(), m) == kAllModes.end()) usage("unknown mode " + m);
        o.modes.push_back(m);
      }
      if (o.modes.empty()) usage("--modes is empty");
    } else if (a == "--no-load") o.loads = false;
    else if (a == "--no-cold-pool") o.cold_pool = false;
    else if (a == "--soak") o.soak_saves = need_int(i, 0);
    else if (a == "--load-settle-ms") o.load_settle_ms = need_int(i, 0);
    else if (a == "--queue-depth") o.queue_depth = need_int(i, 1);
    else if (a == "--chunk-size") o.chunk_size = parse_bytes(need(i));
    else if (a == "--raw-qd") o.raw_queue_depth = need_int(i, 1);
    else if (a == "--raw-piece") o.raw_piece = parse_bytes(need(i));
    else if (a == "--json") o.json_path = need(i);
    else if (a == "--plot") o.plot_path = need(i);
    else if (a == "--markdown") o.markdown_path = need(i);
    else if (a == "--layout") o.layout_path = need(i);
    else if (a == "--render") c.render = need(i);
    else if (a == "--keep") o.keep = true;
    else usage("unknown option " + a);
  }
  if (o.raw_piece % 4096) usage("--raw-piece must be a multiple of 4096");
  if (o.step_ms < 0) usage("--step-ms must be >= 0");
  return c;
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  const Cli cli = parse(argc, argv);
  try {
    json::object res;
    if (!cli.render.empty()) {
      std::ifstream in(cli.render);
      std::stringstream ss;
      ss << in.rdbuf();
      if (!in) throw std::runtime_error("cannot read " + cli.render);
      res = json::parse(ss.str()).as_object();
    } else {
      res = Runner(cli.o).run();
      if (!cli.o.json_path.empty()) write_file(cli.o.json_path, pretty_json(res));
    }
    std::cout << render_table(res) << std::flush;
    if (!cli.o.plot_path.empty()) write_file(cli.o.plot_path, render_svg(res));
    if (!cli.o.markdown_path.empty()) write_file(cli.o.markdown_path, render_markdown(res));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
