// SPDX-License-Identifier: Apache-2.0
// Private: how far a shard image has been copied into its staging buffer, for a save whose
// writes and hashing start while the caller is still copying (Checkpointer::save_sync: the
// caller waits for the checkpoint anyway, so nothing is gained by copying everything first).
//
// The copying thread publishes a growing prefix [0, n) of the image; the io_context's write
// lanes await the prefix their next piece needs (async_wait), and the hashing thread on the
// work pool blocks for it (wait). A copy that fails wakes both with its error.
//
// The io_context runs on one thread, so an async waiter checks the prefix and starts its
// wait on the timer inside one handler; publish() stores the prefix and then posts the
// timer's cancel to that thread, which therefore runs after any wait started against the old
// prefix, and wakes it. The timer's expiry is set once (never) and not reset, so several
// lanes can wait on it at once without cancelling each other.
#pragma once

#include "ckpt/core/export.hpp"

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "ckpt/core/error.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

class StagedBytes : public std::enable_shared_from_this<StagedBytes> {
 public:
  /// Publishing more often than this many bytes only costs wake-ups.
  static constexpr std::uint64_t kPublishStep = 4u << 20;

  explicit StagedBytes(boost::asio::io_context& ctx) : timer_(ctx, boost::asio::steady_timer::time_point::max()) {}

  /// The copying thread: bytes [0, n) of the image are in the buffer (n only grows). Publishes
  /// when n is at least kPublishStep past the last publication, or `last` (the whole image).
  void publish(std::uint64_t n, bool last = false) {
    if (!last && n < published_ + kPublishStep) return;
    published_ = n;
    {
      std::lock_guard lk(mu_);
      ready_.store(n, std::memory_order_release);
    }
    cv_.notify_all();
    wake_lanes();
  }

  /// The copying thread: the copy failed; every waiter, present and future, throws `e`.
  void fail(const Error& e) {
    {
      std::lock_guard lk(mu_);
      error_ = e;
      failed_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
    wake_lanes();
  }

  /// Blocks until [0, n) is staged; throws the copy's error if it failed first.
  void wait(std::uint64_t n) const {
    if (ready_.load(std::memory_order_acquire) >= n) return;
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return ready_.load(std::memory_order_relaxed) >= n || failed_.load(std::memory_order_relaxed); });
    if (ready_.load(std::memory_order_relaxed) < n) throw *error_;
  }

  /// On the io_context's thread: resumes once [0, n) is staged; throws the copy's error.
  boost::asio::awaitable<void> async_wait(std::uint64_t n) {
    while (ready_.load(std::memory_order_acquire) < n) {
      if (failed_.load(std::memory_order_acquire)) {
        std::lock_guard lk(mu_);
        throw *error_;
      }
      co_await timer_.async_wait(boost::asio::as_tuple(boost::asio::use_awaitable));  // woken by cancel()
    }
  }

 private:
  void wake_lanes() {
    boost::asio::post(timer_.get_executor(), [self = shared_from_this()] { self->timer_.cancel(); });
  }

  boost::asio::steady_timer timer_;  // touched on the io_context's thread only
  std::atomic<std::uint64_t> ready_{0};
  std::atomic<bool> failed_{false};
  std::uint64_t published_ = 0;  // the copying thread's own
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::optional<Error> error_;
};

}  // namespace ckpt::detail
CKPT_API_END
