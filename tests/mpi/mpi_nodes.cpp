// SPDX-License-Identifier: Apache-2.0
// Checkpoints across node-local roots with redundancy, one rank per MPI process (run under
// mpirun by tests/mpi/nodes_lost.sh).
//   mpi-nodes train ROOT NODES SCHEME STEPS OUT [resume] [durable=DIR]
//     trains the mini GPT to step STEPS, saving every 5 steps into node roots ROOT/node-n
//     (ranks split evenly over NODES nodes, redundancy SCHEME), resuming first from ROOT when
//     `resume` is given. Rank 0 writes OUT: per step trained "step loss grad_norm param_norm"
//     (bit patterns in hex) and a last line "params" with every rank's final parameters' XXH3,
//     and prints what its Checkpointer rebuilt at construction. With durable=DIR every
//     checkpoint is also copied to the durable tier DIR (from rank 0's process, reading the
//     node roots through the coordinator), and the run waits for the copies before it ends.
// Every process touches only its own node's root: the others are reached through the MPI
// coordinator (tests/mpi/confine.sh makes that a fact by hiding them from the process).
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/mpi/mpi_comm.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/hash/xxh3.hpp"
#include "ckpt/train/trainer.hpp"
#include "mpi/small_config.hpp"

using namespace ckpt;
using namespace ckpt::train;

namespace {

TrainConfig config() { return test::small_mpi_config(40); }

template <typename T>
std::uint64_t bits(T v) {
  std::uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}

int run_training(dist::MpiSession& mpi, const std::string& root, int nodes, const std::string& scheme_text, std::uint64_t steps,
          const std::string& out_path, bool resume, const std::string& durable) {
  const auto scheme = parse_redundancy(scheme_text);
  if (!scheme) throw Error(Errc::invalid_argument, {}, "redundancy scheme", "none, replicate:F or rs:K+M", scheme_text);
  const int world = mpi.size();
  if (nodes < 1 || world % nodes != 0) throw Error(Errc::invalid_argument, {}, "nodes", "a divisor of " + std::to_string(world), std::to_string(nodes));
  auto coord = dist::make_mpi_coordinator();
  std::string out;
  {
    CheckpointerOptions options{.root = root, .world_size = world, .keep_last = 3, .coordinator = coord.get(),
                                .nodes = NodeOptions{.ranks_per_node = world / nodes, .redundancy = *scheme}};
    if (!durable.empty()) options.durable = DurableTierOptions{.root = durable};
    Checkpointer ck(std::move(options));
    for (const auto& rep : ck.repairs())
      for (const auto& line : rep.lines) std::printf("%s: %s\n", rep.name.c_str(), line.c_str());
    Trainer t(config(), mpi.world());
    std::uint64_t start = 0;
    if (resume) {
      start = t.resume_latest(ck, Verify::full);
      std::printf("resumed from step %" PRIu64 "\n", start);
    }
    SaveHandle last;
    for (std::uint64_t s = start + 1; s <= steps; ++s) {
      const StepStats st = t.step();
      char line[128];
      std::snprintf(line, sizeof line, "%" PRIu64 " %08" PRIx64 " %016" PRIx64 " %016" PRIx64 "\n", s, bits(st.loss), bits(st.grad_norm), bits(st.param_norm));
      out += line;
      if (s % 5 == 0) last = start_save(ck, t);
    }
    if (last.valid()) last.wait();
    ck.wait_all();
    ck.wait_durable();
    if (!durable.empty() && mpi.rank() == 0) {
      const DurableStats d = ck.stats().durable;
      std::printf("durable tier: %llu copies, %llu failed attempts%s%s\n", static_cast<unsigned long long>(d.copies),
                  static_cast<unsigned long long>(d.failures), d.last_error.empty() ? "" : ", last error: ", d.last_error.c_str());
    }
    const std::vector<float> p = t.parameters();
    const std::uint64_t h = xxh3_64(p.data(), p.size() * sizeof(float));
    const auto all = mpi.world().all_gather_bytes(std::as_bytes(std::span(&h, 1)));
    out += "params";
    for (const auto& b : all) {
      std::uint64_t x = 0;
      std::memcpy(&x, b.data(), 8);
      char hex[24];
      std::snprintf(hex, sizeof hex, " %016" PRIx64, x);
      out += hex;
    }
    out += "\n";
  }
  if (mpi.rank() == 0) {
    std::FILE* f = std::fopen(out_path.c_str(), "w");
    if (!f || std::fwrite(out.data(), 1, out.size(), f) != out.size() || std::fclose(f) != 0)
      throw Error(Errc::io_error, out_path, "cannot write the result");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    dist::MpiSession mpi(&argc, &argv);
    const std::string mode = argc > 1 ? argv[1] : "";
    bool resume = false;
    std::string durable;
    for (int i = 7; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "resume") resume = true;
      else if (a.starts_with("durable=")) durable = a.substr(8);
      else argc = 0;  // usage
    }
    if (mode == "train" && argc >= 7)
      return run_training(mpi, argv[2], std::stoi(argv[3]), argv[4], std::stoull(argv[5]), argv[6], resume, durable);
    std::fprintf(stderr, "usage: mpi-nodes train ROOT NODES SCHEME STEPS OUT [resume] [durable=DIR]\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILED: %s\n", e.what());
    return 1;
  }
}
