// SPDX-License-Identifier: Apache-2.0
// The commit protocol across node roots (docs/commit-protocol.md, "Across nodes"): one
// checkpoint, one step, on every node's root, committed as one. Each node root is a root as
// in store/local/commit.hpp (its own lock, temporaries, `latest`); what changes is the order:
//
//   1. begin: the temporary directory on every node root (begin_checkpoint on each);
//   2. every shard and redundancy block is written, fsynced and closed in its node's temporary;
//   3. commit, once all of them are durable:
//      a-b. on every node: manifest.json (the same bytes everywhere) written and fsynced, the
//           temporary directory fsynced;
//      c-d. on every node: rename .tmp-step-N-... -> step-N, fsync the node root;
//      e-g. on every node, only once every rename is durable: `latest` replaced (as in
//           store/local/commit.hpp) and the node root fsynced.
//   A checkpoint is committed once any node's `latest` names it: every node holds it then
//   under its final name. A crash before every rename is done leaves the previous
//   checkpoint live on every node (the next prepare_node_roots removes the new step's
//   directories and temporaries). A crash after the renames, before or between the `latest`
//   updates, leaves the new step complete on every node: prepare_node_roots moves every
//   `latest` to it (even when no `latest` had moved yet, or the nodes whose `latest` had
//   are lost since), and the reader takes the newest step any node's `latest` names.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/read/node_layout.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// The newest checkpoint of the node roots `roots` as prepare_node_roots decides it, without
/// writing anything: the newest step any node's `latest` names, or a newer step renamed into
/// place on every node root that holds checkpoints (an empty or missing root is a lost
/// node's) whose lost files the scheme can rebuild (committed, though no `latest` names it
/// yet: the crash came between the renames and the first `latest`). nullopt: none.
std::optional<std::string> newest_node_checkpoint(FileSystem& fs, std::span<const std::string> roots);

/// Crash cleanup across node roots, holding every root's lock (`locks`, in node order).
/// The newest checkpoint is the newest step any node's `latest` names, or a newer step
/// renamed into place on every node root that holds checkpoints (an empty root is a lost
/// node's) whose lost files the scheme can rebuild: all of its files were durable before
/// its first rename, and the nodes whose `latest` had moved to it may be the lost ones.
/// Each node root holding that step's directory gets its `latest` moved forward to it;
/// then a removal cut between its renames is finished (a removal temporary of a step older
/// than the newest on any node root: remove_node_step of that step); then prepare_root on
/// each (which removes what is newer than its `latest`). Returns the names removed,
/// "node-n/NAME". Throws what prepare_root throws.
std::vector<std::string> prepare_node_roots(FileSystem& fs, std::span<const RootLock> locks);

/// Step 1 on every node root: the temporary directories, in node order. On a failure the
/// ones already made are removed and the error is rethrown.
std::vector<std::string> begin_node_checkpoint(FileSystem& fs, std::span<const std::string> roots, std::uint64_t step,
                                               const BeginOptions& options = {});

/// Step 3 across node roots, in the order above. `temps` as begin_node_checkpoint returned
/// them; the manifest must carry the node layout (Manifest::nodes) with roots.size() nodes.
/// Returns node 0's checkpoint directory. A failure before any `latest` names the new step
/// renames every committed directory back to its temporary name (abort_node_checkpoint then
/// removes them) and rethrows; a failure after one has is rethrown too, with the other
/// nodes' `latest` moved on a best-effort basis (the checkpoint is committed).
/// `manifest_text`, when not empty, is written byte for byte instead of `manifest`'s
/// encoding (a copy's: the source's bytes); it must decode to the same step and layout.
std::string commit_node_checkpoint(FileSystem& fs, std::span<const std::string> roots, std::span<const std::string> temps,
                                   const Manifest& manifest, std::string_view manifest_text = {});

/// Best effort removal of every node's temporary directory of a failed checkpoint (empty
/// names are skipped). Never throws.
void abort_node_checkpoint(FileSystem& fs, std::span<const std::string> roots, std::span<const std::string> temps) noexcept;

/// Removes checkpoint `name` from every node root that holds it: first every node's directory
/// is renamed to a removal temporary (each node root fsynced), then the temporaries are
/// deleted, so a kill mid-way leaves no node root with the step and another without it
/// under its name; prepare_node_roots finishes such a removal. Tries every node; throws the
/// first failure.
void remove_node_step(FileSystem& fs, std::span<const std::string> roots, const std::string& name);

/// Rotation across node roots, rotate_checkpoints's rule over the steps of all of them: keeps
/// `committed`, every step a node's `latest` names, and the newest keep_last - 1 others (and
/// what `keep` keeps); each other step is removed from every node root (remove_node_step). A
/// missing node root is skipped. Returns the names removed; throws the first failure.
std::vector<std::string> rotate_node_checkpoints(FileSystem& fs, std::span<const std::string> roots, int keep_last,
                                                 const std::string& committed,
                                                 const std::function<bool(const std::string&)>& keep = {});

}  // namespace ckpt
CKPT_API_END
