// SPDX-License-Identifier: Apache-2.0
// Where checkpoints live, as one type.
//
// A CheckpointStore is a place that holds the committed checkpoints of one run: a directory
// (store/local/commit.hpp's protocol), a set of node roots DIR/node-n committed as one
// (store/nodes/node_commit.hpp), or an object-store prefix s3://bucket/prefix (store/object/object_commit.hpp).
// The three protocols stay as they are, each behind its implementation (store/local/directory.cpp,
// store/nodes/node_set.cpp, store/object/object.cpp); this interface is the level where they agree:
//
//   reading (no lock; nothing is ever written):
//     latest()          the step `latest` names (a node set: the newest any node's names)
//     steps()           the committed steps, ascending
//     list(verify)      every checkpoint with its state, and the saves in progress
//     manifest(step)    the checkpoint's manifest, decoded with the loader's checks
//     describe(step)    what list() says of one committed step, its damage thrown typed
//     open(step)        a CheckpointReader over it (its shards where the store keeps them)
//     shard(step, r)    rank r's shard file, for streaming it elsewhere
//     verify(step)      every shard read and checked (Verify::fast or full)
//     health(step)      a node set's findings per file, and what its redundancy rebuilds
//     rotated_away(s)   a read of s failed because rotation removed it, which is no damage
//   writing (writer(): the root's lock, every node root's lock, or the prefix's writer lease;
//   then the crash cleanup of the kind):
//     begin(step)       a StepTarget: where each rank's shard goes; commit(manifest) or abort()
//     rotate(keep)      keep the newest K, never the committed one, `latest`'s, or a kept one
//     make_room(bytes)  the pre-save rotation for a full disk (a directory; the others: no-op)
//     remove(step)      one committed checkpoint, durably
//
// open_store(root, options) is the only place that looks at a root string and decides what
// kind of store it is (docs/architecture.md, "Stores"); a new kind registers there.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/store/object/object_lease.hpp"
#include "ckpt/core/error.hpp"

