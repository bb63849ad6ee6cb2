// SPDX-License-Identifier: Apache-2.0
// A heap buffer aligned to 4096 bytes (the O_DIRECT unit), optionally pre-faulted: on VMs that
// return freed memory to the host, the first touch of a fresh page costs far more than a
// memcpy into a warm one, so buffers that are reused are touched once, up front.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <span>

CKPT_API_BEGIN
namespace ckpt {

class AlignedBuffer {
 public:
  static constexpr std::size_t kAlignment = 4096;

  AlignedBuffer() noexcept = default;
  /// Allocates `size` bytes rounded up to kAlignment; throws std::bad_alloc. With `prefault`
  /// every page is written once so later writes do not fault.
  explicit AlignedBuffer(std::size_t size, bool prefault = false);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() noexcept { return data_; }
  const std::byte* data() const noexcept { return data_; }
  /// Usable bytes (the requested size rounded up to kAlignment).
  std::size_t capacity() const noexcept { return capacity_; }
  std::span<std::byte> span(std::size_t n) noexcept { return {data_, n}; }
  std::span<const std::byte> span(std::size_t n) const noexcept { return {data_, n}; }

 private:
  std::byte* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace ckpt
CKPT_API_END
