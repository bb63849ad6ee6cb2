// The checkpoint commit across MPI processes (make_mpi_coordinator in mpi_comm.hpp).
//
// Channel: a duplicate of the program's communicator, used for nothing else, so its messages
// can never match the training loop's collectives. Messages are point to point: reports go
// to rank 0 (tag kReportTag), outcomes from rank 0 to every rank (tag kOutcomeTag); each
// carries the step in its first 8 bytes and the text after it. One progress thread per
// process polls for them (MPI_Iprobe), so report() only posts a send and returns.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unistd.h>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/dist/mpi/mpi_comm.hpp"
#include "ckpt/runtime/detail/local_outcomes.hpp"
#include "ckpt/runtime/detail/wire.hpp"

namespace ckpt::dist {

namespace {

constexpr int kReportTag = 1;
constexpr int kOutcomeTag = 2;

std::string pack(std::uint64_t step, const std::string& text) {
  std::string m(8, '\0');
  std::memcpy(m.data(), &step, 8);
  return m + text;
}

class MpiCoordinator final : public CommitCoordinator {
 public:
  explicit MpiCoordinator(MPI_Comm parent) {
    int level = MPI_THREAD_SINGLE;
    check_mpi(MPI_Query_thread(&level), "MPI_Query_thread");
    if (level < MPI_THREAD_MULTIPLE)
      throw Error(Errc::comm_error, {}, "the MPI checkpoint coordinator needs MPI_Init_thread with MPI_THREAD_MULTIPLE",
                  std::to_string(MPI_THREAD_MULTIPLE), std::to_string(level));
    check_mpi(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    progress_ = std::thread([this] { run(); });
  }

  ~MpiCoordinator() override {
    stop_ = true;
    progress_.join();
    // An outcome still in flight goes to a rank that is waiting for it (its Checkpointer
    // does not finish before the outcome arrives), so these waits end.
    std::lock_guard lk(mu_);
    for (auto& p : pending_) MPI_Wait(&p.req, MPI_STATUS_IGNORE);
    MPI_Comm_free(&comm_);
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
    if (!flag) return false;
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
  int rank_ = 0, size_ = 1;
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
