// SPDX-License-Identifier: Apache-2.0
// The Communicator contract, checked on the thread backend: every collective against a serial
// reference that folds ranks in order 0..N-1, for world sizes 1..16 and element counts that
// include 0 and sizes not divisible by the world size; bitwise repeatability under varied thread
// timing; cross-rank disagreements and locally invalid arguments.
#include <doctest/doctest.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/core/dtype.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/dist/communicator.hpp"
#include "ckpt/dist/thread_comm.hpp"
#include "support/collective_reference.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::dist;
using namespace ckpt::test_ref;
using ckpt::test::expect_error;

namespace {

// The largest count of the sweep is prime, so no world size divides it, and spans many blocks
// of the reduction kernel. The repeatability tests always use kRepeatCount.
constexpr std::uint64_t kRepeatCount = 100003;
#if defined(__SANITIZE_THREAD__)
// TSan runs these loops 10-30x slower. What it checks (the synchronisation) does not depend on
// how many elements a collective moves beyond a few kernel blocks, so under TSan only the
// sweep's largest count (still prime, still ~10 blocks) and the number of repeated runs shrink.
constexpr std::uint64_t kLargeCount = 10007;
constexpr int kRepeatRuns = 10;
#else
constexpr std::uint64_t kLargeCount = 100003;
constexpr int kRepeatRuns = 50;
#endif
constexpr int kMaxSweepWorld = 16;

std::vector<std::uint64_t> sweep_counts(int world) {
  const auto n = static_cast<std::uint64_t>(world);
  return {0, 1, 7, n - 1, n, 1000, kLargeCount};
}

const DType kSweepTypes[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64};

enum class Collective { all_reduce, reduce_scatter, all_gather };

// Runs one collective for every count and dtype of the sweep and checks every rank's result
// against the serial reference. One group per world size runs all the cases, and the ranks
// build their own inputs and each folds its own block of the reference: starting a thread
// costs 2-3 ms under TSan, so a group per case would dominate the runtime.
void check_sweep(Collective coll, ReduceOp op, std::uint64_t seed) {
  for (int world = 1; world <= kMaxSweepWorld; ++world) {
    std::vector<Bytes> ins(static_cast<std::size_t>(world));
    std::vector<Bytes> want(static_cast<std::size_t>(world));  // rank q's block of the result
    std::vector<std::vector<std::string>> failures(static_cast<std::size_t>(world));
    run_ranks(world, [&](Communicator& c) {
      const auto me = static_cast<std::size_t>(c.rank());
      for (const std::uint64_t count : sweep_counts(world)) {
        for (const DType t : kSweepTypes) {
          if (coll != Collective::all_gather && op == ReduceOp::mean && !dtype_is_float(t)) continue;
          const std::size_t esz = dtype_size(t);
          const ShardRange mine = shard_range(count, world, c.rank());
          // all_gather's input is this rank's block of one vector; the others' are full vectors.
          ins[me] = coll == Collective::all_gather ? make_input(t, mine.numel, 0, seed, mine.offset)
                                                   : make_input(t, count, c.rank(), seed);
          c.barrier();  // every input is written before anyone folds the reference
          want[me] = coll == Collective::all_gather ? ins[me]
                                                    : reference_reduce(t, op, ins, mine.offset, mine.numel);
          // Filled with a marker first, so an element the collective never writes shows up.
          Bytes out;
          switch (coll) {
            case Collective::all_reduce:
              out = ins[me];
              c.all_reduce(out, t, op);
              break;
            case Collective::reduce_scatter:
              out.assign(mine.numel * esz, std::byte{0xee});
              c.reduce_scatter(ins[me], out, t, op);
              break;
            case Collective::all_gather:
              out.assign(count * esz, std::byte{0xee});
              c.all_gather(ins[me], out, t);
              break;
          }
          c.barrier();  // every block of the reference is complete
          for (int q = 0; q < world; ++q) {
            if (coll == Collective::reduce_scatter && q != c.rank()) continue;
            const auto got = coll == Collective::reduce_scatter
                                 ? std::span<const std::byte>(out)
                                 : block_of(out, shard_range(count, world, q), esz);
            const std::string diff = difference(got, want[static_cast<std::size_t>(q)], esz);
            if (!diff.empty() && failures[me].size() < 5)
              failures[me].push_back("count " + std::to_string(count) + " dtype " +
                                     std::string(dtype_name(t)) + " block of rank " +
                                     std::to_string(q) + ": " + diff);
          }
          c.barrier();  // nobody reads this case's inputs or reference any more
        }
      }
    });
    for (int r = 0; r < world; ++r) {
      const auto& f = failures[static_cast<std::size_t>(r)];
      INFO("world ", world, " rank ", r, ": ", f.empty() ? std::string() : f.front());
      CHECK(f.empty());
    }
  }
}

std::vector<Bytes> make_inputs(DType t, std::uint64_t count, int world, std::uint64_t seed) {
  std::vector<Bytes> ins;
  for (int r = 0; r < world; ++r) ins.push_back(make_input(t, count, r, seed));
  return ins;
}

// A fresh group per run, with the ranks' arrival order varied from run to run.
std::vector<Bytes> run_repeatable(Collective coll, const std::vector<Bytes>& ins, DType t,
                                  int run) {
  const int world = static_cast<int>(ins.size());
  const std::uint64_t count = ins[0].size() / dtype_size(t);
  std::vector<Bytes> outs(ins.size());
  run_ranks(world, [&](Communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    for (int y = 0; y < (run * 7 + c.rank() * 3) % 5; ++y) std::this_thread::yield();
    if ((run + c.rank()) % 7 == 3) std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (coll == Collective::all_reduce) {
      outs[r] = ins[r];
      c.all_reduce(outs[r], t, ReduceOp::sum);
    } else {
      outs[r].resize(shard_range(count, world, c.rank()).numel * dtype_size(t));
      c.reduce_scatter(ins[r], outs[r], t, ReduceOp::sum);
    }
  });
  return outs;
}

}  // namespace

