// SPDX-License-Identifier: Apache-2.0
// DDP + ZeRO-1 over the thread backend, and exact resume through the async checkpointer.
#include <doctest/doctest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/ops/reshard.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/train/trainer.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::train;

namespace {

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

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
      if (ckpt && s == save_at) handles.push_back(start_save(*ckpt, t));
    }
    for (auto& h : handles) h.wait();
    std::lock_guard lk(mu);
    if (comm.rank() == 0) out.params = t.parameters();
    const auto p = t.optimizer().params16();
    out.p16[static_cast<std::size_t>(comm.rank())].assign(p.begin(), p.end());
  });
  return out;
}

// The manifest file of the checkpoint ROOT/latest names.
std::string latest_manifest(const std::string& root) { return open_latest(posix_file_system(), root).reader.manifest_path(); }

// A resume of the checkpoint under `root` (written at 2 ranks) with `cfg` is refused as a
// configuration difference naming its manifest file (of several roots or tiers, the one
// refused), at the same world size and through a load-time reshard to 3 ranks.
void check_resume_refused_for_config(const TrainConfig& cfg, const std::string& root) {
  for (const int world : {2, 3}) {
    CAPTURE(world);
    try {
      run_training(cfg, world, 4, root, 0, true, world == 2 ? Reshard::no : Reshard::allow);
      FAIL("no throw");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_argument);
      CHECK(e.detail() == "training configuration differs");
      CHECK(e.file() == latest_manifest(root));
      CHECK(std::string(e.what()).find(latest_manifest(root)) != std::string::npos);
    }
  }
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
    out.metadata[r] = json_of(t.checkpoint_info().metadata);
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
  check_resume_refused_for_config(cfg, dir.path().string());
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
    CHECK(e.file() == latest_manifest(dir.path().string()));
  }
}

TEST_CASE("restoring a loaded shard of a checkpoint of another world size is refused naming its manifest file") {
  test::TempDir dir;
  const auto cfg = small_config(2);
  run_training(cfg, 2, 2, dir.path().string(), 2);
  const auto opened = open_latest(posix_file_system(), dir.path().string());
  std::mutex mu;
  std::vector<Error> errors;
  dist::run_ranks(3, [&](dist::Communicator& comm) {
    Trainer t(cfg, comm);
    const LoadedShard shard = opened.reader.load_shard(std::min(comm.rank(), 1));
    try {
      t.restore(shard, opened.reader.manifest());
    } catch (const Error& e) {
      std::lock_guard lk(mu);
      errors.push_back(e);
    }
  });
  REQUIRE(errors.size() == 3);
  for (const Error& e : errors) {
    CHECK(e.code() == Errc::world_size_mismatch);
    CHECK(e.file() == (dir.path() / checkpoint_dir_name(2) / kManifestName).string());
    CHECK(e.expected() == "3");
    CHECK(e.actual() == "2");
  }
}

TEST_CASE("a resume whose manifest gives a rank another shard range is refused naming the manifest file and both ranges") {
  test::TempDir dir;
  const auto cfg = small_config(2);
  const auto saved = run_training(cfg, 2, 2, dir.path().string(), 2);
  // Ranks 0 and 1 hold equal halves: their ranges swapped still tile the flat space, so only
  // the trainer's check can tell.
  const auto manifest = dir.path() / checkpoint_dir_name(2) / kManifestName;
  const std::string original = read_text(manifest);
  auto m = boost::json::parse(original).as_object();
  auto& shards = m.at("shards").as_array();
  const auto offset0 = shards[0].at("param_shard_offset"), offset1 = shards[1].at("param_shard_offset");
  REQUIRE(shards[0].at("param_shard_numel") == shards[1].at("param_shard_numel"));
  shards[0].as_object()["param_shard_offset"] = offset1;
  shards[1].as_object()["param_shard_offset"] = offset0;
  write_text(manifest, boost::json::serialize(m));
  const std::string numel = boost::json::serialize(shards[0].at("param_shard_numel"));
  try {
    run_training(cfg, 2, 4, dir.path().string(), 0, true);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.file() == manifest.string());
    CHECK(e.detail().ends_with(" shard range"));
    CHECK(e.expected() == boost::json::serialize(offset0) + "+" + numel);
    CHECK(e.actual() == boost::json::serialize(offset1) + "+" + numel);
  }
  // Nothing was lost: with the manifest as written, the resume continues.
  write_text(manifest, original);
  const auto resumed = run_training(cfg, 2, 4, dir.path().string(), 0, true);
  CHECK(resumed.losses.size() == 2);
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

