// SPDX-License-Identifier: Apache-2.0
// The benchmark run. Every mode runs in segments of (saves + 1) * every steps on rank threads
// that meet at a barrier after each step (the gradient exchange); a save is due after the
// compute of every k-th step. Modes are interleaved, each round starting with another one.
#include "runner.hpp"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include "ckpt/store/store.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/read/mapped.hpp"
#include "ckpt/read/reader.hpp"

namespace bench {

namespace fs = std::filesystem;
namespace json = boost::json;

namespace {
std::atomic<double> g_sink{0};  // keeps the compute from being optimized away

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}
}  // namespace

std::unique_ptr<ckpt::Checkpointer> Runner::make_checkpointer(const std::string& mode, const std::string& root, bool prealloc,
                                                              ckpt::FileSystem* fs) {
  ckpt::CheckpointerOptions co;
  co.root = root;
  co.world_size = o_.ranks;
  co.keep_last = 2;
  co.backend = mode == "async_posix" ? ckpt::WriterBackend::posix
               : mode == "sync"      ? ckpt::WriterBackend::automatic
                                     : ckpt::WriterBackend::io_uring;
  co.queue_depth = o_.queue_depth;
  co.chunk_size = o_.chunk_size;
  co.staging_bytes_per_rank = prealloc ? staging_per_rank_ : 0;
  co.fs = fs;
  return std::make_unique<ckpt::Checkpointer>(co);
}

ckpt::SaveInfo Runner::save_info(int r) const {
  ckpt::SaveInfo info;
  const std::uint64_t n = rank_bytes_ / 14;  // parameters of a ZeRO-1 shard (14 bytes each)
  info.param_shard_offset = static_cast<std::uint64_t>(r) * n;
  info.param_shard_numel = n;
  info.param_numel = n * static_cast<std::uint64_t>(o_.ranks);
  return info;
}

void Runner::references(int rep) {
  // Raw disk: the same byte count as one checkpoint, in the benchmark's directory.
  const RawDisk d = raw_disk(dir_, state_bytes_, o_.raw_piece, o_.raw_queue_depth, io_buf_.data());
  raw_last_ = d;
  if (rep == 0 && o_.load_settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.load_settle_ms));
  if (rep == 0) raw_read_fresh_gbps_ = raw_read_fresh_gbps(dir_, state_bytes_, o_.raw_piece, o_.raw_queue_depth, io_buf_.data());
  raw_write_gbps_.push_back(gb_per_s(d.bytes, d.write_s));
  raw_read_gbps_.push_back(gb_per_s(d.bytes, d.read_s));
  // memcpy of one rank's state into a warm buffer, alone and with every rank copying at once
  // (as they do when a step's save starts on every rank together).
  auto t0 = Clock::now();
  std::memcpy(copy_dst_[0].data(), states_[0]->data(), static_cast<std::size_t>(states_[0]->bytes()));
  memcpy_alone_ms_.push_back(ms(Clock::now() - t0));
  std::vector<Clock::time_point> end(static_cast<std::size_t>(o_.ranks));
  Clock::time_point start;
  std::barrier go(o_.ranks, [&start]() noexcept { start = Clock::now(); });
  on_ranks(o_.ranks, [&](int r) {
    go.arrive_and_wait();
    std::memcpy(copy_dst_[static_cast<std::size_t>(r)].data(), states_[static_cast<std::size_t>(r)]->data(),
                static_cast<std::size_t>(states_[static_cast<std::size_t>(r)]->bytes()));
    end[static_cast<std::size_t>(r)] = Clock::now();
  });
  memcpy_all_ms_.push_back(ms(*std::max_element(end.begin(), end.end()) - start));
  std::fprintf(stderr, "ckpt-bench: repeat %d: raw write %.2f GB/s, raw read %.2f GB/s, memcpy %.1f ms (all ranks %.1f ms)\n", rep,
               raw_write_gbps_.back(), raw_read_gbps_.back(), memcpy_alone_ms_.back(), memcpy_all_ms_.back());
}

