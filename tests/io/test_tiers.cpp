// SPDX-License-Identifier: Apache-2.0
// Two tiers, the I/O part: one checkpoint copied to a durable root with its own commit and
// copy record, and the resume-time choice between the tiers.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ckpt/core/error.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/tiers.hpp"
#include "io/io_fixture.hpp"
#include "support/node_checkpoint.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {

// Saves `steps` synchronously (2 ranks, 4096-byte chunks) into `root`.
void save_steps(const std::string& root, std::initializer_list<std::uint64_t> steps) {
  for (auto s : steps) {
    test::Fixture fx(2, s);
    save_checkpoint_sync(posix_file_system(), root, fx.request);
  }
}

// Flips one byte in the middle of rank 1's shard of root/step-N.
void corrupt(const std::string& root, std::uint64_t step) {
  const fs::path p = fs::path(root) / checkpoint_dir_name(step) / shard_file_name(1, 2);
  auto bytes = test::read_all(p);
  bytes[bytes.size() / 2] ^= 0x5a;
  test::write_all(p, bytes);
}

using test::error_of;

// A local and a durable root in one temporary directory.
struct Roots {
  test::TempDir dir{"ckpt-tiers"};
  std::string local = (dir / "local").string();
  std::string durable = (dir / "durable").string();
};

bool holds_only_checkpoints(const fs::path& root) {
  for (const auto& e : fs::directory_iterator(root))
    if (is_temporary_name(e.path().filename().string())) return false;
  return true;
}

}  // namespace

TEST_CASE("a copied checkpoint is byte-equal, verifies in full and carries its copy record") {
  const Roots roots;
  const std::string &local = roots.local, &durable = roots.durable;
  save_steps(local, {3});
  const CopyRecord rec = copy_checkpoint(posix_file_system(), local, 3, posix_file_system(), durable, Verify::full);

  const auto src = CheckpointReader::open(posix_file_system(), local + "/step-0000000003");
  const auto copy = CheckpointReader::open(posix_file_system(), durable + "/step-0000000003", 2);
  copy.verify(Verify::full);
  std::uint64_t bytes = 0, chunks = 0;
  for (const auto& s : src.manifest().shards) {
    CHECK(test::read_all(src.shard_path(s.rank)) == test::read_all(copy.shard_path(s.rank)));
    bytes += s.size;
    chunks += s.chunk_xxh3.size();
  }
  CHECK(read_latest(posix_file_system(), durable) == "step-0000000003");

  const CopyRecord read = read_copy_record(posix_file_system(), durable + "/step-0000000003");
  for (const CopyRecord& r : {rec, read}) {
    CHECK(r.step == 3);
    CHECK(r.source_root == local);
    CHECK(r.source_dir == "step-0000000003");
    CHECK(r.bytes == bytes);
    CHECK(r.xxh3_chunks_verified == chunks);
    CHECK(r.sha256_verified);
    CHECK(r.copied_at.size() == 24);  // 2026-11-29T10:00:00.123Z
    CHECK(r.copied_at.back() == 'Z');
  }
  CHECK(chunks > 2);  // more than one chunk per shard was checked
}

TEST_CASE("a fast copy checks every chunk's XXH3 and records that SHA-256 was not re-read") {
  const Roots roots;
  const std::string &local = roots.local, &durable = roots.durable;
  save_steps(local, {1});
  const CopyRecord rec = copy_checkpoint(posix_file_system(), local, 1, posix_file_system(), durable);
  CHECK_FALSE(rec.sha256_verified);
  CHECK(rec.xxh3_chunks_verified > 0);
  CHECK(read_copy_record(posix_file_system(), durable + "/step-0000000001").sha256_verified == false);
}

TEST_CASE("a checkpoint written directly has no copy record: not found") {
  test::TempDir dir;
  save_steps(dir.path().string(), {1});
  CHECK(error_of([&] { read_copy_record(posix_file_system(), (dir / "step-0000000001").string()); }).code() == Errc::not_found);
}

TEST_CASE("a corrupt source chunk fails the copy with the source file named and leaves the durable root as it was") {
  const Roots roots;
  const std::string &local = roots.local, &durable = roots.durable;
  save_steps(local, {1, 2});
  copy_checkpoint(posix_file_system(), local, 1, posix_file_system(), durable);
  corrupt(local, 2);
  const Error e = error_of([&] { copy_checkpoint(posix_file_system(), local, 2, posix_file_system(), durable); });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.file() == local + "/step-0000000002/" + shard_file_name(1, 2));
  CHECK(read_latest(posix_file_system(), durable) == "step-0000000001");
  CHECK_FALSE(fs::exists(fs::path(durable) / "step-0000000002"));
  CHECK(holds_only_checkpoints(durable));
  CheckpointReader::open(posix_file_system(), durable + "/step-0000000001").verify(Verify::full);
}

TEST_CASE("the tiered open uses the local tier when its newest checkpoint is good") {
  const Roots roots;
  const std::string &local = roots.local, &durable = roots.durable;
  save_steps(local, {1, 2});
  copy_checkpoint(posix_file_system(), local, 1, posix_file_system(), durable);
  const auto t = open_latest_tiered(posix_file_system(), local, posix_file_system(), durable);
  CHECK(t.tier == "local");
  CHECK(t.opened.name == "step-0000000002");
  CHECK(t.local_error.empty());
}

TEST_CASE("the tiered open falls back to the durable tier when the local root is gone, and says why") {
  const Roots roots;
  const std::string &local = roots.local, &durable = roots.durable;
  save_steps(local, {1});
  copy_checkpoint(posix_file_system(), local, 1, posix_file_system(), durable);
  fs::remove_all(local);
  const auto t = open_latest_tiered(posix_file_system(), local, posix_file_system(), durable, {.expected_world_size = 2});
  CHECK(t.tier == "durable");
  CHECK(t.opened.reader.dir() == durable + "/step-0000000001");
  CHECK(t.local_error.find("no such checkpoint root") != std::string::npos);
}

