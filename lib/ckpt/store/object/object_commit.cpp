// SPDX-License-Identifier: Apache-2.0
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/objstore/object_transfer.hpp"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <charconv>
#include <random>

#include <boost/json.hpp>

#include "ckpt/format/manifest.hpp"
#include "ckpt/hash/sha256.hpp"
#include "ckpt/hash/xxh3.hpp"
#include "ckpt/read/chunk_check.hpp"
#include "ckpt/read/shard_header.hpp"
#include "ckpt/read/tensor_lookup.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/store/copy.hpp"
#include "ckpt/store/detail/kinds.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/store/run_identity.hpp"

#include <mutex>
#include <thread>

namespace ckpt {

namespace {

namespace json = boost::json;

void check_run_id(const std::string& id) {
  if (!is_valid_id(id)) throw Error(Errc::invalid_argument, {}, "ObjectCommitOptions::run_id", "1..64 of [A-Za-z0-9_-]", id);
}

std::string tier_manifest_key(std::uint64_t step) { return checkpoint_dir_name(step) + "/" + std::string(kObjectManifestName); }

std::string encode(const ObjectManifest& m) {
  json::object o{{"schema_version", 1},
                 {"step", m.step},
                 {"run_id", m.run_id},
                 {"data_prefix", m.data_prefix},
                 {"manifest_sha256", m.manifest_sha256},
                 {"manifest_size", m.manifest_size},
                 {"bytes", m.bytes},
                 {"committed_at", m.committed_at}};
  if (!m.run.empty()) o["run"] = m.run;  // absent in stores written before run identities
  return json::serialize(o) + "\n";
}

// `latest`'s content: the step, then who moved it there.
std::string latest_text(std::uint64_t step, const std::string& run, const std::string& holder) {
  std::string text = checkpoint_dir_name(step) + "\n";
  if (!run.empty()) text += "run " + run + "\n";
  if (!holder.empty()) text += "holder " + holder + "\n";
  return text;
}

}  // namespace

ObjectManifest read_object_manifest(ObjectStore& store, std::uint64_t step) {
  const std::string key = store.name_of(tier_manifest_key(step));
  const ObjectInfo info = store.head(tier_manifest_key(step));
  if (info.size > (64u << 10))
    throw Error(Errc::malformed_manifest, key, "tier manifest too large", "at most 65536 bytes", std::to_string(info.size) + " bytes");
  std::vector<std::byte> bytes(info.size);
  if (!bytes.empty()) store.get_range(tier_manifest_key(step), 0, bytes);
  auto bad = [&](const std::string& what) -> ObjectManifest { throw Error(Errc::malformed_manifest, key, what); };
  boost::system::error_code ec;
  const json::value v = json::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), ec);
  const json::object* o = ec ? nullptr : v.if_object();
  if (!o) return bad("not a JSON object");
  auto str = [&](const char* k) {
    const json::value* f = o->if_contains(k);
    if (!f || !f->is_string()) bad(std::string("field ") + k + " missing or not a string");
    return std::string(f->get_string());
  };
  auto num = [&](const char* k) {
    const json::value* f = o->if_contains(k);
    if (!f || !(f->is_uint64() || (f->is_int64() && f->get_int64() >= 0))) bad(std::string("field ") + k + " missing or not a count");
    return f->is_uint64() ? f->get_uint64() : static_cast<std::uint64_t>(f->get_int64());
  };
  if (num("schema_version") != 1) bad("unsupported tier manifest schema_version");
  ObjectManifest m{num("step"), str("run_id"), {}, str("data_prefix"), str("manifest_sha256"), num("manifest_size"), num("bytes"),
                   str("committed_at")};
  if (m.step != step) throw Error(Errc::malformed_manifest, key, "step", std::to_string(step), std::to_string(m.step));
  if (!is_valid_id(m.run_id)) throw Error(Errc::malformed_manifest, key, "run_id", "1..64 of [A-Za-z0-9_-]", m.run_id.substr(0, 80));
  if (o->contains("run")) {
    m.run = str("run");
    if (!is_valid_id(m.run)) throw Error(Errc::malformed_manifest, key, "run", "1..64 of [A-Za-z0-9_-]", m.run.substr(0, 80));
  }
  if (m.data_prefix != checkpoint_dir_name(step) + "/" + m.run_id + "/")
    throw Error(Errc::malformed_manifest, key, "data_prefix", checkpoint_dir_name(step) + "/" + m.run_id + "/", m.data_prefix);
  return m;
}

