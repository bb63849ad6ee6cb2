#include "ckpt/hash/file_digest.hpp"

#include <algorithm>

#include "ckpt/core/error.hpp"

namespace ckpt {

FileHasher::FileHasher(std::uint64_t chunk_size, bool with_sha256) : chunk_size_(chunk_size) {
  if (chunk_size == 0) throw_invalid("FileHasher: chunk_size must be > 0");
  if (with_sha256) sha_.emplace();
}

void FileHasher::update(std::span<const std::byte> data) {
  whole_.update(data);
  if (sha_) sha_->update(data);
  while (!data.empty()) {
    const std::uint64_t in_chunk = size_ % chunk_size_;
    const std::size_t take = static_cast<std::size_t>(std::min<std::uint64_t>(chunk_size_ - in_chunk, data.size()));
    chunk_.update(data.first(take));
    size_ += take;
    data = data.subspan(take);
    if (size_ % chunk_size_ == 0) {
      chunks_.push_back(chunk_.digest());
      chunk_.reset();
    }
  }
}

FileDigest FileHasher::finish() {
  FileDigest d;
  d.size = size_;
  d.chunk_size = chunk_size_;
  d.xxh3 = whole_.digest();
  d.chunk_xxh3 = std::move(chunks_);
  if (size_ % chunk_size_ != 0) d.chunk_xxh3.push_back(chunk_.digest());
  if (sha_) {
    const auto digest = sha_->finish();
    d.sha256 = to_hex(digest);
  }
  return d;
}

}  // namespace ckpt
