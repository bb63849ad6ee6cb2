// SPDX-License-Identifier: Apache-2.0
// Resume over two tiers: a run that copied its checkpoints to a durable root continues bit for
// bit from there when the local root is lost or its newest checkpoint is corrupt.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <mutex>

#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/train/trainer.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::train;
namespace fs = std::filesystem;

namespace {

constexpr int kWorld = 2;

TrainConfig tiny_config() {
  TrainConfig c;
  c.model = GptConfig{.vocab = 32, .seq = 8, .dim = 16, .heads = 2, .layers = 1, .batch = 2};
  c.corpus_tokens = 8192;
  c.token_noise = 0.05f;  // the per-rank RNG streams are part of what must come back
  c.total_steps = 10;
  return c;
}

struct Trace {
  std::vector<float> losses;                    // rank 0, one per step run
  std::vector<std::vector<std::uint16_t>> p16;  // every rank's final 16-bit parameters
  Trainer::TieredResume resumed;                // rank 0's, when resuming
};

// Runs to step 8 from scratch (saving at step 4 to both tiers), or resumes over both tiers.
Trace run(const std::string& local, const std::string& durable, bool resume) {
  Trace out;
  out.p16.resize(kWorld);
  std::mutex mu;
  std::optional<Checkpointer> ck;
  if (!resume) ck.emplace(CheckpointerOptions{.root = local, .world_size = kWorld, .durable = DurableTierOptions{.root = durable}});
  dist::run_ranks(kWorld, [&](dist::Communicator& comm) {
    Trainer t(tiny_config(), comm);
    std::uint64_t start = 0;
    if (resume) {
      const auto r = t.resume_latest_tiered(local, durable, Verify::full);
      start = r.step;
      if (comm.rank() == 0) out.resumed = r;
    }
    for (std::uint64_t s = start + 1; s <= 8; ++s) {
      const auto st = t.step();
      if (comm.rank() == 0) out.losses.push_back(st.loss);
      if (ck && s == 4) start_save(*ck, t).wait();
    }
    std::lock_guard lk(mu);
    const auto p = t.optimizer().params16();
    out.p16[static_cast<std::size_t>(comm.rank())].assign(p.begin(), p.end());
  });
  if (ck) ck->wait_durable();
  return out;
}

// A run to step 8 that saved step 4 to both tiers.
struct SavedRun {
  test::TempDir dir{"ckpt-tiers"};
  std::string local = (dir / "local").string();
  std::string durable = (dir / "durable").string();
  Trace full = run(local, durable, false);
};

void check_continues(const Trace& full, const Trace& resumed) {
  REQUIRE(resumed.losses.size() == 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(std::memcmp(&resumed.losses[i], &full.losses[4 + i], sizeof(float)) == 0);
  CHECK(resumed.p16 == full.p16);
}

}  // namespace

TEST_CASE("a run resumed from the durable tier after the local root is deleted continues bit for bit") {
  const SavedRun saved;
  const std::string &local = saved.local, &durable = saved.durable;
  const Trace& full = saved.full;
  REQUIRE(fs::exists(fs::path(durable) / "step-0000000004" / "manifest.json"));
  fs::remove_all(local);
  const Trace resumed = run(local, durable, true);
  CHECK(resumed.resumed.step == 4);
  CHECK(resumed.resumed.tier == "durable");
  CHECK(resumed.resumed.local_error.find("no such checkpoint root") != std::string::npos);
  check_continues(full, resumed);
}

TEST_CASE("a corrupt newest local checkpoint resumes from the durable tier, which says so") {
  const SavedRun saved;
  const std::string &local = saved.local, &durable = saved.durable;
  const Trace& full = saved.full;
  const fs::path shard = fs::path(local) / "step-0000000004" / shard_file_name(1, kWorld);
  auto bytes = test::read_all(shard);
  bytes[bytes.size() - 3] ^= 0x01;
  test::write_all(shard, bytes);
  const Trace resumed = run(local, durable, true);
  CHECK(resumed.resumed.tier == "durable");
  CHECK(resumed.resumed.local_error.find("checksum mismatch") != std::string::npos);
  check_continues(full, resumed);
}

TEST_CASE("with both tiers good the resume uses the local one") {
  const SavedRun saved;
  const std::string &local = saved.local, &durable = saved.durable;
  const Trace& full = saved.full;
  const Trace resumed = run(local, durable, true);
  CHECK(resumed.resumed.tier == "local");
  CHECK(resumed.resumed.local_error.empty());
  check_continues(full, resumed);
}
