// SPDX-License-Identifier: Apache-2.0
// A synchronous save and verified load of a 4-rank sharded checkpoint, then the three
// failure modes the loader defends against, each on a damaged copy.
//   ckpt-quickstart [--dir] DIR     (default: a fresh directory under /tmp, removed at the end)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/ckpt.hpp"  // the whole public API, as a user includes it
#include "cli.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
int program_main(int argc, char** argv) {
  std::string dir;
  CLI::App app("ckpt-quickstart: a synchronous save and verified load of a 4-rank sharded checkpoint,\n"
               "then the loader refusing a resume at another world size, a missing shard, a\n"
               "truncated shard and a flipped bit, each on a damaged copy",
               "ckpt-quickstart");
  ckpt::cli::setup(app);
  app.add_option("DIR,--dir", dir, "where the checkpoint goes (default: a fresh directory under /tmp,\nremoved at the end)")
      ->type_name("DIR");
  if (const auto rc = ckpt::cli::parse(app, argc, argv)) return *rc;
  const bool temporary = dir.empty();
  const fs::path root = temporary ? fs::temp_directory_path() / ("ckpt-quickstart-" + std::to_string(::getpid())) : fs::path(dir);
  const int world = 4;
  const std::uint64_t numel = 1 << 16;  // per rank

  // Each rank's state: a slice of fp32 master weights and Adam moments, plus a step counter.
  // Every tensor says what it is of the job's state (ckpt/format/sharding.hpp): the slices
  // are boxes of global tensors, the step counter is the same on every rank (replicated:
  // written once). So `ckpt reshard` and `ckpt consolidate` know where each one goes.
  std::vector<std::vector<float>> master(world), m(world), v(world);
  std::vector<std::int64_t> step_counter(world, 10);
  std::vector<int> every_rank(world);
  for (int r = 0; r < world; ++r) every_rank[r] = r;
  SaveRequest req;
  req.step = 10;
  req.wall_clock_seconds = 42.0;
  req.param_numel = numel * world;
  req.training.set("lr_schedule", JsonObject().set("kind", "cosine").set("base_lr", 3e-4));  // free-form JSON
  for (int r = 0; r < world; ++r) {
    for (auto* vec : {&master[r], &m[r], &v[r]}) vec->resize(numel);
    for (std::uint64_t i = 0; i < numel; ++i) master[r][i] = static_cast<float>(r * numel + i) * 1e-6f;
    RankState rs;
    const auto slice = [&](const char* name) { return slice_of(name, {numel * world}, {numel * r}, {numel}); };
    // ckpt::tensor infers the dtype from the element type (F32 here, I64 for the counter).
    rs.tensors = {tensor("master", master[r], {numel}, slice("master")), tensor("adam.m", m[r], {numel}, slice("adam.m")),
                  tensor("adam.v", v[r], {numel}, slice("adam.v")),
                  tensor("step", std::span<const std::int64_t>(&step_counter[r], 1), {1}, replicated(every_rank))};
    rs.param_shard_offset = numel * r;
    rs.param_shard_numel = numel;
    rs.metadata.set("data_position", 10 * 4 + r);
    req.ranks.push_back(std::move(rs));
  }

  std::printf("== saving a %d-rank checkpoint of step 10 under %s\n", world, root.c_str());
  const Manifest saved = save_checkpoint_sync(root.string(), req);
  for (const auto& s : saved.shards)
    std::printf("   rank %d  %-34s %8llu bytes  sha256 %.16s...\n", s.rank, s.path.c_str(),
                static_cast<unsigned long long>(s.size), s.sha256.c_str());

  std::printf("== loading it back (latest, world size 4, full verification)\n");
  auto opened = open_latest(root.string(), {.expected_world_size = world});
  opened.reader.verify(Verify::full);
  bool equal = true;
  for (int r = 0; r < world; ++r) {
    const LoadedShard shard = opened.reader.load_shard(r);
    const auto& t = shard.tensor("master");
    equal &= t.data.size() == master[r].size() * 4 && std::memcmp(t.data.data(), master[r].data(), t.data.size()) == 0;
  }
  std::printf("   %s: every rank's tensors are byte-equal to what was saved\n", equal ? "OK" : "FAILED");

  auto expect_refusal = [&](const char* what, auto&& damage) {
    const fs::path copy = root.string() + "-damaged";
    fs::remove_all(copy);
    fs::copy(root, copy, fs::copy_options::recursive);
    damage(copy / "step-0000000010");
    try {
      auto o = open_latest(copy.string(), {.expected_world_size = world});
      for (int r = 0; r < world; ++r) o.reader.load_shard(r);
      std::printf("   %-28s NOT refused\n", what);
      equal = false;
    } catch (const Error& e) {
      std::printf("   %-28s refused: %s\n", what, e.what());
    }
    fs::remove_all(copy);
  };
  std::printf("== the loader refuses bad checkpoints (on damaged copies)\n");
  {
    try {
      open_latest(root.string(), {.expected_world_size = 8});
      equal = false;
    } catch (const Error& e) {
      std::printf("   %-28s refused: %s\n", "resume at world size 8:", e.what());
    }
  }
  expect_refusal("missing shard:", [&](const fs::path& d) { fs::remove(d / saved.shards[2].path); });
  expect_refusal("truncated shard:", [&](const fs::path& d) { fs::resize_file(d / saved.shards[1].path, saved.shards[1].size / 2); });
  expect_refusal("flipped bit in a shard:", [&](const fs::path& d) {
    std::FILE* f = std::fopen((d / saved.shards[3].path).c_str(), "r+b");
    std::fseek(f, 10000, SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, 10000, SEEK_SET);
    std::fputc(c ^ 1, f);
    std::fclose(f);
  });
  if (temporary) fs::remove_all(root);
  std::printf("%s\n", equal ? "quickstart verified" : "quickstart FAILED");
  return equal ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  return ckpt::cli::guarded_main("ckpt-quickstart", [&] { return program_main(argc, argv); });
}
