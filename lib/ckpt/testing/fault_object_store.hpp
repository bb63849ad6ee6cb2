// SPDX-License-Identifier: Apache-2.0
// An ObjectStore wrapper that injects the failures a real object store shows (the
// counterpart of fault_injection.hpp for the durable tier): 503 SlowDown storms, 500s,
// timeouts, connections dropped after the request reached the server (the answer is lost,
// the effect is not), conditional writes that lose a race to another writer (a real 412 from
// the store underneath), and calls that never complete until released (a part stuck in
// flight). The injected errors have the shape of the S3 client's (object_store.hpp), naming
// the object as the wrapped store does (name_of), so is_transient() and RetryingObjectStore
// treat them as they would the real ones.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "ckpt/objstore/object_store.hpp"

namespace ckpt::testing {

class FaultInjectionObjectStore final : public ObjectStoreWrapper {
 public:
  using Op = ObjectCall::Op;
  enum class Fault {
    slow_down,      ///< HTTP 503 SlowDown; the call does not reach the store
    server_error,   ///< HTTP 500 InternalError; the call does not reach the store
    timeout,        ///< no response (ETIMEDOUT); the call does not reach the store
    dropped,        ///< the call reaches the store, then the connection drops: no response (ECONNRESET)
    lost_race,      ///< a put: another writer's object lands under the key first (a different body), so a
                    ///< conditional put meets the store's real 412; other ops: forwarded unchanged
    hang,           ///< the call blocks until release_hangs() (or abort_calls(), or destruction), then fails: no
                    ///< response (ETIMEDOUT)
  };

  /// Wraps `base`, which must outlive this object. Thread-safe.
  explicit FaultInjectionObjectStore(ObjectStore& base) : ObjectStoreWrapper(base) {}
  /// Releases hanging calls first.
  ~FaultInjectionObjectStore() override;

  /// After the next `after` calls of `op` (counted from now) pass, the `count` calls that
  /// follow fail with `fault`; a later inject() for the same op replaces this one.
  void inject(Op op, Fault fault, std::uint64_t count = 1, std::uint64_t after = 0);
  /// No more faults (calls already hanging stay so until release_hangs()).
  void clear();
  /// Lets every hanging call fail now, and later ones pass through (until inject() again).
  void release_hangs();
  /// release_hangs(), then the wrapped store's abort_calls(): a caller giving up on a hung
  /// store ends the injected hangs as it would the real ones.
  void abort_calls() noexcept override;
  /// Calls of `op` so far, faulty or not.
  std::uint64_t calls(Op op) const;
  /// Faults injected so far.
  std::uint64_t injected() const;
  /// Calls hanging now.
  std::uint64_t hanging() const;

 protected:
  void around(const ObjectCall& call, const std::function<void()>& forward) override;

 private:
  struct Plan {
    Fault fault = Fault::slow_down;
    std::uint64_t skip = 0;
    std::uint64_t remaining = 0;
  };
  // Counts the call; returns the fault to inject into it, if any.
  bool take(Op op, Fault& fault);

  mutable std::mutex mu_;
  std::condition_variable released_;
  std::array<Plan, static_cast<std::size_t>(Op::kCount)> plans_{};
  std::array<std::uint64_t, static_cast<std::size_t>(Op::kCount)> calls_{};
  std::uint64_t injected_ = 0, hanging_ = 0, release_epoch_ = 0;
};

}  // namespace ckpt::testing
