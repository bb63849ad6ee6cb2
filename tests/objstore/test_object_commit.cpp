// SPDX-License-Identifier: Apache-2.0
// The commit of a local checkpoint on the real RGW: shards under a never-reused prefix, the
// tier manifest created last with If-None-Match, `latest` moved forward by compare-and-swap.
#include <doctest/doctest.h>

#include <atomic>
#include <boost/json.hpp>
#include <fstream>
#include <thread>

#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "ckpt/hash/sha256.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/testing/fault_object_store.hpp"
#include "io/io_fixture.hpp"
#include "objstore/rgw_fixture.hpp"

using namespace ckpt;
using Fault = testing::FaultInjectionObjectStore::Fault;
using Op = testing::FaultInjectionObjectStore::Op;

namespace {

std::vector<std::byte> file_bytes(const std::string& path) {
  const auto b = test::read_all(path);
  std::vector<std::byte> out(b.size());
  std::memcpy(out.data(), b.data(), b.size());
  return out;
}

std::string local_dir(const test::SavedCheckpoint& ck, std::uint64_t step) {
  return (ck.dir / checkpoint_dir_name(step)).string();
}

}  // namespace

TEST_CASE("a local checkpoint is committed to the object store: shards and manifest byte-equal, tier manifest, latest") {
  test::SavedCheckpoint ck(2, 10);
  auto store = test::rgw_store("commit");
  const ObjectCommitReport r = commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, *store, {.run_id = "run-a"});
  CHECK(r.step == 10);
  CHECK(r.data_prefix == "step-0000000010/run-a/");
  CHECK(r.latest_moved);
  CHECK(r.chunks_verified > 2);
  std::uint64_t bytes = 0;
  for (const auto& shard : ck.m.shards) {
    CHECK(store->get(r.data_prefix + shard.path) == file_bytes(local_dir(ck, 10) + "/" + shard.path));
    bytes += shard.size;
  }
  CHECK(r.bytes == bytes);
  const auto manifest = file_bytes(local_dir(ck, 10) + "/manifest.json");
  CHECK(store->get(r.data_prefix + "manifest.json") == manifest);
  const ObjectManifest tier = read_object_manifest(*store, 10);
  CHECK(tier.run_id == "run-a");
  CHECK(tier.data_prefix == r.data_prefix);
  CHECK(tier.manifest_sha256 == to_hex(sha256(manifest.data(), manifest.size())));
  CHECK(tier.bytes == bytes);
  CHECK(read_object_latest(*store)->step == 10);
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{10});
}

TEST_CASE("of two writers committing the same step exactly one tier manifest wins and the other reports conflict") {
  test::SavedCheckpoint ck(2, 10);
  auto store = test::rgw_store("commit-race");
  std::atomic<int> won{0};
  std::vector<Error> lost;
  std::mutex mu;
  std::vector<std::thread> writers;
  for (const char* run : {"writer-1", "writer-2"})
    writers.emplace_back([&, run] {
      try {
        commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, *store, {.run_id = run});
        ++won;
      } catch (const Error& e) {
        std::lock_guard lock(mu);
        lost.push_back(e);
      }
    });
  for (auto& t : writers) t.join();
  CHECK(won == 1);
  REQUIRE(lost.size() == 1);
  CHECK(lost[0].code() == Errc::conflict);
  CHECK(lost[0].file().ends_with("/step-0000000010/manifest.json"));
  CHECK(lost[0].detail().starts_with("step-0000000010 was committed by another writer first"));
  CHECK(lost[0].actual() == "HTTP 412 PreconditionFailed");
  const ObjectManifest tier = read_object_manifest(*store, 10);
  CHECK(lost[0].detail().find("run " + tier.run_id + "'s") == std::string::npos);  // the loser names its own run
  CHECK(read_object_latest(*store)->step == 10);
}

TEST_CASE("latest only moves forward: a step committed after a newer one is complete but latest stays") {
  test::SavedCheckpoint ck20(2, 20);
  test::SavedCheckpoint ck10(2, 10);
  auto store = test::rgw_store("commit-order");
  CHECK(commit_to_object_store(posix_file_system(), ck20.dir.path().string(), 20, *store).latest_moved);
  const ObjectCommitReport older = commit_to_object_store(posix_file_system(), ck10.dir.path().string(), 10, *store);
  CHECK(!older.latest_moved);
  CHECK(read_object_latest(*store)->step == 20);
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{10, 20});
}

