// SPDX-License-Identifier: Apache-2.0
#include "ckpt/dist/thread_comm.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/dist/detail/collective_kind.hpp"
#include "ckpt/dist/detail/reduce.hpp"

namespace ckpt::dist {

namespace {

constexpr int kMaxWorld = 1024;

using Kind = detail::CollectiveKind;
using detail::kind_name;

// What a rank publishes on entering a collective. Fields a kind does not use keep their
// defaults on every rank, so comparing all of them checks exactly the ones that matter.
struct Call {
  Kind kind = Kind::barrier;
  DType dtype = DType::U8;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  std::uint64_t count = 0;             // elements; 0 for barrier and all_gather_bytes
  const std::byte* in = nullptr;       // what peers read: input, or the broadcast buffer
  std::size_t in_bytes = 0;
  const std::byte* scratch = nullptr;  // all_reduce: this rank's reduced block
};

enum class Field { collective, dtype, count, root, op };

// The first field on which rank `rank` disagrees with rank 0. Found without allocating (so
// the phase that looks for it cannot throw) and turned into an Error only after the last
// barrier, from copies of the two calls, since the shared slots are reused after it.
struct Disagreement {
  int rank;
  Field field;
  Call expected;
  Call actual;
};

// Shared rendezvous of one thread group.
//
// A collective is a sequence of barriers; between two barriers a rank may read its peers'
// published buffers ("peer phase"), except after the last one. `in_peer_phase_` counts the
// ranks that may still be reading: it is set to the world size when a barrier that opens a
// peer phase completes and decremented as each rank arrives at the next barrier. After a
// failure, a rank waits for it to reach zero before throwing, because throwing lets the caller
// free buffers that a peer could otherwise still be reading.
class Group {
 public:
  explicit Group(int world) : world_(world), calls_(static_cast<std::size_t>(world)),
                              inputs_(static_cast<std::size_t>(world)),
                              split_slots_(static_cast<std::size_t>(world)) {}

  int world() const noexcept { return world_; }

  // First barrier of a collective: publishes `call` and waits for every rank.
  void enter(int rank, const Call& call) { arrive(call.kind, rank, &call, false, true); }
  // Barrier between two peer phases.
  void next_phase(Kind kind) { arrive(kind, -1, nullptr, true, true); }
  // Last barrier: after it no peer reads this rank's buffers.
  void leave(Kind kind) { arrive(kind, -1, nullptr, true, false); }

  // Valid from enter() until leave() returns.
  const Call& call(int rank) const noexcept { return calls_[static_cast<std::size_t>(rank)]; }
  std::span<const std::byte* const> inputs() const noexcept { return inputs_; }

  std::optional<Disagreement> find_disagreement() const noexcept {
    const Call& ref = calls_[0];
    for (int q = 1; q < world_; ++q) {
      const Call& c = calls_[static_cast<std::size_t>(q)];
      // The kind first: when it differs, the other fields mean different things.
      if (c.kind != ref.kind) return Disagreement{q, Field::collective, ref, c};
      if (c.dtype != ref.dtype) return Disagreement{q, Field::dtype, ref, c};
      if (c.count != ref.count) return Disagreement{q, Field::count, ref, c};
      if (c.root != ref.root) return Disagreement{q, Field::root, ref, c};
      if (c.op != ref.op) return Disagreement{q, Field::op, ref, c};
    }
    return std::nullopt;
  }

  // Puts the group in its terminal failed state; the first failure wins. With
  // `propagate`, every group split from this one fails the same way (transitively), so a
  // rank blocked in a sub-group collective is woken too.
  void fail(Errc code, std::string reason, bool propagate = true) noexcept {
    std::vector<std::weak_ptr<Group>> children;
    {
      std::lock_guard lk(mu_);
      if (failed_) return;
      failed_ = true;
      failure_code_ = code;
      failure_reason_ = reason;
      if (propagate) children.swap(children_);
    }
    cv_.notify_all();
    // After unlocking: a child locks only its own mutex, so no lock order arises.
    for (const auto& weak : children)
      if (const auto child = weak.lock()) child->fail(code, reason, true);
  }

