// SPDX-License-Identifier: Apache-2.0
// The licence is stated where a user and a tool look for it: LICENSE at the top is the
// Apache License 2.0, and every source file of the project (C++, Python, CMake, shell) names
// it in an SPDX-License-Identifier line among its first two lines.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

bool is_source(const fs::path& p) {
  const std::string name = p.filename().string(), ext = p.extension().string();
  return ext == ".cpp" || ext == ".hpp" || ext == ".h" || ext == ".inc" || ext == ".py" || ext == ".sh" || ext == ".cmake" ||
         name == "CMakeLists.txt" || name.ends_with(".cmake.in") || name.ends_with(".pc.in") || name.ends_with(".hpp.in");
}

std::string first_lines(const fs::path& p, int n) {
  std::ifstream in(p);
  std::string line, out;
  for (int i = 0; i < n && std::getline(in, line); ++i) out += line + "\n";
  return out;
}

}  // namespace

TEST_CASE("LICENSE is the Apache License 2.0 and every source file carries its SPDX identifier") {
  const fs::path root = CKPT_SOURCE_DIR;
  const std::string licence = first_lines(root / "LICENSE", 4);
  CHECK(licence.find("Apache License") != std::string::npos);
  CHECK(licence.find("Version 2.0, January 2004") != std::string::npos);
  std::vector<fs::path> files;
  for (const char* top : {"lib", "apps", "tests", "bench", "examples", "cmake"})
    for (auto it = fs::recursive_directory_iterator(root / top); it != fs::recursive_directory_iterator(); ++it) {
      const std::string name = it->path().filename().string();
      if (it->is_directory() && (name == "corpus" || name == "data" || name == "results" || name == "__pycache__")) it.disable_recursion_pending();
      else if (it->is_regular_file() && is_source(it->path())) files.push_back(it->path());
    }
  for (const auto& e : fs::directory_iterator(root / "scripts"))
    if (e.is_regular_file()) files.push_back(e.path());
  files.push_back(root / ".ci/run");
  files.push_back(root / "CMakeLists.txt");
  CHECK(files.size() > 300);
  int missing = 0;
  for (const auto& f : files)
    if (first_lines(f, 2).find("SPDX-License-Identifier: Apache-2.0") == std::string::npos) {
      ++missing;
      MESSAGE("no SPDX-License-Identifier line in the first two lines of " << f.string());
    }
  CHECK(missing == 0);
}
