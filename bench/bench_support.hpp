// SPDX-License-Identifier: Apache-2.0
// What the benches in bench/ share: timing, medians, deterministic state, their common
// options (--size --rounds --dir --quick --json) and a scratch directory removed at the end.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ckpt::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// Drops the page cache of every file under `dir` (written back first), so that the next
/// read of them comes from the disk.
inline void drop_cache(const std::filesystem::path& dir) {
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

/// `ranks` buffers of `per_rank` bytes each, filled by a xorshift seeded per rank (the same
/// bytes on every run; incompressible, like trained weights).
inline std::vector<std::vector<std::byte>> make_state(int ranks, std::uint64_t per_rank) {
  std::vector<std::vector<std::byte>> state(static_cast<std::size_t>(ranks), std::vector<std::byte>(per_rank));
  for (int r = 0; r < ranks; ++r) {
    std::uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(r + 1);
    std::byte* p = state[static_cast<std::size_t>(r)].data();
    for (std::uint64_t i = 0; i < per_rank; i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      std::memcpy(p + i, &x, std::min<std::uint64_t>(8, per_rank - i));
    }
  }
  return state;
}

/// The options every bench takes, plus its own valued options (`extra`, name -> value).
struct BenchArgs {
  std::uint64_t size = 0;
  int rounds = 3;
  std::string dir;   // empty: a fresh directory under $TMPDIR (or /var/tmp), removed at the end
  std::string json;  // empty: no JSON
  std::map<std::string, std::string> extra;
};

/// Parses argv into `a` (its fields hold the defaults; `extra`'s keys name the bench's own
/// options, e.g. "--bucket"); prints `usage` and exits 2 on an unknown option, a missing or
/// bad value, a size under 1 MiB or rounds under 1.
inline BenchArgs parse_bench_args(int argc, char** argv, const char* name, const char* usage, BenchArgs a) {
  const auto fail = [&](const std::string& why) {
    std::fprintf(stderr, "%s: %s\n%s", name, why.c_str(), usage);
    std::exit(2);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string o = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(o + " needs a value");
      return argv[++i];
    };
    try {
      if (o == "--size") a.size = std::stoull(value());
      else if (o == "--rounds") a.rounds = std::stoi(value());
      else if (o == "--dir") a.dir = value();
      else if (o == "--json") a.json = value();
      else if (o == "--quick") a.size = 16ull << 20, a.rounds = 1;
      else if (a.extra.contains(o)) a.extra[o] = value();
      else fail("unknown option " + o);
    } catch (const std::logic_error&) {  // std::stoull / std::stoi
      fail("bad value for " + o);
    }
  }
  if (a.size < (1u << 20) || a.rounds < 1) fail("--size must be at least 1048576 and --rounds at least 1");
  return a;
}

/// Runs `body(dir)` in `a.dir` (created) or a fresh scratch directory (removed afterwards);
/// an exception is printed under `name` and gives exit status 1.
inline int run_in_scratch(const char* name, const BenchArgs& a, const std::function<int(const std::filesystem::path&)>& body) {
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path dir =
      a.dir.empty() ? std::filesystem::path(tmp ? tmp : "/var/tmp") / (std::string(name) + "-" + std::to_string(::getpid()))
                    : std::filesystem::path(a.dir);
  int rc = 1;
  try {
    std::filesystem::create_directories(dir);
    rc = body(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
  }
  std::error_code ec;
  if (a.dir.empty()) std::filesystem::remove_all(dir, ec);
  return rc;
}

}  // namespace ckpt::bench