// A checkpointer whose staging pool is not allocated up front: its first save allocates and
// touches the pool inside save(), which on this VM costs far more than the copy itself.
void Runner::cold_pool() {
  const std::string root = dir_ + "/cold_pool";
  fs::remove_all(root);
  auto ck = make_checkpointer("async_io_uring", root, false);
  std::vector<std::vector<double>> stall(2), stage(2);
  for (int k = 0; k < 2; ++k) {
    std::vector<double> s(static_cast<std::size_t>(o_.ranks)), g(static_cast<std::size_t>(o_.ranks));
    std::barrier sync_start(o_.ranks);
    on_ranks(o_.ranks, [&](int r) {
      sync_start.arrive_and_wait();
      const auto t0 = Clock::now();
      auto h = ck->save(r, static_cast<std::uint64_t>(k + 1), states_[static_cast<std::size_t>(r)]->views(), save_info(r));
      s[static_cast<std::size_t>(r)] = ms(Clock::now() - t0);
      g[static_cast<std::size_t>(r)] = ms(h.wait().stage);
    });
    stall[static_cast<std::size_t>(k)] = s;
    stage[static_cast<std::size_t>(k)] = g;
  }
  const auto st = ck->stats();
  ck.reset();
  fs::remove_all(root);
  const double first = summarize(stall[0]).median, second = summarize(stall[1]).median;
  cold_pool_ = {{"first_stall_ms", first},
                {"first_stage_ms", summarize(stage[0]).median},
                {"second_stall_ms", second},
                {"second_stage_ms", summarize(stage[1]).median},
                {"first_over_second", second > 0 ? first / second : 0.0},
                {"staging_allocations", st.staging_allocations},
                {"note", "staging pool allocated (and pre-faulted) inside the first save()"}};
  std::fprintf(stderr, "ckpt-bench: cold pool: first save stall %.1f ms, second %.1f ms\n", first, second);
}

Segment Runner::segment(const std::string& mode, int rep) {
  Segment seg;
  seg.mode = mode;
  seg.repeat = rep;
  ModeData* md = mode == "none" ? nullptr : &modes_.at(mode);
  ckpt::Checkpointer* ck = md ? md->ck.get() : nullptr;
  const int steps = (o_.saves + 1) * o_.every;
  const std::uint64_t base = md ? md->next_step : 0;
  if (md) md->next_step += static_cast<std::uint64_t>(steps);
  seg.step_end.reserve(static_cast<std::size_t>(steps + 1));
  std::barrier step_barrier(o_.ranks, [&seg]() noexcept { seg.step_end.push_back(Clock::now()); });
  std::vector<std::vector<RankSave>> saves(static_cast<std::size_t>(o_.ranks));
  std::vector<std::vector<ckpt::SaveHandle>> handles(static_cast<std::size_t>(o_.ranks));
  std::vector<double> rank_cpu(static_cast<std::size_t>(o_.ranks));

  if (md) md->fs->take();
  seg.hwm_valid = reset_hwm();
  seg.rss_start = rss_bytes();
  const double cpu0 = process_cpu_s(), main0 = thread_cpu_s();
  // The machine's idle CPU every 5 ms, until every save of the segment is durable: the cores
  // idle during each save (the hashing bound of an async save).
  std::optional<std::jthread> sampler;
  sampler.emplace([&seg](std::stop_token stop) {
    while (!stop.stop_requested()) {
      seg.idle_samples.emplace_back(Clock::now(), machine_cpu_s().idle);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    seg.idle_samples.emplace_back(Clock::now(), machine_cpu_s().idle);
  });
  on_ranks(o_.ranks, [&](int r) {
    const auto ri = static_cast<std::size_t>(r);
    const double c0 = thread_cpu_s();
    double local = 0;
    step_barrier.arrive_and_wait();  // start line: the first completion is the segment start
    for (int s = 1; s <= steps; ++s) {
      const std::uint64_t step = base + static_cast<std::uint64_t>(s);
      states_[ri]->mutate(step);
      local += compute_[ri]->run(passes_);
      if (ck && s % o_.every == 0 && s / o_.every <= o_.saves) {
        RankSave rs;
        rs.rank = r;
        rs.step = step;
        rs.call = Clock::now();
        if (mode == "sync") {
          rs.result = ck->save_sync(r, step, states_[ri]->views(), save_info(r));
          rs.ret = Clock::now();
        } else {
          handles[ri].push_back(ck->save(r, step, states_[ri]->views(), save_info(r)));
          rs.ret = Clock::now();
        }
        saves[ri].push_back(std::move(rs));
      }
      step_barrier.arrive_and_wait();  // the step's gradient exchange
    }
    for (std::size_t k = 0; k < handles[ri].size(); ++k) saves[ri][k].result = handles[ri][k].wait();
    rank_cpu[ri] = thread_cpu_s() - c0;
    g_sink.store(local, std::memory_order_relaxed);
  });
  if (ck) ck->wait_all();
  sampler.reset();  // stops and joins it
  const double cpu1 = process_cpu_s(), main1 = thread_cpu_s();
  seg.hwm = hwm_bytes();
  seg.start = seg.step_end.front();
  seg.step_end.erase(seg.step_end.begin());
  for (double c : rank_cpu) seg.rank_cpu_s += c;
  seg.writer_cpu_s = std::max(0.0, (cpu1 - cpu0) - seg.rank_cpu_s - (main1 - main0));
  if (ck)
    for (int k = 0; k < o_.saves; ++k) {
      std::vector<RankSave> one;
      for (int r = 0; r < o_.ranks; ++r) one.push_back(saves[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)]);
      seg.saves.push_back(std::move(one));
    }
  if (md) attach_fs_events(seg, md->fs->take());
  std::fprintf(stderr, "ckpt-bench: repeat %d: %-15s %.1f ms/step\n", rep, mode.c_str(),
               ms(seg.step_end.back() - seg.start) / static_cast<double>(steps));
  return seg;
}

