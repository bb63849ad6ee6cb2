// SPDX-License-Identifier: Apache-2.0
// The ckpt tool on an s3:// root of the real RGW: ls lists the committed steps, verify
// checks the latest one in ranged GETs, and a rewritten object makes both exit 1 naming it;
// inspect reads the manifests, get one tensor's chunks, prune collects leftovers.
// Skipped where the tool is not built (CKPT_BUILD_APPS=OFF).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/store/store.hpp"
#include "io/io_fixture.hpp"
#include "objstore/rgw_fixture.hpp"

using namespace ckpt;

namespace {

const std::string kTool = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt";

std::pair<int, std::string> run(const std::string& args) { return test::run_with_rgw_env(kTool + " " + args); }

}  // namespace

TEST_CASE("ckpt ls, verify and prune work on an s3 root, ls and verify exiting 1 naming an object rewritten behind ckpt's back") {
  if (!std::filesystem::exists(kTool)) {
    MESSAGE("skipped: " << kTool << " is not built (CKPT_BUILD_APPS=OFF)");
    std::exit(77);
  }
  const S3Options o = test::rgw_options(test::unique_prefix("cli"));
  auto store = make_s3_object_store(o);
  test::TempDir local;
  const std::string root = (local / "root").string();
  for (std::uint64_t s : {10, 20}) {
    test::Fixture fx(2, s);
    save_checkpoint_sync(posix_file_system(), root, fx.request);
    commit_to_object_store(posix_file_system(), root, s, *store);
  }
  const auto [ls_rc, ls] = run("ls --verify full " + o.root);
  INFO(ls);
  CHECK(ls_rc == 0);
  CHECK(ls.find("step-0000000010    10      2") != std::string::npos);
  CHECK(ls.find("complete (latest)") != std::string::npos);
  const auto [v_rc, v] = run("verify --full " + o.root);
  CHECK(v_rc == 0);
  CHECK(v.find("OK " + o.root + "/step-0000000020: 2 shards") != std::string::npos);

  const auto [dry_rc, dry] = run("prune --keep 1 --dry-run " + o.root);
  CHECK(dry_rc == 0);
  CHECK(dry.find("would remove step-0000000010") != std::string::npos);
  CHECK(list_object_checkpoints(*store).size() == 2);

  const ObjectManifest tier = read_object_manifest(*store, 20);
  const std::string key = tier.data_prefix + "rank-00001-of-00002.safetensors";
  auto bytes = store->get(key);
  bytes[4500] ^= std::byte{4};
  store->put(key, bytes);
  const auto [bad_rc, bad] = run("ls --verify fast " + o.root);
  CHECK(bad_rc == 1);
  CHECK(bad.find("corrupt (latest)") != std::string::npos);
  CHECK(bad.find("checksum mismatch: " + store->name_of(key)) != std::string::npos);
  const auto [bv_rc, bv] = run("verify " + o.root);
  CHECK(bv_rc == 1);
  CHECK(bv.find("checksum mismatch: " + store->name_of(key) + ": xxh3 of chunk 1 of") != std::string::npos);
  // prune keeps latest's step, corrupt or not, and removes the older one, manifest first.
  const auto [prune_rc, pruned] = run("prune --keep 1 " + o.root);
  INFO(pruned);
  CHECK(prune_rc == 0);
  CHECK(pruned.find("removed  step-0000000010") != std::string::npos);
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{20});
  CHECK(store->list("step-0000000010/").objects.empty());
}

namespace {

void skip_without_tool() {
  if (!std::filesystem::exists(kTool)) {
    MESSAGE("skipped: " << kTool << " is not built (CKPT_BUILD_APPS=OFF)");
    std::exit(77);
  }
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The lines of `text` without those starting with any of `prefixes`.
std::string without_lines(const std::string& text, std::initializer_list<std::string_view> prefixes) {
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);)
    if (std::none_of(prefixes.begin(), prefixes.end(), [&](std::string_view p) { return line.starts_with(p); })) out += line + "\n";
  return out;
}