// ---- gradient accumulation ------------------------------------------------------------------

TEST_CASE("a Trainer accumulating k micro-batches matches one batch of k times the size, within float noise") {
  // Same sequences in the same order: micro-batch i of rank r holds the rows i*b.. of the big
  // batch (the loader's global order), and the token noise draws in the same order too. Not
  // bitwise, for the summation-order reason of the gpt-level test; the tolerances: gradient
  // 1e-5 relative plus 1e-6 of the largest element, loss 1e-6 relative, and gradient norm
  // 1e-3 relative (the optimizer rounds the summed gradient to fp16, where one ulp is 1e-3).
  auto acc_cfg = small_config(1);
  acc_cfg.accumulate = 4;
  acc_cfg.token_noise = 0.05f;
  auto big_cfg = small_config(4);
  big_cfg.token_noise = 0.05f;
  const int world = 2;
  struct Got {
    std::vector<std::vector<float>> grads = std::vector<std::vector<float>>(world);
    float loss = 0;
    double grad_norm = 0;
    boost::json::value position;
  };
  auto one_step = [&](const TrainConfig& cfg) {
    Got got;
    std::mutex mu;
    dist::run_ranks(world, [&](dist::Communicator& comm) {
      Trainer t(cfg, comm);
      const auto s = t.step();
      std::lock_guard lk(mu);
      auto& g = got.grads[static_cast<std::size_t>(comm.rank())];
      for (float x : t.local_gradient()) g.push_back(x / s.loss_scale);
      if (comm.rank() == 0) got.loss = s.loss, got.grad_norm = s.grad_norm, got.position = json_of(t.checkpoint_info().metadata).at("data_position");
    });
    return got;
  };
  const Got acc = one_step(acc_cfg), big = one_step(big_cfg);
  CHECK(acc.position == big.position);
  CHECK(std::abs(acc.loss - big.loss) <= 1e-6f * big.loss);
  CHECK(std::abs(acc.grad_norm - big.grad_norm) <= 1e-3 * big.grad_norm);
  for (int r = 0; r < world; ++r) {
    const auto& a = acc.grads[static_cast<std::size_t>(r)];
    const auto& b = big.grads[static_cast<std::size_t>(r)];
    REQUIRE(a.size() == b.size());
    float scale = 0.0f;
    for (float x : b) scale = std::max(scale, std::abs(x));
    REQUIRE(scale > 0.0f);
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(std::abs(a[i] - b[i]) <= 1e-5f * std::abs(b[i]) + 1e-6f * scale);
  }
}

TEST_CASE("a run accumulating 4 micro-batches, saved at step 5 and resumed, matches the uninterrupted run bit for bit") {
  auto cfg = small_config(1);
  cfg.accumulate = 4;
  cfg.token_noise = 0.05f;
  test::TempDir dir;
  const auto full = run_training(cfg, 2, 10, dir.path().string(), /*save_at=*/5);
  const auto resumed = run_training(cfg, 2, 10, dir.path().string(), 0, /*resume=*/true);
  REQUIRE(resumed.losses.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(bits(resumed.losses[i]) == bits(full.losses[5 + i]));
  }
  CHECK(resumed.p16 == full.p16);
  CHECK(full.losses.back() < full.losses.front());
}

