// SPDX-License-Identifier: Apache-2.0
// ckpt-bench: pieces shared by the benchmark's translation units.
//
//   main.cpp      options; runs, or re-renders a saved --json
//   runner.cpp    the interleaved run of every mode, references, loads, the soak (runner.hpp)
//   results.cpp   the results JSON: every figure, ratios, targets, the timeline
//   output.cpp    the human table and the markdown tables, from the JSON
//   plot.cpp      the SVG timeline and target bars, from the JSON
//   workload.cpp  the simulated training state (tensor mix) and the per-step compute kernel
//   refs.cpp      reference figures: raw O_DIRECT io_uring write/read, XXH3, SHA-256
//   procstat.cpp  RSS / peak RSS / CPU-time / page-fault probes from /proc and getrusage
//   report.cpp    statistics and JSON formatting
//   timed_fs.cpp  a FileSystem wrapper that timestamps the checkpointer's calls
#pragma once

#include <boost/json/object.hpp>
#include <chrono>
#include <initializer_list>
#include <map>
#include <string_view>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/core/aligned_buffer.hpp"
#include "ckpt/core/dtype.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/runtime/checkpointer.hpp"

namespace bench {

/// The --json file's "schema": "ckpt-bench/kJsonVersion" (docs/json-output.md): bumped when a
/// field is removed or changes meaning, never when one is added.
inline constexpr const char* kJsonName = "ckpt-bench";
inline constexpr int kJsonVersion = 1;

using Clock = std::chrono::steady_clock;

inline double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
inline double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
inline double gb_per_s(std::uint64_t bytes, double seconds) { return seconds > 0 ? static_cast<double>(bytes) / 1e9 / seconds : 0; }

// ---- options -------------------------------------------------------------------------

struct Options {
  std::string dir;                       // benchmark directory (default: a fresh one under $TMPDIR or /var/tmp)
  int ranks = 4;                         // rank threads
  std::uint64_t size = 1ull << 30;       // training state, all ranks together
  int repeats = 3;                       // rounds of the interleaved modes
  int saves = 3;                         // checkpoints per mode per repeat
  int every = 20;                        // a checkpoint every k steps
  double step_ms = 100;                  // compute per step (all ranks running), calibrated
  double compute_mb = 16;                // per-rank compute buffer (MiB) the kernel streams over
  std::vector<std::string> modes = {"none", "sync", "async_io_uring", "async_posix"};
  bool loads = true;                     // measure loads (verify none / fast / full)
  bool cold_pool = true;                 // show a first save whose staging pool is allocated in save()
  int soak_saves = 50;                   // back-to-back async saves for the memory-flatness check
  int load_settle_ms = 3000;             // idle before each load, so every load starts on memory the VM took back
  int queue_depth = 4;                   // ckpt writes in flight per shard
  std::uint64_t chunk_size = 4ull << 20; // ckpt chunk (hash and write unit)
  int raw_queue_depth = 8;               // raw reference loop
  std::uint64_t raw_piece = 4ull << 20;
  int load_queue_depth = ckpt::LoadOptions{}.queue_depth;  // load_into's reads in flight per file
  std::uint64_t load_io_size = ckpt::LoadOptions{}.io_size; // load_into's bytes per read
  int load_threads = 0;                  // load_into's threads (0: one per rank)
  std::string json_path, plot_path, markdown_path, layout_path;
  bool quick = false, keep = false;
};

// ---- workload --------------------------------------------------------------------------

struct TensorSpec {
  std::string name;
  ckpt::DType dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t bytes = 0;
  std::optional<ckpt::TensorSharding> sharding;  // what the tensor is of the job's global state
};

/// Per rank, the tensors of its state: a few large bf16/fp32 matrices (parameters and the fp32
/// master / Adam moments of a ZeRO-1 shard) and many small tensors (norms, biases), adding up
/// to `total / ranks` bytes per rank. Deterministic, so the peers script rebuilds it exactly.
/// Every tensor but the step and the RNG state (rank-local) is described as rank r's slice
/// of a global tensor (rows of the matrices, a range of the vectors), so the checkpoints
/// consolidate and reshard like a real job's.
std::vector<std::vector<TensorSpec>> make_layout(std::uint64_t total, int ranks);
boost::json::array layout_to_json(const std::vector<std::vector<TensorSpec>>& layout);

/// One rank's state in one pre-faulted allocation, filled with pseudo-random bytes.
class RankState {
 public:
  RankState(const std::vector<TensorSpec>& specs, std::uint64_t seed);
  const std::vector<ckpt::TensorView>& views() const { return views_; }
  std::uint64_t bytes() const { return bytes_; }
  const std::byte* data() const { return buf_.data(); }
  /// What a training step does to the state the checkpoint must not see afterwards.
  void mutate(std::uint64_t step);