CKPT_API_BEGIN
namespace ckpt {

class ObjectStore;
struct ObjectManifest;
struct LeftoverReport;

enum class StoreKind {
  directory,     ///< ROOT/latest, ROOT/step-N/ (store/local/commit.hpp)
  node_set,      ///< DIR/node-n/, one root per node, committed as one (store/nodes/node_commit.hpp)
  object_store,  ///< s3://bucket/prefix (store/object/object_commit.hpp)
  memory,        ///< mem://NAME: a directory or node set in shared memory (store/memory/memory.hpp)
};
/// "directory", "node set", "object store", "memory".
std::string_view store_kind_name(StoreKind kind) noexcept;

/// How open_store opens a root.
struct StoreOptions {
  /// A directory or node set: the file system it is reached through (default: POSIX).
  FileSystem* fs = nullptr;
  /// A node set to write: its layout (nodes, ranks per node, redundancy scheme; node n's root
  /// is DIR/node-n). Unset: a root that is a node set already (is_node_set) opens as one, with
  /// the node count its checkpoints record (count_node_roots), for reading, rotation and
  /// removal (its writer's begin() then needs the layout); anything else is a directory.
  std::optional<NodeLayout> nodes{};
  /// An object store: the client to use (not owned; it must outlive the store). Null: the S3
  /// client of the root's scheme (open_object_store(): ckpt::s3's open_s3(), with the
  /// environment's endpoint and keys; Errc::invalid_argument in a program without ckpt::s3).
  ObjectStore* object_store = nullptr;
  /// An object store's writer: the run identity it takes the writer lease for and records in
  /// what it commits (store/run_identity.hpp, store/object/object_lease.hpp). Empty: a new random one.
  std::string run{};
  /// An object store's writer: its lease's period and renewal (store/object/object_lease.hpp).
  ObjectLeaseOptions lease{};
  /// A memory store's bound in bytes (store/memory/memory.hpp): a generation is committed only
  /// if two of its size fit (memory_needed); beyond, its commit fails with Errc::no_space and
  /// the previous generation stays. 0: no bound but the shared memory's own size.
  std::uint64_t memory_limit = 0;
};

inline constexpr std::string_view kCopyRecordName = "tier.json";

/// What tier.json records about one copy.
struct CopyRecord {
  std::uint64_t step = 0;
  std::string source_root;  ///< the local root copied from
  std::string source_dir;   ///< e.g. "step-0000000010"
  std::string copied_at;    ///< UTC, RFC 3339, when the copy's data was durable
  std::uint64_t bytes = 0;  ///< shard bytes copied
  std::uint64_t xxh3_chunks_verified = 0;  ///< chunks checked against the manifest (0 with Verify::none)
  bool sha256_verified = false;            ///< whole files re-hashed (Verify::full)
};

/// One entry of CheckpointStore::list().
struct StoredCheckpoint {
  std::string name;                   ///< "step-0000000010"; a save in progress: its temporary's name
  std::optional<std::uint64_t> step;  ///< nullopt for a save in progress
  CheckpointState state = CheckpointState::complete;
  bool is_latest = false;
  int world_size = 0;                 ///< 0 unless complete
  std::uint64_t bytes = 0;            ///< the shards' bytes (complete) or the bytes present (in progress)
  std::uint64_t redundancy_bytes = 0; ///< a node set's: its replicas' and parity blocks' bytes
  std::string error;                  ///< corrupt (or degraded): the typed error's message
  /// What was read of it (complete or degraded): its manifest; on a node set, the health
  /// check's findings (each file's state, how many more node losses it survives); on an
  /// object store, the run that committed it and the attempt whose data the tier manifest names.
  std::shared_ptr<const Manifest> manifest;
  std::shared_ptr<const NodeCheckpointHealth> health;
  std::string run, run_id;
  /// An object store's: the tier manifest that committed it (store/object/object_commit.hpp).
  std::shared_ptr<const ObjectManifest> tier;
  /// A directory's checkpoint copied there from another store (store/copy.hpp): its copy record.
  std::shared_ptr<const CopyRecord> copy;
};

/// Called with each piece of a shard before it is written (its offset in the file and its
/// bytes), from several threads at once for different pieces; throws to stop the write.
using PieceCheck = std::function<void(std::uint64_t offset, std::span<const std::byte> bytes)>;

/// How StepTarget::write_shard cuts a shard into pieces: at most `bytes` each where the store
/// writes from pieces it reads (a directory, a node set; an object store uploads in its
/// parts), each starting at a multiple of `multiple` and holding whole multiples of it (the
/// last may be shorter). A copy passes the manifest's chunk size, so that each piece's
/// chunks are checked whole (store/copy.hpp).
struct PieceSize {
  std::uint64_t bytes = 16ull << 20;
  std::uint64_t multiple = 1;
};

/// Which committed steps rotation and make_room must keep besides their own rules (a step
/// the durable tier still has to copy).
using KeepStep = std::function<bool(std::uint64_t step)>;

/// One checkpoint being written: where each rank's shard goes, then its commit or abort.
/// Made by StoreWriter::begin; used from one thread at a time, except shard_dir(), which is
/// const and thread-safe. The destructor aborts a target neither committed nor aborted.
class StepTarget {
 public:
  virtual ~StepTarget() = default;
  virtual std::uint64_t step() const noexcept = 0;
  /// The directory rank `rank`'s shard file (shard_file_name) is written into, through
  /// file_system(): the writers of runtime/ stream there with their own backends.
  /// Errc::invalid_argument on a store that keeps no files (an object store: use shard_sink).
  virtual const std::string& shard_dir(int rank) const = 0;
  /// The file system shard_dir() is reached through; null on an object store.
  virtual FileSystem* file_system() const noexcept = 0;
  /// Writes rank `rank`'s shard file `name` (shard_file_name) from `source`, read in pieces,
  /// each passed to `check` (may be empty) before it is written, and makes it durable: written
  /// and fsynced into shard_dir(rank), or uploaded under the step's prefix on an object store
  /// (in parts, several at once). For copies between stores; the Checkpointer's writers
  /// stream into shard_dir() themselves. Thread-safe for different ranks.
  /// `pieces` says how the shard is cut (PieceSize).
  virtual void write_shard(int rank, const std::string& name, const ReadableFile& source, const PieceCheck& check = {},
                           PieceSize pieces = {}) = 0;
  /// Whether this target keeps the redundancy blocks of a checkpoint of `layout` as they are
  /// (a node set of that very layout): a copy then writes them with write_redundancy_block
  /// and commits them, instead of arriving as a checkpoint of one root.
  virtual bool keeps_blocks_of(const NodeLayout& layout) const noexcept {
    (void)layout;
    return false;
  }
  /// Writes redundancy block `block` (its node's directory, its file name) from `source`, as
  /// write_shard writes a shard. Errc::invalid_argument where keeps_blocks_of is false.
  virtual void write_redundancy_block(const RedundancyBlock& block, const ReadableFile& source, const PieceCheck& check = {},
                                      PieceSize pieces = {});
  /// Shards a copy writes at once into this target: an object store's upload sends several
  /// parts of one shard at once already, so one; a file store 4.
  virtual int shards_at_once() const noexcept { return 4; }
  /// The redundancy the store keeps besides the shards (a node set with a scheme: replicas or
  /// Reed-Solomon parity on other nodes), in units, each computed from ranks' bytes
  /// (store/nodes/redundancy_io.hpp): how many units the step has for these shard sizes (0: none).
  virtual std::size_t redundancy_units(std::span<const std::uint64_t> shard_sizes) const {
    (void)shard_sizes;
    return 0;
  }
  /// Writes unit `unit`'s blocks into the step, reading the ranks' bytes through `data`;
  /// `stopped` is polled between chunks. Returns the blocks, for commit().
  virtual std::vector<RedundancyBlock> write_redundancy_unit(std::span<const std::uint64_t> shard_sizes, std::size_t unit,
                                                             const std::function<void(int rank, std::uint64_t offset, std::span<std::byte> out)>& data,
                                                             std::uint64_t chunk_size, const std::function<bool()>& stopped);
  /// Commits the step once every shard (and redundancy block) is durable: the store's commit
  /// protocol, `latest` moved to it last. `manifest` is the checkpoint's (assemble_manifest);
  /// a node set records its layout and `blocks` (in the layout's plan order) in it. Returns
  /// the committed checkpoint's location as errors name it. On a failure nothing is
  /// committed and the target is aborted; the error is rethrown. Once only.
  /// `manifest_text`, when given, is the manifest's encoding to commit byte for byte (a copy
  /// commits the source's bytes: re-encoding a decoded manifest may change a metadata double
  /// in its last digit); it must decode to `manifest`'s step. A node set re-encodes (it
  /// records its layout and blocks).
  std::string commit(Manifest manifest, std::vector<RedundancyBlock> blocks = {}, std::string manifest_text = {});
  /// Removes what the step wrote, unless it was committed. Never throws; idempotent.
  void abort() noexcept;

