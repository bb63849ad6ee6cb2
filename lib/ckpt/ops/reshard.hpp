// SPDX-License-Identifier: Apache-2.0
// Changing a checkpoint's world size, and exporting its model: docs/resharding.md has the
// rules in full.
//
// A ZeRO checkpoint partitions one flat space of P parameters (padded to Pp, a multiple of
// the world size N) across its ranks: rank r's shard holds, for each *flat tensor* (the fp32
// master weights, Adam m and v), the slice [param_shard_offset, param_shard_offset +
// param_shard_numel). Everything else in rank 0's shard (the 16-bit parameters) is
// replicated state, the same for every world size. The manifest says which tensors are flat
// (training.flat_tensors) and how many of the flat elements are real (training.num_params);
// Trainer::checkpoint_info records both, and the model's param_layout.
//
// At world size M, rank m owns dist::shard_range(Pm, M, m) of the same space, with Pm = P
// rounded up to a multiple of M (ZeRO's padding rule); elements at or past P are padding and
// always zero. Reading a slice reads only the byte ranges of the source shards that overlap
// it, each chunk checked against its XXH3: a rank of a resharded load reads about 1/M of the
// checkpoint, and nothing is loaded unverified.
//
// reshard_checkpoint and consolidate_checkpoint stream: they hold one buffer of
// buffer_bytes plus one verification chunk (the manifest's chunk_size, 4 MiB by default)
// whatever the checkpoint's size, and they publish their output atomically (a temporary name
// in the destination's parent, fsynced, renamed at the end), removing it on any failure.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/core/dtype.hpp"
#include "ckpt/dist/communicator.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/read/range_reader.hpp"
#include "ckpt/read/flat_layout.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// Default memory budget of reshard and consolidate (their --buffer-mb).
inline constexpr std::uint64_t kDefaultReshardBuffer = 256ull << 20;
/// Smallest buffer accepted: below it the per-piece overhead dominates.
inline constexpr std::uint64_t kMinReshardBuffer = 64ull << 10;

/// Checks the shard headers of ranks first_rank, first_rank + rank_stride, ... against the
/// manifest index (Errc::malformed_shard on disagreement), reading only the headers: with
/// Verify::fast through XXH3-checked chunks (a damaged header is Errc::checksum_mismatch),
/// with Verify::none as they are; Verify::full checks each whole file's SHA-256 instead.
/// What a FlatReader then reads is checked chunk by chunk, so together nothing used is
/// unverified. The stride lets M ranks share the work. Blocks on the file system.
void verify_headers(const CheckpointReader& checkpoint, Verify mode, int first_rank = 0, int rank_stride = 1);

/// How the bytes of a checkpoint written by reshard_checkpoint were checked on their way from
/// the checkpoint a job saved: training.resharded_from.source_verify, the weakest --verify
/// of the reshards that made it (a reshard of a source read unchecked is unchecked, however
/// it was read itself). nullopt for a checkpoint that records none (a job's own, or one
/// resharded before the field existed). A value other than "none", "fast" or "full" is
/// Errc::malformed_manifest naming `file` and the field.
std::optional<Verify> resharded_source_verify(const Manifest& manifest, std::string_view file = kManifestName);

/// Reads any element range of a checkpoint's flat tensors, whatever world size wrote it.
/// Blocks on the file system; not thread-safe (one per thread); the CheckpointReader must
/// outlive it. Memory: one chunk of the checkpoint (see ShardRangeReader).
class FlatReader {
 public:
  /// Checks the layout against the manifest, throwing Errc::malformed_manifest (naming the
  /// manifest, the field, expected and actual) unless: the shards' ranges tile
  /// [0, param_numel) without gap or overlap; num_params <= param_numel; every flat tensor
  /// is on every rank, 1-D with param_shard_numel elements, of one dtype on every rank.
  FlatReader(const CheckpointReader& checkpoint, FlatLayout layout, Verify mode = Verify::fast);

  const FlatLayout& layout() const noexcept { return layout_; }
  const CheckpointReader& checkpoint() const noexcept { return *checkpoint_; }
  /// The dtype of flat tensor `name` (Errc::not_found if it is not one).
  DType dtype(std::string_view name) const;

  /// Fills `out` with elements [first, first + out.size() / element size) of flat tensor
  /// `name`, reading only the byte ranges of the shards that hold them (verified per chunk);
  /// elements at or past num_params are zero. `out.size()` must be a multiple of the element
  /// size (invalid_argument); the range may extend past the source's padded size (zeros).
  /// Throws the reader's errors (Errc::checksum_mismatch, Errc::size_mismatch, ...).
  void read(std::string_view name, std::uint64_t first, std::span<std::byte> out);

  /// Bytes read from shard files so far.
  std::uint64_t bytes_read() const noexcept;

