// SPDX-License-Identifier: Apache-2.0
// The serial reference of the collectives contract (communicator.hpp), shared by the thread
// backend's conformance tests (tests/dist) and the MPI backend's (tests/mpi): inputs whose
// sums round differently in every fold order, and the rank-order fold each backend must match
// bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/core/dtype.hpp"
#include "ckpt/dist/communicator.hpp"

namespace ckpt::test_ref {

using Bytes = std::vector<std::byte>;
using dist::ReduceOp;
using dist::ShardRange;

inline std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-range, range), from 24 random bits so it is exact in fp32.
inline float uniform(std::uint64_t bits, float range) {
  return (static_cast<float>(bits >> 40) / 16777216.0f * 2.0f - 1.0f) * range;
}

template <class T>
inline void put(Bytes& b, std::uint64_t i, T v) {
  std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
}
template <class T>
inline T get(const Bytes& b, std::uint64_t i) {
  T v;
  std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
  return v;
}

// Rank r's elements [first, first + count): values whose sums round differently in every
// order, so a wrong fold order shows up as wrong bits. Integers use all their bits so sums
// wrap around.
inline Bytes make_input(DType t, std::uint64_t count, int rank, std::uint64_t seed,
                 std::uint64_t first = 0) {
  Bytes b(count * dtype_size(t));
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::uint64_t bits = splitmix(seed * 0x100000001b3ull ^
                                        (static_cast<std::uint64_t>(rank) << 40) ^ (first + i));
    switch (t) {
      case DType::F16: put(b, i, f32_to_f16(uniform(bits, 8.0f))); break;
      case DType::BF16: put(b, i, f32_to_bf16(uniform(bits, 8.0f))); break;
      case DType::F32: put(b, i, uniform(bits, 100.0f) * (1.0f + static_cast<float>(bits & 7))); break;
      case DType::F64:
        put(b, i, static_cast<double>(uniform(bits, 1.0f)) * 1e3 + static_cast<double>(bits & 0xffff) * 1e-9);
        break;
      case DType::I32: put(b, i, static_cast<std::int32_t>(static_cast<std::uint32_t>(bits))); break;
      case DType::I64: put(b, i, static_cast<std::int64_t>(bits)); break;
      default: throw std::logic_error("no generator for " + std::string(dtype_name(t)));
    }
  }
  return b;
}

template <class S, class A, class Load, class Store>
inline Bytes fold(const std::vector<Bytes>& ins, std::uint64_t first, std::uint64_t n, bool mean,
           Load load, Store store) {
  Bytes out(n * sizeof(S));
  for (std::uint64_t i = 0; i < n; ++i) {
    A acc = load(get<S>(ins[0], first + i));
    for (std::size_t k = 1; k < ins.size(); ++k)
      acc = static_cast<A>(acc + load(get<S>(ins[k], first + i)));
    if (mean) acc = acc / static_cast<A>(ins.size());
    put<S>(out, i, store(acc));
  }
  return out;
}

// The serial reference for elements [first, first + n): element by element, ranks folded in
// order, in the accumulation type the contract names.
inline Bytes reference_reduce(DType t, ReduceOp op, const std::vector<Bytes>& ins, std::uint64_t first,
                       std::uint64_t n) {
  const bool mean = op == ReduceOp::mean;
  const auto same = [](auto v) { return v; };
  switch (t) {
    case DType::F16:
      return fold<std::uint16_t, float>(ins, first, n, mean, f16_to_f32, f32_to_f16);
    case DType::BF16:
      return fold<std::uint16_t, float>(ins, first, n, mean, bf16_to_f32, f32_to_bf16);
    case DType::F32: return fold<float, float>(ins, first, n, mean, same, same);
    case DType::F64: return fold<double, double>(ins, first, n, mean, same, same);
    case DType::I32:
      return fold<std::int32_t, std::uint32_t>(
          ins, first, n, false, [](std::int32_t v) { return static_cast<std::uint32_t>(v); },
          [](std::uint32_t v) { return static_cast<std::int32_t>(v); });
    case DType::I64:
      return fold<std::int64_t, std::uint64_t>(
          ins, first, n, false, [](std::int64_t v) { return static_cast<std::uint64_t>(v); },
          [](std::uint64_t v) { return static_cast<std::int64_t>(v); });
    default: throw std::logic_error("no reference for " + std::string(dtype_name(t)));
  }
}

// "" when equal, else where and how they differ.
inline std::string difference(std::span<const std::byte> got, std::span<const std::byte> want,
                       std::size_t esz) {
  if (got.size() != want.size())
    return "size " + std::to_string(got.size()) + " != " + std::to_string(want.size());
  for (std::size_t i = 0; i < got.size(); i += esz)
    if (std::memcmp(got.data() + i, want.data() + i, esz) != 0)
      return "first differing element " + std::to_string(i / esz);
  return {};
}

inline std::span<const std::byte> block_of(const Bytes& b, ShardRange r, std::size_t esz) {
  return std::span(b).subspan(r.offset * esz, r.numel * esz);
}

}  // namespace ckpt::test_ref
