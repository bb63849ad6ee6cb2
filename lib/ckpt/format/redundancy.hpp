// SPDX-License-Identifier: Apache-2.0
// Checkpoints across node-local roots, and the redundancy that survives the loss of nodes
// (docs/format.md "Nodes and redundancy" specifies all of it, well enough for an independent
// decoder).
//
// Ranks are grouped into nodes: rank r lives on node r / ranks_per_node, and each node has
// its own checkpoint root (its NVMe). A checkpoint is one step across every node root: node n
// holds its ranks' shard files, the redundancy blocks placed on it, and the manifest (the
// same on every node). The schemes:
//
//   none           nothing beyond the shards: a lost node is lost (the durable tier remains);
//   replicate:F    each node's shard files are also stored, byte for byte, on the F-1 nodes
//                  n + jump, n + 2 jump, ... (mod nodes): any F-1 lost nodes are survived;
//   rs:K+M         Reed-Solomon over GF(2^8) (ISA-L's Cauchy matrix): every node's data (its
//                  shard files back to back, in rank order) is cut into K equal pieces, and
//                  stripe s (one per node, s = 0..nodes-1) encodes piece i of node s+i (i < K)
//                  into M parity blocks stored on nodes s+K, ..., s+K+M-1 (mod nodes). Every
//                  node is data in K stripes and parity in M, no node holds data and parity of
//                  one stripe, the parity is M/K of the data, and any M lost nodes are survived.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

CKPT_API_BEGIN
namespace ckpt {

struct RedundancyScheme {
  enum class Kind : std::uint8_t { none, replicate, reed_solomon };
  Kind kind = Kind::none;
  int copies = 1;  ///< replicate: F, the copies of every shard (the shard itself included)
  int jump = 1;    ///< replicate: nodes between one copy and the next
  int k = 0, m = 0;  ///< rs: data pieces and parity blocks per stripe

  bool operator==(const RedundancyScheme&) const = default;
};

/// Parses "none", "replicate:F" (F >= 2), "replicate:F/J" (jump J >= 1) or "rs:K+M" (K, M
/// >= 1, K + M <= 255); nullopt for anything else.
std::optional<RedundancyScheme> parse_redundancy(std::string_view text) noexcept;
/// The text parse_redundancy reads ("rs:3+1", "replicate:2", "replicate:3/2", "none").
std::string redundancy_name(const RedundancyScheme& s);
/// How many lost nodes the scheme survives, whichever they are (0, F-1, M).
int tolerated_node_losses(const RedundancyScheme& s) noexcept;

/// Where the ranks of a checkpoint live.
struct NodeLayout {
  int nodes = 1;
  int ranks_per_node = 1;
  RedundancyScheme scheme{};

  bool operator==(const NodeLayout&) const = default;
  int node_of(int rank) const noexcept { return rank / ranks_per_node; }
  int world_size() const noexcept { return nodes * ranks_per_node; }
};

/// Why `layout` cannot hold a checkpoint of `world_size` ranks, or nullopt if it can:
/// nodes >= 1, ranks_per_node >= 1, nodes * ranks_per_node == world_size; replicate: F <=
/// nodes and the F copies of every node on F distinct nodes; rs: K + M <= nodes.
std::optional<std::string> layout_problem(const NodeLayout& layout, int world_size);

/// The F-1 nodes holding copies of node `node`'s shards (replicate), in copy order.
std::vector<int> replica_nodes(const NodeLayout& layout, int node);

/// One stripe member's piece of a node's data: bytes [offset, offset + length) of the node's
/// shard files back to back, in rank order (length may be 0, and less than the stripe's
/// length: the rest reads as zeros).
struct StripePiece {
  int node = 0;
  int index = 0;  ///< which of the node's K pieces
  std::uint64_t offset = 0, length = 0;
  bool operator==(const StripePiece&) const = default;
};

/// One Reed-Solomon stripe: K data pieces (code rows 0..K-1), M parity blocks of `length`
/// bytes (rows K..K+M-1) on parity_nodes.
struct Stripe {
  int index = 0;
  std::vector<StripePiece> data;
  std::vector<int> parity_nodes;
  std::uint64_t length = 0;  ///< the longest piece: every member's length on disk or in the code
};

/// Bytes of node n's data: the sizes of its ranks' shard files summed (shard_sizes in rank order).
std::vector<std::uint64_t> node_data_bytes(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes);
/// The stripes of an rs layout: piece i of node n is [i * P, min((i+1) * P, D)) with D the
/// node's data bytes and P = ceil(D / K); stripe s holds piece i of node (s + i) % nodes.
/// Empty for other schemes.
std::vector<Stripe> rs_stripes(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes);

/// File names of the redundancy blocks inside a checkpoint directory.
std::string parity_file_name(int stripe, int index);   ///< "parity-s00003-p0.rs"
std::string replica_file_name(int rank, int world_size);  ///< "replica-rank-00001-of-00004.safetensors"

/// One redundancy block of a checkpoint: a parity block of a stripe or a copy of a shard.
struct RedundancyBlock {
  enum class Kind : std::uint8_t { parity, replica };
  Kind kind = Kind::parity;
  int node = 0;     ///< the node whose root holds it
  int stripe = -1;  ///< parity: the stripe
  int index = -1;   ///< parity: which parity block (0..M-1, code row K + index)
  int rank = -1;    ///< replica: the rank whose shard it copies
  std::string path;  ///< plain file name inside the node's checkpoint directory
  std::uint64_t size = 0;
  std::string sha256;
  std::uint64_t xxh3 = 0;
  std::vector<std::uint64_t> chunk_xxh3;  ///< one per manifest chunk_size bytes
};

/// The blocks a layout calls for, without checksums (kind, node, stripe/index or rank, path,
/// size), in the manifest's order: rs stripe by stripe, parity index by index; replicate rank
/// by rank, copy by copy. `shard_sizes` in rank order.
std::vector<RedundancyBlock> planned_blocks(const NodeLayout& layout, std::span<const std::uint64_t> shard_sizes);

}  // namespace ckpt
CKPT_API_END
