// SPDX-License-Identifier: Apache-2.0
// The FileSystem contract (file_system.hpp), checked on both implementations the hostile
// tests and the fuzzers rely on: posix_file_system() in a scratch directory and
// MemoryFileSystem. Every case runs on each backend, so the in-memory one cannot drift
// from what the real one does. Each also runs on a routed file system
// (fs/remote_file_system.hpp) whose scratch root is served by a FileService over either of
// them through LoopbackFileTransport, with an empty MemoryFileSystem as its local side, so a
// call that failed to route would find nothing: the forwarding keeps every contract.
#include <doctest/doctest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/fs/remote_file_system.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "support/file_contents.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace ckpt::testing;

namespace {

// One backend under test: a file system, a scratch directory in it, and a way to make symlinks
// (not part of the FileSystem interface: ckpt never creates one).
struct Backend {
  std::string name;
  FileSystem* fs;
  std::string base;
  std::function<void(const std::string& path, const std::string& target)> symlink;
};

void for_each_backend(const std::function<void(Backend&)>& body) {
  {
    test::TempDir dir("ckpt-memfs");
    Backend b{"posix", &posix_file_system(), dir.path().string(),
              [](const std::string& p, const std::string& t) { std::filesystem::create_symlink(t, p); }};
    CAPTURE(b.name);
    body(b);
  }
  {
    MemoryFileSystem mem;
    mem.create_dirs("/scratch");
    Backend b{"memory", &mem, "/scratch", [&mem](const std::string& p, const std::string& t) { mem.put_symlink(p, t); }};
    CAPTURE(b.name);
    body(b);
  }
  {
    test::TempDir dir("ckpt-memfs");
    MemoryFileSystem elsewhere;
    FileService service(posix_file_system());
    LoopbackFileTransport transport({nullptr, &service});
    const auto routed = make_routed_file_system(elsewhere, transport, {{dir.path().string(), 1}});
    Backend b{"routed to posix", routed.get(), dir.path().string(),
              [](const std::string& p, const std::string& t) { std::filesystem::create_symlink(t, p); }};
    CAPTURE(b.name);
    body(b);
  }
  {
    MemoryFileSystem served, elsewhere;
    served.create_dirs("/scratch");
    FileService service(served);
    LoopbackFileTransport transport({nullptr, &service});
    const auto routed = make_routed_file_system(elsewhere, transport, {{"/scratch", 1}});
    Backend b{"routed to memory", routed.get(), "/scratch", [&served](const std::string& p, const std::string& t) { served.put_symlink(p, t); }};
    CAPTURE(b.name);
    body(b);
  }
}

using test::bytes_of;
using test::error_of;
using test::read_file;
using test::write_file;

std::vector<std::string> names(const std::vector<DirEntry>& es) {
  std::vector<std::string> out;
  for (const auto& e : es) out.push_back(e.name);
  return out;
}

// A two-rank request with tensors that span several 4096-byte chunks, payload set by `step`.
struct Request {
  std::vector<std::vector<float>> data;
  SaveRequest req;
  explicit Request(std::uint64_t step) {
    req.step = step;
    req.param_numel = 2 * 3000;
    req.chunk_size = 4096;
    for (int r = 0; r < 2; ++r) {
      data.emplace_back(3000);
      for (std::size_t i = 0; i < 3000; ++i) data.back()[i] = static_cast<float>(step * 10000 + static_cast<std::uint64_t>(r) * 5000 + i);
    }
    for (int r = 0; r < 2; ++r) {
      RankState rs;
      rs.tensors = {{"w", DType::F32, {3000}, std::as_bytes(std::span(data[static_cast<std::size_t>(r)]))}};
      rs.param_shard_offset = 3000u * static_cast<std::uint64_t>(r);
      rs.param_shard_numel = 3000;
      req.ranks.push_back(std::move(rs));
    }
  }
};

}  // namespace

