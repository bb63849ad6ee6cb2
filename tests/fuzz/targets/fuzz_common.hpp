// SPDX-License-Identifier: Apache-2.0
// Shared by the fuzz targets: a finding is reported by abort() with a message, so libFuzzer
// saves the input. Anything but a ckpt::Error escaping a target is a finding too (libFuzzer
// reports the uncaught exception as a crash), as is every sanitizer report and leak.
#pragma once

#include <boost/json.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>

#include "ckpt/core/error.hpp"

namespace ckpt::fuzz {

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void require(bool ok, const std::string& what) {
  if (!ok) finding(what);
}

/// A refusal must carry one of `codes` and name a file (every loader error names the file).
inline void check_refusal(const Error& e, std::initializer_list<Errc> codes, std::string_view file_prefix) {
  bool known = false;
  for (Errc c : codes) known |= e.code() == c;
  require(known, std::string("unexpected error code: ") + e.what());
  require(!e.file().empty() && e.file().starts_with(file_prefix), std::string("error does not name the file: ") + e.what());
}

/// JSON equality, doubles within 4 ulps of each other: Boost.JSON 1.81 does not parse decimal
/// numbers correctly rounded (corpus/manifest/finding_double_roundtrip_ulp), so a double is not
/// bit-exact across a serialize and a parse.
inline bool same_json(const boost::json::value& a, const boost::json::value& b) {
  if (a.is_double() && b.is_double()) {
    const double x = a.get_double(), y = b.get_double();
    if (x == y) return true;
    if (std::signbit(x) != std::signbit(y) || !std::isfinite(x) || !std::isfinite(y)) return false;
    std::int64_t bx, by;
    std::memcpy(&bx, &x, 8);
    std::memcpy(&by, &y, 8);
    return (bx > by ? bx - by : by - bx) <= 4;
  }
  if (a.kind() != b.kind()) return false;
  if (const auto* ao = a.if_object()) {
    const auto& bo = b.get_object();
    if (ao->size() != bo.size()) return false;
    for (auto i = ao->begin(), j = bo.begin(); i != ao->end(); ++i, ++j)
      if (i->key() != j->key() || !same_json(i->value(), j->value())) return false;
    return true;
  }
  if (const auto* aa = a.if_array()) {
    const auto& ba = b.get_array();
    if (aa->size() != ba.size()) return false;
    for (std::size_t i = 0; i < aa->size(); ++i)
      if (!same_json((*aa)[i], ba[i])) return false;
    return true;
  }
  return a == b;
}

}  // namespace ckpt::fuzz
