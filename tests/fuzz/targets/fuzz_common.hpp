// Shared by the fuzz targets: a finding is reported by abort() with a message, so libFuzzer
// saves the input. Anything but a ckpt::Error escaping a target is a finding too (libFuzzer
// reports the uncaught exception as a crash), as is every sanitizer report and leak.
#pragma once

#include <cstdio>
#include <cstdlib>
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

}  // namespace ckpt::fuzz
