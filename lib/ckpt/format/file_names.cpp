// SPDX-License-Identifier: Apache-2.0
#include "ckpt/format/file_names.hpp"

#include <cstdio>

#include "ckpt/core/error.hpp"

namespace ckpt {

std::string checkpoint_dir_name(std::uint64_t step) {
  if (step > kMaxStep) throw_invalid("step " + std::to_string(step) + " exceeds " + std::to_string(kMaxStep));
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%010llu", static_cast<unsigned long long>(step));
  return buf;
}

std::optional<std::uint64_t> parse_checkpoint_dir_name(std::string_view name) noexcept {
  constexpr std::string_view prefix = "step-";
  if (name.size() != prefix.size() + 10 || name.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}

std::string shard_file_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "rank-%05d-of-%05d.safetensors", rank, world_size);
  return buf;
}

std::string shard_file_name(int rank, int world_size, int part, int parts) {
  if (parts <= 1) return shard_file_name(rank, world_size);
  char buf[96];
  std::snprintf(buf, sizeof buf, "rank-%05d-of-%05d.part-%05d-of-%05d.safetensors", rank, world_size, part, parts);
  return buf;
}

}  // namespace ckpt
