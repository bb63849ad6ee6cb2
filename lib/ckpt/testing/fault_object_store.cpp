#include "ckpt/testing/fault_object_store.hpp"

#include <cerrno>

namespace ckpt::testing {

namespace {

[[noreturn]] void throw_fault(FaultInjectionObjectStore::Fault f, std::string_view key, std::string_view action) {
  using Fault = FaultInjectionObjectStore::Fault;
  const std::string file(key), what = std::string(action) + " (injected)";
  switch (f) {
    case Fault::slow_down: throw Error(Errc::io_error, file, what + ": Please reduce your request rate.", "HTTP 2xx", "HTTP 503 SlowDown");
    case Fault::server_error: throw Error(Errc::io_error, file, what + ": internal error", "HTTP 2xx", "HTTP 500 InternalError");
    case Fault::timeout:
    case Fault::hang: throw Error(Errc::io_error, file, what + ": timed out", "a response", "no response", ETIMEDOUT);
    case Fault::dropped: throw Error(Errc::io_error, file, what + ": connection reset", "a response", "no response", ECONNRESET);
    case Fault::lost_race: break;
  }
  throw Error(Errc::io_error, file, what);
}

}  // namespace

FaultInjectionObjectStore::~FaultInjectionObjectStore() { release_hangs(); }

void FaultInjectionObjectStore::inject(Op op, Fault fault, std::uint64_t count, std::uint64_t after) {
  std::lock_guard lock(mu_);
  plans_[static_cast<std::size_t>(op)] = {fault, after, count};
}

void FaultInjectionObjectStore::clear() {
  std::lock_guard lock(mu_);
  plans_ = {};
}

void FaultInjectionObjectStore::release_hangs() {
  std::lock_guard lock(mu_);
  for (auto& p : plans_)
    if (p.fault == Fault::hang) p = {};
  ++release_epoch_;
  released_.notify_all();
}

std::uint64_t FaultInjectionObjectStore::calls(Op op) const {
  std::lock_guard lock(mu_);
  return calls_[static_cast<std::size_t>(op)];
}

std::uint64_t FaultInjectionObjectStore::injected() const {
  std::lock_guard lock(mu_);
  return injected_;
}

std::uint64_t FaultInjectionObjectStore::hanging() const {
  std::lock_guard lock(mu_);
  return hanging_;
}

bool FaultInjectionObjectStore::take(Op op, Fault& fault) {
  std::lock_guard lock(mu_);
  ++calls_[static_cast<std::size_t>(op)];
  Plan& p = plans_[static_cast<std::size_t>(op)];
  if (p.remaining == 0) return false;
  if (p.skip > 0) {
    --p.skip;
    return false;
  }
  --p.remaining;
  ++injected_;
  fault = p.fault;
  return true;
}

template <class F>
decltype(auto) FaultInjectionObjectStore::run(Op op, std::string_view key, std::string_view action, F&& forward) {
  Fault f{};
  if (!take(op, f)) return forward();
  const std::string name = base().name_of(key);
  switch (f) {
    case Fault::dropped:
      (void)forward();  // it reached the store; the answer is lost
      throw_fault(f, name, action);
    case Fault::hang: {
      std::unique_lock lock(mu_);
      ++hanging_;
      const std::uint64_t epoch = release_epoch_;
      released_.wait(lock, [&] { return release_epoch_ != epoch; });
      --hanging_;
      throw_fault(f, name, action);
    }
    case Fault::lost_race:
      if (op == Op::put) {  // the other writer's object lands first
        static constexpr std::string_view other = "an object another writer put first";
        base().put(key, std::as_bytes(std::span(other)));
      }
      return forward();
    default:
      throw_fault(f, name, action);
  }
}

std::string FaultInjectionObjectStore::put(std::string_view key, std::span<const std::byte> data, const WriteCondition& when) {
  return run(Op::put, key, "PUT", [&] {
    return base().put(key, data, when);
  });
}

std::string FaultInjectionObjectStore::create_multipart(std::string_view key) {
  return run(Op::create_multipart, key, "create multipart upload", [&] { return base().create_multipart(key); });
}

std::string FaultInjectionObjectStore::upload_part(std::string_view key, std::string_view upload_id, int part_number,
                                                   std::span<const std::byte> data) {
  return run(Op::upload_part, key, "PUT part " + std::to_string(part_number),
             [&] { return base().upload_part(key, upload_id, part_number, data); });
}

std::string FaultInjectionObjectStore::complete_multipart(std::string_view key, std::string_view upload_id,
                                                          std::span<const CompletedPart> parts) {
  return run(Op::complete_multipart, key, "complete multipart upload",
             [&] { return base().complete_multipart(key, upload_id, parts); });
}

void FaultInjectionObjectStore::abort_multipart(std::string_view key, std::string_view upload_id) {
  run(Op::abort_multipart, key, "abort multipart upload", [&] {
    base().abort_multipart(key, upload_id);
    return 0;
  });
}

std::vector<MultipartUpload> FaultInjectionObjectStore::list_multipart_uploads(std::string_view prefix, std::size_t max_uploads) {
  return run(Op::list_uploads, prefix, "list multipart uploads", [&] { return base().list_multipart_uploads(prefix, max_uploads); });
}

void FaultInjectionObjectStore::get_range(std::string_view key, std::uint64_t offset, std::span<std::byte> out) {
  run(Op::get_range, key, "GET", [&] {
    base().get_range(key, offset, out);
    return 0;
  });
}

ObjectInfo FaultInjectionObjectStore::head(std::string_view key) {
  return run(Op::head, key, "HEAD", [&] { return base().head(key); });
}

ObjectPage FaultInjectionObjectStore::list(std::string_view prefix, std::string_view token, std::size_t max_keys) {
  return run(Op::list, prefix, "list objects", [&] { return base().list(prefix, token, max_keys); });
}

void FaultInjectionObjectStore::remove(std::string_view key) {
  run(Op::remove, key, "DELETE", [&] {
    base().remove(key);
    return 0;
  });
}

}  // namespace ckpt::testing
