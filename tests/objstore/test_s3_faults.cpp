// SPDX-License-Identifier: Apache-2.0
// Failures of the object store, injected between the retrying store and the real client
// (RetryingObjectStore -> FaultInjectionObjectStore -> S3 client -> the RGW), and what the
// caller sees: retried and then success, or a typed error once the attempts run out.
#include <doctest/doctest.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/objstore/object_store.hpp"
#include "ckpt/objstore/s3.hpp"
#include "ckpt/testing/fault_object_store.hpp"
#include "objstore/rgw_fixture.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using test::bytes_of;
using test::text_of;
using Fault = testing::FaultInjectionObjectStore::Fault;
using Op = testing::FaultInjectionObjectStore::Op;

namespace {

// The stack of the failure tests, over a fresh prefix of the RGW.
struct Stack {
  explicit Stack(const std::string& tag, int attempts = 4)
      : s3(test::rgw_store(tag)),
        faults(*s3),
        store(faults, {.max_attempts = attempts, .base_delay = std::chrono::milliseconds(2), .max_delay = std::chrono::milliseconds(20)}) {}
  std::unique_ptr<ObjectStore> s3;
  testing::FaultInjectionObjectStore faults;
  RetryingObjectStore store;
};

}  // namespace

TEST_CASE("a put that meets two 503 SlowDown answers is retried and then stored") {
  Stack s("slowdown");
  s.faults.inject(Op::put, Fault::slow_down, 2);
  const std::string etag = s.store.put("obj", bytes_of("payload"));
  CHECK(etag == md5_hex(bytes_of("payload")));
  CHECK(s.store.retries() == 2);
  CHECK(s.faults.calls(Op::put) == 3);
  CHECK(text_of(s.s3->get("obj")) == "payload");
}

TEST_CASE("a 503 storm longer than the retry budget ends in the typed error of the last attempt") {
  Stack s("storm", 4);
  s.faults.inject(Op::put, Fault::slow_down, 1000);
  const Error e = test::error_of([&] { s.store.put("obj", bytes_of("payload")); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.file().starts_with("s3://"));
  CHECK(e.file().ends_with("/obj"));  // named as the client names it
  CHECK(e.detail().starts_with("after 4 attempts: PUT"));
  CHECK(e.expected() == "HTTP 2xx");
  CHECK(e.actual() == "HTTP 503 SlowDown");
  CHECK(s.faults.calls(Op::put) == 4);
  CHECK(s.store.retries() == 3);
  CHECK(test::error_of([&] { s.s3->head("obj"); }).code() == Errc::not_found);
}

TEST_CASE("a non-transient failure is not retried") {
  Stack s("no-retry");
  const Error e = test::error_of([&] { s.store.head("absent"); });
  CHECK(e.code() == Errc::not_found);
  CHECK(s.faults.calls(Op::head) == 1);
  CHECK(s.store.retries() == 0);
}

TEST_CASE("parts that time out or lose their connection are re-sent under the same part numbers and the upload completes") {
  Stack s("part-retry");
  const std::size_t part = 5u << 20;
  std::vector<std::byte> data(part + 100);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 31 + 7);
  const std::string id = s.store.create_multipart("obj");
  s.faults.inject(Op::upload_part, Fault::timeout, 1);
  const std::string e1 = s.store.upload_part("obj", id, 1, std::span(data).first(part));
  s.faults.inject(Op::upload_part, Fault::dropped, 1);  // this one reached the server: a re-send replaces it
  const std::string e2 = s.store.upload_part("obj", id, 2, std::span(data).subspan(part));
  CHECK(s.store.retries() == 2);
  s.faults.inject(Op::complete_multipart, Fault::server_error, 1);
  const std::vector<CompletedPart> parts{{1, e1}, {2, e2}};
  s.store.complete_multipart("obj", id, parts);
  CHECK(s.s3->get("obj") == data);
  CHECK(s.s3->list_multipart_uploads("").empty());
}