  // Registers a group split from this one so that failing this one fails it. A group
  // already failed fails the child at once (the failure may have raced the split).
  void add_child(const std::shared_ptr<Group>& child) {
    bool failed_now = false;
    Errc code = Errc::aborted;
    std::string reason;
    {
      std::lock_guard lk(mu_);
      std::erase_if(children_, [](const std::weak_ptr<Group>& w) { return w.expired(); });
      if (failed_) {
        failed_now = true;
        code = failure_code_;
        reason = failure_reason_;
      } else {
        children_.push_back(child);
      }
    }
    if (failed_now) child->fail(code, std::move(reason), true);
  }

  // split: the group a rank's color leader created, published in the leader's slot during the
  // first peer phase of the split and read in the second. Only a leader writes its own slot.
  std::shared_ptr<Group>& split_slot(int rank) noexcept {
    return split_slots_[static_cast<std::size_t>(rank)];
  }

 private:
  void arrive(Kind kind, int rank, const Call* publish, bool leaving_peer_phase,
              bool opens_peer_phase) {
    std::unique_lock lk(mu_);
    if (leaving_peer_phase && --in_peer_phase_ == 0 && failed_) cv_.notify_all();
    if (failed_) {
      // Peers between barriers only compute, never wait, so this wait is short.
      cv_.wait(lk, [&] { return in_peer_phase_ == 0; });
      throw_failure(kind);
    }
    if (publish != nullptr) {
      calls_[static_cast<std::size_t>(rank)] = *publish;
      inputs_[static_cast<std::size_t>(rank)] = publish->in;
    }
    const std::uint64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      in_peer_phase_ = opens_peer_phase ? world_ : 0;
      // Notify after unlocking, or every woken rank would block again on the mutex we hold.
      lk.unlock();
      cv_.notify_all();
      return;
    }
    cv_.wait(lk, [&] { return generation_ != gen || (failed_ && in_peer_phase_ == 0); });
    // A barrier that completed before the failure still counts: this rank is now in the
    // next phase and is accounted for in in_peer_phase_.
    if (generation_ != gen) return;
    throw_failure(kind);
  }