// An s3 root under a prefix of its own (`tag`) holding steps 10 and 20 of a 2-rank fixture,
// saved first in the local root `root` (in `local`) and committed from there.
struct TwoSteps {
  S3Options o;
  std::unique_ptr<ObjectStore> store;
  test::TempDir local;
  std::string root;
  explicit TwoSteps(const std::string& tag)
      : o(test::rgw_options(test::unique_prefix(tag))), store(make_s3_object_store(o)), root((local / "root").string()) {
    skip_without_tool();
    for (std::uint64_t s : {10, 20}) {
      test::Fixture fx(2, s);
      save_checkpoint_sync(posix_file_system(), root, fx.request);
      commit_to_object_store(posix_file_system(), root, s, *store);
    }
  }
};

}  // namespace

TEST_CASE("ckpt inspect of an s3 root prints what it prints for the local checkpoint plus the run, writer id and commit time, and a missing step is not_found naming its key") {
  TwoSteps two("cli-inspect");
  auto& [o, store, local, root] = two;
  const ObjectManifest tier = read_object_manifest(*store, 20);

  const auto [rc, out] = run("inspect " + o.root);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("checkpoint  " + o.root + "/step-0000000020\n") != std::string::npos);
  CHECK(out.find("writer id   " + tier.run_id + "\n") != std::string::npos);
  CHECK(out.find("run         (not recorded: committed before run identities)\n") != std::string::npos);
  CHECK(out.find("committed   " + tier.committed_at + " (the object store's tier manifest)\n") != std::string::npos);
  const auto [lrc, lout] = run("inspect " + root + "/step-0000000020");
  CHECK(lrc == 0);
  CHECK(without_lines(out, {"checkpoint", "run ", "writer id", "committed"}) == without_lines(lout, {"checkpoint"}));

  for (const std::string& args : {"inspect " + o.root + "/step-0000000010", "inspect " + o.root + " 10", "inspect " + o.root + "/ step-0000000010"}) {
    const auto [src, sout] = run(args);
    INFO(args << "\n" << sout);
    CHECK(src == 0);
    CHECK(sout.find("checkpoint  " + o.root + "/step-0000000010\nstep        10\n") != std::string::npos);
    CHECK(sout.find("writer id   " + read_object_manifest(*store, 10).run_id + "\n") != std::string::npos);
  }
  const auto [jrc, jout] = run("inspect --json " + o.root);
  CHECK(jrc == 0);
  CHECK(jout.find("\"tier\":{\"run\":\"\",\"run_id\":\"" + tier.run_id + "\",\"committed_at\":\"" + tier.committed_at + "\"") != std::string::npos);
  CHECK(jout.find("\"manifest\":{") != std::string::npos);

  const auto [mrc, mout] = run("inspect " + o.root + "/step-0000000030");
  CHECK(mrc == 1);
  CHECK(mout.find("ckpt inspect: not found: " + store->name_of("step-0000000030/manifest.json") + ": ") != std::string::npos);
  const auto [brc, bout] = run("inspect " + o.root + "/step-0000000010 20");
  CHECK(brc == 1);
  CHECK(bout.find("invalid argument: " + o.root + "/step-0000000010: STEP with a checkpoint") != std::string::npos);
}