std::optional<ObjectLatest> read_object_latest(ObjectStore& store) {
  ObjectInfo info;
  try {
    info = store.head(std::string(kLatestName));
  } catch (const Error& e) {
    if (e.code() == Errc::not_found) return std::nullopt;
    throw;
  }
  const std::string name = store.name_of(kLatestName);
  if (info.size > 512) throw Error(Errc::malformed_manifest, name, "latest too large", "at most 512 bytes", std::to_string(info.size) + " bytes");
  std::string text(info.size, '\0');
  if (!text.empty()) store.get_range(kLatestName, 0, std::as_writable_bytes(std::span(text)));
  std::string_view rest = text;
  const std::size_t eol = std::min(rest.find('\n'), rest.size());
  const auto step = parse_checkpoint_dir_name(rest.substr(0, eol));
  if (!step) throw Error(Errc::malformed_manifest, name, "content", "step-N", text.substr(0, 64));
  ObjectLatest out{*step, info.etag, {}, {}};
  rest.remove_prefix(std::min(eol + 1, rest.size()));
  while (!rest.empty()) {
    const std::size_t end = std::min(rest.find('\n'), rest.size());
    const std::string_view line = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    std::string* field = line.starts_with("run ") ? &out.run : line.starts_with("holder ") ? &out.holder : nullptr;
    if (!field) continue;  // a later version's line
    const std::string_view value = line.substr(line.find(' ') + 1);
    if (!is_valid_id(value)) throw Error(Errc::malformed_manifest, name, std::string(line.substr(0, line.find(' '))), "1..64 of [A-Za-z0-9_-]",
                                         std::string(value.substr(0, 80)));
    *field = std::string(value);
  }
  return out;
}

bool move_object_latest(ObjectStore& store, std::uint64_t step, const std::string& run, const std::string& holder) {
  (void)read_object_manifest(store, step);  // never name an uncommitted step
  const std::string content = latest_text(step, run, holder);
  const auto bytes = std::as_bytes(std::span(content));
  for (int attempt = 1;; ++attempt) {
    const auto current = read_object_latest(store);
    if (attempt > 1 && current && !holder.empty() && !current->holder.empty() && current->holder != holder)
      throw Error(Errc::busy, store.name_of(kLatestName),
                  "latest was moved to " + checkpoint_dir_name(current->step) + " by another writer while writer " + holder + " of run " +
                      (run.empty() ? "?" : run) + " moved it to " + checkpoint_dir_name(step) +
                      ": another writer commits to this prefix (this one's lease was taken over), so this one stops",
                  "holder " + holder, "holder " + current->holder + " of run " + (current->run.empty() ? "?" : current->run));
    if (current && current->step >= step) return false;
    try {
      if (current) store.replace(kLatestName, bytes, current->etag);
      else store.create(kLatestName, bytes);
      return true;
    } catch (const Error& e) {
      // Another mover got in between (or removed `latest`): read again.
      if ((e.code() != Errc::conflict && e.code() != Errc::not_found) || attempt >= 16) throw;
    }
  }
}

std::vector<std::uint64_t> list_object_checkpoints(ObjectStore& store) {
  std::vector<std::uint64_t> steps;
  std::string token;
  do {
    ObjectPage page = store.list("step-", token, 1000);
    for (const auto& o : page.objects) {
      const auto slash = o.key.find('/');
      if (slash == std::string::npos || o.key.substr(slash + 1) != kObjectManifestName) continue;
      if (const auto step = parse_checkpoint_dir_name(std::string_view(o.key).substr(0, slash))) steps.push_back(*step);
    }
    token = std::move(page.next_token);
  } while (!token.empty());
  return steps;  // the listing is in key order, and step names sort numerically
}

