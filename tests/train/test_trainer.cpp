// DDP + ZeRO-1 over the thread backend, and exact resume through the async checkpointer.
#include <doctest/doctest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/io/layout.hpp"
#include "ckpt/io/reshard.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/train/trainer.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::train;

namespace {

TrainConfig small_config(int batch_per_rank) {
  TrainConfig c;
  c.model = GptConfig{.vocab = 32, .seq = 8, .dim = 16, .heads = 2, .layers = 1, .batch = batch_per_rank};
  c.corpus_tokens = 8192;
  c.token_noise = 0.0f;  // the per-rank noise streams would differ between world sizes
  c.total_steps = 10;
  return c;
}

struct Outcome {
  std::vector<float> losses;
  std::vector<float> params;                     // rank 0, fp32 upcast of the 16-bit parameters
  std::vector<std::vector<std::uint16_t>> p16;   // every rank
};

// Trains `steps` steps at world size `world`; optionally saves at `save_at` and/or resumes.
Outcome run_training(const TrainConfig& cfg, int world, std::uint64_t steps, const std::string& root = {},
              std::uint64_t save_at = 0, bool resume = false, Reshard reshard = Reshard::no) {
  Outcome out;
  out.p16.resize(static_cast<std::size_t>(world));
  std::mutex mu;
  std::optional<Checkpointer> ckpt;
  if (save_at) ckpt.emplace(CheckpointerOptions{.root = root, .world_size = world});
  dist::run_ranks(world, [&](dist::Communicator& comm) {
    Trainer t(cfg, comm);
    std::uint64_t start = resume ? t.resume_latest(root, Verify::full, reshard) : 0;
    std::vector<SaveHandle> handles;
    for (std::uint64_t s = start + 1; s <= steps; ++s) {
      const auto st = t.step();
      if (comm.rank() == 0) out.losses.push_back(st.loss);
      if (ckpt && s == save_at) handles.push_back(save_checkpoint(*ckpt, t));
    }
    for (auto& h : handles) h.wait();
    std::lock_guard lk(mu);
    if (comm.rank() == 0) out.params = t.parameters();
    const auto p = t.optimizer().params16();
    out.p16[static_cast<std::size_t>(comm.rank())].assign(p.begin(), p.end());
  });
  return out;
}

// What every rank holds right after a resume: its optimizer tensors and per-rank metadata.
struct Restored {
  std::vector<std::map<std::string, std::vector<std::byte>>> tensors;
  std::vector<boost::json::object> metadata;
  std::vector<dist::ShardRange> ranges;
};

Restored resume_only(const TrainConfig& cfg, int world, const std::string& root, Reshard reshard) {
  Restored out;
  out.tensors.resize(static_cast<std::size_t>(world));
  out.metadata.resize(static_cast<std::size_t>(world));
  out.ranges.resize(static_cast<std::size_t>(world));
  std::mutex mu;
  dist::run_ranks(world, [&](dist::Communicator& comm) {
    Trainer t(cfg, comm);
    t.resume_latest(root, Verify::full, reshard);
    std::lock_guard lk(mu);
    const auto r = static_cast<std::size_t>(comm.rank());
    for (const auto& v : t.checkpoint_tensors())
      if (v.name.starts_with("optim.")) out.tensors[r][v.name].assign(v.data.begin(), v.data.end());
    out.metadata[r] = t.checkpoint_info().metadata;
    out.ranges[r] = t.optimizer().shard();
  });
  return out;
}

std::vector<std::byte> concat(const std::vector<std::map<std::string, std::vector<std::byte>>>& per_rank, const std::string& name) {
  std::vector<std::byte> out;
  for (const auto& m : per_rank) out.insert(out.end(), m.at(name).begin(), m.at(name).end());
  return out;
}

}  // namespace

TEST_CASE("every rank holds identical parameters after each ZeRO-1 step") {
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    const auto o = run_training(small_config(2), world, 4);
    for (int r = 1; r < world; ++r) CHECK(o.p16[static_cast<std::size_t>(r)] == o.p16[0]);
  }
}

