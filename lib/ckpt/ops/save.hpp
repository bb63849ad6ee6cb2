// SPDX-License-Identifier: Apache-2.0
// The synchronous whole-checkpoint save: every rank's state, saved from the calling thread,
// durable when the call returns. The simplest complete save, and the reference the
// asynchronous checkpointer (runtime/checkpointer.hpp) is tested against: both write each
// shard through ShardWriter (shard/shard_writer.hpp), assemble the manifest with
// assemble_manifest and commit with the protocol of store/local/commit.hpp.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/fs/file_system.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// One rank's part of a checkpoint.
struct RankState {
  std::vector<TensorView> tensors;
  std::uint64_t param_shard_offset = 0;
  std::uint64_t param_shard_numel = 0;
  JsonObject metadata;
};

struct SaveRequest {
  std::uint64_t step = 0;
  double wall_clock_seconds = 0;
  std::uint64_t param_numel = 0;
  JsonObject training;
  std::vector<RankState> ranks;  ///< world_size entries, rank order
  std::uint64_t chunk_size = kDefaultChunkSize;
  bool allow_older_than_latest = false;  ///< BeginOptions::allow_older_than_latest
};

/// Blocks until the checkpoint is durable and `latest` names it: takes the root's writer lock
/// for the whole save (Errc::busy, with nothing touched, if another writer holds it), prepares
/// the root, writes
/// the ranks' shards into a temporary directory (hashing while writing), in parallel on up to
/// one thread per core (fs is used from those threads at once), then commits. On any failure the temporary directory is removed, `latest` and earlier
/// checkpoints are untouched, and the error is rethrown (Errc::invalid_argument for a bad
/// request or a committed step, the file system's errors otherwise). Returns the committed
/// manifest.
Manifest save_checkpoint_sync(FileSystem& fs, const std::string& root, const SaveRequest& request);
/// save_checkpoint_sync on the POSIX file system.
inline Manifest save_checkpoint_sync(const std::string& root, const SaveRequest& request) {
  return save_checkpoint_sync(posix_file_system(), root, request);
}

}  // namespace ckpt
CKPT_API_END
