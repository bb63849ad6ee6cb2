// SPDX-License-Identifier: Apache-2.0
// The ckpt tool's --json, held to docs/json-output.md: every command, run on real checkpoints,
// prints the schema the doc names and exactly the top-level fields the doc lists for it, so a
// field added to the code without the doc, or listed in the doc and never printed, fails here.
// And an error's `code` is spelled as ckpt::errc_id spells it.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <filesystem>
#include <set>
#include <string>

#include "apps/ckpt_tool_fixture.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/format/sharding.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/ops/save.hpp"
#include "support/json_doc.hpp"
#include "support/node_checkpoint.hpp"

using namespace ckpt;
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {
using test::ckpt_run;
using test::Saved;

// `ckpt ARGS --json` with stdout alone (stderr dropped): the one line it prints, parsed.
json::object json_run(const std::string& args, int expected_status = 0) {
  int status = 0;
  const std::string out = test::run_command(test::kTool + " " + args + " --json 2>/dev/null", &status);
  CAPTURE(args);
  CAPTURE(out);
  CHECK(status == expected_status);
  REQUIRE(!out.empty());
  CHECK(out.find('\n') == out.size() - 1);  // one line
  const json::value v = json::parse(out);
  REQUIRE(v.is_object());
  return v.as_object();
}

// The output of `ckpt COMMAND ... --json` against the doc's section for ckpt.COMMAND.
void check_command(const std::string& command, const std::string& args, const std::set<std::string>& holds = {}, int status = 0) {
  CAPTURE(command);
  CAPTURE(args);
  test::check_documented_output(json_run(command + " " + args, status), "ckpt." + command, holds);
}

// A checkpoint of one global tensor "w" (8 x 3 floats) sliced by rows over `world` ranks: what
// reshard, consolidate and diff work on.
struct SlicedCheckpoint {
  test::TempDir dir;
  std::vector<std::vector<std::uint8_t>> rows;
  explicit SlicedCheckpoint(int world = 4) {
    SaveRequest req{.step = 10};
    for (int r = 0; r < world; ++r) {
      const std::uint64_t n = 8 / static_cast<std::uint64_t>(world);
      rows.push_back(test::random_bytes(n * 3 * 4, 100 + static_cast<std::uint64_t>(r)));
      RankState rs;
      rs.tensors.push_back({"w", DType::F32, {n, 3}, std::as_bytes(std::span(rows.back())), row_slice("w", 8, 3, r, world)});
      req.ranks.push_back(std::move(rs));
    }
    save_checkpoint_sync(posix_file_system(), root(), req);
  }
  std::string root() const { return dir.path().string(); }
};

const RedundancyScheme kRs31{.kind = RedundancyScheme::Kind::reed_solomon, .k = 3, .m = 1};
}  // namespace

TEST_CASE("ckpt ls, inspect, verify, get, prune and recover --json on a root print the schema and the fields docs/json-output.md lists") {
  Saved s;
  check_command("ls", s.root());
  check_command("inspect", s.root());
  check_command("inspect", s.ckpt_dir().string());  // named by its directory: the same fields
  check_command("verify", s.root());
  check_command("verify", "--full " + s.ckpt_dir().string());
  check_command("get", s.root() + " f32 --out " + (s.dir / "f32.npy").string());
  check_command("prune", s.root() + " --keep 1 --dry-run");
  check_command("recover", "--plan " + s.root());
}

TEST_CASE("ckpt ls, inspect, verify and repair --json on a node set print the schema and the fields docs/json-output.md lists") {
  test::SavedNodeCheckpoint s(4, 4, kRs31);
  check_command("ls", s.set(), {"node set"});
  check_command("inspect", s.set(), {"node set"});
  check_command("verify", s.set(), {"node set"});
  fs::remove(s.shard(1));  // rs:3+1 rebuilds it
  check_command("verify", s.set(), {"node set", "not ok"}, 1);
  check_command("repair", s.set(), {"node set"});
}

