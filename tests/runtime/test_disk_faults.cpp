// A failing disk fails the save, not the run: every rank's handle reports the typed error,
// the temporary is removed, earlier checkpoints still verify, and the next save succeeds.
#include <doctest/doctest.h>

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "ckpt/core/error.hpp"
#include "ckpt/io/layout.hpp"
#include "ckpt/io/reader.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "runtime/runtime_fixture.hpp"

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
  if (::geteuid() != 0) {
    MESSAGE("skipped: mounting a small tmpfs needs root");
    std::exit(77);
  }
  test::TempDir dir;
  const std::string mnt = (dir / "small").string();
  fs::create_directory(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=3m") != 0) {
    MESSAGE("skipped: cannot mount tmpfs here: " << std::strerror(errno));
    std::exit(77);
  }
  struct Unmount {
    std::string m;
    ~Unmount() { ::umount2(m.c_str(), MNT_DETACH); }
  } unmount{mnt};
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
