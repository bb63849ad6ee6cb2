// SPDX-License-Identifier: Apache-2.0
// Reed-Solomon erasure coding over GF(2^8), on ISA-L (libisal-dev): the code of the rs:K+M
// redundancy scheme (format/redundancy.hpp). The code matrix is ISA-L's
// gf_gen_cauchy1_matrix(K + M, K): rows 0..K-1 the identity (the data pieces themselves),
// row K + p, column j the GF(2^8) inverse of ((K + p) XOR j), field polynomial
// x^8 + x^4 + x^3 + x^2 + 1 (0x11d); parity p of a stripe is, byte by byte, the sum over j
// of row K + p, column j times data piece j. Any K of the K + M rows form an invertible
// matrix, so any K surviving members rebuild the others (docs/format.md gives an example).
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <span>
#include <vector>

CKPT_API_BEGIN
namespace ckpt {

class ReedSolomon {
 public:
  /// Errc::invalid_argument unless 1 <= k, 1 <= m and k + m <= 255.
  ReedSolomon(int k, int m);

  int k() const noexcept { return k_; }
  int m() const noexcept { return m_; }
  /// Row `row` (0..k+m-1) of the code matrix, k coefficients.
  std::span<const unsigned char> row(int row) const noexcept;

  /// Computes the m parity pieces of `len` bytes from the k data pieces of `len` bytes.
  /// `data` holds k pointers and `parity` m; no buffer may overlap another. Thread-safe.
  void encode(std::span<const std::byte* const> data, std::span<std::byte* const> parity, std::size_t len) const;
  /// Computes parity piece `p` (0..m-1, code row k + p) alone: what encode() writes to
  /// parity[p], for a writer that stores one parity block of a stripe. Errc::invalid_argument
  /// for a wrong count or p out of range. Thread-safe.
  void encode_one(int p, std::span<const std::byte* const> data, std::byte* parity, std::size_t len) const;

  /// Rebuilds members from k others: `have` names k distinct rows (0..k+m-1) whose pieces
  /// are `have_data` (same order); `want` names the rows to rebuild into `out` (same order).
  /// Errc::invalid_argument for a wrong count, a row out of range or repeated. Thread-safe.
  void reconstruct(std::span<const int> have, std::span<const std::byte* const> have_data, std::span<const int> want,
                   std::span<std::byte* const> out, std::size_t len) const;

 private:
  int k_, m_;
  std::vector<unsigned char> matrix_;  // (k + m) x k
  std::vector<unsigned char> tables_;  // ec_init_tables of the parity rows
};

}  // namespace ckpt
CKPT_API_END