  /// Where read(name, first, out) finds elements [first, first + count): one piece per
  /// source shard holding some of them, in order (elements [source_first, source_first +
  /// count) of that rank's tensor `name` go to elements [out_first, ...) of the output), and
  /// the elements from `padding_from` (relative to `first`) on lie at or past num_params
  /// (zero, never read). For loading the pieces into one's own memory (load_into.hpp). Reads
  /// nothing; Errc::not_found for a name that is not a flat tensor.
  struct Piece {
    int rank = 0;
    std::uint64_t source_first = 0, count = 0, out_first = 0;
  };
  std::vector<Piece> pieces(std::string_view name, std::uint64_t first, std::uint64_t count, std::uint64_t& padding_from) const;

 private:
  ShardRangeReader& shard(const ShardRecord& file);

  const CheckpointReader* checkpoint_;
  FlatLayout layout_;
  Verify mode_;
  std::vector<int> by_offset_;  ///< source ranks in order of param_shard_offset
  std::vector<DType> dtypes_;   ///< per layout_.tensors
  std::optional<ShardRangeReader> current_;
  const ShardRecord* current_file_ = nullptr;  // the file current_ reads
  std::uint64_t closed_bytes_ = 0;
};

/// The per-rank metadata (manifest shards[].metadata) for `world` ranks of a resharded
/// checkpoint. A key is rank-local if training.rank_local_metadata lists it or its value
/// differs between the source ranks; other keys (data_position: global samples consumed) are
/// copied to every rank. A rank-local key of target rank r is source rank r's value for
/// r < N, and absent for r >= N: the consumer derives it (Trainer: a fresh RNG stream from
/// seed, rank and step), so a load-time reshard and an offline one agree.
std::vector<JsonObject> remap_rank_metadata(const Manifest& source, int world);

struct ReshardOptions {
  int world_size = 0;                                ///< M >= 1
  std::uint64_t buffer_bytes = kDefaultReshardBuffer;  ///< >= kMinReshardBuffer
  Verify verify = Verify::fast;  ///< of the source; full also checks every file's SHA-256 first
  std::optional<FlatLayout> layout;  ///< default: flat_layout(source manifest)
  ProgressFn progress;               ///< (bytes written, bytes to write), may be empty
};

struct ReshardResult {
  Manifest manifest;  ///< the committed manifest
  std::string dir;    ///< DST/step-N
  std::uint64_t bytes_read = 0, bytes_written = 0;
  /// How the new checkpoint's bytes were checked since a job saved them (recorded as
  /// training.resharded_from.source_verify): options.verify, or the source's own
  /// resharded_source_verify if weaker.
  Verify source_verify = Verify::fast;
};

/// Writes `source` at world size options.world_size as a new checkpoint (same step) under
/// the root `dst_root`, through the commit protocol of commit.hpp: shards into a temporary
/// directory, each hashed while written and fsynced, the manifest last, the rename, and
/// `latest` moved to it. Flat tensors are re-sliced (flat_slice), rank 0's other tensors
/// copied to the new rank 0, per-rank metadata remapped (remap_rank_metadata), training
/// metadata copied with flat_tensors, num_params and resharded_from {world_size,
/// param_numel, source_verify} recorded. The source is checked as options.verify says: with
/// Verify::fast every chunk read (each header, each byte copied) against its XXH3, with
/// Verify::full also every file's SHA-256 first, so a damaged source is refused and nothing
/// unchecked is copied; Verify::none copies the bytes unchecked, and says so in a log line
/// and in the new manifest (source_verify "none", which ckpt inspect and ckpt verify show):
/// checksums computed over damaged bytes must not pass for a check of the source.
/// Tensors of ranks other than 0 that are not flat cannot be placed: invalid_argument.
/// A checkpoint recording training.parallel.tensor = T (tensor-parallel attention heads)
/// needs a world_size that is a multiple of T (invalid_argument naming both before anything
/// is written); its training.parallel.data becomes world_size / T.
/// `dst_root` is created if absent (its parent must exist: Errc::not_found). Its writer lock
/// (store/root_lock.hpp) is held throughout: a root a running job (or a prune, or another
/// reshard) writes to is refused with Errc::busy naming the holder, before anything is
/// touched. It must not already hold the step as a committed checkpoint, and its `latest`
/// must not name a newer step (invalid_argument: moving `latest` back would demote the newer
/// checkpoint).
/// On any failure (a corrupt source: Errc::checksum_mismatch naming the file and chunk) the
/// temporary is removed, and `dst_root` too if this call created it: no partial output.
/// Blocks; uses buffer_bytes plus one chunk of memory.
ReshardResult reshard_checkpoint(FileSystem& fs, const CheckpointReader& source, const std::string& dst_root,
                                 const ReshardOptions& options);
