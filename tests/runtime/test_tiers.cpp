// SPDX-License-Identifier: Apache-2.0
// Two tiers through the checkpointer: background copies to a durable root with their own
// rotation, "latest wins" while a copy runs, and a failing durable tier that never reaches
// training or the local tier.
#include <doctest/doctest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/tiers.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "runtime/runtime_fixture.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

constexpr int kWorld = 2;
constexpr std::size_t kN = 3000;

struct Run {
  test::TempDir dir{"ckpt-tiers"};
  std::string local = (dir / "local").string();
  std::string durable = (dir / "durable").string();
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};

  CheckpointerOptions options(int keep_local, DurableTierOptions d) const {
    d.root = d.root.empty() ? durable : d.root;
    return {.root = local, .world_size = kWorld, .keep_last = keep_local, .backend = WriterBackend::posix, .durable = d};
  }
  // Every rank saves `step` and waits for the local commit and the rotation after it; returns
  // rank 0's result.
  SaveResult save(Checkpointer& ck, std::uint64_t step) {
    std::vector<SaveResult> results(kWorld);
    test::run_ranks(kWorld, [&](int r) {
      auto& st = states[static_cast<std::size_t>(r)];
      st.set(r, step);
      results[static_cast<std::size_t>(r)] = ck.save_sync(r, step, st.views(), test::info_for(r, kWorld, kN, step));
    });
    ck.wait_all();
    return results[0];
  }
};

// The durable checkpoint verifies in full and its shards are byte-equal to the local ones.
void check_same(const std::string& local_root, const std::string& durable_root, const std::string& name) {
  const auto copy = CheckpointReader::open(posix_file_system(), durable_root + "/" + name, kWorld);
  copy.verify(Verify::full);
  for (int r = 0; r < kWorld; ++r)
    CHECK(test::read_all(fs::path(local_root) / name / shard_file_name(r, kWorld)) == test::read_all(copy.shard_path(r)));
}

// Waits (without a clock) until the durable file system has a copy blocked in fsync.
void until_held(const FaultInjectionFileSystem& f) {
  while (f.held_syncs() == 0) std::this_thread::yield();
}

}  // namespace

TEST_CASE("both tiers hold checkpoints with their own rotation, each durable copy verifying in full") {
  Run run;
  Checkpointer ck(run.options(2, {.keep_last = 5}));
  for (std::uint64_t s = 1; s <= 8; ++s) {
    run.save(ck, s);
    ck.wait_durable();  // one copy per commit: nothing superseded
    check_same(run.local, run.durable, checkpoint_dir_name(s));
  }
  CHECK(test::step_dirs(run.local) == std::vector<std::string>{"step-0000000007", "step-0000000008"});
  CHECK(test::step_dirs(run.durable) == std::vector<std::string>{"step-0000000004", "step-0000000005", "step-0000000006",
                                                                "step-0000000007", "step-0000000008"});
  CHECK(read_latest(posix_file_system(), run.durable) == "step-0000000008");
  const auto st = ck.stats().durable;
  CHECK(st.submitted == 8);
  CHECK(st.copies == 8);
  CHECK(st.failures == 0);
  CHECK(st.superseded == 0);
  CHECK(st.rotated == 3);
  CHECK(st.last_step == 8u);
  CHECK(st.bytes > 8 * kWorld * kN * 4);
  CHECK(test::temporaries(run.durable).empty());
}

TEST_CASE("the durable copy records its source, time, bytes and checks") {
  Run run;
  Checkpointer ck(run.options(3, {.verify = Verify::full}));
  run.save(ck, 4);
  ck.wait_durable();
  const CopyRecord rec = read_copy_record(posix_file_system(), run.durable + "/step-0000000004");
  const auto src = CheckpointReader::open(posix_file_system(), run.local + "/step-0000000004");
  std::uint64_t bytes = 0, chunks = 0;
  for (const auto& s : src.manifest().shards) bytes += s.size, chunks += s.chunk_xxh3.size();
  CHECK(rec.step == 4);
  CHECK(rec.source_root == run.local);
  CHECK(rec.source_dir == "step-0000000004");
  CHECK(rec.bytes == bytes);
  CHECK(rec.xxh3_chunks_verified == chunks);
  CHECK(rec.sha256_verified);
  CHECK(ck.stats().durable.bytes == bytes);
}