TEST_CASE("a checkpoint without the accumulate key resumes as k = 1 and is refused for k = 2") {
  auto cfg = small_config(2);
  test::TempDir dir;
  const auto full = run_training(cfg, 2, 4, dir.path().string(), /*save_at=*/2);
  // Make it a checkpoint of before the key existed.
  const auto manifest = dir.path() / checkpoint_dir_name(2) / kManifestName;
  auto m = boost::json::parse(read_text(manifest)).as_object();
  REQUIRE(m.at("training").at("config").as_object().erase("accumulate") == 1);
  write_text(manifest, boost::json::serialize(m));
  const auto resumed = run_training(cfg, 2, 4, dir.path().string(), 0, /*resume=*/true);
  REQUIRE(resumed.losses.size() == 2);
  CHECK(bits(resumed.losses[1]) == bits(full.losses[3]));
  CHECK(resumed.p16 == full.p16);
  cfg.accumulate = 2;
  check_resume_refused_for_config(cfg, dir.path().string());
}

TEST_CASE("a checkpoint whose training state lacks a key is refused as malformed_manifest, on every rank") {
  auto cfg = small_config(2);
  test::TempDir dir;
  run_training(cfg, 2, 4, dir.path().string(), /*save_at=*/2);
  const auto manifest = dir.path() / checkpoint_dir_name(2) / kManifestName;
  auto m = boost::json::parse(read_text(manifest)).as_object();
  REQUIRE(m.at("training").as_object().erase("loss_scaler") == 1);
  write_text(manifest, boost::json::serialize(m));
  try {
    run_training(cfg, 2, 4, dir.path().string(), 0, /*resume=*/true);
    FAIL("no throw");
  } catch (const Error& e) {  // a ckpt::Error, not Boost.JSON's out_of_range
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.file() == manifest.string());
    CHECK(e.detail().find("loss_scaler") != std::string::npos);
  }
}

TEST_CASE("accumulate below 1 is refused naming the field") {
  auto cfg = small_config(2);
  cfg.accumulate = 0;
  try {
    dist::run_ranks(1, [&](dist::Communicator& comm) { Trainer t(cfg, comm); });
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.expected() == ">= 1");
    CHECK(e.actual() == "0");
  }
}

// ---- NaN guard and loss-spike rollback ------------------------------------------------------

namespace {

StepStats stats_of(std::uint64_t step, float loss, double grad_norm = 1.0, bool skipped = false, float scale = 1024.0f) {
  StepStats s;
  s.step = step;
  s.loss = loss;
  s.grad_norm = grad_norm;
  s.skipped = skipped;
  s.loss_scale = scale;
  return s;
}

}  // namespace

TEST_CASE("the spike guard trips on a loss above factor x the recent mean, only after min_history good steps") {
  SpikeGuard g({.factor = 2.0, .window = 3, .min_history = 2});
  CHECK(g.check(stats_of(1, 10.0f)) == Trip::none);
  CHECK(g.check(stats_of(2, 100.0f)) == Trip::none);  // one good step: no verdict yet
  CHECK(g.recent_mean() == doctest::Approx(55.0));
  CHECK(g.check(stats_of(3, 4.0f)) == Trip::none);
  CHECK(g.check(stats_of(4, 4.0f)) == Trip::none);   // window {100, 4, 4}: mean 36
  CHECK(g.check(stats_of(5, 4.0f)) == Trip::none);   // window {4, 4, 4}: mean 4
  CHECK(g.check(stats_of(6, 8.0f)) == Trip::none);   // exactly factor x mean is not above it
  CHECK(g.check(stats_of(7, 11.0f)) == Trip::loss_spike);  // {4, 4, 8}: mean 5.33, 11 > 10.67
  CHECK(g.history_size() == 6);                      // the tripped step is not history
}