TEST_CASE("save, open_latest and load round trip byte-equal on posix, memory and routed file systems") {
  for_each_backend([](Backend& b) {
    const std::string root = join_path(b.base, "root");
    Request r10(10), r20(20);
    save_checkpoint_sync(*b.fs, root, r10.req);
    save_checkpoint_sync(*b.fs, root, r20.req);
    auto opened = open_latest(*b.fs, root, {.expected_world_size = 2});
    CHECK(opened.name == "step-0000000020");
    CHECK_NOTHROW(opened.reader.verify(Verify::full));
    for (int rank = 0; rank < 2; ++rank) {
      const auto shard = opened.reader.load_shard(rank, Verify::full);
      const auto& w = shard.tensor("w");
      const auto want = std::as_bytes(std::span(r20.data[static_cast<std::size_t>(rank)]));
      REQUIRE(w.data.size() == want.size());
      CHECK(std::equal(w.data.begin(), w.data.end(), want.begin()));
      const auto one = opened.reader.read_tensor("w", rank);
      CHECK(std::equal(one.begin(), one.end(), want.begin()));
    }
    const auto older = open_step(*b.fs, root, 10, 2).load_shard(1, Verify::full);
    CHECK(older.tensor("w").data[0] == std::as_bytes(std::span(r10.data[1]))[0]);
    const auto listed = list_checkpoints(*b.fs, root, Verify::full);
    REQUIRE(listed.size() == 2);
    CHECK(listed[0].state == CheckpointState::complete);
    CHECK(listed[1].is_latest);
  });
}

TEST_CASE("create is exclusive, also over a symlink, and needs its parent directory") {
  for_each_backend([](Backend& b) {
    const std::string p = join_path(b.base, "f");
    write_file(*b.fs, p, "one");
    Error e = error_of([&] { b.fs->create(p, {}); });
    CHECK(e.code() == Errc::io_error);
    CHECK(e.sys_errno() == EEXIST);
    CHECK(e.file() == p);
    b.symlink(join_path(b.base, "link"), p);
    CHECK(error_of([&] { b.fs->create(join_path(b.base, "link"), {}); }).sys_errno() == EEXIST);
    CHECK(read_file(*b.fs, p) == "one");
    e = error_of([&] { b.fs->create(join_path(b.base, "no/such/dir/f"), {}); });
    CHECK(e.code() == Errc::io_error);
    CHECK(e.sys_errno() == ENOENT);
  });
}

TEST_CASE("open_read refuses a symlink or a directory as unsafe and reports absence as not found") {
  for_each_backend([](Backend& b) {
    const std::string p = join_path(b.base, "real");
    write_file(*b.fs, p, "data");
    b.symlink(join_path(b.base, "link"), p);
    Error e = error_of([&] { b.fs->open_read(join_path(b.base, "link")); });
    CHECK(e.code() == Errc::unsafe_path);
    CHECK(e.actual() == "symlink");
    b.fs->create_dir(join_path(b.base, "d"));
    CHECK(error_of([&] { b.fs->open_read(join_path(b.base, "d")); }).code() == Errc::unsafe_path);
    e = error_of([&] { b.fs->open_read(join_path(b.base, "absent")); });
    CHECK(e.code() == Errc::not_found);
    CHECK(e.file() == join_path(b.base, "absent"));
    CHECK(error_of([&] { b.fs->open_read(join_path(b.base, "absent/x")); }).code() == Errc::not_found);
  });
}

TEST_CASE("symlinks in the middle of a path are followed, relative to their directory") {
  for_each_backend([](Backend& b) {
    b.fs->create_dirs(join_path(b.base, "a/b"));
    write_file(*b.fs, join_path(b.base, "a/b/f"), "deep");
    b.symlink(join_path(b.base, "rel"), "a/b");
    CHECK(read_file(*b.fs, join_path(b.base, "rel/f")) == "deep");
    b.symlink(join_path(b.base, "a/up"), "..");
    CHECK(read_file(*b.fs, join_path(b.base, "a/up/a/b/f")) == "deep");
    CHECK(names(b.fs->list_dir(join_path(b.base, "rel"))) == std::vector<std::string>{"f"});
    b.symlink(join_path(b.base, "loop"), "loop");
    // A loop: lstat fails with ELOOP; open_read, which cannot tell it from a final symlink
    // (O_NOFOLLOW reports both as ELOOP), refuses it as unsafe.
    const Error e = error_of([&] { b.fs->stat(join_path(b.base, "loop/x")); });
    CHECK(e.code() == Errc::io_error);
    CHECK(e.sys_errno() == ELOOP);
    CHECK(error_of([&] { b.fs->open_read(join_path(b.base, "loop/x")); }).code() == Errc::unsafe_path);
  });
}

