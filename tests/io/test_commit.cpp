// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cerrno>
#include <filesystem>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "io/io_fixture.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {
// Every byte of every tensor of every rank equals the fixture's payload.
void check_equal(const CheckpointReader& r, const test::Fixture& fx) {
  const auto& req = fx.request;
  REQUIRE(r.manifest().world_size == static_cast<int>(req.ranks.size()));
  for (int rank = 0; rank < r.manifest().world_size; ++rank) {
    const LoadedShard s = r.load_shard(rank, Verify::full);
    const auto& rs = req.ranks[static_cast<std::size_t>(rank)];
    REQUIRE(s.tensors.size() == rs.tensors.size());
    for (const auto& t : rs.tensors) {
      const LoadedTensor& lt = s.tensor(t.name);
      CHECK(lt.dtype == t.dtype);
      CHECK(lt.shape == t.shape);
      REQUIRE(lt.data.size() == t.data.size());
      CHECK(std::equal(lt.data.begin(), lt.data.end(), t.data.begin()));
    }
    CHECK(s.record.param_shard_offset == rs.param_shard_offset);
    CHECK(s.record.metadata == rs.metadata);
  }
}

using test::names_in;
}  // namespace

TEST_CASE("round trip is byte-equal for every dtype, empty and odd-sized tensors") {
  test::TempDir dir;
  for (int world : {1, 3}) {
    const std::string root = (dir / ("w" + std::to_string(world))).string();
    test::Fixture fx(world, 7);
    const Manifest m = save_checkpoint_sync(posix_file_system(), root, fx.request);
    CHECK(m.shards.size() == static_cast<std::size_t>(world));
    auto opened = open_latest(posix_file_system(), root, {.expected_world_size = world});
    CHECK(opened.name == "step-0000000007");
    CHECK(json_of(opened.reader.manifest().training).at("lr").as_double() == 0.001);
    check_equal(opened.reader, fx);
    CHECK(names_in(root) == std::vector<std::string>{".lock", "latest", "step-0000000007"});
  }
}

TEST_CASE("shard files start their data 4096-aligned and parse as safetensors") {
  test::TempDir dir;
  test::Fixture fx(1, 1);
  const Manifest m = save_checkpoint_sync(posix_file_system(), dir.path().string(), fx.request);
  const auto bytes = test::read_all(dir / "step-0000000001" / m.shards[0].path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  CHECK((8 + n) % 4096 == 0);
  CHECK(bytes[8] == '{');
  for (const auto& t : m.tensors) CHECK(t.begin >= 8 + n);
}

TEST_CASE("manifest sha256 equals what sha256sum prints for the shard") {
  test::TempDir dir;
  test::Fixture fx(2, 3);
  const Manifest m = save_checkpoint_sync(posix_file_system(), dir.path().string(), fx.request);
  for (const auto& s : m.shards) {
    int status = 0;
    const std::string out = test::run_command("sha256sum '" + (dir / "step-0000000003" / s.path).string() + "'", &status);
    REQUIRE(status == 0);
    CHECK(out.substr(0, 64) == s.sha256);
  }
}

TEST_CASE("saving a step twice is refused and keeps the first checkpoint") {
  test::TempDir dir;
  test::Fixture fx(1, 5);
  save_checkpoint_sync(posix_file_system(), dir.path().string(), fx.request);
  test::Fixture other(1, 5);
  other.payload[0].blobs[2][0] ^= 1;
  try {
    save_checkpoint_sync(posix_file_system(), dir.path().string(), other.request);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
  }
  check_equal(open_latest(posix_file_system(), dir.path().string()).reader, fx);
  CHECK(names_in(dir.path()) == std::vector<std::string>{".lock", "latest", "step-0000000005"});
}

TEST_CASE("a crash at every step of the commit sequence leaves a loadable checkpoint that latest names") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture first(2, 1), second(2, 2);
  save_checkpoint_sync(posix_file_system(), root, first.request);

  // Count the mutating operations of one full save, then crash after each prefix of them.
  const std::uint64_t total = test::mutations_of_one_save(first.request);
  REQUIRE(total > 10);
  for (std::uint64_t k = 0; k <= total; ++k) {
    CAPTURE(k);
    FaultInjectionFileSystem faulty(posix_file_system());
    faulty.crash_after(k);
    bool saved = false;
    try {
      save_checkpoint_sync(faulty, root, second.request);
      saved = true;
    } catch (const Error& e) {
      CHECK(e.code() == Errc::aborted);
    }
    CHECK(saved == (k == total));
    // What a user sees after the crash: latest names a checkpoint that loads completely.
    auto opened = open_latest(posix_file_system(), root, {.expected_world_size = 2});
    if (opened.name == "step-0000000001") {
      check_equal(opened.reader, first);
    } else {
      CHECK(opened.name == "step-0000000002");
      check_equal(opened.reader, second);
    }
    // The next writer cleans up temporaries; no temporary is ever listed as complete.
    for (const auto& info : list_checkpoints(posix_file_system(), root))
      if (info.state == CheckpointState::in_progress) CHECK(is_temporary_name(info.name));
    prepare_root(posix_file_system(), RootLock(posix_file_system(), root));
    for (const auto& n : names_in(root)) CHECK_FALSE(is_temporary_name(n));
    // Undo a completed step-2 so the next iteration starts from the same state.
    if (fs::exists(dir / "step-0000000002")) {
      write_latest(posix_file_system(), root, "step-0000000001");
      fs::remove_all(dir / "step-0000000002");
    }
  }
}

