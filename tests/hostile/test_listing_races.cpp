// SPDX-License-Identifier: Apache-2.0
// list_checkpoints (what `ckpt ls` shows) and open_latest while a save commits and rotates in
// the same root: a checkpoint that is renamed or removed at any instant of the listing is left
// out, never called corrupt, and the checkpoints that stay are listed as they are; one rotated
// away between the read of `latest` and its open is no error: the one `latest` names then is
// opened.
#include <doctest/doctest.h>

#include <functional>
#include <set>
#include <string>

#include "ckpt/store/store.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "hostile/corpus.hpp"

using namespace ckpt;
using namespace ckpt::testing;

namespace {

// Forwards to a MemoryFileSystem and runs `action` (once) just before the `trigger`-th read
// (open_read, list_dir or stat) after the listing starts: the instant a concurrent save acts.
class RacingFileSystem final : public FileSystemWrapper {
 public:
  RacingFileSystem(MemoryFileSystem& inner, std::size_t trigger, std::function<void(MemoryFileSystem&)> action)
      : FileSystemWrapper(inner), inner_(inner), trigger_(trigger), action_(std::move(action)) {}
  std::size_t reads() const noexcept { return reads_; }
  bool fired() const noexcept { return fired_; }

  std::unique_ptr<ReadableFile> open_read(const std::string& p) override { return tick(), inner_.open_read(p); }
  std::vector<DirEntry> list_dir(const std::string& p) override { return tick(), inner_.list_dir(p); }
  std::optional<FileStat> stat(const std::string& p) override { return tick(), inner_.stat(p); }

 private:
  void tick() {
    if (reads_++ == trigger_ && !fired_) {
      fired_ = true;
      action_(inner_);
    }
  }
  MemoryFileSystem& inner_;
  std::size_t trigger_, reads_ = 0;
  bool fired_ = false;
  std::function<void(MemoryFileSystem&)> action_;
};

const hostile::GoodRoot& good() {
  static const hostile::GoodRoot g = hostile::make_good_root();
  return g;
}

const std::string kOld = checkpoint_dir_name(hostile::kPreviousStep), kNew = checkpoint_dir_name(hostile::kLatestStep);
const std::string kAbandoned = ".tmp-step-0000000030-77-1";

// Runs the listing once per instant of it; returns how many instants were tried.
std::size_t at_every_instant(Verify verify, const std::function<void(MemoryFileSystem&)>& action,
                             const std::function<void(const std::vector<CheckpointInfo>&, bool fired)>& check) {
  for (std::size_t trigger = 0;; ++trigger) {
    MemoryFileSystem fs = good().fs.clone();
    fs.put_file(join_path(hostile::kRoot, kAbandoned) + "/rank-00000.safetensors", "partial");
    RacingFileSystem racing(fs, trigger, action);
    std::vector<CheckpointInfo> listed;
    try {
      listed = list_checkpoints(racing, hostile::kRoot, verify);
    } catch (const std::exception& e) {
      FAIL_CHECK("listing threw at read " << trigger << ": " << e.what());
    }
    CAPTURE(trigger);
    check(listed, racing.fired());
    if (!racing.fired()) return trigger;  // the listing ended before this instant
  }
}

void no_corrupt_and_latest_kept(const std::vector<CheckpointInfo>& listed) {
  bool latest_seen = false;
  for (const auto& c : listed) {
    CAPTURE(c.name);
    CHECK_MESSAGE(c.state != CheckpointState::corrupt, c.error);
    if (c.name == kNew) latest_seen = c.is_latest && c.state == CheckpointState::complete;
  }
  CHECK(latest_seen);
}
}  // namespace

TEST_CASE("a checkpoint rotated away at any instant of a listing is left out, never called corrupt") {
  for (Verify verify : {Verify::none, Verify::fast, Verify::full}) {
    CAPTURE(static_cast<int>(verify));
    const std::size_t instants = at_every_instant(
        verify, [](MemoryFileSystem& fs) { remove_checkpoint(fs, hostile::kRoot, kOld); },
        [](const std::vector<CheckpointInfo>& listed, bool) { no_corrupt_and_latest_kept(listed); });
    CHECK(instants > 5);
  }
}

