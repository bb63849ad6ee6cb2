// SPDX-License-Identifier: Apache-2.0
// The results document: every figure of the run, the ratios to the references and the targets.
#include <sys/statfs.h>
#include <sys/utsname.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include "ckpt/hash/xxh3.hpp"
#include "json_output.hpp"
#include "runner.hpp"

namespace bench {

namespace json = boost::json;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const auto c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown";
}

std::string fs_type(const std::string& dir) {
  struct statfs s {};
  if (statfs(dir.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53: return "ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794c7630: return "overlayfs";
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(s.f_type));
      return buf;
    }
  }
}

std::uint64_t mem_total() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemTotal:", 0) == 0) return std::stoull(line.substr(9)) * 1024;
  return 0;
}

double median_of(const std::vector<double>& v) { return v.empty() ? kNaN : summarize(v).median; }

// The machine's idle CPU seconds at t, interpolated between the segment's samples.
double idle_at(const std::vector<std::pair<Clock::time_point, double>>& samples, Clock::time_point t) {
  if (samples.empty()) return kNaN;
  if (t <= samples.front().first) return samples.front().second;
  for (std::size_t i = 1; i < samples.size(); ++i)
    if (t <= samples[i].first) {
      const auto& [t0, v0] = samples[i - 1];
      const auto& [t1, v1] = samples[i];
      const double span = secs(t1 - t0);
      return span > 0 ? v0 + (v1 - v0) * secs(t - t0) / span : v1;
    }
  return samples.back().second;
}

json::value or_null(double v) { return std::isfinite(v) ? json::value(v) : json::value(nullptr); }

std::string str_of(const json::object& o, std::string_view key) {
  const json::value* v = o.if_contains(key);
  return v && v->is_string() ? std::string(v->get_string()) : std::string();
}

}  // namespace

