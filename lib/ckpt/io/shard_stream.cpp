#include "ckpt/io/shard_stream.hpp"

#include <algorithm>
#include <boost/json.hpp>
#include <cstring>
#include <set>

#include "ckpt/core/error.hpp"
#include "ckpt/hash/xxh3.hpp"
#include "ckpt/io/layout.hpp"

namespace ckpt {

namespace json = boost::json;


// ---- ShardStreamWriter ----------------------------------------------------------------

ShardStreamWriter::ShardStreamWriter(FileSystem& fs, const std::string& dir, std::string file_name,
                                     std::span<const TensorSpec> tensors, std::map<std::string, std::string> header_metadata,
                                     std::uint64_t chunk_size, bool with_sha256)
    : header_(plan_shard_specs(tensors, std::move(header_metadata))),
      file_name_(std::move(file_name)),
      path_(join_path(dir, file_name_)),
      hasher_(chunk_size, with_sha256),
      chunk_size_(chunk_size) {
  const std::string head = encode_shard_header(header_);
  file_ = fs.create(path_, {});
  file_->allocate(header_.file_size());
  put(std::as_bytes(std::span(head.data(), head.size())));
}

ShardStreamWriter::~ShardStreamWriter() {
  if (file_ && !finished_) {
    try {
      file_->close();
    } catch (...) {
      // The write already failed (or was abandoned): that error is the one reported.
    }
  }
}

void ShardStreamWriter::put(std::span<const std::byte> bytes) {
  // Chunk-sized writes keep the hashing of one piece close (in cache) to its write.
  while (!bytes.empty()) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(bytes.size(), chunk_size_));
    hasher_.update(bytes.first(n));
    file_->write_at(offset_, bytes.first(n));
    offset_ += n;
    bytes = bytes.subspan(n);
  }
}

void ShardStreamWriter::write(std::span<const std::byte> bytes) {
  if (finished_) throw Error(Errc::invalid_argument, path_, "write after finish");
  if (bytes.size() > remaining())
    throw Error(Errc::invalid_argument, path_, "more data than the planned tensors hold",
                "at most " + std::to_string(remaining()) + " bytes", std::to_string(bytes.size()) + " bytes");
  put(bytes);
  written_ += bytes.size();
}

void ShardStreamWriter::write_zeros(std::uint64_t count) {
  static constexpr std::size_t kZeroBlock = 64 << 10;
  static const std::vector<std::byte> zeros(kZeroBlock);
  while (count > 0) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(count, kZeroBlock));
    write(std::span(zeros.data(), n));
    count -= n;
  }
}

WrittenShard ShardStreamWriter::finish(int rank) {
  if (finished_) throw Error(Errc::invalid_argument, path_, "finish called twice");
  if (remaining() != 0)
    throw Error(Errc::invalid_argument, path_, "data section incomplete", std::to_string(header_.data_size) + " bytes",
                std::to_string(written_) + " bytes");
  file_->sync();
  file_->close();
  finished_ = true;
  const FileDigest d = hasher_.finish();
  WrittenShard out;
  out.record.rank = rank;
  out.record.path = file_name_;
  out.record.size = d.size;
  out.record.sha256 = d.sha256;
  out.record.xxh3 = d.xxh3;
  out.record.chunk_xxh3 = d.chunk_xxh3;
  out.tensors = tensor_records(header_, rank);
  return out;
}

// ---- ShardRangeReader -----------------------------------------------------------------

ShardRangeReader::ShardRangeReader(const CheckpointReader& checkpoint, int rank, Verify mode)
    : rank_(rank), mode_(mode), chunk_size_(checkpoint.manifest().chunk_size) {
  const Manifest& m = checkpoint.manifest();
  check_rank(rank, m.world_size, "rank", checkpoint.dir());
  record_ = &m.shard(rank);
  path_ = checkpoint.shard_path(rank);
  file_ = checkpoint.file_system().open_read(path_);
  check_size(record_->size, file_->size(), "shard size", path_);
}

void ShardRangeReader::check_chunk(std::uint64_t k, std::span<const std::byte> bytes) const {
  const std::uint64_t h = xxh3_64(bytes.data(), bytes.size());
  if (h == record_->chunk_xxh3[k]) return;
  const std::uint64_t begin = k * chunk_size_;
  throw Error(Errc::checksum_mismatch, path_,
              "xxh3 of chunk " + std::to_string(k) + " of " + std::to_string(record_->chunk_xxh3.size()) + " (bytes " +
                  std::to_string(begin) + "-" + std::to_string(begin + bytes.size()) + ")",
              xxh3_hex(record_->chunk_xxh3[k]), xxh3_hex(h));
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