// ---- shard_range --------------------------------------------------------------------------

TEST_CASE("shard_range covers every element of 0..count-1 once, in rank order, with sizes differing by at most one") {
  std::vector<std::uint64_t> counts;
  for (std::uint64_t c = 0; c <= 70; ++c) counts.push_back(c);
  counts.insert(counts.end(), {1000, 100003, std::numeric_limits<std::uint64_t>::max()});
  for (const int world : {1, 2, 3, 4, 7, 8, 16, 17, 1024}) {
    for (const std::uint64_t count : counts) {
      INFO("world ", world, " count ", count);
      std::uint64_t next = 0, smallest = std::numeric_limits<std::uint64_t>::max(), largest = 0;
      for (int r = 0; r < world; ++r) {
        const ShardRange s = shard_range(count, world, r);
        REQUIRE(s.offset == next);
        next = s.offset + s.numel;
        smallest = std::min(smallest, s.numel);
        largest = std::max(largest, s.numel);
        // Larger blocks come first, as the formula in the contract says.
        CHECK(s.numel == count / static_cast<std::uint64_t>(world) +
                             (static_cast<std::uint64_t>(r) < count % static_cast<std::uint64_t>(world)));
      }
      CHECK(next == count);
      CHECK(largest - smallest <= 1);
    }
  }
}

TEST_CASE("shard_range rejects a world below one and a rank outside the group") {
  CHECK(expect_error([] { shard_range(10, 0, 0); }).code() == Errc::invalid_argument);
  CHECK(expect_error([] { shard_range(10, 4, 4); }).code() == Errc::invalid_argument);
  CHECK(expect_error([] { shard_range(10, 4, -1); }).code() == Errc::invalid_argument);
}

// ---- results against the serial reference -----------------------------------------------

