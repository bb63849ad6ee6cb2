// SPDX-License-Identifier: Apache-2.0
#include "ckpt/core/log.hpp"

#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

namespace ckpt {

namespace {
std::mutex g_mu;
LogSink g_sink;
}  // namespace

void log_line(std::string_view line) {
  std::lock_guard lk(g_mu);
  if (g_sink) {
    g_sink(line);
    return;
  }
  std::fprintf(stderr, "ckpt: %.*s\n", static_cast<int>(line.size()), line.data());
}

LogSink set_log_sink(LogSink sink) {
  std::lock_guard lk(g_mu);
  return std::exchange(g_sink, std::move(sink));
}

}  // namespace ckpt
