// SPDX-License-Identifier: Apache-2.0
// The README's examples cannot rot: every code block introduced by "<!-- from FILE -->" must
// appear line for line (ignoring indentation and blank lines) in FILE, which CMake builds.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace {
std::string read(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string normalise(const std::string& text) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) {
    const auto b = line.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    out += line.substr(b, line.find_last_not_of(" \t") - b + 1) + "\n";
  }
  return out;
}
}  // namespace

TEST_CASE("README code blocks taken from a source file match that file") {
  const std::string root = CKPT_SOURCE_DIR;
  const std::string readme = read(root + "/README.md");
  const std::regex block(R"(<!-- from (\S+) -->\s*```\w*\n([\s\S]*?)```)");
  int found = 0;
  for (std::sregex_iterator it(readme.begin(), readme.end(), block), end; it != end; ++it, ++found) {
    const std::string file = (*it)[1];
    CAPTURE(file);
    CHECK(normalise(read(root + "/" + file)).find(normalise((*it)[2])) != std::string::npos);
  }
  CHECK(found >= 1);
}
