// SPDX-License-Identifier: Apache-2.0
// The human table (stdout) and the markdown tables, both rendered from the results JSON.
#include <boost/json.hpp>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "bench.hpp"

namespace bench {

namespace json = boost::json;

namespace {

std::string f(double v, int prec = 2) {
  if (!std::isfinite(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

// The load figures: key in the results' "load" object, and its label.
const std::vector<std::pair<const char*, const char*>>& load_rows() {
  static const std::vector<std::pair<const char*, const char*>> rows = {
      {"none", "none"}, {"fast", "fast"}, {"full", "full"},
      {"raw_into", "raw read into load_into's memory (ref.)"},
      {"into_none", "none, load_into owned memory"}, {"into_fast", "fast, load_into owned memory"}, {"into_full", "full, load_into owned memory"},
      {"mapped", "fast, MappedShard of every tensor"}};
  return rows;
}

std::string printf_s(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string printf_s(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string str(const json::object& o, std::initializer_list<std::string_view> path) {
  const json::object* obj = &o;
  const json::value* cur = nullptr;
  for (auto k : path) {
    if (!obj) return "";
    cur = obj->if_contains(k);
    if (!cur) return "";
    obj = cur->is_object() ? &cur->get_object() : nullptr;
  }
  if (!cur) return "";
  if (cur->is_string()) return std::string(cur->get_string());
  if (cur->is_bool()) return cur->get_bool() ? "yes" : "no";
  return json::serialize(*cur);
}

double mib(double b) { return b / (1 << 20); }
double gib(double b) { return b / (1 << 30); }

std::vector<std::string> mode_names(const json::object& r) {
  std::vector<std::string> out;
  if (const auto* m = r.if_contains("modes"))
    for (const auto& kv : m->as_object()) out.emplace_back(kv.key());
  return out;
}

struct Row {
  std::string mode, stall_min, stall_med, stall_p99, step, overhead, durable, persist, persist_ratio, extra, cpu, cores;
};

Row mode_row(const json::object& r, const std::string& m) {
  const json::object& mo = r.at("modes").as_object().at(m).as_object();
  const double raw_w = json_at(r, {"references", "raw_write_gbps", "median"});
  Row row;
  row.mode = m;
  row.step = f(json_at(mo, {"step_ms"}), 1);
  row.cpu = f(json_at(mo, {"writer_cpu_s_per_save"}), 2);
  if (m == "none") {
    row.stall_min = row.stall_med = row.stall_p99 = row.overhead = row.durable = row.persist = row.persist_ratio = row.extra = row.cores = "-";
    return row;
  }
  row.stall_min = f(json_at(mo, {"stall_ms", "min"}), 1);
  row.stall_med = f(json_at(mo, {"steady_stall_ms", "median"}), 1);
  row.stall_p99 = f(json_at(mo, {"stall_ms", "p99"}), 1);
  const double ov = json_at(mo, {"overhead"});
  row.overhead = std::isfinite(ov) ? f(ov * 100, 1) + "%" : "-";
  row.durable = f(json_at(mo, {"durable_ms", "median"}), 0);
  const double p = json_at(mo, {"persist_gbps", "median"});
  row.persist = f(p, 2);
  row.persist_ratio = f(p / raw_w, 2);
  row.extra = f(json_at(mo, {"peak_extra_ratio"}), 2);
  row.cores = f(json_at(mo, {"writer_cores_while_persisting"}), 2);
  return row;
}

// The hashing bound, the deferred staging and the mapped one-tensor read, as (label, value)
// lines: the table and the markdown render the same rows.
std::vector<std::pair<std::string, std::string>> bound_rows(const json::object& r) {
  std::vector<std::pair<std::string, std::string>> rows;
  const auto* hv = r.if_contains("hashing_bound");
  if (!hv) return rows;
  const auto& h = hv->as_object();
  rows.emplace_back("SHA-256 of one core x cores (at most one per shard: a file's SHA-256 is sequential)",
                    f(json_at(h, {"sha256_gbps"})) + " GB/s x " + f(json_at(h, {"cores"}), 0) + " cores, " + f(json_at(h, {"shards"}), 0) +
                        " shards");
  rows.emplace_back("sync save: all cores, " + f(json_at(h, {"sync_cores"}), 0) + " hashing (measured free: idle " +
                        f(json_at(h, {"sync_idle_cores"})) + " + ckpt " + f(json_at(h, {"sync_writer_cores"})) + ")",
                    f(json_at(h, {"sync_sha256_gbps"})) +
                        " GB/s; raw write " + f(json_at(h, {"raw_write_gbps"})) + " GB/s; bound min(raw write, that) " +
                        f(json_at(h, {"sync_bound_gbps"})) + " GB/s");
  for (const char* m : {"async_io_uring", "async_posix"}) {
    const std::string k(m);
    if (!h.contains(k + "_cores")) continue;
    rows.emplace_back(k + ": idle " + f(json_at(h, {k + "_idle_cores"})) + " + writer " + f(json_at(h, {k + "_writer_cores"})) + " cores",
                      f(json_at(h, {k + "_sha256_gbps"})) + " GB/s; bound min(raw write, that) " + f(json_at(h, {k + "_bound_gbps"})) + " GB/s");
  }
  rows.emplace_back("load: " + f(json_at(h, {"load_cores"}), 0) + " cores hashing", "bound min(raw read " + f(json_at(h, {"raw_read_gbps"})) +
                                                                                      ", SHA-256 x cores) " + f(json_at(h, {"load_bound_gbps"})) +
                                                                                      " GB/s");
  return rows;
}

std::vector<std::pair<std::string, std::string>> deferred_rows(const json::object& r) {
  std::vector<std::pair<std::string, std::string>> rows;
  const auto* dv = r.if_contains("deferred_staging");
  if (!dv) return rows;
  for (const char* model : {"accelerator", "cpu"}) {
    const auto* mv = dv->as_object().if_contains(model);
    if (!mv) continue;
    const auto& d = mv->as_object();
    const std::string m(model);
    const std::string what = m == "cpu" ? "CPU forward + backward" : "forward + backward on an accelerator";
    rows.emplace_back(what + ": blocked per save, save() + wait_staged(), median / p99",
                      f(json_at(d, {"stall_ms", "median"})) + " / " + f(json_at(d, {"stall_ms", "p99"})) + " ms (save() " +
                          f(json_at(d, {"save_ms", "median"})) + ", fence " + f(json_at(d, {"fence_ms", "median"})) + ")");
    rows.emplace_back(what + ": its duration / the copy on ckpt's threads",
                      f(json_at(d, {"compute_ms", "median"}), 1) + " / " + f(json_at(d, {"stage_ms", "median"}), 1) + " ms");
    rows.emplace_back(what + ": blocked over memcpy of the rank's state, all ranks at once / alone",
                      f(json_at(r, {"ratios", "deferred_stall_over_memcpy_all_ranks_" + m}), 3) + " / " +
                          f(json_at(r, {"ratios", "deferred_stall_over_memcpy_alone_" + m}), 3));
  }
  return rows;
}

std::vector<std::pair<std::string, std::string>> mapped_rows(const json::object& r) {
  std::vector<std::pair<std::string, std::string>> rows;
  const auto* ov = r.if_contains("load");
  const auto* mv = ov ? ov->as_object().if_contains("mapped_one_tensor") : nullptr;
  if (!mv) return rows;
  const auto& m = mv->as_object();
  rows.emplace_back("one small tensor (" + str(m, {"tensor"}) + ", " + f(json_at(m, {"tensor_bytes"}), 0) + " bytes), open_latest to its bytes",
                    f(json_at(m, {"ms", "median"})) + " ms");
  rows.emplace_back("chunks checked / covering it; KiB read from storage / covering",
                    f(json_at(m, {"chunks_checked"}), 0) + " / " + f(json_at(m, {"chunks_covering"}), 0) + "; " +
                        f(json_at(m, {"storage_bytes_read"}) / 1024, 0) + " / " + f(json_at(m, {"bytes_covering"}) / 1024, 0));
  return rows;
}

}  // namespace

std::string render_table(const json::object& r) {
  std::string out;
  const auto& c = r.at("config").as_object();
  const auto& mach = r.at("machine").as_object();
  out += printf_s("ckpt-bench: %d ranks x %.1f MiB = %.2f GiB state (checkpoint %.2f GiB, %d tensors per rank)\n",
                  static_cast<int>(json_at(c, {"ranks"})), mib(json_at(c, {"rank_state_bytes"})), gib(json_at(c, {"state_bytes"})),
                  gib(json_at(c, {"checkpoint_bytes"})), static_cast<int>(json_at(c, {"tensors_per_rank"})));
  out += printf_s("  %d rounds x %d saves per mode, a save every %d steps of ~%.0f ms compute (%d passes over %.0f MiB per rank)\n",
                  static_cast<int>(json_at(c, {"repeats"})), static_cast<int>(json_at(c, {"saves_per_repeat"})),
                  static_cast<int>(json_at(c, {"every_steps"})), json_at(c, {"step_ms_target"}),
                  static_cast<int>(json_at(c, {"compute_passes"})), json_at(c, {"compute_mb_per_rank"}));
  out += printf_s("  machine: %d x %s, Linux %s, %.1f GiB RAM; %s on %s; run took %.0f s\n", static_cast<int>(json_at(mach, {"nproc"})),
                  str(mach, {"cpu_model"}).c_str(), str(mach, {"kernel"}).c_str(), gib(json_at(mach, {"mem_total_bytes"})),
                  str(c, {"dir"}).c_str(), str(mach, {"filesystem"}).c_str(), json_at(c, {"wall_seconds"}));

  out += printf_s("  contention: other processes used %.0f%% of the machine's CPU during the run (load average %s at start, %s at end)\n",
                  json_at(mach, {"other_processes_cpu_share"}) * 100, str(mach, {"loadavg_start"}).c_str(), str(mach, {"loadavg_end"}).c_str());
  const auto& ref = r.at("references").as_object();
  out += "\nreferences, same run (median over rounds)\n";
  out += printf_s("  raw write, O_DIRECT %s qd %d x %.0f MiB, fsync   %7s GB/s  (min %s, max %s)\n", str(ref, {"raw_engine"}).c_str(),
                  static_cast<int>(json_at(c, {"raw_queue_depth"})), mib(json_at(c, {"raw_piece"})),
                  f(json_at(ref, {"raw_write_gbps", "median"})).c_str(), f(json_at(ref, {"raw_write_gbps", "min"})).c_str(),
                  f(json_at(ref, {"raw_write_gbps", "max"})).c_str());
  out += printf_s("  raw read, same loop                              %7s GB/s  (min %s, max %s)\n",
                  f(json_at(ref, {"raw_read_gbps", "median"})).c_str(), f(json_at(ref, {"raw_read_gbps", "min"})).c_str(),
                  f(json_at(ref, {"raw_read_gbps", "max"})).c_str());
  out += printf_s("  raw read into fresh memory (first touch)         %7s GB/s\n", f(json_at(ref, {"raw_read_fresh_memory_gbps"})).c_str());
  out += printf_s("  memcpy of a rank's state, alone                  %7s ms    (%s GB/s)\n",
                  f(json_at(ref, {"memcpy_rank_alone_ms", "median"}), 1).c_str(), f(json_at(ref, {"memcpy_warm_gbps"})).c_str());
  out += printf_s("  memcpy of a rank's state, all ranks at once      %7s ms\n",
                  f(json_at(ref, {"memcpy_rank_all_ranks_ms", "median"}), 1).c_str());
  out += printf_s("  memcpy into fresh memory (first touch)           %7s GB/s\n", f(json_at(ref, {"memcpy_first_touch_gbps"})).c_str());
  out += printf_s("  XXH3, one core (%s)                            %7s GB/s\n", str(mach, {"xxh3_kernel"}).c_str(),
                  f(json_at(ref, {"xxh3_gbps"})).c_str());
  out += printf_s("  SHA-256, one core                                %7s GB/s\n", f(json_at(ref, {"sha256_gbps"})).c_str());

  auto section = [&out](const char* title, const std::vector<std::pair<std::string, std::string>>& rows) {
    if (rows.empty()) return;
    out += printf_s("\n%s\n", title);
    for (const auto& [k, v] : rows) out += printf_s("  %-78s %s\n", k.c_str(), v.c_str());
  };
  section("hashing bound of a save (SHA-256 x the cores it can hash on, against the raw disk)", bound_rows(r));
  out += "\nsaves            stall ms per save       step    step      durable  persist  persist  peak extra  writer CPU\n";
  out += "                 min    steady  p99      ms      overhead  ms       GB/s     /raw wr  x ckpt      s/save cores\n";
  for (const auto& m : mode_names(r)) {
    const Row w = mode_row(r, m);
    out += printf_s("  %-14s %-6s %-7s %-8s %-7s %-9s %-8s %-8s %-8s %-11s %-6s %s\n", w.mode.c_str(), w.stall_min.c_str(), w.stall_med.c_str(),
                    w.stall_p99.c_str(), w.step.c_str(), w.overhead.c_str(), w.durable.c_str(), w.persist.c_str(), w.persist_ratio.c_str(),
                    w.extra.c_str(), w.cpu.c_str(), w.cores.c_str());
  }
  out += "\nphases, median ms per rank   wait    stage   write   hash    fsync   commit  total\n";
  for (const auto& m : mode_names(r)) {
    if (m == "none") continue;
    const auto& mo = r.at("modes").as_object().at(m).as_object();
    out += printf_s("  %-27s %-7s %-7s %-7s %-7s %-7s %-7s %s\n", m.c_str(), f(json_at(mo, {"stall_wait_ms", "median"}), 1).c_str(),
                    f(json_at(mo, {"phases_median_ms", "stage"}), 1).c_str(), f(json_at(mo, {"phases_median_ms", "write"}), 1).c_str(),
                    f(json_at(mo, {"phases_median_ms", "hash"}), 1).c_str(), f(json_at(mo, {"phases_median_ms", "fsync"}), 1).c_str(),
                    f(json_at(mo, {"phases_median_ms", "commit"}), 1).c_str(), f(json_at(mo, {"phases_median_ms", "total"}), 1).c_str());
  }
  out += "\ncommit, median ms per file-system call kind (rotation runs after the handles complete, off the commit)\n";
  for (const auto& m : mode_names(r)) {
    if (m == "none") continue;
    const auto* cb = r.at("modes").as_object().at(m).as_object().if_contains("commit_breakdown_median_ms");
    if (!cb) continue;
    const auto& mo = r.at("modes").as_object().at(m).as_object();
    out += printf_s("  %s: durable after %s ms, handles complete after %s ms (+%s ms: delivery), rotation starts %s ms after the handles complete\n",
                    m.c_str(), f(json_at(mo, {"durable_ms", "median"}), 0).c_str(), f(json_at(mo, {"complete_ms", "median"}), 0).c_str(),
                    f(json_at(mo, {"after_durable_ms", "median"}), 0).c_str(),
                    f(json_at(mo, {"rotation_after_complete_ms", "median"}), 1).c_str());
    std::string line = "    ";
    for (const auto& kv : cb->as_object())
      if (kv.value().to_number<double>() >= 0.05) {
        line += ' ';
        line += kv.key();
        line += ' ';
        line += f(kv.value().to_number<double>(), 1);
        line += ',';
      }
    line.back() = '\n';
    out += line;
  }
  out += "\nfirst save vs steady state (stall ms, median over ranks)\n";
  if (const auto* cp = r.if_contains("cold_pool"); cp && !cp->as_object().empty()) {
    const auto& o = cp->as_object();
    out += printf_s("  staging pool allocated inside the first save(): first %s ms (stage %s), second %s ms: %sx\n",
                    f(json_at(o, {"first_stall_ms"}), 1).c_str(), f(json_at(o, {"first_stage_ms"}), 1).c_str(),
                    f(json_at(o, {"second_stall_ms"}), 1).c_str(), f(json_at(o, {"first_over_second"}), 1).c_str());
  }
  for (const auto& m : mode_names(r)) {
    if (m == "none") continue;
    const auto& mo = r.at("modes").as_object().at(m).as_object();
    out += printf_s("  %-15s pre-faulted pool: first save %s ms, steady median %s ms\n", m.c_str(),
                    f(json_at(mo, {"first_save_stall_ms"}), 1).c_str(), f(json_at(mo, {"steady_stall_ms", "median"}), 1).c_str());
  }
  section("deferred staging (save(..., Staging::deferred), the step's compute, wait_staged())", deferred_rows(r));
  if (const auto* l = r.if_contains("load"); l && !l->as_object().empty()) {
    const auto& lo = l->as_object();
    out += printf_s("\nload, %d ranks in parallel, page cache dropped   GB/s    /raw read  minor faults per GiB\n",
                    static_cast<int>(json_at(c, {"ranks"})));
    for (const auto& [v, label] : load_rows())
      out += printf_s("  verify %-40s %-7s %-10s %s\n", label, f(json_at(lo, {v, "gbps", "median"})).c_str(), f(json_at(lo, {v, "over_raw_read"})).c_str(),
                      f(json_at(lo, {v, "minor_faults_per_gib"}), 0).c_str());
    if (lo.contains("into_engine")) out += printf_s("  load_into read with %s\n", str(lo, {"into_engine"}).c_str());
    out += printf_s("  full-verify bound min(raw read, SHA-256 x cores)  %s GB/s\n", f(json_at(lo, {"full_bound_gbps"})).c_str());
    for (const auto& [k, v] : mapped_rows(r)) out += printf_s("  mapped: %-70s %s\n", k.c_str(), v.c_str());
    out += printf_s("  snapshot isolation (optimizer.step of every loaded shard = the checkpoint's step, although the rank\n"
                    "  overwrote it right after save() returned): %s over %d shards\n",
                    str(lo, {"snapshot_isolated"}) == "yes" ? "held" : "BROKEN", static_cast<int>(json_at(lo, {"snapshot_checks"})));
  }
  if (const auto* s = r.if_contains("soak"); s && !s->as_object().empty()) {
    const auto& so = s->as_object();
    out += printf_s("\nsoak: %d back-to-back saves (%s): peak extra %.0f MiB = %sx checkpoint; RSS growth save %d..%d: %.1f MiB\n",
                    static_cast<int>(json_at(so, {"saves"})), str(so, {"mode"}).c_str(), mib(json_at(so, {"peak_extra_bytes"})),
                    f(json_at(so, {"peak_extra_ratio"})).c_str(), static_cast<int>(json_at(so, {"growth_from_save"})),
                    static_cast<int>(json_at(so, {"saves"})), mib(json_at(so, {"growth_bytes"})));
  }
  out += "\ntargets (exit code unaffected)\n";
  for (const auto& t : r.at("targets").as_array()) {
    const auto& o = t.as_object();
    const bool pass = o.at("pass").as_bool();
    out += printf_s("  %s  %-72s %s (%s %s)\n", pass ? "PASS" : "FAIL", str(o, {"text"}).c_str(), f(json_at(o, {"value"}), 3).c_str(),
                    str(o, {"op"}).c_str(), f(json_at(o, {"threshold"}), 2).c_str());
    out += "        " + str(o, {"note"}) + "\n";
  }
  return out;
}

std::string render_markdown(const json::object& r) {
  std::string out;
  const auto& c = r.at("config").as_object();
  const auto& ref = r.at("references").as_object();
  out += printf_s("Workload: %d rank threads x %.1f MiB = %.2f GiB of state (%d tensors per rank: bf16 and fp32 matrices, many small "
                  "tensors), %d rounds x %d saves per mode, a save every %d steps of ~%.0f ms of compute. Run took %.0f s.\n\n",
                  static_cast<int>(json_at(c, {"ranks"})), mib(json_at(c, {"rank_state_bytes"})), gib(json_at(c, {"state_bytes"})),
                  static_cast<int>(json_at(c, {"tensors_per_rank"})), static_cast<int>(json_at(c, {"repeats"})),
                  static_cast<int>(json_at(c, {"saves_per_repeat"})), static_cast<int>(json_at(c, {"every_steps"})),
                  json_at(c, {"step_ms_target"}), json_at(c, {"wall_seconds"}));
  {
    const auto& mach = r.at("machine").as_object();
    out += printf_s("Contention: other processes used %.0f%% of the machine's CPU during this run (load average %s at start, %s at end); "
                    "the disk references are barely affected by that, the CPU-bound figures (hashing, copies) are.\n\n",
                    json_at(mach, {"other_processes_cpu_share"}) * 100, str(mach, {"loadavg_start"}).c_str(), str(mach, {"loadavg_end"}).c_str());
  }
  out += "| reference (same run, median) | value |\n|---|---|\n";
  out += "| raw O_DIRECT write (" + str(ref, {"raw_engine"}) + ", fsync) | " + f(json_at(ref, {"raw_write_gbps", "median"})) + " GB/s (" +
         f(json_at(ref, {"raw_write_gbps", "min"})) + "-" + f(json_at(ref, {"raw_write_gbps", "max"})) + ") |\n";
  out += "| raw O_DIRECT read | " + f(json_at(ref, {"raw_read_gbps", "median"})) + " GB/s (" + f(json_at(ref, {"raw_read_gbps", "min"})) + "-" +
         f(json_at(ref, {"raw_read_gbps", "max"})) + ") |\n";
  out += "| raw O_DIRECT read into fresh memory (first touch) | " + f(json_at(ref, {"raw_read_fresh_memory_gbps"})) + " GB/s |\n";
  out += "| memcpy of a rank's state: alone / all ranks at once | " + f(json_at(ref, {"memcpy_rank_alone_ms", "median"}), 1) + " ms / " +
         f(json_at(ref, {"memcpy_rank_all_ranks_ms", "median"}), 1) + " ms |\n";
  out += "| memcpy warm / into fresh memory (first touch) | " + f(json_at(ref, {"memcpy_warm_gbps"})) + " / " +
         f(json_at(ref, {"memcpy_first_touch_gbps"})) + " GB/s |\n";
  out += "| XXH3 / SHA-256, one core | " + f(json_at(ref, {"xxh3_gbps"})) + " / " + f(json_at(ref, {"sha256_gbps"})) + " GB/s |\n\n";

  auto md_section = [&out](const char* title, const std::vector<std::pair<std::string, std::string>>& rows) {
    if (rows.empty()) return;
    out += std::string("| ") + title + " | value |\n|---|---|\n";
    for (const auto& [k, v] : rows) out += "| " + k + " | " + v + " |\n";
    out += "\n";
  };
  md_section("hashing bound of a save", bound_rows(r));
  md_section("deferred staging", deferred_rows(r));
  out += "| mode | stall min / steady median / p99 (ms) | step ms | overhead | durable ms | persist GB/s | persist / raw write | peak extra mem (x ckpt) | writer CPU s/save |\n";
  out += "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& m : mode_names(r)) {
    const Row w = mode_row(r, m);
    out += "| " + w.mode + " | " + w.stall_min + " / " + w.stall_med + " / " + w.stall_p99 + " | " + w.step + " | " + w.overhead + " | " + w.durable +
           " | " + w.persist + " | " + w.persist_ratio + " | " + w.extra + " | " + w.cpu + " |\n";
  }
  out += "\n| phases, median ms per rank | wait | stage | write | hash | fsync | commit | total |\n|---|---|---|---|---|---|---|---|\n";
  for (const auto& m : mode_names(r)) {
    if (m == "none") continue;
    const auto& mo = r.at("modes").as_object().at(m).as_object();
    out += "| " + m + " | " + f(json_at(mo, {"stall_wait_ms", "median"}), 1) + " | " + f(json_at(mo, {"phases_median_ms", "stage"}), 1) + " | " +
           f(json_at(mo, {"phases_median_ms", "write"}), 1) + " | " + f(json_at(mo, {"phases_median_ms", "hash"}), 1) + " | " +
           f(json_at(mo, {"phases_median_ms", "fsync"}), 1) + " | " + f(json_at(mo, {"phases_median_ms", "commit"}), 1) + " | " +
           f(json_at(mo, {"phases_median_ms", "total"}), 1) + " |\n";
  }
  out += "\n| commit | durable / handles complete (ms) | median ms per file-system call kind in the commit (rotation runs after the handles complete) |\n|---|---|---|\n";
  for (const auto& m : mode_names(r)) {
    if (m == "none") continue;
    const auto* cb = r.at("modes").as_object().at(m).as_object().if_contains("commit_breakdown_median_ms");
    if (!cb) continue;
    std::string line;
    for (const auto& kv : cb->as_object())
      if (kv.value().to_number<double>() >= 0.05) {
        if (!line.empty()) line += ", ";
        line += kv.key();
        line += ' ';
        line += f(kv.value().to_number<double>(), 1);
      }
    const auto& mo = r.at("modes").as_object().at(m).as_object();
    out += "| " + m + " | " + f(json_at(mo, {"durable_ms", "median"}), 0) + " / " + f(json_at(mo, {"complete_ms", "median"}), 0) + " | " + line +
           " |\n";
  }
  out += "\n| first save vs steady state | stall ms |\n|---|---|\n";
  if (const auto* cp = r.if_contains("cold_pool"); cp && !cp->as_object().empty()) {
    const auto& o = cp->as_object();
    out += "| staging pool allocated inside the first save(): first / second save | " + f(json_at(o, {"first_stall_ms"}), 1) + " / " +
           f(json_at(o, {"second_stall_ms"}), 1) + " |\n";
  }
  for (const auto& m : mode_names(r)) {
    if (m == "none") continue;
    const auto& mo = r.at("modes").as_object().at(m).as_object();
    out += "| " + m + ", pre-faulted pool: first / steady median | " + f(json_at(mo, {"first_save_stall_ms"}), 1) + " / " +
           f(json_at(mo, {"steady_stall_ms", "median"}), 1) + " |\n";
  }
  if (const auto* l = r.if_contains("load"); l && !l->as_object().empty()) {
    const auto& lo = l->as_object();
    out += "\n| load, ranks in parallel, page cache dropped | GB/s | / raw read | minor faults per GiB |\n|---|---|---|---|\n";
    for (const auto& [v, label] : load_rows())
      out += std::string("| verify ") + label + " | " + f(json_at(lo, {v, "gbps", "median"})) + " | " + f(json_at(lo, {v, "over_raw_read"})) + " | " +
             f(json_at(lo, {v, "minor_faults_per_gib"}), 0) + " |\n";
  }
  if (const auto rows = mapped_rows(r); !rows.empty()) {
    out += "\n";
    md_section("mapped read of one tensor (MappedShard, verify fast, page cache dropped)", rows);
  }
  if (const auto* l = r.if_contains("load"); l && !l->as_object().empty())
    out += "\nSnapshot isolation (optimizer.step of every loaded shard equals the checkpoint's step although each rank overwrote it right "
           "after save() returned): " + std::string(str(l->as_object(), {"snapshot_isolated"}) == "yes" ? "held" : "**BROKEN**") + ".\n";
  if (const auto* s = r.if_contains("soak"); s && !s->as_object().empty()) {
    const auto& so = s->as_object();
    out += printf_s("\nSoak: %d back-to-back async saves: peak extra memory %.0f MiB = %sx one checkpoint; RSS growth from save %d to %d: "
                    "%.1f MiB.\n",
                    static_cast<int>(json_at(so, {"saves"})), mib(json_at(so, {"peak_extra_bytes"})), f(json_at(so, {"peak_extra_ratio"})).c_str(),
                    static_cast<int>(json_at(so, {"growth_from_save"})), static_cast<int>(json_at(so, {"saves"})),
                    mib(json_at(so, {"growth_bytes"})));
  }
  out += "\n| target | value | threshold | result | measured |\n|---|---|---|---|---|\n";
  for (const auto& t : r.at("targets").as_array()) {
    const auto& o = t.as_object();
    out += "| " + str(o, {"text"}) + " | " + f(json_at(o, {"value"}), 3) + " | " + str(o, {"op"}) + " " + f(json_at(o, {"threshold"}), 2) + " | " +
           (o.at("pass").as_bool() ? "PASS" : "**FAIL**") + " | " + str(o, {"note"}) + " |\n";
  }
  return out;
}

}  // namespace bench
