// SPDX-License-Identifier: Apache-2.0
// The manifest: one JSON file per checkpoint (manifest.json, written last) that says which rank
// owns what. docs/format.md specifies every field. decode_manifest() trusts nothing: every
// field is type-checked, every number checked for range and overflow, every path checked to be
// a plain file name, and the shard table checked against world_size, before a caller sees it.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/core/dtype.hpp"
#include "ckpt/format/json_object.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/format/sharding.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// The version writers write by default (2: tensor entries may carry sharding descriptions).
inline constexpr int kSchemaVersion = 2;
/// The version written when a rank's shard is several files (3: shard entries carry `part`,
/// tensor entries name their file's part); the newest the loader reads.
inline constexpr int kFilesPerRankSchemaVersion = 3;
/// The oldest version the loader reads (1: no sharding descriptions).
inline constexpr int kOldestSchemaVersion = 1;
inline constexpr std::string_view kManifestName = "manifest.json";
/// Default chunk length of the per-chunk XXH3 checksums.
inline constexpr std::uint64_t kDefaultChunkSize = 4ull << 20;

/// One shard file: the whole of a rank's shard, or (schema 3) one part of it.
struct ShardRecord {
  int rank = 0;
  std::string path;  ///< plain file name inside the checkpoint directory
  std::uint64_t size = 0;
  std::string sha256;                     ///< 64 lower-case hex digits
  std::uint64_t xxh3 = 0;                 ///< of the whole file
  std::vector<std::uint64_t> chunk_xxh3;  ///< one per manifest chunk_size bytes
  std::uint64_t param_shard_offset = 0;   ///< this rank's range of the flat parameter space
  std::uint64_t param_shard_numel = 0;
  JsonObject metadata;  ///< per-rank training state (data position, RNG, ...)
  /// Which of its rank's files, 0..n-1 (schema 3; 0 below it). Part 0 carries the rank's
  /// param range and metadata; the other parts leave them zero and empty.
  int part = 0;
};

/// Where one tensor lives: the file `part` of rank's shard, absolute byte range [begin, end)
/// in that file.
struct TensorRecord {
  std::string name;
  int rank = 0;
  DType dtype = DType::U8;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;
  /// Schema 2: a slice of a global tensor, replicated on several ranks (this entry, on the
  /// lowest holder, is the only one: the others' shards do not hold it), or rank-local.
  std::optional<TensorSharding> sharding;
  int part = 0;  ///< which of the rank's files holds it (schema 3; 0 below it)
  /// Whether `r` holds this tensor: it is this entry's rank, or one of a replicated entry's
  /// holders (the one predicate every lookup by holder uses).
  bool held_by(int r) const noexcept;
};

struct Manifest {
  int schema_version = kSchemaVersion;
  int world_size = 0;
  std::uint64_t step = 0;
  double wall_clock_seconds = 0;  ///< training time at the save, as the caller reports it
  std::string created_at;         ///< UTC, RFC 3339 (e.g. 2026-11-29T10:00:00.123Z)
  std::uint64_t chunk_size = kDefaultChunkSize;
  std::uint64_t param_numel = 0;  ///< size of the flat parameter space (sum of shard numels)
  /// Every shard file, sorted by (rank, part): each rank's parts 0..n-1 (n = 1, so exactly
  /// world_size entries, below schema 3).
  std::vector<ShardRecord> shards;
  std::vector<TensorRecord> tensors;  ///< the tensor index
  JsonObject training;                ///< free-form: LR schedule, config, ...
  /// Set: the checkpoint spans node roots (format/redundancy.hpp): shard r lives in the
  /// checkpoint directory of node nodes->node_of(r), and `redundancy` lists every block of
  /// nodes->scheme, in planned_blocks' order. Unset: one directory holds every shard.
  std::optional<NodeLayout> nodes;
  std::vector<RedundancyBlock> redundancy;

  /// The record of rank's one shard file. Errc::invalid_argument naming manifest.json for a
  /// rank outside 0..world_size-1, or one whose shard is several files (files_of lists them;
  /// rank_record has the rank's param range and metadata).
  const ShardRecord& shard(int rank) const;
  /// The record of rank's first file (part 0), which carries the rank's param range and
  /// metadata. Errc::invalid_argument naming manifest.json for a rank outside 0..world_size-1
  /// or one with no file.
  const ShardRecord& rank_record(int rank) const;
  /// Every file of `rank`'s shard, in part order (empty for a rank outside the table).
  std::span<const ShardRecord> files_of(int rank) const noexcept;
  /// The index in `shards` of the file of (rank, part). Errc::invalid_argument naming
  /// manifest.json where there is none.
  std::size_t file_index(int rank, int part) const;
  /// The file that holds tensor `t` (its rank's part t.part).
  const ShardRecord& file_of(const TensorRecord& t) const { return shards[file_index(t.rank, t.part)]; }
  /// Whether some rank's shard is several files (what schema 3 is for).
  bool has_file_parts() const noexcept;
  /// The index entry for (name, rank), or nullptr.
  const TensorRecord* find_tensor(std::string_view name, int rank) const noexcept;
  /// Where rank's tensor `name` is read from: its own entry, or the entry of a replicated
  /// tensor whose holders include `rank` (on the lowest holder's shard); nullptr if neither.
  const TensorRecord* find_held_tensor(std::string_view name, int rank) const noexcept;
  /// The tensors `rank` holds, in the index's order: its own entries and every replicated
  /// entry whose holders include it (find_held_tensor finds each of them by name).
  std::vector<const TensorRecord*> held_tensors(int rank) const;
};

