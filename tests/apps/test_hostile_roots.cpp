// SPDX-License-Identifier: Apache-2.0
// Every program given a root it cannot use (a regular file, a path under one, a directory the
// user cannot read) prints the typed error and exits 1: never an uncaught exception (abort,
// exit 134) or any status >= 128. A root the user can read but not write is read as any other
// (opening never writes).
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "support/test_support.hpp"

namespace {
const std::string kBin = std::string(CKPT_TEST_BINARY_DIR) + "/bin/";

struct Outcome {
  int status = 0;
  std::string out;
};
Outcome run(const std::string& cmd) {
  Outcome o;
  o.out = ckpt::test::run_command(cmd + " 2>&1", &o.status);
  return o;
}

// One program's invocation against a bad root and the typed message it must print.
struct Use {
  std::string args;  // after kBin
  std::string want;  // "<program>: <errc name>: <path>..."
};

void check_refused(const Use& u, const std::string& prefix = {}) {
  CAPTURE(u.args);
  const Outcome o = run(prefix + kBin + u.args);
  CAPTURE(o.out);
  CHECK(o.status == 1);
  CHECK(o.out.find(u.want) != std::string::npos);
  CHECK(o.out.find("terminate called") == std::string::npos);
}

bool setpriv_available() { return ::geteuid() == 0 && ::access("/usr/bin/setpriv", X_OK) == 0; }
}  // namespace

TEST_CASE("every program given a regular file as its root prints the typed I/O error and exits 1") {
  ckpt::test::TempDir dir;
  const std::string file = (dir / "a-file").string();
  ckpt::test::write_all(file, {'x'});
  const std::vector<Use> uses = {
      {"ckpt-demo --steps 2 --dir " + file, "ckpt-demo: I/O error: " + file + ": mkdir -p failed: Not a directory"},
      {"ckpt-demo --steps 2 --dir " + file + "/sub", "ckpt-demo: I/O error: " + file + "/sub: mkdir -p failed: Not a directory"},
      {"ckpt-demo --steps 2 --resume --dir " + file, "ckpt-demo: I/O error: " + file},
      {"ckpt-training-loop --steps 2 --dir " + file, "ckpt-training-loop: I/O error: " + file + ": mkdir -p failed: Not a directory"},
      {"ckpt-quickstart --dir " + file + "/sub", "ckpt-quickstart: I/O error: " + file + "/sub: mkdir -p failed: Not a directory"},
      {"ckpt-bench --dir " + file + " --size 1M --repeats 1 --saves 1 --modes sync --no-load --no-cold-pool --soak 0",
       "ckpt-bench: I/O error: " + file + ": cannot create directories: Not a directory"},
      {"ckpt ls " + file, "ckpt ls: I/O error: " + file + ": opendir failed: Not a directory"},
      {"ckpt verify " + file + "/step-0000000010", "ckpt verify: I/O error: " + file + "/step-0000000010/manifest.json"},
  };
  for (const auto& u : uses) check_refused(u);
  CHECK(std::filesystem::is_regular_file(file));  // nothing replaced it
}

TEST_CASE("every program given a root its user cannot read prints the typed permission error and exits 1") {
  if (!setpriv_available()) {
    MESSAGE("needs root and setpriv to run the programs as another user; skipped");
    return;
  }
  ckpt::test::TempDir dir;
  ::chmod(dir.path().c_str(), 0755);
  const std::string root = (dir / "private").string();
  std::filesystem::create_directories(root + "/step-0000000010");
  ::chmod(root.c_str(), 0700);  // owned by root: uid 65534 can neither list nor enter it
  const std::string as_nobody = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups ";
  // The programs must be runnable by that user at all (a build tree under a private directory
  // is not): else this test says nothing.
  if (run(as_nobody + kBin + "ckpt --version").status != 0) {
    MESSAGE("the build tree is not accessible to uid 65534; skipped");
    return;
  }
  const std::vector<Use> uses = {
      // A fresh run first asks whether the root holds a committed checkpoint (a root it
      // cannot read is never taken for an empty one).
      {"ckpt-demo --steps 2 --dir " + root, "ckpt-demo: I/O error: " + root + "/latest: lstat failed: Permission denied"},
      {"ckpt-demo --steps 2 --resume --dir " + root, "ckpt-demo: I/O error: " + root + "/latest: lstat failed: Permission denied"},
      {"ckpt-training-loop --steps 2 --dir " + root, "ckpt-training-loop: I/O error: " + root},
      {"ckpt ls " + root, "ckpt ls: I/O error: " + root + "/latest: lstat failed: Permission denied"},
      {"ckpt verify " + root + "/step-0000000010", "ckpt verify: I/O error: " + root + "/step-0000000010: lstat failed: Permission denied"},
  };
  for (const auto& u : uses) check_refused(u, as_nobody);
}

