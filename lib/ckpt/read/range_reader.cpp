// SPDX-License-Identifier: Apache-2.0
#include "ckpt/read/range_reader.hpp"

#include <algorithm>
#include <cstring>

#include "ckpt/core/error.hpp"
#include "ckpt/read/chunk_check.hpp"

namespace ckpt {

ShardRangeReader::ShardRangeReader(const CheckpointReader& checkpoint, int rank, Verify mode)
    : ShardRangeReader(checkpoint, (check_rank(rank, checkpoint.manifest().world_size, "rank", checkpoint.dir()), checkpoint.manifest().shard(rank)), mode) {}

ShardRangeReader::ShardRangeReader(const CheckpointReader& checkpoint, const ShardRecord& file, Verify mode)
    : record_(&file), rank_(file.rank), mode_(mode), chunk_size_(checkpoint.manifest().chunk_size) {
  path_ = checkpoint.file_path(file);
  file_ = checkpoint.file_system().open_read(path_);
  check_size(record_->size, file_->size(), "shard size", path_);
  checkpoint.check_file_header(file, mode);
}

void ShardRangeReader::check_chunk(std::uint64_t k, std::span<const std::byte> bytes) const {
  detail::check_chunk_xxh3(path_, record_->chunk_xxh3, k, chunk_size_, bytes);
}

void ShardRangeReader::read(std::uint64_t offset, std::span<std::byte> out) {
  const std::uint64_t size = record_->size;
  if (offset > size || out.size() > size - offset)
    throw Error(Errc::invalid_argument, path_, "read range", "within " + std::to_string(size) + " bytes",
                std::to_string(offset) + "+" + std::to_string(out.size()));
  if (out.empty()) return;
  if (mode_ == Verify::none) {
    file_->read_at(offset, out);
    bytes_read_ += out.size();
    return;
  }
  const std::uint64_t end = offset + out.size();
  for (std::uint64_t k = offset / chunk_size_; k * chunk_size_ < end; ++k) {
    const std::uint64_t begin = k * chunk_size_, len = std::min(chunk_size_, size - begin);
    const std::uint64_t from = std::max(begin, offset), to = std::min(begin + len, end);
    std::span<std::byte> dest = out.subspan(static_cast<std::size_t>(from - offset), static_cast<std::size_t>(to - from));
    if (from == begin && to == begin + len) {
      // The whole chunk is wanted: verify it in place, no copy.
      file_->read_at(begin, dest);
      bytes_read_ += len;
      check_chunk(k, dest);
      continue;
    }
    if (cached_ != k) {
      chunk_.resize(static_cast<std::size_t>(len));
      cached_.reset();
      file_->read_at(begin, chunk_);
      bytes_read_ += len;
      check_chunk(k, chunk_);
      cached_ = k;
    }
    std::memcpy(dest.data(), chunk_.data() + (from - begin), dest.size());
  }
}

}  // namespace ckpt
