// SPDX-License-Identifier: Apache-2.0
// ckpt recover --plan: the recovery planner (store/recovery.hpp) as a user runs it, over a
// memory root and a disk directory.
#include <doctest/doctest.h>

#include <unistd.h>

#include <boost/json.hpp>
#include <filesystem>

#include "apps/ckpt_tool_fixture.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "store/conformance.hpp"

namespace {
using namespace ckpt;
namespace fs = std::filesystem;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void put(const std::string& root, std::initializer_list<std::uint64_t> steps) {
  auto store = open_store(root);
  auto w = store->writer();
  for (const auto s : steps) test::put_checkpoint(*w, test::SourceCheckpoint(2, s));
}
}  // namespace

TEST_CASE("ckpt recover --plan prints the level, step and fetch of every candidate and the plan's line, and loads nothing") {
  const std::string mem = "mem://tool-recover-" + std::to_string(::getpid());
  const fs::path dir = memory_root_dir(mem);
  fs::remove_all(dir);
  test::TempDir disk;
  const std::string durable = (disk / "durable").string();
  put(durable, {10});
  put(mem, {10, 20});
  fs::resize_file(dir / checkpoint_dir_name(20) / shard_file_name(0, 2), 10);
  const auto before = fs::last_write_time(dir / checkpoint_dir_name(20));

  const auto text = test::ckpt_run("recover --plan " + mem + " " + durable);
  CAPTURE(text.out);
  CHECK(text.status == 0);
  CHECK(contains(text.out, "LEVEL KIND         ROOT"));
  CHECK(contains(text.out, "passed over: "));
  CHECK(contains(text.out, "plan: step 10 from memory " + mem + " (read in place); passed over: step 20 on memory " + mem + ": "));
  CHECK(fs::file_size(dir / checkpoint_dir_name(20) / shard_file_name(0, 2)) == 10);
  CHECK(fs::last_write_time(dir / checkpoint_dir_name(20)) == before);

  const auto js = test::ckpt_run("recover --plan --json " + mem + " " + durable);
  CHECK(js.status == 0);
  const auto v = boost::json::parse(js.out).as_object();
  CHECK(v.at("ok").as_bool());
  CHECK(v.at("chosen").at("step").as_int64() == 10);
  CHECK(v.at("chosen").at("kind").as_string() == "memory");
  CHECK(v.at("chosen").at("fetch").as_string() == "read");
  CHECK(v.at("candidates").as_array().size() == 2);
  CHECK(v.at("candidates").at(0).at("usable").as_bool() == false);
  CHECK(v.at("discover_seconds").as_double() >= 0);

  // Nothing anywhere: exit 1, each level named with why.
  fs::remove_all(dir);
  const auto none = test::ckpt_run("recover --plan " + mem + " " + (disk / "missing").string());
  CHECK(none.status == 1);
  CHECK(contains(none.out, "plan: nothing to recover: " + mem + ": holds no committed checkpoint; "));
  // Without --plan: a usage of the library's typed error.
  const auto bare = test::ckpt_run("recover " + durable);
  CHECK(bare.status == 1);
  CHECK(contains(bare.out, "invalid argument"));
  CHECK(contains(bare.out, "--plan"));
}