TEST_CASE("a failed durable copy is retried, never reaches training, and leaves no temporary") {
  Run run;
  FaultInjectionFileSystem durable_fs(posix_file_system());
  durable_fs.fail_nth(FaultInjectionFileSystem::Op::write, 0, EIO);
  Checkpointer ck(run.options(2, {.fs = &durable_fs, .retry_backoff = 1ms}));
  CHECK_NOTHROW(run.save(ck, 1));
  ck.wait_durable();
  CHECK_NOTHROW(run.save(ck, 2));  // the local tier went on regardless
  ck.wait_durable();
  const auto st = ck.stats().durable;
  CHECK(st.failures == 1);
  CHECK(st.last_error_code == Errc::io_error);
  CHECK(st.last_failed_step == 1u);
  CHECK(st.copies == 2);  // step 1 on its second attempt, then step 2
  CHECK(st.given_up == 0);
  CHECK(ck.stats().commits == 2);
  CHECK(ck.stats().failures == 0);
  CHECK(test::step_dirs(run.durable) == std::vector<std::string>{"step-0000000001", "step-0000000002"});
  CHECK(test::temporaries(run.durable).empty());
  check_same(run.local, run.durable, "step-0000000002");
}

TEST_CASE("a step whose copy keeps failing is given up and the next commit is copied") {
  Run run;
  FaultInjectionFileSystem durable_fs(posix_file_system());
  durable_fs.fail_nth(FaultInjectionFileSystem::Op::sync, 0, ENOSPC);
  Checkpointer ck(run.options(2, {.fs = &durable_fs, .max_attempts = 1}));
  run.save(ck, 1);
  ck.wait_durable();
  auto st = ck.stats().durable;
  CHECK(st.failures == 1);
  CHECK(st.given_up == 1);
  CHECK(st.last_error_code == Errc::no_space);
  CHECK_FALSE(st.last_step.has_value());
  CHECK(test::step_dirs(run.durable).empty());
  CHECK(test::temporaries(run.durable).empty());
  run.save(ck, 2);
  ck.wait_durable();
  st = ck.stats().durable;
  CHECK(st.copies == 1);
  CHECK(st.last_step == 2u);
  CHECK(read_latest(posix_file_system(), run.durable) == "step-0000000002");
  CHECK(test::step_dirs(run.local) == std::vector<std::string>{"step-0000000001", "step-0000000002"});
}

TEST_CASE("a durable root that cannot exist never breaks training or the local tier") {
  Run run;
  std::ofstream(run.dir / "not-a-dir") << "x";
  Checkpointer ck(run.options(2, {.root = (run.dir / "not-a-dir" / "durable").string(), .retry_backoff = 1ms}));
  for (std::uint64_t s = 1; s <= 3; ++s) {
    CHECK_NOTHROW(run.save(ck, s));
    ck.wait_durable();
  }
  const auto st = ck.stats().durable;
  CHECK(st.copies == 0);
  CHECK(st.failures == 9);  // 3 attempts per step
  CHECK(st.given_up == 3);
  CHECK(st.last_error_code == Errc::io_error);
  CHECK(ck.stats().commits == 3);
  CHECK(test::step_dirs(run.local) == std::vector<std::string>{"step-0000000002", "step-0000000003"});
  CheckpointReader::open(posix_file_system(), run.local + "/step-0000000003").verify(Verify::full);
}

TEST_CASE("latest wins: commits during a copy replace the pending step, and local rotation keeps the step being copied") {
  Run run;
  FaultInjectionFileSystem durable_fs(posix_file_system());
  durable_fs.hold_syncs(true);
  Checkpointer ck(run.options(1, {.fs = &durable_fs}));
  run.save(ck, 1);
  until_held(durable_fs);  // the copy of step 1 is running, blocked in fsync
  for (std::uint64_t s = 2; s <= 4; ++s) run.save(ck, s);  // local saves are not held back
  // keep_last 1, but step 1 is being copied: rotation keeps it; 2 and 3 are gone.
  CHECK(test::step_dirs(run.local) == std::vector<std::string>{"step-0000000001", "step-0000000004"});
  auto st = ck.stats().durable;
  CHECK(st.submitted == 4);
  CHECK(st.superseded == 2);  // 2 by 3, 3 by 4
  CHECK(st.copies == 0);
  durable_fs.hold_syncs(false);
  ck.wait_durable();
  st = ck.stats().durable;
  CHECK(st.copies == 2);
  CHECK(st.last_step == 4u);
  CHECK(test::step_dirs(run.durable) == std::vector<std::string>{"step-0000000001", "step-0000000004"});
  check_same(run.local, run.durable, "step-0000000004");
  run.save(ck, 5);  // nothing pinned any more: step 1 rotates away locally
  CHECK(test::step_dirs(run.local) == std::vector<std::string>{"step-0000000005"});
}