TEST_CASE("a crash between the tier manifest and latest leaves a complete step that the next commit moves latest past") {
  test::SavedCheckpoint ck10(2, 10);
  test::SavedCheckpoint ck20(2, 20);
  auto store = test::rgw_store("commit-window");
  commit_to_object_store(posix_file_system(), ck10.dir.path().string(), 10, *store, {.move_latest = false});
  CHECK(!read_object_latest(*store));
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{10});
  commit_to_object_store(posix_file_system(), ck20.dir.path().string(), 20, *store);
  CHECK(read_object_latest(*store)->step == 20);
}

TEST_CASE("latest is never moved to a step without a tier manifest") {
  auto store = test::rgw_store("latest-uncommitted");
  const Error e = test::error_of([&] { move_object_latest(*store, 99); });
  CHECK(e.code() == Errc::not_found);
  CHECK(e.file().ends_with("/step-0000000099/manifest.json"));
  CHECK(!read_object_latest(*store));
}

TEST_CASE("a local chunk damaged after the save fails the commit with checksum_mismatch naming the file, committing nothing") {
  test::SavedCheckpoint ck(2, 10);
  const std::string shard = local_dir(ck, 10) + "/" + ck.m.shards[1].path;
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    char c;
    f.read(&c, 1);
    f.seekp(5000);
    c ^= 0x40;
    f.write(&c, 1);
  }
  auto store = test::rgw_store("commit-damaged");
  const Error e = test::error_of([&] { commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, *store); });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.file() == shard);
  CHECK(e.detail().starts_with("xxh3 of chunk 1 of "));
  CHECK(list_object_checkpoints(*store).empty());
  CHECK(!read_object_latest(*store));
}

TEST_CASE("a commit whose tier-manifest create loses its answer is retried and succeeds because its own manifest landed") {
  test::SavedCheckpoint ck(2, 10);
  auto s3 = test::rgw_store("commit-lost-answer");
  testing::FaultInjectionObjectStore faults(*s3);
  RetryingObjectStore store(faults, test::fast_retries(3));
  // Two shard puts and the local manifest pass; the tier manifest's create is dropped after it landed.
  faults.inject(Op::put, Fault::dropped, 1, 3);
  const ObjectCommitReport r = commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, store, {.run_id = "r1"});
  CHECK(store.retries() == 1);
  CHECK(r.latest_moved);
  CHECK(read_object_manifest(*s3, 10).run_id == "r1");
}

TEST_CASE("a 503 storm on the tier manifest's create fails the commit with the typed error and leaves the step uncommitted") {
  test::SavedCheckpoint ck(2, 10);
  auto s3 = test::rgw_store("commit-storm");
  testing::FaultInjectionObjectStore faults(*s3);
  RetryingObjectStore store(faults, test::fast_retries(3));
  faults.inject(Op::put, Fault::slow_down, 1000, 3);
  const Error e = test::error_of([&] { commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, store); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.actual() == "HTTP 503 SlowDown");
  CHECK(e.file().ends_with("/step-0000000010/manifest.json"));
  CHECK(list_object_checkpoints(*s3).empty());
  CHECK(!read_object_latest(*s3));
}

TEST_CASE("a committed step restores into an empty local root that opens, verifies in full and equals the original") {
  test::SavedCheckpoint ck(3, 10);
  auto store = test::rgw_store("restore");
  commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, *store, {.run_id = "r"});
  test::TempDir local;
  const std::string root = (local / "root").string();
  const RestoreReport r = restore_from_object_store(*store, 10, posix_file_system(), root, {.read_size = 1, .verify = Verify::full});
  CHECK(r.run_id == "r");
  CHECK(r.dir == root + "/step-0000000010");
  CHECK(r.chunks_verified > 3);
  const OpenedCheckpoint opened = open_latest(posix_file_system(), root);
  CHECK(opened.reader.manifest().step == 10);
  opened.reader.verify(Verify::full);
  for (const auto& s : ck.m.shards)
    CHECK(test::read_all(r.dir + "/" + s.path) == test::read_all(local_dir(ck, 10) + "/" + s.path));
}

TEST_CASE("a shard object rewritten behind ckpt's back is refused on restore with checksum_mismatch naming the object and chunk") {
  test::SavedCheckpoint ck(2, 10);
  auto store = test::rgw_store("restore-damaged");
  const ObjectCommitReport c = commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, *store);
  const std::string key = c.data_prefix + ck.m.shards[0].path;
  auto bytes = store->get(key);
  bytes[6000] ^= std::byte{1};
  store->put(key, bytes);
  test::TempDir local;
  const std::string root = (local / "root").string();
  const Error e = test::error_of([&] { restore_from_object_store(*store, 10, posix_file_system(), root); });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.file().ends_with("/" + key));
  CHECK(e.detail().starts_with("xxh3 of chunk 1 of "));
  CHECK(!read_latest(posix_file_system(), root));
  for (const auto& entry : std::filesystem::directory_iterator(root)) CHECK(entry.path().filename() == ".lock");
}

