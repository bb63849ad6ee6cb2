// SPDX-License-Identifier: Apache-2.0
// The memory store (store/memory/memory.hpp) beyond the conformance suite: its names, its
// private directories, hostile contents, its bound and a full shared memory. These run with
// CKPT_MEMORY_DIR set to a scratch directory (or a small tmpfs), so that another user's or a
// hostile directory can be planted where the memory roots live.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "ckpt/store/memory/memory.hpp"
#include "store/conformance.hpp"

namespace {

using namespace ckpt;
namespace fs = std::filesystem;
using test::put_checkpoint;
using test::SourceCheckpoint;

// CKPT_MEMORY_DIR pointed at `dir` for the object's life.
// CKPT_MEMORY_DIR at `dir` while the object lives.
struct MemoryDirAt : test::ScopedEnv {
  explicit MemoryDirAt(const fs::path& dir) : test::ScopedEnv({{"CKPT_MEMORY_DIR", dir.string()}}) {}
};

std::string user_dir_name() { return "ckpt-" + std::to_string(::geteuid()); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every entry under `dir` with its mode (the permission bits).
std::vector<std::pair<std::string, unsigned>> modes_under(const fs::path& dir) {
  std::vector<std::pair<std::string, unsigned>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    struct stat st {};
    REQUIRE(::lstat(e.path().c_str(), &st) == 0);
    out.emplace_back(e.path().string(), static_cast<unsigned>(st.st_mode & 07777));
  }
  return out;
}

}  // namespace

