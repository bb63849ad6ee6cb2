// SPDX-License-Identifier: Apache-2.0
// Trainer with tensor-parallel attention heads: agreement with the single-rank baseline,
// exact resume, and the layout recorded in (and enforced from) the checkpoint.
#include <doctest/doctest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/ops/reshard.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/train/trainer.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::train;

namespace {

TrainConfig tp_train_config(int batch, int tensor_parallel) {
  TrainConfig c;
  c.model = GptConfig{.vocab = 32, .seq = 8, .dim = 16, .heads = 4, .layers = 2, .batch = batch};
  c.corpus_tokens = 8192;
  c.token_noise = 0.0f;  // the baselines below run other splits of the same data
  c.total_steps = 10;
  c.tensor_parallel = tensor_parallel;
  return c;
}

struct Run {
  std::vector<float> losses;                     // rank 0's
  std::vector<float> params;                     // rank 0, fp32 upcast
  std::vector<std::vector<std::uint16_t>> p16;   // every rank
  std::vector<boost::json::object> metadata;     // every rank's checkpoint_info().metadata
  std::vector<std::uint64_t> activation_bytes;   // every rank's
};

// Trains to `steps` at world size `world`; saves at `save_at` (0: never) and/or resumes first.
Run run_tp(const TrainConfig& cfg, int world, std::uint64_t steps, const std::string& root = {},
          std::uint64_t save_at = 0, bool resume = false, Reshard reshard = Reshard::no) {
  Run out;
  const auto n = static_cast<std::size_t>(world);
  out.p16.resize(n);
  out.metadata.resize(n);
  out.activation_bytes.resize(n);
  std::mutex mu;
  std::optional<Checkpointer> ckpt;
  if (save_at) ckpt.emplace(CheckpointerOptions{.root = root, .world_size = world});
  dist::run_ranks(world, [&](dist::Communicator& comm) {
    Trainer t(cfg, comm);
    const std::uint64_t start = resume ? t.resume_latest(root, Verify::full, reshard) : 0;
    std::optional<SaveHandle> handle;
    for (std::uint64_t s = start + 1; s <= steps; ++s) {
      const auto st = t.step();
      if (comm.rank() == 0) out.losses.push_back(st.loss);
      if (ckpt && s == save_at) handle = start_save(*ckpt, t);
    }
    if (handle) handle->wait();
    std::lock_guard lk(mu);
    const auto r = static_cast<std::size_t>(comm.rank());
    if (r == 0) out.params = t.parameters();
    const auto p = t.optimizer().params16();
    out.p16[r].assign(p.begin(), p.end());
    out.metadata[r] = json_of(t.checkpoint_info().metadata);
    out.activation_bytes[r] = t.memory().activations;
  });
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

}  // namespace

TEST_CASE("tensor-parallel training tracks the data-parallel and single-rank baselines on the same global batch") {
  // Baseline of tensor T x data D: the plain data-parallel run over the same D replicas
  // (T = 1, world D; for D = 1 the single rank), which rounds its gradients to 16 bits per
  // replica exactly as the tensor-parallel run does, so only the tensor-parallel noise is left.
  // Step 1 starts from the same parameters: its loss differs by fp32 reordering only (1e-5
  // relative is a wide margin). Later steps carry that noise through the 16-bit rounding of
  // gradients and parameters, where one flipped rounding moves a parameter by a 16-bit ulp
  // (2^-10 at the LayerNorm weights near 1): parameters within 1e-3 after 5 steps, losses
  // within 1e-4 relative. A missing or doubled head would miss these by orders of magnitude.
  // Against the single rank, tensor 2 x data 2 may differ by what data parallelism alone does
  // (each replica rounds its own gradient) plus that same tensor-parallel margin.
  const auto single = run_tp(tp_train_config(4, 1), 1, 5);
  const auto dp2 = run_tp(tp_train_config(2, 1), 2, 5);
  struct Layout { int world, tensor; };
  for (const Layout l : {Layout{2, 2}, Layout{4, 2}, Layout{4, 4}}) {
    CAPTURE(l.world);
    CAPTURE(l.tensor);
    const int data = l.world / l.tensor;
    const Run& baseline = data == 1 ? single : dp2;
    const auto run = run_tp(tp_train_config(4 / data, l.tensor), l.world, 5);
    REQUIRE(run.losses.size() == 5);
    CHECK(std::abs(run.losses[0] - baseline.losses[0]) <= 1e-5 * baseline.losses[0]);
    for (std::size_t s = 0; s < 5; ++s) CHECK(std::abs(run.losses[s] - baseline.losses[s]) <= 1e-4 * baseline.losses[s]);
    const double diff = max_abs_diff(run.params, baseline.params);
    MESSAGE("tensor " << l.tensor << " x data " << data << ": step-1 loss " << run.losses[0] << " vs "
                      << baseline.losses[0] << ", max |param difference| after 5 steps " << diff);
    CHECK(diff < 1e-3);
    if (data > 1) {
      const double dp_noise = max_abs_diff(dp2.params, single.params);
      const double to_single = max_abs_diff(run.params, single.params);
      MESSAGE("against the single rank: " << to_single << " (data parallelism alone: " << dp_noise << ")");
      CHECK(to_single < dp_noise + 1e-3);
    }
    for (int r = 1; r < l.world; ++r) CHECK(run.p16[static_cast<std::size_t>(r)] == run.p16[0]);
    // Each rank keeps only its share of the attention activations.
    CHECK(run.activation_bytes[0] < baseline.activation_bytes[0]);
  }
}

TEST_CASE("a tensor-parallel run resumes bit for bit") {
  auto cfg = tp_train_config(2, 2);
  cfg.token_noise = 0.05f;  // the per-replica RNG in the checkpoint is exercised
  test::TempDir dir;
  const auto full = run_tp(cfg, 4, 8, dir.path().string(), /*save_at=*/4);
  const auto resumed = run_tp(cfg, 4, 8, dir.path().string(), 0, /*resume=*/true);
  REQUIRE(resumed.losses.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(std::memcmp(&resumed.losses[i], &full.losses[4 + i], sizeof(float)) == 0);
  CHECK(resumed.p16 == full.p16);
  // The two ranks of a tensor-parallel group draw the same noise; the replicas do not.
  CHECK(full.metadata[0].at("rng") == full.metadata[1].at("rng"));
  CHECK(full.metadata[2].at("rng") == full.metadata[3].at("rng"));
  CHECK(full.metadata[0].at("rng") != full.metadata[2].at("rng"));
}

TEST_CASE("the manifest records the tensor-parallel layout") {
  test::TempDir dir;
  run_tp(tp_train_config(2, 2), 4, 1, dir.path().string(), 1);
  const auto opened = open_latest(posix_file_system(), dir.path().string(), {});
  const auto& parallel = json_of(opened.reader.manifest().training).at("parallel");
  CHECK(parallel == boost::json::value{{"tensor", 2}, {"data", 2}, {"tp_split", "attention heads"}});
  CHECK(json_of(opened.reader.manifest().training).at("config").at("tensor_parallel") == 2);
}

TEST_CASE("a resume at another tensor-parallel layout is refused naming both layouts") {
  test::TempDir dir;
  const auto saved = run_tp(tp_train_config(2, 2), 2, 2, dir.path().string(), 2);
  // Same world size, heads not split: refused, with or without resharding.
  for (const Reshard reshard : {Reshard::no, Reshard::allow}) {
    const Error e = test::expect_error([&] { run_tp(tp_train_config(2, 1), 2, 4, dir.path().string(), 0, true, reshard); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.file() == (dir.path() / checkpoint_dir_name(2) / kManifestName).string());
    CHECK(e.expected() == "tensor 1 x data 2");
    CHECK(e.actual() == "tensor 2 x data 1");
  }
  // Another world size with another split, through the reshard path.
  const Error e4 = test::expect_error([&] { run_tp(tp_train_config(2, 4), 4, 4, dir.path().string(), 0, true, Reshard::allow); });
  CHECK(e4.code() == Errc::invalid_argument);
  CHECK(e4.file() == (dir.path() / checkpoint_dir_name(2) / kManifestName).string());
  CHECK(e4.expected() == "tensor 4 x data 1");
  CHECK(e4.actual() == "tensor 2 x data 1");
  // Nothing was lost: the checkpoint still resumes at its own layout, where it left off.
  const auto again = run_tp(tp_train_config(2, 2), 2, 2, dir.path().string(), 0, true);
  CHECK(again.p16 == saved.p16);
}

TEST_CASE("a checkpoint without tensor parallelism is refused by a tensor-parallel run") {
  test::TempDir dir;
  run_tp(tp_train_config(2, 1), 2, 2, dir.path().string(), 2);
  const Error e = test::expect_error([&] { run_tp(tp_train_config(2, 2), 2, 4, dir.path().string(), 0, true); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "tensor 2 x data 1");
  CHECK(e.actual() == "tensor 1 x data 2");
}

TEST_CASE("a tensor-parallel checkpoint reshards to another number of replicas") {
  // tensor 2 x data 1 -> tensor 2 x data 2: the new replica's two ranks start the same
  // derived stream, so they keep training on the same noisy batch.
  auto cfg = tp_train_config(2, 2);
  cfg.token_noise = 0.05f;
  test::TempDir dir;
  run_tp(cfg, 2, 3, dir.path().string(), 3);
  const auto after = run_tp(cfg, 4, 6, dir.path().string(), 0, true, Reshard::allow);
  REQUIRE(after.losses.size() == 3);
  for (int r = 1; r < 4; ++r) CHECK(after.p16[static_cast<std::size_t>(r)] == after.p16[0]);
  CHECK(after.metadata[2].at("rng") == after.metadata[3].at("rng"));
  CHECK(after.metadata[0].at("rng") != after.metadata[2].at("rng"));
  for (float loss : after.losses) CHECK(std::isfinite(loss));
}

TEST_CASE("an offline reshard of a tensor-parallel checkpoint keeps whole groups and trains as the load-time one") {
  auto cfg = tp_train_config(2, 2);
  cfg.token_noise = 0.05f;
  test::TempDir src, offline, live;
  run_tp(cfg, 2, 3, src.path().string(), 3);
  std::filesystem::copy(src.path(), live.path(), std::filesystem::copy_options::recursive);
  const auto reader = CheckpointReader::open(posix_file_system(), (src.path() / checkpoint_dir_name(3)).string());
  // 3 ranks cannot hold groups of 2: refused before anything is written.
  const auto odd = offline.path() / "odd";
  const Error e = test::expect_error([&] { reshard_checkpoint(posix_file_system(), reader, odd.string(), {.world_size = 3}); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "a multiple of 2");
  CHECK(e.actual() == "3");
  CHECK_FALSE(std::filesystem::exists(odd));
  reshard_checkpoint(posix_file_system(), reader, offline.path().string(), {.world_size = 4});
  const auto opened = open_latest(posix_file_system(), offline.path().string(), {});
  CHECK(json_of(opened.reader.manifest().training).at("parallel").at("data") == 2);
  const auto a = run_tp(cfg, 4, 6, live.path().string(), 0, true, Reshard::allow);
  const auto b = run_tp(cfg, 4, 6, offline.path().string(), 0, true, Reshard::no);
  REQUIRE(a.losses.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) CHECK(std::memcmp(&a.losses[i], &b.losses[i], sizeof(float)) == 0);
  CHECK(a.p16 == b.p16);
}

TEST_CASE("tensor_parallel must divide the world size and the heads") {
  for (auto [world, tensor] : {std::pair{3, 2}, std::pair{4, 8}, std::pair{2, 0}}) {
    CAPTURE(world);
    CAPTURE(tensor);
    const Error e = test::expect_error([&] { run_tp(tp_train_config(2, tensor), world, 1); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.actual() == std::to_string(tensor));
  }
}
