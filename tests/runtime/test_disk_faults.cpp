// SPDX-License-Identifier: Apache-2.0
// A failing disk fails the save, not the run: every rank's handle reports the typed error,
// the temporary is removed, earlier checkpoints still verify, and the next save succeeds.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "runtime/runtime_fixture.hpp"
#include "support/fuse_mount.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kN = 150000;  // floats per rank: 600 KB, ten 64 KiB writes per shard

bool no_temporaries(const fs::path& root) {
  for (const auto& e : fs::directory_iterator(root))
    if (is_temporary_name(e.path().filename().string())) return false;
  return true;
}

// Saves `step` on every rank and waits for the rotation after it; returns the error message
// each rank saw ("" on success). A successful save must have been written by `writer`.
std::vector<std::string> save_all(Checkpointer& c, std::vector<test::RankState>& states, std::uint64_t step,
                                  std::string_view writer) {
  const int world = static_cast<int>(states.size());
  std::vector<std::string> errors(static_cast<std::size_t>(world)), used(static_cast<std::size_t>(world));
  test::run_ranks(world, [&](int r) {
    states[static_cast<std::size_t>(r)].set(r, step);
    try {
      used[static_cast<std::size_t>(r)] = c.save(r, step, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, step)).wait().backend;
    } catch (const Error& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  c.wait_all();
  for (int r = 0; r < world; ++r)
    if (errors[static_cast<std::size_t>(r)].empty()) CHECK(used[static_cast<std::size_t>(r)] == writer);
  return errors;
}

}  // namespace

TEST_CASE("an injected EIO, short write or failed fsync at every write of an async save fails only that save") {
  for (auto backend : test::backends()) {
    CAPTURE(test::backend_label(backend));
    test::TempDir dir;
    FaultInjectionFileSystem faulty(posix_file_system());
    const int world = 2;
    std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
    Checkpointer c({.root = dir.path().string(), .world_size = world, .keep_last = 2, .backend = backend,
                    .chunk_size = 1 << 16, .fs = &faulty});
    REQUIRE(save_all(c, states, 1, test::backend_label(backend)) == std::vector<std::string>(2));
    faulty.reset();
    REQUIRE(save_all(c, states, 2, test::backend_label(backend)) == std::vector<std::string>(2));
    const std::uint64_t writes = faulty.count(FaultInjectionFileSystem::Op::write);
    const std::uint64_t syncs = faulty.count(FaultInjectionFileSystem::Op::sync);
    REQUIRE(writes > 16);
    std::uint64_t step = 3, failed = 0;
    using Op = FaultInjectionFileSystem::Op;
    struct Fault {
      const char* what;
      std::uint64_t count;
      std::function<void(std::uint64_t)> arm;
    };
    const std::vector<Fault> faults = {
        {"EIO on write", writes, [&](std::uint64_t i) { faulty.fail_nth(Op::write, i, EIO); }},
        {"short write", writes, [&](std::uint64_t i) { faulty.short_write_nth(i); }},
        {"failed fsync", syncs, [&](std::uint64_t i) { faulty.fail_nth(Op::sync, i, EIO); }},
    };
    for (const auto& f : faults) {
      for (std::uint64_t i = 0; i < f.count; ++i) {
        CAPTURE(f.what);
        CAPTURE(i);
        faulty.reset();
        f.arm(i);
        const auto errors = save_all(c, states, step, test::backend_label(backend));
        // The fault may hit the small `latest` file after the commit point; every other
        // write belongs to the checkpoint, which then fails on every rank alike.
        if (!errors[0].empty()) {
          ++failed;
          CHECK(errors[0].find("I/O error") == 0);
          CHECK(errors[0] == errors[1]);
        }
        CHECK(no_temporaries(dir.path()));
        // Training goes on: the next interval saves and verifies.
        faulty.reset();
        ++step;
        REQUIRE(save_all(c, states, step, test::backend_label(backend)) == std::vector<std::string>(2));
        auto opened = open_latest(posix_file_system(), dir.path().string(), {.expected_world_size = world});
        CHECK(opened.name == checkpoint_dir_name(step));
        opened.reader.verify(Verify::full);
        ++step;
      }
    }
    MESSAGE(test::backend_label(backend) << ": " << failed << " injected faults failed their save, each recovered at the next one");
    CHECK(failed >= writes);
  }
}

TEST_CASE("a real full disk fails the save with no_space and the run saves again once space is back") {
  test::TempDir dir;
  const test::SmallTmpfs disk(dir, "size=3m");
  const std::string& mnt = disk.path();
  const std::string root = mnt + "/root";
  for (auto backend : test::backends()) {
    CAPTURE(test::backend_label(backend));
    fs::remove_all(root);
    const int world = 2;
    std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};  // 1.2 MB a checkpoint
    Checkpointer c({.root = root, .world_size = world, .keep_last = 1, .backend = backend});
    REQUIRE(save_all(c, states, 1, test::backend_label(backend)) == std::vector<std::string>(2));
    // Fill the disk so the next checkpoint cannot fit next to the kept one.
    {
      std::FILE* f = std::fopen((mnt + "/ballast").c_str(), "wb");
      std::vector<char> mb(1 << 20, 'b');
      for (int i = 0; i < 1; ++i) std::fwrite(mb.data(), 1, mb.size(), f);
      std::fclose(f);
    }
    const auto errors = save_all(c, states, 2, test::backend_label(backend));
    REQUIRE_FALSE(errors[0].empty());
    CHECK(errors[0].find("no space left") == 0);
    CHECK(errors[0] == errors[1]);
    CHECK(no_temporaries(root));
    auto opened = open_latest(posix_file_system(), root, {.expected_world_size = world});
    CHECK(opened.name == "step-0000000001");
    opened.reader.verify(Verify::full);
    fs::remove(mnt + "/ballast");
    REQUIRE(save_all(c, states, 3, test::backend_label(backend)) == std::vector<std::string>(2));
    CHECK(open_latest(posix_file_system(), root).name == "step-0000000003");
  }
}

