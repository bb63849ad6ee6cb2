// SPDX-License-Identifier: Apache-2.0
// The S3 client against a real server: a Ceph RADOS Gateway started once for this suite by
// ctest's fixture (scripts/rgw). Each test works under a prefix of its own.
#include <doctest/doctest.h>

#include <functional>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cerrno>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/objstore/object_store.hpp"
#include "ckpt/objstore/s3.hpp"
#include "objstore/rgw_fixture.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using test::bytes_of;
using test::text_of;

namespace {

std::vector<std::byte> payload(std::size_t n, std::uint64_t seed) {
  const auto b = test::random_bytes(n, seed);
  std::vector<std::byte> out(n);
  std::memcpy(out.data(), b.data(), n);
  return out;
}

}  // namespace

TEST_CASE("an object put is read back whole by get and in part by ranged gets, and head reports its size and MD5 ETag") {
  auto store = test::rgw_store("roundtrip");
  const auto data = payload(100000, 1);
  const std::string etag = store->put("a/obj", data);
  CHECK(etag == md5_hex(data));
  const ObjectInfo info = store->head("a/obj");
  CHECK(info.key == "a/obj");
  CHECK(info.size == data.size());
  CHECK(info.etag == etag);
  CHECK(store->get("a/obj") == data);
  std::vector<std::byte> mid(1000);
  store->get_range("a/obj", 54321, mid);
  CHECK(std::equal(mid.begin(), mid.end(), data.begin() + 54321));
  std::vector<std::byte> tail(10);
  store->get_range("a/obj", data.size() - 10, tail);
  CHECK(std::equal(tail.begin(), tail.end(), data.end() - 10));
}

TEST_CASE("a put replaces the object under its key and an empty object round-trips") {
  auto store = test::rgw_store("replace");
  store->put("k", bytes_of("first"));
  store->put("k", bytes_of("second"));
  CHECK(text_of(store->get("k")) == "second");
  store->put("empty", {});
  CHECK(store->head("empty").size == 0);
  CHECK(store->get("empty").empty());
}

TEST_CASE("a ranged get past the end of an object is a size mismatch naming the object") {
  auto store = test::rgw_store("range-end");
  store->put("short", bytes_of("0123456789"));
  std::vector<std::byte> out(8);
  const Error e = test::error_of([&] { store->get_range("short", 5, out); });
  CHECK(e.code() == Errc::size_mismatch);
  CHECK(e.file().ends_with("/short"));
  CHECK(e.expected() == "8 bytes");
  CHECK(e.actual() == "5 bytes");
  const Error past = test::error_of([&] { store->get_range("short", 10, out); });
  CHECK(past.code() == Errc::size_mismatch);
  CHECK(past.expected() == "at least 18 bytes");
}

TEST_CASE("head and get of a missing object are not_found naming the object and the HTTP status") {
  auto store = test::rgw_store("missing");
  const Error h = test::error_of([&] { store->head("nothing/here"); });
  CHECK(h.code() == Errc::not_found);
  CHECK(h.file().starts_with("s3://"));
  CHECK(h.file().ends_with("/nothing/here"));
  CHECK(h.actual() == "HTTP 404");  // a HEAD answer has no body, hence no S3 error code
  std::vector<std::byte> out(4);
  const Error g = test::error_of([&] { store->get_range("nothing/here", 0, out); });
  CHECK(g.code() == Errc::not_found);
  CHECK(g.expected() == "HTTP 2xx");
  CHECK(g.actual() == "HTTP 404 NoSuchKey");
}

TEST_CASE("every call on a bucket that does not exist is invalid_argument naming the bucket, never not_found") {
  S3Options o = test::rgw_options("p");
  o.root = "s3://ckpt-no-such-bucket/p";
  for (auto* store_of : {&make_s3_object_store, &open_s3}) {
    const auto store = (*store_of)(o);
    std::vector<std::byte> out(4);
    const std::vector<std::pair<const char*, std::function<void()>>> calls = {
        {"head", [&] { store->head("latest"); }},
        {"get", [&] { store->get_range("latest", 0, out); }},
        {"put", [&] { store->put("x", bytes_of("x")); }},
        {"create", [&] { store->create("x", bytes_of("x")); }},
        {"list", [&] { store->list("step-"); }},
        {"remove", [&] { store->remove("x"); }},
        {"list uploads", [&] { store->list_multipart_uploads("step-"); }},
    };
    for (const auto& [name, call] : calls) {
      CAPTURE(name);
      const Error e = test::error_of(call);
      CHECK(e.code() == Errc::invalid_argument);
      CHECK(e.file() == "s3://ckpt-no-such-bucket");
      CHECK(e.detail().find("the bucket of s3://ckpt-no-such-bucket/p does not exist") != std::string::npos);
      CHECK(e.expected() == "an existing bucket");
      CHECK(e.actual() == "HTTP 404 NoSuchBucket");
    }
  }
}

