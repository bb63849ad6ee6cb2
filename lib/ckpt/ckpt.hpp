// ckpt: an asynchronous, sharded checkpointing runtime. This header is the public API a
// checkpointing user needs, in one include:
//
//   #include <ckpt/ckpt.hpp>      // CMake: target_link_libraries(app PRIVATE ckpt::ckpt)
//
//   core     ckpt::Error and ckpt::Errc (every failure), dtypes and tensor views, the log sink
//   format   the manifest and the safetensors shard header (encode, decode, validate)
//   io       the FileSystem interface and posix_file_system(), names on disk, the verified
//            loader (open_latest, CheckpointReader), the synchronous save and its commit,
//            the root's writer lock, the one shard writer and the ranged shard reader,
//            resharding and consolidation, the copy between two tiers
//   runtime  the asynchronous Checkpointer (save, SaveHandle, cadence), the commit
//            coordinator interface, background replication to a durable tier
//
// Each header states, call by call, what blocks, what throws and what is thread-safe. Opt-in
// headers, not included here: <ckpt/runtime/async_wait.hpp> (a SaveHandle as an Asio
// completion-token operation; link ckpt::asio) and, when ckpt is built with MPI,
// <ckpt/dist/mpi/mpi_comm.hpp> (link ckpt::mpi). Nothing here includes Asio or liburing, and
// a consumer compiles with no definition of ckpt's.
#pragma once

#include "ckpt/version.hpp"

#include "ckpt/core/dtype.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/format/file_names.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/format/shard_check.hpp"
#include "ckpt/format/sharding.hpp"
#include "ckpt/io/commit.hpp"
#include "ckpt/io/erasure.hpp"
#include "ckpt/io/file_system.hpp"
#include "ckpt/io/layout.hpp"
#include "ckpt/io/load_into.hpp"
#include "ckpt/io/mapped.hpp"
#include "ckpt/io/node_commit.hpp"
#include "ckpt/io/object_commit.hpp"
#include "ckpt/io/object_lease.hpp"
#include "ckpt/io/object_store.hpp"
#include "ckpt/io/object_transfer.hpp"
#include "ckpt/io/range_reader.hpp"
#include "ckpt/io/reader.hpp"
#include "ckpt/io/redundancy_io.hpp"
#include "ckpt/io/remote_file_system.hpp"
#include "ckpt/io/reshard.hpp"
#include "ckpt/io/root_lock.hpp"
#include "ckpt/io/run_identity.hpp"
#include "ckpt/io/s3.hpp"
#include "ckpt/io/save.hpp"
#include "ckpt/io/shard_writer.hpp"
#include "ckpt/io/slice_load.hpp"
#include "ckpt/io/tiers.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/runtime/coordinator.hpp"
#include "ckpt/runtime/preemption.hpp"
#include "ckpt/runtime/tiering.hpp"
