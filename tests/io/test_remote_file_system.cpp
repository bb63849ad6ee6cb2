// SPDX-License-Identifier: Apache-2.0
// The routed file system (fs/remote_file_system.hpp) through LoopbackFileTransport: errors
// cross the wire unchanged, a rename between processes is refused, locks are held by the
// server for the client, long reads and writes travel in pieces, the server answers every
// request that does not decode with Errc::comm_error, and the whole save, load, node commit,
// check and repair run through it unchanged. (The FileSystem contract cases run on it too:
// tests/hostile/test_memory_fs.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/format/redundancy.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/fs/remote_file_system.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/testing/capped_file_system.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "io/io_fixture.hpp"
#include "support/file_contents.hpp"
#include "support/node_checkpoint.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using ckpt::test::bytes_of;
using ckpt::test::expect_error;
using ckpt::test::Fixture;
using ckpt::test::LogCapture;
using ckpt::test::random_bytes;
using ckpt::test::TempDir;
using ckpt::test::write_file;
using ckpt::testing::CappedFileSystem;
using ckpt::testing::MemoryFileSystem;

namespace {

// A MemoryFileSystem with the directory /r, the routed root of most cases here.
MemoryFileSystem with_r() {
  MemoryFileSystem m;
  m.create_dirs("/r");
  return m;
}

// Two server processes (peers 1 and 2) and the client's local file system, routed by `routes`.
struct TwoPeers {
  MemoryFileSystem local, one, two;
  FileService s1{one}, s2{two};
  LoopbackFileTransport transport{{nullptr, &s1, &s2}};
  std::unique_ptr<FileSystem> fs;
  explicit TwoPeers(std::vector<FileRoute> routes) : fs(make_routed_file_system(local, transport, std::move(routes))) {}
};

// A transport that passes requests on and records each request and reply (thread-safe).
class RecordingTransport : public FileTransport {
 public:
  explicit RecordingTransport(FileTransport& next) : next_(next) {}
  std::string call(int peer, std::string request) override {
    std::string copy = request;
    std::string reply = next_.call(peer, std::move(request));
    std::lock_guard lock(mu_);
    requests.push_back(std::move(copy));
    replies.push_back(reply);
    return reply;
  }
  std::vector<std::string> requests, replies;

 private:
  FileTransport& next_;
  std::mutex mu_;
};

// One server process (peer 1) holding `served`, and a client whose local side is an empty
// MemoryFileSystem, so that a call that failed to route finds nothing. `rec` sees every
// request and reply.
struct OnePeer {
  MemoryFileSystem elsewhere;
  FileService service;
  LoopbackFileTransport loop;
  RecordingTransport rec;
  std::unique_ptr<FileSystem> fs;
  OnePeer(FileSystem& served, const std::string& root)
      : service(served), loop({nullptr, &service}), rec(loop), fs(make_routed_file_system(elsewhere, rec, {{root, 1}})) {}
};

// A transport to `next`, or to nowhere (Errc::comm_error) while `next` is null.
class SwitchTransport : public FileTransport {
 public:
  FileTransport* next = nullptr;
  std::string call(int peer, std::string request) override {
    if (!next) throw Error(Errc::comm_error, {}, "peer " + std::to_string(peer) + " is down");
    return next->call(peer, std::move(request));
  }
};

// A transport that fails with an exception that is not a ckpt::Error.
class BrokenTransport : public FileTransport {
 public:
  std::string call(int, std::string) override { throw std::runtime_error("connection reset"); }
};

// A transport whose peer answers `reply`, whatever it is asked.
class FixedReplyTransport : public FileTransport {
 public:
  std::string reply;
  std::string call(int, std::string) override { return reply; }
};

// A file system whose stat throws what `fail` throws: for errors of every kind on the server.
class ThrowingFileSystem : public FileSystemWrapper {
 public:
  using FileSystemWrapper::FileSystemWrapper;
  std::function<void()> fail;
  std::optional<FileStat> stat(const std::string& path) override {
    if (fail) fail();
    return target().stat(path);
  }
};

void check_same_error(const Error& got, const Error& want) {
  CHECK(got.code() == want.code());
  CHECK(got.file() == want.file());
  CHECK(got.detail() == want.detail());
  CHECK(got.expected() == want.expected());
  CHECK(got.actual() == want.actual());
  CHECK(got.sys_errno() == want.sys_errno());
  CHECK(std::string(got.what()) == want.what());
}

Errc reply_code(const std::string& reply) {
  const auto e = reply_error(reply);
  REQUIRE(e.has_value());
  return e->code();
}

// Every file (path -> bytes) and directory ("path/") below `dir` of a MemoryFileSystem,
// without the lock files.
using Tree = std::map<std::string, std::vector<std::byte>>;
void snapshot(MemoryFileSystem& fs, const std::string& dir, Tree& out) {
  if (!fs.stat(dir)) return;
  for (const auto& e : fs.list_dir(dir)) {
    const std::string p = join_path(dir, e.name);
    if (e.type == EntryType::directory) {
      out[p + "/"] = {};
      snapshot(fs, p, out);
    } else if (e.name != kLockName) {
      out[p] = fs.file_bytes(p).value_or(std::vector<std::byte>{});
    }
  }
}
Tree snapshot(MemoryFileSystem& fs, const std::string& dir) {
  Tree t;
  snapshot(fs, dir, t);
  return t;
}

}  // namespace

