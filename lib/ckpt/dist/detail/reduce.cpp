// SPDX-License-Identifier: Apache-2.0
#include "ckpt/dist/detail/reduce.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#if defined(__SANITIZE_THREAD__)
// Part of the TSan runtime's interface (what its instrumentation calls for a memory range).
extern "C" void __tsan_read_range(void* addr, unsigned long size);
extern "C" void __tsan_write_range(void* addr, unsigned long size);
#endif

namespace ckpt::dist::detail {

namespace {

// GCC folds the block copies below into vector loads and stores that its TSan pass leaves
// uninstrumented, which would hide from the race detector exactly the accesses that matter:
// reads of other ranks' buffers and writes a peer may read. Report them explicitly.
inline void race_check_read(const std::byte* p, std::size_t n) noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_read_range(const_cast<std::byte*>(p), n);
#else
  (void)p, (void)n;
#endif
}
inline void race_check_write(std::byte* p, std::size_t n) noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_write_range(p, n);
#else
  (void)p, (void)n;
#endif
}

// How each dtype is stored, what it accumulates in, and the conversions between the two.
// 16-bit floats accumulate in fp32 and round once, so a sum over N ranks loses no more than
// one rounding to the storage format.
struct F16Traits {
  using storage = std::uint16_t;
  using acc = float;
  static float load(std::uint16_t v) noexcept { return f16_to_f32(v); }
  static std::uint16_t store(float a) noexcept { return f32_to_f16(a); }
};
struct BF16Traits {
  using storage = std::uint16_t;
  using acc = float;
  static float load(std::uint16_t v) noexcept { return bf16_to_f32(v); }
  static std::uint16_t store(float a) noexcept { return f32_to_bf16(a); }
};
template <class T>
struct SameTraits {
  using storage = T;
  using acc = T;
  static T load(T v) noexcept { return v; }
  static T store(T a) noexcept { return a; }
};
// Signed overflow is UB; unsigned arithmetic wraps, and the conversion back to the signed
// type is modular since C++20, which gives two's-complement wrap-around.
template <class T>
struct IntTraits {
  using storage = T;
  using acc = std::make_unsigned_t<T>;
  static acc load(T v) noexcept { return static_cast<acc>(v); }
  static T store(acc a) noexcept { return static_cast<T>(a); }
};

template <class Tr>
void reduce_typed(std::span<const std::byte* const> inputs, std::uint64_t first, std::uint64_t n,
                  std::byte* dst, bool mean) noexcept {
  using S = typename Tr::storage;
  using A = typename Tr::acc;
  // Small enough to stay in L1 while all inputs are folded into it; memcpy into `tmp` keeps the
  // inner loops on aligned local arrays the compiler vectorises, whatever the callers' alignment.
  constexpr std::size_t kBlock = 1024;
  alignas(64) A acc[kBlock];
  alignas(64) S tmp[kBlock];
  for (std::uint64_t done = 0; done < n; done += kBlock) {
    const auto m = static_cast<std::size_t>(std::min<std::uint64_t>(kBlock, n - done));
    const std::size_t src_off = static_cast<std::size_t>(first + done) * sizeof(S);
    race_check_read(inputs[0] + src_off, m * sizeof(S));
    std::memcpy(tmp, inputs[0] + src_off, m * sizeof(S));
    for (std::size_t i = 0; i < m; ++i) acc[i] = Tr::load(tmp[i]);
    for (std::size_t k = 1; k < inputs.size(); ++k) {
      race_check_read(inputs[k] + src_off, m * sizeof(S));
      std::memcpy(tmp, inputs[k] + src_off, m * sizeof(S));
      for (std::size_t i = 0; i < m; ++i) acc[i] = static_cast<A>(acc[i] + Tr::load(tmp[i]));
    }
    if constexpr (std::is_floating_point_v<A>) {
      if (mean) {
        const A world = static_cast<A>(inputs.size());
        for (std::size_t i = 0; i < m; ++i) acc[i] = acc[i] / world;
      }
    }
    for (std::size_t i = 0; i < m; ++i) tmp[i] = Tr::store(acc[i]);
    race_check_write(dst + static_cast<std::size_t>(done) * sizeof(S), m * sizeof(S));
    std::memcpy(dst + static_cast<std::size_t>(done) * sizeof(S), tmp, m * sizeof(S));
  }
}

}  // namespace

void reduce_range(std::span<const std::byte* const> inputs, std::uint64_t first, std::uint64_t n,
                  std::byte* dst, DType t, ReduceOp op) noexcept {
  if (n == 0 || inputs.empty()) return;
  const bool mean = op == ReduceOp::mean;
  switch (t) {
    case DType::F16: return reduce_typed<F16Traits>(inputs, first, n, dst, mean);
    case DType::BF16: return reduce_typed<BF16Traits>(inputs, first, n, dst, mean);
    case DType::F32: return reduce_typed<SameTraits<float>>(inputs, first, n, dst, mean);
    case DType::F64: return reduce_typed<SameTraits<double>>(inputs, first, n, dst, mean);
    case DType::I8: return reduce_typed<IntTraits<std::int8_t>>(inputs, first, n, dst, mean);
    case DType::I16: return reduce_typed<IntTraits<std::int16_t>>(inputs, first, n, dst, mean);
    case DType::I32: return reduce_typed<IntTraits<std::int32_t>>(inputs, first, n, dst, mean);
    case DType::I64: return reduce_typed<IntTraits<std::int64_t>>(inputs, first, n, dst, mean);
    case DType::U8: return reduce_typed<IntTraits<std::uint8_t>>(inputs, first, n, dst, mean);
    case DType::U16: return reduce_typed<IntTraits<std::uint16_t>>(inputs, first, n, dst, mean);
    case DType::U32: return reduce_typed<IntTraits<std::uint32_t>>(inputs, first, n, dst, mean);
    case DType::U64: return reduce_typed<IntTraits<std::uint64_t>>(inputs, first, n, dst, mean);
    case DType::BOOL: return;  // rejected by check_reducible before any communication
  }
}

}  // namespace ckpt::dist::detail