TEST_CASE("a checkpoint manifest that differs from the SHA-256 its tier manifest records is refused on restore") {
  test::SavedCheckpoint ck(2, 10);
  auto store = test::rgw_store("restore-manifest");
  const ObjectCommitReport c = commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, *store);
  auto text = test::text_of(store->get(c.data_prefix + "manifest.json"));
  text[text.find("\"step\"") + 1] = 'S';
  store->put(c.data_prefix + "manifest.json", test::bytes_of(text));
  test::TempDir local;
  const Error e = test::error_of([&] { restore_from_object_store(*store, 10, posix_file_system(), (local / "root").string()); });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.detail() == "sha256 of the checkpoint manifest");
  CHECK(e.expected() == read_object_manifest(*store, 10).manifest_sha256);
}

TEST_CASE("restoring a step that was never committed is not_found and creates no checkpoint") {
  auto store = test::rgw_store("restore-missing");
  test::TempDir local;
  const Error e = test::error_of([&] { restore_from_object_store(*store, 10, posix_file_system(), (local / "root").string()); });
  CHECK(e.code() == Errc::not_found);
  CHECK(e.file().ends_with("/step-0000000010/manifest.json"));
}

TEST_CASE("a restore whose ranged gets meet 503s and timeouts is retried and completes") {
  test::SavedCheckpoint ck(2, 10);
  auto s3 = test::rgw_store("restore-retry");
  commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, *s3);
  testing::FaultInjectionObjectStore faults(*s3);
  RetryingObjectStore store(faults, test::fast_retries(4));
  faults.inject(Op::get_range, Fault::slow_down, 2, 1);
  faults.inject(Op::head, Fault::timeout, 1, 2);
  test::TempDir local;
  const std::string root = (local / "root").string();
  restore_from_object_store(store, 10, posix_file_system(), root);
  CHECK(store.retries() == 3);
  open_latest(posix_file_system(), root).reader.verify(Verify::full);
}

TEST_CASE("rotation keeps the newest committed steps and the one latest names, removing each tier manifest and its data") {
  auto store = test::rgw_store("rotate");
  test::TempDir local;
  const std::string root = (local / "root").string();
  for (std::uint64_t s = 1; s <= 5; ++s) {
    test::Fixture fx(2, s);
    save_checkpoint_sync(posix_file_system(), root, fx.request);
    commit_to_object_store(posix_file_system(), root, s, *store, {.move_latest = s != 5});  // 5: killed before latest
  }
  CHECK(read_object_latest(*store)->step == 4);
  CHECK(rotate_object_checkpoints(*store, 1) == std::vector<std::uint64_t>{1, 2, 3});
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{4, 5});
  CHECK(store->list("step-0000000001/").objects.empty());
  CHECK(store->list("step-0000000003/").objects.empty());
  test::TempDir into;
  restore_from_object_store(*store, 4, posix_file_system(), (into / "r").string(), {.verify = Verify::full});
}

TEST_CASE("removing the step latest names is refused and removes nothing") {
  test::SavedCheckpoint ck(2, 10);
  auto store = test::rgw_store("remove-latest");
  commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, *store);
  const Error e = test::error_of([&] { remove_object_checkpoint(*store, 10); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "the checkpoint latest names is never removed");
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{10});
  CHECK(test::error_of([&] { remove_object_checkpoint(*store, 11); }).code() == Errc::not_found);
}

TEST_CASE("leftovers of failed commits are collected once older than the grace period, and committed data is kept") {
  test::SavedCheckpoint ck(2, 1);
  auto store = test::rgw_store("collect");
  commit_to_object_store(posix_file_system(), ck.dir.path().string(), 1, *store, {.run_id = "winner"});
  store->put("step-0000000001/loser/rank-00000-of-00002.safetensors", test::bytes_of("a racing writer's data"));
  store->put("step-0000000002/killed/rank-00000-of-00002.safetensors", test::bytes_of("a killed commit's data"));
  const std::string upload = store->create_multipart("step-0000000002/killed/rank-00001-of-00002.safetensors");

  const LeftoverReport young = collect_object_leftovers(*store, std::chrono::hours(1));
  CHECK(young.removed.empty());
  CHECK(young.aborted.empty());
  CHECK(young.kept_young == 3);

  const LeftoverReport old = collect_object_leftovers(*store, std::chrono::hours(1), std::chrono::system_clock::now() + std::chrono::hours(2));
  CHECK(old.removed == std::vector<std::string>{"step-0000000001/loser/rank-00000-of-00002.safetensors",
                                                "step-0000000002/killed/rank-00000-of-00002.safetensors"});
  CHECK(old.aborted == std::vector<std::string>{"step-0000000002/killed/rank-00001-of-00002.safetensors"});
  CHECK(store->list_multipart_uploads("").empty());
  CHECK(store->list("step-0000000002/").objects.empty());
  test::TempDir into;
  restore_from_object_store(*store, 1, posix_file_system(), (into / "r").string(), {.verify = Verify::full});
  CHECK(read_object_latest(*store)->step == 1);
}