TEST_CASE("ZeRO-1 at N ranks tracks a single-rank Adam run on the same global batch") {
  // Not bit-exact, and cannot be: at N ranks every rank rounds its own gradient to 16 bits
  // before the reduction (fp32 sum, rounded once), while the single rank rounds the gradient
  // of the whole batch once; the per-sample sums are also added in a different order. The
  // difference is a few 16-bit ulps of gradient per step, which Adam turns into parameter
  // differences far below one learning-rate step (1e-2) after 5 steps. Tolerance: max
  // |difference| < 2e-3 on parameters and < 1e-3 relative on every loss.
  const int global = 8;
  const auto reference = run_training(small_config(global), 1, 5);
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    const auto o = run_training(small_config(global / world), world, 5);
    REQUIRE(o.params.size() == reference.params.size());
    double max_diff = 0;
    for (std::size_t i = 0; i < o.params.size(); ++i) max_diff = std::max(max_diff, std::abs(double(o.params[i]) - reference.params[i]));
    MESSAGE("world " << world << ": max |param difference| after 5 steps = " << max_diff);
    CHECK(max_diff < 2e-3);
    for (std::size_t s = 0; s < o.losses.size(); ++s) CHECK(std::abs(o.losses[s] - reference.losses[s]) <= 1e-3 * reference.losses[s]);
    if (world == 1) CHECK(max_diff == 0);  // the same computation: bit for bit
  }
}

TEST_CASE("optimizer state per rank is 12 P / N bytes") {
  const auto cfg = small_config(2);
  for (int world : {1, 2, 3, 4}) {
    dist::run_ranks(world, [&](dist::Communicator& comm) {
      Trainer t(cfg, comm);
      const auto m = t.memory();
      const std::uint64_t padded = (num_params(cfg.model) + world - 1) / world * world;
      CHECK(m.optimizer == 12 * padded / static_cast<std::uint64_t>(world));
      CHECK(m.optimizer == m.expected_optimizer);
    });
  }
}

TEST_CASE("a resumed run continues bit for bit for N = 1, 2, 4") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    auto cfg = small_config(2);
    cfg.token_noise = 0.05f;  // exercises the per-rank RNG state in the checkpoint
    test::TempDir dir;
    const auto full = run_training(cfg, world, 8, dir.path().string(), /*save_at=*/4);
    const auto resumed = run_training(cfg, world, 8, dir.path().string(), 0, /*resume=*/true);
    REQUIRE(resumed.losses.size() == 4);
    for (std::size_t i = 0; i < 4; ++i) CHECK(std::memcmp(&resumed.losses[i], &full.losses[4 + i], sizeof(float)) == 0);
    CHECK(resumed.p16 == full.p16);
  }
}

TEST_CASE("the LR schedule warms up linearly then decays by cosine to its floor") {
  const LrSchedule s{.base_lr = 1.0f, .warmup_steps = 4, .total_steps = 14, .min_ratio = 0.1f};
  CHECK(s.at(1) == doctest::Approx(0.25));
  CHECK(s.at(4) == doctest::Approx(1.0));
  CHECK(s.at(9) == doctest::Approx(0.55));
  CHECK(s.at(14) == doctest::Approx(0.1));
  CHECK(s.at(100) == doctest::Approx(0.1));
}

TEST_CASE("dynamic loss scaling halves on overflow and grows after good steps") {
  LossScaler sc{.scale = 1024, .good_steps = 0, .growth_interval = 2};
  sc.update(true);
  CHECK(sc.scale == 512);
  sc.update(false);
  CHECK(sc.scale == 512);
  sc.update(false);
  CHECK(sc.scale == 1024);
}

TEST_CASE("a resume with another configuration is refused naming the difference") {
  test::TempDir dir;
  auto cfg = small_config(2);
  run_training(cfg, 2, 2, dir.path().string(), 2);
  cfg.adam.lr = 0.5f;
  try {
    run_training(cfg, 2, 4, dir.path().string(), 0, true);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.detail() == "training configuration differs");
  }
}

TEST_CASE("a resume at another world size fails on every rank with the world-size error, without hanging") {
  test::TempDir dir;
  const auto cfg = small_config(2);
  run_training(cfg, 2, 2, dir.path().string(), 2);
  try {
    run_training(cfg, 3, 4, dir.path().string(), 0, true);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::world_size_mismatch);
    CHECK(e.expected() == "3");
    CHECK(e.actual() == "2");
  }
}