TEST_CASE("the writer a save reports is the one that moved its bytes: io_uring on real files, posix for files without a descriptor") {
  if (!detail::io_uring_available(nullptr)) {
    MESSAGE("skipped: io_uring unavailable here");
    std::exit(77);
  }
  const int world = 2;
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  {
    // Fault injection wraps real files: their descriptors reach the ring.
    test::TempDir dir;
    FaultInjectionFileSystem faulty(posix_file_system());
    Checkpointer c({.root = dir.path().string(), .world_size = world, .backend = WriterBackend::io_uring, .fs = &faulty});
    CHECK(save_all(c, states, 1, "io_uring") == std::vector<std::string>(2));
    CHECK(faulty.count(FaultInjectionFileSystem::Op::write) > 0);  // every ring write passed the fault hook
  }
  {
    MemoryFileSystem mem;
    Checkpointer c({.root = "/root", .world_size = world, .backend = WriterBackend::io_uring, .direct_io = false, .fs = &mem});
    CHECK(c.backend_name() == "io_uring");
    CHECK(save_all(c, states, 1, "posix") == std::vector<std::string>(2));
    CHECK(open_latest(mem, "/root").name == "step-0000000001");
  }
}

TEST_CASE("a root on a FUSE file system that takes O_DIRECT opens and refuses the writes is written buffered: each shard once more, one log line per file") {
  using Kind = test::FuseMount::Kind;
  const int world = 2;
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  for (const Kind kind : {Kind::refuse_direct_io, Kind::refuse_direct_open}) {
    for (const WriterBackend backend : test::backends()) {
      CAPTURE(std::string(test::kind_name(kind)));
      CAPTURE(std::string(test::backend_label(backend)));
      test::TempDir dir;
      fs::create_directory(dir / "src");
      const test::FuseMount mnt(dir / "src", dir / "mnt", kind);
      const std::string root = (mnt.path() / "root").string();
      test::LogCapture log;
      {
        Checkpointer c({.root = root, .world_size = world, .backend = backend, .direct_io = true});
        REQUIRE(save_all(c, states, 1, test::backend_label(backend)) == std::vector<std::string>(2));
      }
      // Each shard's refusal and its buffered rewrite, logged once; a refused open is the
      // open's own fallback, silent as before.
      const auto lines = log.matching({"write: ", "the file system took O_DIRECT at open but refused a write", "writing the file again, buffered"});
      for (int r = 0; r < world; ++r) {
        const std::string shard = shard_file_name(r, world);
        const auto about = log.matching({"write: ", shard + ": the file system took O_DIRECT"});
        CHECK(about.size() == (kind == Kind::refuse_direct_io ? 1u : 0u));
      }
      CHECK(lines.size() == (kind == Kind::refuse_direct_io ? 2u : 0u));
      // What was written through the mount is the state, whole (read from the source, under FUSE).
      const auto opened = open_latest(posix_file_system(), (dir / "src" / "root").string(), {.expected_world_size = world});
      CHECK(opened.name == "step-0000000001");
      opened.reader.verify(Verify::full);
      for (int r = 0; r < world; ++r) {
        const auto master = opened.reader.read_tensor("master", r, Verify::full);
        const auto& want = states[static_cast<std::size_t>(r)].master;
        REQUIRE(master.size() == want.size() * sizeof(float));
        CHECK(std::memcmp(master.data(), want.data(), master.size()) == 0);
      }
    }
  }
}