json::object Runner::mode_results(const std::string& mode) const {
  std::vector<const Segment*> segs;
  for (const auto& s : segments_)
    if (s.mode == mode) segs.push_back(&s);
  json::object m;
  const int steps = (o_.saves + 1) * o_.every;
  double step_total_ms = 0;
  std::vector<double> save_step_ms, plain_step_ms, stall, wait, stage, steady, durable, complete, after_durable, persist, rotation_after,
      idle_cores;
  std::map<std::string, std::vector<double>> phase, commit_ops;
  double writer_cpu = 0, rank_cpu = 0, peak_growth = 0;
  bool hwm_ok = true;
  int saves = 0;
  std::uint64_t ckpt_bytes = 0;
  double first_stall = kNaN;
  for (const Segment* s : segs) {
    step_total_ms += ms(s->step_end.back() - s->start);
    for (int k = 0; k < steps; ++k) {
      const auto begin = k == 0 ? s->start : s->step_end[static_cast<std::size_t>(k - 1)];
      const double d = ms(s->step_end[static_cast<std::size_t>(k)] - begin);
      const int step = k + 1;
      const bool save_step = mode != "none" && step % o_.every == 0 && step / o_.every <= o_.saves;
      (save_step ? save_step_ms : plain_step_ms).push_back(d);
    }
    writer_cpu += s->writer_cpu_s;
    rank_cpu += s->rank_cpu_s;
    hwm_ok = hwm_ok && s->hwm_valid;
    peak_growth = std::max(peak_growth, static_cast<double>(s->hwm) - static_cast<double>(s->rss_start));
    for (const auto& ops : s->commit_ops)
      for (const auto& [op, v] : ops) commit_ops[op].push_back(v);
    for (std::size_t k = 0; k < s->saves.size(); ++k) {
      const auto& one = s->saves[k];
      ++saves;
      std::vector<double> this_stall;
      Clock::time_point first_call = one.front().call, first_write = one.front().call + one.front().result.stall + one.front().result.stage;
      Clock::time_point last_done = first_call;
      std::uint64_t bytes = 0;
      for (const RankSave& rs : one) {
        const double st = ms(rs.ret - rs.call);
        stall.push_back(st);
        this_stall.push_back(st);
        wait.push_back(ms(rs.result.stall));
        stage.push_back(ms(rs.result.stage));
        phase["stage"].push_back(ms(rs.result.stage));
        phase["write"].push_back(ms(rs.result.write));
        phase["hash"].push_back(ms(rs.result.hash));
        phase["fsync"].push_back(ms(rs.result.fsync));
        phase["commit"].push_back(ms(rs.result.commit));
        phase["total"].push_back(ms(rs.result.total));
        first_call = std::min(first_call, rs.call);
        first_write = std::min(first_write, rs.call + rs.result.stall + rs.result.stage);
        last_done = std::max(last_done, rs.call + rs.result.total);
        bytes += rs.result.bytes;
      }
      ckpt_bytes = bytes;
      if (s == segs.front() && k == 0) first_stall = summarize(this_stall).median;
      else steady.insert(steady.end(), this_stall.begin(), this_stall.end());
      // Durable: the directory fsync after `latest` moved (exact, from the file-system
      // timestamps); the handles complete later, and rotation after them.
      if (k < s->rotation_after_complete_ms.size() && s->rotation_after_complete_ms[k])
        rotation_after.push_back(*s->rotation_after_complete_ms[k]);
      const auto durable_at = k < s->durable_at.size() && s->durable_at[k] ? *s->durable_at[k] : last_done;
      durable.push_back(ms(durable_at - first_call));
      complete.push_back(ms(last_done - first_call));
      after_durable.push_back(ms(last_done - durable_at));
      persist.push_back(gb_per_s(bytes, secs(durable_at - first_write)));
      // Cores nothing ran on while this checkpoint persisted (from its first write to durable).
      const double window = secs(durable_at - first_write);
      if (window > 0) idle_cores.push_back((idle_at(s->idle_samples, durable_at) - idle_at(s->idle_samples, first_write)) / window);
    }
  }
  m["segments"] = segs.size();
  m["steps"] = static_cast<std::uint64_t>(steps) * segs.size();
  m["step_ms"] = segs.empty() ? 0.0 : step_total_ms / static_cast<double>(steps * static_cast<int>(segs.size()));
  m["save_step_ms"] = summary_json(summarize(save_step_ms));
  m["plain_step_ms"] = summary_json(summarize(plain_step_ms));
  m["rank_cpu_s"] = rank_cpu;
  m["writer_cpu_s"] = writer_cpu;
  if (mode == "none") return m;
  const ModeData& md = modes_.at(mode);
  m["backend"] = std::string(md.ck ? md.ck->backend_name() : "");
  m["saves"] = saves;
  m["checkpoint_bytes"] = ckpt_bytes;
  m["stall_ms"] = summary_json(summarize(stall));
  m["stall_wait_ms"] = summary_json(summarize(wait));
  m["stage_ms"] = summary_json(summarize(stage));
  m["first_save_stall_ms"] = or_null(first_stall);
  m["steady_stall_ms"] = summary_json(summarize(steady));
  m["durable_ms"] = summary_json(summarize(durable));
  m["complete_ms"] = summary_json(summarize(complete));
  m["after_durable_ms"] = summary_json(summarize(after_durable));
  m["rotation_after_complete_ms"] = summary_json(summarize(rotation_after));
  m["persist_gbps"] = summary_json(summarize(persist));
  json::object ph;
  for (const auto& [k, v] : phase) ph[k] = summarize(v).median;
  m["phases_median_ms"] = ph;
  json::object cb;
  for (const auto& [k, v] : commit_ops) cb[k] = summarize(v).median;
  m["commit_breakdown_median_ms"] = cb;
  const double per_save = saves ? writer_cpu / saves : 0;
  m["writer_cpu_s_per_save"] = per_save;
  // Cores the writer kept busy on average while a checkpoint persisted.
  const double persist_s = summarize(durable).median / 1e3;
  m["writer_cores_while_persisting"] = persist_s > 0 ? per_save / persist_s : 0;
  m["idle_cores_while_persisting"] = or_null(median_of(idle_cores));
  m["resident_staging_bytes"] = md.resident_staging;
  if (hwm_ok) {
    const double extra = peak_growth + static_cast<double>(md.resident_staging);
    m["peak_extra_bytes"] = extra;
    m["peak_extra_ratio"] = ckpt_bytes ? extra / static_cast<double>(ckpt_bytes) : kNaN;
  } else {
    m["peak_extra_bytes"] = nullptr;
    m["peak_extra_ratio"] = nullptr;
  }
  return m;
}

