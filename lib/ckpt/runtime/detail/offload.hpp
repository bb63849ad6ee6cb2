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
#include <vector>
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

/// Runs every one of `v` concurrently (as both() does, pairwise) and awaits them all; then
/// rethrows the first failure, if any, else returns the results in order.
template <typename T>
boost::asio::awaitable<std::vector<T>> all(std::vector<boost::asio::awaitable<T>> v) {
  std::vector<T> out;
  if (v.size() == 1) out.push_back(co_await std::move(v.front()));
  if (v.size() <= 1) co_return out;
  const std::size_t half = v.size() / 2;
  std::vector<boost::asio::awaitable<T>> rest;
  for (std::size_t i = half; i < v.size(); ++i) rest.push_back(std::move(v[i]));
  v.erase(v.begin() + static_cast<std::ptrdiff_t>(half), v.end());
  auto [a, b] = co_await both(all(std::move(v)), all(std::move(rest)));
  for (auto& x : a) out.push_back(std::move(x));
  for (auto& x : b) out.push_back(std::move(x));
  co_return out;
}

}  // namespace ckpt::detail
CKPT_API_END
