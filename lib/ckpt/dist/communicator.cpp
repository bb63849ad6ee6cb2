// SPDX-License-Identifier: Apache-2.0
#include "ckpt/dist/communicator.hpp"

#include <algorithm>
#include <functional>
#include <string>

#include "ckpt/core/error.hpp"

namespace ckpt::dist {

namespace {

// A DType outside the enum would index past the dtype tables; reject it before anything
// calls dtype_size.
void check_dtype(DType t, std::string_view where) {
  if (static_cast<unsigned>(t) > static_cast<unsigned>(DType::BOOL))
    throw Error(Errc::invalid_argument, {}, std::string(where) + ": unknown dtype",
                {}, std::to_string(static_cast<unsigned>(t)));
}

std::uint64_t element_count(std::size_t bytes, DType t, std::string_view what) {
  const std::size_t esz = dtype_size(t);
  if (bytes % esz != 0)
    throw Error(Errc::invalid_argument, {},
                std::string(what) + ": byte size is not a multiple of the " +
                    std::string(dtype_name(t)) + " element size",
                "a multiple of " + std::to_string(esz) + " bytes",
                std::to_string(bytes) + " bytes");
  return bytes / esz;
}

bool overlaps(const std::byte* a, std::size_t na, const std::byte* b, std::size_t nb) {
  if (na == 0 || nb == 0) return false;
  // std::less gives a total order even for pointers into unrelated objects.
  const std::less<const std::byte*> lt;
  return lt(a, b + nb) && lt(b, a + na);
}

}  // namespace

ShardRange shard_range(std::uint64_t count, int world, int rank) {
  if (world < 1) throw_invalid("shard_range: world size must be at least 1, got " +
                               std::to_string(world));
  check_rank(rank, world, "shard_range: rank");
  const auto w = static_cast<std::uint64_t>(world);
  const auto r = static_cast<std::uint64_t>(rank);
  const std::uint64_t base = count / w;
  const std::uint64_t rem = count % w;
  return {r * base + std::min(r, rem), base + (r < rem ? 1 : 0)};
}

std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
  }
  return "unknown";
}

void check_reducible(DType t, ReduceOp op) {
  check_dtype(t, "reduction");
  if (op != ReduceOp::sum && op != ReduceOp::mean)
    throw Error(Errc::invalid_argument, {}, "reduction: unknown ReduceOp", {},
                std::to_string(static_cast<int>(op)));
  if (t == DType::BOOL)
    throw Error(Errc::invalid_argument, {}, "reduction: BOOL cannot be reduced", "a numeric dtype",
                "BOOL");
  if (op == ReduceOp::mean && !dtype_is_float(t))
    throw Error(Errc::invalid_argument, {}, "reduction: mean is defined for float dtypes only",
                "F16, BF16, F32 or F64", std::string(dtype_name(t)));
}

void Communicator::broadcast(std::span<std::byte> buf, DType t, int root) {
  check_dtype(t, "broadcast");
  element_count(buf.size(), t, "broadcast buffer");
  check_rank(root, size(), "root out of range", "broadcast");
  do_broadcast(buf, t, root);
}

void Communicator::all_reduce(std::span<std::byte> buf, DType t, ReduceOp op) {
  check_reducible(t, op);
  element_count(buf.size(), t, "all_reduce buffer");
  do_all_reduce(buf, t, op);
}

void Communicator::reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out,
                                  DType t, ReduceOp op) {
  check_reducible(t, op);
  const std::uint64_t count = element_count(in.size(), t, "reduce_scatter input");
  const std::uint64_t got = element_count(out.size(), t, "reduce_scatter output");
  const ShardRange mine = shard_range(count, size(), rank());
  if (got != mine.numel)
    throw Error(Errc::invalid_argument, {},
                "reduce_scatter output must hold rank " + std::to_string(rank()) + "'s block of " +
                    std::to_string(count) + " elements",
                std::to_string(mine.numel) + " elements", std::to_string(got) + " elements");
  const std::size_t esz = dtype_size(t);
  const std::byte* own_block = in.data() + mine.offset * esz;
  if (out.data() != own_block && overlaps(in.data(), in.size(), out.data(), out.size()))
    throw_invalid("reduce_scatter: output overlaps the input other than exactly in place");
  do_reduce_scatter(in, out, t, op);
}

void Communicator::all_gather(std::span<const std::byte> in, std::span<std::byte> out, DType t) {
  check_dtype(t, "all_gather");
  const std::uint64_t got = element_count(in.size(), t, "all_gather input");
  const std::uint64_t count = element_count(out.size(), t, "all_gather output");
  const ShardRange mine = shard_range(count, size(), rank());
  if (got != mine.numel)
    throw Error(Errc::invalid_argument, {},
                "all_gather input must hold rank " + std::to_string(rank()) + "'s block of " +
                    std::to_string(count) + " elements",
                std::to_string(mine.numel) + " elements", std::to_string(got) + " elements");
  const std::size_t esz = dtype_size(t);
  const std::byte* own_block = out.data() + mine.offset * esz;
  if (in.data() != own_block && overlaps(in.data(), in.size(), out.data(), out.size()))
    throw_invalid("all_gather: input overlaps the output other than exactly in place");
  do_all_gather(in, out, t);
}

void Communicator::barrier() { do_barrier(); }

std::vector<std::vector<std::byte>> Communicator::all_gather_bytes(
    std::span<const std::byte> mine) {
  return do_all_gather_bytes(mine);
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  if (color < 0)
    throw Error(Errc::invalid_argument, {}, "split: color must be non-negative", ">= 0",
                std::to_string(color));
  return do_split(color, key);
}

}  // namespace ckpt::dist
