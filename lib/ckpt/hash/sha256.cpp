// SPDX-License-Identifier: Apache-2.0
#include "ckpt/hash/sha256.hpp"

#include <openssl/evp.h>

#include "ckpt/core/error.hpp"

namespace ckpt {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
  ~Ctx() { EVP_MD_CTX_free(md); }
};

namespace {
void init(EVP_MD_CTX* md) {
  if (EVP_DigestInit_ex(md, EVP_sha256(), nullptr) != 1)
    throw Error(Errc::io_error, {}, "OpenSSL EVP_DigestInit_ex(sha256) failed");
}
}  // namespace

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  if (!ctx_->md) throw Error(Errc::io_error, {}, "OpenSSL EVP_MD_CTX_new failed");
  init(ctx_->md);
}
Sha256::~Sha256() = default;
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::update(const void* data, std::size_t size) {
  if (size != 0 && EVP_DigestUpdate(ctx_->md, data, size) != 1)
    throw Error(Errc::io_error, {}, "OpenSSL EVP_DigestUpdate failed");
}

Sha256Digest Sha256::finish() {
  Sha256Digest out{};
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_->md, out.data(), &len) != 1 || len != out.size())
    throw Error(Errc::io_error, {}, "OpenSSL EVP_DigestFinal_ex failed");
  init(ctx_->md);
  return out;
}

Sha256Digest sha256(const void* data, std::size_t size) {
  Sha256 h;
  h.update(data, size);
  return h.finish();
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(bytes.size() * 2);
  for (auto b : bytes) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 0xf]);
  }
  return s;
}

}  // namespace ckpt
