// SPDX-License-Identifier: Apache-2.0
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

// How the S3 client's errors name the request of `call`.
std::string action_of(const ObjectCall& call) {
  using Op = ObjectCall::Op;
  switch (call.op) {
    case Op::put: return "PUT";
    case Op::create_multipart: return "create multipart upload";
    case Op::upload_part: return "PUT part " + std::to_string(call.part_number);
    case Op::complete_multipart: return "complete multipart upload";
    case Op::abort_multipart: return "abort multipart upload";
    case Op::list_uploads: return "list multipart uploads";
    case Op::get_range: return "GET";
    case Op::head: return "HEAD";
    case Op::list: return "list objects";
    case Op::remove:
    case Op::kCount: break;
  }
  return "DELETE";
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

void FaultInjectionObjectStore::abort_calls() noexcept {
  release_hangs();
  ObjectStoreWrapper::abort_calls();
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

void FaultInjectionObjectStore::around(const ObjectCall& call, const std::function<void()>& forward) {
  Fault f{};
  if (!take(call.op, f)) return forward();
  const std::string name = base().name_of(call.key), action = action_of(call);
  switch (f) {
    case Fault::dropped:
      forward();  // it reached the store; the answer is lost
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
      if (call.op == Op::put) {  // the other writer's object lands first
        static constexpr std::string_view other = "an object another writer put first";
        base().put(call.key, std::as_bytes(std::span(other)));
      }
      return forward();
    default:
      throw_fault(f, name, action);
  }
}

}  // namespace ckpt::testing
