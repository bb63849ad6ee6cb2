// SPDX-License-Identifier: Apache-2.0
// Saves that give a Checkpointer's metrics known values: shared by the render and endpoint tests.
#pragma once

#include <cstdint>

#include "../runtime/runtime_fixture.hpp"

namespace ckpt::test {

/// Steps 1..`steps` saved by `world` rank threads (`n` floats each), waited for.
inline void save_steps(Checkpointer& ckpt, int world, std::uint64_t steps, std::size_t n) {
  for (std::uint64_t step = 1; step <= steps; ++step)
    run_ranks(world, [&](int rank) {
      RankState state(rank, n);
      state.set(rank, step);
      const auto views = state.views();
      ckpt.save_sync(rank, step, views, info_for(rank, world, n, step));
    });
  ckpt.wait_all();
}

}  // namespace ckpt::test