ObjectCommitReport commit_to_object_store(FileSystem& local_fs, const std::string& local_root, std::uint64_t step,
                                          ObjectStore& store, const ObjectCommitOptions& options) {
  if (!options.run_id.empty()) check_run_id(options.run_id);
  if (!options.run.empty() && !is_valid_id(options.run))
    throw Error(Errc::invalid_argument, {}, "ObjectCommitOptions::run", "1..64 of [A-Za-z0-9_-]", options.run);
  if (options.fence) options.fence();
  // The one copy between stores (store/copy.hpp), into a commit attempt of this protocol.
  const auto source = open_store(local_root, {.fs = &local_fs});
  const auto target = detail::make_object_target(store, step, options);
  const CopyReport copied = copy_into(*source, step, *target, {.verify = options.verify_chunks ? Verify::fast : Verify::none});
  ObjectCommitReport report;
  report.step = step;
  report.run_id = target->run_id();
  report.data_prefix = target->data_prefix();
  report.bytes = copied.bytes;
  report.chunks_verified = copied.chunks_verified;
  report.latest_moved = target->latest_moved();
  return report;
}

bool commit_object_step(ObjectStore& store, std::uint64_t step, const std::string& run_id, std::span<const std::byte> manifest,
                        std::uint64_t shard_bytes, const ObjectCommitOptions& options) {
  check_run_id(run_id);
  auto fence = [&] {
    if (options.fence) options.fence();
  };
  const std::string data_prefix = checkpoint_dir_name(step) + "/" + run_id + "/";
  // 2. The checkpoint's manifest, byte for byte.
  fence();
  store.put(data_prefix + std::string(kManifestName), manifest);

  // 3. The tier manifest, created only if no writer committed this step before: the commit.
  const Sha256Digest digest = sha256(manifest.data(), manifest.size());
  const ObjectManifest tier{step, run_id, options.run, data_prefix, to_hex(digest), manifest.size(), shard_bytes, utc_now_rfc3339()};
  const std::string text = encode(tier);
  fence();
  try {
    store.create(tier_manifest_key(step), std::as_bytes(std::span(text)));
  } catch (const Error& e) {
    if (e.code() != Errc::conflict) throw;
    throw Error(Errc::conflict, e.file(), checkpoint_dir_name(step) + " was committed by another writer first; run " +
                run_id + "'s data stays uncommitted", e.expected(), e.actual());
  }

  // 4. `latest`, forward only.
  if (!options.move_latest) return false;
  fence();
  return move_object_latest(store, step, options.run, options.holder);
}

namespace {

// Every object whose key starts with `prefix`, through all pages.
std::vector<ObjectInfo> list_all(ObjectStore& store, const std::string& prefix) {
  std::vector<ObjectInfo> all;
  std::string token;
  do {
    ObjectPage page = store.list(prefix, token, 1000);
    for (auto& o : page.objects) all.push_back(std::move(o));
    token = std::move(page.next_token);
  } while (!token.empty());
  return all;
}

}  // namespace

void remove_object_checkpoint(ObjectStore& store, std::uint64_t step) {
  (void)read_object_manifest(store, step);  // not_found unless committed
  if (const auto latest = read_object_latest(store); latest && latest->step == step)
    throw Error(Errc::invalid_argument, store.name_of(tier_manifest_key(step)), "the checkpoint latest names is never removed",
                "another step", checkpoint_dir_name(step));
  store.remove(tier_manifest_key(step));
  for (const auto& o : list_all(store, checkpoint_dir_name(step) + "/")) store.remove(o.key);
}

