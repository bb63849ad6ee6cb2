// SPDX-License-Identifier: Apache-2.0
// Not installed: whole small files (manifest.json, latest, tier.json, a consolidated index),
// read and written the one way the commit protocol needs.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/file_system.hpp"

CKPT_API_BEGIN
namespace ckpt::detail {

/// Creates `path` (O_EXCL), writes `content`, fsyncs and closes it.
void write_small_file(FileSystem& fs, const std::string& path, std::string_view content);

/// Reads a regular file of at most `limit` bytes (a larger one is `too_big`, a symlink or
/// other type Errc::unsafe_path: open(2) of a FIFO would block forever).
std::string read_small_file(FileSystem& fs, const std::string& path, std::uint64_t limit, Errc too_big);

/// The checks of read_small_file without the read: the file open, its size and what stat
/// said of it before the open (absent only if it appeared between the two).
struct OpenedSmallFile {
  std::unique_ptr<ReadableFile> file;
  std::uint64_t size = 0;
  std::optional<FileStat> stat;
};
OpenedSmallFile open_small_file(FileSystem& fs, const std::string& path, std::uint64_t limit, Errc too_big);

}  // namespace ckpt::detail
CKPT_API_END
