// SPDX-License-Identifier: Apache-2.0
// ReedSolomon (store/nodes/erasure.hpp) against an independent GF(2^8) implementation of the code
// matrix the header documents: a decoder written from docs/format.md alone must agree.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/store/nodes/erasure.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using ckpt::test::expect_error;
using ckpt::test::random_bytes;

namespace {

// GF(2^8) with x^8 + x^4 + x^3 + x^2 + 1 (0x11d), by shift and add: no tables shared with ISA-L.
std::uint8_t gf_mul(std::uint8_t a, std::uint8_t b) {
  unsigned acc = 0, x = a;
  for (unsigned y = b; y; y >>= 1) {
    if (y & 1) acc ^= x;
    x <<= 1;
    if (x & 0x100) x ^= 0x11d;
  }
  return static_cast<std::uint8_t>(acc);
}
std::uint8_t gf_inv(std::uint8_t a) {
  // a^254 = a^-1 in GF(2^8).
  std::uint8_t r = 1;
  for (int i = 0; i < 254; ++i) r = gf_mul(r, a);
  return r;
}

// Row `row` of the documented code matrix: identity for data rows, inverse((row) xor j) for parity.
std::vector<std::uint8_t> reference_row(int k, int row) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(k));
  for (int j = 0; j < k; ++j)
    out[static_cast<std::size_t>(j)] = row < k ? (row == j ? 1 : 0) : gf_inv(static_cast<std::uint8_t>(row ^ j));
  return out;
}

std::vector<std::uint8_t> reference_parity(int k, int p, const std::vector<std::vector<std::uint8_t>>& data, std::size_t len) {
  const auto row = reference_row(k, k + p);
  std::vector<std::uint8_t> out(len, 0);
  for (int j = 0; j < k; ++j)
    for (std::size_t b = 0; b < len; ++b) out[b] ^= gf_mul(row[static_cast<std::size_t>(j)], data[static_cast<std::size_t>(j)][b]);
  return out;
}

// Every subset of {0..n-1} with 1..max elements.
std::vector<std::vector<int>> subsets(int n, int max) {
  std::vector<std::vector<int>> out;
  for (unsigned mask = 1; mask < (1u << n); ++mask) {
    std::vector<int> s;
    for (int i = 0; i < n; ++i)
      if (mask & (1u << i)) s.push_back(i);
    if (static_cast<int>(s.size()) <= max) out.push_back(s);
  }
  return out;
}

struct Geometry {
  int k, m;
};
constexpr std::array<Geometry, 6> kGeometries{{{1, 1}, {2, 1}, {3, 1}, {2, 2}, {4, 2}, {3, 3}}};
constexpr std::array<std::size_t, 5> kLengths{1, 7, 64, 4097, 10001};

}  // namespace

TEST_CASE("the code matrix is the identity over ISA-L's Cauchy rows inverse((K + p) xor j) in GF(2^8) mod 0x11d") {
  for (const auto g : kGeometries) {
    const ReedSolomon code(g.k, g.m);
    CHECK(code.k() == g.k);
    CHECK(code.m() == g.m);
    for (int r = 0; r < g.k + g.m; ++r) {
      INFO("K " << g.k << " M " << g.m << " row " << r);
      const auto got = code.row(r);
      const auto want = reference_row(g.k, r);
      REQUIRE(got.size() == want.size());
      CHECK(std::equal(got.begin(), got.end(), want.begin()));
    }
  }
  // The largest code: the last parity row still follows the formula.
  const ReedSolomon big(200, 55);
  const auto last = big.row(254);
  const auto want = reference_row(200, 254);
  CHECK(std::equal(last.begin(), last.end(), want.begin()));
}

TEST_CASE("parity computed by encode is the documented matrix times the data, byte for byte, for odd lengths") {
  for (const auto g : kGeometries)
    for (const std::size_t len : kLengths) {
      INFO("K " << g.k << " M " << g.m << " length " << len);
      const ReedSolomon code(g.k, g.m);
      std::vector<std::vector<std::uint8_t>> data;
      for (int j = 0; j < g.k; ++j) data.push_back(random_bytes(len, 1000 * static_cast<std::uint64_t>(len) + static_cast<std::uint64_t>(j)));
      std::vector<std::vector<std::uint8_t>> parity(static_cast<std::size_t>(g.m), std::vector<std::uint8_t>(len, 0xAA));
      std::vector<const std::byte*> in;
      std::vector<std::byte*> out;
      for (auto& d : data) in.push_back(reinterpret_cast<const std::byte*>(d.data()));
      for (auto& p : parity) out.push_back(reinterpret_cast<std::byte*>(p.data()));
      code.encode(in, out, len);
      for (int p = 0; p < g.m; ++p) CHECK(parity[static_cast<std::size_t>(p)] == reference_parity(g.k, p, data, len));
      // One parity piece alone (a writer of one block) gives the same bytes.
      for (int p = 0; p < g.m; ++p) {
        std::vector<std::uint8_t> one(len, 0x55);
        code.encode_one(p, in, reinterpret_cast<std::byte*>(one.data()), len);
        CHECK(one == reference_parity(g.k, p, data, len));
      }
    }
}

