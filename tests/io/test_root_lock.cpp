// SPDX-License-Identifier: Apache-2.0
// The writer lock of a root (store/root_lock.hpp): one writer at a time, in this process and
// across processes; the crash cleanup only under it; temporaries that say who made them.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>

#include "ckpt/store/store.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/root_lock.hpp"
#include "io_fixture.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {

const std::string kMyPid = std::to_string(::getpid());

// A file system whose try_lock fails as a file system without locks does.
class NoLockFileSystem final : public FileSystemWrapper {
 public:
  using FileSystemWrapper::FileSystemWrapper;
  std::unique_ptr<FileLock> try_lock(const std::string& p, std::string_view) override { throw_errno(ENOSYS, "flock", p); }
};

// A child process that runs `fn` and then waits (holding whatever fn took) until killed.
// The parent continues once fn has returned in the child.
pid_t child_that(const std::function<void()>& fn) {
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(ready[0]);
    try {
      fn();
    } catch (...) {
      ::_exit(3);
    }
    const char c = 'x';
    if (::write(ready[1], &c, 1) != 1) ::_exit(4);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char c = 0;
  const bool ok = ::read(ready[0], &c, 1) == 1;
  ::close(ready[0]);
  REQUIRE_MESSAGE(ok, "the child failed before it was ready");
  return pid;
}

void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

std::vector<std::string> temporaries_in(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (is_temporary_name(e.path().filename().string())) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void check_busy(const Error& e, const std::string& root, const std::string& pid) {
  CHECK(e.code() == Errc::busy);
  CHECK(e.file() == root);
  CHECK(e.detail().find(join_path(root, kLockName)) != std::string::npos);
  CHECK(e.expected() == "no other writer");
  CHECK(e.actual().starts_with("pid " + pid + " "));
  CHECK(e.actual().find("on host " + host_name()) != std::string::npos);
  CHECK(std::string(e.what()).find("pid " + pid) != std::string::npos);
}

}  // namespace

TEST_CASE("a second lock on a locked root is refused with busy naming the root and the holder, on every file system") {
  test::TempDir dir;
  MemoryFileSystem mem;
  for (FileSystem* f : {&posix_file_system(), static_cast<FileSystem*>(&mem)}) {
    const std::string root = f == &mem ? "/mem/root" : (dir / "root").string();
    CAPTURE(root);
    std::optional<RootLock> first(std::in_place, *f, root);  // creates the root
    CHECK(first->held());
    CHECK(first->exclusive());
    CHECK(f->stat(root)->type == EntryType::directory);
    check_busy(test::error_of([&] { RootLock second(*f, root); }), root, kMyPid);
    // Released on destruction: the next writer gets it.
    first.reset();
    RootLock third(*f, root);
    CHECK(third.held());
  }
}

TEST_CASE("the lock file records the holder, stays after release, and is neither a checkpoint nor a temporary") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture fx(1, 3);
  save_checkpoint_sync(posix_file_system(), root, fx.request);
  {
    RootLock lock(posix_file_system(), root);
    const auto holder = read_lock_holder(posix_file_system(), lock.lock_path());
    REQUIRE(holder);
    CHECK(holder->pid == ::getpid());
    CHECK(holder->host == host_name());
    CHECK_FALSE(holder->program.empty());
    CHECK(holder->since.size() == 24);  // 2025-01-01T12:00:00.000Z
    CHECK(holder->describe().starts_with("pid " + kMyPid + " (" + holder->program + ") on host "));
  }
  CHECK(fs::is_regular_file(dir / ".lock"));
  CHECK_FALSE(is_temporary_name(std::string(kLockName)));
  CHECK_FALSE(parse_checkpoint_dir_name(kLockName));
  const auto listed = list_checkpoints(posix_file_system(), root);
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].name == "step-0000000003");
  // Crash cleanup and rotation leave it alone.
  CHECK(prepare_root(posix_file_system(), RootLock(posix_file_system(), root)).empty());
  CHECK(rotate_checkpoints(posix_file_system(), root, 1, "step-0000000003").empty());
  CHECK(fs::is_regular_file(dir / ".lock"));
  CHECK(parse_lock_record("garbage").pid == 0);
  CHECK(LockHolder{}.describe().starts_with("an unknown process"));
}

TEST_CASE("a lock moved to another object stays held, and the moved-from object holds nothing") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  RootLock a(posix_file_system(), root);
  RootLock b = std::move(a);
  CHECK_FALSE(a.held());
  CHECK(b.held());
  CHECK(b.root() == root);
  check_busy(test::error_of([&] { RootLock c(posix_file_system(), root); }), root, kMyPid);
  b.release();
  b.release();  // idempotent
  CHECK_FALSE(b.held());
  RootLock c(posix_file_system(), root);
  CHECK(c.held());
}

TEST_CASE("a lock another process holds refuses this one at once, and the kernel drops it when that process dies") {
  test::TempDir dir;
  const std::string root = (dir / "root").string();
  const pid_t child = child_that([&] { new RootLock(posix_file_system(), root); });  // held until killed
  check_busy(test::error_of([&] { RootLock mine(posix_file_system(), root); }), root, std::to_string(child));
  // A refused writer removes nothing: the child's record is what the file still says.
  CHECK(read_lock_holder(posix_file_system(), join_path(root, kLockName))->pid == child);
  kill_and_reap(child);
  RootLock mine(posix_file_system(), root);
  CHECK(read_lock_holder(posix_file_system(), mine.lock_path())->pid == ::getpid());
}