 protected:
  /// The kind's commit and abort, each run at most once, and never both (after a failed
  /// commit_step, abort_step runs).
  virtual std::string commit_step(Manifest manifest, std::vector<RedundancyBlock> blocks, std::string manifest_text) = 0;
  virtual void abort_step() noexcept = 0;

 private:
  bool finished_ = false;
};

/// Ranks in several processes save one checkpoint together (runtime/coordinator.hpp): each
/// process writes its own ranks' shards into the run's shared temporaries, named by the run
/// id (the same in every process), and only the lead process (rank 0's, which holds the
/// store's writer) commits.
struct SharedRun {
  std::string run_id;      ///< CommitCoordinator::start_run's; 1..64 of [A-Za-z0-9_-]
  int first_local_rank = 0;  ///< the lowest rank this process writes
};

/// How StoreWriter::begin begins a step.
struct StepOptions {
  BeginOptions begin;               ///< store/local/commit.hpp's (a step before `latest`, for a resumed run)
  std::optional<SharedRun> shared{};  ///< ranks in several processes: this process's part
};

/// How CheckpointStore::writer takes the store.
struct WriterOptions {
  /// true: this process holds the store (its lock, every node root's lock, or the writer lease),
  /// cleans up after a crashed writer, commits and rotates. false: a participant of a shared
  /// run (StepOptions::shared) in another process than the lead's: it takes no lock and
  /// cleans nothing; its begin() makes its part of the run's shared temporaries (the
  /// lead's process cleaned the store up first: CommitCoordinator::start_run), its targets
  /// never commit, and rotate, make_room and remove are refused (Errc::invalid_argument).
  bool lead = true;
  /// false: take the store without its crash cleanup, for maintenance that removes only what
  /// it names (ckpt prune leaves a temporary it did not make, and a step newer than `latest`,
  /// to the next writer).
  bool clean_up = true;
  /// A store that records runs (an object store): the run identity this writer takes it for
  /// (its lease's, recorded in what it commits). Empty: StoreOptions::run.
  std::string run{};
};

/// This process's right to write a store (CheckpointStore::writer): held until destroyed.
class StoreWriter {
 public:
  virtual ~StoreWriter() = default;
  /// What the crash cleanup removed when the writer was made (temporaries of a dead writer,
  /// steps never committed), as "NAME" (a node set: "node-n/NAME").
  virtual const std::vector<std::string>& cleaned_up() const noexcept = 0;
  /// Begins checkpoint `step` (store/local/commit.hpp's begin_checkpoint and its refusals: a committed
  /// step, a step at or before `latest` unless options allow it). With options.shared, the
  /// run's shared temporaries (begin_shared_checkpoint: created if missing, the same paths in
  /// every process); Errc::invalid_argument on a store that has none (an object store).
  virtual std::unique_ptr<StepTarget> begin(std::uint64_t step, const StepOptions& options = {}) = 0;
  /// The run identity of the store (store/run_identity.hpp): a directory's ROOT/.run, a node
  /// set's node-0/.run (drawn and written for a fresh root), an object store's lease's run.
  virtual std::string establish_run_identity() = 0;
  /// Rebuilds what the store's redundancy can rebuild of every kept checkpoint (a node set:
  /// repair_node_roots, store/nodes/redundancy_io.hpp), or of `step` alone; the others keep nothing
  /// to rebuild from and return nothing. Reads never rebuild: this is the one operation that
  /// does.
  virtual std::vector<RepairReport> repair(std::optional<std::uint64_t> step = std::nullopt, Verify verify = Verify::fast) {
    (void)step;
    (void)verify;
    return {};
  }
  /// Keeps the newest `keep_last` committed checkpoints counting `committed` (never removed),
  /// never the one `latest` names nor one `keep` keeps; keep_last 0 keeps all. Returns the
  /// steps removed, oldest first.
  virtual std::vector<std::uint64_t> rotate(int keep_last, std::uint64_t committed, const KeepStep& keep = {}) = 0;
  /// While the store's free space is known and below `needed`, removes the oldest committed
  /// checkpoint older than `latest`'s (never a kept one). Returns the steps removed. A store
  /// whose free space is unknown (an object store) removes nothing.
  virtual std::vector<std::uint64_t> make_room(std::uint64_t needed, const KeepStep& keep = {}) = 0;
  /// Removes the committed checkpoint `step` durably; Errc::invalid_argument for the one
  /// `latest` names, Errc::not_found for one that is not there.
  virtual void remove(std::uint64_t step) = 0;
  /// Removes what failed or killed commits left that no crash cleanup reaches: an object
  /// store's objects no tier manifest commits and its multipart uploads, those the server dates
  /// more than `older_than` ago (collect_object_leftovers, store/object/object_commit.hpp). nullopt for
  /// a store whose next writer removes its leftovers itself (a directory, a node set).
  virtual std::optional<LeftoverReport> collect_leftovers(std::chrono::seconds older_than);
  /// Whether this writer's right was taken from it (an object store's lease taken over by
  /// another writer): it commits and removes nothing more. A lock is never lost.
  virtual bool lost() const noexcept { return false; }
};

/// How long a store's writer is meant to be held (CheckpointStore::writer_tenure).
enum class WriterTenure {
  per_operation,  ///< a lock: taken for each copy, rotation or prune and released, so that a
                  ///< root that does not exist yet, or another maintainer, gets its turn
  per_run,        ///< a lease: held for the writer's whole run and renewed, since taking it
                  ///< over is how a successor job takes the store
};

/// A place where checkpoints live (the file comment). Reading is thread-safe.
class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;
  virtual StoreKind kind() const noexcept = 0;
  /// The root as open_store was given it (trailing slashes removed).
  const std::string& root() const noexcept { return root_; }
  /// How errors name checkpoint `step` of this store: "ROOT/step-0000000010",
  /// "ROOT/node-*/step-0000000010", "s3://bucket/prefix/step-0000000010".
  virtual std::string name_of(std::uint64_t step) const;

