// SPDX-License-Identifier: Apache-2.0
// ckpt-recovery-bench, run as a user would: every level recovers the saved state (the bench
// checks the bytes), each through the level its plan names, the memory held per byte is what
// each scheme promises, and the kills leave no bad resume.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <map>
#include <string>

#include "support/json_doc.hpp"
#include "support/test_support.hpp"

namespace {
const std::string kBin = std::string(CKPT_TEST_BINARY_DIR) + "/bin/";
}

TEST_CASE("ckpt-recovery-bench --quick recovers from every level through the plan, and measures memory held, save overhead and kills") {
  ckpt::test::TempDir dir;
  const std::string json = (dir / "r.json").string(), md = (dir / "r.md").string();
  int status = 0;
  const auto out = ckpt::test::run_command(kBin + "ckpt-recovery-bench --quick --kills 2 --step-ms 10 --dir " + (dir / "work").string() + " --json " + json +
                                               " --markdown " + md + " 2>&1",
                                           &status);
  CAPTURE(out);
  REQUIRE(status == 0);
  const auto bytes = ckpt::test::read_all(json);
  const auto doc = boost::json::parse(std::string(bytes.begin(), bytes.end())).as_object();
  ckpt::test::check_documented_output(doc, "ckpt-recovery-bench");  // its schema and fields as docs/json-output.md lists them
  const auto& levels = doc.at("levels").as_object();
  const std::map<std::string, std::string> plan = {{"memory", "from memory mem://recovery-bench-"},
                                                   {"memory, one node rebuilt (rs:3+1)", "(its lost files rebuilt from the other nodes' redundancy first)"},
                                                   {"local disk, page cache dropped", "/local-0 (read in place)"},
                                                   {"durable directory", "/durable-0 (read in place)"}};
  for (const auto& [level, says] : plan) {
    CAPTURE(level);
    REQUIRE(levels.contains(level));
    const auto& l = levels.at(level).as_object();
    CHECK(std::string(l.at("plan").as_string()).find(says) != std::string::npos);
    CHECK(l.at("seconds").as_array().at(0).to_number<double>() > 0);
    CHECK(l.at("phases").as_object().at("load").to_number<double>() > 0);
  }
  CHECK(levels.at("memory, one node rebuilt (rs:3+1)").as_object().at("phases").as_object().at("rebuild").to_number<double>() > 0);
  const double rs = doc.at("held_per_byte").as_object().at("rs:3+1").to_number<double>();
  const double rep = doc.at("held_per_byte").as_object().at("replicate:2").to_number<double>();
  CHECK(rs >= 4.0 / 3.0);
  CHECK(rs < 4.0 / 3.0 * 1.005);
  CHECK(rep >= 2.0);
  CHECK(rep < 2.0 * 1.005);
  CHECK(doc.at("kills").at("kills").as_int64() == 2);
  CHECK(doc.at("kills").at("bad_resumes").as_int64() == 0);
  CHECK(doc.at("overhead").at("accelerator").at("interval_steps").as_int64() >= 1);
  CHECK(doc.at("young_daly").as_array().size() == 4);
  const auto table = ckpt::test::read_all(md);
  CHECK(std::string(table.begin(), table.end()).find("| time to recover from | total s |") != std::string::npos);
  ckpt::test::run_command(kBin + "ckpt-recovery-bench --rounds 0 2>&1", &status);
  CHECK(status == 2);
}