TEST_CASE("a lock held by a program that writes no record is not blamed on the stale record's pid") {
  test::TempDir dir;
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  const std::string record = "pid " + std::to_string(gone) + "\nhost " + host_name() + "\nprogram ckpt-demo\n";
  test::write_all(dir / ".lock", std::vector<std::uint8_t>(record.begin(), record.end()));
  // As `flock ROOT/.lock some-command` would.
  const int fd = ::open((dir / ".lock").c_str(), O_RDWR | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  const Error e = test::error_of([&] { RootLock(posix_file_system(), dir.path().string()); });
  ::close(fd);
  CHECK(e.code() == Errc::busy);
  CHECK(e.actual() == "a process that left no record (the record names pid " + std::to_string(gone) + ", which has exited)");
  RootLock mine(posix_file_system(), dir.path().string());  // released with the descriptor
  CHECK(mine.held());
}

TEST_CASE("prepare_root under the lock removes the temporaries of a writer that was killed, and refuses a released lock") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture fx(1, 1);
  save_checkpoint_sync(posix_file_system(), root, fx.request);
  // A writer in another process begins a checkpoint and a `latest` update, and is killed.
  const pid_t child = child_that([&] {
    auto* lock = new RootLock(posix_file_system(), root);
    prepare_root(posix_file_system(), *lock);
    begin_checkpoint(posix_file_system(), root, 2);
    test::write_all(dir / temporary_name(kLatestName), {'s'});
  });
  const std::vector<std::string> temps = temporaries_in(dir.path());
  REQUIRE(temps.size() == 2);
  for (const auto& t : temps) {
    CHECK(parse_temporary_name(t)->pid == child);
    CHECK_FALSE(is_own_temporary(t));
  }
  // While it lives, nobody else can clean up.
  CHECK(test::error_of([&] { RootLock(posix_file_system(), root); }).code() == Errc::busy);
  CHECK(temporaries_in(dir.path()) == temps);
  kill_and_reap(child);
  test::LogCapture log;
  RootLock lock(posix_file_system(), root);
  auto removed = prepare_root(posix_file_system(), lock);
  std::sort(removed.begin(), removed.end());
  CHECK(removed == temps);
  CHECK(temporaries_in(dir.path()).empty());
  CHECK(log.matching({"removed", "(pid " + std::to_string(child) + ")"}).size() == 1);
  CHECK(open_latest(posix_file_system(), root).name == "step-0000000001");
  lock.release();
  const Error e = test::error_of([&] { prepare_root(posix_file_system(), lock); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "prepare_root without the root's lock");
}

TEST_CASE("a symlink or a directory where the lock file belongs is refused as an unsafe path") {
  test::TempDir dir;
  fs::create_directories(dir / "a");
  fs::create_symlink(dir / "elsewhere", dir / "a" / ".lock");
  CHECK(test::error_of([&] { RootLock(posix_file_system(), (dir / "a").string()); }).code() == Errc::unsafe_path);
  CHECK_FALSE(fs::exists(dir / "elsewhere"));
  fs::create_directories(dir / "b" / ".lock");
  CHECK(test::error_of([&] { RootLock(posix_file_system(), (dir / "b").string()); }).code() == Errc::unsafe_path);
  MemoryFileSystem mem;
  mem.put_symlink("/r/.lock", "/elsewhere");
  CHECK(test::error_of([&] { RootLock(mem, "/r"); }).code() == Errc::unsafe_path);
  CHECK_FALSE(mem.stat("/elsewhere"));
}

TEST_CASE("on a file system without locks the writer goes on unprotected, and says so") {
  test::TempDir dir;
  NoLockFileSystem nolock(posix_file_system());
  test::LogCapture log;
  RootLock lock(nolock, dir.path().string());
  CHECK(lock.held());
  CHECK_FALSE(lock.exclusive());
  CHECK(log.matching({dir.path().string(), "refuses locks", "not protected"}).size() == 1);
  prepare_root(nolock, lock);
  const std::string temp = begin_checkpoint(nolock, dir.path().string(), 4);
  CHECK(fs::is_directory(temp));
}

TEST_CASE("temporary names say which process made them") {
  const std::string step = temporary_name("step-0000000010");
  const auto t = parse_temporary_name(step);
  REQUIRE(t);
  CHECK(t->final_name == "step-0000000010");
  CHECK(t->pid == ::getpid());
  CHECK(is_own_temporary(step));
  CHECK(parse_temporary_name(temporary_name(kLatestName))->final_name == kLatestName);
  CHECK(is_own_temporary(temporary_name(kLatestName)));
  const auto other = parse_temporary_name(".tmp-step-0000000002-999-7");
  REQUIRE(other);
  CHECK(other->final_name == "step-0000000002");
  CHECK(other->pid == 999);
  CHECK(other->serial == 7);
  CHECK_FALSE(is_own_temporary(".tmp-step-0000000002-999-7"));
  for (const char* bad : {".tmp-step-0000000010-mpi1a2b3c4d", ".tmp-7-1", ".tmp--1-2", ".latest.tmp-x-1", "step-0000000010", ".lock", ".tmp-a-0-1"})
    CHECK_MESSAGE(!parse_temporary_name(bad), bad);
  // Outside a root, a tool's temporary also names its host; it is abandoned only once its
  // process is gone, and only on this host.
  const std::string mine = host_temporary_name("model");
  CHECK(parse_temporary_name(mine)->final_name == "model@" + host_name());
  CHECK_FALSE(is_abandoned_temporary(mine, "model"));
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  const std::string dead = ".tmp-model@" + host_name() + "-" + std::to_string(gone) + "-0";
  CHECK(is_abandoned_temporary(dead, "model"));
  CHECK_FALSE(is_abandoned_temporary(dead, "other"));
  CHECK_FALSE(is_abandoned_temporary(".tmp-model@another-host-" + std::to_string(gone) + "-0", "model"));
  CHECK_FALSE(is_abandoned_temporary(".tmp-model-" + std::to_string(gone) + "-0", "model"));
}