TEST_CASE("a memory root's name is 1..64 of [A-Za-z0-9._-] not starting with a dot: any other is refused, and nothing is made") {
  test::TempDir scratch;
  MemoryDirAt at(scratch.path());
  for (const std::string& bad : std::vector<std::string>{"mem://", "mem://../up", "mem://a/b", "mem://.hidden", "mem://sp ace", "mem://" + std::string(65, 'x')}) {
    INFO(bad);
    const Error e = test::expect_error([&] { open_store(bad); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(contains(e.what(), "1..64 of [A-Za-z0-9._-]"));
  }
  CHECK(fs::is_empty(scratch.path()));
  CHECK(root_kind("mem://run") == StoreKind::memory);
  CHECK(memory_root_dir("mem://run/") == (scratch.path() / user_dir_name() / "run").string());
  CHECK(store_kind_name(StoreKind::memory) == "memory");
}

TEST_CASE("a memory root is private to its user: directories 0700, files 0600, and opening it to read makes nothing") {
  test::TempDir scratch;
  MemoryDirAt at(scratch.path());
  auto store = open_store("mem://run");
  CHECK_FALSE(store->latest().has_value());
  CHECK(fs::is_empty(scratch.path()));  // a read makes nothing
  {
    auto w = store->writer();
    put_checkpoint(*w, SourceCheckpoint(2, 10));
    put_checkpoint(*w, SourceCheckpoint(2, 20));
  }
  const auto modes = modes_under(scratch.path());
  CHECK(modes.size() > 8);
  for (const auto& [path, mode] : modes) {
    INFO(path);
    CHECK(mode == (fs::is_directory(path) ? 0700u : 0600u));
  }
  CHECK(store->latest() == std::optional<std::uint64_t>(20));
  store->verify(20, Verify::full);
  CHECK(store->name_of(20) == "mem://run/step-0000000020");
  // Another process's store of the same root reads the same generations (shared memory
  // outlives the writer).
  CHECK(open_store("mem://run")->steps() == std::vector<std::uint64_t>{10, 20});
}

TEST_CASE("a memory directory that is a symlink, another user's, or open to others is refused with unsafe_path before anything in it is read or written") {
  test::TempDir scratch;
  MemoryDirAt at(scratch.path());
  const fs::path user = scratch / user_dir_name();
  auto refused = [&](const std::string& root, const std::string& detail, const std::string& actual) {
    const auto before = modes_under(scratch.path());
    const Error opening = test::expect_error([&] { open_store(root); });
    CHECK(opening.code() == Errc::unsafe_path);
    CHECK(contains(opening.what(), detail));
    CHECK(contains(opening.what(), "a directory owned by uid " + std::to_string(::geteuid()) + ", mode 0700"));
    CHECK(contains(opening.what(), actual));
    CHECK(modes_under(scratch.path()) == before);  // nothing made or changed
  };
  SUBCASE("the user's memory directory open to others") {
    fs::create_directory(user);
    fs::permissions(user, fs::perms(0755));
    refused("mem://run", "open to other users", "mode 0755");
  }
  SUBCASE("the user's memory directory owned by another user") {
    fs::create_directory(user);
    fs::permissions(user, fs::perms(0700));
    REQUIRE(::chown(user.c_str(), 65534, 65534) == 0);
    refused("mem://run", "belongs to another user", "owned by uid 65534");
  }
  SUBCASE("the user's memory directory a symlink to a directory elsewhere") {
    fs::create_directory(scratch / "elsewhere");
    fs::permissions(scratch / "elsewhere", fs::perms(0700));
    fs::create_directory_symlink(scratch / "elsewhere", user);
    refused("mem://run", "is a symlink", "a symlink");
  }
  SUBCASE("a root's directory owned by another user, with a generation in it") {
    {
      auto store = open_store("mem://run");
      auto w = store->writer();
      put_checkpoint(*w, SourceCheckpoint(2, 10));
    }
    REQUIRE(::chown((user / "run").c_str(), 65534, 65534) == 0);
    refused("mem://run", "belongs to another user", "owned by uid 65534");
    CHECK(open_store("mem://other")->steps().empty());  // the user's other roots are unharmed
  }
  SUBCASE("a root's name taken by a file") {
    fs::create_directory(user);
    fs::permissions(user, fs::perms(0700));
    test::write_all(user / "run", {1, 2, 3});
    refused("mem://run", "is not a directory", "another file type");
  }
}

TEST_CASE("hostile contents in a memory root are refused like a disk root's, naming the file, and the previous generation still opens") {
  test::TempDir scratch;
  MemoryDirAt at(scratch.path());
  const fs::path root = scratch / user_dir_name() / "run";
  auto store = open_store("mem://run");
  {
    auto w = store->writer();
    put_checkpoint(*w, SourceCheckpoint(2, 10));
    put_checkpoint(*w, SourceCheckpoint(2, 20));
  }
  const fs::path shard = root / "step-0000000020" / shard_file_name(1, 2);
  SUBCASE("a generation's shard truncated (a kill of a resizing writer, or another process)") {
    fs::resize_file(shard, fs::file_size(shard) / 2);
    const Error e = test::expect_error([&] { store->open(20); });
    CHECK(contains(e.what(), shard.string()));
  }
  SUBCASE("a generation's shard resized larger") {
    fs::resize_file(shard, fs::file_size(shard) + 4096);
    const Error e = test::expect_error([&] { store->open(20); });
    CHECK(contains(e.what(), shard.string()));
  }
  SUBCASE("a shard replaced by a symlink to a file outside the root") {
    test::write_all(scratch / "outside", test::random_bytes(static_cast<std::size_t>(fs::file_size(shard)), 7));
    fs::remove(shard);
    fs::create_symlink(scratch / "outside", shard);
    const Error e = test::expect_error([&] { store->verify(20, Verify::fast); });
    CHECK(e.code() == Errc::unsafe_path);
    CHECK(contains(e.what(), shard.string()));
  }
  SUBCASE("a manifest naming a shard outside its generation") {
    const fs::path manifest = root / "step-0000000020" / "manifest.json";
    const auto bytes = test::read_all(manifest);
    std::string text(bytes.begin(), bytes.end());
    const std::string name = shard_file_name(1, 2);
    const auto at_name = text.find("\"" + name + "\"");
    REQUIRE(at_name != std::string::npos);
    text.replace(at_name + 1, name.size(), "../../" + name.substr(6));
    test::write_all(manifest, std::vector<std::uint8_t>(text.begin(), text.end()));
    const Error e = test::expect_error([&] { store->open(20); });
    CHECK(contains(e.what(), manifest.string()));
  }
  const OpenedCheckpoint fallen = store->open_latest({.fallback = true});
  CHECK(fallen.reader.manifest().step == 10);
  fallen.reader.verify(Verify::full);
}

TEST_CASE("a generation that with the one before it exceeds the memory bound is refused with no_space naming both sizes, and the previous generation stays") {
  test::TempDir scratch;
  MemoryDirAt at(scratch.path());
  const SourceCheckpoint first(2, 10);
  std::uint64_t generation = 0;
  for (const auto& s : first.manifest().shards) generation += s.size;
  auto store = open_store("mem://run", {.memory_limit = memory_needed(generation)});
  auto w = store->writer();
  put_checkpoint(*w, first);
  auto tight = open_store("mem://run", {.memory_limit = memory_needed(generation) - 1});
  w.reset();
  auto w2 = tight->writer();
  const Error e = test::expect_error([&] { put_checkpoint(*w2, SourceCheckpoint(2, 20)); });
  CHECK(e.code() == Errc::no_space);
  CHECK(contains(e.what(), "mem://run/step-0000000020"));
  CHECK(contains(e.what(), "at most " + std::to_string(memory_needed(generation) - 1) + " bytes"));
  CHECK(contains(e.what(), std::to_string(memory_needed(generation)) + " bytes"));
  CHECK(tight->steps() == std::vector<std::uint64_t>{10});
  tight->verify(10, Verify::full);
  for (const auto& e2 : fs::directory_iterator(scratch / user_dir_name() / "run")) CHECK_FALSE(is_temporary_name(e2.path().filename().string()));
}

TEST_CASE("a full shared memory fails a save with no_space, leaves nothing of it, and the previous generation still loads") {
  test::TempDir scratch;
  test::SmallTmpfs small(scratch, "size=96k");
  MemoryDirAt at(small.path());
  auto store = open_store("mem://run");
  auto w = store->writer();
  put_checkpoint(*w, SourceCheckpoint(1, 10));
  std::optional<Error> full;
  for (std::uint64_t step = 20; step < 200 && !full; step += 10) {
    try {
      put_checkpoint(*w, SourceCheckpoint(1, step));
    } catch (const Error& e) {
      full = e;
    }
  }
  REQUIRE(full.has_value());
  CHECK(full->code() == Errc::no_space);
  const auto latest = store->latest();
  REQUIRE(latest.has_value());
  store->verify(*latest, Verify::full);
  for (const auto& e : fs::directory_iterator(fs::path(small.path()) / user_dir_name() / "run")) CHECK_FALSE(is_temporary_name(e.path().filename().string()));
}