/// One rank's part of a checkpoint, as its shard writer reports it once the shard is durable:
/// everything the manifest needs from that rank. The global fields (param_numel,
/// wall_clock_seconds, training) are taken from rank 0's report.
struct ShardReport {
  ShardRecord shard;                  ///< path, size, checksums, flat range, metadata (part 0)
  std::vector<ShardRecord> more_files;  ///< the rank's parts 1..n-1, in order (none: one file)
  std::vector<TensorRecord> tensors;  ///< the rank's tensor index entries (absolute byte ranges)
  std::uint64_t chunk_size = kDefaultChunkSize;  ///< the chunk length of shard.chunk_xxh3
  std::uint64_t param_numel = 0;
  double wall_clock_seconds = 0;
  JsonObject training;
};

/// The one place a manifest is assembled: `reports` holds one report per rank, in rank order
/// (world size = reports.size(), at least 1); created_at is now. commit_checkpoint checks the
/// result as the loader would before writing it. Throws Errc::invalid_argument for no reports,
/// reports out of rank order, a report's files out of part order, or a report hashed with
/// another chunk length than `chunk_size`. Schema 3 when some rank has several files, else 2.
Manifest assemble_manifest(std::uint64_t step, std::uint64_t chunk_size, std::vector<ShardReport> reports);

/// Serialises a manifest (pretty enough to read with cat, stable field order), as
/// m.schema_version says (2 by default; a schema 1 manifest with sharding descriptions is
/// refused on decode).
std::string encode_manifest(const Manifest& m);

/// Supplies manifest text a piece at a time: returns the text from byte `offset` on (at least
/// one byte while `offset` is before the end; as many as it likes), valid until the next call.
/// The reader passes one that reads the file into a reused 1 MiB buffer.
using ManifestTextSource = std::function<std::string_view(std::uint64_t offset)>;

/// Parses and validates manifest text read from `file`, within the limits of
/// manifest_limits.hpp (checked while parsing, before the memory is spent). Throws
/// Errc::unsupported_schema for a schema_version other than 1 or 2, Errc::unsafe_path for a shard
/// path that is not a plain file name, Errc::malformed_manifest for anything else (invalid
/// JSON, a limit crossed, a bad field; schema 2: a sharding description that is malformed,
/// replicated holders that do not include the entry's rank as the lowest, or the slices of
/// a global tensor that do not tile it exactly, or disagree on its dtype or shape, the error
/// naming the global tensor and the ranks; a node layout that cannot hold the world size,
/// redundancy blocks other than the ones its scheme plans (kind, node, stripe, piece
/// geometry, name, size, in order), a replica whose checksums differ from its shard's),
/// each naming the file, field, expected and actual value. Thread-safe (nothing shared but a counter).
Manifest decode_manifest(std::string_view text, std::string_view file);
/// The same for `size` bytes of text from `source`, of which it never holds more than one
/// piece at a time; `source` is read twice (manifest_limits.hpp: scan, then parse).
Manifest decode_manifest(std::uint64_t size, const ManifestTextSource& source, std::string_view file);

/// The free-form parts (`training`, each shard's `metadata`) may hold any double: JSON has
/// no spelling for NaN or the infinities, so encode_manifest writes each non-finite double
/// there as the object {"__float__": S}, S one of "inf", "-inf", "nan" (the default quiet NaN,
/// bits 0x7ff8000000000000) or "nan:0x" and the 16 lower-case hex digits of any other NaN's
/// bits (its sign and payload); decode_manifest reads each such object (exactly that one
/// member, one of those spellings) back as the double, bit for bit (docs/format.md). Python's
/// float.fromhex reads the first three spellings. (A number literal beyond the double range,
/// 1e400, is still refused on decode: no writer spells a number that way.)
///
/// The check a save makes of what it is given for the manifest (the commit makes it again
/// on the whole manifest): `metadata` as a shard's and `training` as the checkpoint's,
/// non-finite doubles tagged, must pass the scan decode_manifest runs (manifest_limits.hpp:
/// strings at most kMaxManifestStringBytes, keys at most kMaxManifestKeyBytes, nesting at
/// most kMaxManifestDepth levels counting the 3 (metadata) or 1 (training) the manifest puts
/// above them, and together at most the free-form budget of a one-shard manifest). Throws
/// Errc::invalid_argument whose detail starts with `what` (e.g. "metadata and training of
/// rank 0") and names the limit, with its expected and actual values. Thread-safe.
void check_free_form(const JsonObject& metadata, const JsonObject& training, std::string_view what);

/// True if `name` is safe as a file name inside a checkpoint directory: non-empty, at most 255
/// bytes, no '/', no NUL, not "." or "..", not starting with '.' (reserved for temporaries).
bool is_plain_file_name(std::string_view name) noexcept;

/// Current time as RFC 3339 UTC with milliseconds.
std::string utc_now_rfc3339();
/// `t` as RFC 3339 UTC with milliseconds ("2026-12-02T01:15:21.551Z").
std::string utc_rfc3339(std::chrono::system_clock::time_point t);
/// Inverse of utc_rfc3339, also for S3's LastModified and Initiated ("2026-12-02T01:15:21.551Z",
/// with or without the fraction, which is read to the millisecond); nullopt for anything else.
/// Never throws.
std::optional<std::chrono::system_clock::time_point> parse_rfc3339(std::string_view t) noexcept;

}  // namespace ckpt
CKPT_API_END