TEST_CASE("broadcast from every root delivers the root's bytes to every rank") {
  // BOOL travels as opaque bytes too: any byte pattern must arrive unchanged, so it is fed
  // F16 bit patterns.
  const DType kTypes[] = {DType::F32, DType::BF16, DType::I64, DType::BOOL};
  for (int world = 1; world <= kMaxSweepWorld; ++world) {
    const auto counts = sweep_counts(world);
    // Only the root holds the payload; the others start from a rank-specific filler, so a
    // result equal to the payload can only have come from the root.
    std::vector<std::vector<Bytes>> payload(counts.size());
    for (std::size_t ci = 0; ci < counts.size(); ++ci)
      for (const DType t : kTypes)
        payload[ci].push_back(t == DType::BOOL ? make_input(DType::F16, counts[ci] / 2, 0, ci)
                                               : make_input(t, counts[ci], 0, ci));
    std::vector<int> wrong(static_cast<std::size_t>(world), 0);
    std::vector<int> done(static_cast<std::size_t>(world), 0);
    run_ranks(world, [&](Communicator& c) {
      const auto me = static_cast<std::size_t>(c.rank());
      for (int root = 0; root < world; ++root) {
        for (std::size_t ci = 0; ci < counts.size(); ++ci) {
          // The large count costs O(world * count) per root; one root suffices for it.
          if (counts[ci] == kLargeCount && root != world - 1) continue;
          for (std::size_t ti = 0; ti < std::size(kTypes); ++ti) {
            const Bytes& want = payload[ci][ti];
            Bytes buf = c.rank() == root ? want : Bytes(want.size(), std::byte(0xa0 + c.rank()));
            c.broadcast(buf, kTypes[ti], root);
            if (buf != want) ++wrong[me];
            ++done[me];
          }
        }
      }
    });
    for (int r = 0; r < world; ++r) {
      INFO("world ", world, " rank ", r);
      CHECK(wrong[static_cast<std::size_t>(r)] == 0);
      CHECK(done[static_cast<std::size_t>(r)] == (world * 6 + 1) * 4);
    }
  }
}

TEST_CASE("all_reduce sum matches the serial rank-order reference") {
  check_sweep(Collective::all_reduce, ReduceOp::sum, 11);
}

TEST_CASE("all_reduce mean matches the serial reference for float dtypes") {
  check_sweep(Collective::all_reduce, ReduceOp::mean, 13);
}

TEST_CASE("reduce_scatter sum gives each rank its block of the serial reference") {
  check_sweep(Collective::reduce_scatter, ReduceOp::sum, 17);
}

TEST_CASE("reduce_scatter mean gives each rank its block of the serial reference") {
  check_sweep(Collective::reduce_scatter, ReduceOp::mean, 19);
}

TEST_CASE("all_gather places each rank's block at its shard offset on every rank") {
  check_sweep(Collective::all_gather, ReduceOp::sum, 37);
}

TEST_CASE("in-place reduce_scatter and all_gather equal their out-of-place results") {
  // ZeRO keeps a rank's shard inside its full buffer; in place must give the same bits.
  for (const int world : {1, 3, 4, 7}) {
    const std::uint64_t count = 1003;
    const auto ins = make_inputs(DType::F32, count, world, 41);
    const Bytes want = reference_reduce(DType::F32, ReduceOp::sum, ins, 0, count);
    std::vector<Bytes> bufs = ins;
    run_ranks(world, [&](Communicator& c) {
      Bytes& buf = bufs[static_cast<std::size_t>(c.rank())];
      const ShardRange mine = shard_range(count, world, c.rank());
      const std::span<std::byte> block = std::span(buf).subspan(mine.offset * 4, mine.numel * 4);
      c.reduce_scatter(buf, block, DType::F32, ReduceOp::sum);
      c.all_gather(block, buf, DType::F32);
    });
    for (int r = 0; r < world; ++r) {
      INFO("world ", world, " rank ", r);
      CHECK(difference(bufs[static_cast<std::size_t>(r)], want, 4) == "");
    }
  }
}