TEST_CASE("an I/O error at any write or fsync fails the save and keeps the previous checkpoint") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture first(2, 1), second(2, 2, /*chunk=*/4096);
  save_checkpoint_sync(posix_file_system(), root, first.request);
  FaultInjectionFileSystem counter(posix_file_system());
  {
    test::TempDir probe;
    save_checkpoint_sync(counter, probe.path().string(), second.request);
  }
  using Op = FaultInjectionFileSystem::Op;
  for (Op op : {Op::write, Op::sync, Op::sync_dir, Op::rename, Op::create}) {
    for (std::uint64_t i = 0; i < counter.count(op); ++i) {
      for (int err : {EIO, ENOSPC}) {
        CAPTURE(static_cast<int>(op));
        CAPTURE(i);
        FaultInjectionFileSystem faulty(posix_file_system());
        faulty.fail_nth(op, i, err);
        try {
          save_checkpoint_sync(faulty, root, second.request);
        } catch (const Error& e) {
          CHECK(e.code() == (err == ENOSPC ? Errc::no_space : Errc::io_error));
          CHECK(e.sys_errno() == err);
        }
        auto opened = open_latest(posix_file_system(), root);
        if (opened.name == "step-0000000002") {  // the failure hit after the commit point
          check_equal(opened.reader, second);
          write_latest(posix_file_system(), root, "step-0000000001");
          fs::remove_all(dir / "step-0000000002");
        } else {
          check_equal(opened.reader, first);
        }
        for (const auto& n : names_in(root)) CHECK_FALSE(is_temporary_name(n));
      }
    }
  }
}

TEST_CASE("a short write fails the save with the typed error and removes the temporary") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture first(1, 1), second(1, 2);
  save_checkpoint_sync(posix_file_system(), root, first.request);
  FaultInjectionFileSystem faulty(posix_file_system());
  faulty.short_write_nth(1);
  CHECK_THROWS_AS(save_checkpoint_sync(faulty, root, second.request), Error);
  check_equal(open_latest(posix_file_system(), root).reader, first);
  CHECK(names_in(root) == std::vector<std::string>{".lock", "latest", "step-0000000001"});
}

TEST_CASE("leftover temporaries are removed on the next open and never loaded") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture fx(1, 1);
  save_checkpoint_sync(posix_file_system(), root, fx.request);
  fs::create_directory(dir / ".tmp-step-0000000002-999-0");
  test::write_all(dir / ".tmp-step-0000000002-999-0" / "manifest.json", {'{', '}'});
  test::write_all(dir / ".latest.tmp-999-1", {'x'});
  auto listed = list_checkpoints(posix_file_system(), root);
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].state == CheckpointState::in_progress);
  CHECK(open_latest(posix_file_system(), root, {.fallback = true}).name == "step-0000000001");
  const auto removed = prepare_root(posix_file_system(), RootLock(posix_file_system(), root));
  CHECK(removed.size() == 2);
  CHECK(names_in(root) == std::vector<std::string>{".lock", "latest", "step-0000000001"});
}

TEST_CASE("layout names sort by step and reject what they did not make") {
  CHECK(checkpoint_dir_name(10) == "step-0000000010");
  CHECK(checkpoint_dir_name(9) < checkpoint_dir_name(10));
  CHECK(parse_checkpoint_dir_name("step-0000000010") == 10u);
  CHECK_FALSE(parse_checkpoint_dir_name("step-10").has_value());
  CHECK_FALSE(parse_checkpoint_dir_name("step-00000000x0").has_value());
  CHECK_THROWS_AS(checkpoint_dir_name(kMaxStep + 1), Error);
  CHECK(shard_file_name(1, 4) == "rank-00001-of-00004.safetensors");
  CHECK(is_temporary_name(temporary_name("step-0000000001")));
  CHECK(is_temporary_name(temporary_name("latest")));
}

