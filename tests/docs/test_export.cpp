// SPDX-License-Identifier: Apache-2.0
// A shared libckpt.so is compiled with hidden visibility and exports what its headers bracket
// with CKPT_API_BEGIN / CKPT_API_END (core/export.hpp): a header of lib/ckpt that declares
// something in namespace ckpt without the brackets would compile and link in a static build
// and leave its declarations out of the shared library. Every such header has them, around
// all of its namespace blocks, with no #include inside.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace fs = std::filesystem;

TEST_CASE("every header of the library brackets its declarations for export, with no include inside the brackets") {
  const fs::path lib = fs::path(CKPT_SOURCE_DIR) / "lib/ckpt";
  int checked = 0;
  for (const auto& e : fs::recursive_directory_iterator(lib)) {
    const std::string path = e.path().string();
    if (!e.is_regular_file() || !(path.ends_with(".hpp") || path.ends_with(".hpp.in"))) continue;
    if (path.find("/train/") != std::string::npos || path.find("/testing/") != std::string::npos) continue;  // static, in-tree only
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const auto ns = text.find("\nnamespace ckpt");
    if (ns == std::string::npos) continue;  // forwarding headers: includes only
    CAPTURE(path);
    const auto begin = text.find("\nCKPT_API_BEGIN\n");
    const auto end = text.rfind("\nCKPT_API_END\n");
    REQUIRE(begin != std::string::npos);
    REQUIRE(end != std::string::npos);
    CHECK(begin < ns);
    CHECK(text.rfind("\n}") < end);  // the last block closes inside
    CHECK(text.find("#include", begin) == std::string::npos);
    CHECK(text.find("#include \"ckpt/core/export.hpp\"") != std::string::npos);
    ++checked;
  }
  CHECK(checked > 60);
}
