// SPDX-License-Identifier: Apache-2.0
// Shard files use the safetensors layout, so the ecosystem can read them:
//
//   [8 bytes: N, little-endian u64] [N bytes: JSON header, padded with spaces] [tensor data]
//
// The JSON header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the start of the data section) plus an optional "__metadata__" map of
// strings. ckpt pads the header so the data section starts at a multiple of 4096 bytes (the
// whole file image can then be written with O_DIRECT from an aligned buffer), and orders
// tensors by decreasing element size so every tensor is aligned to its element size.
//
// The parser trusts nothing: the header length is checked against the file size and a hard
// cap before any allocation, every number for overflow, and the data offsets must tile the data
// section exactly (no overlap, no hole, nothing past the end).
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "ckpt/core/dtype.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/format/sharding.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// Alignment of the data section (and of ckpt's staging buffers and O_DIRECT writes).
inline constexpr std::uint64_t kDataAlignment = 4096;
/// Largest JSON header accepted (the limit the reference safetensors implementation uses).
inline constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;

/// A tensor to be written: name, type, shape, and its bytes (numel * dtype_size long), and
/// optionally what it is in the whole job (sharding.hpp: a slice of a global tensor,
/// replicated, rank-local), which save() records in the manifest (docs/format.md).
struct TensorView {
  std::string name;
  DType dtype = DType::U8;
  std::vector<std::uint64_t> shape;
  std::span<const std::byte> data;
  std::optional<TensorSharding> sharding;
};

/// A tensor to save from `data`, its dtype inferred from the element type (dtype_of):
/// `ckpt::tensor("w", weights)` for a std::vector<float> is the 1-D F32 tensor of
/// weights.size() elements. `shape` gives it another shape (the product of its dimensions
/// must be data.size(): else Errc::invalid_argument naming the tensor, with both counts);
/// `sharding` says what it is of the job's state (slice_of, replicated, rank_local). The
/// tensor views `data`, which must stay alive and unchanged until the save has staged it.
template <class T>
TensorView tensor(std::string name, std::span<const T> data, std::vector<std::uint64_t> shape = {},
                  std::optional<TensorSharding> sharding = std::nullopt) {
  if (shape.empty()) shape = {data.size()};
  std::uint64_t numel = 1;
  for (const auto d : shape) numel *= d;
  if (numel != data.size())
    throw Error(Errc::invalid_argument, name, "tensor(): the shape's element count differs from the data's",
                std::to_string(data.size()) + " elements", std::to_string(numel) + " elements");
  return TensorView{std::move(name), dtype_of<T>(), std::move(shape), std::as_bytes(data), std::move(sharding)};
}
/// The same for a span of writable elements.
template <class T>
  requires(!std::is_const_v<T>)
TensorView tensor(std::string name, std::span<T> data, std::vector<std::uint64_t> shape = {},
                  std::optional<TensorSharding> sharding = std::nullopt) {
  return tensor(std::move(name), std::span<const T>(data), std::move(shape), std::move(sharding));
}
/// The same for a std::vector (not std::vector<bool>, which holds no array of bool).
template <class T>
TensorView tensor(std::string name, const std::vector<T>& data, std::vector<std::uint64_t> shape = {},
                  std::optional<TensorSharding> sharding = std::nullopt) {
  static_assert(!std::is_same_v<T, bool>, "ckpt::tensor: std::vector<bool> holds no array of bool");
  return tensor(std::move(name), std::span<const T>(data), std::move(shape), std::move(sharding));
}

/// One tensor of a shard header. begin/end are offsets into the data section.
struct ShardTensor {
  std::string name;
  DType dtype = DType::U8;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

/// A parsed or planned shard header.
struct ShardHeader {
  std::vector<ShardTensor> tensors;  ///< in data order (increasing begin)
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;  ///< 8 + N: file offset of the data section
  std::uint64_t data_size = 0;   ///< bytes of tensor data
  std::uint64_t file_size() const noexcept { return data_start + data_size; }
};

/// Number of elements of a shape; throws invalid_argument on overflow.
std::uint64_t shape_numel(std::span<const std::uint64_t> shape);

/// A tensor to be written whose bytes are not in memory yet: name, type and shape.
struct TensorSpec {
  std::string name;
  DType dtype = DType::U8;
  std::vector<std::uint64_t> shape;
};

/// The header plan_shard() would produce for tensors with these specs (same order, same
/// offsets, same data_start), without needing their bytes. Throws invalid_argument as
/// plan_shard does (empty, reserved or duplicate names, sizes that overflow).
ShardHeader plan_shard_specs(std::span<const TensorSpec> tensors, std::map<std::string, std::string> metadata = {});

/// Lays out a shard for the given tensors (validates names unique, non-empty, not
/// "__metadata__"; data sizes equal numel * dtype size): returns the header with data offsets.
ShardHeader plan_shard(std::span<const TensorView> tensors,
                       std::map<std::string, std::string> metadata = {});

/// Where the data section of a planned header starts: 8 + the JSON header's length, rounded
/// up to kDataAlignment (h.tensors and h.metadata must be final).
std::uint64_t planned_data_start(const ShardHeader& h);

/// The first data_start bytes of the file: length prefix plus space-padded JSON.
std::string encode_shard_header(const ShardHeader& header);

/// Reads the 8-byte length prefix of a file of `file_size` bytes and returns data_start
/// (8 + N) after checking it against the file size and kMaxHeaderBytes. Throws
/// Errc::malformed_shard naming `file` otherwise.
std::uint64_t parse_shard_prefix(std::span<const std::byte> first8, std::uint64_t file_size,
                                 std::string_view file);

/// Parses and validates the JSON header (the N bytes after the prefix) of a file of
/// `file_size` bytes. Throws Errc::malformed_shard naming `file` and the offending entry.
ShardHeader parse_shard_header(std::string_view json, std::uint64_t file_size, std::string_view file);

}  // namespace ckpt
CKPT_API_END