// The hashing bound of a save: SHA-256 of one core (this run) x the cores the save can hash
// on, and the lower of that and the raw disk. A file's SHA-256 is sequential, so at most one
// core per shard counts. Sync: the rank threads wait, so every core is the save's. Async: the
// cores idle while the checkpoint persisted (from /proc/stat) plus those ckpt's own threads
// used meanwhile (writer CPU / durable time), i.e. the cores the training left to the save.
json::object Runner::hashing_bound(const json::object& modes) const {
  const double nproc = std::max(1u, std::thread::hardware_concurrency());
  const double shards = std::min<double>(o_.ranks, nproc);
  const double raw_write = median_of(raw_write_gbps_), raw_read = median_of(raw_read_gbps_);
  json::object b{{"sha256_gbps", sha256_gbps_},
                 {"cores", nproc},
                 {"shards", o_.ranks},
                 {"raw_write_gbps", raw_write},
                 {"raw_read_gbps", raw_read},
                 {"sync_cores", shards},
                 {"sync_sha256_gbps", sha256_gbps_ * shards},
                 {"sync_bound_gbps", std::min(raw_write, sha256_gbps_ * shards)},
                 {"load_cores", shards},
                 {"load_bound_gbps", std::min(raw_read, sha256_gbps_ * shards)},
                 {"note", "SHA-256 of a file is sequential: at most one core per shard hashes"}};
  for (const char* m : {"sync", "async_io_uring", "async_posix"}) {
    const json::value* mv = modes.if_contains(m);
    if (!mv) continue;
    const double idle = json_at(mv->as_object(), {"idle_cores_while_persisting"});
    const double writer = json_at(mv->as_object(), {"writer_cores_while_persisting"});
    const double cores = std::min(shards, std::max(0.0, idle) + std::max(0.0, writer));
    b[std::string(m) + "_idle_cores"] = or_null(idle);
    b[std::string(m) + "_writer_cores"] = or_null(writer);
    // Sync: the bound counts every core (the ranks wait); what was measured available (others'
    // processes take the rest) is beside it.
    if (std::string_view(m) == "sync") {
      b["sync_available_cores"] = or_null(cores);
      continue;
    }
    b[std::string(m) + "_cores"] = or_null(cores);
    b[std::string(m) + "_sha256_gbps"] = or_null(sha256_gbps_ * cores);
    b[std::string(m) + "_bound_gbps"] = or_null(std::min(raw_write, sha256_gbps_ * cores));
  }
  return b;
}

