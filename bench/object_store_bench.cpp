// SPDX-License-Identifier: Apache-2.0
// ckpt-object-store-bench: the durable tier on an object store against the directory tier on
// the local disk, measured side by side in one run (the machine is shared and varies):
//
//   - upload: one committed 4-rank checkpoint of the state committed to the object store
//     (commit_to_object_store: parts in flight, every chunk's XXH3 checked, Content-MD5) and
//     copied to a durable directory on the local disk (copy_checkpoint: the same checks,
//     fsync), rounds interleaved;
//   - resume: the local root deleted, then rehydrated from the object store
//     (restore_from_object_store, Verify::fast) and from the durable directory (copy_checkpoint
//     back), each followed by the same open and full verification.
//
// The object store is the one AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
// AWS_REGION name (scripts/rgw start DIR writes them to DIR/env), under s3://BUCKET/<a fresh
// prefix>, removed at the end. Reported: medians over the rounds, MiB/s, and ratios per round.
//
//   ckpt-object-store-bench --bucket B [--size BYTES] [--rounds N] [--dir D] [--quick] [--json FILE]
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/objstore/s3.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/store/tiers.hpp"
#include "bench_support.hpp"

namespace fs = std::filesystem;
using namespace ckpt;
using namespace ckpt::bench;

namespace {

constexpr int kRanks = 4;

int run(const std::string& bucket, std::uint64_t size, int rounds, const fs::path& dir, const std::string& json_path) {
  // The state: 4 ranks of size/4 bytes each, one U8 tensor per rank, deterministic bytes.
  const std::uint64_t per_rank = size / kRanks;
  const std::vector<std::vector<std::byte>> data = make_state(kRanks, per_rank);
  SaveRequest req;
  req.param_numel = per_rank * kRanks;
  for (int r = 0; r < kRanks; ++r) {
    RankState rs;
    rs.tensors.push_back({"state", DType::U8, {per_rank}, data[static_cast<std::size_t>(r)]});
    rs.param_shard_offset = per_rank * static_cast<std::uint64_t>(r);
    rs.param_shard_numel = per_rank;
    req.ranks.push_back(std::move(rs));
  }
  S3Options s3;
  s3.root = "s3://" + bucket + "/ckpt-object-store-bench-" + std::to_string(::getpid()) + "-" +
            std::to_string(Clock::now().time_since_epoch().count());
  const auto store = open_s3(s3);
  const double mib = static_cast<double>(per_rank * kRanks) / (1 << 20);
  std::vector<double> up_s3, up_dir, up_ratio, back_s3, back_dir, back_ratio;
  std::printf("ckpt-object-store-bench: %d ranks x %.1f MiB, %d rounds, object store %s\n", kRanks, mib / kRanks, rounds, s3.root.c_str());
  FileSystem& fs = posix_file_system();
  for (int round = 0; round < rounds; ++round) {
    const std::uint64_t step = static_cast<std::uint64_t>(round + 1);
    req.step = step;
    const fs::path local = dir / "local", durable = dir / "durable", restored = dir / "restored";
    save_checkpoint_sync(fs, local.string(), req);
    auto t0 = Clock::now();
    commit_to_object_store(fs, local.string(), step, *store);
    up_s3.push_back(seconds_since(t0));
    t0 = Clock::now();
    copy_checkpoint(fs, local.string(), step, fs, durable.string(), Verify::fast);
    up_dir.push_back(seconds_since(t0));
    up_ratio.push_back(up_s3.back() / up_dir.back());
    // Resume: the local root lost; rehydrated from each tier, then opened and verified.
    fs::remove_all(restored);
    t0 = Clock::now();
    restore_from_object_store(*store, step, fs, restored.string());
    open_latest(fs, restored.string()).reader.verify(Verify::full);
    back_s3.push_back(seconds_since(t0));
    fs::remove_all(restored);
    t0 = Clock::now();
    copy_checkpoint(fs, durable.string(), step, fs, restored.string(), Verify::fast);
    open_latest(fs, restored.string()).reader.verify(Verify::full);
    back_dir.push_back(seconds_since(t0));
    back_ratio.push_back(back_s3.back() / back_dir.back());
    fs::remove_all(restored);
    std::printf("round %d: upload %.3f s (directory %.3f s), resume %.3f s (directory %.3f s)\n", round + 1, up_s3.back(),
                up_dir.back(), back_s3.back(), back_dir.back());
  }
  std::printf("\n%-36s %12s %10s %22s\n", "", "median s", "MiB/s", "x the directory tier");
  std::printf("%-36s %12.3f %10.0f %22.2f\n", "upload to the object store", median(up_s3), mib / median(up_s3), median(up_ratio));
  std::printf("%-36s %12.3f %10.0f %22s\n", "copy to a durable directory", median(up_dir), mib / median(up_dir), "1.00");
  std::printf("%-36s %12.3f %10.0f %22.2f\n", "resume from the object store", median(back_s3), mib / median(back_s3), median(back_ratio));
  std::printf("%-36s %12.3f %10.0f %22s\n", "resume from a durable directory", median(back_dir), mib / median(back_dir), "1.00");
  // Remove what this run put on the store: every step (latest's last, which rotation keeps).
  for (const std::uint64_t step : list_object_checkpoints(*store)) {
    if (const auto latest = read_object_latest(*store); latest && latest->step == step) continue;
    remove_object_checkpoint(*store, step);
  }
  if (const auto latest = read_object_latest(*store)) {
    store->remove(std::string(kLatestName));
    remove_object_checkpoint(*store, latest->step);
  }
  if (!json_path.empty()) {
    write_json(json_path, "ckpt-object-store-bench", 1,
               {{"state_bytes", per_rank * kRanks},
                {"rounds", rounds},
                {"upload_object_store_s", json_figures(up_s3)},
                {"upload_directory_s", json_figures(up_dir)},
                {"resume_object_store_s", json_figures(back_s3)},
                {"resume_directory_s", json_figures(back_dir)}});
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* name = "ckpt-object-store-bench";
  return cli::guarded_main(name, [&] {
    BenchArgs a{.size = 256ull << 20};
    if (const auto rc = parse_bench_args(argc, argv, name,
                                         "The durable tier on an object store (upload, resume) against a durable directory on the local disk, in one run",
                                         a, {{"--bucket", "B", "the bucket to use (required): an S3 endpoint from AWS_ENDPOINT_URL and the credential chain"}}))
      return *rc;
    const std::string bucket = a.extra.at("--bucket");
    if (bucket.empty()) {
      cli::print_usage_error(name, "--bucket is required");
      return cli::kExitUsage;
    }
    return run_in_scratch(name, a, [&](const fs::path& dir) { return run(bucket, a.size, a.rounds, dir, a.json); });
  });
}
