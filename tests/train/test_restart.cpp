// SPDX-License-Identifier: Apache-2.0
// Restarts that never dead-end: whatever a crash leaves of the first save, the restart loop's
// resume (Trainer::resume_or_start) continues the run, from the checkpoint if it was
// committed, else from step 0 on an empty root.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/train/trainer.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::testing;
using namespace ckpt::train;
namespace fs = std::filesystem;

namespace {

TrainConfig restart_config() {
  TrainConfig c;
  c.model = GptConfig{.vocab = 32, .seq = 8, .dim = 16, .heads = 2, .layers = 1, .batch = 2};
  c.corpus_tokens = 4096;
  c.total_steps = 10;
  return c;
}

std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

constexpr int kWorld = 2;
constexpr std::uint64_t kFirstSave = 3, kLastStep = 6;

// Trains from step 0 to kFirstSave and saves it through `fs` (the save may fail).
void first_save(const std::string& root, FileSystem& fs, const std::function<void()>& armed) {
  Checkpointer ckpt({.root = root, .world_size = kWorld, .backend = WriterBackend::posix, .fs = &fs});
  armed();
  dist::run_ranks(kWorld, [&](dist::Communicator& comm) {
    Trainer t(restart_config(), comm);
    while (t.step_count() < kFirstSave) t.step();
    try {
      start_save(ckpt, t).wait();
    } catch (const Error&) {
      // The crash: what it leaves on disk is the point.
    }
  });
}

struct Restart {
  std::optional<std::uint64_t> resumed_from;
  std::map<std::uint64_t, std::uint32_t> losses;  // step -> bits of rank 0's loss
};

// The restarted process: resume_or_start, train to kLastStep, save it.
Restart restart(const std::string& root) {
  Restart out;
  std::mutex mu;
  Checkpointer ckpt({.root = root, .world_size = kWorld, .backend = WriterBackend::posix});
  dist::run_ranks(kWorld, [&](dist::Communicator& comm) {
    Trainer t(restart_config(), comm);
    const auto from = t.resume_or_start(root, Verify::full);
    while (t.step_count() < kLastStep) {
      const auto s = t.step();
      std::lock_guard lk(mu);
      if (comm.rank() == 0) out.losses[s.step] = bits(s.loss);
    }
    start_save(ckpt, t).wait();
    std::lock_guard lk(mu);
    if (comm.rank() == 0) out.resumed_from = from;
  });
  return out;
}

}  // namespace

TEST_CASE("a crash in every window of the first save, then resume_or_start: the run continues, never dead-ends") {
  // The uninterrupted run, and how many file-system mutations its first save makes.
  test::TempDir ref_dir;
  FaultInjectionFileSystem counting(posix_file_system());
  first_save((ref_dir.path() / "root").string(), counting, [&] { counting.reset(); });
  const std::uint64_t total = counting.mutations();
  REQUIRE(total > 5);
  const Restart reference = restart((ref_dir.path() / "root").string());
  REQUIRE(reference.resumed_from == kFirstSave);
  test::TempDir fresh_dir;
  const Restart from_zero = restart((fresh_dir.path() / "root").string());
  REQUIRE(from_zero.resumed_from == std::nullopt);
  REQUIRE(from_zero.losses.size() == kLastStep);

  int committed = 0, uncommitted_step_dirs = 0;
  for (std::uint64_t k = 0; k <= total; ++k) {
    CAPTURE(k);
    test::TempDir dir;
    const std::string root = (dir.path() / "root").string();
    FaultInjectionFileSystem faults(posix_file_system());
    first_save(root, faults, [&] { faults.crash_after(k); });
    const bool has_latest = fs::exists(dir.path() / "root" / kLatestName);
    const bool orphan = !has_latest && fs::exists(dir.path() / "root" / checkpoint_dir_name(kFirstSave));
    uncommitted_step_dirs += orphan;
    std::vector<std::string> logged;
    std::mutex log_mu;
    auto previous = set_log_sink([&](std::string_view l) {
      std::lock_guard lk(log_mu);
      logged.emplace_back(l);
    });
    Restart r;
    try {
      r = restart(root);
    } catch (...) {
      set_log_sink(previous);
      throw;
    }
    set_log_sink(previous);
    // Committed (`latest` exists): the resume continues from it; else an empty root, started
    // afresh. Either way the same losses as the uninterrupted run, bit for bit.
    if (has_latest) {
      ++committed;
      CHECK(r.resumed_from == kFirstSave);
      CHECK(r.losses == reference.losses);
    } else {
      CHECK(r.resumed_from == std::nullopt);
      CHECK(r.losses == from_zero.losses);
    }
    if (orphan) {
      bool said = false;
      for (const auto& l : logged) said |= l.find("never committed") != std::string::npos && l.find(checkpoint_dir_name(kFirstSave)) != std::string::npos;
      CHECK(said);
    }
    // The new save committed; nothing uncommitted or temporary is left.
    CHECK(read_latest(posix_file_system(), root) == checkpoint_dir_name(kLastStep));
    std::vector<std::string> expect = {checkpoint_dir_name(kFirstSave), checkpoint_dir_name(kLastStep), std::string(kLatestName),
                                       std::string(kLockName)};
    if (!has_latest) expect.erase(expect.begin());  // (the writer lock's file stays)
    std::sort(expect.begin(), expect.end());
    CHECK(test::names_in(dir.path() / "root") == expect);
  }
  // Both outcomes, and the window between the rename and `latest`, were walked through.
  CHECK(committed > 0);
  CHECK(committed < static_cast<int>(total) + 1);
  CHECK(uncommitted_step_dirs > 0);
}