void Runner::attach_fs_events(Segment& seg, std::vector<FsEvent> events) const {
  for (auto& one : seg.saves) {
    std::string marker = "/.tmp-";
    marker += ckpt::checkpoint_dir_name(one.front().step);
    marker += "-";
    Clock::time_point commit_start = Clock::time_point::max(), end = Clock::time_point::min();
    for (auto& rs : one) {
      std::string shard = "/";  // (built in two steps: GCC 12 warns falsely on "/" + temporary)
      shard += ckpt::shard_file_name(rs.rank, o_.ranks);
      bool alloc = false, sync = false, close = false;
      // The shard's last fsync (with the truncate of its padding just before it): the syncs
      // behind the writes of a large shard are part of its writing.
      std::optional<Clock::time_point> last_sync, truncated;
      for (const auto& e : events) {
        if (e.path.find(marker) == std::string::npos || !e.path.ends_with(shard)) continue;
        if (e.op == "allocate") {
          rs.write0 = e.t1;
          alloc = true;
        } else if (e.op == "truncate" || e.op == "sync") {
          auto& at = e.op == "sync" ? last_sync : truncated;
          if (!at || e.t0 > *at) at = e.t0;
          rs.sync0 = truncated && last_sync ? std::min(*truncated, *last_sync) : last_sync ? *last_sync : *truncated;
          sync = true;
        } else if (e.op == "close") {
          rs.close1 = e.t1;
          close = true;
        }
      }
      rs.timed = alloc && sync && close;
      const auto done = rs.call + rs.result.total;
      end = std::max(end, done);
      commit_start = std::min(commit_start, done - rs.result.commit);
    }
    // Every call in the commit window that is not a shard's belongs to the commit (at most
    // one checkpoint is in flight).
    std::map<std::string, double> ops;
    double accounted = 0;
    for (const auto& e : events) {
      if (e.t0 < commit_start || e.t1 > end || e.path.ends_with(".safetensors")) continue;
      ops[e.op] += ms(e.t1 - e.t0);
      accounted += ms(e.t1 - e.t0);
    }
    ops["other (encode, decode, coordination)"] = std::max(0.0, ms(end - commit_start) - accounted);
    seg.commit_ops.push_back(std::move(ops));
    std::optional<Clock::time_point> renamed, durable;
    for (const auto& e : events)
      if (e.op == "rename" && e.t0 >= commit_start && e.t1 <= end && e.path.find("/.latest.tmp") != std::string::npos) renamed = e.t1;
    if (renamed)
      for (const auto& e : events)
        if (e.op == "sync_dir" && e.t0 >= *renamed && e.t1 <= end && (!durable || e.t1 < *durable)) durable = e.t1;
    seg.durable_at.push_back(durable);
    // The rotation this commit caused: the first removal (of a checkpoint renamed to a
    // temporary, not this checkpoint's own) after the commit started.
    std::optional<double> rotation;
    for (const auto& e : events)
      if (e.op == "remove_all" && e.t0 >= commit_start && e.path.find("/.tmp-step-") != std::string::npos &&
          e.path.find(marker) == std::string::npos && (!rotation || ms(e.t0 - end) < *rotation))
        rotation = ms(e.t0 - end);
    seg.rotation_after_complete_ms.push_back(rotation);
  }
}

// The raw reference with load_into's destinations: each rank's shard file read whole, O_DIRECT,
// into its warm copy_dst_ (one thread, the raw loop's pieces and queue depth).
void Runner::raw_into(const std::string& root) {
  const auto opened = ckpt::open_latest(ckpt::posix_file_system(), root, {.expected_world_size = o_.ranks});
  std::vector<std::string> paths;
  std::vector<std::byte*> dests;
  std::uint64_t bytes = 0;
  for (int r = 0; r < o_.ranks; ++r) {
    const auto ri = static_cast<std::size_t>(r);
    std::uint64_t at = 0;  // a rank's files back to back in its destination, each 4096-aligned
    for (const ckpt::ShardRecord& f : opened.reader.manifest().files_of(r)) {
      if (at + f.size > copy_dst_[ri].capacity()) throw std::runtime_error("load destination too small for the shard's files");
      paths.push_back(opened.reader.file_path(f));
      dests.push_back(copy_dst_[ri].data() + at);
      bytes += f.size;
      at += (f.size + 4095) / 4096 * 4096;
    }
  }
  if (o_.load_settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.load_settle_ms));
  const std::uint64_t f0 = minor_faults();
  load_gbps_["raw_into"].push_back(raw_read_into_gbps(paths, dests, o_.raw_piece, o_.raw_queue_depth));
  load_faults_per_gib_["raw_into"].push_back(static_cast<double>(minor_faults() - f0) / (static_cast<double>(bytes) / (1ull << 30)));
  std::fprintf(stderr, "ckpt-bench: raw O_DIRECT read into load_into's destinations %.2f GB/s\n", load_gbps_["raw_into"].back());
}

