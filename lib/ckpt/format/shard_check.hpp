// SPDX-License-Identifier: Apache-2.0
// The one check of a shard file's own safetensors header against the manifest's tensor index,
// shared by every read path (CheckpointReader, load_into, ShardRangeReader, MappedShard, slice
// loads, reshard, the object-store reads): whatever ckpt loads from a shard must be what any
// safetensors reader sees in that file. No I/O here: read_shard_head reads through the
// caller's read_at, so the same check serves a file, a mapped file and an object store.
//
// What is checked: the 8-byte length and the JSON header with parse_shard_prefix and
// parse_shard_header's limits (length against the file size and kMaxHeaderBytes, every
// number for overflow, known dtypes, offsets that tile the data section), then every tensor's
// name, dtype, shape and absolute byte range against the rank's index entries, both ways: a
// header tensor the index lacks and an index entry the header lacks are refused alike.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "ckpt/format/manifest.hpp"
#include "ckpt/format/safetensors.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// Reads `out.size()` bytes of the file at `offset` into `out`, or throws.
using ReadAt = std::function<void(std::uint64_t offset, std::span<std::byte> out)>;

/// Reads the first data_start bytes of a shard of `file_size` bytes (the manifest's) through
/// `read_at`: the 8-byte length first, checked by parse_shard_prefix (Errc::malformed_shard
/// naming `file` for a file shorter than 8 bytes or a length past the file or over
/// kMaxHeaderBytes), then the header. Two reads; the read_at's errors pass through.
std::vector<std::byte> read_shard_head(const ReadAt& read_at, std::uint64_t file_size, std::string_view file);

/// A shard header that agrees with the manifest index: the header, and for each of its
/// tensors (same order) the index entry that describes it.
struct CheckedShardHeader {
  ShardHeader header;
  std::vector<const TensorRecord*> records;  ///< into the manifest passed in
};

/// Parses `head` (the first bytes of the shard file `rec`, a record of `manifest`, at least
/// its data_start; more is ignored) with the limits of parse_shard_prefix and
/// parse_shard_header, for a file of the record's size, and compares every tensor with the
/// manifest's index entries of that file (its rank's, of its part). Throws
/// Errc::malformed_shard naming `file`: the parsers' errors as they are, or the first
/// disagreement in file order, "tensor 'NAME' disagrees with the manifest index in its
/// dtype" (or shape, or byte range) with the manifest's value as expected and the header's as
/// actual; a tensor on one side only is a disagreement in its name ("tensor 'X' of the shard
/// header disagrees with the manifest index in its name": expected the index's name for those
/// bytes, or "absent"; "tensor 'X' of the manifest index disagrees with the shard header in
/// its name": expected 'X', actual the header's name for those bytes, or "absent"). Linear in
/// the tensors.
CheckedShardHeader check_shard_head(const Manifest& manifest, const ShardRecord& rec, std::span<const std::byte> head, std::string_view file);

}  // namespace ckpt
CKPT_API_END
