// SPDX-License-Identifier: Apache-2.0
// The collectives conformance checks of tests/dist/test_collectives.cpp, on the MPI backend:
// run under mpirun (ctest does, with -np 1, 2, 3 and 4). Every rank builds every rank's input
// (they are deterministic), runs the collective and compares its result with the serial
// rank-order reference bit for bit; then the cross-rank disagreements, split, and the
// pieces-of-a-message path (run with CKPT_MPI_MAX_MESSAGE set low). Exit status 0 only if
// every check passed on every rank.
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/mpi/mpi_comm.hpp"
#include "support/collective_reference.hpp"

using namespace ckpt;
using namespace ckpt::dist;
using namespace ckpt::test_ref;

namespace {

int failures = 0;
int me = 0;

void check(bool ok, const std::string& what) {
  if (ok) return;
  ++failures;
  if (failures <= 20) std::fprintf(stderr, "rank %d: FAILED: %s\n", me, what.c_str());
}

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64};

void sweep(Communicator& c) {
  const int n = c.size();
  const std::vector<std::uint64_t> counts{0, 1, 7, static_cast<std::uint64_t>(n > 1 ? n - 1 : 0), static_cast<std::uint64_t>(n),
                                          1000, 100003};
  for (const std::uint64_t count : counts)
    for (const DType t : kTypes)
      for (const ReduceOp op : {ReduceOp::sum, ReduceOp::mean}) {
        if (op == ReduceOp::mean && !dtype_is_float(t)) continue;
        const std::size_t esz = dtype_size(t);
        const std::string tag = "count " + std::to_string(count) + " " + std::string(dtype_name(t)) + " " +
                                std::string(reduce_op_name(op));
        std::vector<Bytes> ins;
        for (int r = 0; r < n; ++r) ins.push_back(make_input(t, count, r, 11));
        const Bytes full = reference_reduce(t, op, ins, 0, count);
        const ShardRange mine = shard_range(count, n, c.rank());

        Bytes ar = ins[static_cast<std::size_t>(c.rank())];
        c.all_reduce(ar, t, op);
        check(difference(ar, full, esz).empty(), "all_reduce " + tag + ": " + difference(ar, full, esz));

        Bytes rs(mine.numel * esz, std::byte{0xee});
        c.reduce_scatter(ins[static_cast<std::size_t>(c.rank())], rs, t, op);
        check(difference(rs, block_of(full, mine, esz), esz).empty(), "reduce_scatter " + tag);

        // In place: the output is this rank's block of the input.
        Bytes in_place = ins[static_cast<std::size_t>(c.rank())];
        c.reduce_scatter(in_place, std::span(in_place).subspan(mine.offset * esz, mine.numel * esz), t, op);
        check(difference(block_of(in_place, mine, esz), block_of(full, mine, esz), esz).empty(), "in-place reduce_scatter " + tag);

        if (op == ReduceOp::sum) {
          Bytes ag(count * esz, std::byte{0xee});
          c.all_gather(block_of(ins[0], mine, esz), ag, t);
          check(difference(ag, ins[0], esz).empty(), "all_gather " + tag);
          for (int root = 0; root < n; ++root) {
            Bytes b = ins[static_cast<std::size_t>(c.rank())];
            c.broadcast(b, t, root);
            check(difference(b, ins[static_cast<std::size_t>(root)], esz).empty(), "broadcast root " + std::to_string(root) + " " + tag);
          }
        }
      }
}

Error error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(Errc::invalid_argument, {}, "no error thrown");
}

void expect_comm_error(const std::function<void()>& f, const std::string& detail, const std::string& expected,
                       const std::string& actual) {
  const Error e = error_of(f);
  check(e.code() == Errc::comm_error && e.detail().find(detail) != std::string::npos && e.expected() == expected &&
            e.actual() == actual,
        "expected comm_error '" + detail + "' (" + expected + " / " + actual + "), got " + e.what());
}

