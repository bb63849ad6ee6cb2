// SPDX-License-Identifier: Apache-2.0
// ckpt-redundancy-bench: what redundancy across node roots costs and what it buys, measured
// side by side in one run (the machine is shared and its disk varies between runs):
//
//   - bytes stored per byte of state: every file of a checkpoint across the node roots
//     (shards, parity or replicas; manifests left out), over the state's bytes;
//   - save time: one checkpoint of the whole state (4 ranks on 4 node roots, saved by a
//     Checkpointer: staged, written, hashed, committed), with each scheme against none,
//     rounds interleaved;
//   - recovery of one lost node (its checkpoint directory deleted): rebuilt from parity or
//     replicas by repair_node_checkpoint, against copying its shard back from a durable-tier
//     copy of the checkpoint (the same writer: XXH3 and SHA-256 as it goes, fsync); page
//     cache dropped for the files read (POSIX_FADV_DONTNEED) before each.
//
// Every node root and the durable copy are directories of one disk here: the recovery
// figures compare work (bytes read and written, decoding), not a network. Reported: medians
// over the rounds, and ratios per round.
//
//   ckpt-redundancy-bench [--size BYTES] [--rounds N] [--dir D] [--quick] [--json FILE]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/store/tiers.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "bench_support.hpp"

namespace fs = std::filesystem;
using namespace ckpt;
using namespace ckpt::bench;

namespace {

constexpr int kRanks = 4;

std::uint64_t stored_bytes(const fs::path& set, const std::string& name) {
  std::uint64_t sum = 0;
  for (const auto& n : fs::directory_iterator(set)) {
    const fs::path d = n.path() / name;
    if (!fs::exists(d)) continue;
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().filename() != kManifestName) sum += e.file_size();
  }
  return sum;
}

struct SchemeResult {
  std::string scheme;
  double stored_per_byte = 0;
  std::vector<double> save_s, save_ratio;      // per round; ratio against none in the same round
  std::vector<double> rebuild_s, copy_s, rebuild_ratio;  // recovery of node 1
  std::string rebuilt_from;
};

// One checkpoint of `state` (kRanks tensors) into the node set `set` with `scheme`; returns
// the seconds from the first save() to the last handle.
double save_once(const fs::path& set, const std::string& scheme, std::uint64_t step, const std::vector<std::vector<std::byte>>& state) {
  CheckpointerOptions o{.root = set.string(), .world_size = kRanks, .keep_last = 1};
  o.staging_bytes_per_rank = state[0].size() + (1u << 20);
  o.nodes = NodeOptions{.ranks_per_node = 1, .redundancy = *parse_redundancy(scheme)};
  Checkpointer c(std::move(o));
  const auto t0 = Clock::now();
  std::vector<std::thread> ranks;
  std::vector<SaveHandle> handles(kRanks);
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      std::vector<TensorView> t{{"state", DType::U8, {state[static_cast<std::size_t>(r)].size()}, std::span(state[static_cast<std::size_t>(r)])}};
      handles[static_cast<std::size_t>(r)] = c.save(r, step, t, {});
    });
  for (auto& t : ranks) t.join();
  for (auto& h : handles) h.wait();
  return seconds_since(t0);
}

