// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <thread>
#include <xxhash.h>  // the system library's reference implementation

#include "ckpt/hash/file_digest.hpp"
#include "ckpt/hash/sha256.hpp"
#include "ckpt/hash/xxh3.hpp"
#include "support/test_support.hpp"

using namespace ckpt;

namespace {
std::span<const std::byte> bytes(const std::vector<std::uint8_t>& v) { return std::as_bytes(std::span(v)); }
}  // namespace

TEST_CASE("xxh3 one-shot matches the reference value for known inputs") {
  // XXH3_64bits("") and ("abc") with seed 0, from the xxHash sanity tests.
  CHECK(xxh3_64("", 0) == 0x2D06800538D394C2ull);
  const std::string kernel(xxh3_kernel_name());
  CHECK((kernel == "avx2" || kernel == "sse2"));
  const auto data = test::random_bytes(100003, 7);
  // The dispatched kernel agrees with the plain library build on every length class.
  for (std::size_t n : {0u, 1u, 3u, 16u, 17u, 128u, 129u, 240u, 241u, 1024u, 100003u})
    CHECK(xxh3_64(data.data(), n) == XXH3_64bits(data.data(), n));
}

TEST_CASE("streaming xxh3 equals one-shot for any split") {
  const auto data = test::random_bytes(1 << 20, 11);
  const auto whole = xxh3_64(data.data(), data.size());
  for (std::size_t piece : {1u, 7u, 64u, 4095u, 65536u, 1u << 20}) {
    Xxh3 h;
    for (std::size_t off = 0; off < data.size(); off += piece)
      h.update(data.data() + off, std::min(piece, data.size() - off));
    CHECK(h.digest() == whole);
  }
}

TEST_CASE("xxh3 hex round-trips and rejects malformed text") {
  std::uint64_t v = 0;
  CHECK(xxh3_hex(0x0123456789abcdefull) == "0123456789abcdef");
  CHECK(parse_xxh3_hex("0123456789abcdef", v));
  CHECK(v == 0x0123456789abcdefull);
  CHECK_FALSE(parse_xxh3_hex("0123456789ABCDEF", v));
  CHECK_FALSE(parse_xxh3_hex("0123", v));
  CHECK_FALSE(parse_xxh3_hex("0123456789abcdeg", v));
}

TEST_CASE("sha256 matches the FIPS 180-2 test vectors") {
  CHECK(to_hex(sha256("abc", 3)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(to_hex(sha256("", 0)) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 h;  // streaming, and reusable after finish()
  h.update("a", 1);
  h.update("bc", 2);
  CHECK(to_hex(h.finish()) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  h.update("abc", 3);
  CHECK(to_hex(h.finish()) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("file hasher gives per-chunk digests independent of how the stream is split") {
  const std::uint64_t chunk = 4096;
  const auto data = test::random_bytes(3 * 4096 + 100, 3);
  FileHasher a(chunk), b(chunk);
  a.update(bytes(data));
  for (std::size_t off = 0; off < data.size(); off += 1000)
    b.update(bytes(data).subspan(off, std::min<std::size_t>(1000, data.size() - off)));
  const auto da = a.finish(), db = b.finish();
  REQUIRE(da.chunk_xxh3.size() == 4);
  CHECK(da.chunk_xxh3 == db.chunk_xxh3);
  CHECK(da.sha256 == db.sha256);
  CHECK(da.xxh3 == xxh3_64(data.data(), data.size()));
  CHECK(da.chunk_xxh3[3] == xxh3_64(data.data() + 3 * 4096, 100));
  CHECK(da.sha256 == to_hex(sha256(data.data(), data.size())));
  CHECK(da.size == data.size());
}

TEST_CASE("file hasher feeds pieces longer than its fused piece to every digest exactly once") {
  // Chunks that are not a multiple of the fused piece, and updates that span several pieces
  // and chunk boundaries: every digest must equal its one-shot value.
  const std::uint64_t chunk = 3 * FileHasher::kFusedPiece + 4099;
  const auto data = test::random_bytes(static_cast<std::size_t>(4 * chunk + 777), 11);
  FileHasher whole(chunk), split(chunk);
  whole.update(bytes(data));
  const std::size_t step = static_cast<std::size_t>(FileHasher::kFusedPiece * 2 + 333);
  for (std::size_t off = 0; off < data.size(); off += step) split.update(bytes(data).subspan(off, std::min(step, data.size() - off)));
  const auto a = whole.finish(), b = split.finish();
  REQUIRE(a.chunk_xxh3.size() == 5);
  for (std::size_t k = 0; k < 5; ++k) {
    const std::size_t begin = static_cast<std::size_t>(k * chunk);
    const std::size_t len = std::min(static_cast<std::size_t>(chunk), data.size() - begin);
    CHECK(a.chunk_xxh3[k] == xxh3_64(data.data() + begin, len));
  }
  CHECK(b.chunk_xxh3 == a.chunk_xxh3);
  CHECK(a.xxh3 == xxh3_64(data.data(), data.size()));
  CHECK(b.xxh3 == a.xxh3);
  CHECK(a.sha256 == to_hex(sha256(data.data(), data.size())));
  CHECK(b.sha256 == a.sha256);
  CHECK(a.size == data.size());
}

TEST_CASE("file hasher handles empty and exact-multiple sizes") {
  FileHasher empty(4096);
  auto d = empty.finish();
  CHECK(d.chunk_xxh3.empty());
  CHECK(d.size == 0);
  const auto data = test::random_bytes(8192, 5);
  FileHasher exact(4096, /*with_sha256=*/false);
  exact.update(bytes(data));
  d = exact.finish();
  CHECK(d.chunk_xxh3.size() == 2);
  CHECK(d.sha256.empty());
  CHECK(chunk_count(8192, 4096) == 2);
  CHECK(chunk_count(8193, 4096) == 3);
}

TEST_CASE("file hasher split across two threads gives every digest one pass gives, and refuses halves fed different byte counts") {
  const std::uint64_t chunk = 2 * FileHasher::kFusedPiece + 4099;
  const auto data = test::random_bytes(static_cast<std::size_t>(3 * chunk + 1234), 21);
  FileHasher one(chunk), two(chunk);
  one.update(bytes(data));
  const std::size_t step = 100'003;  // pieces across chunk and fused-piece boundaries
  std::thread sha([&] {
    for (std::size_t off = 0; off < data.size(); off += step) two.update_sha256(bytes(data).subspan(off, std::min(step, data.size() - off)));
  });
  for (std::size_t off = 0; off < data.size(); off += step) two.update_checksums(bytes(data).subspan(off, std::min(step, data.size() - off)));
  sha.join();
  const auto a = one.finish(), b = two.finish();
  CHECK(b.chunk_xxh3 == a.chunk_xxh3);
  CHECK(b.xxh3 == xxh3_64(data.data(), data.size()));
  CHECK(b.sha256 == to_hex(sha256(data.data(), data.size())));
  CHECK(b.size == data.size());

  FileHasher short_sha(chunk);
  short_sha.update_checksums(bytes(data));
  short_sha.update_sha256(bytes(data).first(100));
  const Error e = test::expect_error([&] { (void)short_sha.finish(); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == std::to_string(data.size()) + " bytes (XXH3)");
  CHECK(e.actual() == "100 bytes (SHA-256)");
  FileHasher no_sha(chunk, /*with_sha256=*/false);  // the split without SHA-256: the XXH3s only
  no_sha.update_checksums(bytes(data));
  const auto c = no_sha.finish();
  CHECK(c.sha256.empty());
  CHECK(c.chunk_xxh3 == a.chunk_xxh3);
}
