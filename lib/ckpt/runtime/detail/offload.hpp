// SPDX-License-Identifier: Apache-2.0
// Private: runs blocking work on a thread pool from a coroutine, which resumes on its own
// executor once the work is done: `auto r = co_await offload(pool, [&] { return fsync(); });`.
// The work's exception is rethrown in the coroutine.
#pragma once

#include "ckpt/core/export.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/deferred.hpp>
#include <boost/asio/experimental/parallel_group.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <exception>
#include <tuple>
#include <type_traits>
#include <utility>

CKPT_API_BEGIN
namespace ckpt::detail {

template <typename Executor, typename F>
boost::asio::awaitable<std::invoke_result_t<F&>> offload(Executor ex, F f) {
  using R = std::invoke_result_t<F&>;
  co_return co_await boost::asio::co_spawn(
      ex, [f = std::move(f)]() mutable -> boost::asio::awaitable<R> { co_return f(); }, boost::asio::use_awaitable);
}

/// Runs `a` and `b` concurrently and awaits both; then rethrows the first one's exception, if
/// any, else returns both results. Unlike the awaitable operator &&, a failure of one does not
/// cancel the other: the pipeline's two halves (the writes and the hashing of the same staged
/// bytes) must both be finished before the bytes may be touched again, and hashing cannot be
/// cancelled anyway.
template <typename A, typename B>
boost::asio::awaitable<std::tuple<A, B>> both(boost::asio::awaitable<A> a, boost::asio::awaitable<B> b) {
  namespace asio = boost::asio;
  auto ex = co_await asio::this_coro::executor;
  auto [order, ea, ra, eb, rb] =
      co_await asio::experimental::make_parallel_group(asio::co_spawn(ex, std::move(a), asio::deferred),
                                                       asio::co_spawn(ex, std::move(b), asio::deferred))
          .async_wait(asio::experimental::wait_for_all(), asio::use_awaitable);
  (void)order;
  if (ea) std::rethrow_exception(ea);
  if (eb) std::rethrow_exception(eb);
  co_return std::tuple<A, B>{std::move(ra), std::move(rb)};
}

}  // namespace ckpt::detail
CKPT_API_END
