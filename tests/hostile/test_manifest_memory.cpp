// SPDX-License-Identifier: Apache-2.0
// A manifest under the size limit whose JSON would need more memory than the process has:
// refused as malformed by the scan that counts its content before any of it is parsed
// (format/manifest_limits.hpp), naming the manifest, within a small address-space budget
// (before the limits, it was std::bad_alloc, then an out-of-memory error).
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "hostile/corpus.hpp"
#include "support/test_support.hpp"

using namespace ckpt;

TEST_CASE("a manifest whose JSON would exhaust memory is refused as malformed naming the manifest, within 384 MiB") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  MESSAGE("skipped: sanitizers reserve terabytes of address space");
  return;
#endif
  hostile::GoodRoot good = hostile::make_good_root();
  const std::string mpath = good.manifest_path();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // 40M zeros in an extra field: 80 MB of text (under the size limit), 640 MB and more as a JSON DOM, against an
    // address space 384 MiB above what the process maps now.
    {
      auto m = hostile::manifest_object(good.fs, good.latest_dir);
      std::string text = boost::json::serialize(m);
      const std::string zeros = [] {
        std::string z = "[0";
        z.reserve(80u << 20);
        for (int i = 1; i < 40'000'000; ++i) z += ",0";
        return z + "]";
      }();
      text.insert(text.rfind('}'), ",\"bulk\":{\"a\":" + zeros + "}");
      good.fs.put_file(mpath, text);
    }
    if (!test::limit_address_space(384ull << 20)) ::_exit(4);
    try {
      CheckpointReader::open(good.fs, good.latest_dir);
      ::_exit(2);
    } catch (const Error& e) {
      const bool ok = e.code() == Errc::malformed_manifest && e.file() == mpath &&
                      e.detail().find("outside the manifest schema") != std::string::npos;
      if (!ok) std::fprintf(stderr, "wrong error: %s\n", e.what());
      ::_exit(ok ? 0 : 1);
    } catch (...) {
      ::_exit(3);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // 1: another error, 2: accepted, 3: not a ckpt::Error
}
