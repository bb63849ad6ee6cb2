// SPDX-License-Identifier: Apache-2.0
// Diagnostics, one line each, to stderr by default. Used sparingly: for decisions a user must
// know about (a fallback writer, an abandoned save), never per operation.
//
// Each record has a level, a short stable event name ("save_failed"), a message and, where
// the caller knows them, a rank and a step. Two settings, read from the environment at the
// first record (and settable in code, which wins):
//
//   CKPT_LOG=error|warn|info|debug   records above this level are dropped (default info; an
//                                    unknown value is reported once, and info used)
//   CKPT_LOG_FORMAT=text|json        text (default): "ckpt: <message>", as ckpt always wrote;
//                                    json: one object per line, for log collectors:
//
//   {"time":"2026-12-07T00:36:42.123456Z","level":"warn","rank":0,"step":10,"event":"save_failed","message":"..."}
//
// time is RFC 3339 in UTC with microseconds; rank and step appear only when known. Strings are
// JSON-escaped; bytes that are not UTF-8 (a path may hold any) become U+FFFD, one per byte.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

CKPT_API_BEGIN
namespace ckpt {

/// Severity, most severe first: a setting of `info` lets error, warn and info through.
enum class LogLevel { error, warn, info, debug };
enum class LogFormat { text, json };

/// "error", "warn", "info", "debug".
std::string_view log_level_name(LogLevel level) noexcept;
/// The level a CKPT_LOG value names (exact, lower case), or nullopt.
std::optional<LogLevel> parse_log_level(std::string_view name) noexcept;

/// What a record knows of where it comes from.
struct LogFields {
  std::optional<int> rank{};
  std::optional<std::uint64_t> step{};
};

struct LogRecord {
  std::chrono::system_clock::time_point time;
  LogLevel level = LogLevel::info;
  std::string_view event;    ///< short, stable, snake_case: what a log query selects on
  std::string_view message;  ///< for a human; its wording may change
  LogFields fields;
};

/// Emits a record if `level` passes the current setting. Thread-safe; never throws.
void log_event(LogLevel level, std::string_view event, std::string_view message, LogFields fields = {});
/// log_event(LogLevel::info, "message", line): the call of code that states no level.
void log_line(std::string_view line);

/// True if a record of `level` would be emitted (to skip building an expensive message).
bool log_enabled(LogLevel level) noexcept;
/// The current settings (the environment's, unless set below).
LogLevel log_level() noexcept;
LogFormat log_format() noexcept;
/// Override the environment for the rest of the process. Thread-safe.
void set_log_level(LogLevel level) noexcept;
void set_log_format(LogFormat format) noexcept;

/// The line `record` becomes in `format`, without the newline: "ckpt: <message>", or the JSON
/// object above.
std::string format_log_record(const LogRecord& record, LogFormat format);
/// `text` as the body of a JSON string (no quotes): ", \ and control characters escaped,
/// valid UTF-8 kept, every byte of an invalid sequence replaced by \ufffd.
std::string json_escape(std::string_view text);

/// Replaces the sink (nullptr restores stderr); returns the previous one. The sink receives
/// the message of every record that passes the level, without "ckpt: " and in any format.
/// For tests and applications with their own logging. The sink runs on the logging thread
/// under the log's lock (records never interleave): it must not log itself. Thread-safe.
using LogSink = std::function<void(std::string_view)>;
LogSink set_log_sink(LogSink sink);

}  // namespace ckpt
CKPT_API_END
