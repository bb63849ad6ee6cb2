// SPDX-License-Identifier: Apache-2.0
#include "ckpt/store/nodes/erasure.hpp"

#include <isa-l/erasure_code.h>

#include <algorithm>
#include <string>

#include "ckpt/core/error.hpp"

namespace ckpt {

namespace {
[[noreturn]] void bad(const std::string& what, const std::string& expected, const std::string& actual) {
  throw Error(Errc::invalid_argument, {}, "Reed-Solomon " + what, expected, actual);
}

// ISA-L takes non-const pointers even for its inputs; it never writes them.
unsigned char** as_isal(std::span<const std::byte* const> v) {
  return const_cast<unsigned char**>(reinterpret_cast<const unsigned char* const*>(v.data()));
}
unsigned char** as_isal(std::span<std::byte* const> v) { return const_cast<unsigned char**>(reinterpret_cast<unsigned char* const*>(v.data())); }
}  // namespace

ReedSolomon::ReedSolomon(int k, int m) : k_(k), m_(m) {
  if (k < 1 || m < 1 || k + m > 255) bad("geometry", "1 <= K, 1 <= M, K + M <= 255", "K " + std::to_string(k) + ", M " + std::to_string(m));
  matrix_.resize(static_cast<std::size_t>((k + m) * k));
  gf_gen_cauchy1_matrix(matrix_.data(), k + m, k);
  tables_.resize(static_cast<std::size_t>(32 * k * m));
  ec_init_tables(k, m, matrix_.data() + k * k, tables_.data());
}

std::span<const unsigned char> ReedSolomon::row(int r) const noexcept {
  return std::span(matrix_).subspan(static_cast<std::size_t>(r * k_), static_cast<std::size_t>(k_));
}

void ReedSolomon::encode(std::span<const std::byte* const> data, std::span<std::byte* const> parity, std::size_t len) const {
  if (data.size() != static_cast<std::size_t>(k_)) bad("encode data pieces", std::to_string(k_), std::to_string(data.size()));
  if (parity.size() != static_cast<std::size_t>(m_)) bad("encode parity pieces", std::to_string(m_), std::to_string(parity.size()));
  if (len == 0) return;
  ec_encode_data(static_cast<int>(len), k_, m_, const_cast<unsigned char*>(tables_.data()), as_isal(data), as_isal(parity));
}

void ReedSolomon::encode_one(int p, std::span<const std::byte* const> data, std::byte* parity, std::size_t len) const {
  if (data.size() != static_cast<std::size_t>(k_)) bad("encode data pieces", std::to_string(k_), std::to_string(data.size()));
  if (p < 0 || p >= m_) bad("encode parity piece", "0.." + std::to_string(m_ - 1), std::to_string(p));
  if (len == 0) return;
  // ec_init_tables lays the tables out row after row, 32 x k bytes each.
  auto* out = reinterpret_cast<unsigned char*>(parity);
  ec_encode_data(static_cast<int>(len), k_, 1, const_cast<unsigned char*>(tables_.data()) + static_cast<std::size_t>(32 * k_ * p), as_isal(data), &out);
}

void ReedSolomon::reconstruct(std::span<const int> have, std::span<const std::byte* const> have_data, std::span<const int> want,
                              std::span<std::byte* const> out, std::size_t len) const {
  const int n = k_ + m_;
  if (have.size() != static_cast<std::size_t>(k_) || have_data.size() != have.size())
    bad("reconstruct surviving members", std::to_string(k_), std::to_string(have.size()) + " rows, " + std::to_string(have_data.size()) + " pieces");
  if (want.size() != out.size() || want.empty() || want.size() > static_cast<std::size_t>(n))
    bad("reconstruct wanted members", "1 to " + std::to_string(n) + " rows, as many outputs", std::to_string(want.size()) + " rows, " + std::to_string(out.size()) + " outputs");
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  for (int r : have) {
    if (r < 0 || r >= n || seen[static_cast<std::size_t>(r)]) bad("reconstruct row", "distinct rows in 0.." + std::to_string(n - 1), std::to_string(r));
    seen[static_cast<std::size_t>(r)] = true;
  }
  for (int r : want)
    if (r < 0 || r >= n) bad("reconstruct wanted row", "0.." + std::to_string(n - 1), std::to_string(r));
  // B: the k surviving rows; its inverse maps the survivors back to the data pieces.
  const auto kk = static_cast<std::size_t>(k_);
  std::vector<unsigned char> b(kk * kk), inv(kk * kk);
  for (std::size_t i = 0; i < kk; ++i) std::copy_n(row(have[i]).data(), kk, b.data() + i * kk);
  if (gf_invert_matrix(b.data(), inv.data(), k_) != 0) bad("reconstruct", "an invertible choice of rows", "a singular one");
  // Each wanted row as a combination of the survivors: row(w) x inv.
  std::vector<unsigned char> rows(want.size() * kk, 0);
  for (std::size_t w = 0; w < want.size(); ++w) {
    const auto coeff = row(want[w]);
    for (std::size_t j = 0; j < kk; ++j) {
      unsigned char acc = 0;
      for (std::size_t t = 0; t < kk; ++t) acc ^= gf_mul(coeff[t], inv[t * kk + j]);
      rows[w * kk + j] = acc;
    }
  }
  if (len == 0) return;
  std::vector<unsigned char> tables(32 * kk * want.size());
  ec_init_tables(k_, static_cast<int>(want.size()), rows.data(), tables.data());
  ec_encode_data(static_cast<int>(len), k_, static_cast<int>(want.size()), tables.data(), as_isal(have_data), as_isal(out));
}

}  // namespace ckpt
