// SPDX-License-Identifier: Apache-2.0
// The layout of a node set as a reader sees it (docs/multi-node.md): node roots DIR/node-n,
// how many a set has, and the newest checkpoint their `latest` files name. Read-only; the
// node set's commit protocol (store/nodes/node_commit.hpp) and its redundancy build on it.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/fs/file_system.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// The n of a node root's name "node-<n>" (1 to 6 digits), or -1 for any other name.
int node_root_index(std::string_view name) noexcept;
/// Node n's root under `dir`: DIR/node-n, for n in 0..nodes-1.
std::vector<std::string> node_root_paths(const std::string& dir, int nodes);
/// True if `dir` holds node roots (a directory node-<n>) and no `latest` of its own.
/// Never throws (an unreadable `dir` is not a node set).
bool is_node_set(FileSystem& fs, const std::string& dir);
/// The number of node roots under `dir`: the node count of the manifest of any node's
/// latest checkpoint (the highest-numbered nodes may be the lost ones), else one more than
/// the highest node-<n> present. 0 when `dir` is not a node set.
int count_node_roots(FileSystem& fs, const std::string& dir);

/// The step `root`'s `latest` names, or nullopt when the root is missing or has no readable
/// `latest` naming a checkpoint (never throws).
std::optional<std::uint64_t> node_latest_step(FileSystem& fs, const std::string& root);

/// The newest checkpoint any node root's `latest` names ("step-0000000010"), or nullopt if
/// no node root has a readable `latest` naming a checkpoint. A missing node root counts as
/// one without `latest` (a lost node).
std::optional<std::string> read_latest_nodes(FileSystem& fs, std::span<const std::string> roots);

}  // namespace ckpt
CKPT_API_END