// Every file and directory under `root` with its bytes (directories as "DIR/"), for "nothing
// changed".
std::map<std::string, std::string> tree_of(const std::string& root) {
  std::map<std::string, std::string> t;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    const std::string rel = std::filesystem::relative(e.path(), root).string();
    if (e.is_directory()) t[rel + "/"] = {};
    else {
      const auto bytes = ckpt::test::read_all(e.path());
      t[rel] = std::string(bytes.begin(), bytes.end());
    }
  }
  return t;
}

TEST_CASE("a root another user can read but not write is listed, inspected and verified by that user, a directory and a node set, and nothing in it changes") {
  if (!setpriv_available()) {
    MESSAGE("needs root and setpriv to run the programs as another user; skipped");
    return;
  }
  const std::string as_nobody = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups ";
  if (run(as_nobody + kBin + "ckpt --version").status != 0) {
    MESSAGE("the build tree is not accessible to uid 65534; skipped");
    return;
  }
  ckpt::test::TempDir dir;
  ::chmod(dir.path().c_str(), 0755);
  const std::string run_root = (dir / "run").string(), set_root = (dir / "set").string();
  REQUIRE(run(kBin + "ckpt-demo --steps 10 --save-every 5 --world-size 2 --dir " + run_root).status == 0);
  REQUIRE(run(kBin + "ckpt-demo --steps 10 --save-every 5 --world-size 4 --nodes 4 --redundancy rs:3+1 --dir " + set_root).status == 0);
  for (const std::string& root : {run_root, set_root}) {
    CAPTURE(root);
    // Owned by root and not writable by uid 65534 (checked: the user's own write is refused).
    REQUIRE(run(as_nobody + "touch " + root + "/x").status != 0);
    const auto before = tree_of(root);
    const Outcome ls = run(as_nobody + kBin + "ckpt ls " + root);
    CAPTURE(ls.out);
    CHECK(ls.status == 0);
    CHECK(ls.out.find("step-0000000010") != std::string::npos);
    CHECK(ls.out.find("(latest)") != std::string::npos);
    const Outcome inspect = run(as_nobody + kBin + "ckpt inspect " + root);
    CAPTURE(inspect.out);
    CHECK(inspect.status == 0);
    CHECK(inspect.out.find("step        10") != std::string::npos);
    const Outcome verify = run(as_nobody + kBin + "ckpt verify --verify full " + root);
    CAPTURE(verify.out);
    CHECK(verify.status == 0);
    CHECK(verify.out.rfind("OK ", 0) == 0);
    CHECK(tree_of(root) == before);
  }
}

TEST_CASE("a step directory that latest names as a symlink to a checkpoint outside the root is refused by verify, ls and --resume") {
  ckpt::test::TempDir dir;
  const std::string root = (dir / "run").string(), outside = (dir / "outside").string();
  REQUIRE(run(kBin + "ckpt-demo --steps 2 --save-every 2 --dir " + root).status == 0);
  const std::string step = root + "/step-0000000002";
  std::filesystem::create_directories(outside);
  std::filesystem::rename(step, outside + "/step-0000000002");
  std::filesystem::create_directory_symlink(outside + "/step-0000000002", step);
  const std::string want = "unsafe path: " + step + ": step directory is a symlink: expected directory, actual symlink";
  check_refused({"ckpt verify " + step, "ckpt verify: " + want});
  check_refused({"ckpt verify --full " + step, "ckpt verify: " + want});
  check_refused({"ckpt ls " + root, "    " + want});
  check_refused({"ckpt-demo --resume --dir " + root, "ckpt-demo: " + want});
  // The checkpoint behind the link was a good one: only the link was refused.
  CHECK(run(kBin + "ckpt verify --full " + outside + "/step-0000000002").status == 0);
}
