// The copy between tiers and the tiered open; the protocol is in tiers.hpp and
// docs/commit-protocol.md ("Two tiers").
#include "ckpt/store/tiers.hpp"

#include <boost/json.hpp>
#include <exception>
#include <functional>
#include <optional>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/format/json_util.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/store/object/object_lease.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/store/run_identity.hpp"
#include "ckpt/shard/shard_writer.hpp"
#include "ckpt/hash/xxh3.hpp"

namespace ckpt {

namespace json = boost::json;

namespace {

std::string encode_copy_record(const CopyRecord& r) {
  return json::serialize(json::object{{"step", r.step},
                                      {"source_root", r.source_root},
                                      {"source_dir", r.source_dir},
                                      {"copied_at", r.copied_at},
                                      {"bytes", r.bytes},
                                      {"verified", json::object{{"xxh3_chunks", r.xxh3_chunks_verified}, {"sha256", r.sha256_verified}}}}) +
         "\n";
}

// Copies one shard through the reader's verified stream into `out_dir`, through the shard
// writer (which hashes what it writes), then checks that what was written is what the
// manifest records: the copy is verified end to end, not only on the way in.
std::uint64_t copy_shard(const CheckpointReader& src, const ShardRecord& s, Verify verify, FileSystem& dst_fs, const std::string& out_dir,
                         std::uint64_t chunk_size) {
  ShardWriter out = ShardWriter::copy(dst_fs, out_dir, s.path, s.size, {.chunk_size = chunk_size, .sha256 = false});
  std::uint64_t chunks = 0;
  src.stream_shard(s.rank, verify, [&](std::uint64_t, std::span<const std::byte> piece) {
    out.write(piece);
    ++chunks;
  });
  const ShardReport written = out.finish(s.rank);
  if (written.shard.xxh3 != s.xxh3 || written.shard.chunk_xxh3 != s.chunk_xxh3)
    throw Error(Errc::checksum_mismatch, out.path(), "xxh3 of the copied file", xxh3_hex(s.xxh3), xxh3_hex(written.shard.xxh3));
  return chunks;
}

}  // namespace

CopyRecord copy_checkpoint(FileSystem& src_fs, const std::string& src_root, std::uint64_t step, FileSystem& dst_fs,
                           const std::string& dst_root, Verify verify, const BeginOptions& begin) {
  const std::string name = checkpoint_dir_name(step);
  const CheckpointReader src = CheckpointReader::open(src_fs, join_path(src_root, name));
  const Manifest& m = src.manifest();
  CopyRecord rec;
  rec.step = step;
  rec.source_root = src_root;
  rec.source_dir = name;
  rec.sha256_verified = verify == Verify::full;
  const RootLock lock(dst_fs, dst_root);
  prepare_root(dst_fs, lock);
  const std::string temp = begin_checkpoint(dst_fs, dst_root, step, begin);
  try {
    for (const auto& s : m.shards) {
      const std::uint64_t chunks = copy_shard(src, s, verify, dst_fs, temp, m.chunk_size);
      if (verify != Verify::none) rec.xxh3_chunks_verified += chunks;
      rec.bytes += s.size;
    }
    rec.copied_at = utc_now_rfc3339();
    detail::write_small_file(dst_fs, join_path(temp, kCopyRecordName), encode_copy_record(rec));
    // A checkpoint across node roots arrives as one of one root: its shards, without the
    // node layout and the redundancy blocks (the durable tier is the redundancy there).
    if (m.nodes) {
      Manifest plain = m;
      plain.nodes.reset();
      plain.redundancy.clear();
      commit_checkpoint(dst_fs, dst_root, temp, plain);
    } else {
      commit_checkpoint(dst_fs, dst_root, temp, m);
    }
  } catch (...) {
    abort_checkpoint(dst_fs, dst_root, temp);
    throw;
  }
  return rec;
}

CopyRecord read_copy_record(FileSystem& fs, const std::string& dir) {
  const std::string path = join_path(dir, kCopyRecordName);
  const std::string text = detail::read_small_file(fs, path, 64 * 1024, Errc::malformed_manifest);
  const detail::JsonContext c{Errc::malformed_manifest, path};
  const json::value root = detail::json_parse(c, text, "copy record JSON");
  const json::object& o = detail::json_obj(c, root, "copy record");
  CopyRecord r;
  r.step = detail::json_u64(c, detail::json_field(c, o, "step", ""), "step");
  r.source_root = std::string(detail::json_str(c, detail::json_field(c, o, "source_root", ""), "source_root"));
  r.source_dir = std::string(detail::json_str(c, detail::json_field(c, o, "source_dir", ""), "source_dir"));
  r.copied_at = std::string(detail::json_str(c, detail::json_field(c, o, "copied_at", ""), "copied_at"));
  r.bytes = detail::json_u64(c, detail::json_field(c, o, "bytes", ""), "bytes");
  const json::object& v = detail::json_obj(c, detail::json_field(c, o, "verified", ""), "verified");
  r.xxh3_chunks_verified = detail::json_u64(c, detail::json_field(c, v, "xxh3_chunks", "verified."), "verified.xxh3_chunks");
  const json::value& sha = detail::json_field(c, v, "sha256", "verified.");
  if (!sha.is_bool()) c.fail("verified.sha256", "boolean", detail::json_kind(sha));
  r.sha256_verified = sha.get_bool();
  return r;
}

namespace {

// The newest checkpoint of one root, verified. `older`: also try the older ones.
OpenedCheckpoint open_verified(FileSystem& fs, const std::string& root, const OpenLatestOptions& opt, bool older) {
  if (older) return open_latest(fs, root, {.expected_world_size = opt.expected_world_size, .fallback = true, .verify = opt.verify});
  OpenedCheckpoint o = open_latest(fs, root, {.expected_world_size = opt.expected_world_size});
  o.reader.verify(opt.verify);
  return o;
}

}  // namespace

namespace {

// Both durable tiers' order: the newest local checkpoint, verified; else what `open_durable`
// opens (it throws when the durable tier has nothing good); else, with opt.fallback, an older
// local one. A world-size mismatch is never retried elsewhere: it is the caller's error.
TieredCheckpoint open_in_tiers(FileSystem& local_fs, const std::string& local_root, const OpenLatestOptions& opt,
                               const std::string& durable_name, const std::function<OpenedCheckpoint()>& open_durable) {
  std::string local_error, durable_error;
  try {
    return {open_verified(local_fs, local_root, opt, false), "local", {}, {}};
  } catch (const Error& e) {
    if (e.code() == Errc::world_size_mismatch) throw;
    local_error = e.what();
  }
  try {
    return {open_durable(), "durable", local_error, {}};
  } catch (const Error& e) {
    // A world-size mismatch is the caller's; a checkpoint of another run, or a live writer
    // (of the store, or of the local root), is refused, not passed over for an older one.
    if (e.code() == Errc::world_size_mismatch || e.code() == Errc::conflict || e.code() == Errc::busy) throw;
    durable_error = e.what();
  }
  if (opt.fallback) {
    try {
      return {open_verified(local_fs, local_root, opt, true), "local", {}, {}};
    } catch (const Error& e) {
      if (e.code() == Errc::world_size_mismatch) throw;
    }
  }
  throw Error(Errc::not_found, local_root, "no checkpoint that opens and verifies in either tier (durable: " + durable_name + ")",
              "a good checkpoint", "local: " + local_error + "; durable: " + durable_error);
}

// Refuses (Errc::conflict, naming both runs) to continue `tier`'s checkpoint in a local root
// of another run (or of none), unless `adopt`. A checkpoint that records no run (a store
// written before run identities) passes.
void check_run(const ObjectManifest& tier, const std::optional<std::string>& local_run, bool adopt, const std::string& object,
               const std::string& local_root) {
  if (tier.run.empty() || tier.run == local_run || adopt) return;
  const std::string step = checkpoint_dir_name(tier.step);
  if (local_run)
    throw Error(Errc::conflict, object,
                step + " was committed by run " + tier.run + ", not by run " + *local_run + " of the local root " + local_root +
                    ": another job's checkpoint on this prefix (to continue run " + tier.run +
                    " here, resume with adopt_run (ckpt-demo --adopt-run); to keep run " + *local_run + ", use another prefix)",
                "run " + *local_run, "run " + tier.run);
  throw Error(Errc::conflict, object,
              step + " was committed by run " + tier.run + "; the local root " + local_root +
                  " has no run of its own (a new root): resume with adopt_run (ckpt-demo --adopt-run) to continue run " + tier.run + " here",
              "a run of the local root", "run " + tier.run);
}

// A writer of another run than the local root's holds the store's lease and it has not
// expired: restoring (and adopting) what it is still writing would race it, and its lease
// refuses this run's writer anyway (store/object/object_lease.hpp). Errc::busy naming both.
void refuse_live_writer(ObjectStore& durable, const std::optional<std::string>& local_run, const std::string& local_root) {
  std::optional<ObjectLeaseState> lease;
  try {
    lease = read_object_lease(durable);
  } catch (const Error& e) {
    if (e.code() != Errc::malformed_manifest) throw;  // not a lease: the writer's take() deals with it
  }
  if (!lease || lease->record.released || lease->record.run == local_run) return;
  const auto expires = parse_rfc3339(lease->record.expires_at);
  if (!expires || *expires <= std::chrono::system_clock::now()) return;
  throw Error(Errc::busy, durable.name_of(kLeaseName),
              "another writer holds the lease of " + durable.name_of("") + " and writes there now: a resume into " + local_root + " (run " +
                  local_run.value_or("none yet") + ") does not restore its checkpoints",
              "no live writer of another run", lease->record.describe());
}

// The object store's candidates, newest first, restored into the local root in turn until
// one opens; the first failure is rethrown when none does. Without a `latest` every
// committed step is a candidate (none is "the" checkpoint: the newest that restores is).
OpenedCheckpoint restore_from_object_tier(FileSystem& local_fs, const std::string& local_root, ObjectStore& durable,
                                          const OpenLatestOptions& opt, bool adopt, std::string& adopted) {
  std::vector<std::uint64_t> candidates;
  if (const auto latest = read_object_latest(durable)) candidates.push_back(latest->step);
  const bool no_latest = candidates.empty();
  if (opt.fallback || no_latest) {
    auto steps = list_object_checkpoints(durable);
    for (auto it = steps.rbegin(); it != steps.rend(); ++it)
      if (candidates.empty() || *it != candidates.front()) candidates.push_back(*it);
  }
  if (candidates.empty()) throw Error(Errc::not_found, durable.name_of(""), "no committed checkpoint on the object store");
  const std::optional<std::string> local_run = read_run_identity(local_fs, local_root);
  refuse_live_writer(durable, local_run, local_root);
  std::exception_ptr first_error;
  for (const std::uint64_t step : candidates) {
    try {
      const std::string name = checkpoint_dir_name(step);
      const ObjectManifest tier = read_object_manifest(durable, step);
      check_run(tier, local_run, adopt, durable.name_of(name + "/" + std::string(kObjectManifestName)), local_root);
      if (local_fs.stat(join_path(local_root, name))) {
        // A local copy that did not open or verify (`latest` may name it, so
        // remove_checkpoint would refuse): renamed to a temporary, which the restore's
        // prepare_root removes, as it would a crashed writer's.
        const RootLock lock(local_fs, local_root);
        const std::string temp = join_path(local_root, temporary_name(name));
        log_line("resume: setting the local " + join_path(local_root, name) + " aside (" + temp + ") to restore it from " +
                 durable.name_of(name));
        local_fs.rename(join_path(local_root, name), temp);
        local_fs.sync_dir(local_root);
      }
      const Verify v = opt.verify == Verify::none ? Verify::fast : opt.verify;
      restore_from_object_store(durable, step, local_fs, local_root, {.verify = v, .begin = {.allow_older_than_latest = true}});
      std::string note = "restored " + name + " from " + durable.name_of(name) + " into " + local_root;
      if (!tier.run.empty() && tier.run != local_run) {
        // Adopted: the local root continues that run from now on.
        write_run_identity(local_fs, RootLock(local_fs, local_root), tier.run);
        adopted = tier.run;
        note += ", adopting run " + tier.run + (local_run ? " in place of the local root's run " + *local_run : std::string());
      }
      CheckpointReader reader = open_step(local_fs, local_root, step, opt.expected_world_size);
      log_line("resume: " + note);
      return OpenedCheckpoint{std::move(reader), name, step != candidates.front() && !no_latest, note};
    } catch (const Error& e) {
      if (e.code() == Errc::world_size_mismatch || e.code() == Errc::conflict || e.code() == Errc::busy) throw;
      if (!first_error) first_error = std::current_exception();
    }
  }
  std::rethrow_exception(first_error);
}

}  // namespace

TieredCheckpoint open_latest_tiered(FileSystem& local_fs, const std::string& local_root, FileSystem& durable_fs,
                                    const std::string& durable_root, const OpenLatestOptions& opt) {
  return open_in_tiers(local_fs, local_root, opt, durable_root,
                       [&] { return open_verified(durable_fs, durable_root, opt, opt.fallback); });
}

TieredCheckpoint open_latest_tiered(FileSystem& local_fs, const std::string& local_root, ObjectStore& durable,
                                    const OpenLatestOptions& opt, bool adopt_run) {
  std::string adopted;
  TieredCheckpoint t = open_in_tiers(local_fs, local_root, opt, durable.name_of(""),
                                     [&] { return restore_from_object_tier(local_fs, local_root, durable, opt, adopt_run, adopted); });
  t.adopted_run = std::move(adopted);
  return t;
}

std::optional<std::string> find_committed_checkpoint(FileSystem& fs, const std::string& root) {
  if (!fs.stat(root)) return std::nullopt;
  const std::string latest = join_path(root, kLatestName);
  if (fs.stat(latest)) return latest;
  const int nodes = count_node_roots(fs, root);
  if (nodes == 0) return std::nullopt;
  const auto roots = node_root_paths(root, nodes);
  for (const auto& r : roots)
    if (fs.stat(r) && fs.stat(join_path(r, kLatestName))) return join_path(r, kLatestName);
  if (const auto step = newest_node_checkpoint(fs, roots))
    return join_path(join_path(root, "node-*"), *step) + " (renamed into place on every node root, no latest names it yet)";
  return std::nullopt;
}

std::optional<std::string> find_committed_checkpoint(ObjectStore& store) {
  if (read_object_latest(store)) return store.name_of(kLatestName);
  const auto steps = list_object_checkpoints(store);
  if (steps.empty()) return std::nullopt;
  return store.name_of(checkpoint_dir_name(steps.back()) + "/" + std::string(kObjectManifestName)) + " (committed, no latest names it)";
}

}  // namespace ckpt