TEST_CASE("resume_or_start on a missing root starts fresh, on a root whose latest names a broken checkpoint it throws that error") {
  test::TempDir dir;
  const std::string root = (dir.path() / "none").string();
  dist::run_ranks(kWorld, [&](dist::Communicator& comm) {
    Trainer t(restart_config(), comm);
    CHECK(t.resume_or_start(root) == std::nullopt);
    CHECK(t.step_count() == 0);
  });
  fs::create_directories(dir.path() / "broken");
  test::write_all(dir.path() / "broken" / kLatestName, {'s', 't', 'e', 'p', '-', '0', '0', '0', '0', '0', '0', '0', '0', '0', '9', '\n'});
  std::mutex mu;
  std::vector<Errc> codes;
  dist::run_ranks(kWorld, [&](dist::Communicator& comm) {
    Trainer t(restart_config(), comm);
    try {
      t.resume_or_start((dir.path() / "broken").string());
    } catch (const Error& e) {
      std::lock_guard lk(mu);
      codes.push_back(e.code());
    }
  });
  CHECK(codes == std::vector<Errc>{Errc::not_found, Errc::not_found});
}

TEST_CASE("resume_or_start on a node set whose newest step no latest names never starts fresh: it resumes that step once the Checkpointer moved the latest pointers") {
  test::TempDir dir;
  const std::string root = (dir.path() / "nodes").string();
  const CheckpointerOptions opt{.root = root, .world_size = kWorld, .backend = WriterBackend::posix, .nodes = NodeOptions{.ranks_per_node = 1}};
  {
    Checkpointer ckpt(opt);
    dist::run_ranks(kWorld, [&](dist::Communicator& comm) {
      Trainer t(restart_config(), comm);
      while (t.step_count() < kFirstSave) t.step();
      start_save(ckpt, t).wait();
    });
  }
  // A crash after every node's rename, before the first `latest`: what that leaves.
  for (int n = 0; n < kWorld; ++n) fs::remove(dir.path() / "nodes" / ("node-" + std::to_string(n)) / kLatestName);
  std::mutex mu;
  std::vector<Errc> codes;
  dist::run_ranks(kWorld, [&](dist::Communicator& comm) {
    Trainer t(restart_config(), comm);
    try {
      t.resume_or_start(root);
    } catch (const Error& e) {
      std::lock_guard lk(mu);
      codes.push_back(e.code());
    }
  });
  CHECK(codes == std::vector<Errc>{Errc::not_found, Errc::not_found});  // not a fresh start
  Checkpointer ckpt(opt);  // prepare_node_roots: every `latest` moves to the complete step
  std::vector<std::optional<std::uint64_t>> from(kWorld);
  dist::run_ranks(kWorld, [&](dist::Communicator& comm) {
    Trainer t(restart_config(), comm);
    from[static_cast<std::size_t>(comm.rank())] = t.resume_or_start(root);
  });
  CHECK(from == std::vector<std::optional<std::uint64_t>>{kFirstSave, kFirstSave});
}
