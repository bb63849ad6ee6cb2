// SPDX-License-Identifier: Apache-2.0
// Writing redundancy blocks (format/redundancy.hpp) and rebuilding what a lost node held.
//
// Every block is written through ShardWriter (copy mode): XXH3 per chunk and SHA-256 while
// the bytes go out, fsync before it counts. Parity is computed chunk by chunk (memory: K + M
// chunks per stripe), from wherever the node data is: the staged shard images while a save
// streams its shards (no read-back), or the surviving files during a repair.
#pragma once

#include "ckpt/core/export.hpp"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/read/reader.hpp"

CKPT_API_BEGIN
namespace ckpt {

class ReedSolomon;  // store/nodes/erasure.hpp: the codec, internal to the library (not installed)

/// Fills `out` with bytes [offset, offset + out.size()) of node `node`'s data (its shard
/// files back to back, rank order); bytes past the end are zeros. Throws the source's errors.
using NodeBytes = std::function<void(int node, std::uint64_t offset, std::span<std::byte> out)>;
/// Fills `out` with bytes [offset, offset + out.size()) of one file.
using FileBytes = std::function<void(std::uint64_t offset, std::span<std::byte> out)>;

/// Fills `out` with bytes [offset, offset + out.size()) of rank `rank`'s shard file.
using RankBytes = std::function<void(int rank, std::uint64_t offset, std::span<std::byte> out)>;

/// NodeBytes over the ranks' shard files, read through `read` (one call per rank overlapping
/// the range, in rank order). `shard_sizes` in rank order.
NodeBytes node_bytes_by_rank(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes, RankBytes read);

/// NodeBytes over in-memory shard images: images[r] holds rank r's whole file (its size is
/// the shard's size). The spans must outlive the result.
NodeBytes node_bytes_from_images(const NodeLayout& layout, std::vector<std::span<const std::byte>> images);

/// Writes `size` bytes from `source` into `dir`/`name` (create, write in chunk_size pieces,
/// fsync, close) and returns the file's record (path, size, SHA-256, XXH3 per chunk and of
/// the file). `stopped`, if given, is polled between chunks: true fails with Errc::aborted.
ShardRecord write_file_from(FileSystem& fs, const std::string& dir, const std::string& name, std::uint64_t size, const FileBytes& source,
                            std::uint64_t chunk_size, const std::function<bool()>& stopped = {});

/// Writes the parity blocks of `stripe` whose entries are in `blocks` (some or all of its M,
/// each of stripe.length bytes) into node_dirs[block.node], filling in their checksums.
/// Reads the K data pieces through `data`, one chunk at a time. Throws the first failure
/// (the partial files stay in node_dirs: temporaries of the caller).
void write_parity(FileSystem& fs, std::span<const std::string> node_dirs, const ReedSolomon& code, const Stripe& stripe,
                  std::span<RedundancyBlock* const> blocks, const NodeBytes& data, std::uint64_t chunk_size,
                  const std::function<bool()>& stopped = {});

/// Every block of `layout` for shards of `shard_sizes`, written from `data` into
/// node_dirs[node]: planned_blocks with their checksums. For a save: the shard images as
/// NodeBytes. Replicas copy the shard bytes (read through `data` by their node offset).
std::vector<RedundancyBlock> write_redundancy(FileSystem& fs, std::span<const std::string> node_dirs, const NodeLayout& layout,
                                              std::span<const std::uint64_t> shard_sizes, const NodeBytes& data, std::uint64_t chunk_size,
                                              const std::function<bool()>& stopped = {});

/// write_redundancy in independent units, for callers that write them in parallel: one unit
/// per block of planned_blocks (rs: a parity block of a stripe, replicate: a replica), in
/// planned_blocks' order.
std::size_t redundancy_units(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes);
/// Writes unit `unit` (0..redundancy_units-1) and returns its block with its checksums.
std::vector<RedundancyBlock> write_redundancy_unit(FileSystem& fs, std::span<const std::string> node_dirs, const NodeLayout& layout,
                                                   std::span<const std::uint64_t> shard_sizes, const NodeBytes& data,
                                                   std::uint64_t chunk_size, std::size_t unit, const std::function<bool()>& stopped = {});

/// The rank whose process writes unit `unit` when ranks live in several processes: one of the
/// ranks of the node that stores the block (node x ranks_per_node + unit % ranks_per_node),
/// so that every block is written on its own node and a node's blocks spread over its ranks.
int redundancy_unit_rank(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes, std::size_t unit);

/// One read of a rank's shard bytes by a redundancy unit.
struct RankRead {
  int rank = 0;
  std::uint64_t offset = 0, length = 0;  ///< within the rank's shard file
  bool operator==(const RankRead&) const = default;
};
/// Every read write_redundancy_unit(unit) makes through a node_bytes_by_rank source, in the
/// order it makes them: what the processes holding those ranks send to the unit's writer when
/// ranks live in several processes (and what the writer must still take in when it stops
/// early, so that no sender is left waiting).
std::vector<RankRead> unit_reads(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes, std::size_t unit,
                                 std::uint64_t chunk_size);

// ---- health and repair -------------------------------------------------------------------

/// One file of a checkpoint across nodes: a shard or a redundancy block.
struct MemberHealth {
  std::string what;  ///< "shard of rank 1", "parity 0 of stripe 2", "replica of rank 3"
  int node = 0;
  std::string path;  ///< full path on its node root
  bool ok = true;
  std::string error;           ///< why not: the typed error's message
  Errc code = Errc::io_error;  ///< and its code (when !ok)
};

/// What check_node_checkpoint found.
struct NodeCheckpointHealth {
  std::string name;  ///< "step-0000000010"
  Manifest manifest;
  std::vector<MemberHealth> shards;  ///< per rank
  std::vector<MemberHealth> blocks;  ///< per manifest redundancy block
  /// Per node: its copy of manifest.json ("manifest copy"), bad when missing, unreadable or
  /// other bytes than `manifest_bytes`.
  std::vector<MemberHealth> manifests;
  std::string manifest_bytes;  ///< manifest.json as most nodes hold it (read_node_manifest)
  /// How many more lost nodes each unit survives: rs, per stripe, M minus its bad members;
  /// replicate, per rank, its good copies minus 1; none, per rank, 0 or -1. Negative: lost.
  std::vector<int> margins;
  std::vector<int> bad_ranks;  ///< shards missing or failing their checksums
  std::vector<int> lost_ranks;  ///< of those, the ones the scheme cannot rebuild
  bool healthy() const noexcept {
    const auto ok = [](const MemberHealth& f) { return f.ok; };
    return bad_ranks.empty() && std::all_of(blocks.begin(), blocks.end(), ok) && std::all_of(manifests.begin(), manifests.end(), ok);
  }
  /// Every bad file: shards, redundancy blocks, manifest copies, in that order.
  std::vector<const MemberHealth*> bad_files() const;
  bool recoverable() const noexcept { return lost_ranks.empty(); }
  /// The smallest margin (the node losses the checkpoint still survives); 0 without units.
  int min_margin() const noexcept;
};

/// Reads the checkpoint `name` across `roots` (read_node_manifest: the manifest most nodes
/// hold) and checks every node's copy of the manifest against those bytes, and every shard
/// and block per `verify` (sizes, then XXH3 of every chunk; full: SHA-256 too). Never throws
/// for damage (it is the report); throws read_node_manifest's errors when no copy opens.
NodeCheckpointHealth check_node_checkpoint(FileSystem& fs, std::span<const std::string> roots, const std::string& name,
                                           Verify verify = Verify::fast);

/// What repair_node_checkpoint did.
struct RepairReport {
  std::string name;
  std::vector<int> rebuilt_ranks;
  std::vector<std::string> lines;  ///< one per file rebuilt: what, where, from what
  bool nothing_to_do() const noexcept { return lines.empty(); }
};

/// Rebuilds every bad shard, block and manifest copy of checkpoint `name` (check_node_checkpoint with
/// `verify`; Verify::none finds lost and truncated files only, by their sizes) from
/// replicas or by Reed-Solomon decoding, each checked against the manifest's SHA-256 before
/// it is renamed into place, durably (file fsync, directory fsync); a node whose root or
/// checkpoint directory is gone gets it back (a temporary directory renamed into place, the
/// manifest); a node's missing or damaged manifest copy is rewritten as the bytes most nodes
/// hold (never re-encoded); every node that holds the checkpoint and whose `latest` names none or an older
/// one gets `latest` naming it, even when every file is good (a line in the report unless
/// the node was recreated). Errc::missing_shard naming
/// the lost shards, their nodes and the scheme's limit when more is lost than the scheme
/// tolerates (nothing is written then). The caller holds the node roots' locks (or knows no
/// writer runs).
RepairReport repair_node_checkpoint(FileSystem& fs, std::span<const std::string> roots, const std::string& name,
                                    Verify verify = Verify::fast);

/// Rebuilds the committed checkpoints of `roots` (at or before the newest `latest`) that have
/// files missing or of the wrong size (Verify::none: a replaced node's empty root, a
/// truncated file), so that every checkpoint kept survives the scheme's losses again, not
/// only the live one. What cannot be rebuilt, or fails, is logged and left. Returns the
/// reports of the checkpoints repaired. The caller holds the node roots' locks.
std::vector<RepairReport> repair_node_roots(FileSystem& fs, std::span<const std::string> roots);

}  // namespace ckpt
CKPT_API_END
