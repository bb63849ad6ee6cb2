// SPDX-License-Identifier: Apache-2.0
// ckpt-bench --quick, run as a user would: it must produce every figure (not particular
// values: this machine is shared and noisy) in its JSON, its table, its SVG and its markdown.
#include <doctest/doctest.h>
#include <liburing.h>

#include <boost/json.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "cli.hpp"
#include "support/json_doc.hpp"
#include "support/test_support.hpp"

namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

const std::string kBench = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt-bench";
const std::string kTool = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool io_uring_here() {
  io_uring ring;
  if (io_uring_queue_init(4, &ring, 0) < 0) return false;
  io_uring_queue_exit(&ring);
  return true;
}

// The value at a "/"-separated path, or nullptr.
const json::value* find(const json::value& root, const std::string& path) {
  const json::value* cur = &root;
  std::stringstream ss(path);
  for (std::string key; std::getline(ss, key, '/');) {
    if (!cur->is_object()) return nullptr;
    cur = cur->as_object().if_contains(key);
    if (!cur) return nullptr;
  }
  return cur;
}

struct QuickRun {
  ckpt::test::TempDir dir{"ckpt-bench-smoke"};
  int status = -1;
  std::string out;
  json::value doc;
  QuickRun() {
    const std::string d = dir.path().string();
    // --quick's 32 MiB, written as a fraction of a larger unit: sizes parse alike in every tool
    // (checked in the JSON below).
    out = ckpt::test::run_command(kBench + " --quick --size 0.03125G --dir " + d + "/run --json " + d + "/b.json --plot " + d +
                                      "/b.svg --markdown " + d + "/b.md --layout " + d + "/layout.json 2>&1",
                                  &status);
    if (status == 0) doc = json::parse(slurp(dir / "b.json"));
  }
};

QuickRun& quick_run() {
  static QuickRun run;  // one run serves every case
  return run;
}

}  // namespace

TEST_CASE("ckpt-bench --quick exits 0 and prints the table with its targets") {
  REQUIRE_MESSAGE(fs::exists(kBench), "build the ckpt_bench target first: " << kBench);
  auto& r = quick_run();
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("references, same run") != std::string::npos);
  CHECK(r.out.find("targets (exit code unaffected)") != std::string::npos);
  CHECK((r.out.find("PASS") != std::string::npos || r.out.find("FAIL") != std::string::npos));
}

TEST_CASE("ckpt-bench --json carries its schema first and exactly the fields docs/json-output.md lists") {
  const QuickRun& r = quick_run();
  REQUIRE(r.status == 0);
  REQUIRE(r.doc.is_object());
  ckpt::test::check_documented_output(r.doc.as_object(), "ckpt-bench", {"async"});  // --quick runs the async modes too
}

TEST_CASE("ckpt-bench --render refuses a file of another schema, naming it and the schema it reads") {
  ckpt::test::TempDir dir;
  for (const std::string& text : {std::string(R"({"schema": "ckpt-bench/2", "config": {}})"), std::string(R"({"config": {}})")}) {
    CAPTURE(text);
    std::ofstream(dir / "old.json") << text;
    int status = 0;
    const std::string out = ckpt::test::run_command(kBench + " --render " + (dir / "old.json").string() + " 2>&1", &status);
    CAPTURE(out);
    CHECK(status == 1);
    CHECK(out.find((dir / "old.json").string() + ": schema ") != std::string::npos);
    CHECK(out.find("expected \"ckpt-bench/1\"") != std::string::npos);
  }
}

