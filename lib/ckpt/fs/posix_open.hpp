// SPDX-License-Identifier: Apache-2.0
// Private: the one way ckpt opens an existing file for reading on POSIX, shared by
// posix_file_system().open_read and the mapped shard (which needs the descriptor itself).
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <string>

CKPT_API_BEGIN
namespace ckpt::detail {

struct OpenedFd {
  int fd = -1;
  std::uint64_t size = 0;  ///< st_size at the open
};

/// open(2) with O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK (O_NONBLOCK: a FIFO in the
/// file's place does not block the open; it changes nothing for a regular file), then fstat.
/// A symlink, or anything but a regular file, is Errc::unsafe_path; absence Errc::not_found;
/// other failures Errc::io_error, each naming `path`. The caller closes the descriptor.
OpenedFd open_regular_file(const std::string& path);

}  // namespace ckpt::detail
CKPT_API_END
