// SPDX-License-Identifier: Apache-2.0
#include "ckpt/core/log.hpp"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>
#include <utility>

namespace ckpt {

namespace {

std::mutex g_mu;  // serialises the sink and the writes to stderr
LogSink g_sink;
std::atomic<LogLevel> g_level{LogLevel::info};
std::atomic<LogFormat> g_format{LogFormat::text};
std::once_flag g_env_once;

// Sets what the environment asks for; returns a line for what it asks wrongly ("" if nothing).
std::string read_environment() {
  std::string complaint;
  if (const char* v = std::getenv("CKPT_LOG"); v && *v) {
    if (const auto level = parse_log_level(v))
      g_level = *level;
    else
      complaint = std::string("CKPT_LOG=") + v + " is not a level (error, warn, info or debug): using info";
  }
  if (const char* v = std::getenv("CKPT_LOG_FORMAT"); v && *v) {
    const std::string_view f = v;
    if (f == "json")
      g_format = LogFormat::json;
    else if (f != "text")
      complaint += std::string(complaint.empty() ? "" : "; ") + "CKPT_LOG_FORMAT=" + v + " is not a format (text or json): using text";
  }
  return complaint;
}

void emit(const LogRecord& record) {
  try {
    std::lock_guard lk(g_mu);
    if (g_sink) {
      g_sink(record.message);
      return;
    }
    const std::string line = format_log_record(record, g_format.load()) + '\n';
    std::fwrite(line.data(), 1, line.size(), stderr);
  } catch (...) {
    // A diagnostic that cannot be formatted (out of memory) or a sink that throws is dropped:
    // logging never fails the operation it reports on.
  }
}

// The environment is read once, at the first record or setting; a bad value is reported then,
// once (at warn: it passes any level but error).
void ensure_environment_read() {
  std::string complaint;
  std::call_once(g_env_once, [&] { complaint = read_environment(); });
  if (!complaint.empty() && g_level.load() >= LogLevel::warn)
    emit(LogRecord{std::chrono::system_clock::now(), LogLevel::warn, "log_setting_unknown", complaint, {}});
}

// The length of the valid UTF-8 sequence at the start of `s`, or 0 if it is not one
// (overlong forms, surrogates and code points past U+10FFFF included).
std::size_t utf8_sequence(std::string_view s) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  std::size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c == 0xE0) n = 3, lo = 0xA0;
  else if (c == 0xED) n = 3, hi = 0x9F;
  else if (c >= 0xE1 && c <= 0xEF) n = 3;
  else if (c == 0xF0) n = 4, lo = 0x90;
  else if (c == 0xF4) n = 4, hi = 0x8F;
  else if (c >= 0xF1 && c <= 0xF3) n = 4;
  else return 0;
  if (s.size() < n || b(1) < lo || b(1) > hi) return 0;
  for (std::size_t i = 2; i < n; ++i)
    if (b(i) < 0x80 || b(i) > 0xBF) return 0;
  return n;
}

std::string rfc3339_utc(std::chrono::system_clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(us / 1000000);
  long frac = static_cast<long>(us % 1000000);
  if (frac < 0) frac += 1000000, --secs;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  std::array<char, 96> buf{};
  std::snprintf(buf.data(), buf.size(), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
  return buf.data();
}

}  // namespace

std::string_view log_level_name(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "info";
}

std::optional<LogLevel> parse_log_level(std::string_view name) noexcept {
  for (const LogLevel l : {LogLevel::error, LogLevel::warn, LogLevel::info, LogLevel::debug})
    if (name == log_level_name(l)) return l;
  return std::nullopt;
}

std::string json_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      if (const std::size_t n = utf8_sequence(text.substr(i))) {
        out.append(text.substr(i, n));
        i += n;
      } else {
        out += "\\ufffd";
        ++i;
      }
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7F) {
          std::array<char, 8> esc{};
          std::snprintf(esc.data(), esc.size(), "\\u%04x", c);
          out += esc.data();
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  return out;
}

std::string format_log_record(const LogRecord& r, LogFormat format) {
  if (format == LogFormat::text) return "ckpt: " + std::string(r.message);
  std::string out = "{\"time\":\"" + rfc3339_utc(r.time) + "\",\"level\":\"" + std::string(log_level_name(r.level)) + '"';
  if (r.fields.rank) out += ",\"rank\":" + std::to_string(*r.fields.rank);
  if (r.fields.step) out += ",\"step\":" + std::to_string(*r.fields.step);
  out += ",\"event\":\"" + json_escape(r.event) + "\",\"message\":\"" + json_escape(r.message) + "\"}";
  return out;
}

bool log_enabled(LogLevel level) noexcept {
  ensure_environment_read();
  return level <= g_level.load();
}

LogLevel log_level() noexcept {
  ensure_environment_read();
  return g_level.load();
}

LogFormat log_format() noexcept {
  ensure_environment_read();
  return g_format.load();
}

void set_log_level(LogLevel level) noexcept {
  ensure_environment_read();
  g_level = level;
}

void set_log_format(LogFormat format) noexcept {
  ensure_environment_read();
  g_format = format;
}

void log_event(LogLevel level, std::string_view event, std::string_view message, LogFields fields) {
  if (!log_enabled(level)) return;
  emit(LogRecord{std::chrono::system_clock::now(), level, event, message, fields});
}

void log_line(std::string_view line) { log_event(LogLevel::info, "message", line); }

LogSink set_log_sink(LogSink sink) {
  std::lock_guard lk(g_mu);
  return std::exchange(g_sink, std::move(sink));
}

}  // namespace ckpt