TEST_CASE("a create whose answer was lost is retried and succeeds because its own bytes landed") {
  Stack s("lost-answer");
  s.faults.inject(Op::put, Fault::dropped, 1);
  const std::string etag = s.store.create("manifest", bytes_of("mine"));
  CHECK(etag == md5_hex(bytes_of("mine")));
  CHECK(s.store.retries() == 1);
  CHECK(text_of(s.s3->get("manifest")) == "mine");
}

TEST_CASE("a create that loses the race to another writer reports conflict, retried or not") {
  Stack s("lost-race");
  s.faults.inject(Op::put, Fault::lost_race, 1);
  const Error e = test::error_of([&] { s.store.create("manifest", bytes_of("mine")); });
  CHECK(e.code() == Errc::conflict);
  CHECK(e.actual() == "HTTP 412 PreconditionFailed");
  CHECK(text_of(s.s3->get("manifest")) == "an object another writer put first");

  // A timeout first, then the race: the retry meets the other writer's object, not ours.
  s.faults.inject(Op::put, Fault::timeout, 1);
  const Error again = test::error_of([&] { s.store.create("manifest", bytes_of("mine")); });
  CHECK(again.code() == Errc::conflict);
}

TEST_CASE("a compare-and-swap that loses the race to another writer reports conflict and keeps the winner") {
  Stack s("cas-race");
  const std::string etag = s.store.put("latest", bytes_of("step-10"));
  s.faults.inject(Op::put, Fault::lost_race, 1);
  const Error e = test::error_of([&] { s.store.replace("latest", bytes_of("step-20"), etag); });
  CHECK(e.code() == Errc::conflict);
  CHECK(e.expected() == "ETag " + etag);
  CHECK(text_of(s.s3->get("latest")) == "an object another writer put first");
}

TEST_CASE("a part that never completes is given up: the upload is aborted and none is left listed") {
  Stack s("hang", 1);
  const std::string id = s.store.create_multipart("obj");
  s.faults.inject(Op::upload_part, Fault::hang, 1);
  Error stuck(Errc::io_error, {}, "not yet");
  std::thread uploader([&] { stuck = test::error_of([&] { s.store.upload_part("obj", id, 1, bytes_of("never")); }); });
  for (int i = 0; i < 500 && s.faults.hanging() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  REQUIRE(s.faults.hanging() == 1);
  CHECK(s.store.list_multipart_uploads("").size() == 1);
  s.store.abort_multipart("obj", id);  // the caller gives the part up
  s.faults.release_hangs();
  uploader.join();
  CHECK(stuck.code() == Errc::io_error);
  CHECK(stuck.actual() == "no response");
  CHECK(stuck.sys_errno() == ETIMEDOUT);
  CHECK(s.store.list_multipart_uploads("").empty());
  CHECK(test::error_of([&] { s.s3->head("obj"); }).code() == Errc::not_found);
}

TEST_CASE("an abort whose answer was lost is retried and succeeds although the upload is gone") {
  Stack s("abort-lost");
  const std::string id = s.store.create_multipart("obj");
  s.faults.inject(Op::abort_multipart, Fault::dropped, 1);
  s.store.abort_multipart("obj", id);
  CHECK(s.store.retries() == 1);
  CHECK(s.store.list_multipart_uploads("").empty());
}

TEST_CASE("a server that refuses connections is a transient no-response error with ECONNREFUSED, retried then reported") {
  S3Options o = test::rgw_options(test::unique_prefix("refused"));
  o.endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
  o.retry = {.max_attempts = 3, .base_delay = std::chrono::milliseconds(1), .max_delay = std::chrono::milliseconds(5)};
  auto store = open_s3(o);
  const Error e = test::error_of([&] { store->head("x"); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.actual() == "no response");
  CHECK(e.sys_errno() == ECONNREFUSED);
  CHECK(is_transient(e));
  CHECK(e.detail().starts_with("after 3 attempts: HEAD to http://127.0.0.1:1 failed"));
}
