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
#include <random>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/io/commit.hpp"
#include "ckpt/io/layout.hpp"
#include "ckpt/io/object_commit.hpp"
#include "ckpt/io/s3.hpp"
#include "ckpt/io/save.hpp"
#include "ckpt/io/tiers.hpp"

namespace fs = std::filesystem;
using namespace ckpt;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRanks = 4;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

int run(const std::string& bucket, std::uint64_t size, int rounds, const fs::path& dir, const std::string& json_path) {
  // The state: 4 ranks of size/4 bytes each, one U8 tensor per rank, deterministic bytes.
  const std::uint64_t per_rank = size / kRanks;
  std::vector<std::vector<std::byte>> data(kRanks, std::vector<std::byte>(per_rank));
  std::mt19937_64 rng(1);
  for (auto& d : data)
    for (std::size_t i = 0; i < d.size(); i += 8) {
      const std::uint64_t x = rng();
      for (std::size_t j = 0; j < 8 && i + j < d.size(); ++j) d[i + j] = static_cast<std::byte>(x >> (8 * j));
    }
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
    auto vec = [](const std::vector<double>& v) { return boost::json::array(v.begin(), v.end()); };
    std::ofstream(json_path) << boost::json::serialize(boost::json::object{{"state_bytes", per_rank * kRanks},
                                                                           {"rounds", rounds},
                                                                           {"upload_object_store_s", vec(up_s3)},
                                                                           {"upload_directory_s", vec(up_dir)},
                                                                           {"resume_object_store_s", vec(back_s3)},
                                                                           {"resume_directory_s", vec(back_dir)}})
                             << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t size = 256ull << 20;
  int rounds = 3;
  std::string bucket, dir_arg, json;
  const char* usage = "usage: ckpt-object-store-bench --bucket B [--size BYTES] [--rounds N] [--dir D] [--quick] [--json FILE]\n";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ckpt-object-store-bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    try {
      if (a == "--bucket") bucket = value();
      else if (a == "--size") size = std::stoull(value());
      else if (a == "--rounds") rounds = std::stoi(value());
      else if (a == "--dir") dir_arg = value();
      else if (a == "--json") json = value();
      else if (a == "--quick") size = 16ull << 20, rounds = 1;
      else {
        std::fprintf(stderr, "ckpt-object-store-bench: unknown option %s\n%s", a.c_str(), usage);
        return 2;
      }
    } catch (const std::exception&) {
      std::fprintf(stderr, "ckpt-object-store-bench: bad value for %s\n", a.c_str());
      return 2;
    }
  }
  if (bucket.empty() || size < (1u << 20) || rounds < 1) {
    std::fprintf(stderr, "ckpt-object-store-bench: --bucket is required, --size must be at least 1048576 and --rounds at least 1\n%s", usage);
    return 2;
  }
  const fs::path dir = dir_arg.empty() ? fs::path(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/var/tmp") / ("ckpt-object-store-bench-" + std::to_string(::getpid()))
                                       : fs::path(dir_arg);
  fs::create_directories(dir);
  int rc = 1;
  try {
    rc = run(bucket, size, rounds, dir, json);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-object-store-bench: %s\n", e.what());
  }
  if (dir_arg.empty()) fs::remove_all(dir);
  return rc;
}
