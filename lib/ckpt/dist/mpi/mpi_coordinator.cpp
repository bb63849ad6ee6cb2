// The checkpoint commit across MPI processes (make_mpi_coordinator in mpi_comm.hpp).
//
// Channel: a duplicate of the program's communicator, used for nothing else, so its messages
// can never match the training loop's collectives. Messages are point to point: reports go
// to rank 0 (tag kReportTag), outcomes from rank 0 to every rank (tag kOutcomeTag); each
// carries the step in its first 8 bytes and the text after it. One progress thread per
// process polls for them (MPI_Iprobe), so report() only posts a send and returns.
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
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unistd.h>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/dist/mpi/mpi_comm.hpp"
#include "ckpt/fs/remote_file_system.hpp"
#include "ckpt/runtime/local_outcomes.hpp"
#include "ckpt/runtime/wire.hpp"

namespace ckpt::dist {

namespace {

constexpr int kReportTag = 1;
constexpr int kOutcomeTag = 2;
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

class MpiCoordinator final : public CommitCoordinator, public FileTransport {
 public:
  explicit MpiCoordinator(MPI_Comm parent) {
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
  }

  ~MpiCoordinator() override {
    // Every process's file calls are answered until all of them are here.
    MPI_Request all_here = MPI_REQUEST_NULL;
    if (MPI_Ibarrier(bytes_comm_, &all_here) == MPI_SUCCESS)
      for (int done = 0; !done;) {
        if (MPI_Test(&all_here, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    stop_ = true;
    progress_.join();
    // An outcome still in flight goes to a rank that is waiting for it (its Checkpointer
    // does not finish before the outcome arrives), so these waits end.
    std::lock_guard lk(mu_);
    for (auto& p : pending_) MPI_Wait(&p.req, MPI_STATUS_IGNORE);
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

  int world_size() const noexcept override { return size_; }
  std::vector<int> local_ranks() const override { return {rank_}; }

  std::string start_run(const std::function<void()>& prepare) override {
    // Rank 0 cleans the root up before anyone can start writing into it, then names the run.
    std::string run_id, failure;
    if (rank_ == 0) {
      try {
        prepare();
        std::random_device rd;
        char buf[32];
        std::snprintf(buf, sizeof buf, "mpi%x%08x", static_cast<unsigned>(::getpid()), rd());
        run_id = buf;
      } catch (const Error& e) {
        failure = error_to_json(e);
      }
    }
    std::string msg = failure.empty() ? "+" + run_id : "-" + failure;
    std::uint64_t len = msg.size();
    check_mpi(MPI_Bcast(&len, 1, MPI_UINT64_T, 0, comm_), "MPI_Bcast");
    msg.resize(len);
    check_mpi(MPI_Bcast(msg.data(), static_cast<int>(len), MPI_CHAR, 0, comm_), "MPI_Bcast");
    if (msg[0] == '-') throw error_from_json(msg.substr(1));
    return msg.substr(1);
  }

  void report(std::uint64_t step, RankReport report, CommitFn commit, OutcomeFn on_outcome) override {
    const int rank = report.rank;
    if (rank != rank_)
      throw Error(Errc::invalid_argument, {}, "report rank: this process hosts only its own MPI rank", std::to_string(rank_),
                  std::to_string(rank));
    std::unique_lock lk(mu_);
    if (auto abandoned = outcomes_.add(step, rank, on_outcome)) {
      lk.unlock();
      on_outcome(*abandoned);
      return;
    }
    if (rank_ != 0) {
      send(0, kReportTag, pack(step, detail::encode_rank_report(step, report)));
      return;
    }
    Step& s = steps_[step];
    s.commit = std::move(commit);
    lk.unlock();
    collect(step, 0, std::move(report));
  }

  void abandon(std::uint64_t step, const CommitOutcome& outcome) override {
    std::unique_lock lk(mu_);
    OutcomeFn fn = outcomes_.abandon(step, outcome);
    steps_.erase(step);
    lk.unlock();
    if (fn) fn(outcome);
  }

  std::vector<int> reported(std::uint64_t step) const override {
    std::lock_guard lk(mu_);
    std::vector<int> out;
    if (rank_ == 0) {
      if (auto it = steps_.find(step); it != steps_.end())
        for (const auto& [r, report] : it->second.reports) out.push_back(r);
    } else if (outcomes_.pending.contains(step)) {
      out.push_back(rank_);
    }
    return out;
  }

 private:
  struct Step {
    std::map<int, RankReport> reports;
    CommitFn commit;  // set by rank 0's own report
  };
  struct Pending {
    std::string data;
    MPI_Request req;
  };

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

  // Posts a send that completes in the background (tested by the progress thread). Caller
  // holds mu_.
  void send(int to, int tag, std::string data) {
    pending_.push_back({std::move(data), MPI_REQUEST_NULL});
    Pending& p = pending_.back();
    check_mpi(MPI_Isend(p.data.data(), static_cast<int>(p.data.size()), MPI_CHAR, to, tag, comm_, &p.req), "MPI_Isend");
  }

  // Rank 0: records a report; the one that completes the step commits and answers everyone.
  void collect(std::uint64_t step, int from, RankReport report) {
    std::unique_lock lk(mu_);
    if (auto it = outcomes_.abandoned.find(step); it != outcomes_.abandoned.end()) {
      if (from != 0) send(from, kOutcomeTag, pack(step, detail::encode_outcome(it->second)));
      return;
    }
    Step& s = steps_[step];
    report.rank = from;  // the sender is the rank, whatever the message says
    s.reports[from] = std::move(report);
    if (static_cast<int>(s.reports.size()) < size_ || !s.commit) return;
    Step done = std::move(s);
    steps_.erase(step);
    lk.unlock();
    std::vector<RankReport> reports;
    for (auto& [r, rep] : done.reports) reports.push_back(std::move(rep));
    const CommitOutcome outcome = done.commit(reports);
    const std::string wire = detail::encode_outcome(outcome);
    lk.lock();
    for (int q = 1; q < size_; ++q) send(q, kOutcomeTag, pack(step, wire));
    lk.unlock();
    deliver(step, outcome);
  }

  void deliver(std::uint64_t step, const CommitOutcome& outcome) {
    OutcomeFn fn;
    {
      std::lock_guard lk(mu_);
      fn = outcomes_.take(step);
    }
    if (fn) fn(outcome);
  }

  void run() {
    while (!stop_) {
      bool busy = false;
      try {
        busy = poll();
      } catch (const Error& e) {
        log_line(std::string("MPI checkpoint coordinator: ") + e.what());
      }
      if (!busy) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  bool poll() {
    const bool served = serve_file_call();
    {
      std::lock_guard lk(mu_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        int done = 0;
        check_mpi(MPI_Test(&it->req, &done, MPI_STATUS_IGNORE), "MPI_Test");
        it = done ? pending_.erase(it) : std::next(it);
      }
    }
    int flag = 0;
    MPI_Status st;
    const int tag = rank_ == 0 ? kReportTag : kOutcomeTag;
    check_mpi(MPI_Iprobe(rank_ == 0 ? MPI_ANY_SOURCE : 0, tag, comm_, &flag, &st), "MPI_Iprobe");
    if (!flag) return served;
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string m(static_cast<std::size_t>(n), '\0');
    check_mpi(MPI_Recv(m.data(), n, MPI_CHAR, st.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
    if (m.size() < 8) throw Error(Errc::comm_error, {}, "short checkpoint coordination message", ">= 8 bytes", std::to_string(n));
    std::uint64_t step = 0;
    std::memcpy(&step, m.data(), 8);
    // A message that does not decode is answered as the rank's failure (or a failed outcome),
    // so the step still ends on every rank.
    if (rank_ == 0) {
      RankReport r;
      try {
        r = detail::decode_rank_report(std::string_view(m).substr(8));
      } catch (const Error& e) {
        r.error = e;
      }
      collect(step, st.MPI_SOURCE, std::move(r));
    } else {
      CommitOutcome o;
      try {
        o = detail::decode_outcome(std::string_view(m).substr(8));
      } catch (const Error& e) {
        o.error = e;
      }
      deliver(step, o);
    }
    return true;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm bytes_comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, tag_ub_ = 32767;
  FileService service_{posix_file_system()};
  std::atomic<unsigned> next_reply_{0};
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::map<std::uint64_t, Step> steps_;              // rank 0: reports so far
  detail::LocalOutcomes outcomes_;                   // this rank's reported, undelivered and abandoned steps
  std::list<Pending> pending_;
  std::thread progress_;
};

}  // namespace

std::unique_ptr<CommitCoordinator> make_mpi_coordinator(MPI_Comm comm) { return std::make_unique<MpiCoordinator>(comm); }

}  // namespace ckpt::dist