void Runner::load(const std::string& root, ckpt::Verify v, bool into) {
  auto& pfs = ckpt::posix_file_system();
  {
    const auto opened = ckpt::open_latest(pfs, root, {.expected_world_size = o_.ranks});
    for (const auto& f : opened.reader.manifest().shards) drop_file_cache(opened.reader.file_path(f));
  }
  std::vector<std::optional<ckpt::LoadedShard>> shards(static_cast<std::size_t>(o_.ranks));
  if (o_.load_settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.load_settle_ms));
  const std::uint64_t f0 = minor_faults();
  const auto t0 = Clock::now();
  const auto opened = ckpt::open_latest(pfs, root, {.expected_world_size = o_.ranks});
  const ckpt::Manifest& m = opened.reader.manifest();
  std::uint64_t bytes = 0;
  // The tensors' addresses in the step's int64 optimizer.step of each rank, for the check below.
  std::vector<const std::byte*> step_of(static_cast<std::size_t>(o_.ranks));
  if (into) {
    // Into the warm memory the memcpy reference writes, every rank's shard in one call (a file
    // per thread), tensors laid out as in the file and at the same address modulo 4096, so
    // whole reads inside a tensor land without a bounce buffer.
    std::vector<std::vector<ckpt::LoadTarget>> targets(static_cast<std::size_t>(o_.ranks));
    std::vector<ckpt::RankLoad> loads;
    for (int r = 0; r < o_.ranks; ++r) {
      const auto ri = static_cast<std::size_t>(r);
      std::uint64_t at = 0;  // each file's tensors as in the file, the files back to back
      for (const ckpt::ShardRecord& f : m.files_of(r)) {
        std::uint64_t lo = ~0ull, hi = 0;
        for (const auto& t : m.tensors)
          if (t.rank == r && t.part == f.part) lo = std::min(lo, t.begin), hi = std::max(hi, t.end);
        if (hi < lo) continue;  // a file of no tensors
        std::byte* base = copy_dst_[ri].data() + at + lo % 4096;
        if (at + hi - lo + 4096 > copy_dst_[ri].capacity()) throw std::runtime_error("load destination too small for the shard's tensors");
        for (const auto& t : m.tensors)
          if (t.rank == r && t.part == f.part) {
            targets[ri].push_back({t.name, std::span(base + (t.begin - lo), t.end - t.begin), t.dtype, t.shape, 0, std::nullopt});
            if (t.name == "optimizer.step") step_of[ri] = base + (t.begin - lo);
          }
        at += (lo % 4096 + hi - lo + 4095) / 4096 * 4096;
      }
      for (const ckpt::ShardRecord& f : m.files_of(r)) bytes += f.size;  // as load_shard's figure: the files' bytes
      loads.push_back({r, targets[ri]});
    }
    const ckpt::LoadReport rep = ckpt::load_into(opened.reader, loads, v,
                                                     {.queue_depth = o_.load_queue_depth, .io_size = o_.load_io_size, .threads = o_.load_threads > 0 ? o_.load_threads : o_.ranks});
    load_engine_ = rep.engine + (rep.direct ? ", O_DIRECT" : ", buffered") + (rep.fallback.empty() ? "" : " (" + rep.fallback + ")");
  } else {
    on_ranks(o_.ranks, [&](int r) { shards[static_cast<std::size_t>(r)].emplace(opened.reader.load_shard(r, v)); });
    for (const auto& sh : shards) bytes += sh->file_bytes().size();
    for (int r = 0; r < o_.ranks; ++r) step_of[static_cast<std::size_t>(r)] = shards[static_cast<std::size_t>(r)]->tensor("optimizer.step").data.data();
  }
  const double s = secs(Clock::now() - t0);
  const std::uint64_t faults = minor_faults() - f0;
  // Snapshot isolation: every rank wrote its step number into optimizer.step just before the
  // save and the next step's number right after save() returned, while the writer still ran.
  for (const std::byte* p : step_of) {
    std::int64_t saved = -1;
    std::memcpy(&saved, p, sizeof saved);
    const bool ok = saved == static_cast<std::int64_t>(m.step);
    isolation_checks_++;
    if (!ok) isolation_failures_++;
  }
  const std::string name = std::string(into ? "into_" : "") + (v == ckpt::Verify::none ? "none" : v == ckpt::Verify::fast ? "fast" : "full");
  load_gbps_[name].push_back(gb_per_s(bytes, s));
  // Minor faults per GiB loaded: 262144 means every 4 KiB page of the destination was touched
  // for the first time during the load.
  std::fprintf(stderr, "ckpt-bench: load, verify %-9s %.2f GB/s\n", name.c_str(), load_gbps_[name].back());
  load_faults_per_gib_[name].push_back(static_cast<double>(faults) / (static_cast<double>(bytes) / (1ull << 30)));
}

