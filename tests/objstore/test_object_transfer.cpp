// SPDX-License-Identifier: Apache-2.0
// upload_file against the real RGW: one put or a multipart upload with parts in flight, the
// caller's check of every byte read, and the abort that leaves nothing behind on a failure.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "ckpt/core/error.hpp"
#include "ckpt/objstore/object_transfer.hpp"
#include "ckpt/testing/fault_object_store.hpp"
#include "objstore/rgw_fixture.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using Fault = testing::FaultInjectionObjectStore::Fault;
using Op = testing::FaultInjectionObjectStore::Op;

namespace {

std::vector<std::byte> write_file(const std::filesystem::path& p, std::size_t n, std::uint64_t seed) {
  const auto bytes = test::random_bytes(n, seed);
  test::write_all(p, bytes);
  std::vector<std::byte> out(n);
  std::memcpy(out.data(), bytes.data(), n);
  return out;
}

}  // namespace

TEST_CASE("a file below the multipart threshold goes up in one put and its ETag is its MD5") {
  test::TempDir dir;
  const auto data = write_file(dir / "small", 100000, 3);
  auto store = test::rgw_store("upload-small");
  const UploadReport r = upload_file(*store, posix_file_system(), (dir / "small").string(), "step-1/small");
  CHECK(r.parts == 0);
  CHECK(r.bytes == data.size());
  CHECK(r.etag == md5_hex(data));
  CHECK(store->get("step-1/small") == data);
}

TEST_CASE("a file above the threshold goes up in parts, three in flight, each byte checked once, and reads back equal") {
  test::TempDir dir;
  const std::size_t mib = 1u << 20;
  const auto data = write_file(dir / "big", 23 * mib + 777, 4);
  auto store = test::rgw_store("upload-big");
  std::mutex mu;
  std::map<std::uint64_t, std::size_t> checked;
  const UploadOptions opt{.multipart_threshold = 8 * mib, .part_size = 5 * mib, .parts_in_flight = 3};
  const UploadReport r = upload_file(*store, posix_file_system(), (dir / "big").string(), "step-1/big", opt,
                                     [&](std::uint64_t offset, std::span<const std::byte> bytes) {
                                       std::lock_guard lock(mu);
                                       checked[offset] = bytes.size();
                                     });
  CHECK(r.parts == 5);
  CHECK(r.etag.ends_with("-5"));
  std::uint64_t expect = 0;
  for (const auto& [offset, len] : checked) {
    CHECK(offset == expect);
    expect += len;
  }
  CHECK(expect == data.size());
  CHECK(store->head("step-1/big").etag == r.etag);
  CHECK(store->get("step-1/big") == data);
  CHECK(store->list_multipart_uploads("").empty());
}

TEST_CASE("an upload whose parts meet a 503 storm fails with the typed error after the retries and is aborted") {
  test::TempDir dir;
  write_file(dir / "big", 12u << 20, 5);
  auto s3 = test::rgw_store("upload-storm");
  testing::FaultInjectionObjectStore faults(*s3);
  RetryingObjectStore store(faults, test::fast_retries(3));
  faults.inject(Op::upload_part, Fault::slow_down, 1000);
  const UploadOptions opt{.multipart_threshold = 1, .part_size = 5u << 20, .parts_in_flight = 2};
  const Error e = test::error_of([&] { upload_file(store, posix_file_system(), (dir / "big").string(), "obj", opt); });
  CHECK(e.code() == Errc::io_error);
  CHECK(e.actual() == "HTTP 503 SlowDown");
  CHECK(e.detail().starts_with("after 3 attempts: PUT part "));
  CHECK(faults.calls(Op::abort_multipart) == 1);
  CHECK(s3->list_multipart_uploads("").empty());
  CHECK(test::error_of([&] { s3->head("obj"); }).code() == Errc::not_found);
}

TEST_CASE("a part that fails the caller's check fails the upload with that error, and the upload is aborted") {
  test::TempDir dir;
  write_file(dir / "big", 12u << 20, 6);
  auto store = test::rgw_store("upload-check");
  const UploadOptions opt{.multipart_threshold = 1, .part_size = 5u << 20, .parts_in_flight = 1};
  const Error e = test::error_of([&] {
    upload_file(*store, posix_file_system(), (dir / "big").string(), "obj", opt, [&](std::uint64_t offset, std::span<const std::byte>) {
      if (offset == (5u << 20)) throw Error(Errc::checksum_mismatch, (dir / "big").string(), "xxh3 of chunk 1", "aa", "bb");
    });
  });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.detail() == "xxh3 of chunk 1");
  CHECK(store->list_multipart_uploads("").empty());
  CHECK(test::error_of([&] { store->head("obj"); }).code() == Errc::not_found);
}

TEST_CASE("an upload of a missing file is not_found and creates no multipart upload") {
  test::TempDir dir;
  auto store = test::rgw_store("upload-missing");
  CHECK(test::error_of([&] { upload_file(*store, posix_file_system(), (dir / "none").string(), "obj"); }).code() == Errc::not_found);
  CHECK(store->list_multipart_uploads("").empty());
}

TEST_CASE("upload options outside S3's limits are invalid arguments naming the option") {
  test::TempDir dir;
  write_file(dir / "f", 10, 7);
  auto store = test::rgw_store("upload-options");
  const Error small = test::error_of([&] { upload_file(*store, posix_file_system(), (dir / "f").string(), "obj", {.part_size = 1u << 20}); });
  CHECK(small.code() == Errc::invalid_argument);
  CHECK(small.detail() == "UploadOptions::part_size");
  const Error flight = test::error_of([&] { upload_file(*store, posix_file_system(), (dir / "f").string(), "obj", {.parts_in_flight = 0}); });
  CHECK(flight.detail() == "UploadOptions::parts_in_flight");
}