 private:
  ckpt::AlignedBuffer buf_;
  std::uint64_t bytes_ = 0;
  std::vector<ckpt::TensorView> views_;
  std::vector<std::uint64_t> offsets_;
};

/// Memory-bound per-step work (y = 0.999 y + 0.001 x over compute_mb MiB), real work that
/// competes with staging copies, hashing and I/O for CPU and memory bandwidth.
class Compute {
 public:
  explicit Compute(double mb);
  double run(int passes);  // returns a value that depends on every element
 private:
  std::vector<float> x_, y_;
};

// ---- references ------------------------------------------------------------------------

struct RawDisk {
  std::uint64_t bytes = 0;
  double write_s = 0, read_s = 0;
  bool direct = true;          // O_DIRECT was accepted by the file system
  std::string engine;          // "io_uring" or "pread/pwrite"
};
/// Sequential write (preallocated file, then fsync) and read of `bytes` in `piece` pieces with
/// `qd` in flight, O_DIRECT, through an own io_uring loop; the file is removed afterwards.
RawDisk raw_disk(const std::string& dir, std::uint64_t bytes, std::uint64_t piece, int qd, std::byte* buf);

/// True if this kernel / sandbox lets the process set up an io_uring.
bool io_uring_works(std::string* why);

/// The same O_DIRECT read loop into a freshly allocated, never touched buffer of `bytes`: what a
/// load into new memory can reach on a VM where first touch is slow. The file is left as is.
double raw_read_fresh_gbps(const std::string& dir, std::uint64_t bytes, std::uint64_t piece, int qd, std::byte* buf);

/// The raw loop (one thread, `piece`-sized O_DIRECT reads, `qd` in flight) over existing files,
/// one after the other, each into its own warm destination spanning the file (dests[i] holds
/// paths[i]'s size rounded down to 4096): the raw read with load_into's destination instead of a
/// reused ring of pieces, to tell what the destination costs from what ckpt's read path does.
/// Through io_uring, or pread where it cannot be set up.
double raw_read_into_gbps(const std::vector<std::string>& paths, const std::vector<std::byte*>& dests, std::uint64_t piece, int qd);

/// Single-core hash throughput over a warm buffer (GB/s).
double xxh3_gbps(const std::byte* data, std::size_t n, double min_seconds);
double sha256_gbps(const std::byte* data, std::size_t n, double min_seconds);

// ---- process probes --------------------------------------------------------------------

std::uint64_t rss_bytes();       // VmRSS
std::uint64_t hwm_bytes();       // VmHWM
bool reset_hwm();                // clear_refs 5: VmHWM := VmRSS
double process_cpu_s();
/// CPU seconds of all cores since boot, from /proc/stat: busy (user, nice, system, irq,
/// softirq, steal; with process_cpu_s() this tells how much of the machine others used) and
/// idle (idle + iowait: cores nothing ran on). Both 0 if /proc/stat is unreadable.
struct MachineCpu {
  double busy = 0, idle = 0;
};
MachineCpu machine_cpu_s();
/// Bytes this process caused to be read from storage (read_bytes of /proc/self/io: page-cache
/// misses, including those of a mapped file's page faults); 0 if unavailable.
std::uint64_t process_read_bytes();
double thread_cpu_s();
std::uint64_t minor_faults();
/// Drops the page cache of a file (clean pages), so the next read comes from the disk.
void drop_file_cache(const std::string& path);

// ---- statistics and report ------------------------------------------------------------

struct Summary {
  std::size_t n = 0;
  double min = 0, median = 0, p99 = 0, max = 0, mean = 0;
};
Summary summarize(std::vector<double> v);
boost::json::object summary_json(const Summary& s);

/// One rank's save as the training thread saw it, with the library's phase durations.
struct RankSave {
  int rank = 0;
  std::uint64_t step = 0;
  Clock::time_point call, ret;  // around save() / save_sync() in the rank thread
  ckpt::SaveResult result;
  // From the timestamped file system, when available: the writes start when the shard's
  // preallocation returns; fsync runs from the first truncate/sync to the close.
  bool timed = false;
  Clock::time_point write0, sync0, close1;
};

/// One mode's run of `steps` steps with saves; times are absolute (steady clock).
struct Segment {
  std::string mode;
  int repeat = 0;
  Clock::time_point start;
  std::vector<Clock::time_point> step_end;  // barrier completions
  std::vector<std::vector<RankSave>> saves; // per checkpoint, per rank
  std::vector<std::map<std::string, double>> commit_ops;  // per checkpoint: ms per file-system call kind
  // Per checkpoint: when the directory fsync after `latest` was renamed returned, i.e. when the
  // checkpoint was durable and live (rotation and the handles' completion come after).
  std::vector<std::optional<Clock::time_point>> durable_at;
  // Per checkpoint: ms from its handles' completion to the start of the rotation it caused
  // (the first removal of an older checkpoint after its commit); positive = after.
  std::vector<std::optional<double>> rotation_after_complete_ms;
  // The machine's idle CPU seconds (MachineCpu::idle), sampled every few ms during the
  // segment: the cores idle over any window of it, by interpolation.
  std::vector<std::pair<Clock::time_point, double>> idle_samples;
  double writer_cpu_s = 0;                   // process CPU minus rank and main threads
  double rank_cpu_s = 0;
  std::uint64_t rss_start = 0, hwm = 0;
  bool hwm_valid = false;
};

/// The number at a path of keys ("modes", "sync", "stall_ms", "median"); NaN when a key is
/// missing or the value is null.
double json_at(const boost::json::object& o, std::initializer_list<std::string_view> path);

/// Pretty JSON with two-space indentation; doubles with up to 6 significant digits.
std::string pretty_json(const boost::json::value& v);

/// Everything below renders from the results JSON alone, so a saved --json file can be
/// rendered again (ckpt-bench --render FILE.json).
/// The human table printed on stdout.
std::string render_table(const boost::json::object& results);
/// The same figures as markdown tables (bench/RESULTS.md).
std::string render_markdown(const boost::json::object& results);
/// The SVG: sync and async timelines one above the other, then ratio bars with targets.
std::string render_svg(const boost::json::object& results);

}  // namespace bench