TEST_CASE("errors raised on the server are rethrown with the same code, file, detail, expected, actual and errno") {
  MemoryFileSystem served = with_r();
  ThrowingFileSystem throwing(served);
  OnePeer peer(throwing, "/r");
  // Every code, to the last: a conflict (the last but one added) used to arrive as a comm_error,
  // "undecodable file reply", as the reply's decoder stopped at busy.
  for (int c = 0; c <= static_cast<int>(kLastErrc); ++c) {
    const Error want(static_cast<Errc>(c), "/r/file " + std::to_string(c), "detail with\nnewline and \"quotes\"", "expected " + std::to_string(c),
                     std::string("actual \0 with NUL", 17), c + 1);
    CAPTURE(c);
    throwing.fail = [&] { throw want; };
    check_same_error(expect_error([&] { peer.fs->stat("/r/x"); }), want);
  }
  // Exceptions that are not ckpt::Error are typed on the server, as to_error types them.
  throwing.fail = [] { throw std::runtime_error("plain failure"); };
  check_same_error(expect_error([&] { peer.fs->stat("/r/x"); }), Error(Errc::io_error, {}, "plain failure"));
  throwing.fail = [] { throw std::bad_alloc(); };
  CHECK(expect_error([&] { peer.fs->stat("/r/x"); }).sys_errno() == ENOMEM);
  throwing.fail = nullptr;

  // And the real ones, compared with what the server's file system raises itself.
  write_file(*peer.fs, "/r/f", "12345");
  const auto direct = [&](auto&& call) { return expect_error([&] { call(served); }); };
  const auto routed = [&](auto&& call) { return expect_error([&] { call(*peer.fs); }); };
  const std::vector<std::function<void(FileSystem&)>> failing = {
      [](FileSystem& fs) { fs.create("/r/f", {}); },                      // EEXIST
      [](FileSystem& fs) { fs.open_read("/r/absent"); },                  // not_found
      [](FileSystem& fs) { fs.list_dir("/r/f"); },                        // ENOTDIR
      [](FileSystem& fs) { fs.create_dir("/r/no/such"); },                // ENOENT
      [](FileSystem& fs) { fs.rename("/r/absent", "/r/g"); },             // ENOENT
      [](FileSystem& fs) {                                                // size mismatch
        std::byte buf[8];
        fs.open_read("/r/f")->read_at(2, buf);
      },
  };
  for (std::size_t i = 0; i < failing.size(); ++i) {
    CAPTURE(i);
    check_same_error(routed(failing[i]), direct(failing[i]));
  }
}

