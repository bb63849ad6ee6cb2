// SPDX-License-Identifier: Apache-2.0
// The object-store interface of the durable tier (S3 and compatible stores), the counterpart
// of file_system.hpp for a store that has no rename and no directory fsync. What it offers
// instead, and what a commit on it is built from: objects written whole (a put, or a
// multipart upload completed at once), a create that fails if the key exists
// (`If-None-Match: *`), a replace that fails unless the object is still the one read before
// (`If-Match: <etag>`), ranged reads, and a listing.
//
// Keys are relative to the store's root (`s3://bucket/prefix`: the store adds `prefix/`), are
// 1..1024 bytes of printable ASCII or UTF-8 without control characters, and never contain an
// empty, `.` or `..` segment or start with `/`; any other key is refused with
// Errc::unsafe_path before a request is sent, and a listing that returns one is refused too.
//
// Errors, for every method: Errc::not_found (HTTP 404; the key or the upload does not exist),
// Errc::conflict (HTTP 412: a create's key exists, a replace's ETag is stale), Errc::io_error
// for everything else. Each names the object ("s3://bucket/prefix/key") as file(); an HTTP
// failure has expected "HTTP 2xx" and actual "HTTP <status> <S3 error code>" (e.g.
// "HTTP 400 BadDigest"); a transport failure (timeout, reset, refused connection) has actual
// "no response" and the errno it stands for (ETIMEDOUT, ECONNRESET, ECONNREFUSED) as
// sys_errno(). is_transient() tells the failures worth retrying from the others.
//
// ETags are returned and taken without quotes (S3 sends `"0f3a..."`; the RGW this was
// measured against matches an If-Match ETag only unquoted, see docs/object-store.md).
// Implementations are thread-safe: any number of calls may run at once.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/core/error.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// What a write requires of the object already under its key.
struct WriteCondition {
  enum class Kind {
    none,    ///< nothing: the put replaces whatever is there
    absent,  ///< no object under the key (If-None-Match: *), else Errc::conflict
    matches  ///< the object's ETag equals `etag` (If-Match), else Errc::conflict (the RGW answers 412 for a
             ///< missing object too; a server answering 404 gives Errc::not_found)
  };
  Kind kind = Kind::none;
  std::string etag;  ///< unquoted; for Kind::matches only

  static WriteCondition if_absent() { return {Kind::absent, {}}; }
  static WriteCondition if_matches(std::string etag) { return {Kind::matches, std::move(etag)}; }
};

/// An object's metadata, as head() and list() report it.
struct ObjectInfo {
  std::string key;     ///< relative to the store's root
  std::uint64_t size = 0;
  std::string etag;    ///< unquoted; the hex MD5 of the bytes for a single put, "<md5>-<parts>" for multipart
  std::string last_modified;  ///< list() only: the server's time of the write, RFC 3339 ("2026-12-02T01:15:21.551Z")
};

/// One page of a listing, in key order.
struct ObjectPage {
  std::vector<ObjectInfo> objects;
  std::string next_token;  ///< pass to list() for the next page; empty on the last page
};

/// A multipart upload the store still holds (begun, neither completed nor aborted).
struct MultipartUpload {
  std::string key;
  std::string upload_id;
  std::string initiated;  ///< the server's time of create_multipart, RFC 3339
};

/// A part uploaded to a multipart upload, as complete_multipart() takes it.
struct CompletedPart {
  int number = 0;     ///< 1..10000
  std::string etag;   ///< what upload_part() returned
};

/// True for a failure that a retry may cure: HTTP 5xx (503 SlowDown included), HTTP 429, and
/// transport failures (no response: timeouts, resets, refused connections). False for every
/// other error (404, 412, 400 BadDigest, 403, a refused key, ...).
bool is_transient(const Error& e) noexcept;

/// The object-store interface. Every method blocks until the server answered (or the
/// implementation gave up) and throws ckpt::Error as the file comment says.
class ObjectStore {
 public:
  virtual ~ObjectStore() = default;

  /// Stores `data` as the whole object `key`, under `when`; sends Content-MD5, so bytes
  /// damaged on the way are refused (HTTP 400 BadDigest) instead of stored. Returns the new
  /// ETag. Errc::conflict if `when` does not hold (nothing is written then).
  virtual std::string put(std::string_view key, std::span<const std::byte> data, const WriteCondition& when = {}) = 0;

  /// put() with If-None-Match: *: creates `key` only if no object has it. Of two writers
  /// racing for one key exactly one succeeds; the other gets Errc::conflict.
  std::string create(std::string_view key, std::span<const std::byte> data) {
    return put(key, data, WriteCondition::if_absent());
  }
  /// put() with If-Match: replaces `key` only if its ETag is still `etag` (compare-and-swap).
  std::string replace(std::string_view key, std::span<const std::byte> data, std::string etag) {
    return put(key, data, WriteCondition::if_matches(std::move(etag)));
  }

