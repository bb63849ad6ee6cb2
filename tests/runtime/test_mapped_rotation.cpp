// SPDX-License-Identifier: Apache-2.0
// A checkpoint the Checkpointer committed, read through mapped shards by several threads while
// later saves rotate it away: the views stay valid and verified (also run under
// ThreadSanitizer, with the runtime tests).
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "ckpt/store/store.hpp"
#include "ckpt/read/mapped.hpp"
#include "ckpt/read/reader.hpp"
#include "runtime/runtime_fixture.hpp"

using namespace ckpt;

TEST_CASE("mapped views taken by several threads stay valid and verified while rotation removes their checkpoint") {
  constexpr std::size_t kN = 50000;  // 200 KB of master weights per rank: several 64 KiB chunks
  test::TempDir dir;
  const int world = 2;
  std::vector<test::RankState> states{test::RankState(0, kN), test::RankState(1, kN)};
  Checkpointer ckpt({.root = dir.path().string(), .world_size = world, .keep_last = 1, .chunk_size = 64 << 10});
  auto save = [&](std::uint64_t step) {
    test::run_ranks(world, [&](int r) {
      states[static_cast<std::size_t>(r)].set(r, step);
      ckpt.save(r, step, states[static_cast<std::size_t>(r)].views(), test::info_for(r, world, kN, step)).wait();
    });
    ckpt.wait_all();
  };
  save(1);
  const test::RankState expected = states[1];  // what step 1 saved for rank 1
  std::optional<MappedShard> shard;
  {
    const auto reader = open_latest(posix_file_system(), dir.path().string()).reader;
    shard.emplace(reader, 1, Verify::fast);
  }
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, views{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i)
    readers.emplace_back([&] {
      do {
        const TensorView v = shard->tensor("master");
        if (v.data.size() != kN * 4 || std::memcmp(v.data.data(), expected.master.data(), v.data.size()) != 0) ++bad;
        ++views;
      } while (!stop.load());
    });
  save(2);  // keep_last 1: step 1 is removed while the threads read it
  save(3);
  stop = true;
  for (auto& t : readers) t.join();
  CHECK(test::step_dirs(dir.path()) == std::vector<std::string>{"step-0000000003"});
  CHECK(bad == 0);
  CHECK(views >= 4);
  const TensorRecord* t = shard->find("master");
  REQUIRE(t);
  const std::uint64_t cs = 64 << 10;
  CHECK(shard->stats().chunks_checked == (t->end - 1) / cs - t->begin / cs + 1);  // each chunk of the tensor, once
  CHECK(std::memcmp(shard->tensor("master").data.data(), expected.master.data(), kN * 4) == 0);
}
