// SPDX-License-Identifier: Apache-2.0
// The order of the calls below is the protocol of node_commit.hpp; do not reorder.
#include "ckpt/store/nodes/node_commit.hpp"

#include <algorithm>
#include <exception>
#include <functional>
#include <utility>
#include <set>
#include <string_view>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"

namespace ckpt {

std::optional<std::string> newest_node_checkpoint(FileSystem& fs, std::span<const std::string> roots) {
  auto newest = read_latest_nodes(fs, roots);
  // A step renamed into place on every node root that holds checkpoints (an empty root is
  // a lost node's) is complete: every file of it was durable before the first rename. If
  // it is newer than every `latest` (the nodes whose `latest` had moved may be the lost
  // ones, or the crash came before the first `latest`), and the scheme can rebuild what
  // the lost nodes held, it is the newest checkpoint.
  std::optional<std::set<std::string>> common;
  for (const auto& r : roots) {
    if (!fs.stat(r)) continue;  // a lost node
    std::set<std::string> mine;
    bool holds = false;
    for (const auto& e : fs.list_dir(r)) {
      const bool step_dir = e.type == EntryType::directory && parse_checkpoint_dir_name(e.name);
      holds |= e.name == kLatestName || step_dir;
      if (step_dir && (!newest || e.name > *newest)) mine.insert(e.name);
    }
    if (!holds) continue;
    if (!common) common = std::move(mine);
    else
      for (auto it = common->begin(); it != common->end();) it = mine.count(*it) ? std::next(it) : common->erase(it);
  }
  if (common)
    for (auto it = common->rbegin(); it != common->rend(); ++it) {
      try {
        if (check_node_checkpoint(fs, roots, *it, Verify::none).recoverable()) return *it;
      } catch (const Error&) {
      }
    }
  return newest;
}

std::vector<std::string> prepare_node_roots(FileSystem& fs, std::span<const RootLock> locks) {
  std::vector<std::string> roots;
  for (const auto& l : locks) roots.push_back(l.root());
  const auto newest = newest_node_checkpoint(fs, roots);
  if (newest && newest != read_latest_nodes(fs, roots))
    log_event(LogLevel::info, "node_commit_recovered", join_path(roots[0], *newest) + " is complete on every node root that holds checkpoints: it is the newest checkpoint");
  if (newest) {
    const auto step = parse_checkpoint_dir_name(*newest);
    for (const auto& r : roots) {
      const auto mine = node_latest_step(fs, r);
      if (mine && *mine >= *step) continue;
      const auto st = fs.stat(join_path(r, *newest));
      if (!st || st->type != EntryType::directory) continue;
      log_event(LogLevel::info, "node_latest_repaired", r + ": latest moved forward to " + *newest + " (a commit across nodes was cut between its latest updates)");
      write_latest(fs, r, *newest);
    }
  }
  std::vector<std::string> removed;
  // A removal cut between its renames (remove_node_step): a removal temporary of a step older
  // than the live one on any node root is the order to remove that step from every node root.
  if (const auto live_name = read_latest_nodes(fs, roots))
    if (const auto live = parse_checkpoint_dir_name(*live_name)) {
      std::set<std::string> unfinished;
      for (const auto& r : roots) {
        if (!fs.stat(r)) continue;
        for (const auto& e : fs.list_dir(r))
          if (const auto t = parse_temporary_name(e.name))
            if (const auto step = parse_checkpoint_dir_name(t->final_name); step && *step < *live) unfinished.insert(t->final_name);
      }
      for (const auto& name : unfinished) {
        bool any = false;
        for (const auto& r : roots) any |= fs.stat(join_path(r, name)).has_value();
        if (!any) continue;
        log_event(LogLevel::info, "node_removal_finished", join_path(roots[0], name) + ": finishing its removal from every node root (a rotation or removal across nodes was cut)");
        remove_node_step(fs, roots, name);
        for (std::size_t n = 0; n < roots.size(); ++n) removed.push_back("node-" + std::to_string(n) + "/" + name);
      }
    }
  for (std::size_t n = 0; n < locks.size(); ++n)
    for (auto& name : prepare_root(fs, locks[n])) removed.push_back("node-" + std::to_string(n) + "/" + name);
  return removed;
}

std::vector<std::string> begin_node_checkpoint(FileSystem& fs, std::span<const std::string> roots, std::uint64_t step,
                                               const BeginOptions& options) {
  std::vector<std::string> temps;
  try {
    for (const auto& r : roots) temps.push_back(begin_checkpoint(fs, r, step, options));
  } catch (...) {
    abort_node_checkpoint(fs, roots.first(temps.size()), temps);
    throw;
  }
  return temps;
}

std::string commit_node_checkpoint(FileSystem& fs, std::span<const std::string> roots, std::span<const std::string> temps,
                                   const Manifest& manifest, std::string_view manifest_text) {
  if (!manifest.nodes || static_cast<std::size_t>(manifest.nodes->nodes) != roots.size() || temps.size() != roots.size())
    throw Error(Errc::invalid_argument, roots.empty() ? std::string() : roots.front(), "commit across nodes: node roots and temporaries",
                std::to_string(manifest.nodes ? manifest.nodes->nodes : 0) + " of each (the manifest's node count)",
                std::to_string(roots.size()) + " roots, " + std::to_string(temps.size()) + " temporaries");
  const std::string name = checkpoint_dir_name(manifest.step);
  const std::string text = manifest_text.empty() ? encode_manifest(manifest) : std::string(manifest_text);
  // Never commit what the loader refuses, nor bytes of another step or layout.
  if (const Manifest decoded = decode_manifest(text, join_path(temps[0], kManifestName));
      decoded.step != manifest.step || decoded.nodes != manifest.nodes)
    throw Error(Errc::invalid_argument, join_path(temps[0], kManifestName), "the manifest text's step and layout", checkpoint_dir_name(manifest.step),
                checkpoint_dir_name(decoded.step));
  for (std::size_t n = 0; n < roots.size(); ++n) {
    detail::write_small_file(fs, join_path(temps[n], kManifestName), text);  // a
    fs.sync_dir(temps[n]);                                                   // b
  }
  std::size_t renamed = 0;
  std::size_t latest_moved = 0;
  try {
    for (; renamed < roots.size(); ++renamed) {
      const std::string final_dir = join_path(roots[renamed], name);
      if (fs.stat(final_dir))
        throw Error(Errc::invalid_argument, final_dir, "checkpoint for step " + std::to_string(manifest.step) + " already exists");
      fs.rename(temps[renamed], final_dir);  // c
    }
    for (const auto& r : roots) fs.sync_dir(r);  // d
    for (; latest_moved < roots.size(); ++latest_moved) write_latest(fs, roots[latest_moved], name);  // e, f, g
  } catch (...) {
    const auto error = std::current_exception();
    bool committed = latest_moved > 0;
    if (!committed && renamed == roots.size()) {
      // write_latest may have replaced node 0's `latest` and failed in its fsync.
      try {
        committed = read_latest(fs, roots[0]) == name;
      } catch (...) {
      }
    }
    if (committed) {
      for (std::size_t n = latest_moved + 1; n < roots.size(); ++n) try {
          write_latest(fs, roots[n], name);
        } catch (...) {
        }
    } else {
      for (std::size_t n = 0; n < renamed; ++n) try {
          fs.rename(join_path(roots[n], name), temps[n]);
        } catch (...) {
        }
    }
    std::rethrow_exception(error);
  }
  return join_path(roots[0], name);
}

void abort_node_checkpoint(FileSystem& fs, std::span<const std::string> roots, std::span<const std::string> temps) noexcept {
  for (std::size_t n = 0; n < temps.size() && n < roots.size(); ++n)
    if (!temps[n].empty()) abort_checkpoint(fs, roots[n], temps[n]);
}

void remove_node_step(FileSystem& fs, std::span<const std::string> roots, const std::string& name) {
  // Every node's directory renamed (and made durable) before any is deleted: a kill between
  // two renames leaves removal temporaries behind, which the next prepare_node_roots takes as
  // the order to finish, never a step gone from some node roots and whole on others.
  std::vector<std::pair<std::string, std::string>> doomed;  // root, temporary
  std::exception_ptr error;
  for (const auto& r : roots) {
    try {
      const auto st = fs.stat(join_path(r, name));
      if (!st || st->type != EntryType::directory) continue;
      const std::string temp = temporary_name(name);
      fs.rename(join_path(r, name), join_path(r, temp));
      fs.sync_dir(r);
      doomed.emplace_back(r, temp);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  for (const auto& [r, temp] : doomed) {
    try {
      fs.remove_all(join_path(r, temp));
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

std::vector<std::string> rotate_node_checkpoints(FileSystem& fs, std::span<const std::string> roots, int keep_last,
                                                 const std::string& committed, const std::function<bool(const std::string&)>& keep) {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  // The steps of every node root but the committed one and any a node's `latest` names; the
  // same names are removed from every node root.
  std::vector<std::string> others;
  std::set<std::string> live;
  std::exception_ptr error;
  for (const auto& r : roots) {
    try {
      if (!fs.stat(r)) continue;  // a lost node
      if (const auto latest = read_latest(fs, r)) live.insert(*latest);
      for (const auto& e : fs.list_dir(r))
        if (e.type == EntryType::directory && parse_checkpoint_dir_name(e.name) && e.name != committed) others.push_back(e.name);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  std::erase_if(others, [&](const std::string& name) { return live.count(name) > 0; });
  for (const auto& name : rotation_victims(std::move(others), keep_last, keep)) {
    try {
      remove_node_step(fs, roots, name);
      removed.push_back(name);
    } catch (...) {
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return removed;
}

}  // namespace ckpt