TEST_CASE("the spike guard trips on a non-finite loss or gradient, but not on an fp16 overflow the scaler absorbs") {
  SpikeGuard g;
  CHECK(g.check(stats_of(1, std::numeric_limits<float>::quiet_NaN())) == Trip::non_finite_loss);
  CHECK(g.check(stats_of(1, std::numeric_limits<float>::infinity())) == Trip::non_finite_loss);
  const double inf = std::numeric_limits<double>::infinity();
  CHECK(g.check(stats_of(1, 3.0f, inf, /*skipped=*/true, /*scale=*/1024.0f)) == Trip::none);
  CHECK(g.check(stats_of(2, 3.0f, inf, /*skipped=*/true, /*scale=*/1.0f)) == Trip::non_finite_grad);
  CHECK(g.check(stats_of(2, 3.0f, std::numeric_limits<double>::quiet_NaN(), false)) == Trip::non_finite_grad);
  CHECK(std::string(trip_name(Trip::loss_spike)) == "loss spike");
}

TEST_CASE("rewinding the spike guard forgets the steps after the rollback point") {
  SpikeGuard g({.factor = 2.0, .window = 2, .min_history = 1});
  for (std::uint64_t s = 1; s <= 4; ++s) REQUIRE(g.check(stats_of(s, static_cast<float>(s))) == Trip::none);
  CHECK(g.recent_mean() == doctest::Approx(3.5));
  g.rewind_to(2);
  CHECK(g.history_size() == 2);
  CHECK(g.recent_mean() == doctest::Approx(1.5));
  CHECK(g.check(stats_of(3, 3.5f)) == Trip::loss_spike);  // judged against {1, 2}, not {3, 4}
}

TEST_CASE("a spike guard configuration out of range is refused naming the field") {
  const std::vector<std::pair<SpikeGuardConfig, std::string>> bad{{{.factor = 1.0}, "SpikeGuardConfig.factor"},
                                                                  {{.window = 0, .min_history = 0}, "SpikeGuardConfig.window"},
                                                                  {{.window = 2, .min_history = 3}, "SpikeGuardConfig.min_history"}};
  for (const auto& [c, field] : bad) {
    CAPTURE(field);
    try {
      SpikeGuard g(c);
      FAIL("no throw");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::invalid_argument);
      CHECK(e.detail() == field);
    }
  }
}

namespace {

struct GuardPlan {
  std::uint64_t spike_at = 0;  // set_lr_multiplier_once(spike_at, spike_x)
  float spike_x = 1000.0f;
  std::uint64_t skip_at = 0;   // skip_batch_of_step(skip_at) from the start (the no-spike twin)
  RollbackFrom from = RollbackFrom::memory_or_disk;
};

struct GuardOutcome {
  std::map<std::uint64_t, float> losses;                              // rank 0; a replayed step's last loss
  std::vector<std::vector<std::pair<std::uint64_t, Trip>>> trips;     // per rank
  std::vector<std::vector<RollbackResult>> rollbacks;                 // per rank
  std::vector<std::vector<std::uint16_t>> p16;                        // per rank, at the end
  std::vector<std::uint64_t> committed;                               // rank 0's committed saves
};

// The guarded loop of docs/training.md: step, ask the guard, roll back on a trip, else save
// every 5 steps; up to step 20 at 2 ranks.
GuardOutcome guarded_run(const TrainConfig& cfg, const std::string& root, const GuardPlan& plan) {
  const int world = 2;
  GuardOutcome out;
  out.trips.resize(world);
  out.rollbacks.resize(world);
  out.p16.resize(world);
  std::mutex mu;
  Checkpointer ckpt({.root = root, .world_size = world});
  dist::run_ranks(world, [&](dist::Communicator& comm) {
    const auto r = static_cast<std::size_t>(comm.rank());
    Trainer t(cfg, comm);
    SpikeGuard guard;
    if (plan.spike_at) t.set_lr_multiplier_once(plan.spike_at, plan.spike_x);
    if (plan.skip_at) t.skip_batch_of_step(plan.skip_at);
    std::vector<SaveHandle> handles;
    while (t.step_count() < 20) {
      const StepStats s = t.step();
      if (const Trip trip = guard.check(s); trip != Trip::none) {
        if (out.trips[r].size() >= 3) throw std::runtime_error("the guard keeps tripping");
        const RollbackResult back = t.rollback(ckpt, s.step, Verify::full, plan.from);
        guard.rewind_to(back.step);
        std::lock_guard lk(mu);
        out.trips[r].emplace_back(s.step, trip);
        out.rollbacks[r].push_back(back);
        continue;
      }
      if (comm.rank() == 0) {
        std::lock_guard lk(mu);
        out.losses[s.step] = s.loss;
      }
      if (s.step % 5 == 0) handles.push_back(start_save(ckpt, t));
    }
    for (auto& h : handles) {
      const auto& res = h.wait();
      if (comm.rank() == 0) {
        std::lock_guard lk(mu);
        out.committed.push_back(res.step);
      }
    }
    std::lock_guard lk(mu);
    const auto p = t.optimizer().params16();
    out.p16[r].assign(p.begin(), p.end());
  });
  return out;
}

TrainConfig guard_config() {
  auto cfg = small_config(2);
  cfg.total_steps = 20;
  cfg.token_noise = 0.05f;  // the replay must restore the RNG too
  return cfg;
}

// Run A (after its rollback) and run B (no spike, same batch skipped) agree bit for bit.
void check_same_run(const GuardOutcome& a, const GuardOutcome& b) {
  REQUIRE(a.losses.size() == 20);
  REQUIRE(b.losses.size() == 20);
  for (std::uint64_t s = 1; s <= 20; ++s) {
    CAPTURE(s);
    CHECK(bits(a.losses.at(s)) == bits(b.losses.at(s)));
  }
  CHECK(a.p16 == b.p16);
  CHECK(a.p16[0] == a.p16[1]);
}

}  // namespace