TEST_CASE("a peer that cannot be reached, or a transport that fails, is a comm_error, and free_space then says unknown") {
  TwoPeers peers({{"/far", 7}, {"/none", 0}});
  const auto& fs = peers.fs;
  for (const std::string p : {"/far/x", "/none/x"}) {
    const Error e = expect_error([&] { fs->stat(p); });
    CHECK(e.code() == Errc::comm_error);
    CHECK_FALSE(fs->free_space(p).has_value());
  }
  // A transport that throws something else: still a comm_error, saying what it threw.
  BrokenTransport broken;
  const auto cut = make_routed_file_system(peers.local, broken, {{"/far", 1}});
  const Error e = expect_error([&] { cut->list_dir("/far"); });
  CHECK(e.code() == Errc::comm_error);
  CHECK(std::string(e.what()).find("connection reset") != std::string::npos);
}

TEST_CASE("paths route by whole components, the longest root first, and everything else stays local") {
  TwoPeers peers({{"/set/", 1}, {"/set/node-2", 2}});
  auto& [local, one, two, s1, s2, transport, fs] = peers;
  fs->create_dirs("/set/node-1");
  fs->create_dirs("/set/node-2/sub");
  fs->create_dirs("/settle");
  CHECK(one.stat("/set/node-1"));
  CHECK_FALSE(one.stat("/set/node-2"));
  CHECK(two.stat("/set/node-2/sub"));
  CHECK(local.stat("/settle"));  // "/set" is not a prefix of "/settle" by components
  CHECK_FALSE(one.stat("/settle"));
  CHECK(fs->stat("/set")->type == EntryType::directory);  // the root itself routes
}

TEST_CASE("stat reports the identity the server sees: device, inode and mtime") {
  TempDir dir("ckpt-rfs-stat");
  OnePeer peer(posix_file_system(), dir.path().string());
  const std::string p = (dir / "f").string();
  write_file(*peer.fs, p, "abc");
  const auto routed = peer.fs->stat(p), direct = posix_file_system().stat(p);
  REQUIRE(routed.has_value());
  REQUIRE(direct.has_value());
  CHECK(routed->type == direct->type);
  CHECK(routed->size == 3);
  CHECK(routed->device == direct->device);
  CHECK(routed->inode == direct->inode);
  CHECK(routed->mtime_ns == direct->mtime_ns);
  CHECK(routed->inode != 0);
}

TEST_CASE("rename across two peers or between a peer and this process is refused naming both paths") {
  TwoPeers peers({{"/a", 1}, {"/b", 2}});
  auto& [local, one, two, s1, s2, transport, fs] = peers;
  fs->create_dirs("/a");
  fs->create_dirs("/b");
  local.create_dirs("/c");
  write_file(*fs, "/a/f", "x");
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{"/a/f", "/b/f"}, {"/a/f", "/c/f"}, {"/c/f", "/a/g"}}) {
    CAPTURE(from);
    CAPTURE(to);
    const Error e = expect_error([&] { fs->rename(from, to); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.file() == from);
    CHECK(std::string(e.what()).find(to) != std::string::npos);
  }
  CHECK(one.file_bytes("/a/f").has_value());
  fs->rename("/a/f", "/a/g");  // within one peer: forwarded
  CHECK(one.file_bytes("/a/g").has_value());
}

TEST_CASE("a lock taken through the routed file system excludes a second try_lock, local or remote, until it is destroyed") {
  TempDir dir("ckpt-rfs-lock");
  MemoryFileSystem mem;
  mem.create_dirs("/r");
  struct Case {
    const char* name;
    FileSystem* served;
    std::string root;
  };
  for (const Case& c : {Case{"posix", &posix_file_system(), dir.path().string()}, Case{"memory", &mem, "/r"}}) {
    CAPTURE(c.name);
    MemoryFileSystem elsewhere;
    FileService service(*c.served);
    LoopbackFileTransport client1({nullptr, &service}, 0), client2({nullptr, &service}, 2);
    const auto fs1 = make_routed_file_system(elsewhere, client1, {{c.root, 1}});
    const auto fs2 = make_routed_file_system(elsewhere, client2, {{c.root, 1}});
    const std::string lock = join_path(c.root, ".lock");
    auto held = fs1->try_lock(lock, "pid 1");
    REQUIRE(held != nullptr);
    CHECK(fs1->try_lock(lock, "pid 2") == nullptr);          // the same client again
    CHECK(fs2->try_lock(lock, "pid 3") == nullptr);          // another client
    CHECK(c.served->try_lock(lock, "pid 4") == nullptr);     // the server's own process
    CHECK(service.open_handles() == 1);
    held.reset();
    CHECK(service.open_handles() == 0);
    auto again = fs2->try_lock(lock, "pid 5");
    CHECK(again != nullptr);
    again.reset();
    // A lock a client never released is released when the service goes; the client's
    // FileLock, destroyed once its peer is unreachable, drops the failure of its release.
    SwitchTransport link;
    std::unique_ptr<FileLock> left;
    {
      FileService short_lived(*c.served);
      LoopbackFileTransport t({nullptr, &short_lived});
      link.next = &t;
      left = make_routed_file_system(elsewhere, link, {{c.root, 1}})->try_lock(lock, "pid 6");
      REQUIRE(left != nullptr);
      CHECK(c.served->try_lock(lock, "pid 7") == nullptr);
      link.next = nullptr;
    }
    CHECK_NOTHROW(left.reset());
    CHECK(c.served->try_lock(lock, "pid 8") != nullptr);
  }
}

