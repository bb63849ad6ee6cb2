// SPDX-License-Identifier: Apache-2.0
#include "ckpt/core/error.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <new>

#include <boost/json.hpp>
#include <iterator>

namespace ckpt {

namespace {
// Each code's identifier (its enumerator's name) and its name in messages, in enum order:
// the one table errc_id, errc_name, the tool's --json and the Python exceptions read.
struct ErrcNames {
  Errc code;
  std::string_view id, name;
};
constexpr ErrcNames kErrcNames[] = {
    {Errc::world_size_mismatch, "world_size_mismatch", "world size mismatch"},
    {Errc::missing_shard, "missing_shard", "missing shard"},
    {Errc::size_mismatch, "size_mismatch", "size mismatch"},
    {Errc::checksum_mismatch, "checksum_mismatch", "checksum mismatch"},
    {Errc::malformed_manifest, "malformed_manifest", "malformed manifest"},
    {Errc::malformed_shard, "malformed_shard", "malformed shard"},
    {Errc::unsupported_schema, "unsupported_schema", "unsupported schema"},
    {Errc::unsafe_path, "unsafe_path", "unsafe path"},
    {Errc::io_error, "io_error", "I/O error"},
    {Errc::no_space, "no_space", "no space left"},
    {Errc::not_found, "not_found", "not found"},
    {Errc::invalid_argument, "invalid_argument", "invalid argument"},
    {Errc::aborted, "aborted", "aborted"},
    {Errc::comm_error, "comm_error", "communication error"},
    {Errc::busy, "busy", "busy"},
    {Errc::conflict, "conflict", "conflict"},
};
static_assert(std::size(kErrcNames) == static_cast<std::size_t>(kLastErrc) + 1, "a code without a name");
constexpr bool in_enum_order() {
  for (std::size_t i = 0; i < std::size(kErrcNames); ++i)
    if (static_cast<std::size_t>(kErrcNames[i].code) != i) return false;
  return true;
}
static_assert(in_enum_order(), "kErrcNames is indexed by code");

const ErrcNames* names_of(Errc code) noexcept {
  const auto i = static_cast<std::size_t>(code);
  return i < std::size(kErrcNames) ? &kErrcNames[i] : nullptr;
}
}  // namespace

std::string_view errc_name(Errc code) noexcept {
  const auto* n = names_of(code);
  return n ? n->name : "unknown error";
}

std::string_view errc_id(Errc code) noexcept {
  const auto* n = names_of(code);
  return n ? n->id : "unknown";
}

namespace {
std::string compose(Errc code, const std::string& file, const std::string& detail,
                    const std::string& expected, const std::string& actual) {
  std::string m(errc_name(code));
  if (!file.empty()) m += ": " + file;
  if (!detail.empty()) m += ": " + detail;
  if (!expected.empty() || !actual.empty()) {
    m += ": expected " + (expected.empty() ? std::string("-") : expected);
    m += ", actual " + (actual.empty() ? std::string("-") : actual);
  }
  return m;
}
}  // namespace

Error::Error(Errc code, std::string file, std::string detail, std::string expected,
             std::string actual, int sys_errno)
    : std::runtime_error(std::string()),
      code_(code),
      message_(compose(code, file, detail, expected, actual)),
      file_(std::move(file)),
      detail_(std::move(detail)),
      expected_(std::move(expected)),
      actual_(std::move(actual)),
      errno_(sys_errno) {}

void throw_errno(int err, std::string_view action, std::string_view file) {
  const Errc code = (err == ENOSPC || err == EDQUOT) ? Errc::no_space : Errc::io_error;
  throw Error(code, std::string(file), std::string(action) + " failed: " + std::strerror(err), {},
              {}, err);
}

void throw_invalid(std::string_view what) {
  throw Error(Errc::invalid_argument, {}, std::string(what));
}

void check_rank(int rank, int world, std::string_view what, std::string_view file) {
  if (rank >= 0 && rank < world) return;
  throw Error(Errc::invalid_argument, std::string(file), std::string(what),
              world > 0 ? "0.." + std::to_string(world - 1) : "none (world size " + std::to_string(world) + ")",
              std::to_string(rank));
}

void check_size(std::uint64_t expected, std::uint64_t actual, std::string_view what, std::string_view file) {
  if (expected == actual) return;
  throw Error(Errc::size_mismatch, std::string(file), std::string(what), std::to_string(expected) + " bytes",
              std::to_string(actual) + " bytes");
}

std::string error_to_json(const Error& e) {
  return boost::json::serialize(boost::json::object{{"code", static_cast<int>(e.code())},
                                                    {"file", e.file()},
                                                    {"detail", e.detail()},
                                                    {"expected", e.expected()},
                                                    {"actual", e.actual()},
                                                    {"errno", e.sys_errno()}});
}

Error error_from_json(std::string_view text) {
  boost::system::error_code ec;
  boost::json::parse_options opt;
  opt.allow_invalid_utf8 = true;  // error_to_json writes the fields' bytes as they are
  const auto v = boost::json::parse(text, ec, {}, opt);
  const auto* o = ec ? nullptr : v.if_object();
  if (!o || !o->contains("code")) return Error(Errc::comm_error, {}, "unreadable error report", "error JSON", std::string(text));
  auto str = [&](const char* k) -> std::string {
    const auto* f = o->if_contains(k);
    return f && f->is_string() ? std::string(f->get_string()) : std::string();
  };
  // A number out of range is not cut to one in range: an unknown code is comm_error, an
  // errno that is no int is 0.
  auto integer = [&](const char* k, std::int64_t lo, std::int64_t hi) -> std::optional<int> {
    const auto* f = o->if_contains(k);
    if (!f || !f->is_int64() || f->get_int64() < lo || f->get_int64() > hi) return std::nullopt;
    return static_cast<int>(f->get_int64());
  };
  const auto code = integer("code", 0, static_cast<int>(kLastErrc));
  return Error(code ? static_cast<Errc>(*code) : Errc::comm_error, str("file"), str("detail"), str("expected"), str("actual"),
               integer("errno", std::numeric_limits<int>::min(), std::numeric_limits<int>::max()).value_or(0));
}

Error to_error(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err;
  } catch (const std::filesystem::filesystem_error& ex) {
    // "filesystem error: directory iterator cannot open directory: Not a directory [/x]":
    // the path and the errno are what the user needs; the code follows throw_errno's rule.
    const int err = ex.code().category() == std::generic_category() || ex.code().category() == std::system_category() ? ex.code().value() : 0;
    const Errc code = (err == ENOSPC || err == EDQUOT) ? Errc::no_space : err == ENOENT ? Errc::not_found : Errc::io_error;
    std::string file = ex.path1().string();
    if (!ex.path2().empty()) file += " -> " + ex.path2().string();
    // The operation as libstdc++ words it, without its prefix and the bracketed paths.
    std::string_view what = ex.what();
    if (what.starts_with("filesystem error: ")) what.remove_prefix(18);
    if (const auto bracket = what.find(" ["); bracket != std::string_view::npos) what = what.substr(0, bracket);
    return Error(code, std::move(file), what.empty() ? ex.code().message() : std::string(what), {}, {}, err);
  } catch (const std::bad_alloc&) {
    return Error(Errc::io_error, {}, "out of memory (std::bad_alloc)", {}, {}, ENOMEM);
  } catch (const std::exception& ex) {
    return Error(Errc::io_error, {}, ex.what());
  } catch (...) {
    return Error(Errc::io_error, {}, "unknown exception");
  }
}

}  // namespace ckpt
