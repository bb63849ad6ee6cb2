// SPDX-License-Identifier: Apache-2.0
// Power loss: everything not made durable is taken away (FaultInjectionFileSystem::
// simulate_power_loss), then the root is reopened as after a reboot. Only checkpoints whose
// commit completed may be visible, and `latest` must name one that loads completely.
#include <doctest/doctest.h>

#include <filesystem>

#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "io/io_fixture.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {

// After the cut: every complete-looking checkpoint verifies fully, latest names one of
// `allowed`, and its bytes are exactly what was saved for that step.
std::string check_after_power_loss(const std::string& root, const std::map<std::string, const test::Fixture*>& allowed) {
  for (const auto& info : list_checkpoints(posix_file_system(), root, Verify::full)) {
    if (info.state == CheckpointState::in_progress) continue;  // a temporary: never loaded
    CHECK_MESSAGE(info.state == CheckpointState::complete, info.name << ": " << info.error);
  }
  auto opened = open_latest(posix_file_system(), root);
  REQUIRE(allowed.count(opened.name));
  const test::Fixture& fx = *allowed.at(opened.name);
  for (int r = 0; r < opened.reader.manifest().world_size; ++r) {
    const auto shard = opened.reader.load_shard(r, Verify::full);
    for (const auto& t : fx.request.ranks[static_cast<std::size_t>(r)].tensors) {
      const auto& got = shard.tensor(t.name);
      CHECK(std::equal(got.data.begin(), got.data.end(), t.data.begin(), t.data.end()));
    }
  }
  return opened.name;
}

void reset_to_step1(const fs::path& root) {
  prepare_root(posix_file_system(), RootLock(posix_file_system(), root.string()));
  if (fs::exists(root / "step-0000000002")) fs::remove_all(root / "step-0000000002");
  write_latest(posix_file_system(), root.string(), "step-0000000001");
}

}  // namespace

TEST_CASE("a power cut after any operation of a synchronous save leaves only durable checkpoints") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture first(2, 1), second(2, 2);
  save_checkpoint_sync(posix_file_system(), root, first.request);
  const std::uint64_t total = test::mutations_of_one_save(first.request);
  int saw_new = 0, saw_old = 0;
  for (std::uint64_t k = 0; k <= total; ++k) {
    CAPTURE(k);
    FaultInjectionFileSystem faulty(posix_file_system());
    faulty.crash_after(k);
    try {
      save_checkpoint_sync(faulty, root, second.request);
    } catch (const Error& e) {
      CHECK(e.code() == Errc::aborted);
    }
    faulty.simulate_power_loss();
    const std::string live = check_after_power_loss(root, {{"step-0000000001", &first}, {"step-0000000002", &second}});
    (live == "step-0000000002" ? saw_new : saw_old)++;
    // A save that completed before the cut (k == total) must survive it.
    if (k == total) CHECK(live == "step-0000000002");
    reset_to_step1(dir.path());
  }
  CHECK(saw_old > 0);
  CHECK(saw_new > 0);
}

TEST_CASE("a power cut during asynchronous saves leaves only durable checkpoints, on every writer") {
  for (auto backend : {WriterBackend::posix, WriterBackend::io_uring}) {
    test::TempDir dir;
    const std::string root = dir.path().string();
    test::Fixture first(2, 1), second(2, 2);
    save_checkpoint_sync(posix_file_system(), root, first.request);
    std::uint64_t total = 0;
    {
      FaultInjectionFileSystem counter(posix_file_system());
      test::TempDir probe;
      Checkpointer c({.root = probe.path().string(), .world_size = 2, .backend = backend, .fs = &counter});
      for (int r = 0; r < 2; ++r) c.save(r, 2, second.request.ranks[static_cast<std::size_t>(r)].tensors, {});
      c.wait_all();
      total = counter.mutations();
    }
    for (std::uint64_t k = 0; k <= total; ++k) {
      CAPTURE(k);
      FaultInjectionFileSystem faulty(posix_file_system());
      {
        Checkpointer c({.root = root, .world_size = 2, .backend = backend, .fs = &faulty});
        faulty.crash_after(k);
        std::vector<SaveHandle> handles;
        for (int r = 0; r < 2; ++r) handles.push_back(c.save(r, 2, second.request.ranks[static_cast<std::size_t>(r)].tensors, {}));
        for (auto& h : handles) {
          try {
            h.wait();
          } catch (const Error&) {
            // the simulated crash fails the save; what matters is what the disk holds
          }
        }
        faulty.simulate_power_loss();
      }
      check_after_power_loss(root, {{"step-0000000001", &first}, {"step-0000000002", &second}});
      reset_to_step1(dir.path());
    }
  }
}

TEST_CASE("power-loss simulation takes away unsynced data and entries but keeps synced ones") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  FaultInjectionFileSystem fsim(posix_file_system());
  const std::string payload(10000, 'x');
  const auto bytes = std::as_bytes(std::span(payload.data(), payload.size()));
  fsim.create_dir(root + "/d");
  fsim.sync_dir(root);
  auto durable = fsim.create(root + "/d/durable", {});
  durable->write_at(0, bytes);
  durable->sync();
  durable->write_at(10000, bytes);  // written after the fsync: lost
  fsim.sync_dir(root + "/d");
  auto lost = fsim.create(root + "/d/lost", {});  // its directory entry is never synced
  lost->write_at(0, bytes);
  lost->sync();
  test::write_all(dir / "old", {'o', 'l', 'd'});
  auto fresh = fsim.create(root + "/new", {});
  fresh->write_at(0, bytes.first(3));
  fresh->sync();
  fsim.sync_dir(root);
  fsim.rename(root + "/new", root + "/old");  // replaces old, never made durable
  const auto undone = fsim.simulate_power_loss();
  CHECK(fs::file_size(dir / "d" / "durable") == 10000);
  CHECK_FALSE(fs::exists(dir / "d" / "lost"));
  CHECK(test::read_all(dir / "old") == std::vector<std::uint8_t>{'o', 'l', 'd'});
  CHECK(fs::file_size(dir / "new") == 3);
  CHECK(undone.size() == 3);
  CHECK_THROWS_AS(fsim.create(root + "/after", {}), Error);  // nothing reaches the disk after the cut
}
