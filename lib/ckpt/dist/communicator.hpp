// SPDX-License-Identifier: Apache-2.0
// The one interface through which anything crosses ranks: the gradient collectives of the
// training loop and the coordination of a checkpoint commit. It speaks only in byte spans,
// element counts and owned byte vectors, never in pointers a peer would dereference, so a
// multi-process backend (MPI) can implement it without changing callers. The in-process
// backend lives in thread_comm.hpp.
//
// Contract shared by every collective:
// - Every rank of the group calls the same collectives in the same order, with the same
//   dtype, element count, root and ReduceOp. A backend detects a disagreement and throws
//   Errc::comm_error on every rank (naming the field, the value on rank 0 as expected and the
//   other rank's as actual) instead of reading past a buffer.
// - Arguments a rank can check alone (span sizes not a multiple of the dtype size, a dtype or
//   ReduceOp the operation does not support, a root out of range, an output of the wrong size,
//   overlapping input and output) throw Errc::invalid_argument on that rank before it
//   communicates. Its peers then stay blocked until the group is aborted (run_ranks does this),
//   exactly as they would if that rank had crashed.
// - Every call blocks until this rank's output is complete and its input buffers are no longer
//   read by any peer, so the caller may reuse or free them on return.
// - Results are bitwise reproducible, independent of thread timing: element i is reduced by
//   folding the ranks' values in rank order 0, 1, ..., N-1, so every rank also receives the
//   same bits.
// - Once a group is aborted, every rank blocked in or later entering a collective throws
//   Errc::aborted whose detail carries the reason.
#pragma once

#include "ckpt/core/export.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/core/dtype.hpp"

CKPT_API_BEGIN
namespace ckpt::dist {

/// How all_reduce and reduce_scatter combine the ranks' values.
/// sum: F16 and BF16 accumulate in fp32 and round once at the end; F32 accumulates in F32,
/// F64 in F64; integers in their own width with wrap-around (two's complement) on overflow.
/// mean: sum / world_size, divided in the accumulation type; float dtypes only.
/// BOOL supports neither.
enum class ReduceOp { sum, mean };

/// A contiguous block [offset, offset + numel) of a flat element range.
struct ShardRange {
  std::uint64_t offset = 0;
  std::uint64_t numel = 0;
  friend bool operator==(const ShardRange&, const ShardRange&) = default;
};

/// The block of `count` elements that `rank` owns in a group of `world` ranks: the first
/// count % world ranks get one element more than the others, blocks in rank order, so the
/// blocks cover [0, count) exactly and their sizes differ by at most one. Used by
/// reduce_scatter, all_gather, ZeRO sharding and the checkpoint's param_shard_offset, so all of
/// them agree on who owns what. Throws Errc::invalid_argument unless 1 <= world and
/// 0 <= rank < world.
ShardRange shard_range(std::uint64_t count, int world, int rank);

/// Element types the typed convenience overloads accept (F16 and BF16 have no C++ type here:
/// pass their bytes with DType::F16 / DType::BF16).
template <class T>
concept CommElement =
    std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int8_t> ||
    std::same_as<T, std::int16_t> || std::same_as<T, std::int32_t> ||
    std::same_as<T, std::int64_t> || std::same_as<T, std::uint8_t> ||
    std::same_as<T, std::uint16_t> || std::same_as<T, std::uint32_t> ||
    std::same_as<T, std::uint64_t>;

/// The DType a CommElement travels as.
template <CommElement T>
constexpr DType dtype_of() noexcept {
  if constexpr (std::same_as<T, float>) return DType::F32;
  else if constexpr (std::same_as<T, double>) return DType::F64;
  else if constexpr (std::same_as<T, std::int8_t>) return DType::I8;
  else if constexpr (std::same_as<T, std::int16_t>) return DType::I16;
  else if constexpr (std::same_as<T, std::int32_t>) return DType::I32;
  else if constexpr (std::same_as<T, std::int64_t>) return DType::I64;
  else if constexpr (std::same_as<T, std::uint8_t>) return DType::U8;
  else if constexpr (std::same_as<T, std::uint16_t>) return DType::U16;
  else if constexpr (std::same_as<T, std::uint32_t>) return DType::U32;
  else return DType::U64;
}

/// One rank's handle on a group of ranks.
///
/// Thread safety: a communicator belongs to one rank and is driven by one thread at a time;
/// rank(), size() and abort() may be called from any thread. Public collectives validate
/// their arguments here and then call the backend's do_* implementation (non-virtual
/// interface), so every backend rejects the same bad calls the same way.
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// This rank, in [0, size()).
  virtual int rank() const noexcept = 0;
  /// Number of ranks in the group.
  virtual int size() const noexcept = 0;

