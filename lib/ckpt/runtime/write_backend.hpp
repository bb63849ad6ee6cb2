// SPDX-License-Identifier: Apache-2.0
// Private: the two ways the pipeline moves a staged shard image into its file. Both write the
// whole buffer at offset 0 with up to `queue_depth` writes of `io_size` bytes in flight,
// requeue short writes, and are awaited from the pipeline's coroutines on the io_context.
#pragma once

#include "ckpt/core/export.hpp"

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <atomic>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ckpt/fs/file_system.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

class StagedBytes;

class WriteBackend {
 public:
  virtual ~WriteBackend() = default;
  virtual std::string_view name() const noexcept = 0;
  /// Writes all of `data` into `file` from offset `base`. Returns the name of the writer that
  /// moved the bytes ("io_uring", or "posix" for a file without a descriptor); throws the
  /// first write's ckpt::Error once every write in flight has finished. Once `*stop` is true
  /// no further piece is started: the write ends with Errc::aborted when the pieces in
  /// flight are done. A file opened with O_DIRECT whose writes fail with EINVAL (the file
  /// system took the open, not the writes) is reopened buffered (WritableFile::reopen_buffered)
  /// and the whole of `data` written again, once, with one log_line naming the file. With
  /// `staged`, `data` is still being copied in: each piece is written once its bytes are
  /// (StagedBytes::async_wait, whose offsets count from `staged_base` + `base`: the file's
  /// image starts at `staged_base` of the staging the watermark counts), and a failed copy
  /// fails the write with its error.
  virtual boost::asio::awaitable<std::string_view> write(WritableFile& file, std::span<const std::byte> data, std::size_t io_size,
                                                         int queue_depth, const std::atomic<bool>* stop = nullptr,
                                                         StagedBytes* staged = nullptr, std::uint64_t base = 0,
                                                         std::uint64_t staged_base = 0) = 0;
};

/// True if this process may create an io_uring; otherwise `why` says what the kernel said.
bool io_uring_available(std::string* why);

/// io_uring through Asio's random_access_file on `ctx` (BOOST_ASIO_HAS_IO_URING). Faults of
/// fault-injecting files reach it through WritableFile::before_native_write; files without a
/// descriptor (in-memory) are written through `pool` instead, and reported as "posix".
std::unique_ptr<WriteBackend> make_uring_backend(boost::asio::io_context& ctx, boost::asio::thread_pool& pool);
/// pwrite (WritableFile::write_at) on `pool`.
std::unique_ptr<WriteBackend> make_posix_backend(boost::asio::thread_pool& pool);

}  // namespace ckpt::detail
CKPT_API_END