  /// The step `latest` names; nullopt when there is none (a fresh or missing root).
  /// Errc::malformed_manifest naming a `latest` that does not name a checkpoint.
  virtual std::optional<std::uint64_t> latest() = 0;
  /// The committed steps, ascending. A missing root has none.
  virtual std::vector<std::uint64_t> steps() = 0;
  /// What shows that the store holds a committed checkpoint, as its commit protocol says
  /// (find_committed_checkpoint, store/tiers.hpp: "ROOT/latest", a node root's `latest`, a step
  /// committed that no `latest` names yet): nullopt only for an empty or missing store, so
  /// that a run deciding between a fresh start and a resume never takes an unreadable store
  /// for an empty one (its errors are thrown; a missing bucket is Errc::invalid_argument).
  virtual std::optional<std::string> committed_evidence() = 0;
  /// Every checkpoint and save in progress, in name order (a directory lists its temporaries
  /// among them, as ls always has; a node set after them, "node-n/.tmp-..."). With
  /// Verify::none only manifests and sizes are read; else every shard is checked. A
  /// checkpoint that rotation removes while it is listed is left out, never reported
  /// corrupt. Errc::not_found naming the root when it holds no checkpoint root at all.
  virtual std::vector<StoredCheckpoint> list(Verify verify = Verify::none) = 0;
  /// The manifest of the committed `step`. Errc::not_found when it is not committed.
  virtual std::shared_ptr<const Manifest> manifest(std::uint64_t step) = 0;
  /// The committed `step` as list() gives it without reading shards (its manifest, sizes and
  /// what the kind records besides: a node set's health by sizes, an object store's tier
  /// manifest), except that what is wrong with it is thrown, typed: Errc::not_found when it
  /// is not committed, the manifest's errors, a directory's missing or resized shard.
  virtual StoredCheckpoint describe(std::uint64_t step) = 0;
  /// A reader over the committed `step` (every shard where this store keeps it). Errc::not_found
  /// when it is not committed; the reader's open errors.
  virtual CheckpointReader open(std::uint64_t step, std::optional<int> expected_world_size = {}) = 0;
  /// Shard file `file` (a record of the committed `step`'s manifest: a rank's one file, or one
  /// of its several), for reading it as a stream or in ranges.
  virtual std::unique_ptr<ReadableFile> shard(std::uint64_t step, const ShardRecord& file) = 0;
  /// Redundancy block `index` (of Manifest::redundancy) of the committed `step`, where the
  /// store keeps them (a node set); Errc::invalid_argument elsewhere.
  virtual std::unique_ptr<ReadableFile> redundancy_block(std::uint64_t step, std::size_t index);
  /// Reads and checks every shard of `step` (the header against the manifest index always;
  /// each chunk's XXH3 with fast; also the whole files' XXH3 and SHA-256 with full).
  virtual void verify(std::uint64_t step, Verify mode, const ProgressFn& progress = {}) = 0;
  /// What the store's redundancy makes of committed `step`: a node set's check of every shard,
  /// redundancy block and node's manifest copy per `mode` (check_node_checkpoint: damage is
  /// the report, with what the scheme can rebuild). nullptr on a store that keeps no
  /// redundancy: its damage is verify()'s typed error.
  virtual std::shared_ptr<const NodeCheckpointHealth> health(std::uint64_t step, Verify mode) {
    (void)step;
    (void)mode;
    return nullptr;
  }
  /// Whether committed `step` was removed by rotation: it is gone and `latest` names a newer
  /// step. Never throws.
  virtual bool rotated_away(std::uint64_t step) noexcept = 0;
  /// Opens the checkpoint `latest` names, the one way every reader of a root opens its live
  /// checkpoint (open_latest below, the tools, the resume): Errc::not_found when there is
  /// none, or the typed error of the named checkpoint, unless options.fallback finds another
  /// that opens and verifies (the other steps the store holds, newest first). A checkpoint
  /// rotated away between the read of `latest` and its open (rotated_away) is no error:
  /// `latest` is read again, up to kOpenLatestAttempts times. A world-size mismatch is never
  /// fallen back from. Reads only: rebuilding a lost node's files is StoreWriter::repair.
  OpenedCheckpoint open_latest(const OpenLatestOptions& options = {});
  /// Takes this process's right to write the store and cleans up after a crashed writer
  /// (WriterOptions::lead; a participant of a shared run takes nothing). Errc::busy naming
  /// the holder when another writer has it.
  virtual std::unique_ptr<StoreWriter> writer(const WriterOptions& options = {}) = 0;
  /// The run identity that committed `step`, where the store records one (an object store's
  /// tier manifest); "" where it records none (a directory, a node set, a store written
  /// before run identities). Errc::not_found when `step` is not committed.
  virtual std::string run_of(std::uint64_t step) {
    (void)manifest(step);
    return {};
  }
  /// A directory or node set: per_operation (a lock); an object store: per_run (a lease).
  virtual WriterTenure writer_tenure() const noexcept { return WriterTenure::per_operation; }
  /// The bytes of committed `step`'s manifest as the store holds them (what a copy commits):
  /// the file, or the object; a node set: its manifest re-encoded.
  virtual std::string manifest_text(std::uint64_t step);
  /// Stops the store's requests in flight, which then fail at once (an object store's: a
  /// drain that gives up); a file system's calls cannot be stopped. Thread-safe.
  virtual void abort_calls() noexcept {}

