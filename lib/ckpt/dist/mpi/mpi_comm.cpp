// SPDX-License-Identifier: Apache-2.0
// The MPI Communicator and MpiSession (see mpi_comm.hpp). Data moves point to point with
// MPI_Isend/MPI_Irecv in pieces of at most max_message_ bytes; between two ranks, messages
// with one tag on one communicator arrive in the order sent, so the pieces need no numbering.
#include "ckpt/dist/mpi/mpi_comm.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/detail/collective_kind.hpp"
#include "ckpt/dist/detail/reduce.hpp"

namespace ckpt::dist {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int len = 0;
  if (MPI_Error_string(rc, text.data(), &len) != MPI_SUCCESS) len = 0;
  throw Error(Errc::comm_error, {}, std::string(what) + " failed: " + std::string(text.data(), static_cast<std::size_t>(len)),
              "MPI_SUCCESS", std::to_string(rc));
}

namespace {

constexpr int kDataTag = 17;

using Kind = detail::CollectiveKind;
using detail::kind_name;

// What every rank sends on entering a collective; fields a kind does not use stay at their
// defaults on every rank. `extra` is not compared (all_gather_bytes: this rank's blob size).
struct Header {
  std::uint64_t kind = 0, dtype = 0, count = 0, root = 0, op = 0, extra = 0;
};
constexpr int kHeaderWords = 6;

std::string field_value(const Header& h, int field) {
  switch (field) {
    case 0: return std::string(kind_name(static_cast<Kind>(h.kind)));
    case 1: return std::string(dtype_name(static_cast<DType>(h.dtype)));
    case 2: return std::to_string(h.count);
    case 3: return std::to_string(h.root);
    default: return std::string(reduce_op_name(static_cast<ReduceOp>(h.op)));
  }
}

std::size_t max_message_bytes() {
  std::size_t limit = std::size_t{1} << 30;
  if (const char* env = std::getenv("CKPT_MPI_MAX_MESSAGE"); env && *env) {
    const long long v = std::atoll(env);
    if (v <= 0) throw Error(Errc::invalid_argument, {}, "CKPT_MPI_MAX_MESSAGE", "a positive byte count", env);
    limit = std::min<std::size_t>(limit, static_cast<std::size_t>(v));
  }
  return std::min<std::size_t>(limit, INT_MAX);
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm), max_message_(max_message_bytes()) {
    check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }
  ~MpiCommunicator() override { MPI_Comm_free(&comm_); }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }

  void abort(std::string reason) noexcept override {
    std::lock_guard lk(abort_mu_);
    if (!aborted_) aborted_ = std::move(reason);
  }

 protected:
  void do_broadcast(std::span<std::byte> buf, DType t, int root) override {
    agree({.kind = static_cast<std::uint64_t>(Kind::broadcast), .dtype = static_cast<std::uint64_t>(t),
           .count = buf.size() / dtype_size(t), .root = static_cast<std::uint64_t>(root)});
    for (std::size_t off = 0; off < buf.size(); off += max_message_) {
      const std::size_t n = std::min(max_message_, buf.size() - off);
      check_mpi(MPI_Bcast(buf.data() + off, static_cast<int>(n), MPI_BYTE, root, comm_), "MPI_Bcast");
    }
  }

  void do_all_reduce(std::span<std::byte> buf, DType t, ReduceOp op) override {
    const std::uint64_t count = buf.size() / dtype_size(t);
    agree({.kind = static_cast<std::uint64_t>(Kind::all_reduce), .dtype = static_cast<std::uint64_t>(t), .count = count,
           .op = static_cast<std::uint64_t>(op)});
    const std::size_t esz = dtype_size(t);
    std::byte* mine = buf.data() + shard_range(count, size_, rank_).offset * esz;
    reduce_own_block(buf, mine, t, op);
    // Every rank now holds its reduced block in place; gather them.
    std::vector<Transfer> sends, recvs;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const ShardRange b = shard_range(count, size_, q);
      sends.push_back({q, mine, shard_range(count, size_, rank_).numel * esz});
      recvs.push_back({q, buf.data() + b.offset * esz, b.numel * esz});
    }
    exchange(sends, recvs);
  }

  void do_reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out, DType t, ReduceOp op) override {
    agree({.kind = static_cast<std::uint64_t>(Kind::reduce_scatter), .dtype = static_cast<std::uint64_t>(t),
           .count = in.size() / dtype_size(t), .op = static_cast<std::uint64_t>(op)});
    reduce_own_block(in, out.data(), t, op);
  }

  void do_all_gather(std::span<const std::byte> in, std::span<std::byte> out, DType t) override {
    const std::size_t esz = dtype_size(t);
    const std::uint64_t count = out.size() / esz;
    agree({.kind = static_cast<std::uint64_t>(Kind::all_gather), .dtype = static_cast<std::uint64_t>(t), .count = count});
    std::byte* own = out.data() + shard_range(count, size_, rank_).offset * esz;
    if (!in.empty() && own != in.data()) std::memmove(own, in.data(), in.size());
    std::vector<Transfer> sends, recvs;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const ShardRange b = shard_range(count, size_, q);
      sends.push_back({q, own, in.size()});
      recvs.push_back({q, out.data() + b.offset * esz, b.numel * esz});
    }
    exchange(sends, recvs);
  }

  // The header exchange is an all-gather: no rank leaves it before every rank entered.
  void do_barrier() override { agree({.kind = static_cast<std::uint64_t>(Kind::barrier)}); }

  std::vector<std::vector<std::byte>> do_all_gather_bytes(std::span<const std::byte> mine) override {
    const auto headers = agree({.kind = static_cast<std::uint64_t>(Kind::all_gather_bytes), .extra = mine.size()});
    std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(size_));
    std::vector<Transfer> sends, recvs;
    for (int q = 0; q < size_; ++q) {
      auto& blob = all[static_cast<std::size_t>(q)];
      if (q == rank_) {
        blob.assign(mine.begin(), mine.end());
        continue;
      }
      blob.resize(static_cast<std::size_t>(headers[static_cast<std::size_t>(q)].extra));
      sends.push_back({q, const_cast<std::byte*>(mine.data()), mine.size()});
      recvs.push_back({q, blob.data(), blob.size()});
    }
    exchange(sends, recvs);
    return all;
  }

  std::unique_ptr<Communicator> do_split(int color, int key) override {
    if (color < 0)
      throw Error(Errc::invalid_argument, {}, "split: color must be >= 0", ">= 0", std::to_string(color));
    agree({.kind = static_cast<std::uint64_t>(Kind::split)});
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(sub);
  }

 private:
  struct Transfer {
    int peer;
    std::byte* data;
    std::size_t bytes;
  };

  void check_alive() {
    std::lock_guard lk(abort_mu_);
    if (aborted_) throw Error(Errc::aborted, {}, *aborted_);
  }

  // Exchanges every rank's header; every rank finds the same first disagreement (lowest rank,
  // then collective, dtype, count, root, op) and throws the same comm_error.
  std::vector<Header> agree(const Header& h) {
    check_alive();
    std::vector<Header> all(static_cast<std::size_t>(size_));
    check_mpi(MPI_Allgather(&h, kHeaderWords, MPI_UINT64_T, all.data(), kHeaderWords, MPI_UINT64_T, comm_), "MPI_Allgather");
    const Header& ref = all[0];
    for (int q = 1; q < size_; ++q) {
      const Header& c = all[static_cast<std::size_t>(q)];
      const std::array<bool, 5> differs{c.kind != ref.kind, c.dtype != ref.dtype, c.count != ref.count, c.root != ref.root,
                                        c.op != ref.op};
      static constexpr std::array<const char*, 5> kFields{"collective", "dtype", "element count", "root", "reduce op"};
      for (int f = 0; f < 5; ++f)
        if (differs[static_cast<std::size_t>(f)])
          throw Error(Errc::comm_error, {},
                      std::string(kind_name(static_cast<Kind>(ref.kind))) + ": rank " + std::to_string(q) +
                          " disagrees with rank 0 on the " + kFields[static_cast<std::size_t>(f)],
                      field_value(ref, f), field_value(c, f));
    }
    return all;
  }

  // Sends every rank its block of `in` and folds this rank's block from every rank's copy, in
  // rank order, into `dst` (which may be exactly this rank's block of `in`).
  void reduce_own_block(std::span<const std::byte> in, std::byte* dst, DType t, ReduceOp op) {
    const std::size_t esz = dtype_size(t);
    const std::uint64_t count = in.size() / esz;
    const ShardRange mine = shard_range(count, size_, rank_);
    const std::size_t block = mine.numel * esz;
    std::vector<std::byte> scratch(block * static_cast<std::size_t>(size_ - 1));
    std::vector<const std::byte*> inputs(static_cast<std::size_t>(size_));
    std::vector<Transfer> sends, recvs;
    std::size_t slot = 0;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) {
        inputs[static_cast<std::size_t>(q)] = in.data() + mine.offset * esz;
        continue;
      }
      const ShardRange b = shard_range(count, size_, q);
      sends.push_back({q, const_cast<std::byte*>(in.data()) + b.offset * esz, b.numel * esz});
      std::byte* into = scratch.data() + slot++ * block;
      recvs.push_back({q, into, block});
      inputs[static_cast<std::size_t>(q)] = into;
    }
    exchange(sends, recvs);
    if (mine.numel) detail::reduce_range(inputs, 0, mine.numel, dst, t, op);
  }

  // Posts every receive and send (cut into pieces of at most max_message_ bytes) and waits for
  // all of them, so the buffers are free again on return.
  void exchange(const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs) {
    std::vector<MPI_Request> reqs;
    auto post = [&](const Transfer& x, bool send) {
      for (std::size_t off = 0; off < x.bytes; off += max_message_) {
        const int n = static_cast<int>(std::min(max_message_, x.bytes - off));
        MPI_Request r = MPI_REQUEST_NULL;
        check_mpi(send ? MPI_Isend(x.data + off, n, MPI_BYTE, x.peer, kDataTag, comm_, &r)
                       : MPI_Irecv(x.data + off, n, MPI_BYTE, x.peer, kDataTag, comm_, &r),
                  send ? "MPI_Isend" : "MPI_Irecv");
        reqs.push_back(r);
      }
    };
    for (const auto& x : recvs) post(x, false);
    for (const auto& x : sends) post(x, true);
    if (!reqs.empty())
      check_mpi(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::size_t max_message_;
  std::mutex abort_mu_;
  std::optional<std::string> aborted_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm) {
  MPI_Comm dup = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
  return std::make_unique<MpiCommunicator>(dup);
}

MpiSession::MpiSession(int* argc, char*** argv) {
  int already = 0;
  check_mpi(MPI_Initialized(&already), "MPI_Initialized");
  int provided = MPI_THREAD_SINGLE;
  if (already) {
    check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  } else {
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    initialised_here_ = true;
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    if (initialised_here_) MPI_Finalize();
    throw Error(Errc::comm_error, {}, "MPI does not provide the thread level the checkpoint coordinator needs",
                "MPI_THREAD_MULTIPLE (" + std::to_string(MPI_THREAD_MULTIPLE) + ")", std::to_string(provided));
  }
  try {
    world_ = make_mpi_communicator(MPI_COMM_WORLD);
  } catch (...) {
    if (initialised_here_) MPI_Finalize();
    throw;
  }
  rank_ = world_->rank();
  size_ = world_->size();
}

MpiSession::~MpiSession() {
  world_.reset();
  if (initialised_here_) MPI_Finalize();
}

}  // namespace ckpt::dist
