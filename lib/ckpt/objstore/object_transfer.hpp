// SPDX-License-Identifier: Apache-2.0
// Moving one local file to an object store: a single put below a threshold, else a multipart
// upload with a bounded number of parts in flight, every part carrying Content-MD5 (the store
// refuses damaged bytes) and passing the caller's check of the bytes read (the tier re-checks
// each chunk against its XXH3, as the directory tier does). An upload that fails is aborted, so
// it leaves no multipart upload behind (unless the abort itself fails: then the upload is one
// of the leftovers that list_multipart_uploads() shows and a collector removes). Not installed:
// the library's own transfer (UploadOptions, what a user sets, is in object_store.hpp).
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "ckpt/fs/file_system.hpp"
#include "ckpt/objstore/object_store.hpp"

CKPT_API_BEGIN
namespace ckpt {


/// Called with the bytes read from the file at `offset` before they are sent (from the
/// uploading threads, concurrently for different ranges); throws to fail the upload.
using UploadCheck = std::function<void(std::uint64_t offset, std::span<const std::byte> bytes)>;

struct UploadReport {
  std::string etag;        ///< the object's ETag
  std::uint64_t bytes = 0; ///< the file's size
  int parts = 0;           ///< parts uploaded (0: a single put)
};

/// Uploads the file `path` (read through `fs`) as the object `key` of `store`, replacing what
/// is there (a conditional first write is the caller's: this is for keys never reused).
/// Blocks until the object is complete. Throws Errc::invalid_argument for bad options, the
/// file's errors (not_found, io_error), `check`'s error, or the store's error of the first
/// part that failed (after the store's own retries, when `store` is a RetryingObjectStore);
/// a failed multipart upload is aborted first. Thread-safe for different keys.
UploadReport upload_file(ObjectStore& store, FileSystem& fs, const std::string& path, std::string_view key,
                         const UploadOptions& options = {}, const UploadCheck& check = {});

/// upload_file's upload from any readable source (a shard of another store): the same parts,
/// checks and failures, naming source.path(). `source` is read from several threads at once
/// (ReadableFile::read_at is const and reads at an offset).
UploadReport upload_object(ObjectStore& store, const ReadableFile& source, std::string_view key, const UploadOptions& options = {},
                           const UploadCheck& check = {});

}  // namespace ckpt
CKPT_API_END