  /// Fails the whole group: every rank blocked in or later entering a collective throws
  /// Errc::aborted with `reason` in its detail. The first reason wins; later calls do nothing.
  /// Never blocks for a peer and may be called from any thread, including one that is not a
  /// rank (a watchdog). An aborted group stays aborted.
  virtual void abort(std::string reason) noexcept = 0;

  /// Copies root's `buf` into every other rank's `buf` (same dtype and element count on all).
  void broadcast(std::span<std::byte> buf, DType t, int root);

  /// Replaces `buf` on every rank by the element-wise reduction of all ranks' `buf`.
  void all_reduce(std::span<std::byte> buf, DType t, ReduceOp op);

  /// `in` holds `count` elements on every rank; rank r receives in `out` the reduction of
  /// block shard_range(count, size(), r), which `out` must hold exactly. `out` may be exactly
  /// that block of `in` (in place); any other overlap is invalid_argument.
  void reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out, DType t,
                      ReduceOp op);

  /// `out` holds `count` elements; rank r contributes `in`, which must hold exactly
  /// shard_range(count, size(), r).numel elements, placed at that block of every rank's `out`.
  /// `in` may be exactly that block of `out` (in place); any other overlap is invalid_argument.
  void all_gather(std::span<const std::byte> in, std::span<std::byte> out, DType t);

  /// Returns once every rank has entered the barrier.
  void barrier();

  /// Variable-length exchange: returns every rank's `mine`, in rank order (own included).
  /// Blobs may differ in length, including empty.
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> mine);

  /// Collective over this group: ranks passing the same color form a new group, ordered by (key, rank).
  ///
  /// Every rank of this group calls split (as MPI_Comm_split, without MPI_UNDEFINED: every
  /// rank joins exactly one new group). The returned communicator's rank is this rank's index
  /// among its color's members sorted by (key, rank in this group); equal keys keep this
  /// group's order. color < 0 is Errc::invalid_argument on this rank before it communicates.
  /// Lifetime: the new communicator owns its own shared state and may outlive this one.
  /// Failure: aborting this group also aborts every group split from it (transitively, also
  /// those split before the abort), so a rank blocked in a sub-group collective is woken when
  /// any rank of the parent fails; aborting a split group does not abort its parent.
  std::unique_ptr<Communicator> split(int color, int key);

  // Typed conveniences: the same operations with the dtype taken from T.
  template <CommElement T>
  void broadcast(std::span<T> buf, int root) {
    broadcast(std::as_writable_bytes(buf), dtype_of<T>(), root);
  }
  template <CommElement T>
  void all_reduce(std::span<T> buf, ReduceOp op = ReduceOp::sum) {
    all_reduce(std::as_writable_bytes(buf), dtype_of<T>(), op);
  }
  template <CommElement T>
  void reduce_scatter(std::span<const T> in, std::span<T> out, ReduceOp op = ReduceOp::sum) {
    reduce_scatter(std::as_bytes(in), std::as_writable_bytes(out), dtype_of<T>(), op);
  }
  template <CommElement T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    all_gather(std::as_bytes(in), std::as_writable_bytes(out), dtype_of<T>());
  }

 protected:
  Communicator() = default;

  // Backend hooks, called with arguments already validated as documented above: sizes are
  // whole elements, dtype/op combinations are supported, root is in range, out/in sizes match
  // this rank's block, and overlaps are either none or exactly in place. Cross-rank agreement
  // is the backend's to check.
  virtual void do_broadcast(std::span<std::byte> buf, DType t, int root) = 0;
  virtual void do_all_reduce(std::span<std::byte> buf, DType t, ReduceOp op) = 0;
  virtual void do_reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out,
                                 DType t, ReduceOp op) = 0;
  virtual void do_all_gather(std::span<const std::byte> in, std::span<std::byte> out,
                             DType t) = 0;
  virtual void do_barrier() = 0;
  virtual std::vector<std::vector<std::byte>> do_all_gather_bytes(
      std::span<const std::byte> mine) = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key) = 0;
};

/// Throws Errc::invalid_argument unless `op` is defined for `t` (see ReduceOp). Exposed so a
/// backend or caller can check before committing to a collective.
void check_reducible(DType t, ReduceOp op);

/// "sum" / "mean".
std::string_view reduce_op_name(ReduceOp op) noexcept;

}  // namespace ckpt::dist
CKPT_API_END
