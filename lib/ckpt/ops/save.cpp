// SPDX-License-Identifier: Apache-2.0
#include "ckpt/ops/save.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/shard/shard_writer.hpp"
#include "ckpt/shard/sharded_save.hpp"

namespace ckpt {

namespace {

// One rank's shard, streamed through ShardWriter (which hashes each piece as it writes it).
ShardReport write_rank(FileSystem& fs, const std::string& temp, const SaveRequest& req, int r, int world) {
  const RankState& rs = req.ranks[static_cast<std::size_t>(r)];
  const std::vector<TensorView> tensors = tensors_to_write(r, world, rs.tensors);  // replicated: the lowest holder's only
  // plan_shard validates the views' sizes; the writer streams them in the planned order.
  const ShardHeader planned = plan_shard(tensors, shard_header_metadata(r, world, req.step));
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  ShardWriter w = ShardWriter::stream(fs, temp, shard_file_name(r, world), specs, planned.metadata, {.chunk_size = req.chunk_size});
  for (const auto& p : planned.tensors) {
    const auto it = std::find_if(tensors.begin(), tensors.end(), [&](const TensorView& t) { return t.name == p.name; });
    w.write(it->data);
  }
  ShardReport rep = w.finish(r);
  attach_sharding(rep.tensors, sharding_by_name(tensors));
  rep.shard.param_shard_offset = rs.param_shard_offset;
  rep.shard.param_shard_numel = rs.param_shard_numel;
  rep.shard.metadata = rs.metadata;
  if (r == 0) {
    rep.param_numel = req.param_numel;
    rep.wall_clock_seconds = req.wall_clock_seconds;
    rep.training = req.training;
  }
  return rep;
}

}  // namespace

Manifest save_checkpoint_sync(FileSystem& fs, const std::string& root, const SaveRequest& req) {
  if (req.ranks.empty()) throw_invalid("save_checkpoint_sync: no ranks");
  const int world = static_cast<int>(req.ranks.size());
  const RootLock lock(fs, root);
  prepare_root(fs, lock);
  const std::string temp = begin_checkpoint(fs, root, req.step, {.allow_older_than_latest = req.allow_older_than_latest});
  try {
    // The shards are written and hashed in parallel, one thread per shard up to one per core:
    // a file's SHA-256 is sequential, so with fewer shards than cores the shard count bounds
    // the hashing; with more, every core hashes (and its writes overlap the others' hashing).
    std::vector<ShardReport> reports(static_cast<std::size_t>(world));
    const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, world);
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(threads));
    auto work = [&](int t) {
      try {
        for (int r = next++; r < world && !failed; r = next++) reports[static_cast<std::size_t>(r)] = write_rank(fs, temp, req, r, world);
      } catch (...) {
        errors[static_cast<std::size_t>(t)] = std::current_exception();
        failed = true;
      }
    };
    {
      std::vector<std::jthread> pool;
      for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
      work(0);
    }  // joined
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    Manifest m = assemble_manifest(req.step, req.chunk_size, std::move(reports));
    commit_checkpoint(fs, root, temp, m);
    return m;
  } catch (...) {
    abort_checkpoint(fs, root, temp);
    throw;
  }
}

}  // namespace ckpt
