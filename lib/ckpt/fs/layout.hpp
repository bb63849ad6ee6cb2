// SPDX-License-Identifier: Apache-2.0
// Names on disk under a checkpoint root:
//
//   ROOT/latest                               one line: the live checkpoint's directory name
//   ROOT/step-0000000010/manifest.json        written last, see docs/format.md
//   ROOT/step-0000000010/rank-00000-of-00004.safetensors
//   ROOT/.tmp-step-0000000010-<pid>-<n>/      a checkpoint being written (never loaded)
//   ROOT/.latest.tmp-<pid>-<n>                a `latest` being replaced
//   ROOT/.lock                                the writer lock (store/root_lock.hpp): neither a
//                                             checkpoint nor a temporary; it stays
//
// A temporary's name says who made it: the pid of the process and a counter of that process
// (parse_temporary_name). The one exception is the temporary the processes of one MPI run
// share, ".tmp-step-N-<run id>", owned by the run. Only the holder of the root's lock removes
// temporaries it did not make (prepare_root, after a crash).
//
// Step numbers are zero-padded to 10 digits so that names sort in step order.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/format/file_names.hpp"

CKPT_API_BEGIN
namespace ckpt {

inline constexpr std::string_view kLatestName = "latest";
/// True for the names of temporaries (".tmp-..." directories and ".latest.tmp-..." files).
bool is_temporary_name(std::string_view name) noexcept;
/// A fresh temporary name for `final_name`, unique within this process and across processes:
/// ".tmp-<final_name>-<pid>-<n>", or ".latest.tmp-<pid>-<n>" for `latest`.
std::string temporary_name(std::string_view final_name);

/// What a name made by temporary_name says about its owner.
struct TemporaryName {
  std::string final_name;  ///< what it becomes (or came from): "step-0000000010", "latest", ...
  long pid = 0;            ///< the process that made it
  std::uint64_t serial = 0;  ///< that process's counter
};
/// Parses a name temporary_name made; nullopt for any other name (a shared temporary
/// ".tmp-step-N-<run id>" included). Never throws.
std::optional<TemporaryName> parse_temporary_name(std::string_view name) noexcept;
/// True if this process made `name` with temporary_name.
bool is_own_temporary(std::string_view name) noexcept;

/// This machine's host name (gethostname), "?" if it has none.
std::string host_name();
/// A temporary for `final_name` outside any root (a tool's output, such as consolidate's in
/// OUT's parent), which names its host as well: temporary_name(final_name + "@" + host), e.g.
/// ".tmp-model@node7-12345-0". No lock guards such a directory; its name lets a later run
/// tell whether its owner is gone (is_abandoned_temporary).
std::string host_temporary_name(std::string_view final_name);
/// True if `name` is a host_temporary_name(final_name) made on this host by a process that
/// no longer exists (kill(pid, 0) fails with ESRCH): nobody owns it, and it may be removed.
/// A temporary of another host is never abandoned by this test (its pid means nothing
/// here), nor one whose pid a live process has reused (kept until that process ends).
bool is_abandoned_temporary(std::string_view name, std::string_view final_name) noexcept;

/// root + "/" + name, without doubling a trailing slash.
std::string join_path(std::string_view dir, std::string_view name);
/// The directory that holds `path`, trailing slashes ignored: "a/b/" -> "a", "/a" -> "/",
/// "a" -> ".".
std::string parent_dir(std::string_view path);
/// The last component of `path`, trailing slashes ignored: "a/b/" -> "b", "a" -> "a".
std::string_view last_component(std::string_view path) noexcept;

}  // namespace ckpt
CKPT_API_END