/// reshard_checkpoint on the POSIX file system.
inline ReshardResult reshard_checkpoint(const CheckpointReader& source, const std::string& dst_root, const ReshardOptions& options) {
  return reshard_checkpoint(posix_file_system(), source, dst_root, options);
}

/// Whether a global tensor is optimizer state, by its name: it starts with "optim." (the
/// trainer's flat tensors, an optimizer's state flattened as "optim.state.3.exp_avg") or
/// "optimizer.".
bool is_optimizer_state(std::string_view name) noexcept;

struct ConsolidateOptions {
  std::string tensor = "optim.master";  ///< the flat tensor to export (fp32 master weights)
  std::optional<DType> dtype;           ///< weights: F32, F16 or BF16 (cast through fp32); default: the tensor's
  bool with_optimizer = false;          ///< also write the optimizer state (optimizer*.safetensors); default: weights only
  std::uint64_t max_file_size = 0;      ///< tensor bytes per file; 0: one file
  std::uint64_t buffer_bytes = kDefaultReshardBuffer;
  Verify verify = Verify::fast;
  ProgressFn progress;
};

struct ConsolidatedFile {
  std::string name;  ///< "model.safetensors" or "model-00001-of-00003.safetensors"
  std::uint64_t size = 0;
  std::vector<std::string> tensors;
};

struct ConsolidateResult {
  std::string dir;
  DType dtype = DType::F32;
  std::vector<ConsolidatedFile> files;
  std::optional<std::string> index;  ///< "model.safetensors.index.json" when several files
  std::optional<std::string> config;  ///< "config.json": training.config, when the checkpoint records it
  std::uint64_t total_size = 0;      ///< weight tensor bytes (the index's metadata.total_size)
  std::vector<ConsolidatedFile> optimizer_files;  ///< with_optimizer: "optimizer.safetensors" or "optimizer-0000k-of-0000n..."
  std::optional<std::string> optimizer_index;     ///< "optimizer.safetensors.index.json" when several files
  std::uint64_t optimizer_size = 0;               ///< optimizer tensor bytes
  std::size_t left_out = 0;                       ///< optimizer tensors not written (without with_optimizer)
  std::uint64_t bytes_read = 0;
  /// How the exported bytes were checked since a job saved them: options.verify, or the
  /// source's resharded_source_verify if weaker. Every file's __metadata__ records it as
  /// "ckpt.source_verify".
  Verify source_verify = Verify::fast;
};

/// Writes the full model in the Hugging Face layout to the new directory `out_dir`: every
/// param_layout tensor of the flat tensor options.tensor, reassembled from the shards and
/// cast to options.dtype, into `model.safetensors`, or (when the tensors exceed
/// max_file_size) `model-0000k-of-0000n.safetensors` files filled in layout order plus
/// `model.safetensors.index.json` ({"metadata": {"total_size"}, "weight_map"}). Headers carry
/// {"format": "pt", "ckpt.source_verify": "none" | "fast" | "full"} (ConsolidateResult::
/// source_verify; options.verify none is logged, as for reshard_checkpoint). When the checkpoint's training metadata holds a `config` object (the
/// trainer's model and run configuration), it is written beside them as `config.json`.
/// A checkpoint without training.flat_tensors exports its global tensors instead
/// (slice_load.hpp: every sliced, replicated and single tensor under its global name, float
/// ones cast to options.dtype, others as they are; rank-local tensors left out), in name
/// order. Optimizer state is left out (counted in left_out) unless options.with_optimizer:
/// then it goes, in its own dtype, into `optimizer.safetensors` (or
/// `optimizer-0000k-of-0000n.safetensors` plus `optimizer.safetensors.index.json`, split by
/// the same max_file_size): for a trainer checkpoint, each other flat tensor F cut per model
/// tensor P as "F.P" (e.g. "optim.m.wte"); otherwise every global tensor whose name starts
/// is_optimizer_state says. Errc::not_found if nothing is left to write. `out_dir` must not exist (invalid_argument) and its parent must
/// (Errc::not_found); everything is written under a temporary name in that parent
/// (host_temporary_name: ".tmp-OUT@HOST-<pid>-<n>"), fsynced, and renamed at the end; on any
/// failure the temporary is removed. A temporary a killed consolidate into the same OUT left
/// is removed first, if it was made on this host by a process that is gone
/// (is_abandoned_temporary); a live one's is never touched. Blocks; uses buffer_bytes plus
/// one chunk of memory.
ConsolidateResult consolidate_checkpoint(FileSystem& fs, const CheckpointReader& source, const std::string& out_dir,
                                         const ConsolidateOptions& options);
/// consolidate_checkpoint on the POSIX file system.
inline ConsolidateResult consolidate_checkpoint(const CheckpointReader& source, const std::string& out_dir, const ConsolidateOptions& options) {
  return consolidate_checkpoint(posix_file_system(), source, out_dir, options);
}

}  // namespace ckpt
CKPT_API_END
