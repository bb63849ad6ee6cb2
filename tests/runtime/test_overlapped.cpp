// SPDX-License-Identifier: Apache-2.0
// Staging::overlapped (what save_sync uses): the shard is handed over before the copy into
// staging, and its writes, its hashing and the node set's redundancy follow the copy through
// detail::StagedBytes. The watermark itself, then whole checkpoints: byte for byte what a
// copy-before-hand-off save writes, on one root and across node roots with parity.
#include <doctest/doctest.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/runtime/detail/staged_bytes.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "runtime/runtime_fixture.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
namespace asio = boost::asio;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t kStep = detail::StagedBytes::kPublishStep;

// Runs `ctx` until a lane awaiting `n` staged bytes has resumed; returns whether it resumed
// and what it threw.
struct Lane {
  std::atomic<bool> resumed{false};
  std::optional<Error> error;
  void start(asio::io_context& ctx, detail::StagedBytes& staged, std::uint64_t n) {
    asio::co_spawn(
        ctx,
        [this, &staged, n]() -> asio::awaitable<void> {
          try {
            co_await staged.async_wait(n);
          } catch (const Error& e) {
            error = e;
          }
          resumed = true;
        },
        asio::detached);
  }
};

struct Big {
  std::vector<std::uint8_t> a, b, c;
  std::vector<TensorView> views;
  Big(int rank, std::uint64_t seed) {
    // One tensor of several publication steps (and not a multiple of one), one odd-sized, one
    // empty: the copy publishes mid-tensor, between tensors and at the padding.
    a = test::random_bytes(2 * kStep + 12345 * 4, seed * 10 + static_cast<std::uint64_t>(rank));
    b = test::random_bytes(4099, seed * 10 + static_cast<std::uint64_t>(rank) + 5);
    views = {{"a", DType::F32, {a.size() / 4}, std::as_bytes(std::span(a))},
             {"b", DType::U8, {b.size()}, std::as_bytes(std::span(b))},
             {"c", DType::F32, {0}, {}}};
  }
};

// Saves the same tensors (world ranks, step 1) under `root`, overlapped or not; returns the
// manifest of what was committed, after a full verification.
Manifest save_world(const std::string& root, int world, bool overlapped, std::optional<NodeOptions> nodes) {
  CheckpointerOptions o{.root = root, .world_size = world};
  o.nodes = nodes;
  Checkpointer c(o);
  std::vector<Big> state;
  for (int r = 0; r < world; ++r) state.emplace_back(r, 3);
  std::vector<std::thread> threads;
  std::vector<SaveResult> results(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      const auto& v = state[static_cast<std::size_t>(r)].views;
      results[static_cast<std::size_t>(r)] = overlapped ? c.save_sync(r, 1, v, {}) : c.save(r, 1, v, {}, Staging::copy).wait();
    });
  for (auto& t : threads) t.join();
  for (const auto& res : results) CHECK_FALSE(res.deferred);
  auto opened = open_latest(posix_file_system(), root, {.expected_world_size = world});
  opened.reader.verify(Verify::full);
  for (int r = 0; r < world; ++r)
    for (const auto& name : {"a", "b"}) {
      const auto bytes = opened.reader.read_tensor(name, r, Verify::full);
      const auto& want = std::string(name) == "a" ? state[static_cast<std::size_t>(r)].a : state[static_cast<std::size_t>(r)].b;
      CHECK(std::equal(bytes.begin(), bytes.end(), reinterpret_cast<const std::byte*>(want.data()), reinterpret_cast<const std::byte*>(want.data() + want.size())));
    }
  return opened.reader.manifest();
}

}  // namespace

TEST_CASE("StagedBytes: a lane resumes once the prefix it needs is published, a blocking waiter too, and a failed copy wakes both with its error") {
  asio::io_context ctx;
  auto staged = std::make_shared<detail::StagedBytes>(ctx);
  Lane lane;
  lane.start(ctx, *staged, 2 * kStep);
  ctx.poll();
  CHECK_FALSE(lane.resumed);
  staged->publish(kStep - 1);  // under one step past the last publication: not yet published
  staged->publish(kStep);      // published, but short of what the lane needs
  ctx.poll();
  CHECK_FALSE(lane.resumed);
  std::atomic<bool> blocked_done{false};
  std::thread waiter([&] {
    staged->wait(2 * kStep);
    blocked_done = true;
  });
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(blocked_done);
  staged->publish(2 * kStep + 1);
  waiter.join();
  CHECK(blocked_done);
  ctx.run_for(2s);
  ctx.restart();
  CHECK(lane.resumed);
  CHECK_FALSE(lane.error);
  staged->wait(2 * kStep + 1);  // already there: returns at once

  // The last publication goes out whatever its distance from the previous one.
  auto last = std::make_shared<detail::StagedBytes>(ctx);
  Lane tail;
  tail.start(ctx, *last, 100);
  last->publish(100, /*last=*/true);
  ctx.run_for(2s);
  ctx.restart();
  CHECK(tail.resumed);

  auto failing = std::make_shared<detail::StagedBytes>(ctx);
  Lane hurt;
  hurt.start(ctx, *failing, kStep);
  ctx.poll();
  std::optional<Error> blocking_error;
  std::thread blocked([&] {
    try {
      failing->wait(kStep);
    } catch (const Error& e) {
      blocking_error = e;
    }
  });
  failing->fail(Error(Errc::io_error, "rank-0", "copy into staging failed"));
  blocked.join();
  ctx.run_for(2s);
  REQUIRE(hurt.resumed);
  REQUIRE(hurt.error);
  CHECK(hurt.error->code() == Errc::io_error);
  CHECK(std::string(hurt.error->what()).find("copy into staging failed") != std::string::npos);
  REQUIRE(blocking_error);
  CHECK(blocking_error->code() == Errc::io_error);
}

