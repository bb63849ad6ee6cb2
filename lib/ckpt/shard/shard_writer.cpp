// SPDX-License-Identifier: Apache-2.0
#include "ckpt/shard/shard_writer.hpp"

#include <algorithm>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"

namespace ckpt {

std::map<std::string, std::string> shard_header_metadata(int rank, int world_size, std::uint64_t step) {
  return {{"ckpt.rank", std::to_string(rank)}, {"ckpt.world_size", std::to_string(world_size)}, {"ckpt.step", std::to_string(step)}};
}

std::vector<TensorRecord> tensor_records(const ShardHeader& header, int rank) {
  std::vector<TensorRecord> out;
  out.reserve(header.tensors.size());
  for (const auto& t : header.tensors)
    out.push_back({t.name, rank, t.dtype, t.shape, header.data_start + t.begin, header.data_start + t.end, std::nullopt});
  return out;
}

ShardWriter::ShardWriter(FileSystem& fs, const std::string& dir, std::string file_name, ShardHeader header, std::uint64_t size,
                         ShardWriterOptions options)
    : header_(std::move(header)),
      file_name_(std::move(file_name)),
      path_(join_path(dir, file_name_)),
      size_(size),
      hasher_(std::make_unique<FileHasher>(options.chunk_size, options.sha256)),
      chunk_size_(options.chunk_size) {
  file_ = fs.create(path_, {.direct = options.direct});
  file_->allocate(size_);
}

ShardWriter ShardWriter::stream(FileSystem& fs, const std::string& dir, std::string file_name, std::span<const TensorSpec> tensors,
                                std::map<std::string, std::string> header_metadata, ShardWriterOptions options) {
  options.direct = false;  // pieces of any length and alignment
  ShardHeader header = plan_shard_specs(tensors, std::move(header_metadata));
  const std::uint64_t size = header.file_size();
  ShardWriter w(fs, dir, std::move(file_name), std::move(header), size, options);
  const std::string head = encode_shard_header(w.header_);
  w.put(std::as_bytes(std::span(head.data(), head.size())));
  return w;
}

ShardWriter ShardWriter::image(FileSystem& fs, const std::string& dir, std::string file_name, ShardHeader header,
                               ShardWriterOptions options) {
  const std::uint64_t size = header.file_size();
  return ShardWriter(fs, dir, std::move(file_name), std::move(header), size, options);
}

ShardWriter ShardWriter::copy(FileSystem& fs, const std::string& dir, std::string file_name, std::uint64_t size,
                              ShardWriterOptions options) {
  options.direct = false;
  return ShardWriter(fs, dir, std::move(file_name), ShardHeader{}, size, options);
}

ShardWriter::ShardWriter(ShardWriter&&) noexcept = default;
ShardWriter& ShardWriter::operator=(ShardWriter&&) noexcept = default;

ShardWriter::~ShardWriter() {
  if (file_ && !finished_) {
    try {
      file_->close();
    } catch (...) {
      // The write already failed (or was abandoned): that error is the one reported.
    }
  }
}

namespace {
void check_room(const std::string& path, std::uint64_t size, std::uint64_t hashed, std::size_t more) {
  if (more > size - hashed)
    throw Error(Errc::invalid_argument, path, "more bytes than the shard holds", "at most " + std::to_string(size - hashed) + " bytes",
                std::to_string(more) + " bytes");
}
}  // namespace

void ShardWriter::hash_checksums(std::span<const std::byte> bytes) {
  check_room(path_, size_, hashed_, bytes.size());
  split_ = true;
  hasher_->update_checksums(bytes);
  hashed_ += bytes.size();
}

void ShardWriter::hash_sha256(std::span<const std::byte> bytes) {
  check_room(path_, size_, hashed_sha_, bytes.size());
  hasher_->update_sha256(bytes);
  hashed_sha_ += bytes.size();
}

void ShardWriter::hash(std::span<const std::byte> bytes) {
  check_room(path_, size_, hashed_, bytes.size());
  // Chunk by chunk keeps the bytes in cache between the hashes of one piece.
  for (std::size_t off = 0; off < bytes.size(); off += static_cast<std::size_t>(chunk_size_))
    hasher_->update(bytes.subspan(off, static_cast<std::size_t>(std::min<std::uint64_t>(chunk_size_, bytes.size() - off))));
  hashed_ += bytes.size();
}

void ShardWriter::put(std::span<const std::byte> bytes) {
  // Chunk-sized writes keep the hashing of one piece close (in cache) to its write.
  while (!bytes.empty()) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), chunk_size_));
    hash(bytes.first(n));
    file_->write_at(written_end_, bytes.first(n));
    written_end_ += n;
    bytes = bytes.subspan(n);
  }
}

void ShardWriter::write(std::span<const std::byte> bytes) {
  if (finished_) throw Error(Errc::invalid_argument, path_, "write after finish");
  if (bytes.size() > remaining())
    throw Error(Errc::invalid_argument, path_, "more data than the planned tensors hold",
                "at most " + std::to_string(remaining()) + " bytes", std::to_string(bytes.size()) + " bytes");
  put(bytes);
}

void ShardWriter::write_zeros(std::uint64_t count) {
  static constexpr std::size_t kZeroBlock = 64 << 10;
  static const std::vector<std::byte> zeros(kZeroBlock);
  while (count > 0) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(count, kZeroBlock));
    write(std::span(zeros.data(), n));
    count -= n;
  }
}

ShardReport ShardWriter::finish(int rank) {
  if (finished_) throw Error(Errc::invalid_argument, path_, "finish called twice");
  const std::uint64_t hashed = split_ ? std::min(hashed_, hashed_sha_) : hashed_;
  if (hashed != size_ || written_end_ < size_)
    throw Error(Errc::invalid_argument, path_, "shard file incomplete", std::to_string(size_) + " bytes",
                std::to_string(std::min(hashed, written_end_)) + " bytes");
  if (written_end_ > size_) file_->truncate(size_);  // the O_DIRECT padding
  file_->sync();
  file_->close();
  finished_ = true;
  const FileDigest d = hasher_->finish();
  ShardReport out;
  out.shard.rank = rank;
  out.shard.path = file_name_;
  out.shard.size = d.size;
  out.shard.sha256 = d.sha256;
  out.shard.xxh3 = d.xxh3;
  out.shard.chunk_xxh3 = d.chunk_xxh3;
  out.tensors = tensor_records(header_, rank);
  out.chunk_size = chunk_size_;
  return out;
}

}  // namespace ckpt
