// SPDX-License-Identifier: Apache-2.0
// The checkpoint commit across MPI processes (make_mpi_coordinator in mpi_comm.hpp).
//
// The protocol is runtime/coordinator.hpp's (ChannelCoordinator); this file supplies its
// transport and the traffic of node-local roots.
//
// Channel: a duplicate of the program's communicator, used for nothing else, so its messages
// can never match the training loop's collectives. The protocol's two collectives (gather on
// rank 0, broadcast from rank 0) run there on a channel thread of their own, non-blocking
// (MPI_Igather/MPI_Igatherv, MPI_Ibcast: a size, then the bytes) and tested until done, so
// that closing the coordinator ends a round a peer will never join.
//
// Node-local roots (CheckpointerOptions::nodes) add two kinds of traffic:
//   - file calls: a routed file system calls another process's FileService (over the posix
//     file system of that process's node): the request goes to the peer with tag
//     kFileRequestTag, prefixed with the tag the caller waits for the reply on (one of
//     kReplyTags tags from kFileReplyBase, taken in turn, so concurrent callers each get
//     their own); the peer's progress thread serves it and answers on that tag.
//   - redundancy bytes and shard sizes, on a second duplicate (bytes_comm_): exchange() on
//     tag kExchangeTag, channel c of send_bytes/receive_bytes on tag kBytesBase + c. The
//     callers' own threads send and receive (blocking), matched probes take each message.
// The destructor keeps serving file calls until every process has reached it (a
// non-blocking barrier): rank 0's Checkpointer may still rotate or commit another node's
// root through a process that is done with its own.
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/dist/mpi/mpi_comm.hpp"
#include "ckpt/fs/remote_file_system.hpp"

