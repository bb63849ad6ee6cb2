// SPDX-License-Identifier: Apache-2.0
// The memory profile is measured from the buffers that hold the bytes, so a check of it can
// fail: an optimizer that keeps more than its state shows more than 12 P / N.
#include <doctest/doctest.h>

#include "ckpt/dist/thread_comm.hpp"
#include "ckpt/train/trainer.hpp"
#include "ckpt/train/zero.hpp"

using namespace ckpt;
using namespace ckpt::train;

namespace {
TrainConfig tiny() {
  TrainConfig c;
  c.model = GptConfig{.vocab = 32, .seq = 8, .dim = 16, .heads = 2, .layers = 1, .batch = 2};
  c.corpus_tokens = 8192;
  c.total_steps = 10;
  return c;
}
}  // namespace

TEST_CASE("every category of the memory profile is measured, the fp32 working copies included, before and after steps") {
  const auto cfg = tiny();
  const std::uint64_t p = num_params(cfg.model);
  for (int world : {1, 3}) {
    CAPTURE(world);
    dist::run_ranks(world, [&](dist::Communicator& comm) {
      Trainer t(cfg, comm);
      const std::uint64_t padded = (p + world - 1) / world * world;
      for (int steps = 0; steps < 2; ++steps) {
        const auto m = t.memory();
        CHECK(m.params == 2 * padded);
        CHECK(m.grads == 2 * padded);
        CHECK(m.params32 == 4 * p);  // forward and backward run on fp32 copies: 8P bytes per rank
        CHECK(m.grads32 == 4 * p);
        CHECK(m.optimizer == 12 * padded / static_cast<std::uint64_t>(world));
        CHECK(m.expected_optimizer == m.optimizer);
        CHECK(m.activations > 0);
        CHECK(m.total() == m.params + m.grads + m.params32 + m.grads32 + m.optimizer + m.activations);
        t.step();
      }
    });
  }
}

TEST_CASE("an optimizer that holds an extra buffer measures more than 12 P / N, so the check against it fails") {
  const auto cfg = tiny();
  dist::run_ranks(2, [&](dist::Communicator& comm) {
    Trainer t(cfg, comm);
    const auto lean = t.memory();
    REQUIRE(lean.optimizer == lean.expected_optimizer);
    t.optimizer().hold_extra_for_testing(4096);
    const auto fat = t.memory();
    CHECK(fat.optimizer == lean.optimizer + 4096);
    CHECK(fat.optimizer != fat.expected_optimizer);
    CHECK(fat.expected_optimizer == lean.expected_optimizer);  // the promise does not move with the measurement
    t.step();  // training is unaffected
    CHECK(t.memory().optimizer == lean.optimizer + 4096);
  });
}