json::object Runner::results() const {
  json::object r;
  json::array modes;
  for (const auto& m : o_.modes) modes.emplace_back(m);
  const std::uint64_t ckpt_bytes = [&] {
    for (const auto& s : segments_)
      if (!s.saves.empty()) {
        std::uint64_t b = 0;
        for (const auto& rs : s.saves.front()) b += rs.result.bytes;
        return b;
      }
    return state_bytes_;
  }();
  r["config"] = json::object{{"ranks", o_.ranks},
                             {"size_bytes", o_.size},
                             {"state_bytes", state_bytes_},
                             {"rank_state_bytes", rank_bytes_},
                             {"checkpoint_bytes", ckpt_bytes},
                             {"tensors_per_rank", layout_.empty() ? 0 : layout_.front().size()},
                             {"repeats", o_.repeats},
                             {"saves_per_repeat", o_.saves},
                             {"every_steps", o_.every},
                             {"step_ms_target", o_.step_ms},
                             {"compute_mb_per_rank", o_.compute_mb},
                             {"compute_passes", passes_},
                             {"compute_pass_ms", calib_pass_ms_},
                             {"queue_depth", o_.queue_depth},
                             {"chunk_size", o_.chunk_size},
                             {"raw_queue_depth", o_.raw_queue_depth},
                             {"raw_piece", o_.raw_piece},
                             {"load_queue_depth", o_.load_queue_depth},
                             {"load_io_size", o_.load_io_size},
                             {"load_threads", o_.load_threads > 0 ? o_.load_threads : o_.ranks},
                             {"soak_saves", o_.soak_saves},
                             {"load_settle_ms", o_.load_settle_ms},
                             {"modes", modes},
                             {"dir", dir_},
                             {"quick", o_.quick},
                             {"wall_seconds", wall_s_}};
  utsname u{};
  uname(&u);
  r["machine"] = json::object{{"nproc", std::thread::hardware_concurrency()},
                              {"cpu_model", cpu_model()},
                              {"kernel", std::string(u.release)},
                              {"mem_total_bytes", mem_total()},
                              {"filesystem", fs_type(dir_)},
                              {"io_uring", io_uring_},
                              {"io_uring_unavailable_because", io_uring_why_},
                              {"xxh3_kernel", std::string(ckpt::xxh3_kernel_name())},
                              {"loadavg_start", loadavg_start_},
                              {"loadavg_end", loadavg_end_},
                              {"cpu_s_ours", ours_cpu_s_},
                              {"cpu_s_other_processes", others_cpu_s_},
                              // Share of the machine's CPU (wall x cores) other processes used during the run.
                              {"other_processes_cpu_share",
                               wall_s_ > 0 ? others_cpu_s_ / (wall_s_ * std::max(1u, std::thread::hardware_concurrency())) : 0.0}};
  r["layout"] = layout_to_json(layout_);

  const double memcpy_alone = median_of(memcpy_alone_ms_), memcpy_all = median_of(memcpy_all_ms_);
  json::object refs{{"raw_engine", raw_last_.engine},
                    {"raw_direct", raw_last_.direct},
                    {"raw_bytes", raw_last_.bytes},
                    {"raw_write_gbps", summary_json(summarize(raw_write_gbps_))},
                    {"raw_read_gbps", summary_json(summarize(raw_read_gbps_))},
                    {"memcpy_rank_alone_ms", summary_json(summarize(memcpy_alone_ms_))},
                    {"memcpy_rank_all_ranks_ms", summary_json(summarize(memcpy_all_ms_))},
                    {"memcpy_warm_gbps", gb_per_s(rank_bytes_, memcpy_alone / 1e3)},
                    {"memcpy_first_touch_gbps", memcpy_cold_gbps_},
                    {"raw_read_fresh_memory_gbps", raw_read_fresh_gbps_},
                    {"xxh3_gbps", xxh3_gbps_},
                    {"sha256_gbps", sha256_gbps_}};
  r["references"] = refs;

  json::object modes_o;
  for (const auto& m : o_.modes) modes_o[m] = mode_results(m);
  const double none_step = modes_o.contains("none") ? modes_o["none"].as_object()["step_ms"].to_number<double>() : kNaN;
  for (auto& [name, v] : modes_o) {
    auto& o = v.as_object();
    const double step = o["step_ms"].to_number<double>();
    o["overhead"] = or_null(step / none_step - 1);
  }
  r["modes"] = modes_o;
  r["cold_pool"] = cold_pool_;
  r["hashing_bound"] = hashing_bound(modes_o);
  if (!deferred_.empty()) {
    json::object d{{"mode", deferred_mode_}};
    for (const auto& [model, dd] : deferred_)
      d[model] = json::object{{"saves", dd.stall_ms.size()},
                              {"stall_ms", summary_json(summarize(dd.stall_ms))},
                              {"save_ms", summary_json(summarize(dd.save_ms))},
                              {"fence_ms", summary_json(summarize(dd.fence_ms))},
                              {"compute_ms", summary_json(summarize(dd.compute_ms))},
                              {"stage_ms", summary_json(summarize(dd.stage_ms))}};
    r["deferred_staging"] = d;
  }

  json::object load;
  // The same hashing bound as the saves' (hashing_bound): SHA-256 x cores, one per shard at most.
  const double sha_cores = json_at(r.at("hashing_bound").as_object(), {"load_cores"}) * sha256_gbps_;
  const double raw_read = median_of(raw_read_gbps_), raw_write = median_of(raw_write_gbps_);
  for (const auto& [name, v] : load_gbps_)
    load[name] = json::object{{"gbps", summary_json(summarize(v))},
                              {"minor_faults_per_gib", median_of(load_faults_per_gib_.at(name))},
                              {"over_raw_read", median_of(v) / raw_read}};
  if (!load.empty()) {
    load["full_bound_gbps"] = std::min(raw_read, sha_cores);
    load["snapshot_checks"] = isolation_checks_;
    load["snapshot_isolated"] = isolation_checks_ > 0 && isolation_failures_ == 0;
    if (!load_engine_.empty()) load["into_engine"] = load_engine_;
  }
  if (!mapped_one_.empty()) {
    json::object one = mapped_one_;
    one["ms"] = summary_json(summarize(mapped_one_ms_));
    load["mapped_one_tensor"] = one;
  }
  r["load"] = load;
  r["soak"] = soak_;

  // ---- ratios and targets ------------------------------------------------------------
  auto mode_at = [&](const std::string& m, std::initializer_list<std::string_view> rest) {
    const json::value* mv = r.at("modes").as_object().if_contains(m);
    if (!mv) return kNaN;
    return json_at(mv->as_object(), rest);
  };
  json::object ratios;
  json::array targets;
  auto target = [&](const std::string& id, const std::string& text, double value, const std::string& op, double threshold,
                    const std::string& note) {
    const bool measured = std::isfinite(value);
    const bool pass = measured && (op == "<=" ? value <= threshold : value >= threshold);
    targets.push_back(json::object{{"id", id},
                                   {"text", text},
                                   {"value", or_null(value)},
                                   {"op", op},
                                   {"threshold", threshold},
                                   {"pass", pass},
                                   {"measured", measured},
                                   {"note", note}});
  };
  char buf[512];
  for (const char* m : {"async_io_uring", "async_posix"}) {
    const std::string sm(m);
    const std::string tag = sm == "async_io_uring" ? "" : " (posix writer)";
    const double st = mode_at(sm, {"steady_stall_ms", "median"});
    ratios["stall_over_memcpy_all_ranks_" + sm] = or_null(st / memcpy_all);
    ratios["stall_over_memcpy_alone_" + sm] = or_null(st / memcpy_alone);
    const double persist = mode_at(sm, {"persist_gbps", "median"});
    ratios["persist_over_raw_write_" + sm] = or_null(persist / raw_write);
    ratios["overhead_" + sm] = or_null(mode_at(sm, {"overhead"}));
    if (!std::isfinite(st)) continue;
    std::snprintf(buf, sizeof buf,
                  "steady stall median %.1f ms; memcpy of the rank's state %.1f ms with every rank copying at once, %.1f ms alone "
                  "(ratio to that: %.2f); p99 stall %.1f ms",
                  st, memcpy_all, memcpy_alone, st / memcpy_alone, mode_at(sm, {"steady_stall_ms", "p99"}));
    target("async_stall" + std::string(sm == "async_io_uring" ? "" : "_posix"),
           "async stall per save <= 1.2x memcpy of the rank's state" + tag, st / memcpy_all, "<=", 1.2, buf);
    const double interval_ms = o_.every * none_step, dur = mode_at(sm, {"durable_ms", "median"});
    std::snprintf(buf, sizeof buf, "save interval %.0f ms (%d steps of %.1f ms) vs time until durable %.0f ms: %s", interval_ms, o_.every,
                  none_step, dur, interval_ms > dur ? "interval longer, the target applies" : "interval SHORTER than persist");
    target("async_overhead" + std::string(sm == "async_io_uring" ? "" : "_posix"), "async step-time overhead <= 5%" + tag,
           mode_at(sm, {"overhead"}), "<=", 0.05, buf);
    std::snprintf(buf, sizeof buf, "persist %.2f GB/s (both checksums) vs raw O_DIRECT write %.2f GB/s; writer CPU %.2f s per save", persist,
                  raw_write, mode_at(sm, {"writer_cpu_s_per_save"}));
    target("persist_bandwidth" + std::string(sm == "async_io_uring" ? "" : "_posix"),
           "persist bandwidth >= 0.85x raw O_DIRECT write" + tag, persist / raw_write, ">=", 0.85, buf);
  }
  {
    const double sync_st = mode_at("sync", {"steady_stall_ms", "median"});
    const double async_st = mode_at("async_io_uring", {"steady_stall_ms", "median"});
    ratios["sync_over_async_stall"] = or_null(sync_st / async_st);
    std::snprintf(buf, sizeof buf, "sync stall %.1f ms / async stall %.1f ms at %.0f MiB%s", sync_st, async_st,
                  static_cast<double>(state_bytes_) / (1 << 20), state_bytes_ >= (1ull << 30) ? "" : " (target is stated at 1 GiB)");
    if (std::isfinite(sync_st) && std::isfinite(async_st))
      target("sync_over_async_stall", "sync stall / async stall >= 10x at 1 GiB", sync_st / async_st, ">=", 10, buf);
    const double sync_persist = mode_at("sync", {"persist_gbps", "median"});
    ratios["persist_over_raw_write_sync"] = or_null(sync_persist / raw_write);
    const auto& hb = r.at("hashing_bound").as_object();
    const double bound = json_at(hb, {"sync_bound_gbps"});
    ratios["persist_over_hash_bound_sync"] = or_null(sync_persist / bound);
    if (std::isfinite(sync_persist)) {
      std::snprintf(buf, sizeof buf,
                    "sync persist %.2f GB/s (XXH3 per chunk and of the file, SHA-256) vs min(raw O_DIRECT write %.2f, SHA-256 %.2f GB/s "
                    "x %.0f cores = %.2f) = %.2f GB/s; a file's SHA-256 is sequential (one core per shard); measured while persisting: "
                    "%.2f cores idle + %.2f used by ckpt (other processes had the rest); writer CPU %.2f s per save",
                    sync_persist, raw_write, sha256_gbps_, json_at(hb, {"sync_cores"}), json_at(hb, {"sync_sha256_gbps"}), bound,
                    json_at(hb, {"sync_idle_cores"}), json_at(hb, {"sync_writer_cores"}), mode_at("sync", {"writer_cpu_s_per_save"}));
      target("sync_persist", "sync persist with both checksums >= 0.9x min(raw write, SHA-256 x cores) (hashing bound)",
             sync_persist / bound, ">=", 0.9, buf);
    }
  }
  if (const json::value* dv = r.if_contains("deferred_staging")) {
    for (const char* model : {"accelerator", "cpu"}) {
      const json::value* mv = dv->as_object().if_contains(model);
      if (!mv) continue;
      const auto& d = mv->as_object();
      const bool cpu = std::string_view(model) == "cpu";
      const double st = json_at(d, {"stall_ms", "median"}), compute = json_at(d, {"compute_ms", "median"}),
                   copy = json_at(d, {"stage_ms", "median"}), fence = json_at(d, {"fence_ms", "median"});
      ratios[std::string("deferred_stall_over_memcpy_all_ranks_") + model] = or_null(st / memcpy_all);
      ratios[std::string("deferred_stall_over_memcpy_alone_") + model] = or_null(st / memcpy_alone);
      std::snprintf(buf, sizeof buf,
                    "blocked per save (save() + wait_staged()) median %.2f ms (fence %.2f), p99 %.2f ms, against the memcpy of the rank's "
                    "state %.1f ms with every rank copying at once (%.1f ms alone: ratio %.2f); forward + backward (%s) %.1f ms, the copy "
                    "on ckpt's threads %.1f ms: %s",
                    st, fence, json_at(d, {"stall_ms", "p99"}), memcpy_all, memcpy_alone, st / memcpy_alone,
                    cpu ? "the step's CPU kernel, sharing the cores with the copy" : "the rank waits, host cores free, as on an accelerator",
                    compute, copy,
                    compute > copy ? "forward + backward longer than the copy, the target applies" : "the copy was LONGER than forward + backward");
      target(cpu ? "deferred_stall_cpu" : "deferred_stall",
             cpu ? "deferred staging stall <= 0.2x a memcpy of the state (CPU forward + backward sharing the cores)"
                 : "deferred staging stall <= 0.2x a memcpy of the state (forward + backward on an accelerator)",
             st / memcpy_all, "<=", 0.2, buf);
    }
  }
  if (!load_gbps_.empty()) {
    const double fast = median_of(load_gbps_.at("fast")), full = median_of(load_gbps_.at("full")),
                 none = median_of(load_gbps_.at("none"));
    ratios["load_none_over_raw_read"] = none / raw_read;
    ratios["load_fast_over_raw_read"] = fast / raw_read;
    ratios["load_full_over_bound"] = full / std::min(raw_read, sha_cores);
    std::snprintf(buf, sizeof buf,
                  "load fast %.2f GB/s vs raw O_DIRECT read %.2f GB/s (verify none %.2f GB/s); %.0f minor faults per GiB loaded; "
                  "first-touch memcpy %.2f GB/s",
                  fast, raw_read, none, median_of(load_faults_per_gib_.at("fast")), memcpy_cold_gbps_);
    target("load_fast", "load with fast verify >= 0.85x raw read", fast / raw_read, ">=", 0.85, buf);
    std::snprintf(buf, sizeof buf, "load full %.2f GB/s vs min(raw read %.2f, SHA-256 %.2f GB/s x %d cores = %.2f)", full, raw_read,
                  sha256_gbps_, static_cast<int>(std::min<double>(o_.ranks, std::thread::hardware_concurrency())), sha_cores);
    target("load_full", "load with full verify >= 0.85x min(raw read, SHA-256 x cores) (hashing bound)", full / std::min(raw_read, sha_cores), ">=",
           0.85, buf);
  }
  if (load_gbps_.count("into_fast") && load_gbps_.count("into_full")) {
    const double fast = median_of(load_gbps_.at("into_fast")), full = median_of(load_gbps_.at("into_full"));
    ratios["load_into_fast_over_raw_read"] = fast / raw_read;
    if (load_gbps_.count("raw_into")) ratios["load_into_fast_over_raw_read_into"] = fast / median_of(load_gbps_.at("raw_into"));
    ratios["load_into_full_over_bound"] = full / std::min(raw_read, sha_cores);
    std::snprintf(buf, sizeof buf,
                  "load_into (fast) %.2f GB/s into pre-faulted memory vs raw O_DIRECT read into warm memory %.2f GB/s, same run "
                  "(verify none %.2f GB/s; the raw loop into load_into's own destinations %.2f GB/s); %.0f minor faults per GiB; %s",
                  fast, raw_read, load_gbps_.count("into_none") ? median_of(load_gbps_.at("into_none")) : kNaN,
                  load_gbps_.count("raw_into") ? median_of(load_gbps_.at("raw_into")) : kNaN, median_of(load_faults_per_gib_.at("into_fast")),
                  load_engine_.c_str());
    target("load_into_fast", "load with fast verify into owned memory >= 0.85x raw O_DIRECT read into warm memory", fast / raw_read, ">=",
           0.85, buf);
    std::snprintf(buf, sizeof buf, "load_into (full) %.2f GB/s vs min(raw read %.2f, SHA-256 %.2f GB/s x %d cores = %.2f)", full, raw_read,
                  sha256_gbps_, static_cast<int>(std::min<double>(o_.ranks, std::thread::hardware_concurrency())), sha_cores);
    target("load_into_full", "load with full verify into owned memory >= 0.85x min(raw read, SHA-256 x cores) (hashing bound)",
           full / std::min(raw_read, sha_cores), ">=", 0.85, buf);
  }
  if (load_gbps_.count("mapped")) {
    const double all = median_of(load_gbps_.at("mapped"));
    ratios["load_mapped_over_raw_read"] = all / raw_read;
  }
  if (!mapped_one_.empty()) {
    const double covering = json_at(mapped_one_, {"chunks_covering"}), checked = json_at(mapped_one_, {"chunks_checked"});
    const double bytes_cov = json_at(mapped_one_, {"bytes_covering"}), disk = json_at(mapped_one_, {"storage_bytes_read"});
    // Both counts: the chunks hashed (MappedShardStats) and the bytes the process read from
    // storage for the view (/proc/self/io; 0 where the file system does not count them).
    const double value = std::max(checked / covering, disk / bytes_cov);
    ratios["mapped_one_tensor_chunks_over_covering"] = or_null(checked / covering);
    ratios["mapped_one_tensor_storage_over_covering"] = or_null(disk / bytes_cov);
    std::snprintf(buf, sizeof buf,
                  "%s (%.0f bytes) of rank 0 through MappedShard (verify fast), page cache dropped: %.0f chunk(s) checked, %.0f cover it "
                  "(%.0f KiB of a %.1f MiB shard); %.0f KiB read from storage for the view; %.2f ms from open_latest to its bytes",
                  str_of(mapped_one_, "tensor").c_str(), json_at(mapped_one_, {"tensor_bytes"}), checked, covering, bytes_cov / 1024,
                  json_at(mapped_one_, {"shard_bytes"}) / (1 << 20), disk / 1024, median_of(mapped_one_ms_));
    target("mapped_one_tensor", "reading one small tensor from the checkpoint reads at most the chunks that cover it (read / covering)",
           value, "<=", 1.0, buf);
  }
  if (!soak_.empty()) {
    const double peak = json_at(soak_, {"peak_extra_ratio"}), growth = json_at(soak_, {"growth_ratio"});
    ratios["soak_peak_extra_ratio"] = or_null(peak);
    ratios["soak_growth_ratio"] = or_null(growth);
    std::snprintf(buf, sizeof buf, "peak RSS above the training state over %d back-to-back async saves: %.0f MiB for a %.0f MiB checkpoint",
                  o_.soak_saves, json_at(soak_, {"peak_extra_bytes"}) / (1 << 20), static_cast<double>(ckpt_bytes) / (1 << 20));
    target("memory_peak", "peak extra memory during async saves <= 1.1x one checkpoint", peak, "<=", 1.1, buf);
    std::snprintf(buf, sizeof buf, "RSS growth from save %.0f to save %d: %.1f MiB; staging allocations during the soak: %.0f",
                  json_at(soak_, {"growth_from_save"}), o_.soak_saves, json_at(soak_, {"growth_bytes"}) / (1 << 20),
                  json_at(soak_, {"staging_allocations_during"}));
    target("memory_flat", "memory flat over the soak saves (growth <= 0.02x one checkpoint)", growth, "<=", 0.02, buf);
  }
  r["ratios"] = ratios;
  r["targets"] = targets;

  // ---- timeline of the last round's sync and async segments ---------------------------
  json::object timeline;
  for (const char* m : {"sync", "async_io_uring", "async_posix"}) {
    const Segment* seg = nullptr;
    for (const auto& s : segments_)
      if (s.mode == m) seg = &s;
    if (!seg) continue;
    if (std::string(m) == "async_posix" && timeline.contains("async_io_uring")) continue;
    auto rel = [&](Clock::time_point t) { return ms(t - seg->start); };
    json::array steps;
    Clock::time_point prev = seg->start;
    for (auto t : seg->step_end) {
      steps.push_back(json::array{rel(prev), rel(t)});
      prev = t;
    }
    json::array saves;
    for (const auto& one : seg->saves)
      for (const RankSave& rs : one) {
        const auto& x = rs.result;
        const double call = rel(rs.call);
        const double end = call + ms(x.total);
        // Exact where the timestamped file system saw the calls; otherwise the writes start
        // right after staging and fsync right after the later of write and hash.
        const double w0 = rs.timed ? rel(rs.write0) : call + ms(x.stall) + ms(x.stage);
        const double we = w0 + ms(x.write);
        const double f0 = rs.timed ? rel(rs.sync0) : w0 + std::max(ms(x.write), ms(x.hash));
        const double f1 = rs.timed ? rel(rs.close1) : f0 + ms(x.fsync);
        // The hash's start is not reported: if fsync waited past the write's end, the hash
        // was the later part and ended just before fsync; else it ran alongside the write.
        const bool hash_last = rs.timed && f0 - we > 1.0;
        const double h0 = hash_last ? std::max(w0, f0 - ms(x.hash)) : w0;
        saves.push_back(json::object{{"rank", rs.rank},
                                     {"step", rs.step},
                                     {"timed", rs.timed},
                                     {"blocked", json::array{call, rel(rs.ret)}},
                                     {"wait", json::array{call, call + ms(x.stall)}},
                                     {"stage", json::array{call + ms(x.stall), call + ms(x.stall) + ms(x.stage)}},
                                     {"write", json::array{w0, we}},
                                     {"hash", json::array{h0, h0 + ms(x.hash)}},
                                     {"fsync", json::array{f0, f1}},
                                     {"commit", json::array{end - ms(x.commit), end}}});
      }
    timeline[m] = json::object{{"mode", m},
                               {"repeat", seg->repeat},
                               {"duration_ms", rel(seg->step_end.back())},
                               {"steps", steps},
                               {"saves", saves}};
  }
  r["timeline"] = timeline;
  return ckpt::cli::with_schema(kJsonName, kJsonVersion, r);
}

}  // namespace bench