 protected:
  explicit CheckpointStore(std::string root) : root_(std::move(root)) {}
  /// open_latest's error when latest() finds nothing (the kind's words for "nothing committed").
  virtual Error no_latest_error();
  /// The steps open_latest's fallback tries besides the one `latest` names (newest first
  /// after sorting): every step the store holds under a checkpoint's name, committed or
  /// not (a step renamed into place whose `latest` was never written is one). Default: steps().
  virtual std::vector<std::uint64_t> fallback_steps() { return steps(); }
  /// `store`'s no_latest_error() and fallback_steps(), for a store that serves through another
  /// (the memory store over a directory or node set in shared memory).
  static Error no_latest_error_of(CheckpointStore& store) { return store.no_latest_error(); }
  static std::vector<std::uint64_t> fallback_steps_of(CheckpointStore& store) { return store.fallback_steps(); }

 private:
  std::string root_;
};

/// Opens the store at `root`, deciding its kind: "s3://..." is an object store; with
/// options.nodes, or when `root` holds node roots and no `latest` of its own (is_node_set), a
/// node set; anything else a directory (which need not exist yet). Reads at most the root's
/// entries; writes nothing. Errc::invalid_argument for an empty root, a bad s3:// root or
/// missing credentials, or options.nodes on an s3:// root.
std::unique_ptr<CheckpointStore> open_store(const std::string& root, const StoreOptions& options = {});

