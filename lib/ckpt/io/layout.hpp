// Names on disk under a checkpoint root:
//
//   ROOT/latest                               one line: the live checkpoint's directory name
//   ROOT/step-0000000010/manifest.json        written last, see docs/format.md
//   ROOT/step-0000000010/rank-00000-of-00004.safetensors
//   ROOT/.tmp-step-0000000010-<pid>-<n>/      a checkpoint being written (never loaded)
//   ROOT/.latest.tmp-<pid>-<n>                a `latest` being replaced
//
// Step numbers are zero-padded to 10 digits so that names sort in step order.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ckpt {

inline constexpr std::string_view kLatestName = "latest";
inline constexpr std::uint64_t kMaxStep = 9'999'999'999ull;

/// "step-0000000010". Throws invalid_argument for step > kMaxStep.
std::string checkpoint_dir_name(std::uint64_t step);
/// Inverse of checkpoint_dir_name; nullopt for any other name.
std::optional<std::uint64_t> parse_checkpoint_dir_name(std::string_view name) noexcept;
/// "rank-00001-of-00004.safetensors".
std::string shard_file_name(int rank, int world_size);
/// True for the names of temporaries (".tmp-..." directories and ".latest.tmp-..." files).
bool is_temporary_name(std::string_view name) noexcept;
/// A fresh temporary name for `final_name`, unique within this process and across processes.
std::string temporary_name(std::string_view final_name);

/// root + "/" + name, without doubling a trailing slash.
std::string join_path(std::string_view dir, std::string_view name);

}  // namespace ckpt