TEST_CASE("training continues after a load-time reshard: the loss 10 steps on is below the loss at the resume point") {
  auto cfg = small_config(2);
  cfg.total_steps = 20;
  cfg.token_noise = 0.05f;  // the RNG remap is exercised too
  test::TempDir dir;
  const auto first = run_training(cfg, 4, 10, dir.path().string(), /*save_at=*/10);
  const float at_resume = first.losses.back();
  for (int world : {8, 3, 1}) {
    CAPTURE(world);
    test::TempDir copy;
    std::filesystem::copy(dir.path(), copy.path(), std::filesystem::copy_options::recursive);
    const auto after = run_training(cfg, world, 20, copy.path().string(), 0, /*resume=*/true, Reshard::allow);
    REQUIRE(after.losses.size() == 10);
    MESSAGE("world " << world << ": loss " << at_resume << " at step 10, " << after.losses.back() << " at step 20");
    CHECK(after.losses.back() < at_resume);
    for (int r = 1; r < world; ++r) CHECK(after.p16[static_cast<std::size_t>(r)] == after.p16[0]);
  }
}

TEST_CASE("a resharded resume gives every rank its slice of the source's flat optimizer state") {
  const auto cfg = small_config(2);
  const std::uint64_t P = num_params(cfg.model);
  for (auto [n, m] : {std::pair{4, 8}, std::pair{4, 3}, std::pair{3, 2}, std::pair{1, 4}, std::pair{2, 1}}) {
    CAPTURE(n);
    CAPTURE(m);
    test::TempDir dir;
    run_training(cfg, n, 3, dir.path().string(), 3);
    const auto source = resume_only(cfg, n, dir.path().string(), Reshard::no);
    const auto resharded = resume_only(cfg, m, dir.path().string(), Reshard::allow);
    for (int r = 0; r < m; ++r) CHECK(resharded.ranges[static_cast<std::size_t>(r)] == flat_slice(P, m, r));
    for (const char* name : {"optim.master", "optim.m", "optim.v"}) {
      const auto a = concat(source.tensors, name), b = concat(resharded.tensors, name);
      REQUIRE(b.size() == padded_numel(P, m) * 4);
      CHECK(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(P * 4), b.begin()));
      CHECK(std::all_of(b.begin() + static_cast<std::ptrdiff_t>(P * 4), b.end(), [](std::byte x) { return x == std::byte{0}; }));
    }
  }
}

TEST_CASE("after a reshard rank r continues source rank r's RNG stream and new ranks start the derived one") {
  auto cfg = small_config(2);
  cfg.token_noise = 0.05f;
  test::TempDir dir;
  run_training(cfg, 2, 3, dir.path().string(), 3);
  const auto source = resume_only(cfg, 2, dir.path().string(), Reshard::no);
  const auto r4 = resume_only(cfg, 4, dir.path().string(), Reshard::allow);
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    const auto& meta = r4.metadata[static_cast<std::size_t>(r)];
    CHECK(meta.at("data_position") == source.metadata[0].at("data_position"));
    if (r < 2) {
      CHECK(meta.at("rng") == source.metadata[static_cast<std::size_t>(r)].at("rng"));
    } else {
      const auto s = Rng(rank_rng_seed(cfg.seed, r, 3)).state();
      CHECK(meta.at("rng") == boost::json::value(boost::json::array{s[0], s[1], s[2], s[3]}));
    }
  }
  CHECK(r4.metadata[2].at("rng") != r4.metadata[3].at("rng"));
}

TEST_CASE("a load-time reshard and an offline reshard followed by a plain resume train identically, bit for bit") {
  auto cfg = small_config(2);
  cfg.token_noise = 0.05f;  // new ranks draw from their derived RNG streams in both paths
  test::TempDir src, offline, live;
  run_training(cfg, 3, 4, src.path().string(), 4);
  std::filesystem::copy(src.path(), live.path(), std::filesystem::copy_options::recursive);
  const auto reader = CheckpointReader::open(posix_file_system(), (src.path() / checkpoint_dir_name(4)).string());
  reshard_checkpoint(posix_file_system(), reader, offline.path().string(), {.world_size = 5});
  const auto a = run_training(cfg, 5, 9, live.path().string(), 0, true, Reshard::allow);
  const auto b = run_training(cfg, 5, 9, offline.path().string(), 0, true, Reshard::no);
  REQUIRE(a.losses.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) CHECK(std::memcmp(&a.losses[i], &b.losses[i], sizeof(float)) == 0);
  CHECK(a.p16 == b.p16);
}