TEST_CASE("a handle belongs to the client that opened it, and destroying remote files releases their handles") {
  MemoryFileSystem served = with_r();
  OnePeer peer(served, "/r");
  auto& [elsewhere, service, loop, rec, fs] = peer;
  {
    auto w = fs->create("/r/f", {.direct = true});
    CHECK_FALSE(w->is_direct());  // remote files are always buffered
    CHECK(w->native_handle() == -1);
    CHECK(w->path() == "/r/f");
    w->write_at(1, bytes_of("abc"));  // no alignment asked
    const std::string write_request = rec.requests.back();
    CHECK(reply_code(service.handle(2, write_request)) == Errc::comm_error);  // another client
    CHECK(reply_error(service.handle(0, write_request)) == std::nullopt);   // its own
    w->close();
    auto r = fs->open_read("/r/f");
    CHECK(r->size() == 4);
    CHECK(service.open_handles() == 2);
  }
  CHECK(service.open_handles() == 0);
  // A handle released is gone: naming it again is a comm_error.
  CHECK(reply_code(service.handle(0, rec.requests[1])) == Errc::comm_error);
}

TEST_CASE("a 40 MiB write_at and read_at round trip byte-equal in requests of at most 16 MiB") {
  constexpr std::size_t kSize = (std::size_t{40} << 20) + 12345;
  const auto payload = random_bytes(kSize, 42);
  MemoryFileSystem served = with_r();
  OnePeer peer(served, "/r");
  auto& [elsewhere, service, loop, rec, fs] = peer;
  auto w = fs->create("/r/big", {});
  w->write_at(100, std::as_bytes(std::span(payload)));
  w->sync();
  w->close();
  auto r = fs->open_read("/r/big");
  REQUIRE(r->size() == kSize + 100);
  std::vector<std::uint8_t> back(kSize);
  r->read_at(100, std::as_writable_bytes(std::span(back)));
  CHECK(back == payload);
  CHECK(served.file_bytes("/r/big")->size() == kSize + 100);
  std::size_t pieces = 0;
  for (std::size_t i = 0; i < rec.requests.size(); ++i) {
    CHECK(rec.requests[i].size() <= kMaxRemotePiece + 64);
    CHECK(rec.replies[i].size() <= kMaxRemotePiece + 64);
    pieces += rec.requests[i].size() > (1u << 20) || rec.replies[i].size() > (1u << 20);
  }
  CHECK(pieces == 6);  // 3 pieces each way
}

// A transport that flips one bit of the next request's (or reply's) last payload byte larger
// than `over` bytes: a write's data or a read's bytes damaged on the way between nodes.
class FlippingTransport : public FileTransport {
 public:
  explicit FlippingTransport(FileTransport& next) : next_(next) {}
  bool flip_request = false, flip_reply = false;
  std::string call(int peer, std::string request) override {
    if (flip_request && request.size() > 4096) {
      request[request.size() - 100] ^= 0x10;  // inside the payload (the XXH3 is the last 8 bytes)
      flip_request = false;
    }
    std::string reply = next_.call(peer, std::move(request));
    if (flip_reply && reply.size() > 4096) {
      reply[reply.size() - 100] ^= 0x10;
      flip_reply = false;
    }
    return reply;
  }