TEST_CASE("ckpt get of an s3 root writes the .npy the local get writes, checking only the chunks covering the tensor, and a rewritten object fails naming the key and chunk, writing nothing") {
  TwoSteps two("cli-get");
  auto& [o, store, local, root] = two;
  const auto out = [&](const std::string& name) { return (local / name).string(); };

  // f32 [33, 31] of rank 1: 4092 bytes, across two 4 KiB chunks.
  const auto [lrc, lout] = run("get " + root + " f32 --rank 1 --out " + out("local.npy"));
  REQUIRE(lrc == 0);
  const auto [rc, text] = run("get " + o.root + " f32 --rank 1 --out " + out("s3.npy"));
  INFO(text);
  CHECK(rc == 0);
  CHECK(slurp(out("s3.npy")) == slurp(out("local.npy")));
  CHECK(text.find("wrote f32 (rank 1, F32 [33, 31], 4.0 KiB) to " + out("s3.npy") + " as '<f4'\n") != std::string::npos);
  const ObjectCheckpoint ck = open_object_checkpoint(*store, 20);
  const TensorRecord* t = ck.manifest.find_tensor("f32", 1);
  REQUIRE(t);
  const std::uint64_t cs = ck.manifest.chunk_size, covering = (t->end - 1) / cs - t->begin / cs + 1;
  const auto [jrc, json] = run("get --json " + o.root + "/step-0000000020 f32 --rank 1 --out " + out("j.npy"));
  CHECK(jrc == 0);
  CHECK(json.find("\"chunks_checked\":" + std::to_string(covering) + ",") != std::string::npos);
  CHECK(json.find("\"dir\":\"" + o.root + "/step-0000000020\"") != std::string::npos);
  const auto [nvrc, nv] = run("get --json --verify none " + o.root + " f32 --rank 1 --out " + out("none.npy"));
  CHECK(nvrc == 0);
  CHECK(nv.find("\"chunks_checked\":0,") != std::string::npos);
  CHECK(slurp(out("none.npy")) == slurp(out("local.npy")));
  const auto [frc, full] = run("get " + o.root + " f32 --rank 1 --verify full --out " + out("full.npy"));
  CHECK(frc == 0);
  CHECK(full.find("verified: the whole shard (") != std::string::npos);
  CHECK(slurp(out("full.npy")) == slurp(out("local.npy")));
  // Without --rank, the lowest rank holding it; the older step by name.
  const auto [orc, older] = run("get " + o.root + "/step-0000000010 u8 --out " + out("u8.npy"));
  CHECK(orc == 0);
  CHECK(older.find("wrote u8 (rank 0, U8 [4097]") != std::string::npos);
  const auto [nrc, none] = run("get " + o.root + " nope --out " + out("nope.npy"));
  CHECK(nrc == 1);
  CHECK(none.find("not found: " + store->name_of(ck.tier.data_prefix + ck.manifest.shards[0].path) + ": no tensor 'nope' on rank 0") !=
        std::string::npos);
  CHECK_FALSE(std::filesystem::exists(out("nope.npy")));

  // One byte of f32's first chunk rewritten behind ckpt's back.
  const std::string key = ck.tier.data_prefix + ck.manifest.shards[1].path;
  auto bytes = store->get(key);
  bytes[t->begin + 1] ^= std::byte{1};
  store->put(key, bytes);
  const std::uint64_t k = t->begin / cs;
  for (const char* verify : {"fast", "full"}) {
    const auto [brc, bad] = run("get " + o.root + " f32 --rank 1 --verify " + verify + " --out " + out("bad.npy"));
    INFO(bad);
    CHECK(brc == 1);
    CHECK(bad.find("checksum mismatch: " + store->name_of(key) + ": xxh3 of chunk " + std::to_string(k) + " of ") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(out("bad.npy")));
  }
  // An existing file is left as it was.
  const auto [src, same] = run("get " + o.root + " f32 --rank 1 --out " + out("local.npy"));
  CHECK(src == 1);
  CHECK(slurp(out("local.npy")) == slurp(out("s3.npy")));
}

TEST_CASE("ckpt prune --leftovers-older-than removes an s3 root's uncommitted objects older than it, prints them, keeps younger ones and every committed step") {
  TwoSteps two("cli-leftovers");
  auto& [o, store, local, root] = two;
  const std::string leftover = "step-0000000030/deadrun/rank-00000-of-00002.safetensors";
  store->put(leftover, test::bytes_of("half a shard"));

  const auto [yrc, young] = run("prune --leftovers-older-than 3600 " + o.root);
  INFO(young);
  CHECK(yrc == 0);
  CHECK(young.find("leftovers: 0 objects removed, 0 uploads aborted, 1 younger than 3600 s kept\n") != std::string::npos);
  CHECK(store->list("step-0000000030/").objects.size() == 1);

  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the server's dates are whole seconds here
  const auto [rc, out] = run("prune --leftovers-older-than 0 " + o.root);
  INFO(out);
  CHECK(rc == 0);
  CHECK(out.find("removed  leftover " + leftover + "\n") != std::string::npos);
  CHECK(out.find("leftovers: 1 object removed, 0 uploads aborted, 0 younger than 0 s kept\n") != std::string::npos);
  CHECK(store->list("step-0000000030/").objects.empty());
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{10, 20});
  CHECK(out.find("kept     step-") == std::string::npos);  // no --keep: no checkpoint considered

  const auto [lrc, lout] = run("prune --leftovers-older-than 60 " + root);
  CHECK(lrc == 1);
  CHECK(lout.find("invalid argument: " + root + ": --leftovers-older-than collects") != std::string::npos);
  const auto [urc, uout] = run("prune " + o.root);
  CHECK(urc == 2);
  CHECK(uout.find("--keep (or --leftovers-older-than) is required") != std::string::npos);
  const auto [drc, dout] = run("prune --dry-run --leftovers-older-than 60 " + o.root);
  CHECK(drc == 2);
}

