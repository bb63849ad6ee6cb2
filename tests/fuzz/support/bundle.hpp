// SPDX-License-Identifier: Apache-2.0
// The input of the fuzz targets that build a directory tree (fuzz_checkpoint, fuzz_node_set),
// and what tests/fuzz/tools/make_seeds.cpp writes: the text of a manifest, then files, each as
// "\n@@file@@ NAME\n" and its bytes, up to the next separator.
#pragma once

#include <string>
#include <string_view>

namespace ckpt::fuzz {

inline constexpr std::string_view kFileSeparator = "\n@@file@@ ";

/// One file of a bundle.
inline std::string bundle_entry(std::string_view name, std::string_view bytes) {
  return std::string(kFileSeparator) + std::string(name) + "\n" + std::string(bytes);
}

/// Calls on_file(name, bytes) for each file of `in` (a name runs to the end of its line; an
/// entry without a line end is dropped) and returns the text before the first one.
template <class OnFile>
std::string_view split_bundle(std::string_view in, OnFile&& on_file) {
  std::size_t pos = in.find(kFileSeparator);
  const std::string_view manifest = in.substr(0, pos);
  while (pos != std::string_view::npos) {
    const std::size_t name_begin = pos + kFileSeparator.size();
    const std::size_t name_end = in.find('\n', name_begin);
    if (name_end == std::string_view::npos) break;
    pos = in.find(kFileSeparator, name_end + 1);
    on_file(in.substr(name_begin, name_end - name_begin),
            in.substr(name_end + 1, pos == std::string_view::npos ? std::string_view::npos : pos - name_end - 1));
  }
  return manifest;
}

}  // namespace ckpt::fuzz
