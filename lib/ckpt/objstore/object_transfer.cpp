// SPDX-License-Identifier: Apache-2.0
// upload_file, in steps:
//   1. open the file, take its size;
//   2. below the threshold: read it whole, check it, one put; done;
//   3. create the multipart upload;
//   4. min(parts_in_flight, parts) threads take part numbers in order from one counter; each
//      reads its part into its own buffer, checks it, uploads it (Content-MD5 is the client's),
//      and records its ETag; the first failure stops the others taking new parts;
//   5. on a failure: abort the upload (a failed abort is logged; the leftover stays listed),
//      then throw the first failure;
//   6. complete with every part in order; if that fails, abort as in 5.
#include "ckpt/objstore/object_transfer.hpp"

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/core/log.hpp"

namespace ckpt {

namespace {

void abort_quietly(ObjectStore& store, std::string_view key, const std::string& upload_id) {
  try {
    store.abort_multipart(key, upload_id);
  } catch (const Error& e) {
    log_event(LogLevel::warn, "multipart_abort_failed", "object upload: aborting upload " + upload_id + " of " + std::string(key) +
             " failed (it stays listed until collected): " + e.what());
  }
}

void check_upload_options(const UploadOptions& options, const std::string& path) {
  constexpr std::uint64_t kMinPart = 5ull << 20, kMaxPart = 5ull << 30;
  if (options.part_size < kMinPart || options.part_size > kMaxPart)
    throw Error(Errc::invalid_argument, path, "UploadOptions::part_size", "5 MiB..5 GiB",
                std::to_string(options.part_size) + " bytes");
  if (options.parts_in_flight < 1 || options.parts_in_flight > 64)
    throw Error(Errc::invalid_argument, path, "UploadOptions::parts_in_flight", "1..64",
                std::to_string(options.parts_in_flight));
}

}  // namespace

UploadReport upload_file(ObjectStore& store, FileSystem& fs, const std::string& path, std::string_view key,
                         const UploadOptions& options, const UploadCheck& check) {
  check_upload_options(options, path);
  return upload_object(store, *fs.open_read(path), key, options, check);
}

UploadReport upload_object(ObjectStore& store, const ReadableFile& source, std::string_view key, const UploadOptions& options,
                           const UploadCheck& check) {
  const std::string& path = source.path();
  check_upload_options(options, path);
  const ReadableFile* file = &source;
  const std::uint64_t size = file->size();
  if (size < options.multipart_threshold) {
    std::vector<std::byte> all(size);
    if (size) file->read_at(0, all);
    if (check) check(0, all);
    return {store.put(key, all), size, 0};
  }

  const std::uint64_t n_parts = (size + options.part_size - 1) / options.part_size;
  if (n_parts > 10000)
    throw Error(Errc::invalid_argument, path, "more than 10000 parts at UploadOptions::part_size", "at most 10000 parts",
                std::to_string(n_parts) + " parts");
  const std::string upload_id = store.create_multipart(key);

  std::vector<CompletedPart> parts(n_parts);
  std::atomic<std::uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::exception_ptr first_error;
  auto worker = [&] {
    std::vector<std::byte> buffer;
    try {
      for (;;) {
        const std::uint64_t i = next.fetch_add(1);
        if (i >= n_parts || failed.load()) return;
        const std::uint64_t offset = i * options.part_size;
        buffer.resize(std::min(options.part_size, size - offset));
        file->read_at(offset, buffer);
        if (check) check(offset, buffer);
        const int number = static_cast<int>(i + 1);
        parts[i] = {number, store.upload_part(key, upload_id, number, buffer)};
      }
    } catch (...) {
      std::lock_guard lock(mu);
      if (!first_error) first_error = std::current_exception();
      failed = true;
    }
  };
  const std::size_t n_threads = static_cast<std::size_t>(std::min<std::uint64_t>(options.parts_in_flight, n_parts));
  {
    std::vector<std::jthread> threads;
    for (std::size_t t = 1; t < n_threads; ++t) threads.emplace_back(worker);
    worker();
  }
  if (first_error) {
    abort_quietly(store, key, upload_id);
    std::rethrow_exception(first_error);
  }
  try {
    return {store.complete_multipart(key, upload_id, parts), size, static_cast<int>(n_parts)};
  } catch (...) {
    abort_quietly(store, key, upload_id);
    throw;
  }
}

}  // namespace ckpt
