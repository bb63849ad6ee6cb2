// SPDX-License-Identifier: Apache-2.0
// Training and the checkpoint commit across MPI processes (run under mpirun by ctest).
//   mpi-train train DIR    the mini GPT on the MPI backend (one Checkpointer per process, the
//                          MPI coordinator) against the thread backend at the same world size
//                          (run on rank 0 in this program): losses equal bit for bit, a save at
//                          step 3 resumes bit-exactly, and each backend resumes the other's
//                          checkpoint with the same losses.
//   mpi-train kill DIR     saves step 2, then rank 1 dies (SIGKILL) at step 4 after its shard
//                          is durable, before reporting it: mpirun ends the job.
//   mpi-train verify DIR STEP   (one process) `latest` names STEP and it verifies in full.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/mpi/mpi_comm.hpp"
#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/train/trainer.hpp"
#include "mpi/small_config.hpp"

using namespace ckpt;
using namespace ckpt::train;

namespace {

constexpr std::uint64_t kSteps = 6, kSaveAt = 3;

TrainConfig config() { return test::small_mpi_config(10); }

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

// Losses of steps start+1..kSteps on the thread backend (optionally resuming from `resume`,
// optionally saving at kSaveAt into `root`).
std::vector<float> thread_run(int world, const std::string& root, const std::string& resume) {
  std::vector<float> losses;
  std::optional<Checkpointer> ck;
  if (!root.empty()) ck.emplace(CheckpointerOptions{.root = root, .world_size = world});
  dist::run_ranks(world, [&](dist::Communicator& comm) {
    Trainer t(config(), comm);
    const std::uint64_t start = resume.empty() ? 0 : t.resume_latest(resume, Verify::full);
    std::vector<SaveHandle> hs;
    for (std::uint64_t s = start + 1; s <= kSteps; ++s) {
      const auto st = t.step();
      if (comm.rank() == 0) losses.push_back(st.loss);
      if (ck && s == kSaveAt) hs.push_back(start_save(*ck, t));
    }
    for (auto& h : hs) h.wait();
  });
  return losses;
}

// The same on the MPI backend: one Checkpointer per process with the MPI coordinator.
std::vector<float> mpi_run(dist::MpiSession& mpi, const std::string& root, const std::string& resume) {
  auto coord = dist::make_mpi_coordinator();
  std::vector<float> losses;
  std::optional<Checkpointer> ck;
  if (!root.empty()) ck.emplace(CheckpointerOptions{.root = root, .world_size = mpi.size(), .coordinator = coord.get()});
  Trainer t(config(), mpi.world());
  const std::uint64_t start = resume.empty() ? 0 : t.resume_latest(resume, Verify::full);
  for (std::uint64_t s = start + 1; s <= kSteps; ++s) {
    losses.push_back(t.step().loss);
    if (ck && s == kSaveAt) start_save(*ck, t).wait();
  }
  return losses;
}

// Forwards to the MPI coordinator, except that the dying rank kills itself in report() of
// step 4: its shard is written and durable, its report never leaves.
class DyingCoordinator final : public CommitCoordinator {
 public:
  DyingCoordinator(CommitCoordinator& inner, bool die) : inner_(inner), die_(die) {}
  int world_size() const noexcept override { return inner_.world_size(); }
  std::vector<int> local_ranks() const override { return inner_.local_ranks(); }
  std::string start_run(const std::function<void()>& prepare) override { return inner_.start_run(prepare); }
  void report(std::uint64_t step, RankReport report, CommitFn c, OutcomeFn o) override {
    if (die_ && step == 4) std::raise(SIGKILL);
    inner_.report(step, std::move(report), std::move(c), std::move(o));
  }
  void abandon(std::uint64_t step, const CommitOutcome& outcome) override { inner_.abandon(step, outcome); }
  std::vector<int> reported(std::uint64_t step) const override { return inner_.reported(step); }

 private:
  CommitCoordinator& inner_;
  bool die_;
};

int fail(const std::string& what) {
  std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  return 1;
}

int train_run(dist::MpiSession& mpi, const std::string& dir) {
  const int world = mpi.size();
  const std::string tdir = dir + "/thread", mdir = dir + "/mpi";
  // The reference: the thread backend at the same world size, run by rank 0 alone.
  std::vector<float> ref;
  if (mpi.rank() == 0) ref = thread_run(world, tdir, "");
  mpi.world().barrier();  // the thread checkpoint is committed before anyone resumes it

  const auto mpi_losses = mpi_run(mpi, mdir, "");
  const auto mpi_resumed = mpi_run(mpi, "", mdir);       // MPI resumes MPI
  const auto from_thread = mpi_run(mpi, "", tdir);       // MPI resumes threads
  int bad = 0;
  if (mpi.rank() == 0) {
    const auto tail = std::vector<float>(ref.begin() + kSaveAt, ref.end());
    if (bits(mpi_losses) != bits(ref)) bad += fail("MPI losses differ from the thread backend's");
    if (bits(mpi_resumed) != bits(tail)) bad += fail("MPI resume of the MPI checkpoint differs");
    if (bits(from_thread) != bits(tail)) bad += fail("MPI resume of the thread checkpoint differs");
    if (bits(thread_run(world, "", mdir)) != bits(tail)) bad += fail("thread resume of the MPI checkpoint differs");
    std::printf("mpi training: %d ranks, %zu losses, first %08x, %s\n", world, mpi_losses.size(), bits(mpi_losses)[0],
                bad ? "MISMATCH" : "bit-exact with the thread backend, resumes cross-backend");
  }
  std::vector<std::int32_t> b{bad};
  mpi.world().all_reduce(std::span(b));
  return b[0] == 0 ? 0 : 1;
}

int kill_mid_save(dist::MpiSession& mpi, const std::string& dir) {
  auto inner = dist::make_mpi_coordinator();
  DyingCoordinator coord(*inner, mpi.rank() == 1);
  Checkpointer ck({.root = dir, .world_size = mpi.size(), .coordinator = &coord});
  Trainer t(config(), mpi.world());
  for (std::uint64_t s = 1; s <= 4; ++s) {
    t.step();
    if (s == 2 || s == 4) start_save(ck, t).wait();  // step 4 never completes
  }
  return fail("the save of step 4 completed although rank 1 died");
}

int verify(const std::string& root, const std::string& step) {
  auto& fs = posix_file_system();
  const auto latest = read_latest(fs, root);
  const std::string want = checkpoint_dir_name(std::stoull(step));
  if (!latest || *latest != want) return fail("latest is " + (latest ? *latest : "missing") + ", expected " + want);
  CheckpointReader::open(fs, root + "/" + *latest).verify(Verify::full);
  std::printf("latest is %s and verifies\n", latest->c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 2 ? argv[1] : "";
    if (mode == "verify" && argc > 3) return verify(argv[2], argv[3]);
    dist::MpiSession mpi(&argc, &argv);
    if (mode == "train") return train_run(mpi, argv[2]);
    if (mode == "kill") return kill_mid_save(mpi, argv[2]);
    return fail("usage: mpi-train train|kill DIR | verify DIR STEP");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
