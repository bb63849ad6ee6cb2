// SPDX-License-Identifier: Apache-2.0
// The in-process backend: ranks are threads of one process and a collective is a rendezvous on
// shared state. Each rank publishes pointers to its buffers, waits for the others, then reads
// its peers' buffers directly to compute its own output, so no rank ever holds a copy of
// everyone's data (all_reduce keeps one block of count / N elements per rank as scratch,
// reused from call to call).
//
// Every collective runs in phases separated by group-wide barriers:
//   publish -> barrier -> read peers -> [barrier -> read peers] -> barrier -> return
// The last barrier is what lets the caller free its buffers on return: no peer can still be
// reading them. An abort does not break that promise: a rank woken by an abort in the middle of
// a collective waits until every peer has stopped touching its buffers (peers between barriers
// only compute, so that wait is short) before it throws.
#pragma once

#include "ckpt/core/export.hpp"

#include <functional>
#include <memory>
#include <vector>

#include "ckpt/dist/communicator.hpp"

CKPT_API_BEGIN
namespace ckpt::dist {

/// Creates a group of `world_size` communicators sharing one in-process rendezvous; element r
/// is rank r. Hand each to its own thread. The group's shared state lives as long as any of its
/// communicators. Throws Errc::invalid_argument unless 1 <= world_size <= 1024.
///
/// Besides the contract of Communicator, this backend throws Errc::invalid_argument when two
/// threads use the same rank's communicator at once (the second one to enter), rather than
/// letting them interleave into a deadlock.
///
/// split() creates the sub-group's shared state in-process (its color's lowest rank creates
/// it); the sub-group's communicators are of this backend too and may be split again. An
/// abort of a group reaches every group split from it (transitively).
std::vector<std::unique_ptr<Communicator>> make_thread_group(int world_size);

/// Runs fn(comm) on `world_size` new threads, one per rank of a fresh thread group, and joins
/// them all before returning. If a rank throws, the group is aborted (so peers blocked in a
/// collective throw Errc::aborted instead of hanging); if a rank returns while peers still
/// call collectives, those collectives throw Errc::comm_error naming the departed rank (in
/// the group and in every group split from it that the departed rank belongs to; sub-groups
/// without it carry on).
/// After joining, rethrows the error of the lowest rank that failed for a reason of its own
/// (anything but Errc::aborted), else the lowest rank's Errc::aborted. Blocks until every rank
/// thread has finished. Throws Errc::invalid_argument for a world size outside 1..1024.
void run_ranks(int world_size, std::function<void(Communicator&)> fn);

}  // namespace ckpt::dist
CKPT_API_END
