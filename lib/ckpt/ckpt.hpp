// SPDX-License-Identifier: Apache-2.0
// ckpt: an asynchronous, sharded checkpointing runtime. This header is the public API a
// checkpointing user needs, in one include:
//
//   #include <ckpt/ckpt.hpp>      // CMake: target_link_libraries(app PRIVATE ckpt::ckpt)
//
//   core     ckpt::Error and ckpt::Errc (every failure), dtypes and tensor views, the log sink
//   format   the manifest and the safetensors shard header (encode, decode, validate), and
//            JsonObject, the free-form metadata a checkpoint carries
//   fs       the FileSystem interface and posix_file_system(), names on disk
//   objstore the ObjectStore interface and its S3 client
//   shard    the one shard writer
//   read     the verified loader (open_latest, CheckpointReader), the ranged shard reader,
//            loads into owned memory, mapped shards, slice loads
//   store    where checkpoints live (CheckpointStore, open_store), each kind's commit, the
//            root's writer lock, the copy between two tiers
//   ops      the synchronous save, resharding and consolidation
//   runtime  the asynchronous Checkpointer (save, SaveHandle, cadence), the commit
//            coordinator interface, background replication to a durable tier
//
// Each header states, call by call, what blocks, what throws and what is thread-safe. Opt-in
// headers, not included here: <ckpt/runtime/async_wait.hpp> (a SaveHandle as an Asio
// completion-token operation; link ckpt::asio) and, when ckpt is built with MPI,
// <ckpt/dist/mpi/mpi_comm.hpp> (link ckpt::mpi) and, when built with prometheus-cpp,
// <ckpt/metrics/server.hpp> (the metrics endpoint; link ckpt::metrics). Nothing here includes Boost (Asio, JSON) or
// liburing, and a consumer compiles with no definition of ckpt's.
#pragma once

#include "ckpt/version.hpp"

#include "ckpt/core/dtype.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/format/file_names.hpp"
#include "ckpt/format/json_object.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/format/shard_check.hpp"
#include "ckpt/format/sharding.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/fs/remote_file_system.hpp"
#include "ckpt/objstore/object_store.hpp"
#include "ckpt/objstore/s3.hpp"
#include "ckpt/shard/shard_writer.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/read/mapped.hpp"
#include "ckpt/read/range_reader.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/read/slice_load.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/store/run_identity.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/store/copy.hpp"
#include "ckpt/store/tiers.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/store/object/object_lease.hpp"
#include "ckpt/store/memory/memory.hpp"
#include "ckpt/store/recovery.hpp"
#include "ckpt/ops/reshard.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/runtime/coordinator.hpp"
#include "ckpt/runtime/preemption.hpp"
#include "ckpt/runtime/tiering.hpp"
#include "ckpt/metrics/prometheus.hpp"