TEST_CASE("a checkpoint renamed to a temporary mid-listing, or a temporary removed, is left out, never called corrupt") {
  const auto rotate_half = [](MemoryFileSystem& fs) {  // rotation's rename, its removal not yet done
    fs.rename(join_path(hostile::kRoot, kOld), join_path(hostile::kRoot, temporary_name(kOld)));
  };
  const auto abandon = [](MemoryFileSystem& fs) { fs.remove_all(join_path(hostile::kRoot, kAbandoned)); };
  for (const auto& action : {std::function<void(MemoryFileSystem&)>(rotate_half), std::function<void(MemoryFileSystem&)>(abandon)})
    at_every_instant(Verify::fast, action, [](const std::vector<CheckpointInfo>& listed, bool) { no_corrupt_and_latest_kept(listed); });
}

TEST_CASE("without a concurrent save the listing still reports real damage as corrupt") {
  MemoryFileSystem fs = good().fs.clone();
  fs.put_file(join_path(join_path(hostile::kRoot, kOld), good().previous.shard(1).path), "cut");
  const auto listed = list_checkpoints(fs, hostile::kRoot, Verify::fast);
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].name == kOld);
  CHECK(listed[0].state == CheckpointState::corrupt);
  CHECK(listed[0].error.find("size mismatch") != std::string::npos);
  CHECK(listed[1].state == CheckpointState::complete);
}

// ---- open_latest and rotated_away while a save commits and rotates -------------------------

namespace {
const std::string kNewer = checkpoint_dir_name(hostile::kLatestStep + 10);

// What a save does to the root: commits a newer checkpoint (a copy of the latest one under
// its own step), moves `latest` to it, and rotates away the one `latest` named.
void commit_newer_and_rotate(MemoryFileSystem& fs) {
  const std::string from = join_path(hostile::kRoot, kNew), to = join_path(hostile::kRoot, kNewer);
  for (const auto& e : fs.list_dir(from)) fs.put_file(join_path(to, e.name), *fs.file_bytes(join_path(from, e.name)));
  auto m = hostile::manifest_object(fs, to);
  m["step"] = hostile::kLatestStep + 10;
  hostile::write_manifest_object(fs, to, m);
  write_latest(fs, hostile::kRoot, kNewer);
  remove_checkpoint(fs, hostile::kRoot, kNew);
}
}  // namespace

TEST_CASE("a checkpoint removed by rotation is rotated away, and one deleted while latest names it, or never there, is not") {
  MemoryFileSystem fs = good().fs.clone();
  CHECK_FALSE(rotated_away(fs, hostile::kRoot, kNew));  // still there
  commit_newer_and_rotate(fs);
  CHECK(rotated_away(fs, hostile::kRoot, kNew));
  CHECK(rotated_away(fs, hostile::kRoot, kOld) == false);  // there: kept by the rotation
  CHECK_FALSE(rotated_away(fs, hostile::kRoot, checkpoint_dir_name(hostile::kLatestStep + 20)));  // newer than latest
  CHECK_FALSE(rotated_away(fs, hostile::kRoot, "latest"));  // not a checkpoint's name
  MemoryFileSystem damaged = good().fs.clone();
  damaged.remove_all(join_path(hostile::kRoot, kNew));  // latest still names it: damage, not rotation
  CHECK_FALSE(rotated_away(damaged, hostile::kRoot, kNew));
  CHECK_FALSE(rotated_away(damaged, "/no/such/root", kNew));
}

TEST_CASE("open_latest while a save commits a newer checkpoint and rotates the latest away, at any instant, opens the live one") {
  std::set<std::string> opened;
  for (std::size_t trigger = 0;; ++trigger) {
    CAPTURE(trigger);
    MemoryFileSystem fs = good().fs.clone();
    RacingFileSystem racing(fs, trigger, commit_newer_and_rotate);
    try {
      const OpenedCheckpoint o = open_latest(racing, hostile::kRoot);
      CHECK((o.name == kNew || o.name == kNewer));
      CHECK(checkpoint_dir_name(o.reader.manifest().step) == o.name);
      opened.insert(o.name);
    } catch (const Error& e) {
      FAIL_CHECK("open_latest threw: " << std::string(e.what()));
    }
    if (!racing.fired()) break;  // the open ended before this instant
  }
  // A rotation before `latest` was read, and one after the open, both seen; the ones between
  // are the instants the retry covers (without it: not_found naming the manifest or a shard).
  CHECK(opened == std::set<std::string>{kNew, kNewer});
}