 private:
  FileTransport& next_;
};

TEST_CASE("a bit flipped on the way in a write's payload or a read's bytes is refused with checksum_mismatch naming the file, before it is written or used") {
  const auto payload = random_bytes(64 << 10, 7);
  MemoryFileSystem served = with_r();
  FileService service(served);
  LoopbackFileTransport loop({nullptr, &service});
  FlippingTransport flip(loop);
  MemoryFileSystem elsewhere;
  const auto fs = make_routed_file_system(elsewhere, flip, {{"/r", 1}});
  auto w = fs->create("/r/f", {});
  w->write_at(0, std::as_bytes(std::span(payload)));
  // The same bytes again, damaged on the way: refused, and the file keeps what it had.
  flip.flip_request = true;
  std::vector<std::uint8_t> other(payload.size(), 0xab);
  const Error e = expect_error([&] { w->write_at(0, std::as_bytes(std::span(other))); });
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.file() == "/r/f");
  CHECK(e.detail().find("bytes received from process 0 to write at offset 0 do not match the XXH3-64 sent with them") != std::string::npos);
  CHECK(e.expected() != e.actual());
  w->close();
  const auto kept = served.file_bytes("/r/f");
  REQUIRE(kept.has_value());
  CHECK(std::equal(kept->begin(), kept->end(), std::as_bytes(std::span(payload)).begin(), std::as_bytes(std::span(payload)).end()));
  // A read whose bytes are damaged on the way back: refused, the caller's buffer untouched.
  auto r = fs->open_read("/r/f");
  std::vector<std::uint8_t> back(payload.size(), 0x5a);
  flip.flip_reply = true;
  const Error f = expect_error([&] { r->read_at(0, std::as_writable_bytes(std::span(back))); });
  CHECK(f.code() == Errc::checksum_mismatch);
  CHECK(f.file() == "/r/f");
  CHECK(f.detail().find("bytes received from the process serving it, read at offset 0") != std::string::npos);
  CHECK(std::all_of(back.begin(), back.end(), [](std::uint8_t b) { return b == 0x5a; }));
  // Undamaged, the same read succeeds.
  r->read_at(0, std::as_writable_bytes(std::span(back)));
  CHECK(back == payload);
}

TEST_CASE("truncated requests and replies, and requests with bytes left over, are comm_errors") {
  MemoryFileSystem served = with_r();
  OnePeer peer(served, "/r");
  auto& [elsewhere, service, loop, rec, fs] = peer;
  // One request of every kind, recorded.
  fs->create_dirs("/r/d");
  fs->create_dir("/r/e");
  fs->sync_dir("/r/d");
  auto w = fs->create("/r/d/f", {});
  w->allocate(10);
  w->write_at(0, bytes_of("hello"));
  w->truncate(5);
  w->sync();
  auto r = fs->open_read("/r/d/f");
  r->size();
  std::byte buf[5];
  r->read_at(0, buf);
  fs->list_dir("/r/d");
  const std::size_t stat_index = rec.requests.size();
  fs->stat("/r/d/f");
  fs->free_space("/r/d");
  auto lock = fs->try_lock("/r/d/.lock", "record");
  fs->rename("/r/e", "/r/e2");
  fs->remove_all("/r/e2");
  w->close();
  const auto requests = rec.requests;
  const auto replies = rec.replies;
  REQUIRE(requests.size() >= 17);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    CAPTURE(i);
    const std::string& req = requests[i];
    for (std::size_t n = 0; n < req.size(); ++n) CHECK(reply_code(service.handle(0, std::string_view(req).substr(0, n))) == Errc::comm_error);
    CHECK(reply_code(service.handle(0, req + '\0')) == Errc::comm_error);
  }
  // A path with a NUL byte, which the system calls would cut short.
  std::string nul_path = requests[0];
  nul_path[nul_path.size() - 2] = '\0';
  CHECK(reply_code(service.handle(0, nul_path)) == Errc::comm_error);
  // Replies cut short, or with a byte too many, fail the client's call as comm_errors.
  FixedReplyTransport fixed;
  const auto lied_to = make_routed_file_system(elsewhere, fixed, {{"/r", 1}});
  const auto stat_reply = replies[stat_index];
  REQUIRE(stat_reply.size() == 1 + 1 + 1 + 8 * 4);
  fixed.reply = stat_reply;
  CHECK(lied_to->stat("/r/d/f")->size == 5);
  for (std::size_t n = 0; n < stat_reply.size(); ++n) {
    fixed.reply = stat_reply.substr(0, n);
    CHECK(expect_error([&] { lied_to->stat("/r/d/f"); }).code() == Errc::comm_error);
  }
  fixed.reply = stat_reply + 'x';
  CHECK(expect_error([&] { lied_to->stat("/r/d/f"); }).code() == Errc::comm_error);
  fixed.reply = std::string("\x02", 1);
  CHECK(expect_error([&] { lied_to->stat("/r/d/f"); }).code() == Errc::comm_error);
}