std::vector<std::uint64_t> rotate_object_checkpoints(ObjectStore& store, int keep_last) {
  if (keep_last < 1) throw Error(Errc::invalid_argument, {}, "keep_last", "at least 1", std::to_string(keep_last));
  const auto steps = list_object_checkpoints(store);
  const auto latest = read_object_latest(store);
  std::vector<std::uint64_t> removed;
  const std::size_t keep = static_cast<std::size_t>(keep_last);
  for (std::size_t i = 0; i + keep < steps.size(); ++i) {
    if (latest && latest->step == steps[i]) continue;
    remove_object_checkpoint(store, steps[i]);
    removed.push_back(steps[i]);
  }
  return removed;
}

LeftoverReport collect_object_leftovers(ObjectStore& store, std::chrono::seconds grace, std::chrono::system_clock::time_point now) {
  LeftoverReport report;
  auto old_enough = [&](const std::string& stamp) {
    const auto t = parse_rfc3339(stamp);
    if (t && *t + grace < now) return true;
    ++report.kept_young;
    return false;
  };
  std::map<std::uint64_t, std::optional<std::string>> committed_run;  // step -> the run its tier manifest names
  auto committed = [&](std::uint64_t step) -> const std::optional<std::string>& {
    auto it = committed_run.find(step);
    if (it != committed_run.end()) return it->second;
    std::optional<std::string> run;
    try {
      run = read_object_manifest(store, step).run_id;
    } catch (const Error& e) {
      if (e.code() != Errc::not_found) throw;  // a damaged tier manifest is not a leftover: leave it to a human
    }
    return committed_run.emplace(step, std::move(run)).first->second;
  };
  for (const auto& o : list_all(store, "step-")) {
    // step-N/<run>/<file>: data; step-N/manifest.json: the commit itself, never collected here.
    const auto first = o.key.find('/');
    const auto second = first == std::string::npos ? std::string::npos : o.key.find('/', first + 1);
    const auto step = parse_checkpoint_dir_name(std::string_view(o.key).substr(0, first));
    if (!step || second == std::string::npos) continue;
    const std::string run = o.key.substr(first + 1, second - first - 1);
    const auto& winner = committed(*step);
    if (winner && *winner == run) continue;
    if (!old_enough(o.last_modified)) continue;
    store.remove(o.key);
    report.removed.push_back(o.key);
  }
  for (const auto& u : store.list_multipart_uploads("step-", 1000)) {
    if (!old_enough(u.initiated)) continue;
    try {
      store.abort_multipart(u.key, u.upload_id);
    } catch (const Error& e) {
      if (e.code() != Errc::not_found) throw;  // completed or aborted meanwhile
    }
    report.aborted.push_back(u.key);
  }
  return report;
}

ObjectCheckpoint open_object_checkpoint(ObjectStore& store, std::uint64_t step) {
  ObjectCheckpoint out{read_object_manifest(store, step), {}, {}};
  const std::string key = out.tier.data_prefix + std::string(kManifestName), name = store.name_of(key);
  const ObjectInfo info = store.head(key);
  check_size(out.tier.manifest_size, info.size, "checkpoint manifest size", name);
  std::string text(info.size, '\0');
  if (!text.empty()) store.get_range(key, 0, std::as_writable_bytes(std::span(text)));
  const std::string sha = to_hex(sha256(text.data(), text.size()));
  if (sha != out.tier.manifest_sha256)
    throw Error(Errc::checksum_mismatch, name, "sha256 of the checkpoint manifest", out.tier.manifest_sha256, sha);
  out.manifest = decode_manifest(text, name);
  if (out.manifest.step != step) throw Error(Errc::malformed_manifest, name, "step", std::to_string(step), std::to_string(out.manifest.step));
  out.manifest_bytes = std::move(text);
  return out;
}

