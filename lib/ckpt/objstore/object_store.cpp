// SPDX-License-Identifier: Apache-2.0
#include "ckpt/objstore/object_store.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include <openssl/evp.h>

#include "ckpt/hash/sha256.hpp"

namespace ckpt {

bool is_transient(const Error& e) noexcept {
  if (e.code() != Errc::io_error) return false;
  const std::string& a = e.actual();
  return a == "no response" || a.starts_with("HTTP 5") || a.starts_with("HTTP 429");
}

std::string md5_hex(std::span<const std::byte> data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), md, &n, EVP_md5(), nullptr) != 1)
    throw Error(Errc::io_error, {}, "MD5 failed (OpenSSL EVP_Digest)");
  return to_hex(std::span<const std::uint8_t>(md, n));
}

std::vector<std::byte> ObjectStore::get(std::string_view key) {
  const ObjectInfo info = head(key);
  std::vector<std::byte> out(info.size);
  if (!out.empty()) get_range(key, 0, out);
  return out;
}

// ---- RetryingObjectStore ------------------------------------------------------------------

struct RetryingObjectStore::State {
  std::mutex mu;
  std::condition_variable wake;  // abort_calls() ends the waits before retries
  bool aborted = false;
  std::mt19937_64 rng{std::random_device{}()};
  std::atomic<std::uint64_t> retries{0};
};

RetryingObjectStore::RetryingObjectStore(ObjectStore& base, RetryPolicy policy)
    : ObjectStoreWrapper(base), policy_(policy), state_(std::make_shared<State>()) {
  if (policy_.max_attempts < 1) throw_invalid("RetryPolicy::max_attempts must be at least 1");
}

RetryingObjectStore::RetryingObjectStore(std::unique_ptr<ObjectStore> base, RetryPolicy policy)
    : RetryingObjectStore(*base, policy) {
  owned_ = std::move(base);
}

std::uint64_t RetryingObjectStore::retries() const noexcept { return state_->retries.load(); }

std::string ObjectStoreWrapper::put(std::string_view key, std::span<const std::byte> data, const WriteCondition& when) {
  std::string etag;
  around({ObjectCall::Op::put, key}, [&] { etag = base_.put(key, data, when); });
  return etag;
}

std::string ObjectStoreWrapper::create_multipart(std::string_view key) {
  std::string id;
  around({ObjectCall::Op::create_multipart, key}, [&] { id = base_.create_multipart(key); });
  return id;
}

std::string ObjectStoreWrapper::upload_part(std::string_view key, std::string_view upload_id, int part_number,
                                            std::span<const std::byte> data) {
  std::string etag;
  around({ObjectCall::Op::upload_part, key, part_number}, [&] { etag = base_.upload_part(key, upload_id, part_number, data); });
  return etag;
}

std::string ObjectStoreWrapper::complete_multipart(std::string_view key, std::string_view upload_id,
                                                   std::span<const CompletedPart> parts) {
  std::string etag;
  around({ObjectCall::Op::complete_multipart, key}, [&] { etag = base_.complete_multipart(key, upload_id, parts); });
  return etag;
}

void ObjectStoreWrapper::abort_multipart(std::string_view key, std::string_view upload_id) {
  around({ObjectCall::Op::abort_multipart, key}, [&] { base_.abort_multipart(key, upload_id); });
}

std::vector<MultipartUpload> ObjectStoreWrapper::list_multipart_uploads(std::string_view prefix, std::size_t max_uploads) {
  std::vector<MultipartUpload> uploads;
  around({ObjectCall::Op::list_uploads, prefix}, [&] { uploads = base_.list_multipart_uploads(prefix, max_uploads); });
  return uploads;
}

void ObjectStoreWrapper::get_range(std::string_view key, std::uint64_t offset, std::span<std::byte> out) {
  around({ObjectCall::Op::get_range, key}, [&] { base_.get_range(key, offset, out); });
}

ObjectInfo ObjectStoreWrapper::head(std::string_view key) {
  ObjectInfo info;
  around({ObjectCall::Op::head, key}, [&] { info = base_.head(key); });
  return info;
}

ObjectPage ObjectStoreWrapper::list(std::string_view prefix, std::string_view token, std::size_t max_keys) {
  ObjectPage page;
  around({ObjectCall::Op::list, prefix}, [&] { page = base_.list(prefix, token, max_keys); });
  return page;
}

void ObjectStoreWrapper::remove(std::string_view key) {
  around({ObjectCall::Op::remove, key}, [&] { base_.remove(key); });
}

