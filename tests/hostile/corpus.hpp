// SPDX-License-Identifier: Apache-2.0
// The hostile-checkpoint corpus: from one good checkpoint root, every kind of damage a disk,
// a crash, a bad copy or an attacker can do to it, each with the typed error the loader must
// refuse it with. tests/hostile/test_hostile.cpp runs every case through the reader; the fuzz
// seed tool (tests/fuzz/tools/make_seeds.cpp) turns the same cases into fuzzer inputs.
//
// The root, in a MemoryFileSystem under kRoot, holds two checkpoints written by
// save_checkpoint: step 10 (the previous one) and step 20 (the one `latest` names). Each case
// damages step 20 (or the root's `latest`) of a copy of that tree, so the test can also check
// that step 10 still loads afterwards.
//
// Damage comes in two strengths. Plain damage (a flipped bit, a cut file) is what the
// checksums exist for. "Resealed" damage also rewrites the manifest's size and checksums of
// the damaged shard to match its new bytes: what a tool, a bug or an attacker that knows the
// format produces, so that only the structural checks (shard header, index agreement) stand
// between it and the training state.
#pragma once

#include <boost/json.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/testing/memory_file_system.hpp"

namespace ckpt::hostile {

using testing::MemoryFileSystem;

inline constexpr const char* kRoot = "/ckpt";
inline constexpr int kWorld = 2;
inline constexpr std::uint64_t kPreviousStep = 10, kLatestStep = 20;
inline constexpr std::uint64_t kChunk = 4096;

/// The pristine root every case starts from.
struct GoodRoot {
  MemoryFileSystem fs;
  Manifest previous, latest;  ///< the manifests save_checkpoint committed
  std::string previous_dir, latest_dir;
  std::string manifest_path() const;        ///< of the latest checkpoint
  std::string shard_path(int rank) const;   ///< of the latest checkpoint
  std::string latest_pointer() const;       ///< ROOT/latest
};

/// Writes the two checkpoints (world size kWorld, chunk size kChunk, several dtypes, an
/// empty and a scalar tensor, tensors that span chunks) with save_checkpoint. `small`: the
/// same tensors with a few elements each (shards of one chunk), for fuzzer seeds; the cases'
/// expectations are written for the full size.
GoodRoot make_good_root(bool small = false);

/// Where a case must be refused.
enum class Stage {
  open,  ///< CheckpointReader::open (and open_latest) throws
  load,  ///< open succeeds; every read path throws (load_shard, verify, load_into, read_tensor, ...)
  root,  ///< open_latest throws (the `latest` pointer is bad; the checkpoints are intact)
};

struct Case {
  std::string category;  ///< flip, truncate, shards, paths, numbers, index, header, manifest, latest, huge
  std::string name;      ///< what was done, e.g. "shard1 json byte 130 bit 2"
  std::function<void(MemoryFileSystem&)> damage;  ///< applied to a clone of GoodRoot::fs
  Errc code;             ///< the exact error every refusing call must throw
  std::string file;      ///< the path the error must name
  Stage stage;
  std::string detail_contains;  ///< optional: a piece of Error::detail() (e.g. "chunk 2 of")
  double max_seconds = 1.0;     ///< bound on the whole check of this case
  /// Damage only the checksums can tell (a flipped bit, a shard swapped for another
  /// well-formed one): refused by reads that check the chunks they read (Verify::fast, full),
  /// while Verify::none reads it as it is. false: structural damage (a header, an index, a
  /// size, a path), refused at every verify level, Verify::none included.
  bool checksums_only = false;
};

/// Every case below, in category order.
std::vector<Case> all_cases(const GoodRoot& good);

std::vector<Case> bit_flip_cases(const GoodRoot& good);      ///< every region of a shard, resealed prefix flips
std::vector<Case> truncation_cases(const GoodRoot& good);    ///< shards and manifest cut at many offsets
std::vector<Case> shard_set_cases(const GoodRoot& good);     ///< missing, renamed, swapped, extra, duplicate
std::vector<Case> path_cases(const GoodRoot& good);          ///< absolute, "..", symlinks, special files
std::vector<Case> number_cases(const GoodRoot& good);        ///< absurd sizes, offsets, counts, versions
std::vector<Case> sharding_cases(const GoodRoot& good);      ///< overlapping / gapped / out-of-range slices, bad replicated and rank_local
std::vector<Case> index_cases(const GoodRoot& good);         ///< overlapping / holed / stray manifest tensor index
std::vector<Case> header_cases(const GoodRoot& good);        ///< hostile safetensors headers, resealed
std::vector<Case> manifest_cases(const GoodRoot& good);      ///< wrong types, missing fields, bad JSON, nesting
std::vector<Case> latest_cases(const GoodRoot& good);        ///< the `latest` pointer
std::vector<Case> huge_cases(const GoodRoot& good);          ///< 100k entries: headers, index, shard table
std::vector<Case> redundancy_cases(const GoodRoot& good);    ///< node layouts and redundancy blocks that are not what the scheme plans

// --- building blocks, also used by the fuzz seed tool ---

std::string read_text(const MemoryFileSystem& fs, const std::string& path);
/// The manifest of `dir` as a JSON object (the good manifests parse).
boost::json::object manifest_object(const MemoryFileSystem& fs, const std::string& dir);
void write_manifest_object(MemoryFileSystem& fs, const std::string& dir, const boost::json::object& o);
/// Rewrites size, sha256, xxh3 and chunk_xxh3 of `rank`'s entry in dir's manifest to match the
/// shard file as it now is (the manifest's chunk_size is used as found).
void reseal(MemoryFileSystem& fs, const std::string& dir, int rank);
/// A shard file: the 8-byte little-endian length of `json`, `json`, then `data`.
std::string shard_bytes(std::string_view json, std::string_view data);
/// The latest manifest with a node layout of kWorld nodes of one rank under `scheme`
/// ("rs:1+1", "replicate:2") and the blocks it plans: valid (a replica has its shard's
/// checksums, a parity block made-up ones of the right form), so a reader of the one
/// directory opens it; the redundancy cases each break one thing in it.
boost::json::object manifest_with_nodes(const GoodRoot& good, std::string_view scheme);
/// The JSON header text (without padding) and the data section of a shard file.
std::string shard_json(const MemoryFileSystem& fs, const std::string& path);
std::string shard_data(const MemoryFileSystem& fs, const std::string& path);

/// A complete, valid checkpoint ROOT/step-N of world size 1 whose one shard holds
/// `tensor_count` one-byte U8 tensors, and a `latest` naming it. Written from the format
/// functions (plan_shard, FileHasher, encode_manifest), not by save_checkpoint, whose writer
/// is not meant for 100k tensors.
void write_many_tensor_checkpoint(MemoryFileSystem& fs, const std::string& root, std::uint64_t step,
                                  std::size_t tensor_count);

}  // namespace ckpt::hostile