TEST_CASE("a full disk frees itself: with K=3 on a small tmpfs, pre-save rotation lets saves succeed again and latest advances") {
  test::TempDir dir;
  const test::SmallTmpfs disk(dir, "size=6m");
  const std::string root = disk.path() + "/root";
  for (auto backend : test::backends()) {
    CAPTURE(test::backend_label(backend));
    fs::remove_all(root);
    fs::remove(disk.path() + "/ballast");
    const int world = 2;
    std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};  // 1.2 MB a checkpoint
    std::vector<std::string> logged;
    std::mutex log_mu;
    auto previous = set_log_sink([&](std::string_view l) {
      std::lock_guard lk(log_mu);
      logged.emplace_back(l);
    });
    {
      Checkpointer c({.root = root, .world_size = world, .keep_last = 3, .backend = backend});
      for (std::uint64_t s = 1; s <= 3; ++s) REQUIRE(save_all(c, states, s, test::backend_label(backend)) == std::vector<std::string>(2));
      // Fill the disk: about half a checkpoint left free.
      {
        const std::uint64_t free = *posix_file_system().free_space(disk.path());
        REQUIRE(free > 700000);
        std::FILE* f = std::fopen((disk.path() + "/ballast").c_str(), "wb");
        const std::vector<char> bytes(free - 600000, 'b');
        REQUIRE(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
        std::fclose(f);
      }
      REQUIRE(*posix_file_system().free_space(disk.path()) < 1200000);
      // Each save now first removes the oldest checkpoint, then commits; `latest` advances.
      for (std::uint64_t s = 4; s <= 5; ++s) {
        CAPTURE(s);
        CHECK(save_all(c, states, s, test::backend_label(backend)) == std::vector<std::string>(2));
        CHECK(read_latest(posix_file_system(), root) == checkpoint_dir_name(s));
        CHECK(test::step_dirs(root) == std::vector<std::string>{checkpoint_dir_name(s - 2), checkpoint_dir_name(s - 1), checkpoint_dir_name(s)});
      }
      auto st = c.stats();
      CHECK(st.early_rotations == 2);
      CHECK(st.early_rotated == 2);
      CHECK(st.rotated == 0);
      // Space back: rotation keeps the last 3 after each commit, as without a full disk.
      fs::remove(disk.path() + "/ballast");
      REQUIRE(save_all(c, states, 6, test::backend_label(backend)) == std::vector<std::string>(2));
      CHECK(test::step_dirs(root) == std::vector<std::string>{checkpoint_dir_name(4), checkpoint_dir_name(5), checkpoint_dir_name(6)});
      st = c.stats();
      CHECK(st.early_rotations == 2);
      CHECK(st.rotated == 1);
      CHECK(st.commits == 6);
    }
    set_log_sink(previous);
    int said = 0;
    for (const auto& l : logged) said += l.find("disk nearly full") != std::string::npos && l.find("removing " + root + "/step-") != std::string::npos;
    CHECK(said == 2);
    for (const auto& c : list_checkpoints(posix_file_system(), root, Verify::full)) CHECK(c.state == CheckpointState::complete);
  }
}

