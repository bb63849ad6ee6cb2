// SPDX-License-Identifier: Apache-2.0
// What the benches in bench/ share: timing, medians, deterministic state, their common
// options (--size --rounds --dir --quick --json) and a scratch directory removed at the end.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cli.hpp"          // apps/common: the command-line conventions of every ckpt program
#include "json_output.hpp"  // apps/common: the "schema" of every JSON output

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

/// Figures (seconds, ratios) as a JSON array, in their order.
inline boost::json::array json_figures(const std::vector<double>& v) { return boost::json::array(v.begin(), v.end()); }

/// Writes a bench's --json FILE: `figures` as one line, its first field "schema":
/// "PROGRAM/VERSION" (apps/common/json_output.hpp; each bench's fields: docs/json-output.md).
/// `version` changes when a field is removed or changes meaning, never when one is added.
inline void write_json(const std::string& path, std::string_view program, int version, const boost::json::object& figures) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << boost::json::serialize(cli::with_schema(program, version, figures)) << "\n";
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
}

/// The options every bench takes, plus its own valued options (`extra`, name -> value).
struct BenchArgs {
  std::uint64_t size = 0;
  int rounds = 3;
  std::string dir;   // empty: a fresh directory under $TMPDIR (or /var/tmp), removed at the end
  std::string json;  // empty: no JSON
  std::map<std::string, std::string> extra;
};

/// One of a bench's own options: its name ("--kills"), what the help shows after it ("N"),
/// its description, and what its value must be.
struct BenchOption {
  enum class Kind { text, count, number };  ///< any text; an integer >= 0; a number
  std::string name;
  std::string value_name;
  std::string description;
  Kind kind = Kind::text;
};

/// Parses argv into `a` with the command-line conventions of every ckpt program
/// (apps/common/cli.hpp: CLI11, --help and --version exiting 0, a usage error exiting 2 with
/// a message naming the option, sizes as 1024, 64K, 500M, 1.5G). `a`'s fields hold the
/// defaults, `a.extra` those of `extra`. Returns the exit status when the program should stop
/// now (help, version, usage error), nullopt when it should run.
inline std::optional<int> parse_bench_args(int argc, char** argv, const char* name, const std::string& description, BenchArgs& a,
                                           const std::vector<BenchOption>& extra = {}) {
  CLI::App app(description, name);
  cli::setup(app);
  cli::add_size_option(app, "--size", a.size, "bytes of state, at least 1M (default " + std::to_string(a.size >> 20) + "M)");
  cli::add_int_option(app, "--rounds", a.rounds, 1, 1 << 20, "N", "rounds; figures are their medians (default " + std::to_string(a.rounds) + ")");
  app.add_option("--dir", a.dir, "work directory (default: a fresh one under $TMPDIR or /var/tmp, removed at the end)")->option_text("DIR");
  bool quick = false;
  app.add_flag("--quick", quick, "a smoke run: 16M of state, one round");
  app.add_option("--json", a.json, "also write the figures as JSON to FILE")->option_text("FILE");
  for (const auto& o : extra) {
    std::string& value = a.extra[o.name];
    CLI::Option* opt = app.add_option(o.name, value, o.description + (value.empty() ? "" : " (default " + value + ")"))->option_text(o.value_name);
    if (o.kind == BenchOption::Kind::count) opt->check(cli::integer_in(0, 1e9));
    else if (o.kind == BenchOption::Kind::number) opt->check(cli::number_in(0, 1e9));
  }
  if (const auto rc = cli::parse(app, argc, argv)) return rc;
  if (quick) a.size = 16ull << 20, a.rounds = 1;
  if (a.size < (1u << 20)) {
    cli::print_usage_error(name, "--size must be at least 1M (1048576 bytes), got " + std::to_string(a.size));
    return cli::kExitUsage;
  }
  return std::nullopt;
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
