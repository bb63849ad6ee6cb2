// SPDX-License-Identifier: Apache-2.0
// The endpoint (metrics/server.hpp, ckpt::metrics): fetched with curl, a real HTTP client,
// from a running Checkpointer. Built only with the component (CKPT_METRICS).
#include <doctest/doctest.h>

#ifdef CKPT_TEST_METRICS_SERVER

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "ckpt/metrics/server.hpp"
#include "exposition.hpp"
#include "metrics_fixture.hpp"

namespace {

struct Response {
  int status = 0;  // curl's exit status
  std::string headers, body;
};

// GET `url` with curl: the response's headers and body.
Response fetch(const std::string& url) {
  ckpt::test::TempDir dir("ckpt-metrics-curl");
  const auto headers = dir.path() / "headers";
  Response r;
  r.body = ckpt::test::run_command("curl -sS --max-time 10 -D " + headers.string() + " " + url, &r.status);
  std::ifstream in(headers);
  std::stringstream ss;
  ss << in.rdbuf();
  r.headers = ss.str();
  return r;
}

// The local address of the socket listening on `port`, from /proc/net/tcp ("0100007F" is
// 127.0.0.1), or "" if none is found.
std::string listening_address(int port) {
  std::ifstream in("/proc/net/tcp");
  char want[8];
  std::snprintf(want, sizeof want, ":%04X", port);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (state == "0A" && local.ends_with(want)) return local.substr(0, local.find(':'));
  }
  return {};
}

void save_three_steps(ckpt::Checkpointer& ckpt) { ckpt::test::save_steps(ckpt, 2, 3, 1024); }

}  // namespace

TEST_CASE("curl fetches every documented metric from a running Checkpointer's endpoint, as text/plain") {
  ckpt::test::TempDir dir("ckpt-metrics-server");
  ckpt::Checkpointer ckpt({.root = (dir.path() / "root").string(), .world_size = 2, .backend = ckpt::WriterBackend::posix});
  ckpt::MetricsServer server(ckpt);  // port 0: a free one
  REQUIRE(server.port() > 0);
  CHECK(server.url() == "http://127.0.0.1:" + std::to_string(server.port()) + "/metrics");

  const auto before = fetch(server.url());
  REQUIRE(before.status == 0);
  CHECK(before.headers.starts_with("HTTP/1.1 200"));
  // prometheus-cpp 1.0 says "text/plain; charset=utf-8": Prometheus reads text/plain as 0.0.4.
  CHECK(before.headers.find("Content-Type: text/plain") != std::string::npos);
  auto e = ckpt::test::parse_exposition(before.body);
  ckpt::test::check_documented(e);
  CHECK(e.value("ckpt_checkpoints_committed_total") == 0);

  save_three_steps(ckpt);
  const auto after = fetch(server.url());
  REQUIRE(after.status == 0);
  e = ckpt::test::parse_exposition(after.body);
  ckpt::test::check_documented(e);
  CHECK(e.value("ckpt_checkpoints_committed_total") == 3);
  CHECK(e.value("ckpt_last_committed_step") == 3);
  CHECK(e.value("ckpt_saves_total") == 6);
  CHECK(e.value("ckpt_committed_bytes_total") == static_cast<double>(ckpt.stats().bytes_committed));
  CHECK(e.value("ckpt_save_phase_seconds_count", {{"phase", "write"}}) == 6);
  CHECK(e.value("ckpt_save_phase_seconds_bucket", {{"phase", "write"}, {"le", "+Inf"}}) == 6);
  CHECK(e.value("ckpt_save_phase_seconds_bucket", {{"phase", "fsync"}, {"le", "60"}}) <= 6);
}

TEST_CASE("the endpoint serves the same families as render_prometheus") {
  ckpt::test::TempDir dir("ckpt-metrics-server");
  ckpt::Checkpointer ckpt({.root = (dir.path() / "root").string(), .world_size = 2, .backend = ckpt::WriterBackend::posix});
  save_three_steps(ckpt);
  ckpt::MetricsServer server(ckpt);
  const auto served = ckpt::test::parse_exposition(fetch(server.url()).body);
  const auto rendered = ckpt::test::parse_exposition(ckpt::render_prometheus(ckpt));
  for (const auto& [name, type] : rendered.type) {
    CAPTURE(name);
    REQUIRE(served.type.count(name) == 1);
    CHECK(served.type.at(name) == type);
    CHECK(served.help.at(name) == rendered.help.at(name));
  }
  for (const auto& s : rendered.samples) {
    CAPTURE(s.name);
    if (s.name.find("stall") != std::string::npos || s.name == "ckpt_staging_bytes") continue;
    CHECK(served.value(s.name, s.labels) == doctest::Approx(s.value));
  }
}

TEST_CASE("the endpoint binds 127.0.0.1 by default and answers 404 off /metrics") {
  ckpt::MetricsServer server([] { return ckpt::checkpointer_metrics(ckpt::CheckpointerStats{}); });
  CHECK(listening_address(server.port()) == "0100007F");
  const auto other = fetch("-o /dev/null -w '%{http_code}' http://127.0.0.1:" + std::to_string(server.port()) + "/other");
  CHECK(other.body == "404");
}

TEST_CASE("a port in use is refused with io_error naming the address and port") {
  ckpt::MetricsServer first([] { return std::vector<ckpt::MetricFamily>{}; });
  const auto e = ckpt::test::expect_error([&] {
    ckpt::MetricsServer second([] { return std::vector<ckpt::MetricFamily>{}; }, {.port = first.port()});
  });
  CHECK(e.code() == ckpt::Errc::io_error);
  CHECK(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())) != std::string::npos);
  const auto range = ckpt::test::expect_error([] { ckpt::MetricsServer bad([] { return std::vector<ckpt::MetricFamily>{}; }, {.port = 70000}); });
  CHECK(range.code() == ckpt::Errc::invalid_argument);
}

#endif  // CKPT_TEST_METRICS_SERVER