namespace ckpt::dist {

namespace {

constexpr int kFileRequestTag = 3;
constexpr int kFileReplyBase = 1024;
constexpr int kReplyTags = 4096;
constexpr int kExchangeTag = 1;
constexpr int kBytesBase = 2;

std::string pack(std::uint64_t step, const std::string& text) {
  std::string m(8, '\0');
  std::memcpy(m.data(), &step, 8);
  return m + text;
}

// The transport is the first base: constructed before the protocol that is handed it.
class MpiCoordinator final : private CoordinationTransport, public ChannelCoordinator, public FileTransport {
 public:
  explicit MpiCoordinator(MPI_Comm parent) : ChannelCoordinator(size_of(parent), rank_of(parent), *this) {
    int level = MPI_THREAD_SINGLE;
    check_mpi(MPI_Query_thread(&level), "MPI_Query_thread");
    if (level < MPI_THREAD_MULTIPLE)
      throw Error(Errc::comm_error, {}, "the MPI checkpoint coordinator needs MPI_Init_thread with MPI_THREAD_MULTIPLE",
                  std::to_string(MPI_THREAD_MULTIPLE), std::to_string(level));
    check_mpi(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    check_mpi(MPI_Comm_dup(parent, &bytes_comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(bytes_comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    int* ub = nullptr;
    int has = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &has);
    tag_ub_ = has && ub ? *ub : 32767;  // the least MPI promises
    progress_ = std::thread([this] { run(); });
    channel_ = std::thread([this] { serve(); });
  }

  ~MpiCoordinator() override {
    // Every process's file calls are answered until all of them are here.
    MPI_Request all_here = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(bytes_comm_, &all_here) == MPI_SUCCESS)
      for (int done = 0; !done;) {
        if (MPI_Test(&all_here, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    stop_serving();  // the protocol's serve() returns
    stop_ = true;    // a round a peer never joined ends
    channel_.join();
    progress_.join();
    MPI_Comm_free(&bytes_comm_);
    MPI_Comm_free(&comm_);
  }

  FileTransport* file_transport() override { return this; }

  // A call to `peer`'s file service: the request out on kFileRequestTag, the reply back on a
  // tag of this call's own.
  std::string call(int peer, std::string request) override {
    check_rank(peer, size_, "file service peer");
    if (peer == rank_) return service_.handle(rank_, request);
    const int reply_tag = kFileReplyBase + static_cast<int>(next_reply_.fetch_add(1) % static_cast<unsigned>(kReplyTags));
    std::string msg(4, '\0');
    std::memcpy(msg.data(), &reply_tag, 4);
    msg += request;
    check_count(msg.size(), "file request");
    check_mpi(MPI_Send(msg.data(), static_cast<int>(msg.size()), MPI_CHAR, peer, kFileRequestTag, comm_), "MPI_Send");
    return receive_message(comm_, peer, reply_tag);
  }

  std::vector<std::string> exchange(std::uint64_t step, const std::string& mine) override {
    const std::string msg = pack(step, mine);
    check_count(msg.size(), "exchange");
    std::vector<MPI_Request> sends;
    for (int q = 0; q < size_; ++q)
      if (q != rank_) {
        sends.emplace_back();
        check_mpi(MPI_Isend(msg.data(), static_cast<int>(msg.size()), MPI_CHAR, q, kExchangeTag, bytes_comm_, &sends.back()), "MPI_Isend");
      }
    std::vector<std::string> out(static_cast<std::size_t>(size_));
    out[static_cast<std::size_t>(rank_)] = mine;
    std::optional<Error> bad;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      std::string m = receive_message(bytes_comm_, q, kExchangeTag);
      std::uint64_t theirs = 0;
      if (m.size() >= 8) std::memcpy(&theirs, m.data(), 8);
      if (m.size() < 8 || theirs != step) {
        if (!bad)
          bad = Error(Errc::comm_error, {}, "exchange of step " + std::to_string(step) + " with rank " + std::to_string(q), "step " + std::to_string(step),
                      m.size() < 8 ? "a short message" : "step " + std::to_string(theirs));
        continue;
      }
      out[static_cast<std::size_t>(q)] = m.substr(8);
    }
    check_mpi(MPI_Waitall(static_cast<int>(sends.size()), sends.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    if (bad) throw *bad;
    return out;
  }

  void send_bytes(int to, std::uint32_t channel, std::span<const std::byte> bytes) override {
    check_rank(to, size_, "send_bytes rank");
    check_count(bytes.size(), "send_bytes");
    check_mpi(MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, to, bytes_tag(channel), bytes_comm_), "MPI_Send");
  }

  void receive_bytes(int from, std::uint32_t channel, std::span<std::byte> out) override {
    check_rank(from, size_, "receive_bytes rank");
    MPI_Message msg;
    MPI_Status st;
    const int tag = bytes_tag(channel);
    check_mpi(MPI_Mprobe(from, tag, bytes_comm_, &msg, &st), "MPI_Mprobe");
    int n = 0;
    MPI_Get_count(&st, MPI_BYTE, &n);
    if (static_cast<std::size_t>(n) != out.size()) {
      std::string sink(static_cast<std::size_t>(n), '\0');  // taken, so that the channel stays in step
      MPI_Mrecv(sink.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
      throw Error(Errc::comm_error, {}, "bytes from rank " + std::to_string(from) + " on channel " + std::to_string(channel),
                  std::to_string(out.size()) + " bytes", std::to_string(n) + " bytes");
    }
    check_mpi(MPI_Mrecv(out.data(), n, MPI_BYTE, &msg, MPI_STATUS_IGNORE), "MPI_Mrecv");
  }

 private:
  static int rank_of(MPI_Comm c) {
    int r = 0;
    check_mpi(MPI_Comm_rank(c, &r), "MPI_Comm_rank");
    return r;
  }
  static int size_of(MPI_Comm c) {
    int n = 1;
    check_mpi(MPI_Comm_size(c, &n), "MPI_Comm_size");
    return n;
  }

  // ---- the protocol's transport (the channel thread) ----

  // Waits for a non-blocking collective; Errc::comm_error once the coordinator is closing.
  void await(MPI_Request& req, const char* what) {
    for (int done = 0;;) {
      check_mpi(MPI_Test(&req, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (stop_) throw Error(Errc::comm_error, {}, std::string(what) + ": the MPI checkpoint coordinator was closed before every rank joined");
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  std::vector<std::string> gather(const std::string& mine) override {
    check_count(mine.size(), "vote");
    std::uint64_t n = mine.size();
    std::vector<std::uint64_t> sizes(rank_ == 0 ? static_cast<std::size_t>(size_) : 0);
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Igather(&n, 1, MPI_UINT64_T, sizes.data(), 1, MPI_UINT64_T, 0, comm_, &req), "MPI_Igather");
    await(req, "MPI_Igather");
    std::vector<int> counts, displs;
    std::string all;
    if (rank_ == 0) {
      std::uint64_t total = 0;
      for (const auto z : sizes) {
        check_count(z, "vote");
        counts.push_back(static_cast<int>(z));
        displs.push_back(static_cast<int>(total));
        total += z;
        check_count(total, "votes of every rank");
      }
      all.resize(total);
    }
    check_mpi(MPI_Igatherv(mine.data(), static_cast<int>(n), MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, 0, comm_, &req),
              "MPI_Igatherv");
    await(req, "MPI_Igatherv");
    std::vector<std::string> out;
    for (std::size_t q = 0; q < counts.size(); ++q) out.push_back(all.substr(static_cast<std::size_t>(displs[q]), static_cast<std::size_t>(counts[q])));
    return out;
  }

  std::string broadcast(const std::string& text) override {
    std::uint64_t n = text.size();
    MPI_Request req = MPI_REQUEST_NULL;
    check_mpi(MPI_Ibcast(&n, 1, MPI_UINT64_T, 0, comm_, &req), "MPI_Ibcast");
    await(req, "MPI_Ibcast");
    check_count(n, "broadcast");
    std::string out = rank_ == 0 ? text : std::string(n, '\0');
    check_mpi(MPI_Ibcast(out.data(), static_cast<int>(n), MPI_CHAR, 0, comm_, &req), "MPI_Ibcast");
    await(req, "MPI_Ibcast");
    return out;
  }

  static void check_count(std::size_t n, const char* what) {
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw Error(Errc::comm_error, {}, std::string(what) + ": one message", "at most 2^31-1 bytes", std::to_string(n) + " bytes");
  }

  int bytes_tag(std::uint32_t channel) const {
    if (channel > static_cast<std::uint32_t>(tag_ub_ - kBytesBase))
      throw Error(Errc::comm_error, {}, "byte channel beyond MPI_TAG_UB", "at most " + std::to_string(tag_ub_ - kBytesBase), std::to_string(channel));
    return kBytesBase + static_cast<int>(channel);
  }

  // The next message from `from` on `tag` of `comm`, whole (a matched probe: no other thread
  // can take it in between).
  static std::string receive_message(MPI_Comm comm, int from, int tag) {
    MPI_Message msg;
    MPI_Status st;
    check_mpi(MPI_Mprobe(from, tag, comm, &msg, &st), "MPI_Mprobe");
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string m(static_cast<std::size_t>(n), '\0');
    check_mpi(MPI_Mrecv(m.data(), n, MPI_CHAR, &msg, MPI_STATUS_IGNORE), "MPI_Mrecv");
    return m;
  }

  // A file call from another process, served here (on the progress thread).
  bool serve_file_call() {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    check_mpi(MPI_Improbe(MPI_ANY_SOURCE, kFileRequestTag, comm_, &flag, &msg, &st), "MPI_Improbe");
    if (!flag) return false;
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string m(static_cast<std::size_t>(n), '\0');
    check_mpi(MPI_Mrecv(m.data(), n, MPI_CHAR, &msg, MPI_STATUS_IGNORE), "MPI_Mrecv");
    if (m.size() < 4) throw Error(Errc::comm_error, {}, "short file request from rank " + std::to_string(st.MPI_SOURCE), ">= 4 bytes", std::to_string(n));
    int reply_tag = 0;
    std::memcpy(&reply_tag, m.data(), 4);
    if (reply_tag < kFileReplyBase || reply_tag >= kFileReplyBase + kReplyTags)
      throw Error(Errc::comm_error, {}, "file request from rank " + std::to_string(st.MPI_SOURCE) + ": reply tag", "a reply tag", std::to_string(reply_tag));
    const std::string reply = service_.handle(st.MPI_SOURCE, std::string_view(m).substr(4));
    check_count(reply.size(), "file reply");
    check_mpi(MPI_Send(reply.data(), static_cast<int>(reply.size()), MPI_CHAR, st.MPI_SOURCE, reply_tag, comm_), "MPI_Send");
    return true;
  }

  void run() {
    while (!stop_) {
      bool busy = false;
      try {
        busy = serve_file_call();
      } catch (const Error& e) {
        log_event(LogLevel::error, "coordinator_error", std::string("MPI checkpoint coordinator: ") + e.what());
      }
      if (!busy) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm bytes_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, tag_ub_ = 32767;
  FileService service_{posix_file_system()};
  std::atomic<unsigned> next_reply_{0};
  std::atomic<bool> stop_{false};
  std::thread progress_;  // serves file calls
  std::thread channel_;   // runs the protocol's rounds (serve)
};

}  // namespace

std::unique_ptr<CommitCoordinator> make_mpi_coordinator(MPI_Comm comm) { return std::make_unique<MpiCoordinator>(comm); }

}  // namespace ckpt::dist