TEST_CASE("ckpt-bench --json holds every figure of every mode") {
  REQUIRE(fs::exists(kBench));
  auto& r = quick_run();
  REQUIRE(r.status == 0);
  std::vector<std::string> modes = {"none", "sync", "async_posix"};
  if (io_uring_here()) modes.push_back("async_io_uring");
  std::vector<std::string> numbers = {
      "config/ranks", "config/state_bytes", "config/checkpoint_bytes", "config/compute_passes", "machine/nproc",
      "references/raw_write_gbps/median", "references/raw_read_gbps/median", "references/memcpy_rank_alone_ms/median",
      "references/memcpy_rank_all_ranks_ms/median", "references/memcpy_first_touch_gbps", "references/xxh3_gbps",
      "references/sha256_gbps", "cold_pool/first_stall_ms", "cold_pool/second_stall_ms", "load/none/gbps/median",
      "load/fast/gbps/median", "load/full/gbps/median", "load/full_bound_gbps", "soak/peak_extra_ratio", "soak/growth_bytes",
      "ratios/sync_over_async_stall", "ratios/load_fast_over_raw_read", "ratios/load_full_over_bound",
      "load/into_none/gbps/median", "load/into_fast/gbps/median", "load/into_full/gbps/median", "load/into_fast/minor_faults_per_gib",
      "ratios/load_into_fast_over_raw_read", "ratios/load_into_full_over_bound",
      // The hashing bound: SHA-256 x cores beside the raw disk, for sync, async and loads.
      "hashing_bound/sha256_gbps", "hashing_bound/cores", "hashing_bound/sync_cores", "hashing_bound/sync_sha256_gbps",
      "hashing_bound/raw_write_gbps", "hashing_bound/sync_bound_gbps", "hashing_bound/sync_idle_cores", "hashing_bound/load_bound_gbps",
      "hashing_bound/async_posix_idle_cores", "hashing_bound/async_posix_cores", "hashing_bound/async_posix_bound_gbps",
      "ratios/persist_over_hash_bound_sync", "modes/sync/idle_cores_while_persisting",
      // Deferred staging, both models of forward + backward.
      "deferred_staging/accelerator/stall_ms/median", "deferred_staging/accelerator/save_ms/median",
      "deferred_staging/accelerator/fence_ms/median", "deferred_staging/accelerator/compute_ms/median",
      "deferred_staging/accelerator/stage_ms/median", "deferred_staging/cpu/stall_ms/median", "deferred_staging/cpu/compute_ms/median",
      "ratios/deferred_stall_over_memcpy_all_ranks_accelerator", "ratios/deferred_stall_over_memcpy_all_ranks_cpu",
      // MappedShard: one small tensor, and everything.
      "load/mapped/gbps/median", "load/mapped/minor_faults_per_gib", "ratios/load_mapped_over_raw_read",
      "load/mapped_one_tensor/ms/median", "load/mapped_one_tensor/tensor_bytes", "load/mapped_one_tensor/chunks_checked",
      "load/mapped_one_tensor/chunks_covering", "load/mapped_one_tensor/bytes_covering", "load/mapped_one_tensor/storage_bytes_read",
      "ratios/mapped_one_tensor_chunks_over_covering"};
  for (const auto& m : modes) {
    numbers.push_back("modes/" + m + "/step_ms");
    numbers.push_back("modes/" + m + "/writer_cpu_s");
    if (m == "none") continue;
    for (const char* k : {"stall_ms/min", "stall_ms/median", "stall_ms/p99", "steady_stall_ms/median", "first_save_stall_ms", "overhead",
                          "durable_ms/median", "persist_gbps/median", "peak_extra_bytes", "peak_extra_ratio", "writer_cpu_s_per_save",
                          "phases_median_ms/stage", "phases_median_ms/write", "phases_median_ms/hash", "phases_median_ms/fsync",
                          "phases_median_ms/commit", "commit_breakdown_median_ms/sync_dir"})
      numbers.push_back("modes/" + m + "/" + k);
    if (m != "sync") {
      numbers.push_back("ratios/stall_over_memcpy_all_ranks_" + m);
      numbers.push_back("ratios/persist_over_raw_write_" + m);
    }
  }
  for (const auto& p : numbers) {
    const json::value* v = find(r.doc, p);
    CHECK_MESSAGE(v, "missing: " << p);
    if (v) CHECK_MESSAGE(v->is_number(), "not a number: " << p << " = " << json::serialize(*v));
  }
  const json::value* targets = find(r.doc, "targets");
  REQUIRE(targets);
  REQUIRE(targets->is_array());
  std::set<std::string> ids;
  for (const auto& t : targets->as_array()) {
    ids.insert(std::string(t.at("id").as_string()));
    CHECK(t.at("pass").is_bool());
    CHECK(t.at("text").is_string());
    CHECK(t.at("threshold").is_number());
    CHECK((t.at("value").is_number() || t.at("value").is_null()));
  }
  for (const char* id : {"async_stall_posix", "async_overhead_posix", "persist_bandwidth_posix", "load_fast", "load_full", "load_into_fast",
                         "load_into_full", "memory_peak", "memory_flat", "sync_persist", "deferred_stall", "deferred_stall_cpu",
                         "mapped_one_tensor"})
    CHECK_MESSAGE(ids.count(id), "target missing: " << id);
  if (io_uring_here())
    for (const char* id : {"async_stall", "async_overhead", "persist_bandwidth", "sync_over_async_stall"})
      CHECK_MESSAGE(ids.count(id), "target missing: " << id);
  if (io_uring_here())
    for (const char* p : {"hashing_bound/async_io_uring_cores", "hashing_bound/async_io_uring_bound_gbps"})
      CHECK_MESSAGE((find(r.doc, p) && find(r.doc, p)->is_number()), "missing: " << p);
  // Not timings: a view of one small tensor hashes only the chunks that cover it, whatever the
  // machine; the deferred saves kept their snapshot too (the loads read the last of them).
  const json::value* checked = find(r.doc, "load/mapped_one_tensor/chunks_checked");
  const json::value* covering = find(r.doc, "load/mapped_one_tensor/chunks_covering");
  REQUIRE((checked && covering));
  CHECK(checked->to_number<double>() >= 1);
  CHECK(checked->to_number<double>() <= covering->to_number<double>());
  REQUIRE(find(r.doc, "load/snapshot_isolated"));
  CHECK(find(r.doc, "load/snapshot_isolated")->as_bool());
  // Every rank's every deferred save of every round is counted.
  const double per_model = find(r.doc, "config/ranks")->to_number<double>() * find(r.doc, "config/repeats")->to_number<double>() *
                           find(r.doc, "config/saves_per_repeat")->to_number<double>();
  for (const char* model : {"accelerator", "cpu"})
    CHECK(find(r.doc, std::string("deferred_staging/") + model + "/saves")->to_number<double>() == per_model);
  CHECK(find(r.doc, "timeline/sync/steps"));
  REQUIRE(find(r.doc, "config/size_bytes"));
  CHECK(find(r.doc, "config/size_bytes")->to_number<std::uint64_t>() == 32ull << 20);  // --size 0.03125G
  CHECK(find(r.doc, "layout"));
}

