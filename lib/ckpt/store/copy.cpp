// SPDX-License-Identifier: Apache-2.0
// The copy between stores (copy.hpp): one thread per shard in flight, each streaming its
// shard from the source into the destination's target with every piece checked on the way.
#include "ckpt/store/copy.hpp"

#include <atomic>
#include <boost/json.hpp>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/format/json_util.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/hash/sha256.hpp"
#include "ckpt/read/chunk_check.hpp"

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

// What a file of the checkpoint must hold: a shard's or a redundancy block's size and checksums.
struct FileRecord {
  std::uint64_t size = 0;
  const std::string& sha256;
  const std::vector<std::uint64_t>& chunk_xxh3;
};

// The checks of one file's pieces as the destination hands them over (PieceCheck): from
// several threads at once, each piece starting at a multiple of the chunk size and holding
// whole chunks (the last may be short). Every chunk's XXH3 against the source manifest; with
// Verify::full the file's SHA-256 too, fed in file order (a piece that arrives before those
// in front of it waits, copied, until they have been hashed).
class ShardCheck {
 public:
  ShardCheck(FileRecord shard, std::uint64_t chunk_size, std::string path, Verify verify, const std::atomic<bool>& stopped)
      : shard_(shard), chunk_(chunk_size), path_(std::move(path)), verify_(verify), stopped_(stopped) {}

  void operator()(std::uint64_t offset, std::span<const std::byte> bytes) {
    if (stopped_.load()) throw Error(Errc::aborted, path_, "the copy stopped: another shard's copy failed");
    if (verify_ == Verify::none) return;
    if (offset % chunk_ != 0 || offset > shard_.size || bytes.size() > shard_.size - offset)
      throw Error(Errc::invalid_argument, path_, "a piece of the copy", "whole chunks of " + std::to_string(chunk_) + " bytes within the file",
                  std::to_string(bytes.size()) + " bytes at " + std::to_string(offset));
    for (std::uint64_t done = 0; done < bytes.size();) {
      const std::uint64_t k = (offset + done) / chunk_;
      const std::uint64_t len = std::min<std::uint64_t>(chunk_, shard_.size - k * chunk_);
      if (k >= shard_.chunk_xxh3.size())
        throw Error(Errc::size_mismatch, path_, "chunks", std::to_string(shard_.chunk_xxh3.size()), "more");
      if (len > bytes.size() - done)
        throw Error(Errc::invalid_argument, path_, "a piece of the copy", "whole chunks", "a piece ending inside chunk " + std::to_string(k));
      detail::check_chunk_xxh3(path_, shard_.chunk_xxh3, k, chunk_, bytes.subspan(done, len));
      done += len;
      chunks_.fetch_add(1);
    }
    if (verify_ != Verify::full) return;
    std::lock_guard lk(mu_);
    if (offset != next_) {
      waiting_.emplace(offset, std::vector<std::byte>(bytes.begin(), bytes.end()));
      return;
    }
    sha_.update(bytes);
    next_ += bytes.size();
    for (auto it = waiting_.begin(); it != waiting_.end() && it->first == next_; it = waiting_.erase(it)) {
      sha_.update(it->second);
      next_ += it->second.size();
    }
  }

  // After the destination wrote the whole shard: every chunk was seen; the SHA-256 matches.
  std::uint64_t finish() {
    if (verify_ == Verify::none) return 0;
    if (chunks_.load() != shard_.chunk_xxh3.size())
      throw Error(Errc::size_mismatch, path_, "chunks checked", std::to_string(shard_.chunk_xxh3.size()), std::to_string(chunks_.load()));
    if (verify_ == Verify::full) {
      const std::string actual = to_hex(sha_.finish());
      if (next_ != shard_.size || actual != shard_.sha256) throw Error(Errc::checksum_mismatch, path_, "sha256 of the whole file", shard_.sha256, actual);
    }
    return chunks_.load();
  }

 private:
  const FileRecord shard_;
  const std::uint64_t chunk_;
  const std::string path_;
  const Verify verify_;
  const std::atomic<bool>& stopped_;
  std::atomic<std::uint64_t> chunks_{0};
  std::mutex mu_;
  Sha256 sha_;
  std::uint64_t next_ = 0;
  std::map<std::uint64_t, std::vector<std::byte>> waiting_;
};

// The options' and the source's refusals, before anything is written.
std::shared_ptr<const Manifest> source_manifest(CheckpointStore& source, std::uint64_t step, const CopyOptions& opt) {
  if (opt.parallel_shards < 1 || opt.parallel_shards > 64)
    throw Error(Errc::invalid_argument, source.name_of(step), "CopyOptions::parallel_shards", "1..64", std::to_string(opt.parallel_shards));
  std::shared_ptr<const Manifest> m = source.manifest(step);
  if (m->chunk_size == 0) throw Error(Errc::malformed_manifest, source.name_of(step), "chunk_size 0");
  return m;
}