TEST_CASE("remove deletes an object, and removing a key that does not exist succeeds") {
  auto store = test::rgw_store("remove");
  store->put("gone", bytes_of("x"));
  store->remove("gone");
  CHECK(test::error_of([&] { store->head("gone"); }).code() == Errc::not_found);
  store->remove("gone");
  store->remove("never-was");
}

TEST_CASE("a listing of more keys than a page returns every key once, in order, through continuation tokens") {
  auto store = test::rgw_store("list");
  std::vector<std::string> keys;
  for (int i = 0; i < 7; ++i) keys.push_back("step-" + std::to_string(i) + "/shard");
  for (const auto& k : keys) store->put(k, bytes_of(k));
  store->put("other/x", bytes_of("not under the prefix"));
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    ObjectPage page = store->list("step-", token, 3);
    CHECK(page.objects.size() <= 3);
    for (const auto& o : page.objects) {
      seen.push_back(o.key);
      CHECK(o.size == o.key.size());
      CHECK(o.etag == md5_hex(bytes_of(o.key)));
    }
    token = page.next_token;
    ++pages;
  } while (!token.empty() && pages < 10);
  CHECK(pages == 3);
  CHECK(seen == keys);
  CHECK(store->list("nothing-").objects.empty());
}

TEST_CASE("a multipart upload of three parts joins them in part order into one object") {
  auto store = test::rgw_store("multipart");
  const std::size_t part = 5u << 20;  // S3's smallest part but the last
  const auto data = payload(2 * part + 12345, 7);
  const std::string id = store->create_multipart("big");
  CHECK(!id.empty());
  std::vector<CompletedPart> parts;
  // Uploaded out of order: the part numbers, not the order of arrival, place the bytes.
  for (int n : {3, 1, 2}) {
    const std::size_t begin = (n - 1) * part, len = std::min(part, data.size() - begin);
    const std::string etag = store->upload_part("big", id, n, std::span(data).subspan(begin, len));
    CHECK(etag == md5_hex(std::span(data).subspan(begin, len)));
    parts.push_back({n, etag});
  }
  std::sort(parts.begin(), parts.end(), [](auto& a, auto& b) { return a.number < b.number; });
  CHECK(test::error_of([&] { store->head("big"); }).code() == Errc::not_found);  // nothing visible before complete
  const std::string etag = store->complete_multipart("big", id, parts);
  CHECK(etag.ends_with("-3"));
  CHECK(store->head("big").size == data.size());
  CHECK(store->head("big").etag == etag);
  std::vector<std::byte> across(100);  // across the boundary of parts 1 and 2
  store->get_range("big", part - 50, across);
  CHECK(std::equal(across.begin(), across.end(), data.begin() + (part - 50)));
  CHECK(store->get("big") == data);
  CHECK(store->list_multipart_uploads("").empty());
}