namespace {

// The header of shard file `file` (the object `key`) against the manifest index, read in
// ranged GETs: CheckpointReader::check_file_header's check, naming the object.
void check_object_header(ObjectStore& store, const ObjectCheckpoint& ck, const std::string& key, const ShardRecord& file, Verify mode) {
  detail::read_checked_shard_header(
      ck.manifest, file, [&](std::uint64_t offset, std::span<std::byte> out) { store.get_range(key, offset, out); }, store.name_of(key),
      mode);
}

// The one read loop over a committed step's shards on the store (those of `which`, indices
// into the manifest's shards; empty: all), shared by verify, restore and the tensor read's
// full check: shards `parallel` at once (each in order, in ranged GETs of `read_size` rounded
// to whole chunks), each piece's chunks checked against the manifest (Verify::fast and full)
// before `sink(rank, bytes)` sees it, then `done(rank, whole-file xxh3, sha256 or "")`
// compares the whole file. The first failure stops the others; it is rethrown.
void read_object_shards(ObjectStore& store, const ObjectCheckpoint& ck, Verify mode, std::uint64_t read_size, int parallel,
                        const std::function<void(std::size_t)>& begin,
                        const std::function<void(std::size_t, std::span<const std::byte>)>& sink,
                        const std::function<void(std::size_t)>& end, std::atomic<std::uint64_t>& chunks,
                        std::vector<std::size_t> which = {}) {
  const Manifest& m = ck.manifest;
  if (which.empty())
    for (std::size_t i = 0; i < m.shards.size(); ++i) which.push_back(i);
  if (parallel < 1 || parallel > 64) throw Error(Errc::invalid_argument, {}, "shards in parallel", "1..64", std::to_string(parallel));
  if (m.chunk_size == 0) throw Error(Errc::malformed_manifest, store.name_of(ck.tier.data_prefix + std::string(kManifestName)), "chunk_size 0");
  read_size = std::max<std::uint64_t>(1, (read_size + m.chunk_size - 1) / m.chunk_size) * m.chunk_size;
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::exception_ptr first_error;
  auto worker = [&] {
    try {
      std::vector<std::byte> buffer;
      for (;;) {
        const std::size_t n = next.fetch_add(1);
        if (n >= which.size() || failed.load()) return;
        const std::size_t i = which[n];
        const ShardRecord& s = m.shards[i];
        const std::string key = ck.tier.data_prefix + s.path, name = store.name_of(key);
        check_size(s.size, store.head(key).size, "shard size", name);
        begin(i);
        for (std::uint64_t offset = 0; offset < s.size && !failed.load(); offset += read_size) {
          buffer.resize(std::min(read_size, s.size - offset));
          store.get_range(key, offset, buffer);
          if (mode != Verify::none) {
            for (std::uint64_t done = 0; done < buffer.size(); done += m.chunk_size) {
              const std::uint64_t k = (offset + done) / m.chunk_size;
              if (k >= s.chunk_xxh3.size()) throw Error(Errc::malformed_manifest, name, "more chunks than chunk_xxh3 lists");
              detail::check_chunk_xxh3(name, s.chunk_xxh3, k, m.chunk_size,
                                       std::span<const std::byte>(buffer).subspan(done, std::min<std::uint64_t>(m.chunk_size, buffer.size() - done)));
              chunks.fetch_add(1);
            }
          }
          sink(i, buffer);
        }
        if (failed.load()) return;
        end(i);
      }
    } catch (...) {
      std::lock_guard guard(mu);
      if (!first_error) first_error = std::current_exception();
      failed = true;
    }
  };
  {
    std::vector<std::jthread> threads;
    const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(parallel), which.size());
    for (std::size_t t = 1; t < n; ++t) threads.emplace_back(worker);
    worker();
  }
  if (first_error) std::rethrow_exception(first_error);
}