// copy_into with the source's manifest `m` read already (once per copy: on an object store
// each read is a few requests).
CopyReport copy_with(CheckpointStore& source, std::uint64_t step, const std::shared_ptr<const Manifest>& m, StepTarget& destination,
                     const CopyOptions& opt) {
  try {
    CopyReport report;
    report.step = step;
    report.sha256_verified = opt.verify == Verify::full;

    // A node set's redundancy blocks go along where the destination keeps them as they are
    // (a node set of the same layout); else the checkpoint arrives as one of one root.
    const bool blocks = m->nodes && destination.keeps_blocks_of(*m->nodes);
    const std::size_t files = m->shards.size() + (blocks ? m->redundancy.size() : 0);

    // The files, several at once; the first failure stops the others at their next piece.
    std::atomic<std::size_t> next{0};
    std::atomic<bool> stopped{false};
    std::atomic<std::uint64_t> chunks{0};
    std::mutex error_mu;
    std::exception_ptr error;
    auto work = [&] {
      for (std::size_t i; (i = next.fetch_add(1)) < files && !stopped.load();) {
        try {
          const PieceSize pieces{.bytes = opt.piece_bytes, .multiple = m->chunk_size};
          if (i < m->shards.size()) {
            const ShardRecord& s = m->shards[i];
            const auto file = source.shard(step, s);
            if (file->size() != s.size)
              throw Error(Errc::size_mismatch, file->path(), "shard size", std::to_string(s.size), std::to_string(file->size()));
            ShardCheck check({s.size, s.sha256, s.chunk_xxh3}, m->chunk_size, file->path(), opt.verify, stopped);
            destination.write_shard(s.rank, s.path, *file, std::ref(check), pieces);
            chunks.fetch_add(check.finish());
          } else {
            const std::size_t k = i - m->shards.size();
            const RedundancyBlock& b = m->redundancy[k];
            const auto file = source.redundancy_block(step, k);
            if (file->size() != b.size)
              throw Error(Errc::size_mismatch, file->path(), "redundancy block size", std::to_string(b.size), std::to_string(file->size()));
            ShardCheck check({b.size, b.sha256, b.chunk_xxh3}, m->chunk_size, file->path(), opt.verify, stopped);
            destination.write_redundancy_block(b, *file, std::ref(check), pieces);
            chunks.fetch_add(check.finish());
          }
        } catch (...) {
          std::lock_guard lk(error_mu);
          if (!error) error = std::current_exception();
          stopped.store(true);
        }
      }
    };
    const std::size_t threads = std::min<std::size_t>(
        static_cast<std::size_t>(std::min(opt.parallel_shards, std::max(destination.shards_at_once(), 1))), files);
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    if (error) std::rethrow_exception(error);
    for (const auto& s : m->shards) report.bytes += s.size;
    report.chunks_verified = chunks.load();
    report.copied_at = utc_now_rfc3339();

    if (FileSystem* fs = destination.file_system(); fs && opt.copy_record && !m->shards.empty()) {
      const CopyRecord rec{step, source.root(), checkpoint_dir_name(step), report.copied_at, report.bytes, report.chunks_verified,
                           report.sha256_verified};
      detail::write_small_file(*fs, join_path(destination.shard_dir(m->shards.front().rank), kCopyRecordName), encode_copy_record(rec));
    }
    // A destination that keeps redundancy of its own (a node set with a scheme, given a
    // checkpoint it does not keep as it is) computes it from the shards, read again from the
    // source, unit by unit.
    std::vector<RedundancyBlock> computed;
    if (!blocks) {
      std::vector<std::uint64_t> sizes;
      for (const auto& s : m->shards) sizes.push_back(s.size);
      if (const std::size_t units = destination.redundancy_units(sizes); units > 0) {
        if (m->has_file_parts())
          throw Error(Errc::invalid_argument, source.name_of(step), "a checkpoint for a node set with redundancy",
                      "one file per rank (the redundancy is planned over each rank's one file)", "a rank in several files");
        std::vector<std::unique_ptr<ReadableFile>> files(m->shards.size());
        for (const auto& s : m->shards) files.at(static_cast<std::size_t>(s.rank)) = source.shard(step, s);
        const auto data = [&](int rank, std::uint64_t offset, std::span<std::byte> out) {
          files.at(static_cast<std::size_t>(rank))->read_at(offset, out);
        };
        for (std::size_t u = 0; u < units; ++u)
          for (auto& b : destination.write_redundancy_unit(sizes, u, data, m->chunk_size, [] { return false; })) computed.push_back(std::move(b));
      }
    }
    // A checkpoint across node roots arrives with its blocks, or as one of one root (the file
    // comment); any other commits the very manifest bytes the source holds.
    if (blocks) {
      report.committed = destination.commit(*m, m->redundancy, source.manifest_text(step));
    } else if (m->nodes) {
      Manifest plain = *m;
      plain.nodes.reset();
      plain.redundancy.clear();
      report.committed = destination.commit(std::move(plain), std::move(computed));
    } else {
      if (computed.empty()) report.committed = destination.commit(*m, {}, source.manifest_text(step));
      else report.committed = destination.commit(*m, std::move(computed));  // the node set records its layout and blocks
    }
    return report;
  } catch (...) {
    destination.abort();
    throw;
  }
}

}  // namespace

CopyReport copy_into(CheckpointStore& source, std::uint64_t step, StepTarget& destination, const CopyOptions& options) {
  std::shared_ptr<const Manifest> m;
  try {
    m = source_manifest(source, step, options);
  } catch (...) {
    destination.abort();
    throw;
  }
  return copy_with(source, step, m, destination, options);
}

CopyReport copy_checkpoint(CheckpointStore& source, std::uint64_t step, StoreWriter& destination, const CopyOptions& options) {
  const auto m = source_manifest(source, step, options);  // before anything is written
  const std::unique_ptr<StepTarget> target = destination.begin(step, {.begin = options.begin});
  return copy_with(source, step, m, *target, options);
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

}  // namespace ckpt