TEST_CASE("the checkpointer's destructor finishes the pending copy") {
  Run run;
  {
    Checkpointer ck(run.options(2, {}));
    run.save(ck, 1);
    run.save(ck, 2);
  }
  CHECK(read_latest(posix_file_system(), run.durable) == "step-0000000002");
  check_same(run.local, run.durable, "step-0000000002");
}

TEST_CASE("a durable tier on the local root itself is refused") {
  Run run;
  try {
    Checkpointer ck(run.options(2, {.root = run.local}));
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
  }
  CHECK_THROWS_AS(Checkpointer(run.options(2, {.max_attempts = 0})), Error);
}

TEST_CASE("a tier's own cadence: only steps that are multiples of `every` are copied, and copy_to_durable hands over one off it") {
  Run run;
  Checkpointer ck(run.options(2, {.keep_last = 10, .every = 3}));
  for (std::uint64_t s = 1; s <= 7; ++s) {
    run.save(ck, s);
    ck.wait_durable();  // one copy at a time: none superseded, whatever the build's speed
  }
  CHECK(test::step_dirs(run.durable) == std::vector<std::string>{"step-0000000003", "step-0000000006"});
  CHECK(ck.stats().durable.submitted == 2);
  CHECK(ck.durable_latest() == std::optional<std::uint64_t>(6));
  // Local rotation kept 2; the last one reaches the durable tier on demand.
  ck.copy_to_durable(7);
  ck.wait_durable();
  CHECK(ck.durable_latest() == std::optional<std::uint64_t>(7));
  check_same(run.local, run.durable, checkpoint_dir_name(7));
  const Error zero = test::expect_error([&] { Checkpointer bad(run.options(2, {.root = (run.dir / "other").string(), .every = 0})); });
  CHECK(zero.code() == Errc::invalid_argument);
  CHECK(std::string(zero.what()).find("DurableTierOptions::every") != std::string::npos);
}

TEST_CASE("three levels: the root, a local tier and the durable tier each keep their own cadence and rotation, and copy_to_durable fills what each passed over") {
  Run run;
  const std::string local_tier = (run.dir / "disk").string();
  CheckpointerOptions o = run.options(2, {.keep_last = 10, .every = 3});
  o.local_tier = DurableTierOptions{.root = local_tier, .keep_last = 2, .every = 2};
  Checkpointer ck(o);
  for (std::uint64_t s = 1; s <= 7; ++s) {
    run.save(ck, s);
    ck.wait_durable();  // one copy at a time: none superseded, whatever the build's speed
  }
  CHECK(test::step_dirs(local_tier) == std::vector<std::string>{"step-0000000004", "step-0000000006"});
  CHECK(test::step_dirs(run.durable) == std::vector<std::string>{"step-0000000003", "step-0000000006"});
  CHECK(ck.stats().local_tier.copies == 3);
  CHECK(ck.stats().durable.copies == 2);
  ck.copy_to_durable(7);  // off both cadences: both copy it
  ck.wait_durable();
  check_same(run.local, local_tier, checkpoint_dir_name(7));
  check_same(run.local, run.durable, checkpoint_dir_name(7));
  ck.copy_to_durable(6);  // both took 6 already: nothing is copied again
  ck.wait_durable();
  CHECK(ck.stats().local_tier.failures == 0);
  CHECK(ck.stats().durable.failures == 0);
  CHECK(ck.stats().local_tier.copies == 4);
  // A local tier on the durable tier's root, or of another kind than a directory, is refused.
  CheckpointerOptions same = run.options(2, {.root = (run.dir / "d2").string()});
  same.root = (run.dir / "l2").string();
  same.local_tier = DurableTierOptions{.root = (run.dir / "d2").string()};
  CHECK(test::expect_error([&] { Checkpointer bad(same); }).code() == Errc::invalid_argument);
  same.local_tier = DurableTierOptions{.root = "s3://bucket/prefix"};
  const Error kind = test::expect_error([&] { Checkpointer bad(same); });
  CHECK(kind.code() == Errc::invalid_argument);
  CHECK(std::string(kind.what()).find("local_tier: a directory") != std::string::npos);
}