TEST_CASE("ckpt ls of an s3 root a job commits to and rotates with keep 1 never calls a checkpoint corrupt") {
  // Before ls read every root through one store (store/object/object.cpp), a step that rotation
  // removed between the listing and its read was listed as corrupt with exit 1 (18-22 of
  // ~250 runs during training).
  if (!std::filesystem::exists(kTool)) {
    MESSAGE("skipped: " << kTool << " is not built (CKPT_BUILD_APPS=OFF)");
    std::exit(77);
  }
  const S3Options o = test::rgw_options(test::unique_prefix("cli-ls-race"));
  auto client = open_s3(o);
  StoreOptions so;
  so.object_store = client.get();
  auto store = open_store(o.root, so);
  std::atomic<bool> done{false};
  std::atomic<int> commits{0};
  std::thread job([&] {
    auto w = store->writer();
    test::TempDir scratch;
    for (std::uint64_t step = 1; !done.load() && step < 400; ++step) {
      test::Fixture fx(2, step);
      const std::string root = (scratch / std::to_string(step)).string();
      const Manifest m = save_checkpoint_sync(posix_file_system(), root, fx.request);
      auto t = w->begin(step);
      for (const auto& s : m.shards)
        t->write_shard(s.rank, s.path, *posix_file_system().open_read(root + "/" + checkpoint_dir_name(step) + "/" + s.path));
      t->commit(m);
      w->rotate(1, step);
      ++commits;
    }
  });
  while (commits.load() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  int runs = 0;
  std::string bad;  // the first listing that reported damage
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(8); std::chrono::steady_clock::now() < until && bad.empty(); ++runs) {
    const auto [rc, out] = run("ls --json " + o.root);
    if (rc != 0 || out.find("\"corrupt\"") != std::string::npos) bad = "exit " + std::to_string(rc) + ": " + out;
  }
  done = true;
  job.join();
  CHECK_MESSAGE(bad.empty(), bad);
  MESSAGE(runs << " listings during " << commits.load() << " commits, each rotating the one before away");
  CHECK(runs > 3);
  CHECK(commits.load() > 3);
}

TEST_CASE("ckpt prune of an s3 root holds the prefix's writer lease: refused with busy while a job writes there, removing nothing") {
  TwoSteps two("cli-prune-lease");
  auto& [o, store, local, root] = two;
  StoreOptions so;
  so.object_store = store.get();
  const auto job = open_store(o.root, so);
  {
    const auto writer = job->writer();  // a job writing to the prefix holds its lease
    const auto [rc, out] = run("prune --keep 1 " + o.root);
    INFO(out);
    CHECK(rc == 1);
    CHECK(out.find("ckpt prune: busy: " + store->name_of("lease")) != std::string::npos);
    CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{10, 20});
    // A dry run takes no lease.
    const auto [drc, dry] = run("prune --keep 1 --dry-run " + o.root);
    CHECK(drc == 0);
    CHECK(dry.find("would remove step-0000000010") != std::string::npos);
  }
  // Released when the job's writer ends: prune takes it at once.
  const auto [rc, out] = run("prune --keep 1 " + o.root);
  INFO(out);
  CHECK(rc == 0);
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{20});
}