TEST_CASE("F16 and BF16 sums accumulate in fp32 and round once") {
  // In f16, 2048 + 1 rounds back to 2048 (ties to even), so folding in f16 would give 2048;
  // accumulating in fp32 gives 2050, which f16 represents exactly.
  for (const DType t : {DType::F16, DType::BF16}) {
    const auto to16 = t == DType::F16 ? f32_to_f16 : f32_to_bf16;
    const auto from16 = t == DType::F16 ? f16_to_f32 : bf16_to_f32;
    const float big = t == DType::F16 ? 2048.0f : 256.0f;  // where the format's ulp becomes 2
    std::vector<float> got(3);
    run_ranks(3, [&](Communicator& c) {
      std::uint16_t v = to16(c.rank() == 0 ? big : 1.0f);
      c.all_reduce(std::as_writable_bytes(std::span(&v, 1)), t, ReduceOp::sum);
      got[static_cast<std::size_t>(c.rank())] = from16(v);
    });
    for (const float g : got) CHECK(g == big + 2.0f);
  }
}

TEST_CASE("integer sums wrap around like two's complement") {
  std::vector<std::int32_t> i32(2);
  std::vector<std::int8_t> i8(2);
  std::vector<std::uint64_t> u64(2);
  run_ranks(2, [&](Communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    i32[r] = c.rank() == 0 ? std::numeric_limits<std::int32_t>::max() : 1;
    c.all_reduce(std::span(&i32[r], 1));
    i8[r] = -128;
    c.all_reduce(std::span(&i8[r], 1));
    u64[r] = std::numeric_limits<std::uint64_t>::max();
    c.all_reduce(std::span(&u64[r], 1));
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(i32[r] == std::numeric_limits<std::int32_t>::min());
    CHECK(i8[r] == 0);
    CHECK(u64[r] == std::numeric_limits<std::uint64_t>::max() - 1);
  }
}

TEST_CASE("typed overloads carry the dtype of their element type") {
  std::vector<std::vector<double>> f64(4);
  std::vector<std::vector<float>> gathered(4);
  std::vector<std::vector<std::int64_t>> scattered(4);
  std::vector<std::uint32_t> broadcasted(4);
  run_ranks(4, [&](Communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    f64[r] = {1.0 + c.rank(), 0.5};
    c.all_reduce(std::span(f64[r]), ReduceOp::mean);
    const std::vector<float> mine(shard_range(6, 4, c.rank()).numel, static_cast<float>(c.rank()));
    gathered[r].resize(6);
    c.all_gather<float>(mine, gathered[r]);
    const std::vector<std::int64_t> in{1, 2, 3, 4, 5, 6};
    scattered[r].resize(shard_range(6, 4, c.rank()).numel);
    c.reduce_scatter<std::int64_t>(in, scattered[r]);
    std::vector<std::uint32_t> b{c.rank() == 2 ? 7u : 0u};
    c.broadcast(std::span(b), 2);
    broadcasted[r] = b[0];
  });
  CHECK(broadcasted == std::vector<std::uint32_t>(4, 7u));
  for (std::size_t r = 0; r < 4; ++r) {
    CHECK(f64[r] == std::vector<double>{2.5, 0.5});
    CHECK(gathered[r] == std::vector<float>{0, 0, 1, 1, 2, 3});
  }
  CHECK(scattered[0] == std::vector<std::int64_t>{4, 8});
  CHECK(scattered[1] == std::vector<std::int64_t>{12, 16});
  CHECK(scattered[2] == std::vector<std::int64_t>{20});
  CHECK(scattered[3] == std::vector<std::int64_t>{24});
}

// ---- determinism --------------------------------------------------------------------------

TEST_CASE("all_reduce is bitwise identical across repeated runs with varied timing") {
  for (const int world : {4, 7}) {
    for (const DType t : {DType::F32, DType::F16}) {
      const auto ins = make_inputs(t, kRepeatCount, world, 53);
      const auto first = run_repeatable(Collective::all_reduce, ins, t, 0);
      int differing_runs = 0;
      for (int run = 1; run < kRepeatRuns; ++run)
        if (run_repeatable(Collective::all_reduce, ins, t, run) != first) ++differing_runs;
      INFO("world ", world, " dtype ", dtype_name(t));
      CHECK(differing_runs == 0);
      for (const Bytes& out : first) CHECK(out == first[0]);  // every rank has the same bits
    }
  }
}

TEST_CASE("reduce_scatter is bitwise identical across repeated runs with varied timing") {
  for (const int world : {4, 7}) {
    for (const DType t : {DType::F32, DType::F16}) {
      const auto ins = make_inputs(t, kRepeatCount, world, 59);
      const auto first = run_repeatable(Collective::reduce_scatter, ins, t, 0);
      int differing_runs = 0;
      for (int run = 1; run < kRepeatRuns; ++run)
        if (run_repeatable(Collective::reduce_scatter, ins, t, run) != first) ++differing_runs;
      INFO("world ", world, " dtype ", dtype_name(t));
      CHECK(differing_runs == 0);
    }
  }
}

// ---- exchange and synchronisation -----------------------------------------------------------

TEST_CASE("all_gather_bytes returns every rank's blob in rank order, empty ones included") {
  for (const int world : {1, 2, 5, 16}) {
    const auto blob = [](int rank) {
      Bytes b(static_cast<std::size_t>((rank * 37) % 5 == 0 ? 0 : rank * 13 + 1));
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(rank * 31 + i);
      return b;
    };
    std::vector<std::vector<Bytes>> got(static_cast<std::size_t>(world));
    run_ranks(world, [&](Communicator& c) {
      for (int round = 0; round < 3; ++round)  // the group is reusable round after round
        got[static_cast<std::size_t>(c.rank())] = c.all_gather_bytes(blob(c.rank()));
    });
    for (int r = 0; r < world; ++r) {
      INFO("world ", world, " rank ", r);
      const auto& all = got[static_cast<std::size_t>(r)];
      REQUIRE(all.size() == static_cast<std::size_t>(world));
      for (int q = 0; q < world; ++q) CHECK(all[static_cast<std::size_t>(q)] == blob(q));
    }
  }
}

TEST_CASE("barrier does not return before every rank has entered it") {
  constexpr int kWorld = 8;
  constexpr int kRounds = 200;
  std::vector<std::atomic<int>> entered(kRounds);
  // Plain ints: without the barrier's happens-before edge TSan reports these reads.
  std::vector<std::vector<int>> stamps(kRounds, std::vector<int>(kWorld, 0));
  std::vector<int> early(kWorld, 0), unseen(kWorld, 0);
  run_ranks(kWorld, [&](Communicator& c) {
    const auto me = static_cast<std::size_t>(c.rank());
    for (int round = 0; round < kRounds; ++round) {
      const auto k = static_cast<std::size_t>(round);
      if ((round + c.rank()) % 5 == 0) std::this_thread::yield();
      stamps[k][me] = round + 1;
      entered[k].fetch_add(1);
      c.barrier();
      if (entered[k].load() != kWorld) ++early[me];
      for (int q = 0; q < kWorld; ++q)
        if (stamps[k][static_cast<std::size_t>(q)] != round + 1) ++unseen[me];
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    CHECK(early[static_cast<std::size_t>(r)] == 0);
    CHECK(unseen[static_cast<std::size_t>(r)] == 0);
  }
}

// ---- disagreements across ranks -------------------------------------------------------------

namespace {

// Runs fn on 4 ranks; each rank's ckpt::Error (if any) is returned instead of rethrown, so the
// test sees what every rank saw.
std::vector<std::optional<Error>> errors_per_rank(int world,
                                                  const std::function<void(Communicator&)>& fn) {
  std::vector<std::optional<Error>> seen(static_cast<std::size_t>(world));
  run_ranks(world, [&](Communicator& c) {
    try {
      fn(c);
    } catch (const Error& e) {
      seen[static_cast<std::size_t>(c.rank())] = e;
    }
  });
  return seen;
}

void check_comm_error_everywhere(const std::vector<std::optional<Error>>& seen,
                                 const std::string& detail_part, const std::string& expected,
                                 const std::string& actual) {
  for (std::size_t r = 0; r < seen.size(); ++r) {
    INFO("rank ", r);
    REQUIRE(seen[r].has_value());
    CHECK(seen[r]->code() == Errc::comm_error);
    CHECK(seen[r]->detail().find(detail_part) != std::string::npos);
    CHECK(seen[r]->expected() == expected);
    CHECK(seen[r]->actual() == actual);
  }
}

}  // namespace

TEST_CASE("mismatched element counts raise comm_error on every rank") {
  const auto count_for = [](const Communicator& c) -> std::uint64_t { return c.rank() == 2 ? 999 : 1000; };
  SUBCASE("all_reduce") {
    check_comm_error_everywhere(errors_per_rank(4, [&](Communicator& c) {
      std::vector<float> v(count_for(c), 1.0f);
      c.all_reduce(std::span(v));
    }), "all_reduce: rank 2 disagrees with rank 0 on the element count", "1000", "999");
  }
  SUBCASE("broadcast") {
    check_comm_error_everywhere(errors_per_rank(4, [&](Communicator& c) {
      std::vector<float> v(count_for(c), 1.0f);
      c.broadcast(std::span(v), 0);
    }), "broadcast: rank 2 disagrees with rank 0 on the element count", "1000", "999");
  }
  SUBCASE("reduce_scatter") {
    check_comm_error_everywhere(errors_per_rank(4, [&](Communicator& c) {
      const std::vector<float> in(count_for(c), 1.0f);
      std::vector<float> out(shard_range(count_for(c), 4, c.rank()).numel);
      c.reduce_scatter<float>(in, out);
    }), "reduce_scatter: rank 2 disagrees with rank 0 on the element count", "1000", "999");
  }
  SUBCASE("all_gather") {
    check_comm_error_everywhere(errors_per_rank(4, [&](Communicator& c) {
      const std::vector<float> in(shard_range(count_for(c), 4, c.rank()).numel, 1.0f);
      std::vector<float> out(count_for(c));
      c.all_gather<float>(in, out);
    }), "all_gather: rank 2 disagrees with rank 0 on the element count", "1000", "999");
  }
}

TEST_CASE("mismatched dtypes raise comm_error on every rank") {
  check_comm_error_everywhere(errors_per_rank(3, [](Communicator& c) {
    Bytes buf(64);  // same bytes, different element types
    c.all_reduce(buf, c.rank() == 1 ? DType::BF16 : DType::F16, ReduceOp::sum);
  }), "rank 1 disagrees with rank 0 on the dtype", "F16", "BF16");
}

TEST_CASE("mismatched broadcast roots raise comm_error on every rank") {
  check_comm_error_everywhere(errors_per_rank(4, [](Communicator& c) {
    std::vector<double> v(10);
    c.broadcast(std::span(v), c.rank() == 3 ? 1 : 0);
  }), "broadcast: rank 3 disagrees with rank 0 on the root", "0", "1");
}

TEST_CASE("mismatched reduce ops raise comm_error on every rank") {
  check_comm_error_everywhere(errors_per_rank(2, [](Communicator& c) {
    std::vector<float> v(10);
    c.all_reduce(std::span(v), c.rank() == 1 ? ReduceOp::mean : ReduceOp::sum);
  }), "rank 1 disagrees with rank 0 on the reduce op", "sum", "mean");
}

TEST_CASE("different collectives on different ranks raise comm_error on every rank") {
  check_comm_error_everywhere(errors_per_rank(3, [](Communicator& c) {
    if (c.rank() == 2) {
      c.barrier();
    } else {
      std::vector<float> v(10);
      c.all_reduce(std::span(v));
    }
  }), "all_reduce: rank 2 disagrees with rank 0 on the collective", "all_reduce", "barrier");
}

TEST_CASE("the group stays usable after a detected mismatch") {
  std::vector<float> after(4);
  std::vector<int> mismatches_seen(4);
  run_ranks(4, [&](Communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    std::vector<float> v(c.rank() == 1 ? 5 : 6, 1.0f);
    try {
      c.all_reduce(std::span(v));
    } catch (const Error& e) {
      if (e.code() == Errc::comm_error) ++mismatches_seen[r];
    }
    std::vector<float> ok{static_cast<float>(c.rank())};
    c.all_reduce(std::span(ok));
    after[r] = ok[0];
  });
  CHECK(mismatches_seen == std::vector<int>(4, 1));
  CHECK(after == std::vector<float>(4, 6.0f));
}

// ---- arguments a rank can check alone ---------------------------------------------------------

namespace {
Errc local_error(const std::function<void(Communicator&)>& fn) {
  auto group = make_thread_group(1);  // invalid arguments are rejected before communicating
  return expect_error([&] { fn(*group[0]); }).code();
}
}  // namespace

TEST_CASE("spans whose size is not a multiple of the element size raise invalid_argument") {
  Bytes odd(6), out(6);
  CHECK(local_error([&](Communicator& c) { c.all_reduce(odd, DType::F32, ReduceOp::sum); }) == Errc::invalid_argument);
  CHECK(local_error([&](Communicator& c) { c.broadcast(odd, DType::F64, 0); }) == Errc::invalid_argument);
  CHECK(local_error([&](Communicator& c) { c.reduce_scatter(odd, out, DType::F32, ReduceOp::sum); }) == Errc::invalid_argument);
  CHECK(local_error([&](Communicator& c) { c.all_gather(odd, out, DType::F32); }) == Errc::invalid_argument);
}

TEST_CASE("mean of an integer dtype and any reduction of BOOL raise invalid_argument") {
  Bytes buf(8), out(8);
  CHECK(local_error([&](Communicator& c) { c.all_reduce(buf, DType::I32, ReduceOp::mean); }) == Errc::invalid_argument);
  CHECK(local_error([&](Communicator& c) { c.all_reduce(buf, DType::U8, ReduceOp::mean); }) == Errc::invalid_argument);
  CHECK(local_error([&](Communicator& c) { c.all_reduce(buf, DType::BOOL, ReduceOp::sum); }) == Errc::invalid_argument);
  CHECK(local_error([&](Communicator& c) { c.reduce_scatter(buf, out, DType::I64, ReduceOp::mean); }) == Errc::invalid_argument);
  CHECK(local_error([&](Communicator& c) { c.all_reduce(buf, static_cast<DType>(200), ReduceOp::sum); }) == Errc::invalid_argument);
}

TEST_CASE("a broadcast root outside the group raises invalid_argument") {
  Bytes buf(8);
  CHECK(local_error([&](Communicator& c) { c.broadcast(buf, DType::F32, 1); }) == Errc::invalid_argument);
  CHECK(local_error([&](Communicator& c) { c.broadcast(buf, DType::F32, -1); }) == Errc::invalid_argument);
}

TEST_CASE("reduce_scatter and all_gather reject a block of the wrong size") {
  Bytes full(40), short_block(36);
  const Error rs = expect_error([&] {
    auto g = make_thread_group(1);
    g[0]->reduce_scatter(full, short_block, DType::F32, ReduceOp::sum);
  });
  CHECK(rs.code() == Errc::invalid_argument);
  CHECK(rs.expected() == "10 elements");
  CHECK(rs.actual() == "9 elements");
  CHECK(local_error([&](Communicator& c) { c.all_gather(short_block, full, DType::F32); }) == Errc::invalid_argument);
}

TEST_CASE("input and output overlapping other than exactly in place raise invalid_argument") {
  Bytes buf(80);
  const std::span<std::byte> all(buf);
  // World 1 owns the whole range, so its in-place block is the whole buffer; offset by one
  // element it overlaps without being in place.
  CHECK(local_error([&](Communicator& c) {
    c.reduce_scatter(all.subspan(0, 40), all.subspan(4, 40), DType::F32, ReduceOp::sum);
  }) == Errc::invalid_argument);
  CHECK(local_error([&](Communicator& c) {
    c.all_gather(all.subspan(4, 40), all.subspan(0, 40), DType::F32);
  }) == Errc::invalid_argument);
}
