// SPDX-License-Identifier: Apache-2.0
#include "ckpt/fs/small_file.hpp"

#include <span>

namespace ckpt {

namespace detail {

void write_small_file(FileSystem& fs, const std::string& path, std::string_view content) {
  auto f = fs.create(path, {});
  f->write_at(0, std::as_bytes(std::span(content.data(), content.size())));
  f->sync();
  f->close();
}

OpenedSmallFile open_small_file(FileSystem& fs, const std::string& path, std::uint64_t limit, Errc too_big) {
  // Only a regular file is opened: open(2) of a FIFO named manifest.json or latest blocks
  // until a writer appears, i.e. forever.
  OpenedSmallFile out;
  out.stat = fs.stat(path);
  if (out.stat && out.stat->type != EntryType::file) {
    const bool link = out.stat->type == EntryType::symlink;
    throw Error(Errc::unsafe_path, path, link ? "is a symlink" : "not a regular file", "regular file", link ? "symlink" : "other file type");
  }
  out.file = fs.open_read(path);
  out.size = out.file->size();
  if (out.size > limit)
    throw Error(too_big, path, "file size", "at most " + std::to_string(limit) + " bytes", std::to_string(out.size) + " bytes");
  return out;
}

std::string read_small_file(FileSystem& fs, const std::string& path, std::uint64_t limit, Errc too_big) {
  const OpenedSmallFile f = open_small_file(fs, path, limit, too_big);
  std::string text(static_cast<std::size_t>(f.size), '\0');
  f.file->read_at(0, std::as_writable_bytes(std::span(text.data(), text.size())));
  return text;
}
}  // namespace detail

}  // namespace ckpt
