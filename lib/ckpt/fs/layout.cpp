// SPDX-License-Identifier: Apache-2.0
#include "ckpt/fs/layout.hpp"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <climits>

#include <atomic>
#include <cstdio>

#include "ckpt/core/error.hpp"

namespace ckpt {

bool is_temporary_name(std::string_view name) noexcept {
  return name.starts_with(".tmp-") || name.starts_with(".latest.tmp-");
}

std::string temporary_name(std::string_view final_name) {
  static std::atomic<std::uint64_t> counter{0};
  const std::string prefix = final_name == kLatestName ? ".latest.tmp-" : ".tmp-" + std::string(final_name) + "-";
  return prefix + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

namespace {
// The decimal number `s` (no sign, at most 19 digits), or nullopt.
std::optional<std::uint64_t> parse_decimal(std::string_view s) noexcept {
  if (s.empty() || s.size() > 19) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return v;
}
}  // namespace

std::optional<TemporaryName> parse_temporary_name(std::string_view name) noexcept {
  constexpr std::string_view latest_prefix = ".latest.tmp-", prefix = ".tmp-";
  std::string_view rest;
  std::string_view final_name;
  if (name.starts_with(latest_prefix)) {
    final_name = kLatestName;
    rest = name.substr(latest_prefix.size());
  } else if (name.starts_with(prefix)) {
    rest = name.substr(prefix.size());
  } else {
    return std::nullopt;
  }
  // <final_name>-<pid>-<serial>, read from the right: a final name may contain '-'.
  const std::size_t last = rest.rfind('-');
  if (last == std::string_view::npos) return std::nullopt;
  const auto serial = parse_decimal(rest.substr(last + 1));
  std::string_view head = rest.substr(0, last);
  std::string_view pid_text = head;
  if (final_name.empty()) {
    const std::size_t before = head.rfind('-');
    if (before == std::string_view::npos || before == 0) return std::nullopt;
    final_name = head.substr(0, before);
    pid_text = head.substr(before + 1);
  }
  const auto pid = parse_decimal(pid_text);
  if (!serial || !pid || *pid == 0 || *pid > 0x7fffffffu) return std::nullopt;
  try {
    return TemporaryName{std::string(final_name), static_cast<long>(*pid), *serial};
  } catch (...) {
    return std::nullopt;  // bad_alloc
  }
}

bool is_own_temporary(std::string_view name) noexcept {
  const auto t = parse_temporary_name(name);
  return t && t->pid == static_cast<long>(::getpid());
}

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "?";
  return buf;
}

std::string host_temporary_name(std::string_view final_name) { return temporary_name(std::string(final_name) + "@" + host_name()); }

bool is_abandoned_temporary(std::string_view name, std::string_view final_name) noexcept {
  try {
    const auto t = parse_temporary_name(name);
    if (!t || t->final_name != std::string(final_name) + "@" + host_name()) return false;
    return ::kill(static_cast<pid_t>(t->pid), 0) != 0 && errno == ESRCH;
  } catch (...) {
    return false;  // bad_alloc: keep it
  }
}

std::string join_path(std::string_view dir, std::string_view name) {
  std::string out(dir);
  if (!out.empty() && out.back() != '/') out += '/';
  out += name;
  return out;
}

std::string_view last_component(std::string_view p) noexcept {
  while (p.size() > 1 && p.back() == '/') p.remove_suffix(1);
  if (const auto slash = p.rfind('/'); slash != std::string_view::npos && p.size() > 1) p.remove_prefix(slash + 1);
  return p;
}

std::string parent_dir(std::string_view p) {
  while (p.size() > 1 && p.back() == '/') p.remove_suffix(1);
  const auto slash = p.rfind('/');
  if (slash == std::string_view::npos) return ".";
  return slash == 0 ? std::string("/") : std::string(p.substr(0, slash));
}

}  // namespace ckpt