// Deferred staging as a trainer uses it: save(..., Staging::deferred) returns before the copy,
// the rank runs its step's forward and backward while ckpt's threads copy, then calls
// wait_staged() right before its optimizer step, the first thing to modify the saved tensors.
// Blocked = time in save() + time in wait_staged(). Forward + backward is either the
// accelerator model (the rank waits max(--step-ms, 2x the all-ranks memcpy of this run) with
// the host's cores free, as while a GPU computes) or the CPU kernel of a step (cpu_compute:
// its calibrated passes, competing with the copy for the cores). Each save is waited for (off
// the clock) before the next, as the save interval of training leaves it time to persist; the
// optimizer step's mutation after the fence must not reach the checkpoint (the loads check).
void Runner::deferred(bool cpu_compute) {
  ModeData* md = nullptr;
  for (const char* m : {"async_io_uring", "async_posix"})
    if (modes_.count(m)) {
      md = &modes_.at(m);
      deferred_mode_ = m;
      break;
    }
  if (!md || (cpu_compute && passes_ == 0)) return;
  const auto wait_for = std::chrono::duration<double, std::milli>(std::max(o_.step_ms, 2 * summarize(memcpy_all_ms_).median));
  DeferredData& dd = deferred_[cpu_compute ? "cpu" : "accelerator"];
  ckpt::Checkpointer& ck = *md->ck;
  const std::uint64_t base = md->next_step;
  md->next_step += static_cast<std::uint64_t>(o_.saves);
  std::barrier start(o_.ranks);
  std::mutex mu;
  md->fs->take();
  on_ranks(o_.ranks, [&](int r) {
    const auto ri = static_cast<std::size_t>(r);
    double local = 0;
    for (int k = 1; k <= o_.saves; ++k) {
      const std::uint64_t step = base + static_cast<std::uint64_t>(k);
      states_[ri]->mutate(step);
      start.arrive_and_wait();  // every rank saves at the same step
      const auto t0 = Clock::now();
      ckpt::SaveHandle h = ck.save(r, step, states_[ri]->views(), save_info(r), ckpt::Staging::deferred);
      const auto t1 = Clock::now();
      if (cpu_compute) local += compute_[ri]->run(passes_);  // forward + backward
      else std::this_thread::sleep_for(wait_for);
      const auto t2 = Clock::now();
      h.wait_staged();
      const auto t3 = Clock::now();
      states_[ri]->mutate(step + 1);  // the optimizer step
      const ckpt::SaveResult res = h.wait();
      std::lock_guard lk(mu);
      dd.save_ms.push_back(ms(t1 - t0));
      dd.fence_ms.push_back(ms(t3 - t2));
      dd.stall_ms.push_back(ms(t1 - t0) + ms(t3 - t2));
      dd.compute_ms.push_back(ms(t2 - t1));
      dd.stage_ms.push_back(ms(res.stage));
    }
    g_sink.store(local, std::memory_order_relaxed);
  });
  ck.wait_all();
  md->fs->take();
  std::fprintf(stderr, "ckpt-bench: deferred staging (%s): blocked %.1f ms per save (save %.1f + fence %.1f), compute %.1f ms, copy %.1f ms\n",
               cpu_compute ? "cpu" : "accelerator", summarize(dd.stall_ms).median, summarize(dd.save_ms).median,
               summarize(dd.fence_ms).median, summarize(dd.compute_ms).median, summarize(dd.stage_ms).median);
}

namespace {
// Reads one byte of every page of a view, as a user of a mapped tensor would (and as the peers
// script does for safetensors' mapped loads).
std::uint64_t touch_pages(std::span<const std::byte> b) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < b.size(); i += 4096) sum += static_cast<std::uint64_t>(b[i]);
  if (!b.empty()) sum += static_cast<std::uint64_t>(b.back());
  return sum;
}

const std::string kSmallTensor = "model.layers.0.input_norm.weight";
}  // namespace