TEST_CASE("ckpt-bench writes an SVG timeline, markdown tables and the tensor layout") {
  REQUIRE(fs::exists(kBench));
  auto& r = quick_run();
  REQUIRE(r.status == 0);
  const std::string svg = slurp(r.dir / "b.svg");
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(svg.find("synchronous save") != std::string::npos);
  CHECK(svg.find("asynchronous save") != std::string::npos);
  const std::string md = slurp(r.dir / "b.md");
  CHECK(md.find("| mode |") != std::string::npos);
  CHECK(md.find("| target |") != std::string::npos);
  CHECK(md.find("| verify fast, load_into owned memory |") != std::string::npos);
  CHECK(md.find("| verify fast, MappedShard of every tensor |") != std::string::npos);
  CHECK(md.find("| hashing bound of a save | value |") != std::string::npos);
  CHECK(md.find("| deferred staging | value |") != std::string::npos);
  CHECK(md.find("sync persist with both checksums") != std::string::npos);
  CHECK(md.find("deferred staging stall") != std::string::npos);
  CHECK(md.find("reading one small tensor from the checkpoint reads at most the chunks that cover it") != std::string::npos);
  const json::value layout = json::parse(slurp(r.dir / "layout.json"));
  REQUIRE(layout.is_array());
  CHECK(layout.as_array().size() == 4);
  // A saved JSON renders again without running.
  int status = -1;
  const std::string again = ckpt::test::run_command(kBench + " --render " + (r.dir / "b.json").string() + " 2>&1", &status);
  CHECK(status == 0);
  CHECK(again.find("targets (exit code unaffected)") != std::string::npos);
  // The run cleaned up its checkpoints.
  CHECK_FALSE(fs::exists(r.dir / "run" / "sync"));
}

