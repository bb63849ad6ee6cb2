// SPDX-License-Identifier: Apache-2.0
#include "cli.hpp"

#include <cstdio>

#include <cctype>
#include <iostream>
#include <limits>
#include <memory>
#include <sstream>

#ifndef CKPT_APP_VERSION
#error "CKPT_APP_VERSION (the CMake project version) must be defined"
#endif

namespace ckpt::cli {

std::string_view version() noexcept { return CKPT_APP_VERSION; }

std::optional<std::uint64_t> parse_size(std::string_view s) noexcept {
  using u128 = unsigned __int128;
  constexpr u128 kMax = std::numeric_limits<std::uint64_t>::max();
  constexpr std::size_t kMaxFractionDigits = 18;  // 10^18 < 2^60: every product below fits in 128 bits
  auto digit = [&](std::size_t i) { return i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); };
  std::size_t i = 0;
  u128 whole = 0, fraction = 0, scale = 1;
  for (; digit(i); ++i) {
    whole = whole * 10 + static_cast<unsigned>(s[i] - '0');
    if (whole > kMax) return std::nullopt;
  }
  const std::size_t whole_digits = i;
  if (i < s.size() && s[i] == '.') {
    const std::size_t from = ++i;
    for (; digit(i); ++i) {
      if (i - from >= kMaxFractionDigits) return std::nullopt;
      fraction = fraction * 10 + static_cast<unsigned>(s[i] - '0');
      scale *= 10;
    }
    if (i == from) return std::nullopt;  // "1." or "."
  } else if (whole_digits == 0) {
    return std::nullopt;
  }
  std::string unit(s.substr(i));
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() == 3 && unit.ends_with("IB")) unit.resize(1);      // KiB -> K
  else if (unit.size() == 2 && unit.back() == 'B') unit.resize(1);  // KB -> K
  int shift = 0;
  if (unit.empty() || unit == "B") shift = 0;
  else if (unit == "K") shift = 10;
  else if (unit == "M") shift = 20;
  else if (unit == "G") shift = 30;
  else if (unit == "T") shift = 40;
  else if (unit == "P") shift = 50;
  else return std::nullopt;
  const u128 mult = u128{1} << shift;
  const u128 fraction_bytes = fraction * mult;
  if (fraction_bytes % scale != 0) return std::nullopt;  // a fraction of a byte
  const u128 bytes = whole * mult + fraction_bytes / scale;
  if (bytes == 0 || bytes > kMax) return std::nullopt;
  return static_cast<std::uint64_t>(bytes);
}