// One small tensor of rank 0 through MappedShard (verify fast), page cache dropped: the time
// from open_latest to the tensor's bytes read, and what was read for it: chunks hashed, and
// the bytes the process read from storage, against the chunks that cover the tensor.
void Runner::mapped_one(const std::string& root) {
  auto& pfs = ckpt::posix_file_system();
  {
    const auto opened = ckpt::open_latest(pfs, root, {.expected_world_size = o_.ranks});
    for (const auto& f : opened.reader.manifest().shards) drop_file_cache(opened.reader.file_path(f));
  }
  if (o_.load_settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.load_settle_ms));
  const auto t0 = Clock::now();
  const auto opened = ckpt::open_latest(pfs, root, {.expected_world_size = o_.ranks});
  const ckpt::Manifest& m = opened.reader.manifest();
  const ckpt::TensorRecord* small = m.find_tensor(kSmallTensor, 0);
  ckpt::MappedShard shard(opened.reader, small ? m.file_of(*small) : m.rank_record(0), ckpt::Verify::fast);
  const std::uint64_t io0 = process_read_bytes();
  const ckpt::TensorView v = shard.tensor(kSmallTensor);
  g_sink.store(static_cast<double>(touch_pages(v.data)), std::memory_order_relaxed);
  const std::uint64_t io1 = process_read_bytes();
  const double took = ms(Clock::now() - t0);
  mapped_one_ms_.push_back(took);
  const ckpt::TensorRecord* rec = shard.find(kSmallTensor);
  const std::uint64_t chunk = opened.reader.manifest().chunk_size;
  const std::uint64_t first = rec->begin / chunk, last = rec->end > rec->begin ? (rec->end - 1) / chunk : first;
  const std::uint64_t covering = last - first + 1;
  const std::uint64_t covering_bytes = std::min(shard.size(), (last + 1) * chunk) - first * chunk;
  const ckpt::MappedShardStats st = shard.stats();
  mapped_one_ = {{"tensor", kSmallTensor},
                 {"tensor_bytes", rec->end - rec->begin},
                 {"mapped", shard.is_mapped()},
                 {"chunks_covering", covering},
                 {"bytes_covering", covering_bytes},
                 {"chunks_checked", st.chunks_checked},
                 {"bytes_checked", st.bytes_checked},
                 {"bytes_read_fallback", st.bytes_read},
                 {"storage_bytes_read", io1 - io0},
                 {"shard_bytes", shard.size()}};
  std::fprintf(stderr, "ckpt-bench: mapped, one tensor: %.2f ms, %llu of %llu covering chunks checked, %.1f KiB read from storage\n", took,
               static_cast<unsigned long long>(st.chunks_checked), static_cast<unsigned long long>(covering),
               static_cast<double>(io1 - io0) / 1024);
}

// Every tensor of every rank through MappedShard (verify fast, a thread per rank), one byte of
// every page read, page cache dropped: a lazy load of everything.
void Runner::mapped_all(const std::string& root) {
  auto& pfs = ckpt::posix_file_system();
  {
    const auto opened = ckpt::open_latest(pfs, root, {.expected_world_size = o_.ranks});
    for (const auto& f : opened.reader.manifest().shards) drop_file_cache(opened.reader.file_path(f));
  }
  if (o_.load_settle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.load_settle_ms));
  const std::uint64_t f0 = minor_faults();
  const auto t0 = Clock::now();
  const auto opened = ckpt::open_latest(pfs, root, {.expected_world_size = o_.ranks});
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(o_.ranks));
  std::uint64_t bytes = 0;
  for (const auto& f : opened.reader.manifest().shards) bytes += f.size;
  on_ranks(o_.ranks, [&](int r) {
    for (const ckpt::ShardRecord& f : opened.reader.manifest().files_of(r)) {
      ckpt::MappedShard shard(opened.reader, f, ckpt::Verify::fast);
      for (const auto& t : shard.tensors()) sums[static_cast<std::size_t>(r)] += touch_pages(shard.tensor(t.name).data);
    }
  });
  const double s = secs(Clock::now() - t0);
  const std::uint64_t faults = minor_faults() - f0;
  g_sink.store(static_cast<double>(sums[0]), std::memory_order_relaxed);
  load_gbps_["mapped"].push_back(gb_per_s(bytes, s));
  load_faults_per_gib_["mapped"].push_back(static_cast<double>(faults) / (static_cast<double>(bytes) / (1ull << 30)));
  std::fprintf(stderr, "ckpt-bench: load, mapped (fast)  %.2f GB/s\n", load_gbps_["mapped"].back());
}

