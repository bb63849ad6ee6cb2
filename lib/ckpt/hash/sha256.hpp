// SPDX-License-Identifier: Apache-2.0
// Streaming SHA-256 over OpenSSL 3 EVP (uses SHA-NI where the CPU has it).
#pragma once

#include "ckpt/core/export.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

CKPT_API_BEGIN
namespace ckpt {

using Sha256Digest = std::array<std::uint8_t, 32>;

/// Streaming SHA-256. Not thread-safe; one object per stream; movable, not copyable.
/// Throws ckpt::Error (io_error) only if OpenSSL cannot create a digest context.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;

  void update(const void* data, std::size_t size);
  void update(std::span<const std::byte> data) { update(data.data(), data.size()); }
  /// Digest of everything fed; the object is reset afterwards and can hash a new stream.
  Sha256Digest finish();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

/// One-shot SHA-256.
Sha256Digest sha256(const void* data, std::size_t size);

/// Lower-case hex of any byte string (64 digits for a SHA-256 digest, as sha256sum prints).
std::string to_hex(std::span<const std::uint8_t> bytes);

}  // namespace ckpt
CKPT_API_END
