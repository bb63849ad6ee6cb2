// SPDX-License-Identifier: Apache-2.0
// What one rank of a ckpt-demo run saw, and its wire form: every rank serialises its record
// and the ranks exchange them with Communicator::all_gather_bytes, so the demo assembles the
// whole run the same way whether its ranks are threads or processes.
#pragma once

#include <boost/json/object.hpp>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/train/trainer.hpp"

namespace ckpt::demo {

/// One training step as one rank saw it.
struct StepRow {
  train::StepStats stats;
  double stall_ms = 0;   ///< time save() blocked at this step (0 if no save)
  train::MemoryProfile memory;  ///< this rank's memory after the step
  std::string event;     ///< what else happened at this step (a failed save noticed, a rollback), or empty
  std::uint64_t consecutive_save_failures = 0;  ///< CheckpointerStats::consecutive_failures after the step
};

/// A save that failed (the run trained on).
struct SaveFailure {
  std::uint64_t step = 0;
  std::string code;     ///< errc_name of the error
  std::string message;  ///< what()
};

struct RankRecord {
  int rank = 0;
  std::vector<StepRow> rows;                  ///< every step trained, in order (a rollback replays steps)
  std::vector<std::uint16_t> final_params;    ///< the 16-bit parameters at the end
  train::MemoryProfile memory;
  std::optional<std::uint64_t> snapshot_step; ///< the first checkpoint this run saved (not a failing one)
  std::vector<std::pair<std::string, std::vector<std::byte>>> snapshot;  ///< its tensors, as staged
  boost::json::object snapshot_meta;          ///< its per-rank metadata
  std::vector<SaveFailure> save_errors;       ///< failed saves, in step order
  std::map<std::string, std::vector<std::byte>> restored;  ///< optim.* right after a resharded resume
  std::uint64_t resumed_from = 0, last_step = 0;
  std::size_t num_params = 0;
  std::vector<std::uint64_t> skipped_batches;  ///< steps whose batch a rollback skipped
  std::string resume_tier;                    ///< where a resume found its checkpoint ("" if not resumed)
  double resume_verify_s = 0, resume_load_s = 0;  ///< Trainer::last_resume_timing of a resume
};

/// The byte form exchanged between ranks (same build on every rank; not a file format).
std::vector<std::byte> encode(const RankRecord& r);
/// Inverse of encode; throws ckpt::Error (Errc::comm_error) on a malformed blob.
RankRecord decode(std::span<const std::byte> blob);

}  // namespace ckpt::demo
