// SPDX-License-Identifier: Apache-2.0
// The fixed sequence of file calls fuzz_wire's "file replies" mode makes through a routed file
// system (each reply it reads comes from the input), shared with the seed tool, which records
// the replies a real FileService gives to the same calls.
#pragma once

#include <functional>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/file_system.hpp"

namespace ckpt::fuzz {

/// Runs `f`; a ckpt::Error it throws is an answer like any other (a reply may carry any error,
/// and one that does not decode is a comm_error), anything else escapes.
template <class F>
void any_error(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}

/// stat, list_dir (its entries to `listed`), open_read / size / read_at, create / write_at /
/// close, try_lock, free_space, rename, remove_all, all under /r.
inline void fixed_file_calls(FileSystem& fs, const std::function<void(const std::vector<DirEntry>&)>& listed = {}) {
  std::byte buf[16]{};
  any_error([&] { fs.stat("/r/d/f"); });
  any_error([&] {
    const auto entries = fs.list_dir("/r");
    if (listed) listed(entries);
  });
  any_error([&] {
    auto r = fs.open_read("/r/d/f");
    any_error([&] { r->size(); });
    any_error([&] { r->read_at(0, std::span(buf, 7)); });
  });
  any_error([&] {
    auto w = fs.create("/r/y", {});
    any_error([&] { w->write_at(0, std::span<const std::byte>(buf, 4)); });
    any_error([&] { w->close(); });
  });
  any_error([&] { fs.try_lock("/r/.lock", "record"); });
  fs.free_space("/r");
  any_error([&] { fs.rename("/r/y", "/r/z"); });
  any_error([&] { fs.remove_all("/r/z"); });
}

}  // namespace ckpt::fuzz
