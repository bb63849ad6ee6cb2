// SPDX-License-Identifier: Apache-2.0
// One-line diagnostics ("ckpt: ..."), to stderr by default. Used sparingly: for decisions a
// user must know about (a fallback writer, an abandoned save), never per operation.
#pragma once

#include "ckpt/core/export.hpp"

#include <functional>
#include <string_view>

CKPT_API_BEGIN
namespace ckpt {

/// Writes "ckpt: <line>\n" to the current sink. Thread-safe.
void log_line(std::string_view line);

/// Replaces the sink (nullptr restores stderr); returns the previous one. For tests and
/// applications with their own logging.
using LogSink = std::function<void(std::string_view)>;
LogSink set_log_sink(LogSink sink);

}  // namespace ckpt
CKPT_API_END
