// SPDX-License-Identifier: Apache-2.0
// What a manifest may cost: the limits decode_manifest enforces while it parses, before the
// memory is spent. docs/format.md ("Size and memory limits") explains each one.
//
// A manifest is read in two passes over its text, neither holding the whole text:
//   1. a scan (a SAX pass of Boost.JSON's basic_parser, allocating nothing) counts what the
//      manifest holds (ManifestCounts) and refuses, the moment a limit is crossed, a string
//      or key too long, nesting too deep, free-form parts (`training` and the shards'
//      `metadata`) too large, or too much outside the schema (unknown fields, a repeated
//      field, the wrong kind of value where the schema has a container or a scalar); at the
//      end it refuses a file larger than manifest_allowance() of its counts (padding);
//   2. the parse into a JSON document draws from a memory resource that refuses, with a
//      typed error, to hold more than manifest_memory_budget() of the same counts.
// So what opening a checkpoint holds grows with its shards, chunk checksums, tensors and
// free-form content, never with the file's size, and a hostile manifest is refused as
// Errc::malformed_manifest naming the file before it costs more than its budget.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>

CKPT_API_BEGIN
namespace ckpt {

/// Absolute cap on manifest.json, whatever its content (checked before any byte is parsed).
inline constexpr std::uint64_t kMaxManifestBytes = 256ull << 20;
/// JSON nesting (objects and arrays) at most this deep; the schema itself needs 4.
inline constexpr std::uint32_t kMaxManifestDepth = 32;
/// Longest string value (decoded bytes) anywhere in the manifest.
inline constexpr std::uint64_t kMaxManifestStringBytes = 1ull << 20;
/// Longest object key (decoded bytes) anywhere in the manifest.
inline constexpr std::uint64_t kMaxManifestKeyBytes = 4096;

/// Budget of the free-form parts, `training` and every shard's `metadata` together:
/// their compact JSON size (strings at their decoded length) and their number of values
/// (every object, array, string, number, literal), each plus an allowance per shard entry
/// read so far. The trainer's param_layout takes 7 values and about 100 bytes per model
/// tensor: 1 Mi values hold it for 140k tensors (the demo's model has 16). At most, the
/// free-form parts cost about 150 MB of document (1 Mi values) plus their strings.
inline constexpr std::uint64_t kFreeFormBytes = 64ull << 20;
inline constexpr std::uint64_t kFreeFormValues = 1ull << 20;
inline constexpr std::uint64_t kFreeFormBytesPerShard = 4096;
inline constexpr std::uint64_t kFreeFormValuesPerShard = 256;
/// Budget of what the schema does not know (unknown fields, a field repeated, a container
/// where a scalar belongs or the reverse, shape dimensions past 64, byte_range entries past
/// 2), in compact bytes: tolerated so that a small mistake is reported precisely by the
/// field checks, refused as a whole beyond this.
inline constexpr std::uint64_t kOutsideSchemaBytes = 64ull << 10;

/// Text allowances: a manifest may be at most manifest_allowance() bytes, the sum of a
/// base, one allowance per entry, and its strings and free-form parts counted twice (room
/// for escapes and the layout's whitespace). encode_manifest's output needs about a third.
inline constexpr std::uint64_t kAllowanceBase = 64ull << 10;
inline constexpr std::uint64_t kAllowancePerShard = 512;   ///< one shards[] entry, strings aside
inline constexpr std::uint64_t kAllowancePerChunk = 8;     ///< one chunk_xxh3 entry, its 16 digits aside
inline constexpr std::uint64_t kAllowancePerTensor = 256;  ///< one tensors[] entry, name and shape aside
inline constexpr std::uint64_t kAllowancePerDim = 24;      ///< one dimension of shape, or of a slice's global_shape, offsets, lengths
inline constexpr std::uint64_t kAllowancePerSharding = 128;  ///< one slice / replicated / rank_local field of a tensor entry, strings aside
inline constexpr std::uint64_t kAllowancePerHolder = 16;     ///< one rank of a replicated tensor's holders

/// Memory budget of the parsed document: bytes the JSON document and the parser's stack may
/// hold at once, counted as glibc's malloc reserves them (the request plus its header,
/// rounded to 16 bytes). A base, plus a cost per value, per object member, per string
/// longer than Boost.JSON keeps inline (14 bytes) and per byte of string and key. Measured
/// (Boost 1.81, 1k to 3M entries): an array element 49-58 bytes, a 16-digit chunk checksum
/// 97-106, an object member with its value 125-143, a tensors[] entry about 600 (10 values,
/// 5 members): the budget is 1.3 to 2.7 times that.
inline constexpr std::uint64_t kBudgetBase = 1ull << 20;
inline constexpr std::uint64_t kBudgetPerValue = 96;
inline constexpr std::uint64_t kBudgetPerMember = 96;
inline constexpr std::uint64_t kBudgetPerLongString = 48;
inline constexpr std::uint64_t kBudgetPerStringByte = 2;

/// What the scan of a manifest counted.
struct ManifestCounts {
  std::uint64_t shards = 0;          ///< shards[] entries
  std::uint64_t chunks = 0;          ///< chunk_xxh3 entries, all shards
  std::uint64_t tensors = 0;         ///< tensors[] entries
  std::uint64_t dims = 0;            ///< shape dimensions, all tensors (slices' global_shape, offsets and lengths included)
  std::uint64_t shardings = 0;       ///< tensors[] entries' slice, replicated and rank_local fields
  std::uint64_t holders = 0;         ///< replicated holders entries, all tensors
  std::uint64_t schema_string_bytes = 0;  ///< decoded bytes of the schema's string values
  std::uint64_t free_form_bytes = 0;      ///< compact bytes of training and the metadata
  std::uint64_t free_form_values = 0;
  std::uint64_t outside_schema_bytes = 0;
  std::uint64_t values = 0;        ///< every value of the document
  std::uint64_t members = 0;       ///< every object member
  std::uint64_t string_bytes = 0;  ///< decoded bytes of every string and key
  std::uint64_t long_strings = 0;  ///< strings longer than 14 bytes
};

/// The largest file size `c` justifies.
std::uint64_t manifest_allowance(const ManifestCounts& c) noexcept;
/// The most the parsed document of `c` may hold.
std::uint64_t manifest_memory_budget(const ManifestCounts& c) noexcept;

}  // namespace ckpt
CKPT_API_END