int run(std::uint64_t size, int rounds, const fs::path& dir, const std::string& json_path) {
  const std::uint64_t per_rank = size / kRanks;
  const std::vector<std::vector<std::byte>> state = make_state(kRanks, per_rank);
  const std::vector<std::string> schemes = {"none", "rs:3+1", "rs:2+2", "replicate:2"};
  std::map<std::string, SchemeResult> results;
  for (const auto& s : schemes) results[s].scheme = s;
  std::printf("ckpt-redundancy-bench: %llu bytes of state, %d ranks on %d node roots under %s, %d rounds\n",
              static_cast<unsigned long long>(size), kRanks, kRanks, dir.c_str(), rounds);
  for (int round = 0; round < rounds; ++round) {
    std::map<std::string, double> save;
    // Interleaved: every scheme once per round, the order rotated so none goes first always.
    for (std::size_t i = 0; i < schemes.size(); ++i) {
      const std::string& s = schemes[(i + static_cast<std::size_t>(round)) % schemes.size()];
      const fs::path set = dir / ("set-" + std::to_string(round) + "-" + std::to_string(i));
      const std::uint64_t step = 10;
      save[s] = save_once(set, s, step, state);
      const std::string name = checkpoint_dir_name(step);
      auto& res = results[s];
      res.stored_per_byte = static_cast<double>(stored_bytes(set, name)) / static_cast<double>(per_rank * kRanks);
      if (s != "none") {
        // The durable copy (shards only), then node 1 lost.
        const fs::path durable = dir / ("durable-" + std::to_string(round) + "-" + std::to_string(i));
        copy_checkpoint(posix_file_system(), (set / "node-0").string(), step, posix_file_system(), durable.string(), Verify::fast);
        const std::vector<std::string> roots = node_root_paths(set.string(), kRanks);
        const fs::path lost = set / "node-1" / name;
        const auto original = fs::file_size(lost / shard_file_name(1, kRanks));
        fs::remove_all(lost);
        drop_cache(set);
        auto t0 = Clock::now();
        const auto rep = repair_node_checkpoint(posix_file_system(), roots, name, Verify::fast);
        res.rebuild_s.push_back(seconds_since(t0));
        if (!rep.lines.empty()) res.rebuilt_from = rep.lines.front();
        if (fs::file_size(lost / shard_file_name(1, kRanks)) != original) throw Error(Errc::size_mismatch, lost.string(), "rebuilt shard");
        // The same shard copied back from the durable tier, through the same writer.
        fs::remove(lost / shard_file_name(1, kRanks));
        drop_cache(durable);
        t0 = Clock::now();
        {
          const CheckpointReader src = CheckpointReader::open(posix_file_system(), (durable / name).string());
          const ShardRecord& rec = src.manifest().shard(1);
          auto in = std::shared_ptr<ReadableFile>(posix_file_system().open_read(src.shard_path(1)));
          const auto got = write_file_from(
              posix_file_system(), lost.string(), rec.path, rec.size, [&](std::uint64_t off, std::span<std::byte> out) { in->read_at(off, out); },
              src.manifest().chunk_size);
          if (got.sha256 != rec.sha256) throw Error(Errc::checksum_mismatch, lost.string(), "copied shard");
        }
        res.copy_s.push_back(seconds_since(t0));
        res.rebuild_ratio.push_back(res.rebuild_s.back() / res.copy_s.back());
        fs::remove_all(durable);
      }
      fs::remove_all(set);
    }
    for (const auto& s : schemes) {
      results[s].save_s.push_back(save[s]);
      results[s].save_ratio.push_back(save[s] / save["none"]);
    }
  }
  std::printf("\n%-12s %14s %22s %26s %28s\n", "scheme", "stored/state", "save s (x none)", "rebuild node 1 from it s", "copy it back from durable s");
  for (const auto& s : schemes) {
    const auto& r = results[s];
    char save[64], rebuild[64] = "-", copy[64] = "-";
    std::snprintf(save, sizeof save, "%.3f (%.2fx)", median(r.save_s), median(r.save_ratio));
    if (!r.rebuild_s.empty()) {
      std::snprintf(rebuild, sizeof rebuild, "%.3f (%.2fx the copy)", median(r.rebuild_s), median(r.rebuild_ratio));
      std::snprintf(copy, sizeof copy, "%.3f", median(r.copy_s));
    }
    std::printf("%-12s %14.4f %22s %26s %28s\n", s.c_str(), r.stored_per_byte, save, rebuild, copy);
  }
  for (const auto& s : schemes)
    if (!results[s].rebuilt_from.empty()) std::printf("  %s: %s\n", s.c_str(), results[s].rebuilt_from.c_str());
  if (!json_path.empty()) {
    boost::json::array arr;
    for (const auto& s : schemes) {
      const auto& r = results[s];
      arr.push_back(boost::json::object{{"scheme", s},
                                        {"stored_per_byte", r.stored_per_byte},
                                        {"save_s", json_figures(r.save_s)},
                                        {"save_ratio_vs_none", json_figures(r.save_ratio)},
                                        {"rebuild_s", json_figures(r.rebuild_s)},
                                        {"copy_from_durable_s", json_figures(r.copy_s)},
                                        {"rebuild_ratio_vs_copy", json_figures(r.rebuild_ratio)}});
    }
    write_json(json_path, "ckpt-redundancy-bench", 1, {{"state_bytes", size}, {"rounds", rounds}, {"schemes", arr}});
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* name = "ckpt-redundancy-bench";
  return cli::guarded_main(name, [&] {
    BenchArgs a{.size = 1ull << 30};
    if (const auto rc = parse_bench_args(argc, argv, name,
                                         "Redundancy across node roots: bytes stored, save time, and recovery of a lost node against a copy from the durable tier",
                                         a))
      return *rc;
    return run_in_scratch(name, a, [&](const fs::path& dir) { return run(a.size, a.rounds, dir, a.json); });
  });
}
