// SPDX-License-Identifier: Apache-2.0
// A directory mirrored through a real FUSE mount, for the tests of the load and save paths on
// file systems that treat O_DIRECT their own way.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace ckpt::test {

/// `source` mirrored at `mountpoint` (created if missing) through FUSE for the object's
/// lifetime: the test file system (tests/support/fuse_test_fs.cpp, bin/ckpt-test-fuse) in one
/// of its modes, or bindfs (a real passthrough). The daemon runs in the foreground as a child
/// that gets SIGTERM when this thread ends (PR_SET_PDEATHSIG), so a crashed or killed test
/// leaves no mount behind; the destructor unmounts (fusermount3 -u, lazily if the mount is
/// busy) and reaps the daemon. Exits the test process with 77 (ctest's skip), printing why,
/// where /dev/fuse is missing or the kernel refuses FUSE mounts; a daemon that fails for any
/// other reason (bindfs not installed, ckpt-test-fuse not built) fails the test.
class FuseMount {
 public:
  enum class Kind {
    refuse_direct_io,    ///< takes O_DIRECT opens, fails their reads and writes with EINVAL
    short_direct_reads,  ///< O_DIRECT reads return 512 bytes short of the file; an offset off 4096 is EINVAL
    refuse_direct_open,  ///< O_DIRECT opens fail with EINVAL (tmpfs before Linux 6.6)
    bindfs,              ///< bindfs: the caller's flags passed through to the source
  };
  /// `from` (the test file system only): O_DIRECT requests that start before this byte of a
  /// file go through; the mode applies from there on.
  FuseMount(const std::filesystem::path& source, const std::filesystem::path& mountpoint, Kind kind, std::uint64_t from = 0);
  ~FuseMount();
  FuseMount(const FuseMount&) = delete;
  FuseMount& operator=(const FuseMount&) = delete;
  const std::filesystem::path& path() const { return mnt_; }

 private:
  std::filesystem::path mnt_;
  std::string log_;  // the daemon's stdout and stderr
  pid_t pid_ = -1;
};

/// The name of a FuseMount::Kind, for test messages.
const char* kind_name(FuseMount::Kind kind);

}  // namespace ckpt::test