TEST_CASE("list_dir is sorted by name with entry types, and an absent directory is not found") {
  for_each_backend([](Backend& b) {
    for (const char* n : {"b", "a", "c10", "c9", "A"}) write_file(*b.fs, join_path(b.base, n), n);
    b.fs->create_dir(join_path(b.base, "dir"));
    b.symlink(join_path(b.base, "sym"), "a");
    const auto es = b.fs->list_dir(b.base);
    CHECK(names(es) == std::vector<std::string>{"A", "a", "b", "c10", "c9", "dir", "sym"});
    CHECK(es[5].type == EntryType::directory);
    CHECK(es[6].type == EntryType::symlink);
    CHECK(es[0].type == EntryType::file);
    CHECK(error_of([&] { b.fs->list_dir(join_path(b.base, "nope")); }).code() == Errc::not_found);
    CHECK(error_of([&] { b.fs->list_dir(join_path(b.base, "a")); }).sys_errno() == ENOTDIR);
  });
}

TEST_CASE("rename replaces a file, moves a directory, and refuses a non-empty target or a move into itself") {
  for_each_backend([](Backend& b) {
    const std::string x = join_path(b.base, "x"), y = join_path(b.base, "y");
    write_file(*b.fs, x, "new");
    write_file(*b.fs, y, "old");
    b.fs->rename(x, y);
    CHECK(read_file(*b.fs, y) == "new");
    CHECK_FALSE(b.fs->stat(x).has_value());
    const std::string d1 = join_path(b.base, "d1"), d2 = join_path(b.base, "d2");
    b.fs->create_dirs(join_path(d1, "sub"));
    write_file(*b.fs, join_path(d1, "sub/f"), "f");
    b.fs->create_dir(d2);
    b.fs->rename(d1, d2);  // over an empty directory
    CHECK(read_file(*b.fs, join_path(d2, "sub/f")) == "f");
    b.fs->create_dirs(join_path(d1, "other"));
    CHECK(error_of([&] { b.fs->rename(d1, d2); }).sys_errno() == ENOTEMPTY);  // d2 not empty
    CHECK(error_of([&] { b.fs->rename(d2, join_path(d2, "sub/inside")); }).sys_errno() == EINVAL);
    CHECK(error_of([&] { b.fs->rename(y, d1); }).sys_errno() == EISDIR);
    CHECK(error_of([&] { b.fs->rename(d1, y); }).sys_errno() == ENOTDIR);
    CHECK(error_of([&] { b.fs->rename(join_path(b.base, "absent"), y); }).sys_errno() == ENOENT);
    b.fs->rename(y, y);  // the same entry: nothing happens
    CHECK(read_file(*b.fs, y) == "new");
  });
}

TEST_CASE("remove_all removes a tree or a symlink (not its target) and ignores absent paths") {
  for_each_backend([](Backend& b) {
    const std::string d = join_path(b.base, "tree");
    b.fs->create_dirs(join_path(d, "a/b/c"));
    write_file(*b.fs, join_path(d, "a/b/c/f"), "x");
    write_file(*b.fs, join_path(b.base, "target"), "t");
    b.symlink(join_path(b.base, "link"), join_path(b.base, "target"));
    b.fs->remove_all(join_path(b.base, "link"));
    CHECK(read_file(*b.fs, join_path(b.base, "target")) == "t");
    b.fs->remove_all(d);
    CHECK_FALSE(b.fs->stat(d).has_value());
    CHECK_NOTHROW(b.fs->remove_all(d));
    CHECK_NOTHROW(b.fs->remove_all(join_path(b.base, "no/such/thing")));
  });
}

TEST_CASE("stat does not follow symlinks, reports file sizes, and nullopt for absent paths") {
  for_each_backend([](Backend& b) {
    write_file(*b.fs, join_path(b.base, "f"), "12345");
    b.symlink(join_path(b.base, "s"), "f");
    CHECK(b.fs->stat(join_path(b.base, "f"))->size == 5);
    CHECK(b.fs->stat(join_path(b.base, "f"))->type == EntryType::file);
    CHECK(b.fs->stat(join_path(b.base, "s"))->type == EntryType::symlink);
    CHECK(b.fs->stat(b.base)->type == EntryType::directory);
    CHECK_FALSE(b.fs->stat(join_path(b.base, "none")).has_value());
    CHECK_FALSE(b.fs->stat(join_path(b.base, "f/below-a-file")).has_value());
  });
}

