// SPDX-License-Identifier: Apache-2.0
// ckpt reports every failure as a ckpt::Error: a typed code plus the file involved and the
// expected and actual values, so a message such as
//   checksum mismatch: /ckpt/step-00000010/rank-00001.safetensors: chunk 3: expected xxh3 0f..., actual 9a...
// tells the user what broke without a debugger. Errors raised on a background thread are
// stored and rethrown where the caller waits; they are never swallowed.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

CKPT_API_BEGIN
namespace ckpt {

/// What went wrong, for callers that branch on the kind of failure.
enum class Errc {
  world_size_mismatch,  ///< checkpoint written at another world size
  missing_shard,        ///< a shard file the manifest lists does not exist
  size_mismatch,        ///< a file's size differs from the recorded one
  checksum_mismatch,    ///< XXH3 or SHA-256 of a file (or chunk) differs
  malformed_manifest,   ///< manifest is not valid JSON or violates the schema
  malformed_shard,      ///< shard header (safetensors layout) is invalid
  unsupported_schema,   ///< manifest schema_version this build cannot read
  unsafe_path,          ///< a path in a manifest escapes its directory or names a symlink
  io_error,             ///< a system call failed (errno in sys_errno())
  no_space,             ///< ENOSPC / EDQUOT while writing
  not_found,            ///< no such checkpoint, tensor or directory
  invalid_argument,     ///< the caller passed something unusable
  aborted,              ///< the operation was cancelled (shutdown, a peer failed)
  comm_error,           ///< a collective or the commit coordination failed
  busy,                 ///< another writer holds the root's lock (the message names its pid)
  conflict,             ///< an object store refused a conditional write (HTTP 412): the key exists, or its ETag moved
};
/// The last code: a code read from a wire or a file is one iff 0 <= code <= kLastErrc.
inline constexpr Errc kLastErrc = Errc::conflict;

/// Stable lower-case name of a code ("checksum mismatch"): how messages begin.
std::string_view errc_name(Errc code) noexcept;

/// Stable identifier of a code: its enumerator's name ("checksum_mismatch"). The `code` of
/// an error in the ckpt tool's --json output and of the Python exceptions (ckpt.errors): the
/// one identifier a program branches on, whatever the language. Names and identifiers come
/// from one table (core/error.cpp).
std::string_view errc_id(Errc code) noexcept;

/// The one error type of ckpt. what() is the full human-readable message.
///
/// The message is held in a std::string of the Error itself, not in std::runtime_error's
/// reference-counted string: copies of an error are handed between threads (a commit's
/// outcome, a rank's failure), and a buffer shared by copies on two threads is freed by
/// whichever drops it last, through reference counts ThreadSanitizer cannot see.
class Error : public std::runtime_error {
 public:
  /// `detail` is free text (e.g. "chunk 3"); `expected`/`actual` are printed when non-empty.
  Error(Errc code, std::string file, std::string detail, std::string expected = {},
        std::string actual = {}, int sys_errno = 0);

  Errc code() const noexcept { return code_; }
  const std::string& file() const noexcept { return file_; }
  const std::string& detail() const noexcept { return detail_; }
  const std::string& expected() const noexcept { return expected_; }
  const std::string& actual() const noexcept { return actual_; }
  int sys_errno() const noexcept { return errno_; }
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  Errc code_;
  std::string message_, file_, detail_, expected_, actual_;
  int errno_;
};

/// Throws Errc::io_error (or Errc::no_space for ENOSPC/EDQUOT) for a failed system call:
/// "<action> failed: <file>: <strerror(err)>".
[[noreturn]] void throw_errno(int err, std::string_view action, std::string_view file);

/// Throws Errc::invalid_argument naming what was wrong.
[[noreturn]] void throw_invalid(std::string_view what);

/// The one range check for a rank (or a root) of a world of `world` ranks: throws
/// Errc::invalid_argument naming `file` (or the call: may be empty) and `what`, expected
/// "0..world-1", actual `rank`, unless 0 <= rank < world. Allocates nothing when it passes.
void check_rank(int rank, int world, std::string_view what, std::string_view file = {});

/// The one check of a file's size against the size recorded for it: throws
/// Errc::size_mismatch naming `file` and `what`, expected and actual as "N bytes", unless
/// they are equal.
void check_size(std::uint64_t expected, std::uint64_t actual, std::string_view what, std::string_view file);

/// An Error as one line of JSON ({"code", "file", "detail", "expected", "actual", "errno"}), so
/// that it can cross a thread or process boundary and be rethrown there unchanged. The strings
/// carry their bytes as they are, UTF-8 or not (a path need not be): read the text with
/// error_from_json, or with a JSON parser told to accept invalid UTF-8.
std::string error_to_json(const Error& e);
/// Inverse of error_to_json (every field, byte for byte). Text that is not such JSON becomes
/// Errc::comm_error quoting it; a code out of range is comm_error, an errno that is no int 0.
Error error_from_json(std::string_view text);
/// The exception in `e` as a ckpt::Error: a ckpt::Error unchanged; a
/// std::filesystem::filesystem_error as Errc::io_error (not_found for ENOENT, no_space for
/// ENOSPC/EDQUOT) naming its path(s), with its errno; std::bad_alloc as Errc::io_error "out of
/// memory" with errno ENOMEM; any other exception as Errc::io_error with what().
Error to_error(std::exception_ptr e);

/// Runs `body`, rethrowing whatever it throws as to_error() of it, with `file` filled in when
/// the error names none (e.g. a std::bad_alloc while reading `file`).
template <class F>
decltype(auto) with_typed_errors(const std::string& file, F&& body) {
  try {
    return body();
  } catch (const Error&) {
    throw;
  } catch (...) {
    Error e = to_error(std::current_exception());
    if (!e.file().empty()) throw e;
    throw Error(e.code(), file, e.detail(), e.expected(), e.actual(), e.sys_errno());
  }
}

}  // namespace ckpt
CKPT_API_END