  /// Begins a multipart upload to `key`; returns its upload id. Nothing is visible under
  /// `key` until complete_multipart(); list_multipart_uploads() lists it until then.
  virtual std::string create_multipart(std::string_view key) = 0;
  /// Uploads part `part_number` (1..10000) of `upload_id` with Content-MD5; returns the
  /// part's ETag. Re-uploading a part number replaces that part (so a retry is safe). Every
  /// part but the last must be at least 5 MiB for complete_multipart() to accept it.
  virtual std::string upload_part(std::string_view key, std::string_view upload_id, int part_number,
                                  std::span<const std::byte> data) = 0;
  /// Joins `parts` (ascending part numbers) into the object `key`, atomically: readers see
  /// the old object (or none) until it returns. Returns the object's ETag. Errc::not_found if
  /// the upload does not exist (aborted, or completed before).
  virtual std::string complete_multipart(std::string_view key, std::string_view upload_id,
                                         std::span<const CompletedPart> parts) = 0;
  /// Discards `upload_id` and its parts. Errc::not_found if the upload does not exist.
  virtual void abort_multipart(std::string_view key, std::string_view upload_id) = 0;
  /// The multipart uploads under `prefix` not yet completed or aborted (at most `max_uploads`,
  /// 1..1000; Errc::invalid_argument beyond), in key order.
  virtual std::vector<MultipartUpload> list_multipart_uploads(std::string_view prefix, std::size_t max_uploads = 1000) = 0;

  /// Reads exactly out.size() bytes of `key` from `offset`. Errc::not_found if there is no
  /// such object; Errc::size_mismatch (naming the object) if the object ends before.
  virtual void get_range(std::string_view key, std::uint64_t offset, std::span<std::byte> out) = 0;
  /// The object's size and ETag. Errc::not_found if there is none.
  virtual ObjectInfo head(std::string_view key) = 0;
  /// One page (at most `max_keys`, 1..1000; Errc::invalid_argument beyond) of the objects whose key starts with `prefix`,
  /// after `token` (empty: from the first). A page the server returns with a key outside
  /// `prefix`, an unsafe key, or more entries than asked for is refused (Errc::unsafe_path,
  /// Errc::io_error); a response larger than the implementation's bound is Errc::io_error.
  virtual ObjectPage list(std::string_view prefix, std::string_view token = {}, std::size_t max_keys = 1000) = 0;
  /// Deletes `key`. Deleting a key that does not exist succeeds (as S3 does).
  virtual void remove(std::string_view key) = 0;

  /// The whole object (head, then one ranged read of its size).
  std::vector<std::byte> get(std::string_view key);

  /// How errors name the object `key` (the S3 client: "s3://bucket/prefix/key"), for callers
  /// that raise errors of their own about an object. The default is the key itself.
  virtual std::string name_of(std::string_view key) const { return std::string(key); }

  /// Gives up on the store: every call in flight ends promptly (the S3 client: within about a
  /// second, connecting and waiting for an answer included) and every later call fails at
  /// once, each with Errc::aborted naming its object; a retrying store retries neither. For a
  /// caller that stops waiting for a store that stopped answering (the durable tier's drain
  /// deadline). Irreversible. Thread-safe; never blocks. The default does nothing (a store
  /// whose calls cannot be interrupted).
  virtual void abort_calls() noexcept {}
};

/// How a component of ckpt opens the object store of a root of its URL scheme (the
/// `s3://bucket/prefix` of ckpt::s3): the client, with its retries, for `root`.
using ObjectStoreOpener = std::unique_ptr<ObjectStore> (*)(const std::string& root);

/// Makes `opener` the one open_object_store() uses for roots starting with `scheme` ("s3://").
/// Components register themselves when their library is loaded (ckpt::s3 does, for s3://);
/// the core library knows no object-store client, so that a program that links only
/// ckpt::ckpt links no HTTP client. Thread-safe; a later registration replaces an earlier one.
void register_object_store_scheme(std::string_view scheme, ObjectStoreOpener opener);

/// The object store of `root` through the opener registered for its scheme. A root whose
/// scheme has none (an s3:// root in a program without ckpt::s3) is Errc::invalid_argument
/// naming the root and saying how to get the component.
std::unique_ptr<ObjectStore> open_object_store(const std::string& root);

/// One call of the ObjectStore interface, as ObjectStoreWrapper::around() sees it.
struct ObjectCall {
  enum class Op { put, create_multipart, upload_part, complete_multipart, abort_multipart, list_uploads, get_range, head, list, remove, kCount };
  Op op;
  std::string_view key;  ///< the object's key; for a listing, its prefix
  int part_number = 0;   ///< upload_part's
};

