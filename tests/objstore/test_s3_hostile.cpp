// SPDX-License-Identifier: Apache-2.0
// What the S3 client does with answers a well-behaved server does not give: keys with '..'
// segments stored behind its back (the RGW keeps them as written), listings larger than its
// bound, a server that never answers, one that hangs up.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/objstore/s3.hpp"
#include "objstore/rgw_fixture.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using test::bytes_of;

namespace {

// Stores `key` (relative to the bucket) with the curl tool, bypassing the client's key check:
// `--path-as-is` keeps '..' segments in the URL, and the RGW stores the key as written.
void raw_put(const std::string& key) {
  auto env = test::rgw_env();
  const std::string empty_sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  const std::string cmd = "curl -sf -o /dev/null --path-as-is -X PUT --data-binary '' --aws-sigv4 aws:amz:" + env["AWS_REGION"] +
                          ":s3 --user " + env["AWS_ACCESS_KEY_ID"] + ":" + env["AWS_SECRET_ACCESS_KEY"] +
                          " -H 'x-amz-content-sha256: " + empty_sha + "' '" + env["AWS_ENDPOINT_URL"] + "/" +
                          env["CKPT_S3_BUCKET"] + "/" + key + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
}

// A TCP listener on 127.0.0.1 (an ephemeral port); `serve` runs on each accepted connection.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 16) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

S3Options offline(const std::string& endpoint) {
  S3Options o;
  o.root = "s3://bucket/p";
  o.endpoint = endpoint;
  o.access_key = "k";
  o.secret_key = "s";
  o.region = "us-east-1";
  return o;
}

}  // namespace

TEST_CASE("a listing from the real server holding a key with '..' segments is refused as unsafe naming the key") {
  const std::string prefix = test::unique_prefix("hostile");
  raw_put(prefix + "/step-1/../../../etc/passwd");
  auto store = make_s3_object_store(test::rgw_options(prefix));
  const Error e = test::error_of([&] { store->list(""); });
  CHECK(e.code() == Errc::unsafe_path);
  CHECK(e.actual() == "\"step-1/../../../etc/passwd\"");
}

TEST_CASE("a listing larger than the client's response bound is refused, not read") {
  S3Options o = test::rgw_options(test::unique_prefix("bounded"));
  auto store = make_s3_object_store(o);
  for (int i = 0; i < 20; ++i) store->put("key-" + std::to_string(i), bytes_of("x"));
  o.max_response_bytes = 2048;
  auto bounded = make_s3_object_store(o);
  const Error e = test::error_of([&] { bounded->list(""); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.detail() == "GET (list objects): response larger than the client's bound");
  CHECK(e.expected() == "at most 2048 bytes");
  CHECK(!is_transient(e));
  CHECK(bounded->list("", {}, 5).objects.size() == 5);  // a smaller page fits
}

TEST_CASE("a server that accepts the connection and never answers is a transient timeout (ETIMEDOUT)") {
  Listener silent;  // never accepts: the kernel completes the handshake, nobody reads
  S3Options o = offline(silent.url());
  o.request_timeout = std::chrono::milliseconds(300);
  auto store = make_s3_object_store(o);
  const Error e = test::error_of([&] { store->head("x"); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.actual() == "no response");
  CHECK(e.sys_errno() == ETIMEDOUT);
  CHECK(is_transient(e));
  CHECK(e.file() == "s3://bucket/p/x");
}

TEST_CASE("a call to a server that never answers ends within about a second of abort_calls, aborted, and later calls fail at once") {
  Listener silent;
  auto store = make_s3_object_store(offline(silent.url()));  // stall timeout: the default 30 s
  const auto t0 = std::chrono::steady_clock::now();
  std::thread giver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    store->abort_calls();
  });
  const Error e = test::error_of([&] { store->head("x"); });
  giver.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(took < 2.5);
  CHECK(e.code() == Errc::aborted);
  CHECK(e.file() == "s3://bucket/p/x");
  CHECK(e.detail() == "HEAD: the caller gave up on the store (abort_calls)");
  CHECK(!is_transient(e));
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(test::error_of([&] { store->put("y", bytes_of("y")); }).code() == Errc::aborted);
  CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::milliseconds(100));
}

TEST_CASE("a retrying store neither retries nor waits for its next attempt after abort_calls") {
  Listener silent;
  S3Options o = offline(silent.url());
  o.request_timeout = std::chrono::milliseconds(200);
  o.retry = {.max_attempts = 100, .base_delay = std::chrono::milliseconds(2000), .max_delay = std::chrono::milliseconds(2000)};
  auto store = open_s3(o);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread giver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));  // inside a wait before a retry, or an attempt
    store->abort_calls();
  });
  const Error e = test::error_of([&] { store->head("x"); });
  giver.join();
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2500));
  CHECK(e.code() == Errc::aborted);
  CHECK(e.file() == "s3://bucket/p/x");
}

TEST_CASE("a server that hangs up without answering is a transient reset (ECONNRESET)") {
  Listener rude;
  std::thread server([&] {
    for (int i = 0; i < 2; ++i) {  // curl may retry a reused connection once
      const int c = ::accept(rude.fd, nullptr, nullptr);
      if (c < 0) return;
      char buf[4096];
      (void)::read(c, buf, sizeof buf);
      ::close(c);
    }
  });
  auto store = make_s3_object_store(offline(rude.url()));
  const Error e = test::error_of([&] { store->put("x", bytes_of("payload")); });
  ::shutdown(rude.fd, SHUT_RDWR);
  server.join();
  CHECK(e.code() == Errc::io_error);
  CHECK(e.actual() == "no response");
  CHECK(e.sys_errno() == ECONNRESET);
  CHECK(is_transient(e));
}