TEST_CASE("random garbage requests are answered with comm_error, never a crash, and the service keeps serving") {
  MemoryFileSystem served = with_r();
  CappedFileSystem capped(served);
  OnePeer peer(capped, "/r");
  auto& [elsewhere, service, loop, rec, fs] = peer;
  auto w = fs->create("/r/f", {});
  w->write_at(0, bytes_of("payload"));
  auto r = fs->open_read("/r/f");
  std::byte buf[7];
  r->read_at(0, buf);
  fs->stat("/r/f");
  const auto valid = rec.requests;
  std::mt19937_64 rng(20261202);
  int garbage = 0;
  for (int i = 0; i < 4000; ++i) {
    std::string req(static_cast<std::size_t>(rng() % 300), '\0');
    for (auto& c : req) c = static_cast<char>(rng());
    // Half of them get past the version byte and name a real operation, to reach the decoders.
    if (i % 2 && req.size() >= 2) req[0] = 2, req[1] = static_cast<char>(1 + rng() % 19);
    const std::string reply = service.handle(static_cast<int>(rng() % 3), req);
    const auto e = reply_error(reply);
    if (e && e->code() == Errc::comm_error) ++garbage;
  }
  CHECK(garbage == 4000);
  // Valid requests with random bytes changed: anything may come back, but a reply that decodes.
  for (int i = 0; i < 2000; ++i) {
    std::string req = valid[rng() % valid.size()];
    for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) req[rng() % req.size()] = static_cast<char>(rng());
    const auto e = reply_error(service.handle(0, req));
    if (e) CHECK(e->detail().find("undecodable file reply") == std::string::npos);
  }
  // The changed requests may have written, renamed or removed anything under /r: the service
  // still serves a fresh file.
  fs->create_dirs("/r/after");
  write_file(*fs, "/r/after/f", "payload");
  auto again = fs->open_read("/r/after/f");
  std::string s(7, '\0');
  again->read_at(0, std::as_writable_bytes(std::span(s.data(), s.size())));
  CHECK(s == "payload");
}

TEST_CASE("a checkpoint saved into a routed root loads back and verifies with Verify::full") {
  TempDir dir("ckpt-rfs-save");
  OnePeer peer(posix_file_system(), dir.path().string());
  const std::string root = (dir / "root").string();
  const Fixture fx(2, 10);
  save_checkpoint_sync(*peer.fs, root, fx.request);
  const Fixture fx20(2, 20);
  save_checkpoint_sync(*peer.fs, root, fx20.request);
  auto opened = open_latest(*peer.fs, root, {.expected_world_size = 2});
  CHECK(opened.name == "step-0000000020");
  CHECK_NOTHROW(opened.reader.verify(Verify::full));
  for (int rank = 0; rank < 2; ++rank) {
    const auto shard = opened.reader.load_shard(rank, Verify::full);
    const auto& want = fx20.payload[static_cast<std::size_t>(rank)].blobs[2];  // "f32"
    const auto got = shard.tensor("f32").data;
    REQUIRE(got.size() == want.size());
    CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
  }
  // The bytes are on the server's disk: it opens there without the routing.
  CHECK_NOTHROW(open_latest(posix_file_system(), root, {.expected_world_size = 2}).reader.verify(Verify::full));
  CHECK(list_checkpoints(*peer.fs, root, Verify::full).size() == 2);
  CHECK(peer.service.open_handles() == 0);
}