/// Forwards every call to the store it wraps (which must outlive it) through around(), so
/// that a wrapper (the retrying store below, the fault-injecting one in ckpt::testing) says
/// once what it does around every call, and overrides a call only where it does more.
class ObjectStoreWrapper : public ObjectStore {
 public:
  explicit ObjectStoreWrapper(ObjectStore& base) : base_(base) {}
  ObjectStore& base() const noexcept { return base_; }

  std::string put(std::string_view key, std::span<const std::byte> data, const WriteCondition& when = {}) override;
  std::string create_multipart(std::string_view key) override;
  std::string upload_part(std::string_view key, std::string_view upload_id, int part_number,
                          std::span<const std::byte> data) override;
  std::string complete_multipart(std::string_view key, std::string_view upload_id,
                                 std::span<const CompletedPart> parts) override;
  void abort_multipart(std::string_view key, std::string_view upload_id) override;
  std::vector<MultipartUpload> list_multipart_uploads(std::string_view prefix, std::size_t max_uploads = 1000) override;
  void get_range(std::string_view key, std::uint64_t offset, std::span<std::byte> out) override;
  ObjectInfo head(std::string_view key) override;
  ObjectPage list(std::string_view prefix, std::string_view token = {}, std::size_t max_keys = 1000) override;
  void remove(std::string_view key) override;
  std::string name_of(std::string_view key) const override { return base_.name_of(key); }
  void abort_calls() noexcept override { base_.abort_calls(); }

 protected:
  /// Runs `forward` (the call on the wrapped store; it may run more than once, or not at
  /// all) for `call`. The default runs it once.
  virtual void around(const ObjectCall& call, const std::function<void()>& forward);

 private:
  ObjectStore& base_;
};

/// How a RetryingObjectStore retries: at most `max_attempts` tries of a call (1: no retry),
/// the n-th retry after a random delay in [0, min(max_delay, base_delay * 2^(n-1))] ("full
/// jitter"), only for failures is_transient() accepts.
struct RetryPolicy {
  int max_attempts = 6;
  std::chrono::milliseconds base_delay{100};
  std::chrono::milliseconds max_delay{5000};
};

/// Retries each call of the store it wraps under `policy`. Each call of the interface is safe
/// to repeat: a put or part re-sends the same bytes, a read re-reads. Two answers of a repeated
/// call are resolved here: a create or replace that failed transiently and then meets
/// Errc::conflict on its retry succeeds if the object now holds exactly its bytes (the first
/// attempt landed; its ETag, the MD5 of the bytes, is the proof), and an abort whose retry
/// finds the upload gone succeeds. A complete_multipart whose retry finds the upload gone
/// reports Errc::not_found (the caller checks the object). When the attempts run out, the
/// last error is thrown, its detail prefixed with "after N attempts: ". After abort_calls()
/// nothing is retried and a wait before a retry ends at once. Thread-safe.
class RetryingObjectStore final : public ObjectStoreWrapper {
 public:
  RetryingObjectStore(ObjectStore& base, RetryPolicy policy);
  /// Owns `base`.
  RetryingObjectStore(std::unique_ptr<ObjectStore> base, RetryPolicy policy);

  std::string put(std::string_view key, std::span<const std::byte> data, const WriteCondition& when = {}) override;
  void abort_multipart(std::string_view key, std::string_view upload_id) override;
  void abort_calls() noexcept override;

  /// Retries made so far (attempts beyond the first of each call), over all calls.
  std::uint64_t retries() const noexcept;

 protected:
  void around(const ObjectCall& call, const std::function<void()>& forward) override;

 private:
  // Runs `call(failures)` (transient failures so far) until it succeeds, fails for good, or
  // the attempts run out.
  void attempt(const std::function<void(int failures)>& call);
  std::unique_ptr<ObjectStore> owned_;
  RetryPolicy policy_;
  struct State;
  std::shared_ptr<State> state_;
};

/// The lower-case hex MD5 of `data`: the ETag S3 gives an object stored by one put.
std::string md5_hex(std::span<const std::byte> data);

/// How a file goes up to an object store (a checkpoint's shards, by the object store's
/// commit and the durable tier).
struct UploadOptions {
  /// Files of at least this many bytes go up in parts; smaller ones in one put.
  std::uint64_t multipart_threshold = 64ull << 20;
  /// Bytes per part (the last may be shorter): 5 MiB..5 GiB (S3's limits), and at most
  /// 10000 parts per file.
  std::uint64_t part_size = 16ull << 20;
  /// Parts uploaded at once (each holds one part_size buffer): 1..64.
  int parts_in_flight = 4;
};

}  // namespace ckpt
CKPT_API_END
