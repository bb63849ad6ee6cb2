// SPDX-License-Identifier: Apache-2.0
// A process committing checkpoints to the real RGW is SIGKILLed at seeded instants, and then
// in each phase of a commit in turn (stopped there by a wrapper of the store); after each kill
// the store must show only whole checkpoints (every committed step restores and verifies in
// full), `latest` must name one of them, leftovers must be collected, and the next commit
// must work.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/ops/save.hpp"
#include "io/io_fixture.hpp"
#include "objstore/rgw_fixture.hpp"

using namespace ckpt;

TEST_CASE("a process SIGKILLed at any instant of commits to the object store leaves only whole checkpoints and latest on one") {
  const int kills = 24;
  test::TempDir local;
  const std::string root = (local / "root").string();
  for (int s = 1; s <= kills + 3; ++s) {
    test::Fixture fx(3, static_cast<std::uint64_t>(s));
    save_checkpoint_sync(posix_file_system(), root, fx.request);
  }
  const S3Options options = test::rgw_options(test::unique_prefix("kill"));
  auto store = make_s3_object_store(options);

  // A child process that commits `step` with a store of its own (no connection is shared
  // with the parent); exits 0 when done, 3 on an error.
  auto spawn = [&](std::uint64_t step) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        auto mine = make_s3_object_store(options);
        commit_to_object_store(posix_file_system(), root, step, *mine);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    return child;
  };
  // How long a child takes for one whole commit here, to spread the kills over it: the
  // quickest of 3 (the first commit to a fresh prefix can take far longer than the others,
  // and kills spread over that would all come after the commit ended).
  constexpr std::uint64_t kWarm = 3;
  std::chrono::microseconds one = std::chrono::hours(1);
  for (std::uint64_t s = 1; s <= kWarm; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    int status = 0;
    ::waitpid(spawn(s), &status, 0);
    REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    one = std::min(one, std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0));
  }
  int status = 0;

  std::mt19937_64 rng(19);
  std::set<std::uint64_t> verified;
  int killed_mid = 0, uncommitted = 0, landed_late = 0, before_latest = 0, complete = 0;  // what each kill left
  for (std::uint64_t step = kWarm + 1; step <= static_cast<std::uint64_t>(kills) + kWarm; ++step) {
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<std::int64_t>(0, one.count() * 3 / 4)(rng));
    const pid_t child = spawn(step);
    std::this_thread::sleep_for(delay);
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    if (WIFSIGNALED(status)) ++killed_mid;
    INFO("step " << step << " killed after " << delay.count() << " us");

    // Only whole checkpoints: every committed step restores and verifies in full (each one
    // once: a committed step's objects are never written again).
    const auto steps = list_object_checkpoints(*store);
    for (const auto s : steps) {
      if (!verified.insert(s).second) continue;
      test::TempDir into;
      CHECK_NOTHROW(restore_from_object_store(*store, s, posix_file_system(), (into / "r").string(), {.verify = Verify::full}));
    }
    // latest names one of them, and the newest one committed before this round at least.
    const auto latest = read_object_latest(*store);
    REQUIRE(latest);
    CHECK(std::find(steps.begin(), steps.end(), latest->step) != steps.end());
    CHECK(latest->step >= step - 1);
    // The next round may find this step committed (the kill came late): commit it if not.
    if (std::find(steps.begin(), steps.end(), step) == steps.end()) {
      ++uncommitted;
      try {
        commit_to_object_store(posix_file_system(), root, step, *store);
      } catch (const Error& e) {
        // The killed child's create was on its way and the server completed it after the
        // listing above (a request outlives its sender): the step is committed, by the child.
        REQUIRE(e.code() == Errc::conflict);
        ++landed_late;
        move_object_latest(*store, step);
      }
    } else if (latest->step < step) {
      ++before_latest;
      CHECK(move_object_latest(*store, step));  // the kill fell between the tier manifest and latest
    } else {
      ++complete;
    }
    CHECK(read_object_latest(*store)->step == step);
  }
  MESSAGE(killed_mid << " of " << kills << " kills hit a running process (one commit: " << one.count() << " us); left: "
                     << uncommitted << " uncommitted (" << landed_late
                     << " of them committed by the dead child's last request, landing after it died), " << before_latest
                     << " committed before latest moved, " << complete
                     << " complete");
  CHECK(killed_mid > 0);
}

namespace {

// Blocks the `nth` call of `op` on `key` (empty: any key) for good, after writing one byte to
// `fd`: the parent then knows the child stands exactly there, and kills it.
class KillPoint final : public ObjectStoreWrapper {
 public:
  KillPoint(ObjectStore& base, ObjectCall::Op op, std::string key, int nth, int fd)
      : ObjectStoreWrapper(base), op_(op), key_(std::move(key)), nth_(nth), fd_(fd) {}

 protected:
  void around(const ObjectCall& call, const std::function<void()>& forward) override {
    if (call.op == op_ && (key_.empty() || call.key == key_) && seen_.fetch_add(1) + 1 == nth_) {
      const char c = 1;
      if (::write(fd_, &c, 1) != 1) ::_exit(4);
      for (;;) ::pause();
    }
    forward();
  }

 private:
  ObjectCall::Op op_;
  std::string key_;
  int nth_;
  int fd_;
  std::atomic<int> seen_{0};
};

}  // namespace