TEST_CASE("a step newer than latest that was never committed is replaced when saved again") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture first(1, 1), orphan(1, 2), again(1, 2);
  again.payload[0].blobs[2][0] ^= 0xff;  // different bytes for the same step
  save_checkpoint_sync(posix_file_system(), root, first.request);
  save_checkpoint_sync(posix_file_system(), root, orphan.request);
  // A crash between the rename of step 2 and the `latest` update leaves this state:
  write_latest(posix_file_system(), root, "step-0000000001");
  std::vector<std::string> logged;
  auto previous = set_log_sink([&](std::string_view l) { logged.emplace_back(l); });
  save_checkpoint_sync(posix_file_system(), root, again.request);
  set_log_sink(previous);
  REQUIRE(logged.size() == 1);
  CHECK(logged[0].find("never committed") != std::string::npos);
  check_equal(open_latest(posix_file_system(), root).reader, again);
  // A committed step is still never overwritten.
  CHECK_THROWS_AS(save_checkpoint_sync(posix_file_system(), root, first.request), Error);
}

TEST_CASE("saving a step older than the one latest names is refused naming both steps, and changes nothing") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture s4(1, 4), s8(1, 8), s6(1, 6);
  save_checkpoint_sync(posix_file_system(), root, s4.request);
  save_checkpoint_sync(posix_file_system(), root, s8.request);
  remove_checkpoint(posix_file_system(), root, "step-0000000004");  // rotated away
  const auto before = names_in(root);
  for (const test::Fixture* fx : {&s4, &s6}) {
    const std::uint64_t step = fx->request.step;
    CAPTURE(step);
    const Error e = test::error_of([&] { save_checkpoint_sync(posix_file_system(), root, fx->request); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.file() == root);
    CHECK(e.detail().find("saving step " + std::to_string(step) + " would move latest back from step 8") != std::string::npos);
    CHECK(e.expected() == "a step after 8");
    CHECK(e.actual() == "step " + std::to_string(step));
    CHECK(names_in(root) == before);  // no temporary, no checkpoint, latest unchanged
    check_equal(open_latest(posix_file_system(), root).reader, s8);
  }
  // The step latest names: its checkpoint exists, and that is what the error says.
  test::Fixture again8(1, 8);
  CHECK(test::error_of([&] { save_checkpoint_sync(posix_file_system(), root, again8.request); }).detail() ==
        "checkpoint for step 8 already exists");
}

TEST_CASE("opted in, an older step than latest commits, moves latest back and is logged, a committed step is still refused") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture s4(1, 4), s8(1, 8), s6(1, 6);
  save_checkpoint_sync(posix_file_system(), root, s4.request);
  save_checkpoint_sync(posix_file_system(), root, s8.request);
  // A run resumed from step 4 (say step 8 was corrupt), saving step 6.
  s6.request.allow_older_than_latest = true;
  {
    test::LogCapture log;
    save_checkpoint_sync(posix_file_system(), root, s6.request);
    const auto lines = log.matching({"saving step 6", "step 8 that latest names", "allow_older_than_latest", "step-0000000006"});
    CHECK(lines.size() == 1);
    CHECK(log.lines().size() == 1);
  }
  const auto opened = open_latest(posix_file_system(), root);
  CHECK(opened.name == "step-0000000006");
  check_equal(opened.reader, s6);
  CHECK(names_in(root) == std::vector<std::string>{".lock", "latest", "step-0000000004", "step-0000000006", "step-0000000008"});
  // The old step-8 is now newer than latest, as a step never committed: the next save
  // (even a refused one) prepares the root and removes it, and the resumed run's own step 8
  // takes its place.
  test::LogCapture log;
  // Step 4 is still committed (at or below latest): refused even so.
  test::Fixture again4(1, 4);
  again4.request.allow_older_than_latest = true;
  CHECK(test::error_of([&] { save_checkpoint_sync(posix_file_system(), root, again4.request); }).detail() ==
        "checkpoint for step 4 already exists");
  CHECK(log.matching({"removing", "step-0000000008", "never committed (newer than what latest names)"}).size() == 1);
  CHECK_FALSE(std::filesystem::exists(dir / "step-0000000008"));
  test::Fixture new8(1, 8);
  new8.payload[0].blobs[2][0] ^= 0xff;
  save_checkpoint_sync(posix_file_system(), root, new8.request);
  check_equal(open_latest(posix_file_system(), root).reader, new8);
}
