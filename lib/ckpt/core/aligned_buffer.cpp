// SPDX-License-Identifier: Apache-2.0
#include "ckpt/core/aligned_buffer.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace ckpt {

AlignedBuffer::AlignedBuffer(std::size_t size, bool prefault) {
  capacity_ = (size + kAlignment - 1) / kAlignment * kAlignment;
  if (capacity_ == 0) return;
  data_ = static_cast<std::byte*>(std::aligned_alloc(kAlignment, capacity_));
  if (!data_) throw std::bad_alloc();
  if (prefault) std::memset(data_, 0, capacity_);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}

}  // namespace ckpt