void disagreements(Communicator& c) {
  if (c.size() < 2) return;
  const int odd = c.size() - 1;  // the disagreeing rank
  const std::string who = "rank " + std::to_string(odd) + " disagrees with rank 0 on the ";
  expect_comm_error([&] {
    std::vector<float> v(c.rank() == odd ? 999 : 1000, 1.0f);
    c.all_reduce(std::span(v));
  }, "all_reduce: " + who + "element count", "1000", "999");
  expect_comm_error([&] {
    Bytes buf(64);
    c.all_reduce(buf, c.rank() == odd ? DType::BF16 : DType::F16, ReduceOp::sum);
  }, who + "dtype", "F16", "BF16");
  expect_comm_error([&] {
    std::vector<double> v(10);
    c.broadcast(std::span(v), c.rank() == odd ? 1 : 0);
  }, "broadcast: " + who + "root", "0", "1");
  expect_comm_error([&] {
    std::vector<float> v(10);
    c.all_reduce(std::span(v), c.rank() == odd ? ReduceOp::mean : ReduceOp::sum);
  }, who + "reduce op", "sum", "mean");
  expect_comm_error([&] {
    if (c.rank() == odd) {
      c.barrier();
    } else {
      std::vector<float> v(10);
      c.all_reduce(std::span(v));
    }
  }, "all_reduce: " + who + "collective", "all_reduce", "barrier");
  // Still usable afterwards.
  std::vector<float> ok{static_cast<float>(c.rank())};
  c.all_reduce(std::span(ok));
  check(ok[0] == static_cast<float>(c.size() * (c.size() - 1) / 2), "all_reduce after the mismatches");
}

void bytes_and_split(Communicator& c) {
  std::vector<std::byte> mine(static_cast<std::size_t>(c.rank() * 3), std::byte(c.rank() + 1));
  const auto all = c.all_gather_bytes(mine);
  check(static_cast<int>(all.size()) == c.size(), "all_gather_bytes size");
  for (int q = 0; q < c.size() && q < static_cast<int>(all.size()); ++q)
    check(all[static_cast<std::size_t>(q)] == std::vector<std::byte>(static_cast<std::size_t>(q * 3), std::byte(q + 1)),
          "all_gather_bytes blob of rank " + std::to_string(q));

  // Even and odd ranks, ordered by descending world rank.
  auto sub = c.split(c.rank() % 2, -c.rank());
  const int expected_size = (c.size() + 1 - c.rank() % 2) / 2;
  check(sub->size() == expected_size, "split size");
  std::vector<std::int64_t> v{c.rank()};
  sub->all_reduce(std::span(v));
  std::int64_t want = 0;
  for (int r = c.rank() % 2; r < c.size(); r += 2) want += r;
  check(v[0] == want, "all_reduce within a split group");
  // Key -rank: the highest world rank of the color is rank 0 of the new group.
  int highest = c.rank() % 2;
  while (highest + 2 < c.size()) highest += 2;
  check(sub->rank() == (highest - c.rank()) / 2, "split orders by key");
  check(error_of([&] { c.split(-1, 0); }).code() == Errc::invalid_argument, "split with a negative color");

  c.abort("test abort");
  const Error e = error_of([&] { c.barrier(); });
  check(e.code() == Errc::aborted && e.detail().find("test abort") != std::string::npos, "aborted handle throws aborted");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    MpiSession mpi(&argc, &argv);
    me = mpi.rank();
    sweep(mpi.world());
    disagreements(mpi.world());
    bytes_and_split(mpi.world());  // aborts the world handle last
    int all = 0;
    auto tally = make_mpi_communicator(MPI_COMM_WORLD);
    std::vector<std::int32_t> f{failures};
    tally->all_reduce(std::span(f));
    all = f[0];
    if (me == 0) std::printf("mpi collectives: %d ranks, %d failed checks\n", mpi.size(), all);
    return all == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", me, e.what());
    return 1;
  }
}