// verify_object_checkpoint's checks of the shards of `which` (empty: all); returns the
// chunk XXH3s computed.
std::uint64_t verify_object_shards(ObjectStore& store, const ObjectCheckpoint& ck, Verify mode, const ProgressFn& progress,
                                   std::uint64_t read_size, int parallel_shards, const std::vector<std::size_t>& which = {}) {
  const Manifest& m = ck.manifest;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < m.shards.size(); ++i)
    if (which.empty() || std::find(which.begin(), which.end(), i) != which.end()) total += m.shards[i].size;
  if (mode == Verify::none) {
    // Sizes and headers only, as CheckpointReader::verify checks a local checkpoint at none:
    // no shard is downloaded (a listing of a store must not read every byte it holds).
    std::uint64_t checked = 0;
    for (std::size_t i = 0; i < m.shards.size(); ++i) {
      if (!which.empty() && std::find(which.begin(), which.end(), i) == which.end()) continue;
      const ShardRecord& s = m.shards[i];
      const std::string key = ck.tier.data_prefix + s.path;
      check_size(s.size, store.head(key).size, "shard size", store.name_of(key));
      check_object_header(store, ck, key, s, Verify::none);
      checked += s.size;
      if (progress) progress(checked, total);
    }
    return 0;
  }
  std::vector<Xxh3> xxh(m.shards.size());
  std::vector<Sha256> sha(mode == Verify::full ? m.shards.size() : 0);
  std::mutex progress_mu;
  std::uint64_t done = 0;
  std::atomic<std::uint64_t> chunks{0};
  read_object_shards(
      store, ck, mode, read_size, parallel_shards, [](std::size_t) {},
      [&](std::size_t i, std::span<const std::byte> bytes) {
        if (mode == Verify::full) {
          xxh[i].update(bytes);
          sha[i].update(bytes);
        }
        if (progress) {
          std::lock_guard lock(progress_mu);
          done += bytes.size();
          progress(done, total);
        }
      },
      [&](std::size_t i) {
        const ShardRecord& s = m.shards[i];
        const std::string key = ck.tier.data_prefix + s.path, name = store.name_of(key);
        if (mode == Verify::full) {
          if (xxh[i].digest() != s.xxh3) throw Error(Errc::checksum_mismatch, name, "xxh3 of the whole object", xxh3_hex(s.xxh3), xxh3_hex(xxh[i].digest()));
          const std::string got = to_hex(sha[i].finish());
          if (got != s.sha256) throw Error(Errc::checksum_mismatch, name, "sha256 of the whole object", s.sha256, got);
        }
        // The header against the index, as CheckpointReader::verify checks a local shard (its
        // chunks were checked above, per mode).
        check_object_header(store, ck, key, s, Verify::none);
      },
      chunks, which);
  return chunks.load();
}

}  // namespace

ObjectCheckpoint verify_object_checkpoint(ObjectStore& store, std::uint64_t step, Verify mode, const ProgressFn& progress,
                                          std::uint64_t read_size, int parallel_shards) {
  ObjectCheckpoint ck = open_object_checkpoint(store, step);
  verify_object_shards(store, ck, mode, progress, read_size, parallel_shards);
  return ck;
}

