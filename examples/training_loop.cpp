// SPDX-License-Identifier: Apache-2.0
// The minimal training loop of the README: 4 rank threads save every N steps without
// stopping, keep the last 3 checkpoints, then resume from the latest one.
//   ckpt-training-loop [--dir DIR] [--steps STEPS] [--every EVERY]   (defaults: a fresh /tmp dir, 100, 1)
//   ckpt-training-loop [DIR] [STEPS] [EVERY]                          (the same, positionally)
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/ckpt.hpp"  // the whole public API, as a user includes it
#include "cli.hpp"

namespace {
int program_main(int argc, char** argv) {
  std::string dir;
  std::uint64_t steps = 100, every = 1;
  CLI::App app("ckpt-training-loop: 4 rank threads save asynchronously every EVERY steps without\n"
               "stopping, keep the last 3 checkpoints, then resume from the latest one",
               "ckpt-training-loop");
  ckpt::cli::setup(app);
  app.add_option("DIR,--dir", dir, "checkpoint root (default: a fresh directory under /tmp, removed at\nthe end)")->type_name("DIR");
  ckpt::cli::add_int_option(app, "STEPS,--steps", steps, std::uint64_t{1}, std::uint64_t{1} << 40, "STEPS", "training steps (default 100)");
  ckpt::cli::add_int_option(app, "EVERY,--every", every, std::uint64_t{1}, std::uint64_t{1} << 40, "EVERY", "a save every EVERY steps (default 1)");
  app.footer("CKPT_WRITER=posix in the environment picks the pwrite writer instead of io_uring.");
  if (const auto rc = ckpt::cli::parse(app, argc, argv)) return *rc;
  const bool temporary = dir.empty();
  const std::string root = temporary ? "/tmp/ckpt-training-loop-" + std::to_string(::getpid()) : dir;
  const int world = 4;
  const std::size_t n = 1 << 18;  // floats per rank
  std::vector<std::vector<float>> final_state(world);
  std::vector<int> commits(world, 0), failures(world, 0);
  std::vector<double> stall_ms(world, 0.0);

  // --- the README's example starts here ---
  ckpt::Checkpointer checkpointer({.root = root, .world_size = world, .keep_last = 3});
  auto rank_main = [&](int rank) {
    std::vector<float> weights(n, 0.0f);
    auto cadence = ckpt::SaveCadence::every_steps(every);
    std::vector<ckpt::SaveHandle> pending;
    for (std::uint64_t step = 1; step <= steps; ++step) {
      for (auto& w : weights) w = w * 0.999f + 0.001f * static_cast<float>(step + rank);  // "training"
      if (!cadence.due(step)) continue;
      ckpt::SaveInfo info;
      info.param_shard_offset = rank * n;
      info.param_shard_numel = n;
      info.param_numel = world * n;
      info.metadata.set("step", step);
      // What the tensor is of the job's state: rank's slice of the global "weights" (so ckpt
      // reshard and consolidate know where it goes; replicated() and rank_local() say the rest).
      const auto slice = ckpt::slice_of("weights", {world * n}, {rank * n}, {n});
      std::vector<ckpt::TensorView> state{ckpt::tensor("weights", weights, {n}, slice)};  // F32, from the element type
      pending.push_back(checkpointer.save(rank, step, state, info));  // returns once staged
    }
    for (auto& h : pending) {  // every save reports its commit, or rethrows its error
      try {
        stall_ms[rank] += h.wait().stall.count() / 1e6;
        ++commits[rank];
      } catch (const ckpt::Error& e) {
        std::fprintf(stderr, "rank %d: step %llu failed: %s\n", rank, (unsigned long long)h.step(), e.what());
        ++failures[rank];
      }
    }
    final_state[rank] = weights;
  };
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(rank_main, r);
  for (auto& t : ranks) t.join();

  // Resume: the latest checkpoint, verified, at the same world size.
  auto latest = ckpt::open_latest(root, {.expected_world_size = world});
  std::vector<float> resumed(n);
  const auto shard = latest.reader.load_shard(/*rank=*/0);
  std::memcpy(resumed.data(), shard.tensor("weights").data.data(), n * sizeof(float));
  // Or straight into memory you own, without a shard buffer (ckpt/read/load_into.hpp).
  std::vector<float> owned(n);
  const ckpt::LoadTarget into[] = {ckpt::load_target("weights", owned)};
  ckpt::load_into(latest.reader, /*rank=*/0, into, ckpt::Verify::fast);
  // --- the README's example ends here ---

  const bool exact = (std::memcmp(resumed.data(), final_state[0].data(), n * sizeof(float)) == 0 || steps % every != 0) && owned == resumed;
  std::printf("%s: %d ranks, %llu steps, saved every %llu: %d commits per rank, %d failures, mean stall %.3f ms per save\n",
              checkpointer.backend_name().data(), world, (unsigned long long)steps, (unsigned long long)every, commits[0],
              failures[0], stall_ms[0] / std::max(1, commits[0]));
  std::printf("latest: %s; resumed weights %s the final state\n", latest.name.c_str(), exact ? "equal" : "DIFFER from");
  const bool ok = failures[0] == 0 && commits[0] == static_cast<int>(steps / every) && exact;
  checkpointer.wait_all();  // the rotation after the last commit runs in the background
  if (temporary) std::filesystem::remove_all(root);
  return ok ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  return ckpt::cli::guarded_main("ckpt-training-loop", [&] { return program_main(argc, argv); });
}
