// SPDX-License-Identifier: Apache-2.0
// The command-line conventions every ckpt program shares (ckpt, ckpt-demo, ckpt-bench and the
// examples), on top of CLI11: help is generated from the same declarations that parse, so the
// two cannot drift.
//
//   - `-h, --help` prints help (usage first, then what the program or command does, its
//     arguments and options, then the footer: details and an example) and exits 0;
//   - `--version` prints "<program> <version>" (the CMake project version) and exits 0;
//   - a usage error (an unknown option or command, a missing or malformed value, options that
//     contradict each other) exits 2 with a message that names the option or command;
//   - a size (a byte count) is written alike everywhere: 1024, 64K, 500M, 1.5G (parse_size).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "ckpt/core/error.hpp"

namespace ckpt::cli {

inline constexpr int kExitUsage = 2;
/// The exit status of a program that stopped on an error (a typed ckpt::Error on stderr).
inline constexpr int kExitError = 1;

/// The project version (CMake's PROJECT_VERSION), e.g. "0.1.0".
std::string_view version() noexcept;

/// A usage error found after CLI11 has parsed (options that contradict each other, a value
/// that only the program can check). Caught like CLI11's own errors: exit 2, the message shown.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A byte count written as digits with an optional fraction and an optional binary unit:
/// "1024", "64K", "500M", "1.5G", "2T" (K = 1024, M = 1024^2, ... P = 1024^5; any case; "B",
/// "KB"/"KiB", "MB"/"MiB", ... spell the same). Returns nullopt for anything else: an empty
/// or signed text, an unknown unit, zero, a fraction of a byte ("1.5", "0.3K") and more than
/// 2^64 - 1 bytes. Never throws.
std::optional<std::uint64_t> parse_size(std::string_view text) noexcept;

/// Declares option `name` (e.g. "--size") on `app`, taking a SIZE (parse_size) into
/// `target`; a text that is not a size is a usage error naming the option.
CLI::Option* add_size_option(CLI::App& app, const std::string& name, std::uint64_t& target, const std::string& description);

/// A CLI11 validator that accepts an integer (digits with an optional sign) from `lo` to `hi`
/// and refuses anything else with "expected an integer from LO to HI, got 'TEXT'".
CLI::Validator integer_in(long double lo, long double hi);
/// The same for any decimal number (1, 0.5, 1e3) from `lo` to `hi`.
CLI::Validator number_in(long double lo, long double hi);

/// Declares option `name` taking an integer in lo..hi into `target` (an integer, or a
/// std::optional of one); `value_name` is what the help shows after the option ("N").
/// Negative text is refused for unsigned targets too (CLI11 alone would wrap it around).
/// A value out of range or not an integer is a usage error that names the option and the
/// expected form ("--world-size: expected an integer from 1 to 65536, got 'abc'"), where
/// CLI11's own range check would say "Value abc not in range 1 to 65536".
template <class Target, class T>
CLI::Option* add_int_option(CLI::App& app, const std::string& name, Target& target, T lo, T hi, const std::string& value_name,
                            const std::string& description) {
  return app.add_option(name, target, description)->check(integer_in(static_cast<long double>(lo), static_cast<long double>(hi)))->option_text(value_name);
}

/// Makes `app` a ckpt program: the help layout, `-h, --help`, and `--version` printing
/// "<app name> <version>". Call before declaring options and subcommands (subcommands take
/// the layout and the help flag from their parent when they are added).
void setup(CLI::App& app);

/// Receives a usage error: the command it is about (e.g. "ckpt ls", or the program name) and
/// the message. The default prints "<command>: <message>" and "run '<command> --help' for
/// usage" on stderr.
using UsageReporter = std::function<void(const std::string& command, const std::string& message)>;
void print_usage_error(const std::string& command, const std::string& message);

/// Parses argv into `app`'s declarations. Returns nullopt when the program should go on, or
/// the exit code it should return now: 0 after --help or --version (printed on stdout),
/// kExitUsage after a usage error (given to `report`, default print_usage_error). A first
/// argument that names no subcommand of an `app` that has some is reported as an unknown
/// command. Blocks only to write the help; throws nothing CLI11 throws.
std::optional<int> parse(CLI::App& app, int argc, char** argv, const UsageReporter& report = {});

/// Runs a program's `body` and returns its exit status; whatever escapes it (a ckpt::Error, a
/// std::filesystem::filesystem_error, std::bad_alloc, any exception) is printed on stderr as
/// "<program>: <typed error>" (ckpt::to_error) and returns kExitError, so that no failure
/// ends a program with an uncaught exception (abort, exit 134). Every program's main() is
/// `return cli::guarded_main("ckpt-...", [&] { ... });`.
inline int guarded_main(std::string_view program, const std::function<int()>& body) noexcept {
  try {
    try {
      return body();
    } catch (...) {
      const Error e = to_error(std::current_exception());
      std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(program.size()), program.data(), e.what());
    }
  } catch (...) {
    std::fputs("out of memory\n", stderr);  // even composing the message failed
  }
  return kExitError;
}

/// The command a usage error after parsing is about: the app's name and that of the selected
/// subcommand, if any ("ckpt ls").
std::string command_name(const CLI::App& app);

}  // namespace ckpt::cli