/// The kind open_store opens `root` as, without opening it: no client is made and no
/// credentials are needed (a node set is told by the root's entries, as open_store tells it).
StoreKind root_kind(const std::string& root, const StoreOptions& options = {});

/// Opens the live checkpoint of the root `root` (any kind: open_store's, with `fs` for a
/// directory or a node set): CheckpointStore::open_latest.
OpenedCheckpoint open_latest(FileSystem& fs, const std::string& root, const OpenLatestOptions& options = {});
/// open_latest on the POSIX file system: `ckpt::open_latest(root, {.expected_world_size = 4})`.
inline OpenedCheckpoint open_latest(const std::string& root, const OpenLatestOptions& options = {}) {
  return open_latest(posix_file_system(), root, options);
}

/// What a path names, as the tools take it (located by locate_checkpoint).
struct LocatedCheckpoint {
  /// The store the path is, or holds a checkpoint of; null for a checkpoint directory outside
  /// any store (`dir`: a directory of another name than step-N, an output of ckpt reshard).
  std::unique_ptr<CheckpointStore> store;
  std::optional<std::uint64_t> step;  ///< the step the path names; nullopt: the store's latest
  std::string dir;                    ///< with no store: the checkpoint directory
  bool node_root = false;             ///< the path was one node root DIR/node-n of the node set
};

/// Resolves `path` into a store (through open_store) and perhaps a step of it: a root (a
/// directory, a node set, s3://bucket/prefix) names its latest; ROOT/step-N,
/// s3://bucket/prefix/step-N and DIR/node-n/step-N (a checkpoint across node roots) name that
/// step; DIR/node-n, when its latest is a checkpoint across nodes, names the node set's latest;
/// a directory holding a manifest under another name is a checkpoint outside any store. Reads
/// at most a few entries and one manifest; writes nothing. open_store's errors.
LocatedCheckpoint locate_checkpoint(const std::string& path, const StoreOptions& options = {});

}  // namespace ckpt
CKPT_API_END