TEST_CASE("reconstruct rebuilds every subset of up to M lost members bit-exactly from any K survivors") {
  for (const auto g : kGeometries)
    for (const std::size_t len : kLengths) {
      const int n = g.k + g.m;
      const ReedSolomon code(g.k, g.m);
      // All K + M members: data rows then parity rows.
      std::vector<std::vector<std::uint8_t>> member;
      for (int j = 0; j < g.k; ++j) member.push_back(random_bytes(len, 77 + static_cast<std::uint64_t>(j) * 31 + len));
      for (int p = 0; p < g.m; ++p) member.push_back(std::vector<std::uint8_t>(len));
      {
        std::vector<const std::byte*> in;
        std::vector<std::byte*> out;
        for (int j = 0; j < g.k; ++j) in.push_back(reinterpret_cast<const std::byte*>(member[static_cast<std::size_t>(j)].data()));
        for (int p = 0; p < g.m; ++p) out.push_back(reinterpret_cast<std::byte*>(member[static_cast<std::size_t>(g.k + p)].data()));
        code.encode(in, out, len);
      }
      for (const auto& lost : subsets(n, g.m)) {
        std::vector<int> survivors;
        for (int r = 0; r < n; ++r)
          if (std::find(lost.begin(), lost.end(), r) == lost.end()) survivors.push_back(r);
        // The first K survivors and the last K survivors: any choice of K rows decodes.
        for (const bool from_end : {false, true}) {
          std::vector<int> have(from_end ? survivors.end() - g.k : survivors.begin(), from_end ? survivors.end() : survivors.begin() + g.k);
          std::vector<const std::byte*> have_data;
          for (int r : have) have_data.push_back(reinterpret_cast<const std::byte*>(member[static_cast<std::size_t>(r)].data()));
          std::vector<std::vector<std::uint8_t>> rebuilt(lost.size(), std::vector<std::uint8_t>(len, 0x5A));
          std::vector<std::byte*> out;
          for (auto& b : rebuilt) out.push_back(reinterpret_cast<std::byte*>(b.data()));
          code.reconstruct(have, have_data, lost, out, len);
          for (std::size_t i = 0; i < lost.size(); ++i) {
            INFO("K " << g.k << " M " << g.m << " length " << len << " lost row " << lost[i] << " of " << lost.size()
                      << (from_end ? ", last survivors" : ", first survivors"));
            CHECK(rebuilt[i] == member[static_cast<std::size_t>(lost[i])]);
          }
        }
      }
    }
}

TEST_CASE("bad geometries and bad encode and reconstruct arguments are invalid_argument") {
  for (const auto& [k, m] : std::vector<std::pair<int, int>>{{0, 1}, {1, 0}, {-1, 2}, {2, -1}, {200, 56}, {255, 1}}) {
    INFO("K " << k << " M " << m);
    CHECK(expect_error([&] { ReedSolomon(k, m); }).code() == Errc::invalid_argument);
  }
  CHECK_NOTHROW(ReedSolomon(254, 1));
  const ReedSolomon code(2, 2);
  std::vector<std::uint8_t> a(8, 1), b(8, 2), c(8), d(8);
  const std::byte* two[] = {reinterpret_cast<const std::byte*>(a.data()), reinterpret_cast<const std::byte*>(b.data())};
  const std::byte* one[] = {two[0]};
  std::byte* out2[] = {reinterpret_cast<std::byte*>(c.data()), reinterpret_cast<std::byte*>(d.data())};
  std::byte* out1[] = {out2[0]};
  const auto invalid = [](auto&& f) { return expect_error(f).code() == Errc::invalid_argument; };
  CHECK(invalid([&] { code.encode(one, out2, 8); }));
  CHECK(invalid([&] { code.encode(two, out1, 8); }));
  CHECK(invalid([&] { code.encode_one(2, two, out2[0], 8); }));
  CHECK(invalid([&] { code.encode_one(-1, two, out2[0], 8); }));
  CHECK(invalid([&] { code.encode_one(0, one, out2[0], 8); }));
  const int rows01[] = {0, 1}, rows00[] = {0, 0}, rows04[] = {0, 4}, rows0[] = {0}, row2[] = {2}, row4[] = {4}, rowm1[] = {-1};
  CHECK(invalid([&] { code.reconstruct(rows0, one, row2, out1, 8); }));   // one survivor for K = 2
  CHECK(invalid([&] { code.reconstruct(rows00, two, row2, out1, 8); }));  // a row repeated
  CHECK(invalid([&] { code.reconstruct(rows04, two, row2, out1, 8); }));  // a row out of range
  CHECK(invalid([&] { code.reconstruct(rows01, two, row4, out1, 8); }));  // a wanted row out of range
  CHECK(invalid([&] { code.reconstruct(rows01, two, rowm1, out1, 8); }));
  CHECK(invalid([&] { code.reconstruct(rows01, two, row2, out2, 8); }));  // outputs and rows disagree
  CHECK(invalid([&] { code.reconstruct(rows01, two, std::span<const int>{}, std::span<std::byte* const>{}, 8); }));
  CHECK(invalid([&] { code.reconstruct(rows01, one, row2, out1, 8); }));  // rows and pieces disagree
  // None of the refusals wrote anything.
  CHECK(c == std::vector<std::uint8_t>(8, 0));
  // Zero bytes: nothing to do, nothing touched.
  code.encode(two, out2, 0);
  CHECK(c == std::vector<std::uint8_t>(8, 0));
}
