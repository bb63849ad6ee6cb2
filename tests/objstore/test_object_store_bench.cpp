// SPDX-License-Identifier: Apache-2.0
// ckpt-object-store-bench --quick against the real RGW, run as a user would: it measures the
// upload and the resume on both tiers, writes its JSON, and leaves nothing on the store.
// Skipped where the program is not built (CKPT_BUILD_APPS=OFF).
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/objstore/s3.hpp"
#include "objstore/rgw_fixture.hpp"
#include "support/test_support.hpp"

TEST_CASE("ckpt-object-store-bench --quick measures upload and resume against the directory tier and cleans the store") {
  const std::string bin = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt-object-store-bench";
  if (!std::filesystem::exists(bin)) {
    MESSAGE("skipped: " << bin << " is not built (CKPT_BUILD_APPS=OFF)");
    std::exit(77);
  }
  auto env = ckpt::test::rgw_env();
  ckpt::test::TempDir dir;
  const std::string json = (dir / "out.json").string();
  const auto [status, out] = ckpt::test::run_with_rgw_env(bin + " --quick --bucket " + env["CKPT_S3_BUCKET"] + " --dir " +
                                                          (dir / "work").string() + " --json " + json);
  INFO(out);
  CHECK(status == 0);
  for (const char* row : {"upload to the object store", "copy to a durable directory", "resume from the object store",
                          "resume from a durable directory"})
    CHECK(out.find(row) != std::string::npos);
  std::ifstream in(json);
  std::stringstream text;
  text << in.rdbuf();
  const auto v = boost::json::parse(text.str()).as_object();
  CHECK(v.at("state_bytes").as_int64() == 16 << 20);
  CHECK(v.at("upload_object_store_s").as_array().size() == 1);
  CHECK(v.at("resume_object_store_s").as_array().at(0).as_double() > 0);
  // Nothing left under the prefix it named.
  const auto at = out.find("object store s3://");
  REQUIRE(at != std::string::npos);
  const std::string root = out.substr(at + 13, out.find('\n', at) - at - 13);
  ckpt::S3Options o = ckpt::test::rgw_options("x");
  o.root = root;
  CHECK(ckpt::make_s3_object_store(o)->list("").objects.empty());
}
