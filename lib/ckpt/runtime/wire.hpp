// SPDX-License-Identifier: Apache-2.0
// Private: the one place the commit coordination's typed messages become text, for
// coordinators whose ranks live in other processes (runtime/coordinator.hpp's protocol over
// a transport; dist/mpi's shard-size exchange). A report travels as a one-shard manifest
// (decoded by decode_manifest, with every check the loader makes) plus its rank and error; a
// vote as its step and its ranks' reports; the start of a run as "+" and the run id, or "-"
// and process 0's error (error_to_json); an outcome as its directory, commit time and error; a process's shard
// sizes (the exchange before redundancy across processes) as "+rank:size" per rank it hosts,
// or "-" and why it has none. Text that does not decode is Errc::comm_error naming what was
// wrong (a report's manifest part: the manifest's own error).
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/runtime/coordinator.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

std::string encode_rank_report(std::uint64_t step, const RankReport& report);
RankReport decode_rank_report(std::string_view text);
std::string encode_outcome(const CommitOutcome& outcome);
CommitOutcome decode_outcome(std::string_view text);

/// A process's message in a step's vote: the step and its ranks' encoded reports.
std::string encode_vote(std::uint64_t step, std::span<const std::string> reports);
struct Vote {
  std::uint64_t step = 0;
  std::vector<std::string> reports;  ///< encode_rank_report's texts
};
Vote decode_vote(std::string_view text);

/// Process 0's word at the start of a run: the run id, or the error its preparation threw.
std::string encode_run_start(const std::string& run_id);
std::string encode_run_start_failure(const Error& error);
/// The run id; throws the error process 0 sent (or Errc::comm_error for text that is neither).
std::string decode_run_start(std::string_view text);

/// One process's message in the shard-size exchange: the sizes of the shards of the ranks it
/// hosts, (rank, size) pairs; or why it has none.
std::string encode_shard_sizes(std::span<const std::pair<int, std::uint64_t>> sizes);
std::string encode_sizes_failure(std::string_view why);

/// Every process's message of the exchange of `step` together.
struct ShardSizes {
  std::vector<std::uint64_t> sizes;   ///< per rank, 0..world_size-1 (empty if `failed`)
  std::optional<std::string> failed;  ///< the first failure a process sent
};
/// Throws Errc::comm_error naming the step for a message that is neither a failure nor
/// "+rank:size" entries (decimal, rank 0..world_size-1, size a 64-bit count, nothing else), a
/// rank sent twice, or (without a failure) a rank nobody sent.
ShardSizes decode_shard_sizes(std::span<const std::string> messages, int world_size, std::uint64_t step);

}  // namespace ckpt::detail
CKPT_API_END
