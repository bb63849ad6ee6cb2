// SPDX-License-Identifier: Apache-2.0
// check_rank / check_size, to_error / with_typed_errors (what escapes std::filesystem and the
// allocator becomes a ckpt::Error naming the path), and the JSON an error crosses processes as.
#include <doctest/doctest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <new>
#include <set>
#include <stdexcept>
#include <string>

#include "ckpt/core/error.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using test::expect_error;

TEST_CASE("check_rank accepts 0..N-1 and refuses anything else naming the file, the range and the rank") {
  CHECK_NOTHROW(check_rank(0, 1, "rank"));
  CHECK_NOTHROW(check_rank(3, 4, "rank"));
  for (int bad : {-1, 4, 1 << 30}) {
    const Error e = expect_error([&] { check_rank(bad, 4, "save rank", "/ckpts/run1"); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.file() == "/ckpts/run1");
    CHECK(e.detail() == "save rank");
    CHECK(e.expected() == "0..3");
    CHECK(e.actual() == std::to_string(bad));
  }
  const Error none = expect_error([] { check_rank(0, 0, "shard rank"); });
  CHECK(none.expected() == "none (world size 0)");
}

TEST_CASE("check_size refuses a size other than the recorded one as size_mismatch in bytes") {
  CHECK_NOTHROW(check_size(4096, 4096, "shard size", "/c/rank-00000-of-00001.safetensors"));
  const Error e = expect_error([] { check_size(4096, 100, "shard size", "/c/rank-00000-of-00001.safetensors"); });
  CHECK(e.code() == Errc::size_mismatch);
  CHECK(std::string(e.what()) == "size mismatch: /c/rank-00000-of-00001.safetensors: shard size: expected 4096 bytes, actual 100 bytes");
}

namespace {
template <class E>
Error typed(const E& e) {
  return to_error(std::make_exception_ptr(e));
}
}  // namespace

TEST_CASE("a std::filesystem error becomes a typed error naming its path, the operation and the errno") {
  std::error_code ec;
  std::filesystem::directory_iterator("/proc/self/status/x", ec);
  REQUIRE(ec);
  const Error e = typed(std::filesystem::filesystem_error("directory iterator cannot open directory", "/proc/self/status/x", ec));
  CHECK(e.code() == Errc::io_error);
  CHECK(e.file() == "/proc/self/status/x");
  CHECK(e.detail() == "directory iterator cannot open directory: Not a directory");
  CHECK(e.sys_errno() == ENOTDIR);
  CHECK(std::string(e.what()) == "I/O error: /proc/self/status/x: directory iterator cannot open directory: Not a directory");

  const Error gone = typed(std::filesystem::filesystem_error("cannot copy", "/a", "/b", std::make_error_code(std::errc::no_such_file_or_directory)));
  CHECK(gone.code() == Errc::not_found);
  CHECK(gone.file() == "/a -> /b");
  const Error full = typed(std::filesystem::filesystem_error("cannot copy", "/a", std::make_error_code(std::errc::no_space_on_device)));
  CHECK(full.code() == Errc::no_space);
}

TEST_CASE("std::bad_alloc becomes an out-of-memory error, and with_typed_errors names the file it was about") {
  const Error e = typed(std::bad_alloc());
  CHECK(e.code() == Errc::io_error);
  CHECK(e.sys_errno() == ENOMEM);
  CHECK(e.detail().find("out of memory") != std::string::npos);
  try {
    with_typed_errors("/ckpt/step-0000000010/manifest.json", []() -> int { throw std::bad_alloc(); });
    FAIL("nothing thrown");
  } catch (const Error& err) {
    CHECK(err.code() == Errc::io_error);
    CHECK(err.file() == "/ckpt/step-0000000010/manifest.json");
    CHECK(std::string(err.what()).find("out of memory") != std::string::npos);
  }
  // A ckpt::Error passes unchanged; a value is returned as is.
  const Error own(Errc::checksum_mismatch, "/x", "chunk 3");
  CHECK_THROWS_WITH_AS(with_typed_errors("/y", [&]() -> int { throw own; }), own.what(), Error);
  CHECK(with_typed_errors("/y", [] { return 7; }) == 7);
}

TEST_CASE("an error crosses a process boundary as JSON with its code, file, detail, expected, actual and errno") {
  const Error e(Errc::conflict, "s3://b/p/latest", "PUT", "no object under the key", "HTTP 412 PreconditionFailed", 17);
  const Error back = error_from_json(error_to_json(e));
  CHECK(back.code() == Errc::conflict);
  CHECK(std::string(back.what()) == e.what());
  CHECK(back.sys_errno() == 17);
}

// Read before as the number cut to 32 bits: code 2^32 + 1 as missing_shard, errno 2^32 + 2 as
// ENOENT.
TEST_CASE("an error report whose code or errno is out of range reads as comm_error and errno 0, not as a number cut to 32 bits") {
  const Error e = error_from_json(R"({"code":4294967297,"file":"f","detail":"d","expected":"","actual":"","errno":4294967298})");
  CHECK(e.code() == Errc::comm_error);
  CHECK(e.file() == "f");
  CHECK(e.sys_errno() == 0);
  CHECK(error_from_json(R"({"code":16,"detail":"d"})").code() == Errc::comm_error);
  CHECK(error_from_json(R"({"code":-1,"detail":"d"})").code() == Errc::comm_error);
  CHECK(error_from_json(R"({"code":15,"detail":"d"})").code() == Errc::conflict);
}

// fuzz_wire: corpus/wire/finding_error_json_not_utf8 (the error JSON "\xcd."). error_to_json
// wrote the bytes as they were, and error_from_json refused them: an error naming a path that
// is not UTF-8 crossed a process as "unreadable error report".
TEST_CASE("an error whose fields are not UTF-8 (a path of any bytes) crosses as JSON byte for byte") {
  const Error e(Errc::no_space, "/ckpt/\xcd\xff/rank-0.safetensors", "write failed", "", "\xcd.", ENOSPC);
  const Error back = error_from_json(error_to_json(e));
  CHECK(back.code() == Errc::no_space);
  CHECK(back.file() == e.file());
  CHECK(back.actual() == "\xcd.");
  CHECK(back.sys_errno() == ENOSPC);
  const Error unreadable = error_from_json("\xcd.");
  CHECK(unreadable.code() == Errc::comm_error);
  CHECK(error_from_json(error_to_json(unreadable)).actual() == "\xcd.");
}

TEST_CASE("every code has one identifier and one name, and a message begins with its name") {
  std::set<std::string> ids, names;
  for (int c = 0; c <= static_cast<int>(kLastErrc); ++c) {
    const auto code = static_cast<Errc>(c);
    ids.emplace(errc_id(code));
    names.emplace(errc_name(code));
    const Error e(code, "/ckpt/f", "d", "x", "y");
    CAPTURE(e.what());
    CHECK(std::string_view(e.what()).starts_with(std::string(errc_name(code)) + ": /ckpt/f"));
  }
  CHECK(ids.size() == static_cast<std::size_t>(kLastErrc) + 1);
  CHECK(names.size() == ids.size());
  CHECK(errc_id(Errc::checksum_mismatch) == "checksum_mismatch");
  CHECK(errc_name(Errc::checksum_mismatch) == "checksum mismatch");
  CHECK(errc_id(Errc::io_error) == "io_error");
  CHECK(errc_name(Errc::io_error) == "I/O error");
}

namespace {
// Every `code = "..."` of lib/python/ckpt/errors.py, the Python exceptions (a class attribute
// of each class, indented).
std::set<std::string> python_error_codes() {
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/lib/python/ckpt/errors.py");
  REQUIRE_MESSAGE(in, "cannot read lib/python/ckpt/errors.py");
  std::set<std::string> codes;
  const std::string key = "code = \"";
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find(key);
    if (at == std::string::npos || line.find_first_not_of(' ') != at) continue;
    const auto from = at + key.size();
    codes.insert(line.substr(from, line.find('"', from) - from));
  }
  return codes;
}
}  // namespace

// One spelling everywhere: errc_id is the `code` of the ckpt tool's --json errors
// (tests/apps/test_json_output.cpp) and of the Python exceptions, each a class of errors.py.
TEST_CASE("the Python exceptions define one class per error code with exactly the errc_id of the code, and no code errc_id lacks") {
  const std::set<std::string> python = python_error_codes();
  std::set<std::string> ids;
  for (int c = 0; c <= static_cast<int>(kLastErrc); ++c) {
    const std::string id(errc_id(static_cast<Errc>(c)));
    CAPTURE(id);
    CHECK(python.count(id) == 1);
    ids.insert(id);
  }
  // What Python has besides: the base class's "error" and "timeout" (a wait's timeout=, raised
  // by the Python side only; docs/json-output.md lists it).
  for (const auto& code : python) {
    CAPTURE(code);
    CHECK((ids.count(code) == 1 || code == "error" || code == "timeout"));
  }
  CHECK(python.size() == ids.size() + 2);
}