TEST_CASE("a checkpoint ckpt-bench wrote consolidates under its global names and reshards to one that compares equal") {
  ckpt::test::TempDir dir{"ckpt-bench-tools"};
  const std::string d = dir.path().string();
  int status = -1;
  const std::string run = ckpt::test::run_command(
      kBench + " --quick --modes sync --no-load --no-cold-pool --soak 0 --repeats 1 --keep --dir " + d + "/run 2>&1", &status);
  INFO(run);
  REQUIRE(status == 0);
  const std::string root = d + "/run/sync";  // --keep left the sync mode's root
  REQUIRE(fs::exists(root + "/latest"));
  const std::string out = ckpt::test::run_command(kTool + " consolidate " + root + " " + d + "/model --json 2>&1", &status);
  INFO(out);
  REQUIRE(status == 0);
  const json::object res = json::parse(out).as_object();
  std::set<std::string> names;
  for (const auto& f : res.at("files").as_array())
    for (const auto& t : f.at("tensors").as_array()) names.insert(std::string(t.as_string()));
  CHECK(names.count("model.blocks.0.weight"));
  CHECK(names.count("model.layers.31.mlp.bias"));
  CHECK_FALSE(names.count("optimizer.master"));  // optimizer state: left out by default
  CHECK(res.at("left_out").to_number<int>() == 3);
  CHECK_FALSE(names.count("rng.state"));  // rank-local
  const std::string dst = d + "/eight";  // rank-local tensors stay on their ranks (r < 8)
  const std::string re = ckpt::test::run_command(kTool + " reshard " + root + " " + dst + " --world-size 8 2>&1", &status);
  INFO(re);
  REQUIRE(status == 0);
  const std::string diff = ckpt::test::run_command(kTool + " diff " + root + " " + dst + " 2>&1", &status);
  INFO(diff);
  CHECK(status == 0);
}

TEST_CASE("ckpt-bench refuses a malformed size, value or flag with exit 2 naming the option, before running anything") {
  REQUIRE(fs::exists(kBench));
  ckpt::test::TempDir dir{"ckpt-bench-usage"};
  const std::string d = dir.path().string();
  for (const std::string args : {"--size 1.5Q", "--size 1.5", "--chunk-size -4M", "--raw-piece 1000", "--ranks 0", "--modes sync,tape",
                                 "--step-ms soon", "--no-such-flag"}) {
    CAPTURE(args);
    int status = -1;
    const std::string out = ckpt::test::run_command(kBench + " --quick --dir " + d + "/run " + args + " 2>&1", &status);
    CHECK(status == 2);
    CHECK(out.find(args.substr(0, args.find(' '))) != std::string::npos);
    CHECK(out.find("run 'ckpt-bench --help' for usage") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(dir / "run"));
  int status = -1;
  CHECK(ckpt::test::run_command(kBench + " --version", &status) == "ckpt-bench " + std::string(ckpt::cli::version()) + "\n");
  CHECK(status == 0);
  const std::string help = ckpt::test::run_command(kBench + " --help", &status);
  CHECK(status == 0);
  CHECK(help.find("usage: ckpt-bench") == 0);
  CHECK(help.find("--size SIZE") != std::string::npos);
}