TEST_CASE("consecutive failed saves are counted and logged, a commit resets the count, and max_consecutive_failures stops the loop") {
  test::TempDir dir;
  FaultInjectionFileSystem faulty(posix_file_system());
  const int world = 2;
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  std::vector<std::string> logged;
  std::mutex log_mu;
  auto previous = set_log_sink([&](std::string_view l) {
    std::lock_guard lk(log_mu);
    logged.emplace_back(l);
  });
  auto failing_save = [&](Checkpointer& c, std::uint64_t step) {
    faulty.fail_nth(FaultInjectionFileSystem::Op::write, 0, EIO);
    const auto errors = save_all(c, states, step, "posix");
    faulty.reset();
    return errors;
  };
  {
    Checkpointer c({.root = (dir / "a").string(), .world_size = world, .backend = WriterBackend::posix, .fs = &faulty});
    REQUIRE(save_all(c, states, 1, "posix") == std::vector<std::string>(2));
    CHECK(c.stats().consecutive_failures == 0);
    for (std::uint64_t s = 2; s <= 3; ++s) {
      REQUIRE_FALSE(failing_save(c, s)[0].empty());
      CHECK(c.stats().consecutive_failures == s - 1);
      CHECK(c.stats().last_failure.find("I/O error") != std::string::npos);
    }
    REQUIRE(save_all(c, states, 4, "posix") == std::vector<std::string>(2));
    CHECK(c.stats().consecutive_failures == 0);
    CHECK(c.stats().failures == 2);
  }
  {
    std::lock_guard lk(log_mu);
    int first = 0, second = 0;
    for (const auto& l : logged) {
      first += l.find("save of step 2 failed (1 in a row since the last commit): ") != std::string::npos;
      second += l.find("save of step 3 failed (2 in a row since the last commit): ") != std::string::npos;
    }
    CHECK(first == 1);
    CHECK(second == 1);
  }
  {
    const std::string root = (dir / "b").string();
    Checkpointer c({.root = root, .world_size = world, .backend = WriterBackend::posix, .fs = &faulty, .max_consecutive_failures = 2});
    REQUIRE(save_all(c, states, 1, "posix") == std::vector<std::string>(2));
    REQUIRE_FALSE(failing_save(c, 2)[0].empty());
    REQUIRE_FALSE(failing_save(c, 3)[0].empty());
    const std::uint64_t mutations = faulty.mutations();
    std::vector<std::optional<Error>> refused(world);
    test::run_ranks(world, [&](int r) {
      try {
        c.save(r, 4, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, 4));
      } catch (const Error& e) {
        refused[static_cast<std::size_t>(r)] = e;
      }
    });
    c.wait_all();
    for (const auto& e : refused) {
      REQUIRE(e.has_value());
      CHECK(e->code() == Errc::aborted);
      CHECK(e->detail().find("2 saves in a row failed (max_consecutive_failures); the last: ") == 0);
      CHECK(e->detail().find("I/O error") != std::string::npos);
      CHECK(e->expected() == "fewer than 2");
      CHECK(e->actual() == "2");
    }
    CHECK(faulty.mutations() == mutations);  // nothing was written for the refused step
    CHECK(read_latest(posix_file_system(), root) == checkpoint_dir_name(1));
    CHECK(test::temporaries(root).empty());
  }
  set_log_sink(previous);
}

TEST_CASE("cancel() stops a save mid-write: no further write starts, every handle fails with aborted, the temporary is removed, latest stays") {
  for (const WriterBackend backend : test::backends()) {
    CAPTURE(test::backend_label(backend));
    test::TempDir dir;
    FaultInjectionFileSystem faulty(posix_file_system());
    const std::string root = (dir / "r").string();
    const int world = 2;
    std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
    // 4 KiB pieces: each shard takes about 150 writes, of which at most queue_depth are in flight.
    Checkpointer c({.root = root, .world_size = world, .backend = backend, .chunk_size = 4096, .fs = &faulty});
    REQUIRE(save_all(c, states, 1, test::backend_label(backend)) == std::vector<std::string>(2));
    CHECK_FALSE(c.cancel("nothing is in flight").has_value());

    faulty.reset();
    faulty.hold_writes(true);
    std::vector<SaveHandle> handles(world);
    test::run_ranks(world, [&](int r) {
      states[static_cast<std::size_t>(r)].set(r, 2);
      handles[static_cast<std::size_t>(r)] = c.save(r, 2, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, 2));
    });
    while (faulty.held_writes() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(c.cancel("out of time") == std::optional<std::uint64_t>(2));
    CHECK(c.cancel("a second time") == std::optional<std::uint64_t>(2));  // the same step, nothing more
    faulty.hold_writes(false);
    for (auto& h : handles) {
      try {
        h.wait();
        FAIL("the cancelled save committed");
      } catch (const Error& e) {
        CHECK(e.code() == Errc::aborted);
        CHECK(e.detail() == "save of step 2 cancelled: out of time");
        CHECK(e.file().find("/.tmp-step-0000000002") != std::string::npos);
      }
    }
    c.wait_all();
    const std::uint64_t pieces_per_shard = (kN * sizeof(float)) / 4096;
    CHECK(faulty.count(FaultInjectionFileSystem::Op::write) < pieces_per_shard);  // of 2 x ~150
    CHECK(read_latest(posix_file_system(), root) == checkpoint_dir_name(1));
    CHECK(no_temporaries(root));
    CHECK(c.stats().consecutive_failures == 1);
    CheckpointReader::open(posix_file_system(), join_path(root, checkpoint_dir_name(1))).verify(Verify::full);
    // The next save is unaffected.
    REQUIRE(save_all(c, states, 3, test::backend_label(backend)) == std::vector<std::string>(2));
    CHECK(read_latest(posix_file_system(), root) == checkpoint_dir_name(3));
  }
}