  [[noreturn]] void throw_failure(Kind kind) const {
    std::string detail(kind_name(kind));
    detail += failure_code_ == Errc::aborted ? ": group aborted: " : ": ";
    detail += failure_reason_;
    throw Error(failure_code_, {}, std::move(detail));
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const int world_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  int in_peer_phase_ = 0;
  bool failed_ = false;
  Errc failure_code_ = Errc::aborted;
  std::string failure_reason_;
  std::vector<Call> calls_;
  // calls_[q].in again, contiguous, so the reduction kernel takes them as one span.
  std::vector<const std::byte*> inputs_;
  std::vector<std::shared_ptr<Group>> split_slots_;
  std::vector<std::weak_ptr<Group>> children_;  // guarded by mu_
};

std::string_view field_name(Field f) noexcept {
  switch (f) {
    case Field::collective: return "collective";
    case Field::dtype: return "dtype";
    case Field::count: return "element count";
    case Field::root: return "root";
    case Field::op: return "reduce op";
  }
  return "call";
}

std::string field_value(const Call& c, Field f) {
  switch (f) {
    case Field::collective: return std::string(kind_name(c.kind));
    case Field::dtype: return std::string(dtype_name(c.dtype));
    case Field::count: return std::to_string(c.count);
    case Field::root: return std::to_string(c.root);
    case Field::op: return std::string(reduce_op_name(c.op));
  }
  return {};
}

[[noreturn]] void throw_disagreement(const Disagreement& d) {
  throw Error(Errc::comm_error, {},
              std::string(kind_name(d.expected.kind)) + ": rank " + std::to_string(d.rank) +
                  " disagrees with rank 0 on the " + std::string(field_name(d.field)),
              field_value(d.expected, d.field), field_value(d.actual, d.field));
}

void copy_bytes(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
  if (n != 0 && dst != src) std::memcpy(dst, src, n);
}

// Every group one rank belongs to through splits of one root communicator, shared by that
// rank's communicators: depart() fails exactly these (only this rank's thread touches it).
using Memberships = std::vector<std::weak_ptr<Group>>;

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> group, int rank,
                     std::shared_ptr<Memberships> memberships = std::make_shared<Memberships>())
      : group_(std::move(group)), rank_(rank), memberships_(std::move(memberships)) {}

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return group_->world(); }
  void abort(std::string reason) noexcept override {
    group_->fail(Errc::aborted, std::move(reason));
  }

  // run_ranks: this rank's function returned, so it will never join another collective; a
  // peer that calls one would wait forever.
  // The groups split from this one that do not contain this rank carry on: only the groups
  // this rank is a member of are failed.
  void depart() noexcept {
    std::string reason;
    try {
      reason = "rank " + std::to_string(rank_) +
               " returned from its rank function and will never join this collective";
    } catch (...) {
    }
    group_->fail(Errc::comm_error, reason, false);
    for (const auto& weak : *memberships_)
      if (const auto g = weak.lock()) g->fail(Errc::comm_error, reason, false);
  }

 protected:
  void do_broadcast(std::span<std::byte> buf, DType t, int root) override {
    const Exclusive guard(*this, Kind::broadcast);
    const Call call{.kind = Kind::broadcast, .dtype = t, .root = root,
                    .count = buf.size() / dtype_size(t), .in = buf.data(),
                    .in_bytes = buf.size()};
    group_->enter(rank_, call);
    const auto bad = group_->find_disagreement();
    if (!bad && rank_ != root) copy_bytes(buf.data(), group_->call(root).in, buf.size());
    group_->leave(call.kind);
    if (bad) throw_disagreement(*bad);
  }

  // Each rank reduces only its own block of every rank's buffer into scratch; after a barrier
  // each rank copies every block into its own buffer. Total work is O(count * N) spread over N
  // threads, and nobody writes a buffer while a peer may still read it.
  void do_all_reduce(std::span<std::byte> buf, DType t, ReduceOp op) override {
    const Exclusive guard(*this, Kind::all_reduce);
    const std::size_t esz = dtype_size(t);
    const std::uint64_t count = buf.size() / esz;
    const int world = group_->world();
    const ShardRange mine = shard_range(count, world, rank_);
    // Kept across calls: a training loop all-reduces the same sizes every step. Resizing here
    // is safe because no peer reads it outside a collective.
    scratch_.resize(static_cast<std::size_t>(mine.numel) * esz);
    const Call call{.kind = Kind::all_reduce, .dtype = t, .op = op, .count = count,
                    .in = buf.data(), .in_bytes = buf.size(), .scratch = scratch_.data()};
    group_->enter(rank_, call);
    // On a disagreement every rank goes straight to leave(): the peers may have entered a
    // collective with fewer barriers, and all ranks reach the same verdict.
    const auto bad = group_->find_disagreement();
    if (!bad) {
      detail::reduce_range(group_->inputs(), mine.offset, mine.numel, scratch_.data(), t, op);
      group_->next_phase(call.kind);
      for (int q = 0; q < world; ++q) {
        const ShardRange block = shard_range(count, world, q);
        copy_bytes(buf.data() + block.offset * esz, group_->call(q).scratch, block.numel * esz);
      }
    }
    group_->leave(call.kind);
    if (bad) throw_disagreement(*bad);
  }

  void do_reduce_scatter(std::span<const std::byte> in, std::span<std::byte> out, DType t,
                         ReduceOp op) override {
    const Exclusive guard(*this, Kind::reduce_scatter);
    const std::uint64_t count = in.size() / dtype_size(t);
    const ShardRange mine = shard_range(count, group_->world(), rank_);
    const Call call{.kind = Kind::reduce_scatter, .dtype = t, .op = op, .count = count,
                    .in = in.data(), .in_bytes = in.size()};
    group_->enter(rank_, call);
    const auto bad = group_->find_disagreement();
    // In place (out == own block of in) is safe: no peer reads this rank's block, and the
    // kernel reads each block before writing it.
    if (!bad) detail::reduce_range(group_->inputs(), mine.offset, mine.numel, out.data(), t, op);
    group_->leave(call.kind);
    if (bad) throw_disagreement(*bad);
  }

  void do_all_gather(std::span<const std::byte> in, std::span<std::byte> out, DType t) override {
    const Exclusive guard(*this, Kind::all_gather);
    const std::size_t esz = dtype_size(t);
    const std::uint64_t count = out.size() / esz;
    const int world = group_->world();
    const Call call{.kind = Kind::all_gather, .dtype = t, .count = count, .in = in.data(),
                    .in_bytes = in.size()};
    group_->enter(rank_, call);
    const auto bad = group_->find_disagreement();
    if (!bad) {
      // In place, this rank's own block is skipped (source == destination) and peers only
      // read that block of our `out`, which we never write.
      for (int q = 0; q < world; ++q) {
        const ShardRange block = shard_range(count, world, q);
        copy_bytes(out.data() + block.offset * esz, group_->call(q).in, block.numel * esz);
      }
    }
    group_->leave(call.kind);
    if (bad) throw_disagreement(*bad);
  }

  void do_barrier() override {
    const Exclusive guard(*this, Kind::barrier);
    // Two barriers rather than one: the second keeps the published calls alive until every
    // rank has checked them, so a rank that entered barrier() while another entered a
    // different collective is reported instead of silently pairing them.
    group_->enter(rank_, Call{.kind = Kind::barrier});
    const auto bad = group_->find_disagreement();
    group_->leave(Kind::barrier);
    if (bad) throw_disagreement(*bad);
  }

  std::vector<std::vector<std::byte>> do_all_gather_bytes(
      std::span<const std::byte> mine) override {
    const Exclusive guard(*this, Kind::all_gather_bytes);
    const Call call{.kind = Kind::all_gather_bytes, .in = mine.data(), .in_bytes = mine.size()};
    group_->enter(rank_, call);
    const auto bad = group_->find_disagreement();
    std::vector<std::vector<std::byte>> all;
    std::exception_ptr alloc_error;
    if (!bad) {
      // Allocation can fail; the rank must still reach leave() or its peers would wait forever.
      try {
        all.resize(static_cast<std::size_t>(group_->world()));
        for (int q = 0; q < group_->world(); ++q) {
          const Call& c = group_->call(q);
          all[static_cast<std::size_t>(q)].assign(c.in, c.in + c.in_bytes);
        }
      } catch (...) {
        alloc_error = std::current_exception();
      }
    }
    group_->leave(call.kind);
    if (bad) throw_disagreement(*bad);
    if (alloc_error) std::rethrow_exception(alloc_error);
    return all;
  }

  // One collective in two peer phases: every rank publishes (color, key); the leader of each
  // color (its lowest rank here) creates the new group's shared state, registers it as a
  // child of this group and publishes it in its slot; after a barrier every member takes it
  // from its leader's slot. The next split's first barrier comes after every rank has read
  // its slot, so a leader never overwrites a slot a peer still reads.
  std::unique_ptr<Communicator> do_split(int color, int key) override {
    const Exclusive guard(*this, Kind::split);
    const std::array<int, 2> mine{color, key};
    const Call call{.kind = Kind::split, .in = reinterpret_cast<const std::byte*>(mine.data()),
                    .in_bytes = sizeof mine};
    group_->enter(rank_, call);
    const auto bad = group_->find_disagreement();
    int leader = -1, new_rank = 0, new_size = 0;
    std::exception_ptr error;
    if (!bad) {
      try {
        const int world = group_->world();
        auto color_key = [&](int q) {
          std::array<int, 2> ck{};
          std::memcpy(ck.data(), group_->call(q).in, sizeof ck);
          return ck;
        };
        std::vector<std::pair<int, int>> members;  // (key, rank) of this color
        for (int q = 0; q < world; ++q) {
          const auto ck = color_key(q);
          if (ck[0] != color) continue;
          if (leader < 0) leader = q;
          members.emplace_back(ck[1], q);
        }
        std::sort(members.begin(), members.end());
        new_size = static_cast<int>(members.size());
        new_rank = static_cast<int>(
            std::find(members.begin(), members.end(), std::pair{key, rank_}) - members.begin());
        if (leader == rank_) {
          group_->split_slot(rank_).reset();  // never leave a previous split's group there
          auto child = std::make_shared<Group>(new_size);
          group_->add_child(child);
          group_->split_slot(rank_) = std::move(child);
        }
      } catch (...) {  // allocation: the rank must still reach every barrier
        error = std::current_exception();
      }
      group_->next_phase(call.kind);
    }
    std::shared_ptr<Group> child;
    if (!bad && !error) child = group_->split_slot(leader);
    group_->leave(call.kind);
    // Every member has read the slot: the parent no longer holds the child alive.
    if (leader == rank_) group_->split_slot(rank_).reset();
    if (bad) throw_disagreement(*bad);
    if (error) std::rethrow_exception(error);
    if (!child)  // the leader failed to create it
      throw Error(Errc::comm_error, {}, "split: rank " + std::to_string(leader) +
                                            " could not create the group of color " +
                                            std::to_string(color));
    memberships_->push_back(child);
    return std::make_unique<ThreadCommunicator>(std::move(child), new_rank, memberships_);
  }

 private:
  // Two threads driving one rank would pair their collectives with the peers' in an arbitrary
  // order and deadlock or corrupt; refuse the second one instead.
  class Exclusive {
   public:
    Exclusive(ThreadCommunicator& c, Kind kind) : c_(c) {
      if (c_.busy_.exchange(true, std::memory_order_acquire))
        throw Error(Errc::invalid_argument, {},
                    std::string(kind_name(kind)) + ": rank " + std::to_string(c_.rank_) +
                        "'s communicator is already in a collective on another thread");
    }
    ~Exclusive() { c_.busy_.store(false, std::memory_order_release); }
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;

   private:
    ThreadCommunicator& c_;
  };

  std::shared_ptr<Group> group_;
  const int rank_;
  std::shared_ptr<Memberships> memberships_;
  std::atomic<bool> busy_{false};
  std::vector<std::byte> scratch_;  // all_reduce: this rank's reduced block, read by peers
};