ObjectTensor read_object_tensor(ObjectStore& store, const ObjectCheckpoint& ck, int rank, std::string_view name, Verify mode,
                                std::uint64_t read_size) {
  const Manifest& m = ck.manifest;
  const std::string manifest_name = store.name_of(ck.tier.data_prefix + std::string(kManifestName));
  if (rank < 0 || rank >= m.world_size)
    throw Error(Errc::invalid_argument, manifest_name, "rank",
                "0.." + std::to_string(m.world_size - 1), std::to_string(rank));
  // The file holding the tensor (of a rank's several, its part); unknown: the rank's first.
  const TensorRecord* t = m.find_tensor(name, rank);
  const auto files = m.files_of(rank);
  if (files.empty()) throw Error(Errc::malformed_manifest, manifest_name, "no shard of rank " + std::to_string(rank));
  const ShardRecord* shard = t ? &m.file_of(*t) : &files.front();
  const std::string key = ck.tier.data_prefix + shard->path;
  ObjectTensor out;
  out.object = store.name_of(key);
  out.shard_size = shard->size;
  if (!t) {
    std::vector<TensorRecord> held;
    for (const auto& r : m.tensors)
      if (r.rank == rank) held.push_back(r);
    detail::throw_no_tensor(out.object, rank, held, name);
  }
  out.record = *t;
  if (m.chunk_size == 0) throw Error(Errc::malformed_manifest, manifest_name, "chunk_size 0");
  check_size(shard->size, store.head(key).size, "shard size", out.object);
  if (mode == Verify::full) {
    // The whole object, its header included.
    out.chunks_checked = verify_object_shards(store, ck, Verify::full, {}, read_size, 1, {static_cast<std::size_t>(shard - m.shards.data())});
    out.bytes_checked = shard->size;
  } else {
    // What any safetensors reader of the object sees must be what the index says.
    check_object_header(store, ck, key, *shard, mode);
  }
  if (t->end == t->begin) return out;
  if (mode == Verify::none) {
    out.data.resize(t->end - t->begin);
    for (std::uint64_t at = 0; at < out.data.size(); at += read_size)
      store.get_range(key, t->begin + at, std::span(out.data).subspan(at, std::min<std::uint64_t>(read_size, out.data.size() - at)));
    return out;
  }
  // The chunks covering [begin, end), read whole and checked, then the tensor's bytes kept.
  const std::uint64_t cs = m.chunk_size;
  read_size = std::max<std::uint64_t>(1, (read_size + cs - 1) / cs) * cs;
  const std::uint64_t first = t->begin / cs * cs, last = std::min(shard->size, (t->end + cs - 1) / cs * cs);
  std::vector<std::byte> bytes(last - first);
  for (std::uint64_t at = 0; at < bytes.size(); at += read_size) {
    const auto piece = std::span(bytes).subspan(at, std::min<std::uint64_t>(read_size, bytes.size() - at));
    store.get_range(key, first + at, piece);
    for (std::uint64_t done = 0; done < piece.size(); done += cs) {
      const std::uint64_t k = (first + at + done) / cs;
      if (k >= shard->chunk_xxh3.size()) throw Error(Errc::malformed_manifest, out.object, "more chunks than chunk_xxh3 lists");
      const auto chunk = piece.subspan(done, std::min<std::uint64_t>(cs, piece.size() - done));
      detail::check_chunk_xxh3(out.object, shard->chunk_xxh3, k, cs, chunk);
      ++out.chunks_checked;
      out.bytes_checked += chunk.size();
    }
  }
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(t->begin - first));
  bytes.resize(t->end - t->begin);
  out.data = std::move(bytes);
  return out;
}

RestoreReport restore_from_object_store(ObjectStore& store, std::uint64_t step, FileSystem& local_fs,
                                        const std::string& local_root, const RestoreOptions& options) {
  if (options.parallel_shards < 1 || options.parallel_shards > 64)
    throw Error(Errc::invalid_argument, local_root, "RestoreOptions::parallel_shards", "1..64", std::to_string(options.parallel_shards));
  // The one copy between stores (store/copy.hpp): the object store's step into the local
  // root's writer (its lock and crash cleanup), every chunk checked before it is written.
  std::string name = store.name_of("");
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  const auto source = detail::make_object_store(name, store, nullptr, {});
  const ObjectManifest tier = read_object_manifest(store, step);
  const auto local = open_store(local_root, {.fs = &local_fs});
  const auto writer = local->writer();
  CopyOptions copy;
  copy.verify = options.verify == Verify::none ? Verify::fast : options.verify;
  copy.begin = options.begin;
  copy.parallel_shards = options.parallel_shards;
  copy.piece_bytes = options.read_size;
  copy.copy_record = false;
  const CopyReport copied = copy_checkpoint(*source, step, *writer, copy);
  RestoreReport report;
  report.step = step;
  report.run_id = tier.run_id;
  report.bytes = copied.bytes;
  report.chunks_verified = copied.chunks_verified;
  report.dir = copied.committed;
  return report;
}

}  // namespace ckpt