TEST_CASE("ckpt reshard, consolidate and diff --json print the schema and the fields docs/json-output.md lists") {
  SlicedCheckpoint c;
  const std::string r2 = (c.dir / "r2").string();
  check_command("reshard", c.root() + " " + r2 + " --world-size 2");
  check_command("consolidate", c.root() + " " + (c.dir / "model").string());
  check_command("diff", c.root() + " " + r2);
}

TEST_CASE("a failed ckpt command prints ckpt.error/1 with the error object docs/json-output.md lists") {
  const test::DocOutput doc = test::doc_output("ckpt.error");
  REQUIRE(doc.tables.size() >= 2);  // the top-level fields, then the error object's
  test::TempDir dir;
  for (const std::string& args : {"ls " + (dir / "missing").string(), "verify --no-such-flag " + dir.path().string()}) {
    CAPTURE(args);
    const json::object out = json_run(args, args.find("--no-such-flag") != std::string::npos ? 2 : 1);
    test::check_documented_output(out, "ckpt.error");
    test::check_documented_fields(out.at("error").as_object(), doc.tables[1], {}, "the error object");
  }
}

TEST_CASE("docs/json-output.md documents no output of the tool that the tests do not run") {
  // The outputs the cases above run; a section for another ckpt.* output documents nothing real.
  const std::set<std::string> run = {"ckpt.error", "ckpt.ls",      "ckpt.inspect", "ckpt.verify", "ckpt.repair", "ckpt.reshard",
                                     "ckpt.consolidate", "ckpt.prune", "ckpt.diff", "ckpt.get", "ckpt.recover"};
  std::set<std::string> documented;
  for (const auto& id : test::documented_schemas())
    if (id.starts_with("ckpt.")) documented.insert(id.substr(0, id.find('/')));
  CHECK(documented == run);
  // And every command of `ckpt --help` is among them.
  const auto help = ckpt_run("--help").out;
  for (const std::string cmd : {"ls", "inspect", "verify", "repair", "reshard", "consolidate", "prune", "diff", "get", "recover"}) {
    CAPTURE(cmd);
    CHECK(help.find("  " + cmd + " ") != std::string::npos);
    CHECK(run.count("ckpt." + cmd) == 1);
  }
}

TEST_CASE("the code of a failed command's JSON error is the errc_id of its typed error") {
  struct Case {
    const char* what;
    std::function<std::string(Saved&)> damage;  // returns the command's arguments
    Errc code;
  };
  const std::vector<Case> cases = {
      {"a flipped byte in a shard",
       [](Saved& s) {
         auto b = test::read_all(s.shard(1));
         b.at(s.m.tensors.back().begin) ^= 1;
         test::write_all(s.shard(1), b);
         return "verify " + s.ckpt_dir().string();
       },
       Errc::checksum_mismatch},
      {"a truncated shard", [](Saved& s) { fs::resize_file(s.shard(0), 4096); return "verify " + s.ckpt_dir().string(); }, Errc::size_mismatch},
      {"a missing shard", [](Saved& s) { fs::remove(s.shard(1)); return "verify " + s.ckpt_dir().string(); }, Errc::missing_shard},
      {"a garbage manifest",
       [](Saved& s) {
         test::write_all(s.ckpt_dir() / "manifest.json", {'{', 'x'});
         return "verify " + s.ckpt_dir().string();
       },
       Errc::malformed_manifest},
      {"a missing directory", [](Saved& s) { return "ls " + (s.dir / "missing").string(); }, Errc::not_found},
      {"a rank outside the world", [](Saved& s) { return "get " + s.root() + " f32 --rank 5 --out " + (s.dir / "x.npy").string(); },
       Errc::invalid_argument},
  };
  for (const auto& c : cases) {
    CAPTURE(c.what);
    Saved s;
    const json::object out = json_run(c.damage(s), 1);
    CHECK(out.at("schema") == json::value("ckpt.error/1"));
    CHECK(out.at("error").at("code") == json::value(errc_id(c.code)));
  }
}