TEST_CASE("a forced loss spike rolls every rank back in memory, and the run then matches one that skipped the batch, bit for bit") {
  const auto cfg = guard_config();
  test::TempDir da, db;
  const auto a = guarded_run(cfg, da.path().string(), {.spike_at = 12});
  // The spike: every rank's guard tripped at the same step, without a collective of its own.
  REQUIRE(a.trips[0].size() == 1);
  CHECK(a.trips[0] == a.trips[1]);
  const std::uint64_t tripped = a.trips[0][0].first;
  MESSAGE("LR x1000 at step 12 tripped the guard at step " << tripped << " (" << std::string(trip_name(a.trips[0][0].second)) << ")");
  CHECK((tripped == 12 || tripped == 13));
  for (const auto& rb : a.rollbacks) {
    REQUIRE(rb.size() == 1);
    CHECK(rb[0].step == 10);
    CHECK(rb[0].from_memory);
    CHECK(rb[0].skipped_step == tripped);
  }
  // Replayed steps 11.. saved again where due: 15 and 20 commit (10 was the rollback point).
  CHECK(a.committed == std::vector<std::uint64_t>{5, 10, 15, 20});
  const auto b = guarded_run(cfg, db.path().string(), {.skip_at = tripped});
  CHECK(b.trips[0].empty());
  check_same_run(a, b);
  CHECK(a.losses.at(20) < a.losses.at(1));
}

TEST_CASE("a rollback read back from disk gives the same run as the in-memory one") {
  const auto cfg = guard_config();
  test::TempDir dm, dd;
  const auto mem = guarded_run(cfg, dm.path().string(), {.spike_at = 12});
  const auto disk = guarded_run(cfg, dd.path().string(), {.spike_at = 12, .from = RollbackFrom::disk});
  REQUIRE(disk.rollbacks[0].size() == 1);
  CHECK(disk.rollbacks[0][0].step == 10);
  CHECK_FALSE(disk.rollbacks[0][0].from_memory);
  CHECK_FALSE(disk.rollbacks[1][0].from_memory);
  check_same_run(mem, disk);
}

TEST_CASE("a NaN loss trips the guard and the rollback recovers the run") {
  const auto cfg = guard_config();
  test::TempDir da, db;
  // A NaN learning rate at step 12 makes every weight NaN: the loss of step 13 is NaN.
  const auto a = guarded_run(cfg, da.path().string(), {.spike_at = 12, .spike_x = std::numeric_limits<float>::quiet_NaN()});
  REQUIRE(a.trips[0].size() == 1);
  CHECK(a.trips[0][0] == std::pair<std::uint64_t, Trip>{13, Trip::non_finite_loss});
  CHECK(a.trips[0] == a.trips[1]);
  CHECK(a.rollbacks[0][0].step == 10);
  const auto b = guarded_run(cfg, db.path().string(), {.skip_at = 13});
  check_same_run(a, b);
}

