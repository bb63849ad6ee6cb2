// SPDX-License-Identifier: Apache-2.0
// The MPI backend (target ckpt::mpi, built when CMake finds MPI; see docs/multi-node.md).
//
// A Communicator over an MPI communicator, with the contract of communicator.hpp, and the
// same numbers as the thread backend bit for bit: MPI's own reductions (MPI_Allreduce,
// MPI_Reduce_scatter) fold in an unspecified order, so they are not used. all_reduce and
// reduce_scatter exchange blocks point to point (block q of every rank goes to rank q, q's
// block being shard_range(count, N, q)), rank q folds its block in rank order 0..N-1 with the
// thread backend's kernel (dist/detail/reduce.hpp), and all_reduce then gathers the reduced
// blocks. Every collective starts with a small header exchange (collective, dtype, element
// count, root, reduce op), so a disagreement is Errc::comm_error on every rank with the same
// text as the thread backend. MPI's int counts are never exceeded: messages are cut into
// pieces of at most 1 GiB (env CKPT_MPI_MAX_MESSAGE lowers it, for tests).
//
// Differences from the thread backend, all inherent to processes:
// - abort() marks this process's handle aborted (its later collectives throw Errc::aborted);
//   it cannot wake a peer blocked in MPI. A process that dies makes mpirun end the job.
// - An MPI failure (an MPI function returning an error) is Errc::comm_error carrying
//   MPI_Error_string's text; the communicators use MPI_ERRORS_RETURN.
#pragma once

#include "ckpt/core/export.hpp"

#include <mpi.h>

#include <memory>
#include <string>

#include "ckpt/dist/communicator.hpp"
#include "ckpt/runtime/coordinator.hpp"

CKPT_API_BEGIN
namespace ckpt::dist {

/// Wraps a duplicate of `comm` (MPI_Comm_dup: collective over `comm`), freed with the
/// returned object. MPI must be initialised. Throws Errc::comm_error if MPI fails.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

/// Throws Errc::comm_error naming `what` and MPI's text for `rc` unless rc == MPI_SUCCESS.
void check_mpi(int rc, const char* what);

/// RAII for one process's MPI: MPI_Init_thread with MPI_THREAD_MULTIPLE (the checkpoint
/// coordinator's threads talk MPI while the training thread runs collectives), a
/// world communicator, and MPI_Finalize at destruction. One per process.
class MpiSession {
 public:
  /// Initialises MPI (unless the program already did; then only checks the thread level).
  /// Throws Errc::comm_error if MPI provides less than MPI_THREAD_MULTIPLE, naming both.
  MpiSession(int* argc = nullptr, char*** argv = nullptr);
  /// Frees the world communicator, then MPI_Finalize if this object initialised MPI.
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  /// A Communicator over (a duplicate of) MPI_COMM_WORLD, for the training collectives.
  Communicator& world() noexcept { return *world_; }
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

 private:
  bool initialised_here_ = false;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<Communicator> world_;
};

/// The checkpoint commit across processes: ckpt's commit protocol (ChannelCoordinator,
/// runtime/coordinator.hpp) for the process that hosts rank comm's rank (one rank per
/// process), over its own duplicate of `comm`, used only for checkpoint coordination, so it
/// never interleaves with the training collectives. This supplies the protocol's transport:
/// a channel thread runs its rounds (each step's votes gathered on rank 0, which commits, and
/// the outcome broadcast) over non-blocking MPI collectives, so report() never blocks.
/// start_run() runs the root's crash cleanup on rank 0 only and agrees on one run id
/// (collective over comm, at Checkpointer construction). abandon() answers only this
/// process's ranks.
/// For checkpoints across node-local roots it also moves bytes between processes:
/// exchange(), send_bytes() and receive_bytes() on a second duplicate of `comm`, and
/// file_transport(): a call to another process's file service (that process's posix file
/// system, served by its progress thread), so that rank 0 reaches every node's root. The
/// destructor is collective: it keeps serving file calls until every process has reached it.
/// Requires MPI_THREAD_MULTIPLE (Errc::comm_error otherwise).
std::unique_ptr<CommitCoordinator> make_mpi_coordinator(MPI_Comm comm = MPI_COMM_WORLD);

}  // namespace ckpt::dist
CKPT_API_END