TEST_CASE("save_sync (overlapped) writes byte for byte the shards a copy-first save writes, on one root") {
  test::TempDir dir;
  const Manifest copied = save_world((dir / "copy").string(), 3, false, std::nullopt);
  const Manifest overlapped = save_world((dir / "overlapped").string(), 3, true, std::nullopt);
  REQUIRE(copied.shards.size() == overlapped.shards.size());
  for (std::size_t i = 0; i < copied.shards.size(); ++i) {
    CHECK(copied.shards[i].sha256 == overlapped.shards[i].sha256);
    CHECK(copied.shards[i].chunk_xxh3 == overlapped.shards[i].chunk_xxh3);
  }
}

TEST_CASE("save_sync (overlapped) across node roots: the parity blocks, computed while the copies go on, are those of a copy-first save") {
  test::TempDir dir;
  const NodeOptions nodes{.ranks_per_node = 1, .redundancy = *parse_redundancy("rs:2+1")};
  const Manifest copied = save_world((dir / "copy").string(), 3, false, nodes);
  const Manifest overlapped = save_world((dir / "overlapped").string(), 3, true, nodes);
  REQUIRE(copied.redundancy.size() == overlapped.redundancy.size());
  REQUIRE_FALSE(copied.redundancy.empty());
  for (std::size_t i = 0; i < copied.redundancy.size(); ++i) CHECK(copied.redundancy[i].sha256 == overlapped.redundancy[i].sha256);
  for (std::size_t i = 0; i < copied.shards.size(); ++i) CHECK(copied.shards[i].sha256 == overlapped.shards[i].sha256);
}

TEST_CASE("staging_bytes_for sizes the pool for any step and rank: made at construction, no save grows it") {
  test::TempDir dir;
  const int world = 3;
  std::vector<Big> state;
  for (int r = 0; r < world; ++r) state.emplace_back(r, 4);
  std::vector<TensorSpec> specs;
  for (const auto& v : state[0].views) specs.push_back({v.name, v.dtype, v.shape});
  const std::uint64_t need = staging_bytes_for(specs, world);
  CHECK(need % 4096 == 0);
  CHECK(need >= state[0].a.size() + state[0].b.size() + 4096);
  Checkpointer c({.root = (dir / "r").string(), .world_size = world, .staging_bytes_per_rank = need});
  CHECK(c.stats().staging_allocations == static_cast<std::uint64_t>(world));
  CHECK(c.stats().staging_bytes == need * world);
  const std::uint64_t last_step = 9'999'999'999;  // the longest step a checkpoint directory holds
  test::run_ranks(world, [&](int r) { c.save_sync(r, last_step, state[static_cast<std::size_t>(r)].views, {}); });
  CHECK(c.stats().staging_allocations == static_cast<std::uint64_t>(world));
  CHECK(c.stats().commits == 1);
  const Error e = test::expect_error([&] { (void)staging_bytes_for(specs, 0); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.expected() == "at least 1");
}

TEST_CASE("a shard larger than the flush-behind piece is synced behind its writes, and a failed sync there fails the save with latest kept") {
  test::TempDir dir;
  const std::string root = (dir / "r").string();
  testing::FaultInjectionFileSystem faulty(posix_file_system());
  // One rank, 2 x 64 MiB + a bit: the image is written in two pieces (the last takes the
  // remainder), the first synced while the second is written, then the shard's last fsync.
  const auto big = test::random_bytes((std::size_t{2} << 26) + 12345 * 4, 9);
  const std::vector<TensorView> views{{"w", DType::F32, {big.size() / 4}, std::as_bytes(std::span(big))}};
  {
    Checkpointer c({.root = root, .world_size = 1, .fs = &faulty});
    const std::uint64_t before = faulty.count(testing::FaultInjectionFileSystem::Op::sync);
    c.save_sync(0, 1, views, {});
    const std::uint64_t syncs = faulty.count(testing::FaultInjectionFileSystem::Op::sync) - before;
    CHECK(syncs == 4);  // 1 behind the writes, the shard's last, the manifest's, latest's
    // The first sync of the next save fails: the one behind its writes.
    faulty.fail_nth(testing::FaultInjectionFileSystem::Op::sync, 0, EIO);
    const Error e = test::expect_error([&] { c.save_sync(0, 2, views, {}); });
    CHECK(e.code() == Errc::io_error);
    CHECK(std::string(e.what()).find("rank-00000-of-00001.safetensors") != std::string::npos);
  }
  auto opened = open_latest(posix_file_system(), root);
  CHECK(opened.name == checkpoint_dir_name(1));
  opened.reader.verify(Verify::full);
  const auto bytes = opened.reader.read_tensor("w", 0, Verify::full);
  CHECK(std::equal(bytes.begin(), bytes.end(), reinterpret_cast<const std::byte*>(big.data()), reinterpret_cast<const std::byte*>(big.data() + big.size())));
}