bool is_abort(const std::exception_ptr& e) noexcept {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.code() == Errc::aborted;
  } catch (...) {
    return false;
  }
}

std::string failure_reason(int rank, const std::exception_ptr& e) {
  std::string what;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
    what = "a non-standard exception";
  }
  return "rank " + std::to_string(rank) + " failed: " + what;
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_group(int world_size) {
  if (world_size < 1 || world_size > kMaxWorld)
    throw Error(Errc::invalid_argument, {}, "thread group world size", "1.." +
                std::to_string(kMaxWorld), std::to_string(world_size));
  auto group = std::make_shared<Group>(world_size);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) comms.push_back(std::make_unique<ThreadCommunicator>(group, r));
  return comms;
}

void run_ranks(int world_size, std::function<void(Communicator&)> fn) {
  auto comms = make_thread_group(world_size);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  auto rank_main = [&](int r) {
    auto& comm = static_cast<ThreadCommunicator&>(*comms[static_cast<std::size_t>(r)]);
    try {
      fn(comm);
      comm.depart();
    } catch (...) {
      auto& err = errors[static_cast<std::size_t>(r)];
      err = std::current_exception();
      try {
        comm.abort(failure_reason(r, err));
      } catch (...) {  // building the reason failed; abort anyway so no peer hangs
        comm.abort({});
      }
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(world_size));
  try {
    for (int r = 0; r < world_size; ++r) threads.emplace_back(rank_main, r);
  } catch (...) {
    comms[0]->abort("run_ranks could not start a thread for every rank");
    for (auto& t : threads) t.join();
    throw;
  }
  for (auto& t : threads) t.join();

  std::exception_ptr first_abort;
  for (const auto& e : errors) {
    if (!e) continue;
    if (!is_abort(e)) std::rethrow_exception(e);
    if (!first_abort) first_abort = e;
  }
  if (first_abort) std::rethrow_exception(first_abort);
}

}  // namespace ckpt::dist