void ObjectStoreWrapper::around(const ObjectCall&, const std::function<void()>& forward) { forward(); }

void RetryingObjectStore::attempt(const std::function<void(int)>& call) {
  for (int n = 1;; ++n) {
    try {
      return call(n - 1);
    } catch (const Error& e) {
      if (!is_transient(e)) throw;
      std::unique_lock lock(state_->mu);
      // After abort_calls() the caller has given up: a transient failure is not retried.
      if (state_->aborted)
        throw Error(Errc::aborted, e.file(), "not retried, the caller gave up on the store (abort_calls): " + e.detail(),
                    e.expected(), e.actual(), e.sys_errno());
      if (n >= policy_.max_attempts)
        throw Error(e.code(), e.file(), "after " + std::to_string(n) + " attempts: " + e.detail(), e.expected(),
                    e.actual(), e.sys_errno());
      const auto cap = std::min<std::int64_t>(policy_.max_delay.count(),
                                              policy_.base_delay.count() << std::min(n - 1, 30));
      const std::int64_t delay = std::uniform_int_distribution<std::int64_t>(0, std::max<std::int64_t>(cap, 0))(state_->rng);
      state_->retries.fetch_add(1);
      state_->wake.wait_for(lock, std::chrono::milliseconds(delay), [&] { return state_->aborted; });
    }
  }
}

void RetryingObjectStore::around(const ObjectCall&, const std::function<void()>& forward) {
  // A lost answer to create_multipart leaves an upload nobody knows of; listing and
  // collecting such leftovers is the caller's (list_multipart_uploads()).
  attempt([&](int) { forward(); });
}

std::string RetryingObjectStore::put(std::string_view key, std::span<const std::byte> data, const WriteCondition& when) {
  std::string etag;
  attempt([&](int failures) {
    try {
      etag = base().put(key, data, when);
    } catch (const Error& e) {
      // A conditional write refused after an attempt whose answer was lost: that attempt may
      // have landed. It did exactly when the object now holds our bytes.
      if (e.code() != Errc::conflict || failures == 0 || when.kind == WriteCondition::Kind::none) throw;
      const std::string mine = md5_hex(data);
      if (base().head(key).etag != mine) throw;
      etag = mine;
    }
  });
  return etag;
}

void RetryingObjectStore::abort_calls() noexcept {
  {
    std::lock_guard lock(state_->mu);
    state_->aborted = true;
  }
  state_->wake.notify_all();
  base().abort_calls();
}

void RetryingObjectStore::abort_multipart(std::string_view key, std::string_view upload_id) {
  attempt([&](int failures) {
    try {
      base().abort_multipart(key, upload_id);
    } catch (const Error& e) {
      if (e.code() != Errc::not_found || failures == 0) throw;  // an earlier attempt aborted it
    }
  });
}

namespace {
struct SchemeRegistry {
  std::mutex mu;
  std::vector<std::pair<std::string, ObjectStoreOpener>> openers;
};
// A function-local static: components register from their static initializers, which may
// run before this file's.
SchemeRegistry& scheme_registry() {
  static SchemeRegistry r;
  return r;
}
}  // namespace

void register_object_store_scheme(std::string_view scheme, ObjectStoreOpener opener) {
  auto& r = scheme_registry();
  std::lock_guard lock(r.mu);
  for (auto& [s, o] : r.openers)
    if (s == scheme) {
      o = opener;
      return;
    }
  r.openers.emplace_back(std::string(scheme), opener);
}

std::unique_ptr<ObjectStore> open_object_store(const std::string& root) {
  ObjectStoreOpener opener = nullptr;
  {
    auto& r = scheme_registry();
    std::lock_guard lock(r.mu);
    for (const auto& [s, o] : r.openers)
      if (root.starts_with(s)) opener = o;
  }
  if (!opener) {
    const std::string scheme = root.substr(0, root.find("://") + 3);
    if (scheme == "s3://")
      throw Error(Errc::invalid_argument, root, "this program has no S3 client: link ckpt::s3 (CMake: find_package(ckpt COMPONENTS s3), target ckpt::s3; pkg-config: ckpt-s3), from a ckpt built with -DCKPT_S3=ON (Debian: libcurl4-openssl-dev, libexpat1-dev)",
                  "a program linked with ckpt::s3", "ckpt::ckpt alone");
    throw Error(Errc::invalid_argument, root, "no object-store client for this scheme", "s3://bucket/prefix", root);
  }
  return opener(root);
}

}  // namespace ckpt
