// SPDX-License-Identifier: Apache-2.0
// Shared by the tests of the ckpt tool: running it as a user would, and a small checkpoint.
#pragma once

#include <filesystem>
#include <string>

#include "../io/io_fixture.hpp"
#include "ckpt/ops/save.hpp"

namespace ckpt::test {

inline const std::string kTool = std::string(CKPT_TEST_BINARY_DIR) + "/bin/ckpt";

struct Run {
  int status;
  std::string out;
};
/// `ckpt ARGS`, stdout and stderr together.
inline Run ckpt_run(const std::string& args) {
  int status = 0;
  std::string out = run_command(kTool + " " + args + " 2>&1", &status);
  return {status, out};
}

/// The io fixture's checkpoint of 2 ranks at step 10 (every dtype), saved in a fresh root.
using Saved = SavedCheckpoint;

}  // namespace ckpt::test
