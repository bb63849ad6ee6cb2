// SPDX-License-Identifier: Apache-2.0
// A coroutine on the consumer's own io_context saves and co_awaits the commit.
//   async_consumer DIR
#include <ckpt/ckpt.hpp>
#include <ckpt/runtime/async_wait.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>
#include <span>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  boost::asio::io_context io;  // outlives the checkpointer's threads
  ckpt::Checkpointer checkpointer({.root = argv[1], .world_size = 1});
  std::vector<float> w(100, 2.5f);
  std::uint64_t committed = 0;
  boost::asio::co_spawn(
      io,
      [&]() -> boost::asio::awaitable<void> {
        for (std::uint64_t step = 1; step <= 3; ++step) {  // save() runs on this io_context's thread
          ckpt::SaveInfo info;
          info.param_shard_numel = info.param_numel = w.size();
          std::vector<ckpt::TensorView> state{{"w", ckpt::DType::F32, {w.size()}, std::as_bytes(std::span(w))}};
          const ckpt::SaveResult r = co_await ckpt::async_wait(checkpointer.save(0, step, state, info), boost::asio::use_awaitable);
          committed = r.step;
        }
      },
      boost::asio::detached);
  io.run();
  std::printf("async consumer: committed step %llu\n", static_cast<unsigned long long>(committed));
  return committed == 3 ? 0 : 1;
}
