// SPDX-License-Identifier: Apache-2.0
// Whole small files through a FileSystem, for the tests of file systems themselves (the
// conformance suite, the routed file system): what a test writes and reads back as text.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "ckpt/fs/file_system.hpp"

namespace ckpt::test {

inline std::span<const std::byte> bytes_of(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

/// create, write_at(0), sync, close: `content` as the new file `path`.
inline void write_file(FileSystem& fs, const std::string& path, std::string_view content) {
  auto f = fs.create(path, {});
  f->write_at(0, bytes_of(content));
  f->sync();
  f->close();
}

/// The whole file `path`, read at once.
inline std::string read_file(FileSystem& fs, const std::string& path) {
  auto f = fs.open_read(path);
  std::string s(static_cast<std::size_t>(f->size()), '\0');
  f->read_at(0, std::as_writable_bytes(std::span(s.data(), s.size())));
  return s;
}

}  // namespace ckpt::test
