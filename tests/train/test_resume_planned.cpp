// SPDX-License-Identifier: Apache-2.0
// Trainer::resume_planned: the recovery planner (store/recovery.hpp) drives the resume over a
// run's levels: memory (with rs:2+1 parity over 3 nodes), then a durable directory on disk.
// Rank 0 plans (and rebuilds what the plan says, when no Checkpointer's start-up did first),
// every rank loads what it chose, and the run continues bit for bit as one never interrupted.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "ckpt/train/trainer.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::train;
namespace fs = std::filesystem;

namespace {

TrainConfig config() {
  TrainConfig c;
  c.model = GptConfig{.vocab = 32, .seq = 8, .dim = 16, .heads = 2, .layers = 1, .batch = 2};
  c.corpus_tokens = 4096;
  c.total_steps = 12;
  return c;
}

constexpr int kWorld = 3;

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

CheckpointerOptions options(const std::string& mem, const std::string& durable) {
  CheckpointerOptions o{.root = mem, .world_size = kWorld, .keep_last = 2, .backend = WriterBackend::posix};
  o.nodes = NodeOptions{.ranks_per_node = 1, .redundancy = *parse_redundancy("rs:2+1")};
  o.durable = DurableTierOptions{.root = durable, .keep_last = 4, .every = 4};
  o.allow_older_than_latest = true;
  return o;
}

// Trains from the levels' newest checkpoint (or step 0) to `last`, saving every step to
// memory (the disk every 4th); returns rank 0's loss bits per step trained and what the
// resume said.
struct Run {
  std::optional<Trainer::PlannedResume> resumed;
  std::map<std::uint64_t, std::uint32_t> losses;
  std::size_t repaired = 0;  // checkpoints the Checkpointer's start-up rebuilt
};
Run train_to(const std::string& mem, const std::string& durable, std::uint64_t last) {
  Run out;
  std::mutex mu;
  Checkpointer ckpt(options(mem, durable));
  out.repaired = ckpt.repairs().size();
  dist::run_ranks(kWorld, [&](dist::Communicator& comm) {
    Trainer t(config(), comm);
    const auto r = t.resume_planned({mem, durable}, Verify::full);
    while (t.step_count() < last) {
      const auto s = t.step();
      start_save(ckpt, t).wait();
      std::lock_guard lk(mu);
      if (comm.rank() == 0) out.losses[s.step] = bits(s.loss);
    }
    std::lock_guard lk(mu);
    if (comm.rank() == 0) out.resumed = r;
  });
  ckpt.wait_durable();
  return out;
}

}  // namespace

TEST_CASE("resume_planned resumes from memory, from memory with a node rebuilt, and from the disk when memory is gone, bit for bit") {
  test::TempDir dir;
  const std::string mem = "mem://trainer-planned-" + std::to_string(::getpid());
  const fs::path mem_dir = memory_root_dir(mem);
  fs::remove_all(mem_dir);
  const std::string durable = (dir / "durable").string();
  const Run reference = train_to("mem://trainer-planned-ref-" + std::to_string(::getpid()), (dir / "ref").string(), 12);
  fs::remove_all(memory_root_dir("mem://trainer-planned-ref-" + std::to_string(::getpid())));
  REQUIRE(reference.losses.size() == 12);
  CHECK_FALSE(reference.resumed.has_value());  // nothing anywhere: a fresh start

  const auto same = [&](const Run& r) {
    for (const auto& [step, b] : r.losses) {
      INFO("step " << step);
      CHECK(b == reference.losses.at(step));
    }
  };
  const Run first = train_to(mem, durable, 6);
  CHECK_FALSE(first.resumed.has_value());
  // The process restarts: memory holds step 6.
  Run second = train_to(mem, durable, 8);
  REQUIRE(second.resumed.has_value());
  CHECK(second.resumed->step == 6);
  CHECK(second.resumed->root == mem);
  CHECK(second.resumed->plan == "step 6 from memory " + mem + " (read in place)");
  same(second);
  // Node 1's memory lost: the Checkpointer's start-up (constructed first, as a restart loop
  // does) rebuilds it from the others' parity; the plan then reads it in place.
  fs::remove_all(mem_dir / "node-1");
  Run third = train_to(mem, durable, 10);
  REQUIRE(third.resumed.has_value());
  CHECK(third.repaired == 2);  // both generations in memory
  CHECK(third.resumed->step == 8);
  CHECK(third.resumed->plan == "step 8 from memory " + mem + " (read in place)");
  same(third);
  // A reboot: all memory gone; the disk holds every 4th step (and 10, the last, is not
  // there: only what the cadence copied).
  fs::remove_all(mem_dir);
  Run fourth = train_to(mem, durable, 12);
  REQUIRE(fourth.resumed.has_value());
  CHECK(fourth.resumed->step == 8);
  CHECK(fourth.resumed->root == durable);
  CHECK(fourth.resumed->plan.starts_with("step 8 from disk " + durable + " (read in place); not used: " + mem + ": "));
  same(fourth);
  fs::remove_all(mem_dir);
}

TEST_CASE("resume_planned before any Checkpointer rebuilds a node's lost memory itself, as the plan says, and times it") {
  const std::string mem = "mem://trainer-planned-rebuild-" + std::to_string(::getpid());
  const fs::path mem_dir = memory_root_dir(mem);
  fs::remove_all(mem_dir);
  test::TempDir dir;
  const std::string durable = (dir / "durable").string();
  train_to(mem, durable, 5);
  fs::remove_all(mem_dir / "node-2");
  std::mutex mu;
  std::optional<Trainer::PlannedResume> got;
  dist::run_ranks(kWorld, [&](dist::Communicator& comm) {
    Trainer t(config(), comm);
    const auto r = t.resume_planned({mem, durable});
    std::lock_guard lk(mu);
    if (comm.rank() == 0) got = r;
  });
  REQUIRE(got.has_value());
  CHECK(got->step == 5);
  CHECK(got->plan == "step 5 from memory " + mem + " (its lost files rebuilt from the other nodes' redundancy first)");
  CHECK(got->rebuild.count() > 0);
  CHECK(fs::exists(mem_dir / "node-2" / "step-0000000005"));
  fs::remove_all(mem_dir);
}
