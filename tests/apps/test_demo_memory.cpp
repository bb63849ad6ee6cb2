// SPDX-License-Identifier: Apache-2.0
// ckpt-demo's memory profile is measured: every category in the table and in each --metrics
// line, and check (c) fails for an optimizer that holds more than 12 P / N.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <sstream>

#include "support/test_support.hpp"

namespace {
const std::string kBin = std::string(CKPT_TEST_BINARY_DIR) + "/bin/";
std::string line_of(const std::string& out, const std::string& start) {
  const auto at = out.find(start);
  return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
}
}  // namespace

TEST_CASE("ckpt-demo shows every measured memory category and check (c) passes for the lean optimizer") {
  ckpt::test::TempDir dir;
  int status = 0;
  const std::string metrics = (dir / "m.jsonl").string();
  const auto out = ckpt::test::run_command(kBin + "ckpt-demo --steps 4 --save-every 2 --dir " + (dir / "run").string() + " --metrics " + metrics + " 2>&1", &status);
  CAPTURE(out);
  CHECK(status == 0);
  const std::string header = line_of(out, "  rank ");
  for (const char* column : {"params (16b)", "grads (16b)", "params (fp32)", "grads (fp32)", "optimizer", "activations", "total", "12 P / N"})
    CHECK(header.find(column) != std::string::npos);
  // 30,080 parameters over 4 ranks: 2P per 16-bit copy, 4P per fp32 copy, 12P/N of optimizer state.
  CHECK(line_of(out, "     0 ").find("          60160          60160         120320         120320          90240") == 6);
  CHECK(line_of(out, "  (c) ").find("PASS: 90240 bytes measured per rank = 12 x 30080 (padded to a multiple of 4) / 4") != std::string::npos);
  std::istringstream in([&] {
    const auto b = ckpt::test::read_all(metrics);
    return std::string(b.begin(), b.end());
  }());
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    const auto mem = boost::json::parse(line).at("memory").as_object();
    for (const char* part : {"max", "mean"})
      for (const char* key : {"params", "grads", "params32", "grads32", "optimizer", "activations", "total"}) CHECK(mem.at(part).as_object().contains(key));
    const auto& r0 = mem.at("per_rank").as_array().at(0).as_object();
    CHECK(r0.at("params32").to_number<std::uint64_t>() == 120320);
    CHECK(r0.at("grads32").to_number<std::uint64_t>() == 120320);
    CHECK(r0.at("optimizer").to_number<std::uint64_t>() == 90240);
  }
  CHECK(lines == 4);
}

TEST_CASE("ckpt-demo --inflate-optimizer: the measured optimizer bytes exceed 12 P / N and check (c) fails with exit 1") {
  int status = 0;
  const auto help = ckpt::test::run_command(kBin + "ckpt-demo --help", &status);
  CHECK(help.find("  --inflate-optimizer SIZE") != std::string::npos);
  const auto out = ckpt::test::run_command(kBin + "ckpt-demo --inflate-optimizer 4K 2>&1", &status);
  CAPTURE(out);
  CHECK(status == 1);
  CHECK(line_of(out, "  (c) ").find("FAIL: rank 0 holds 94336 optimizer bytes, expected 90240 = 12 x 30080 (padded to a multiple of 4) / 4") !=
        std::string::npos);
  CHECK(line_of(out, "     0 ").find("94336") != std::string::npos);
  CHECK(line_of(out, "  (a) ").find("PASS") != std::string::npos);  // only (c) is about it
  CHECK(out.find("resume verified") != std::string::npos);
}
