// Private: the one place the commit coordination's typed messages become text, for
// coordinators whose ranks live in other processes (dist/mpi). A report travels as a
// one-shard manifest (decoded by decode_manifest, with every check the loader makes) plus
// its rank and error; an outcome as its directory, commit time and error. Text that does not
// decode is Errc::comm_error naming what was wrong.
#pragma once

#include <string>
#include <string_view>

#include "ckpt/runtime/coordinator.hpp"

namespace ckpt::detail {

std::string encode_rank_report(std::uint64_t step, const RankReport& report);
RankReport decode_rank_report(std::string_view text);
std::string encode_outcome(const CommitOutcome& outcome);
CommitOutcome decode_outcome(std::string_view text);

}  // namespace ckpt::detail
