// SPDX-License-Identifier: Apache-2.0
// ckpt-redundancy-bench, run as a user would: the figures it reports are measured, and the
// bytes it stores per byte of state are what each scheme promises (1 + M/K, F).
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <map>

#include "support/json_doc.hpp"
#include "support/test_support.hpp"

namespace {
const std::string kBin = std::string(CKPT_TEST_BINARY_DIR) + "/bin/";
}

TEST_CASE("ckpt-redundancy-bench --quick measures storage, save time and recovery for every scheme") {
  ckpt::test::TempDir dir;
  const std::string json = (dir / "r.json").string();
  int status = 0;
  const auto out = ckpt::test::run_command(kBin + "ckpt-redundancy-bench --quick --dir " + (dir / "work").string() + " --json " + json + " 2>&1", &status);
  REQUIRE(status == 0);
  CHECK(out.find("rebuilt from parity: stripe 0") != std::string::npos);
  CHECK(out.find("rebuilt from its replica on node 2") != std::string::npos);
  const auto bytes = ckpt::test::read_all(json);
  const auto doc = boost::json::parse(std::string(bytes.begin(), bytes.end())).as_object();
  ckpt::test::check_documented_output(doc, "ckpt-redundancy-bench");  // its schema and fields as docs/json-output.md lists them
  const std::map<std::string, double> promised = {{"none", 1.0}, {"rs:3+1", 4.0 / 3.0}, {"rs:2+2", 2.0}, {"replicate:2", 2.0}};
  for (const auto& v : doc.at("schemes").as_array()) {
    const auto& s = v.as_object();
    const std::string scheme(s.at("scheme").as_string());
    CAPTURE(scheme);
    // Bytes of every shard and block on disk over the state: the promise plus the shards'
    // headers and the padding of unequal pieces (below 0.5% at 16 MiB).
    const double stored = s.at("stored_per_byte").to_number<double>();
    CHECK(stored >= promised.at(scheme));
    CHECK(stored < promised.at(scheme) * 1.005);
    CHECK(s.at("save_s").as_array().size() == 1);
    CHECK(s.at("save_s").as_array()[0].to_number<double>() > 0);
    if (scheme != "none") {
      CHECK(s.at("rebuild_s").as_array()[0].to_number<double>() > 0);
      CHECK(s.at("copy_from_durable_s").as_array()[0].to_number<double>() > 0);
    }
  }
  ckpt::test::run_command(kBin + "ckpt-redundancy-bench --rounds 0 2>&1", &status);
  CHECK(status == 2);
}