TEST_CASE("a committed step verifies on the store without a local copy, and a rewritten object is named by the check") {
  test::SavedCheckpoint ck(2, 10);
  auto store = test::rgw_store("verify");
  const ObjectCommitReport c = commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, *store);
  std::uint64_t last_done = 0, last_total = 0;
  const ObjectCheckpoint v = verify_object_checkpoint(*store, 10, Verify::full, [&](std::uint64_t done, std::uint64_t total) {
    last_done = done;
    last_total = total;
  });
  CHECK(v.manifest.world_size == 2);
  CHECK(v.tier.run_id == c.run_id);
  CHECK(last_total == c.bytes);
  CHECK(last_done == c.bytes);
  const std::string key = c.data_prefix + ck.m.shards[1].path;
  auto bytes = store->get(key);
  bytes[bytes.size() - 1] ^= std::byte{0x10};
  store->put(key, bytes);
  for (const Verify mode : {Verify::fast, Verify::full}) {
    const Error e = test::error_of([&] { verify_object_checkpoint(*store, 10, mode); });
    CHECK(e.code() == Errc::checksum_mismatch);
    CHECK(e.file() == store->name_of(key));
  }
  CHECK_NOTHROW(verify_object_checkpoint(*store, 10, Verify::none));  // sizes only
}

TEST_CASE("a shard object whose header was rewritten and resealed is refused by read_object_tensor and verify at every level") {
  // The object's header says I32 where the index says F32, and every checksum on the store was
  // recomputed to match: the shard's record in the checkpoint manifest, and that manifest's
  // SHA-256 and size in the tier manifest. Only the header check can tell.
  test::SavedCheckpoint ck(2, 10);
  auto store = test::rgw_store("resealed-header");
  const ObjectCommitReport c = commit_to_object_store(posix_file_system(), ck.dir.path().string(), 10, *store);
  const std::string key = c.data_prefix + ck.m.shards[1].path, manifest_key = c.data_prefix + "manifest.json";
  auto bytes = store->get(key);
  std::string shard = test::text_of(bytes);
  const std::string from = "\"f32\":{\"dtype\":\"F32\"";
  const auto at = shard.find(from);
  REQUIRE(at != std::string::npos);
  shard.replace(at, from.size(), "\"f32\":{\"dtype\":\"I32\"");
  store->put(key, test::bytes_of(shard));
  Manifest m = decode_manifest(test::text_of(store->get(manifest_key)), manifest_key);
  FileHasher hasher(m.chunk_size);
  hasher.update(test::bytes_of(shard));
  const FileDigest d = hasher.finish();
  ShardRecord& rec = m.shards[1];
  rec.size = d.size, rec.sha256 = d.sha256, rec.xxh3 = d.xxh3, rec.chunk_xxh3 = d.chunk_xxh3;
  const std::string text = encode_manifest(m);
  store->put(manifest_key, test::bytes_of(text));
  const std::string tier_key = checkpoint_dir_name(10) + "/manifest.json";
  boost::json::object tier = boost::json::parse(test::text_of(store->get(tier_key))).as_object();
  tier["manifest_sha256"] = to_hex(sha256(text.data(), text.size()));
  tier["manifest_size"] = text.size();
  store->put(tier_key, test::bytes_of(boost::json::serialize(tier) + "\n"));
  const ObjectCheckpoint opened = open_object_checkpoint(*store, 10);  // the manifests agree
  for (const Verify mode : {Verify::none, Verify::fast, Verify::full}) {
    CAPTURE(verify_name(mode));
    for (const char* name : {"f32", "u8"}) {
      const Error e = test::error_of([&] { read_object_tensor(*store, opened, 1, name, mode); });
      CHECK(e.code() == Errc::malformed_shard);
      CHECK(e.file() == store->name_of(key));
      CHECK(e.detail() == "tensor 'f32' disagrees with the manifest index in its dtype");
      CHECK(e.expected() == "F32");
      CHECK(e.actual() == "I32");
    }
    const Error e = test::error_of([&] { verify_object_checkpoint(*store, 10, mode); });
    CHECK(e.code() == Errc::malformed_shard);
    CHECK(e.file() == store->name_of(key));
  }
  // Rank 0's object is intact.
  CHECK(read_object_tensor(*store, opened, 0, "f32", Verify::fast).data.size() == 33 * 31 * 4);
}