TEST_CASE("a process SIGKILLed in each phase of a commit (parts in flight, before complete, before the tier manifest, before latest) leaves the store whole") {
  // 2 ranks of 12 MiB in 1 MiB chunks, 5 MiB parts: 3 parts per shard, multipart for both.
  constexpr std::uint64_t kRankBytes = 12ull << 20;
  test::TempDir local;
  const std::string root = (local / "root").string();
  std::vector<std::vector<std::byte>> data(2, std::vector<std::byte>(kRankBytes));
  for (std::uint64_t step = 1; step <= 5; ++step) {
    SaveRequest req;
    req.step = step;
    req.chunk_size = 1u << 20;
    req.param_numel = 2 * kRankBytes;
    for (int r = 0; r < 2; ++r) {
      auto& d = data[static_cast<std::size_t>(r)];
      for (std::size_t i = 0; i < d.size(); i += 4096) d[i] = static_cast<std::byte>(step * 7 + static_cast<std::uint64_t>(r) + i / 4096);
      RankState rs;
      rs.tensors.push_back({"state", DType::U8, {kRankBytes}, d});
      rs.param_shard_offset = kRankBytes * static_cast<std::uint64_t>(r);
      rs.param_shard_numel = kRankBytes;
      req.ranks.push_back(std::move(rs));
    }
    save_checkpoint_sync(posix_file_system(), root, req);
  }
  const S3Options options = test::rgw_options(test::unique_prefix("kill-phase"));
  auto store = make_s3_object_store(options);
  ObjectCommitOptions commit;
  commit.upload = {.multipart_threshold = 5ull << 20, .part_size = 5ull << 20, .parts_in_flight = 4};
  commit_to_object_store(posix_file_system(), root, 1, *store, commit);

  enum class Key { any, tier_manifest, latest };
  struct Phase {
    const char* name;
    ObjectCall::Op op;
    Key key;
    int nth;
    bool committed;  // the tier manifest is on the store when the kill comes
  };
  const std::vector<Phase> phases = {
      {"a part in flight", ObjectCall::Op::upload_part, Key::any, 2, false},
      {"parts uploaded, before complete", ObjectCall::Op::complete_multipart, Key::any, 1, false},
      {"data uploaded, before the tier manifest", ObjectCall::Op::put, Key::tier_manifest, 1, false},
      {"tier manifest created, before latest", ObjectCall::Op::put, Key::latest, 1, true},
  };
  std::uint64_t step = 2;
  for (const Phase& here : phases) {
    const std::string phase = here.name;
    CAPTURE(phase);
    const std::string key = here.key == Key::tier_manifest ? checkpoint_dir_name(step) + "/manifest.json"
                            : here.key == Key::latest      ? std::string(kLatestName)
                                                           : std::string();
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::close(fds[0]);
      try {
        auto mine = make_s3_object_store(options);
        KillPoint at(*mine, here.op, key, here.nth, fds[1]);
        commit_to_object_store(posix_file_system(), root, step, at, commit);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);  // the kill point was never reached
    }
    ::close(fds[1]);
    char c = 0;
    const bool reached = ::read(fds[0], &c, 1) == 1;
    ::close(fds[0]);
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(reached);
    REQUIRE(WIFSIGNALED(status));

    // What the dead commit left: its step is committed exactly when its tier manifest landed;
    // `latest` stays on the previous step; every committed step restores in full.
    const auto steps = list_object_checkpoints(*store);
    CHECK((std::find(steps.begin(), steps.end(), step) != steps.end()) == here.committed);
    REQUIRE(read_object_latest(*store));
    CHECK(read_object_latest(*store)->step == step - 1);
    for (const auto s : steps) {
      test::TempDir into;
      CHECK_NOTHROW(restore_from_object_store(*store, s, posix_file_system(), (into / "r").string(), {.verify = Verify::full}));
    }
    // The leftovers: an open multipart upload (killed among its parts), data objects without
    // a tier manifest (killed before it), nothing (committed).
    const LeftoverReport left = collect_object_leftovers(*store, std::chrono::seconds(0));
    if (here.op == ObjectCall::Op::upload_part || here.op == ObjectCall::Op::complete_multipart) CHECK(!left.aborted.empty());
    if (here.op == ObjectCall::Op::put && !here.committed) {
      CHECK(left.aborted.empty());
      CHECK(!left.removed.empty());
    }
    if (here.committed) CHECK((left.removed.empty() && left.aborted.empty()));
    CHECK(store->list_multipart_uploads("").empty());
    // The next writer finishes the step (or only moves latest, if it was committed).
    if (here.committed) CHECK(move_object_latest(*store, step));
    else commit_to_object_store(posix_file_system(), root, step, *store, commit);
    CHECK(read_object_latest(*store)->step == step);
    test::TempDir into;
    const RestoreReport r = restore_from_object_store(*store, step, posix_file_system(), (into / "r").string(), {.verify = Verify::full});
    std::uint64_t shard_bytes = 0;
    for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(root) / checkpoint_dir_name(step)))
      if (e.path().filename().string().starts_with("rank-")) shard_bytes += e.file_size();
    CHECK(r.bytes == shard_bytes);
    ++step;
  }
}
