// SPDX-License-Identifier: Apache-2.0
// The benchmark run: states, references, the interleaved segments of every mode, loads, the
// memory soak (runner.cpp), and the results JSON they add up to (results.cpp).
#pragma once

#include <boost/json/object.hpp>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"
#include "ckpt/read/reader.hpp"
#include "timed_fs.hpp"

namespace bench {

inline const std::vector<std::string> kAllModes = {"none", "sync", "async_io_uring", "async_posix"};

/// Runs fn(r) on `n` threads, joins them, rethrows the first error.
template <typename Fn>
void on_ranks(int n, Fn&& fn) {
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> errs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errs[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

class Runner {
 public:
  explicit Runner(Options o) : o_(std::move(o)) {}
  /// Runs everything and returns the results (the --json document).
  boost::json::object run();

 private:
  struct ModeData {
    std::unique_ptr<TimedFileSystem> fs;  // outlives ck
    std::unique_ptr<ckpt::Checkpointer> ck;
    std::string root;
    std::uint64_t resident_staging = 0;  // RSS the checkpointer added when constructed
    std::uint64_t next_step = 0;
  };

  std::unique_ptr<ckpt::Checkpointer> make_checkpointer(const std::string& mode, const std::string& root, bool prealloc,
                                                        ckpt::FileSystem* fs = nullptr);
  void attach_fs_events(Segment& seg, std::vector<FsEvent> events) const;
  ckpt::SaveInfo save_info(int r) const;
  void references(int rep);
  void cold_pool();
  Segment segment(const std::string& mode, int rep);
  void load(const std::string& root, ckpt::Verify v, bool into);  // into: load_into warm memory
  void raw_into(const std::string& root);  // the raw read loop into load_into's destinations
  void deferred(bool cpu_compute);     // saves with Staging::deferred, forward + backward before the fence
  void mapped_one(const std::string& root);  // MappedShard: one small tensor
  void mapped_all(const std::string& root);  // MappedShard: every tensor of every rank
  boost::json::object hashing_bound(const boost::json::object& modes) const;
  void soak(ModeData& md);
  boost::json::object results() const;
  boost::json::object mode_results(const std::string& mode) const;

  Options o_;
  std::string dir_;
  std::vector<std::vector<TensorSpec>> layout_;
  std::vector<std::unique_ptr<RankState>> states_;
  std::vector<std::unique_ptr<Compute>> compute_;
  std::vector<ckpt::AlignedBuffer> copy_dst_;  // warm destinations of the memcpy references
  ckpt::AlignedBuffer io_buf_;                 // the raw loop's buffers
  int passes_ = 0;
  double calib_pass_ms_ = 0;
  std::uint64_t rank_bytes_ = 0, state_bytes_ = 0, staging_per_rank_ = 0;
  std::map<std::string, ModeData> modes_;
  std::vector<Segment> segments_;
  double wall_s_ = 0;
  double others_cpu_s_ = 0, ours_cpu_s_ = 0;  // over the whole run: CPU of other processes, and ours
  std::string loadavg_start_, loadavg_end_;
  bool io_uring_ = true;
  int isolation_checks_ = 0, isolation_failures_ = 0;
  std::string io_uring_why_;
  std::string load_engine_;  // what load_into used (engine, O_DIRECT, fallback)

  // References: one entry per repeat, except the CPU-only ones.
  std::vector<double> raw_write_gbps_, raw_read_gbps_, memcpy_alone_ms_, memcpy_all_ms_;
  RawDisk raw_last_;
  double memcpy_cold_gbps_ = 0, xxh3_gbps_ = 0, sha256_gbps_ = 0, raw_read_fresh_gbps_ = 0;
  boost::json::object cold_pool_, soak_;
  std::map<std::string, std::vector<double>> load_gbps_, load_faults_per_gib_;
  // Deferred staging, per rank and save: time blocked in save() and in wait_staged(), their
  // sum, the compute that ran between them, and the copy's own duration.
  // Two models of forward + backward between save() and the fence: "accelerator" (the rank
  // waits the step's time with the host's cores free, as while a GPU computes) and "cpu" (the
  // benchmark's CPU kernel, which competes with the copy for the cores).
  struct DeferredData {
    std::vector<double> save_ms, fence_ms, stall_ms, compute_ms, stage_ms;
  };
  std::string deferred_mode_;
  std::map<std::string, DeferredData> deferred_;
  // MappedShard: one small tensor of rank 0 (per round) and every tensor of every rank.
  std::vector<double> mapped_one_ms_;
  boost::json::object mapped_one_;  // the last round's counters
};

}  // namespace bench