TEST_CASE("a skipped batch is recorded in the checkpoint, so a resume skips it too") {
  auto cfg = guard_config();
  test::TempDir dir;
  const auto full = [&] {
    GuardOutcome o;
    std::mutex mu;
    Checkpointer ckpt({.root = dir.path().string(), .world_size = 2});
    dist::run_ranks(2, [&](dist::Communicator& comm) {
      Trainer t(cfg, comm);
      t.skip_batch_of_step(8);
      while (t.step_count() < 10) {
        const auto s = t.step();
        if (comm.rank() == 0) {
          std::lock_guard lk(mu);
          o.losses[s.step] = s.loss;
        }
        if (s.step == 5) start_save(ckpt, t).wait();
      }
    });
    return o;
  }();
  const auto resumed = run_training(cfg, 2, 10, dir.path().string(), 0, /*resume=*/true);
  REQUIRE(resumed.losses.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) CHECK(bits(resumed.losses[i]) == bits(full.losses.at(6 + i)));
  const auto plain = run_training(cfg, 2, 10);
  CHECK(bits(plain.losses[7]) != bits(full.losses.at(8)));  // the skip changed step 8's batch
}

TEST_CASE("a rollback before any checkpoint fails on every rank with the loader's error, without hanging") {
  const auto cfg = guard_config();
  test::TempDir dir;
  try {
    guarded_run(cfg, dir.path().string(), {.spike_at = 2, .spike_x = std::numeric_limits<float>::quiet_NaN()});
    FAIL("no throw");
  } catch (const Error& e) {
    MESSAGE(std::string(e.what()));
    CHECK(e.code() == Errc::not_found);
  }
}

TEST_CASE("a resume reads the optimizer state into the optimizer's own buffers, and a corrupt chunk fails it on every rank naming the shard") {
  test::TempDir dir;
  const auto cfg = small_config(2);
  const std::string root = dir.path().string();
  run_training(cfg, 2, 2, root, 2);
  // In place: the buffers keep their addresses and hold the checkpoint's bytes.
  const auto saved = resume_only(cfg, 2, root, Reshard::no);
  dist::run_ranks(2, [&](dist::Communicator& comm) {
    Trainer t(cfg, comm);
    const float* before = t.optimizer().master().data();
    t.resume_latest(root, Verify::fast);
    CHECK(t.optimizer().master().data() == before);
    const auto& want = saved.tensors[static_cast<std::size_t>(comm.rank())].at("optim.master");
    CHECK(std::memcmp(t.optimizer().master().data(), want.data(), want.size()) == 0);
  });
  // A flipped byte in rank 1's Adam m.
  const auto opened = open_latest(posix_file_system(), root);
  const std::string shard = opened.reader.shard_path(1);
  const std::uint64_t at = opened.reader.manifest().find_tensor("optim.m", 1)->begin + 10;
  std::string bytes = read_text(shard);
  bytes.at(at) = static_cast<char>(bytes.at(at) ^ 0x40);
  write_text(shard, bytes);
  std::vector<std::optional<Error>> errors(2);
  dist::run_ranks(2, [&](dist::Communicator& comm) {
    Trainer t(cfg, comm);
    try {
      t.resume_latest(root, Verify::fast);
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e;
    }
  });
  REQUIRE(errors[1]);
  CHECK(errors[1]->code() == Errc::checksum_mismatch);
  CHECK(errors[1]->file() == shard);
  CHECK(errors[1]->detail().find("xxh3 of chunk") == 0);
  CHECK(errors[1]->detail().find("were zeroed") != std::string::npos);
  REQUIRE(errors[0]);
  CHECK(errors[0]->code() == Errc::aborted);
}
