// SPDX-License-Identifier: Apache-2.0
// The mini GPT the MPI programs train: small enough for 8 processes on 2 cores.
#pragma once

#include <cstdint>

#include "ckpt/train/trainer.hpp"

namespace ckpt::test {

inline train::TrainConfig small_mpi_config(std::uint64_t total_steps) {
  train::TrainConfig c;
  c.model = train::GptConfig{.vocab = 32, .seq = 8, .dim = 16, .heads = 2, .layers = 1, .batch = 2};
  c.corpus_tokens = 8192;
  c.total_steps = total_steps;
  return c;
}

}  // namespace ckpt::test