TEST_CASE("writes extend files, allocate and truncate set the length, reads past the end are size mismatches") {
  for_each_backend([](Backend& b) {
    const std::string p = join_path(b.base, "w");
    auto f = b.fs->create(p, {});
    f->allocate(10);
    f->write_at(12, bytes_of("xy"));
    f->write_at(0, bytes_of("ab"));
    f->sync();
    CHECK(b.fs->stat(p)->size == 14);
    f->truncate(13);
    f->close();
    CHECK_NOTHROW(f->close());  // idempotent
    const std::string s = read_file(*b.fs, p);
    CHECK(s == std::string("ab") + std::string(10, '\0') + "x");
    auto r = b.fs->open_read(p);
    std::byte buf[4];
    const Error e = error_of([&] { r->read_at(11, buf); });
    CHECK(e.code() == Errc::size_mismatch);
    CHECK(e.file() == p);
  });
}

TEST_CASE("a file open for reading keeps its bytes after it is replaced or removed") {
  for_each_backend([](Backend& b) {
    const std::string p = join_path(b.base, "f"), q = join_path(b.base, "g");
    write_file(*b.fs, p, "first");
    auto r = b.fs->open_read(p);
    write_file(*b.fs, q, "second");
    b.fs->rename(q, p);
    std::byte buf[5];
    r->read_at(0, buf);
    CHECK(std::memcmp(buf, "first", 5) == 0);
    b.fs->remove_all(p);
    r->read_at(0, buf);
    CHECK(std::memcmp(buf, "first", 5) == 0);
  });
}

TEST_CASE("sync_dir needs an existing directory, create_dir refuses an existing one, create_dirs does not") {
  for_each_backend([](Backend& b) {
    CHECK_NOTHROW(b.fs->sync_dir(b.base));
    CHECK(error_of([&] { b.fs->sync_dir(join_path(b.base, "none")); }).code() == Errc::io_error);
    b.fs->create_dir(join_path(b.base, "d"));
    CHECK(error_of([&] { b.fs->create_dir(join_path(b.base, "d")); }).sys_errno() == EEXIST);
    CHECK(error_of([&] { b.fs->create_dir(join_path(b.base, "x/y")); }).sys_errno() == ENOENT);
    CHECK_NOTHROW(b.fs->create_dirs(join_path(b.base, "d/e/f")));
    CHECK_NOTHROW(b.fs->create_dirs(join_path(b.base, "d/e/f")));
    CHECK(b.fs->stat(join_path(b.base, "d/e/f"))->type == EntryType::directory);
  });
}

TEST_CASE("memory file system: clone is a deep copy and helpers place raw bytes, symlinks and special files") {
  MemoryFileSystem a;
  a.put_file("/r/x", std::string_view("abc"));
  a.put_symlink("/r/s", "/r/x");
  a.put_special("/r/fifo");
  MemoryFileSystem b = a.clone();
  a.put_file("/r/x", std::string_view("changed"));
  CHECK(b.file_bytes("/r/x")->size() == 3);
  CHECK(a.file_bytes("/r/x")->size() == 7);
  CHECK_FALSE(b.file_bytes("/r/s").has_value());  // a symlink is not a file
  CHECK(b.stat("/r/fifo")->type == EntryType::other);
  CHECK(error_of([&] { b.open_read("/r/fifo"); }).code() == Errc::unsafe_path);
  CHECK(b.total_file_bytes() == 3);
  CHECK(b.stat("r/x")->size == 3);  // relative paths start at the root
}

TEST_CASE("memory file system, and a routed one over it: concurrent writers and readers on distinct files") {
  MemoryFileSystem mem, elsewhere;
  FileService service(mem);
  LoopbackFileTransport transport({nullptr, &service});
  const auto routed = make_routed_file_system(elsewhere, transport, {{"/c", 1}});
  for (FileSystem* fs : {static_cast<FileSystem*>(&mem), routed.get()}) {
    CAPTURE(fs == routed.get());
    mem.remove_all("/c");
    mem.create_dirs("/c");
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < 200; ++i) {
          const std::string p = "/c/t" + std::to_string(t) + "-" + std::to_string(i);
          const std::string content(static_cast<std::size_t>(i + 1), static_cast<char>('a' + t));
          try {
            write_file(*fs, p, content);
            if (read_file(*fs, p) != content || fs->stat(p)->size != content.size()) ++bad;
            fs->list_dir("/c");
            if (i % 2) fs->rename(p, p + ".moved");
            else fs->remove_all(p);
          } catch (...) {
            ++bad;
          }
        }
      });
    for (auto& th : threads) th.join();
    CHECK(bad.load() == 0);
    CHECK(fs->list_dir("/c").size() == 400);
  }
  CHECK(service.open_handles() == 0);
}