TEST_CASE("the tiered open falls back to the durable tier when the newest local checkpoint is corrupt") {
  const Roots roots;
  const std::string &local = roots.local, &durable = roots.durable;
  save_steps(local, {1, 2});
  copy_checkpoint(posix_file_system(), local, 2, posix_file_system(), durable);
  corrupt(local, 2);
  const auto t = open_latest_tiered(posix_file_system(), local, posix_file_system(), durable);
  CHECK(t.tier == "durable");
  CHECK(t.opened.name == "step-0000000002");
  CHECK(t.local_error.find("checksum mismatch") != std::string::npos);
}

TEST_CASE("the tiered open with fallback takes an older local checkpoint when the durable tier has none") {
  const Roots roots;
  const std::string &local = roots.local, &durable = roots.durable;
  save_steps(local, {1, 2});
  corrupt(local, 2);
  const auto t = open_latest_tiered(posix_file_system(), local, posix_file_system(), durable, {.fallback = true});
  CHECK(t.tier == "local");
  CHECK(t.opened.name == "step-0000000001");
  CHECK(error_of([&] { open_latest_tiered(posix_file_system(), local, posix_file_system(), durable); }).code() == Errc::not_found);
}

TEST_CASE("the tiered open refuses another world size at once and reports not found when neither tier has a checkpoint") {
  const Roots roots;
  const std::string &local = roots.local, &durable = roots.durable;
  const Error none = error_of([&] { open_latest_tiered(posix_file_system(), local, posix_file_system(), durable); });
  CHECK(none.code() == Errc::not_found);
  CHECK(none.actual().find("durable: ") != std::string::npos);
  save_steps(local, {1});
  copy_checkpoint(posix_file_system(), local, 1, posix_file_system(), durable);
  CHECK(error_of([&] { open_latest_tiered(posix_file_system(), local, posix_file_system(), durable, {.expected_world_size = 4}); }).code() ==
        Errc::world_size_mismatch);
}

TEST_CASE("a copy into a durable root another writer holds fails with busy and leaves it untouched") {
  const Roots roots;
  save_steps(roots.local, {3});
  const RootLock other(posix_file_system(), roots.durable);
  const Error e = error_of([&] { copy_checkpoint(posix_file_system(), roots.local, 3, posix_file_system(), roots.durable); });
  CHECK(e.code() == Errc::busy);
  CHECK(e.file() == roots.durable);
  CHECK(e.actual().starts_with("pid " + std::to_string(::getpid()) + " "));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(roots.durable)) names.push_back(entry.path().filename().string());
  CHECK(names == std::vector<std::string>{".lock"});  // no temporary, no checkpoint, no latest
}

TEST_CASE("a copy of a step older than the durable latest is refused unless allowed, which moves the durable latest back") {
  const Roots roots;
  save_steps(roots.local, {3, 5});
  copy_checkpoint(posix_file_system(), roots.local, 5, posix_file_system(), roots.durable);
  const Error e = error_of([&] { copy_checkpoint(posix_file_system(), roots.local, 3, posix_file_system(), roots.durable); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "a step after 5");
  CHECK(e.actual() == "step 3");
  CHECK(holds_only_checkpoints(roots.durable));
  copy_checkpoint(posix_file_system(), roots.local, 3, posix_file_system(), roots.durable, Verify::fast, {.allow_older_than_latest = true});
  CHECK(read_latest(posix_file_system(), roots.durable) == "step-0000000003");
}

TEST_CASE("a restart finds a directory root's committed checkpoint by its latest alone: step directories without one are nothing, a missing root is empty") {
  Roots r;
  CHECK(find_committed_checkpoint(posix_file_system(), r.local) == std::nullopt);
  save_steps(r.local, {1, 2});
  CHECK(find_committed_checkpoint(posix_file_system(), r.local) == r.local + "/latest");
  test::write_all(fs::path(r.local) / "latest", {'?'});  // one that does not open: the resume's error, not a fresh start
  CHECK(find_committed_checkpoint(posix_file_system(), r.local) == r.local + "/latest");
  fs::remove(fs::path(r.local) / "latest");  // a crash before the first `latest`: never committed
  CHECK(find_committed_checkpoint(posix_file_system(), r.local) == std::nullopt);
}

TEST_CASE("a restart finds a node set's committed checkpoint in any node's latest, or in a step renamed into place on every node root that no latest names") {
  test::TempDir dir("ckpt-tiers");
  const std::string set = (dir / "set").string();
  test::Fixture fx(2, 10);
  test::save_node_checkpoint(posix_file_system(), set, 2, RedundancyScheme{}, fx.request);
  CHECK(find_committed_checkpoint(posix_file_system(), set) == set + "/node-0/latest");
  fs::remove(fs::path(set) / "node-0" / "latest");
  CHECK(find_committed_checkpoint(posix_file_system(), set) == set + "/node-1/latest");
  fs::remove(fs::path(set) / "node-1" / "latest");
  CHECK(find_committed_checkpoint(posix_file_system(), set) ==
        set + "/node-*/step-0000000010 (renamed into place on every node root, no latest names it yet)");
  // Renamed on one node only (the crash came between the renames): never committed.
  fs::remove_all(fs::path(set) / "node-1" / "step-0000000010");
  fs::create_directories(fs::path(set) / "node-1" / "step-0000000005");
  CHECK(find_committed_checkpoint(posix_file_system(), set) == std::nullopt);
}