TEST_CASE("a part sent with a Content-MD5 that does not match its bytes is refused with HTTP 400 BadDigest") {
  S3Options o = test::rgw_options(test::unique_prefix("bad-digest"));
  o.before_send = [](std::vector<std::string>& headers) {
    for (auto& h : headers)
      if (h.starts_with("Content-MD5: ")) h = "Content-MD5: " + std::string("AAAAAAAAAAAAAAAAAAAAAA==");
  };
  auto store = make_s3_object_store(o);
  auto plain = make_s3_object_store(test::rgw_options(o.root.substr(o.root.find('/', 5) + 1)));
  const std::string id = plain->create_multipart("obj");
  const Error e = test::error_of([&] { store->upload_part("obj", id, 1, bytes_of("some bytes")); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.file().ends_with("/obj"));
  CHECK(e.detail().starts_with("PUT part 1"));
  CHECK(e.expected() == "HTTP 2xx");
  CHECK(e.actual() == "HTTP 400 BadDigest");
  CHECK(!is_transient(e));
  const Error put = test::error_of([&] { store->put("whole", bytes_of("some bytes")); });
  CHECK(put.actual() == "HTTP 400 BadDigest");
  CHECK(test::error_of([&] { plain->head("whole"); }).code() == Errc::not_found);  // nothing stored
  plain->abort_multipart("obj", id);
}

TEST_CASE("a create of a key that exists is refused with conflict (HTTP 412) and the first object stays") {
  auto store = test::rgw_store("create");
  const std::string first = store->create("manifest", bytes_of("writer 1"));
  const Error e = test::error_of([&] { store->create("manifest", bytes_of("writer 2")); });
  CHECK(e.code() == Errc::conflict);
  CHECK(e.file().ends_with("/manifest"));
  CHECK(e.expected() == "no object under the key");
  CHECK(e.actual() == "HTTP 412 PreconditionFailed");
  CHECK(!is_transient(e));
  CHECK(text_of(store->get("manifest")) == "writer 1");
  CHECK(store->head("manifest").etag == first);
}

TEST_CASE("of eight writers racing to create one key exactly one wins and the others get conflict") {
  auto store = test::rgw_store("race");
  std::atomic<int> won{0}, conflicts{0}, other{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 8; ++w)
    writers.emplace_back([&, w] {
      try {
        store->create("step-10/manifest.json", bytes_of("writer " + std::to_string(w)));
        ++won;
      } catch (const Error& e) {
        (e.code() == Errc::conflict ? conflicts : other)++;
      }
    });
  for (auto& t : writers) t.join();
  CHECK(won == 1);
  CHECK(conflicts == 7);
  CHECK(other == 0);
}

TEST_CASE("a replace with the current ETag swaps the object and one with a stale ETag is refused with conflict") {
  auto store = test::rgw_store("cas");
  const std::string e1 = store->put("latest", bytes_of("step-10"));
  const std::string e2 = store->replace("latest", bytes_of("step-20"), e1);
  CHECK(e2 != e1);
  const Error e = test::error_of([&] { store->replace("latest", bytes_of("step-15"), e1); });
  CHECK(e.code() == Errc::conflict);
  CHECK(e.expected() == "ETag " + e1);
  CHECK(e.actual() == "HTTP 412 PreconditionFailed");
  CHECK(text_of(store->get("latest")) == "step-20");
  // The ETag as S3 prints it (quoted) is taken too: the client sends it bare.
  store->replace("latest", bytes_of("step-30"), "\"" + e2 + "\"");
  CHECK(text_of(store->get("latest")) == "step-30");
}

TEST_CASE("a replace of a key that does not exist is refused and creates nothing") {
  auto store = test::rgw_store("cas-missing");
  const Error e = test::error_of([&] { store->replace("latest", bytes_of("x"), "0123456789abcdef0123456789abcdef"); });
  CHECK(e.code() == Errc::conflict);  // measured: the RGW answers 412 for a missing object too
  CHECK(e.actual() == "HTTP 412 PreconditionFailed");
  CHECK(test::error_of([&] { store->head("latest"); }).code() == Errc::not_found);
}

TEST_CASE("an aborted multipart upload is no longer listed and leaves no object") {
  auto store = test::rgw_store("abort");
  const std::string keep = store->create_multipart("keep");
  const std::string drop = store->create_multipart("drop");
  store->upload_part("drop", drop, 1, bytes_of("part one"));
  auto listed = store->list_multipart_uploads("");
  REQUIRE(listed.size() == 2);
  CHECK(listed[0].key == "drop");
  CHECK(listed[0].upload_id == drop);
  CHECK(listed[1].key == "keep");
  store->abort_multipart("drop", drop);
  listed = store->list_multipart_uploads("");
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].upload_id == keep);
  CHECK(test::error_of([&] { store->head("drop"); }).code() == Errc::not_found);
  const Error again = test::error_of([&] { store->abort_multipart("drop", drop); });
  CHECK(again.code() == Errc::not_found);
  CHECK(again.actual() == "HTTP 404 NoSuchUpload");
  store->abort_multipart("keep", keep);
  CHECK(store->list_multipart_uploads("").empty());
}

TEST_CASE("a key with a '..' segment is refused as unsafe before any request is sent") {
  auto store = test::rgw_store("unsafe");
  for (const std::string& key : std::vector<std::string>{"a/../b", "..", "/abs", "a//b", "a/./b", std::string("nul\0x", 5)}) {
    const Error e = test::error_of([&] { store->put(key, bytes_of("x")); });
    CHECK(e.code() == Errc::unsafe_path);
  }
  CHECK(test::error_of([&] { store->list("../"); }).code() == Errc::unsafe_path);
}

TEST_CASE("keys with spaces, unicode and reserved characters round-trip through signing and listing") {
  auto store = test::rgw_store("encoding");
  const std::vector<std::string> keys{"a b/c+d=e&f", "\xc3\xa9t\xc3\xa9/%41~x", "q?x#y:z;w,v!u*t(s)'r@"};
  for (const auto& k : keys) {
    store->put(k, bytes_of(k));
    CHECK(text_of(store->get(k)) == k);
  }
  std::vector<std::string> listed;
  for (const auto& o : store->list("").objects) listed.push_back(o.key);
  std::vector<std::string> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  CHECK(listed == sorted);
}

TEST_CASE("a client with wrong credentials is refused with HTTP 403 and an io_error that is not transient") {
  S3Options o = test::rgw_options(test::unique_prefix("auth"));
  o.secret_key = "wrong-secret-key-wrong-secret-key-00000";
  auto store = make_s3_object_store(o);
  const Error e = test::error_of([&] { store->put("x", bytes_of("x")); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.actual() == "HTTP 403 SignatureDoesNotMatch");
  CHECK(!is_transient(e));
}