void Runner::soak(ModeData& md) {
  const int n = o_.soak_saves;
  std::vector<double> series(static_cast<std::size_t>(n));
  std::vector<double> stalls;
  std::mutex mu;
  int k = 0;
  std::barrier after_save(o_.ranks, [&]() noexcept {
    series[static_cast<std::size_t>(k)] = static_cast<double>(rss_bytes());
    ++k;
  });
  const auto stats0 = md.ck->stats();
  const bool hwm_ok = reset_hwm();
  const std::uint64_t rss0 = rss_bytes();
  const std::uint64_t base = md.next_step;
  md.next_step += static_cast<std::uint64_t>(n);
  const auto t0 = Clock::now();
  on_ranks(o_.ranks, [&](int r) {
    const auto ri = static_cast<std::size_t>(r);
    for (int i = 1; i <= n; ++i) {
      const std::uint64_t step = base + static_cast<std::uint64_t>(i);
      states_[ri]->mutate(step);
      const auto c = Clock::now();
      auto h = md.ck->save(r, step, states_[ri]->views(), save_info(r));
      const double st = ms(Clock::now() - c);
      {
        std::lock_guard lk(mu);
        stalls.push_back(st);
      }
      h.wait();
      after_save.arrive_and_wait();
    }
  });
  const double took = secs(Clock::now() - t0);
  md.fs->take();
  const std::uint64_t peak = hwm_bytes();
  const auto stats1 = md.ck->stats();
  const double ckpt_bytes = static_cast<double>(state_bytes_);
  const double extra = static_cast<double>(peak) - static_cast<double>(rss0) + static_cast<double>(md.resident_staging);
  // Growth between the fifth save (or the first, if fewer) and the last.
  const std::size_t from = std::min<std::size_t>(4, series.size() - 1);
  const double growth = series.back() - series[from];
  json::array rss;
  for (double v : series) rss.push_back(v);
  soak_ = {{"saves", n},
           {"seconds", took},
           {"rss_after_each_save_bytes", rss},
           {"rss_before_bytes", rss0},
           {"peak_rss_bytes", peak},
           {"hwm_reset", hwm_ok},
           {"resident_staging_bytes", md.resident_staging},
           {"peak_extra_bytes", extra},
           {"peak_extra_ratio", extra / ckpt_bytes},
           {"growth_bytes", growth},
           {"growth_from_save", static_cast<std::uint64_t>(from + 1)},
           {"growth_ratio", growth / ckpt_bytes},
           {"staging_allocations_during", stats1.staging_allocations - stats0.staging_allocations},
           {"stall_ms", summary_json(summarize(stalls))}};
  std::fprintf(stderr, "ckpt-bench: soak: %d saves in %.1f s, peak extra %.2fx checkpoint, growth %.1f MiB\n", n, took,
               extra / ckpt_bytes, growth / (1 << 20));
}

namespace {
std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}
}  // namespace

