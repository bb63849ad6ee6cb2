// Private: the two ways the writer puts a staged shard on disk. Both write the whole buffer
// with up to `queue_depth` writes of `io_size` bytes in flight and requeue short writes;
// both call `done` on the io_context's thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ckpt/io/file_system.hpp"

namespace ckpt::detail {

class WriteBackend {
 public:
  using Done = std::function<void(std::exception_ptr)>;
  virtual ~WriteBackend() = default;
  virtual std::string_view name() const noexcept = 0;
  virtual void async_write_all(WritableFile& file, std::span<const std::byte> data, std::size_t io_size, int queue_depth,
                               Done done) = 0;
};

/// True if this process may create an io_uring; otherwise `why` says what the kernel said.
bool io_uring_available(std::string* why);

/// io_uring through Asio's random_access_file (BOOST_ASIO_HAS_IO_URING). Files without a
/// descriptor (fault-injecting wrappers) are written through `pool` instead.
std::unique_ptr<WriteBackend> make_uring_backend(boost::asio::io_context& ctx, boost::asio::thread_pool& pool);
/// pwrite on `pool`.
std::unique_ptr<WriteBackend> make_posix_backend(boost::asio::io_context& ctx, boost::asio::thread_pool& pool);

}  // namespace ckpt::detail