TEST_CASE("a checkpoint across node roots served by separate processes is committed, checked, and a deleted node root rebuilt bit-exactly") {
  LogCapture quiet;
  constexpr int kNodes = 4;
  // Node 0's root is local; node n's (n >= 1) lives in its own file system behind its own
  // service, reached as peer n.
  MemoryFileSystem local;
  std::vector<std::unique_ptr<MemoryFileSystem>> node_fs;
  std::vector<std::unique_ptr<FileService>> services;
  std::vector<FileService*> peers{nullptr};
  std::vector<FileRoute> routes;
  const std::string dir = "/set";
  const auto roots = node_root_paths(dir, kNodes);
  for (int n = 1; n < kNodes; ++n) {
    node_fs.push_back(std::make_unique<MemoryFileSystem>());
    services.push_back(std::make_unique<FileService>(*node_fs.back()));
    peers.push_back(services.back().get());
    routes.push_back({roots[static_cast<std::size_t>(n)], n});
  }
  LoopbackFileTransport transport(peers);
  const auto fs = make_routed_file_system(local, transport, routes);
  const auto scheme = parse_redundancy("rs:3+1");
  REQUIRE(scheme.has_value());
  const Fixture fx(kNodes, 10);
  std::vector<std::vector<std::uint8_t>> images;
  const Manifest m = test::save_node_checkpoint(*fs, dir, kNodes, *scheme, fx.request, &images);
  const std::string name = checkpoint_dir_name(m.step);
  // Every node's files went to its own process: node n's file system holds node n's root only.
  CHECK(local.stat(join_path(roots[0], name)).has_value());
  for (int n = 1; n < kNodes; ++n) {
    MemoryFileSystem& nfs = *node_fs[static_cast<std::size_t>(n - 1)];
    CHECK(nfs.stat(join_path(roots[static_cast<std::size_t>(n)], name)).has_value());
    CHECK_FALSE(nfs.stat(roots[0]).has_value());
    CHECK(read_latest(nfs, roots[static_cast<std::size_t>(n)]) == name);
  }
  CHECK(read_latest_nodes(*fs, roots) == name);
  CHECK(check_node_checkpoint(*fs, roots, name, Verify::full).healthy());

  // Node 2's root is lost; the repair, run from this process, rebuilds it through its service.
  MemoryFileSystem& node2 = *node_fs[1];
  const Tree before = snapshot(node2, roots[2]);
  REQUIRE(before.size() > 2);
  node2.remove_all(roots[2]);
  const NodeCheckpointHealth h = check_node_checkpoint(*fs, roots, name, Verify::full);
  CHECK_FALSE(h.healthy());
  CHECK(h.recoverable());
  CHECK(h.bad_ranks == std::vector<int>{2});
  const RepairReport rep = repair_node_checkpoint(*fs, roots, name, Verify::full);
  CHECK(rep.rebuilt_ranks == std::vector<int>{2});
  CHECK(snapshot(node2, roots[2]) == before);
  CHECK(check_node_checkpoint(*fs, roots, name, Verify::full).healthy());
  const CheckpointReader reader = test::repair_then_open_latest(*fs, roots, kNodes, Verify::full);
  for (int r = 0; r < kNodes; ++r) {
    const auto shard = reader.load_shard(r, Verify::full);
    const auto bytes = shard.file_bytes();
    const auto& want = images[static_cast<std::size_t>(r)];
    REQUIRE(bytes.size() == want.size());
    CHECK(std::memcmp(bytes.data(), want.data(), want.size()) == 0);
  }
  // A second step, then rotation to one: step 10 goes on every node, through the services.
  const Fixture fx20(kNodes, 20);
  test::save_node_checkpoint(*fs, dir, kNodes, *scheme, fx20.request);
  rotate_node_checkpoints(*fs, roots, 1, checkpoint_dir_name(20));
  for (int n = 1; n < kNodes; ++n) CHECK_FALSE(node_fs[static_cast<std::size_t>(n - 1)]->stat(join_path(roots[static_cast<std::size_t>(n)], name)));
  CHECK_FALSE(local.stat(join_path(roots[0], name)));
  for (const auto& s : services) CHECK(s->open_handles() == 0);
}
