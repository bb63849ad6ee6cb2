// SPDX-License-Identifier: Apache-2.0
#include "ckpt/hash/file_digest.hpp"

#include <algorithm>

#include "ckpt/core/error.hpp"

namespace ckpt {

FileHasher::FileHasher(std::uint64_t chunk_size, bool with_sha256) : chunk_size_(chunk_size) {
  if (chunk_size == 0) throw_invalid("FileHasher: chunk_size must be > 0");
  if (with_sha256) sha_.emplace();
}

void FileHasher::update_checksums(std::span<const std::byte> data) {
  split_ = true;
  feed(data, false);
}

void FileHasher::update_sha256(std::span<const std::byte> data) {
  if (sha_) sha_->update(data);
  sha_size_ += data.size();
}

void FileHasher::update(std::span<const std::byte> data) { feed(data, true); }

void FileHasher::feed(std::span<const std::byte> data, bool with_sha256) {
  // One pass: every piece of kFusedPiece bytes goes through the whole-file XXH3, the chunk's
  // XXH3 and SHA-256 while it is in L1/L2, so memory is read once however many digests the
  // file gets (hashing each digest over the caller's whole span would stream it from memory
  // three times).
  while (!data.empty()) {
    const std::uint64_t in_chunk = size_ % chunk_size_;
    const std::size_t take =
        static_cast<std::size_t>(std::min<std::uint64_t>({chunk_size_ - in_chunk, data.size(), kFusedPiece}));
    const auto piece = data.first(take);
    whole_.update(piece);
    chunk_.update(piece);
    if (with_sha256 && sha_) sha_->update(piece);
    size_ += take;
    data = data.subspan(take);
    if (size_ % chunk_size_ == 0) {
      chunks_.push_back(chunk_.digest());
      chunk_.reset();
    }
  }
}

FileDigest FileHasher::finish() {
  if (split_ && sha_ && sha_size_ != size_)
    throw Error(Errc::invalid_argument, {}, "FileHasher: the split halves took different byte counts",
                std::to_string(size_) + " bytes (XXH3)", std::to_string(sha_size_) + " bytes (SHA-256)");
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
