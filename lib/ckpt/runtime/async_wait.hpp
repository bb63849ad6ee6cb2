// SPDX-License-Identifier: Apache-2.0
// Opt-in: a SaveHandle as a Boost.Asio asynchronous operation, for code that runs on Asio.
//
//   #include <ckpt/runtime/async_wait.hpp>        // and link the CMake target ckpt::asio
//   SaveResult r = co_await ckpt::async_wait(handle, asio::use_awaitable);   // in a coroutine
//   std::future<SaveResult> f = ckpt::async_wait(handle, asio::use_future);
//   ckpt::async_wait(handle, [](std::exception_ptr e, ckpt::SaveResult r) { ... });
//
// Completion signature void(std::exception_ptr, SaveResult): a failed save completes with its
// ckpt::Error (a coroutine gets it thrown, a future rethrows it from get()). The handler runs
// through its associated executor (asio::dispatch, so a handler without one, such as a plain
// callback, runs on the ckpt thread that completed the save and must not block); until then
// the wait counts as outstanding work on that executor, so io_context::run() does not return
// while a save it awaits is still in flight. Thread-safe, like SaveHandle::on_ready, on which
// it is built: everything Asio here is compiled in the caller's translation unit.
//
// Why this header is opt-in and wants ckpt::asio: Asio code running on a thread shares that
// thread's small-block cache, whatever library compiled it, and the unit in which the cache
// records block sizes is 8 bytes when BOOST_ASIO_HAS_IO_URING is defined and 4 when it is not.
// The handler wrapped here is dispatched from a ckpt thread whose cache the library's own Asio
// code (built with io_uring) fills; so this code must be compiled with that same definition.
// ckpt::asio carries it (and liburing, which Asio's io_uring support then links); without it
// this header refuses to compile rather than corrupt memory at run time.
#pragma once

#include "ckpt/core/export.hpp"

#if !defined(BOOST_ASIO_HAS_IO_URING)
#error "ckpt/runtime/async_wait.hpp needs the Asio configuration ckpt is built with: link the CMake target ckpt::asio (or define BOOST_ASIO_HAS_IO_URING and link liburing)"
#endif

#include <boost/asio/append.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <exception>
#include <memory>
#include <utility>

#include "ckpt/runtime/checkpointer.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// Waits for `handle` as an Asio operation (see the top of this file). Errc::invalid_argument
/// for an empty handle, delivered through the handler like any save error.
template <typename CompletionToken>
auto async_wait(const SaveHandle& handle, CompletionToken&& token) {
  return boost::asio::async_initiate<CompletionToken, void(std::exception_ptr, SaveResult)>(
      [](auto handler, const SaveHandle& h) {
        using Handler = decltype(handler);
        using Executor = boost::asio::associated_executor_t<Handler>;
        struct Pending {
          boost::asio::executor_work_guard<Executor> work;
          Handler handler;
        };
        // SaveHandle::ReadyCallback is a std::function, which needs a copyable target; Asio
        // handlers are move-only, so the callback holds the handler through a shared_ptr.
        const Executor ex = boost::asio::get_associated_executor(handler);
        auto pending = std::make_shared<Pending>(Pending{boost::asio::executor_work_guard<Executor>(ex), std::move(handler)});
        h.on_ready([pending](std::exception_ptr e, SaveResult r) {
          const auto work = std::move(pending->work);  // released once the handler is dispatched
          boost::asio::dispatch(boost::asio::append(std::move(pending->handler), std::move(e), std::move(r)));
        });
      },
      token, handle);
}

}  // namespace ckpt
CKPT_API_END