json::object Runner::run() {
  const auto t_run = Clock::now();
  const double busy0 = machine_cpu_s().busy, ours0 = process_cpu_s();
  loadavg_start_ = loadavg();
  // Directory: ours if not given; subdirectories we own are cleared first.
  bool own_dir = false;
  if (o_.dir.empty()) {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/var/tmp") + "/ckpt-bench-XXXXXX";
    if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed: " + templ);
    dir_ = templ;
    own_dir = true;
  } else {
    dir_ = o_.dir;
    fs::create_directories(dir_);
  }
  for (const auto& m : kAllModes) fs::remove_all(dir_ + "/" + m);
  io_uring_ = io_uring_works(&io_uring_why_);
  if (!io_uring_) {
    std::fprintf(stderr, "ckpt-bench: io_uring unavailable (%s): async_io_uring is skipped, sync uses the posix writer\n",
                 io_uring_why_.c_str());
    std::erase(o_.modes, std::string("async_io_uring"));
  }

  layout_ = make_layout(o_.size, o_.ranks);
  if (!o_.layout_path.empty()) write_text(o_.layout_path, pretty_json(layout_to_json(layout_)));
  std::fprintf(stderr, "ckpt-bench: building %d rank states of %s total in %s\n", o_.ranks,
               std::to_string(o_.size >> 20).append(" MiB").c_str(), dir_.c_str());
  states_.resize(static_cast<std::size_t>(o_.ranks));
  compute_.resize(static_cast<std::size_t>(o_.ranks));
  copy_dst_.resize(static_cast<std::size_t>(o_.ranks));
  on_ranks(o_.ranks, [&](int r) {
    const auto ri = static_cast<std::size_t>(r);
    states_[ri] = std::make_unique<RankState>(layout_[ri], 0x5eed0000ull + ri);
    compute_[ri] = std::make_unique<Compute>(o_.compute_mb);
    // 1 MiB more than the state: room for the shard's padding between tensors and a start at
    // the file's offset modulo 4096 when a load writes into it (Runner::load).
    copy_dst_[ri] = ckpt::AlignedBuffer(static_cast<std::size_t>(states_[ri]->bytes() + (1u << 20)), /*prefault=*/true);
  });
  for (const auto& s : states_) state_bytes_ += s->bytes();
  rank_bytes_ = states_[0]->bytes();
  io_buf_ = ckpt::AlignedBuffer(static_cast<std::size_t>(o_.raw_piece) * static_cast<std::size_t>(o_.raw_queue_depth), true);
  for (std::size_t i = 0; i < io_buf_.capacity(); ++i) io_buf_.data()[i] = static_cast<std::byte>(i * 131 + 7);
  {
    std::vector<ckpt::TensorView> v = states_[0]->views();
    const auto h = ckpt::plan_shard(v, {{"ckpt.rank", "0"}, {"ckpt.world_size", "0"}, {"ckpt.step", "0"}});
    staging_per_rank_ = (h.file_size() + 4096 + 4095) / 4096 * 4096;  // room for longer step numbers
  }

  // Compute calibration: passes on every rank at once, doubled until a run lasts long enough
  // that thread start-up does not count, then the best of three at that count.
  if (o_.step_ms > 0) {
    auto time_passes = [&](int p) {
      const auto t0 = Clock::now();
      on_ranks(o_.ranks, [&](int r) { g_sink.store(compute_[static_cast<std::size_t>(r)]->run(p)); });
      return ms(Clock::now() - t0);
    };
    int p = 1;
    while (time_passes(p) < std::max(20.0, o_.step_ms) && p < (1 << 20)) p *= 2;
    double best = 1e300;
    for (int k = 0; k < 3; ++k) best = std::min(best, time_passes(p));
    calib_pass_ms_ = best / p;
    passes_ = std::max(1, static_cast<int>(std::lround(o_.step_ms / calib_pass_ms_)));
  }

  // Single-core hash throughput and first-touch memcpy: CPU-only, once.
  {
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(rank_bytes_), 64u << 20);
    const double t = o_.quick ? 0.1 : 0.5;
    xxh3_gbps_ = xxh3_gbps(states_[0]->data(), n, t);
    sha256_gbps_ = sha256_gbps(states_[0]->data(), n, t);
    ckpt::AlignedBuffer fresh(static_cast<std::size_t>(rank_bytes_));
    const auto t0 = Clock::now();
    std::memcpy(fresh.data(), states_[0]->data(), static_cast<std::size_t>(rank_bytes_));
    memcpy_cold_gbps_ = gb_per_s(rank_bytes_, secs(Clock::now() - t0));
  }

  const bool want_async_uring = std::find(o_.modes.begin(), o_.modes.end(), "async_io_uring") != o_.modes.end();
  if (o_.cold_pool && want_async_uring) cold_pool();

  for (const auto& m : o_.modes) {
    if (m == "none") continue;
    ModeData md;
    md.root = dir_ + "/" + m;
    const std::uint64_t before = rss_bytes();
    md.fs = std::make_unique<TimedFileSystem>(ckpt::posix_file_system());
    md.ck = make_checkpointer(m, md.root, true, md.fs.get());
    md.resident_staging = rss_bytes() - std::min(before, rss_bytes());
    md.next_step = 1000;
    modes_.emplace(m, std::move(md));
  }

  // load_shard with each verify mode, load_into owned memory with each (none: what reading
  // costs without the checks), MappedShard of one small tensor and of everything.
  // raw_into: the raw read loop into load_into's destinations (a reference, not a ckpt load).
  const std::vector<std::string> verifies = {"none", "fast", "full", "raw_into", "into_none", "into_fast", "into_full", "mapped_one", "mapped"};
  std::string load_root;
  for (const char* m : {"async_io_uring", "async_posix", "sync"})
    if (modes_.count(m)) {
      load_root = modes_.at(m).root;
      break;
    }
  for (int rep = 0; rep < o_.repeats; ++rep) {
    references(rep);
    // Interleaved: each round starts with a different mode, so drift hits every mode alike.
    for (std::size_t i = 0; i < o_.modes.size(); ++i) {
      const std::string& m = o_.modes[(i + static_cast<std::size_t>(rep)) % o_.modes.size()];
      Segment seg = segment(m, rep);
      segments_.push_back(std::move(seg));
    }
    // Deferred staging, both models of forward + backward, in alternating order.
    for (int k = 0; k < 2; ++k) deferred((k + rep) % 2 == 1);
    if (o_.loads && !load_root.empty())
      for (std::size_t i = 0; i < verifies.size(); ++i) {
        const std::string& v = verifies[(i + static_cast<std::size_t>(rep)) % verifies.size()];
        if (v == "mapped_one") {
          mapped_one(load_root);
          continue;
        }
        if (v == "mapped") {
          mapped_all(load_root);
          continue;
        }
        if (v == "raw_into") {
          raw_into(load_root);
          continue;
        }
        const bool into = v.rfind("into_", 0) == 0;
        load(load_root, *ckpt::parse_verify(into ? v.substr(5) : v), into);
      }
  }
  if (o_.soak_saves > 0) {
    for (const char* m : {"async_io_uring", "async_posix"})
      if (modes_.count(m)) {
        soak(modes_.at(m));
        soak_["mode"] = m;
        break;
      }
  }
  wall_s_ = secs(Clock::now() - t_run);
  ours_cpu_s_ = process_cpu_s() - ours0;
  others_cpu_s_ = std::max(0.0, machine_cpu_s().busy - busy0 - ours_cpu_s_);
  loadavg_end_ = loadavg();
  json::object res = results();
  for (auto& [name, md] : modes_) md.ck.reset();
  if (!o_.keep) {
    for (const auto& m : kAllModes) fs::remove_all(dir_ + "/" + m);
    if (own_dir) fs::remove_all(dir_);
  }
  return res;
}

}  // namespace bench