namespace {
// "1", "-3", "0.5", "1e3" as written (no trailing junk), or nullopt.
std::optional<long double> parse_number(const std::string& v, bool integer) {
  if (v.empty() || v.size() > 64) return std::nullopt;
  std::size_t i = (v[0] == '-' || v[0] == '+') ? 1 : 0;
  if (i == v.size()) return std::nullopt;
  if (integer) {
    for (std::size_t k = i; k < v.size(); ++k)
      if (v[k] < '0' || v[k] > '9') return std::nullopt;
  }
  try {
    std::size_t used = 0;
    const long double x = std::stold(v, &used);
    if (used != v.size()) return std::nullopt;
    return x;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::string bound_text(long double x) {
  char buf[64];
  if (x == static_cast<long double>(static_cast<long long>(x))) std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(x));
  else std::snprintf(buf, sizeof buf, "%.10Lg", x);
  return buf;
}

CLI::Validator number_validator(long double lo, long double hi, bool integer) {
  const std::string what = std::string(integer ? "an integer" : "a number") + " from " + bound_text(lo) + " to " + bound_text(hi);
  return CLI::Validator(
      [lo, hi, integer, what](std::string& v) -> std::string {
        const auto x = parse_number(v, integer);
        if (!x || *x < lo || *x > hi) return "expected " + what + ", got '" + v + "'";
        return {};
      },
      /*validator_desc=*/"", integer ? "INTEGER" : "NUMBER");
}
}  // namespace

CLI::Validator integer_in(long double lo, long double hi) { return number_validator(lo, hi, true); }
CLI::Validator number_in(long double lo, long double hi) { return number_validator(lo, hi, false); }

CLI::Option* add_size_option(CLI::App& app, const std::string& name, std::uint64_t& target, const std::string& description) {
  const CLI::Validator size(
      [](std::string& v) -> std::string {
        const auto n = parse_size(v);
        if (!n) return "'" + v + "' is not a size such as 1.5G, 500M, 64K or 1048576 (binary units: K = 1024)";
        v = std::to_string(*n);
        return {};
      },
      /*validator_desc=*/"", "SIZE");
  return app.add_option(name, target, description)->transform(size)->option_text("SIZE");
}

namespace {

// CLI11's layout with the usage line first, as a man page or `git help` starts, and the labels
// in the lower case the rest of ckpt's output uses.
class Formatter : public CLI::Formatter {
 public:
  Formatter() {
    label("Usage", "usage");
    label("OPTIONS", "options");
    label("SUBCOMMAND", "COMMAND");
    label("Positionals", "arguments");
    label("REQUIRED", "(required)");
    label("Excludes", "excludes");
    label("Needs", "needs");
    column_width(26);
  }
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    return make_usage(app, name) + "\n" + make_description(app) + make_positionals(app) + make_groups(app, mode) +
           make_subcommands(app, mode) + "\n" + make_footer(app);
  }
  std::string make_group(std::string group, bool is_positional, std::vector<const CLI::Option*> opts) const override {
    return CLI::Formatter::make_group(CLI::detail::to_lower(group), is_positional, std::move(opts));
  }
  std::string make_subcommands(const CLI::App* app, CLI::AppFormatMode mode) const override {
    return CLI::detail::find_and_replace(CLI::Formatter::make_subcommands(app, mode), "\nSubcommands:\n", "\ncommands:\n");
  }
  // An argument's name says what it is (ROOT, DIR): no type after it.
  std::string make_option(const CLI::Option* opt, bool is_positional) const override {
    if (!is_positional) return CLI::Formatter::make_option(opt, is_positional);
    std::stringstream out;
    CLI::detail::format_help(out, make_option_name(opt, true) + (opt->get_required() ? " " + get_label("REQUIRED") : ""),
                             make_option_desc(opt), column_width_);
    return out.str();
  }
  // Which options need or exclude which is said in their descriptions, in words.
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string opts = CLI::Formatter::make_option_opts(opt);
    for (const char* label : {" needs:", " excludes:"})
      if (const auto at = opts.find(label); at != std::string::npos) opts.erase(at);
    return opts;
  }
  // A footer given as a raw string literal may start and end with a newline: one blank line
  // before it, none after.
  std::string make_footer(const CLI::App* app) const override {
    std::string footer = app->get_footer();
    while (!footer.empty() && footer.front() == '\n') footer.erase(0, 1);
    while (!footer.empty() && footer.back() == '\n') footer.pop_back();
    return footer.empty() ? footer : footer + "\n";
  }
};

}  // namespace

void setup(CLI::App& app) {
  app.formatter(std::make_shared<Formatter>());
  app.set_help_flag("-h,--help", "this help");
  app.set_version_flag("--version", std::string(app.get_name()) + " " + std::string(version()), "the version of ckpt");
}

void print_usage_error(const std::string& command, const std::string& message) {
  std::cerr << command << ": " << message << "\nrun '" << command << " --help' for usage\n";
}

std::string command_name(const CLI::App& app) {
  std::string name = app.get_name();
  for (const CLI::App* sub = &app;;) {
    const auto selected = sub->get_subcommands();
    if (selected.empty()) return name;
    sub = selected.front();
    name += " " + sub->get_name();
  }
}

std::optional<int> parse(CLI::App& app, int argc, char** argv, const UsageReporter& report) {
  const UsageReporter& say = report ? report : UsageReporter(print_usage_error);
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
    std::string message = e.what();
    // CLI11 says "A subcommand is required" for `ckpt` and `ckpt frobnicate`: say what was wrong.
    if (!app.get_subcommands({}).empty() && app.get_subcommands().empty()) {
      if (argc <= 1) message = "no command given";
      else if (argv[1][0] != '-') message = "unknown command '" + std::string(argv[1]) + "'";
    }
    say(command_name(app), message);
    return kExitUsage;
  }
}

}  // namespace ckpt::cli
