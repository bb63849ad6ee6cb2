// The ckpt tool on an s3:// root of the real RGW: ls lists the committed steps, verify
// checks the latest one in ranged GETs, and a rewritten object makes both exit 1 naming it.
// Skipped where the tool is not built (CKPT_BUILD_APPS=OFF).
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "ckpt/io/object_commit.hpp"
#include "ckpt/io/save.hpp"
#include "io/io_fixture.hpp"
#include "objstore/rgw_fixture.hpp"

using namespace ckpt;

namespace {

const std::string kTool = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt";

std::pair<int, std::string> run(const std::string& args) {
  auto env = test::rgw_env();
  std::string line;
  for (const auto& [k, v] : env) line += k + "=" + v + " ";
  FILE* p = ::popen(("env " + line + kTool + " " + args + " 2>&1").c_str(), "r");
  REQUIRE(p);
  std::string out;
  char buf[4096];
  while (const std::size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

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
