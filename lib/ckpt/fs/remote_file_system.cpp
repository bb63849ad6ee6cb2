// SPDX-License-Identifier: Apache-2.0
// The routed file system and its server (contracts and wire format in remote_file_system.hpp).
//
// One request, one reply: the client encodes the call (Encoder), the transport moves the
// bytes, FileService::handle decodes them (Decoder: every length checked against what is
// left), runs the call on its FileSystem and encodes the result or the error; the client
// decodes the reply the same defensive way and returns the result or rethrows the error.
// Open files and locks stay on the server under a handle id the client names in later
// requests and releases when its object is destroyed.
#include "ckpt/fs/remote_file_system.hpp"

#include "ckpt/hash/xxh3.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>

namespace ckpt {

namespace {

constexpr std::uint8_t kVersion = 2;  // 2: write and read payloads carry their XXH3-64
constexpr std::uint8_t kOk = 0;
constexpr std::uint8_t kFailed = 1;

enum class Op : std::uint8_t {
  create = 1,
  open_read,
  create_dir,
  create_dirs,
  sync_dir,
  rename,
  remove_all,
  list_dir,
  stat,
  try_lock,
  free_space,
  write_at,
  allocate,
  truncate,
  sync,
  close,
  read_size,
  read_at,
  release,
};
constexpr std::uint8_t kLastOp = static_cast<std::uint8_t>(Op::release);

class Encoder {
 public:
  Encoder& u8(std::uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  Encoder& u32(std::uint32_t v) { return little_endian(v, 4); }
  Encoder& u64(std::uint64_t v) { return little_endian(v, 8); }
  Encoder& i32(std::int32_t v) { return u32(static_cast<std::uint32_t>(v)); }
  Encoder& i64(std::int64_t v) { return u64(static_cast<std::uint64_t>(v)); }
  /// A presence byte; last_flag() returns it, so that `if (out.flag(x).last_flag()) out.u64(...)`
  /// encodes an optional value.
  Encoder& flag(bool f) { return u8(f ? 1 : 0); }
  bool last_flag() const noexcept { return !out_.empty() && out_.back() == 1; }
  Encoder& op(Op o) { return u8(kVersion).u8(static_cast<std::uint8_t>(o)); }
  Encoder& str(std::string_view s) {
    if (s.size() > std::numeric_limits<std::uint32_t>::max()) throw_invalid("a string of more than 4 GiB in a file request");
    u32(static_cast<std::uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  Encoder& bytes(std::span<const std::byte> b) { return str(std::string_view(reinterpret_cast<const char*>(b.data()), b.size())); }
  /// A string of `n` zero bytes, to be filled in place through the span returned (valid until
  /// the next call): a read lands in the reply without another copy.
  std::span<std::byte> str_space(std::uint32_t n) {
    u32(n);
    const std::size_t at = out_.size();
    out_.resize(at + n);
    return std::as_writable_bytes(std::span(out_.data() + at, n));
  }
  std::string take() { return std::move(out_); }

 private:
  Encoder& little_endian(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  std::string out_;
};

// A write's or a read's payload arrived as it was sent: its XXH3-64 is the one the sender
// computed, or Errc::checksum_mismatch naming the file, before the bytes are kept or used.
void check_payload(const std::string& file, const std::string& what, std::string_view data, std::uint64_t sent) {
  const std::uint64_t got = xxh3_64(data.data(), data.size());
  if (got != sent) throw Error(Errc::checksum_mismatch, file, what + " do not match the XXH3-64 sent with them", xxh3_hex(sent), xxh3_hex(got));
}

// Reads a message front to back; anything that does not fit throws Errc::comm_error naming
// `what` ("file request", "file reply"), never reading past the end.
class Decoder {
 public:
  Decoder(std::string_view in, const char* what) : in_(in), what_(what) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(little_endian(1)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(little_endian(4)); }
  std::uint64_t u64() { return little_endian(8); }
  std::int32_t i32() { return static_cast<std::int32_t>(u32()); }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  std::string_view str() {
    const std::uint32_t n = u32();
    return take(n, "a string");
  }
  /// A path: a string without NUL bytes (the system calls would cut it there).
  std::string path() {
    const std::string_view p = str();
    if (p.find('\0') != std::string_view::npos) fail("a path without NUL bytes", "a NUL byte in the path");
    return std::string(p);
  }
  EntryType type() {
    const std::uint8_t t = u8();
    if (t > static_cast<std::uint8_t>(EntryType::other)) fail("an entry type 0..3", std::to_string(t));
    return static_cast<EntryType>(t);
  }
  bool flag() {
    const std::uint8_t f = u8();
    if (f > 1) fail("a flag 0 or 1", std::to_string(f));
    return f == 1;
  }
  std::size_t left() const noexcept { return in_.size() - pos_; }
  /// The message must end here.
  void done() {
    if (left() != 0) fail("the end of the message", std::to_string(left()) + " more bytes");
  }
  [[noreturn]] void fail(const std::string& expected, const std::string& actual) const {
    throw Error(Errc::comm_error, {}, std::string("undecodable ") + what_ + " at byte " + std::to_string(pos_), expected, actual);
  }

 private:
  std::string_view take(std::size_t n, const char* field) {
    if (n > left()) fail(std::string(field) + " of " + std::to_string(n) + " bytes", std::to_string(left()) + " bytes left");
    const std::string_view s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  std::uint64_t little_endian(std::size_t n) {
    const std::string_view s = take(n, "an integer");
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
    return v;
  }
  std::string_view in_;
  std::size_t pos_ = 0;
  const char* what_;
};

Encoder ok_reply() { return std::move(Encoder().u8(kOk)); }

std::string error_reply(const Error& e) {
  return Encoder()
      .u8(kFailed)
      .i32(static_cast<std::int32_t>(e.code()))
      .str(e.file())
      .str(e.detail())
      .str(e.expected())
      .str(e.actual())
      .i32(e.sys_errno())
      .take();
}

// The error a reply carries after its status byte 1.
Error decode_error(Decoder& in) {
  const std::int32_t code = in.i32();
  if (code < 0 || code > static_cast<std::int32_t>(kLastErrc)) in.fail("an error code 0.." + std::to_string(static_cast<int>(kLastErrc)), std::to_string(code));
  std::string file(in.str()), detail(in.str()), expected(in.str()), actual(in.str());
  const int err = in.i32();
  in.done();
  return Error(static_cast<Errc>(code), std::move(file), std::move(detail), std::move(expected), std::move(actual), err);
}

std::span<const std::byte> as_bytes_of(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

}  // namespace

// ---- the server ---------------------------------------------------------------------------

namespace {
// What a client holds open on the server: one of a file being written, a file being read or
// a lock. Shared pointers, so that a call on a file runs outside the map's mutex.
struct Held {
  int client = 0;
  std::shared_ptr<WritableFile> writer;
  std::shared_ptr<ReadableFile> reader;
  std::shared_ptr<FileLock> lock;
};
}  // namespace

struct FileService::State {
  FileSystem& fs;
  mutable std::mutex mu;
  std::unordered_map<std::uint64_t, Held> held;
  std::uint64_t next_id = 1;

  explicit State(FileSystem& f) : fs(f) {}

  std::uint64_t add(Held h) {
    std::lock_guard lock(mu);
    const std::uint64_t id = next_id++;
    held.emplace(id, std::move(h));
    return id;
  }
  // The handle `id` of `client`, copied out of the map (a comm_error if it has none such).
  Held find(int client, std::uint64_t id) const {
    std::lock_guard lock(mu);
    const auto it = held.find(id);
    if (it == held.end() || it->second.client != client) throw unknown(client, id);
    return it->second;
  }
  std::shared_ptr<WritableFile> writer(int client, std::uint64_t id) const {
    auto w = find(client, id).writer;
    if (!w) throw unknown(client, id);
    return w;
  }
  std::shared_ptr<ReadableFile> reader(int client, std::uint64_t id) const {
    auto r = find(client, id).reader;
    if (!r) throw unknown(client, id);
    return r;
  }
  // Takes the handle out of the map; the caller's copy closes or unlocks when it goes.
  Held release(int client, std::uint64_t id) {
    std::lock_guard lock(mu);
    const auto it = held.find(id);
    if (it == held.end() || it->second.client != client) throw unknown(client, id);
    Held h = std::move(it->second);
    held.erase(it);
    return h;
  }
  static Error unknown(int client, std::uint64_t id) {
    return Error(Errc::comm_error, {}, "file request names handle " + std::to_string(id), "a handle process " + std::to_string(client) + " holds open",
                 "none such");
  }

  std::string execute(int client, std::string_view request);
  static bool takes_one_path(Op op) noexcept;
  void on_path(int client, Op op, const std::string& path, Encoder& out);
};

std::string FileService::State::execute(int client, std::string_view request) {
  Decoder in(request, "file request");
  const std::uint8_t version = in.u8();
  if (version != kVersion) in.fail("protocol version " + std::to_string(kVersion), std::to_string(version));
  const std::uint8_t op_byte = in.u8();
  if (op_byte == 0 || op_byte > kLastOp) in.fail("an operation 1.." + std::to_string(kLastOp), std::to_string(op_byte));
  const Op op = static_cast<Op>(op_byte);
  Encoder out = ok_reply();
  if (takes_one_path(op)) {
    const std::string path = in.path();
    in.done();
    on_path(client, op, path, out);
    return out.take();
  }
  switch (op) {
    case Op::rename: {
      const std::string from = in.path(), to = in.path();
      in.done();
      fs.rename(from, to);
      break;
    }
    case Op::try_lock: {
      const std::string path = in.path();
      const std::string_view record = in.str();
      in.done();
      std::shared_ptr<FileLock> lock = fs.try_lock(path, record);
      if (out.flag(lock != nullptr).last_flag()) out.u64(add({client, nullptr, nullptr, std::move(lock)}));
      break;
    }
    case Op::write_at: {
      const std::uint64_t id = in.u64(), offset = in.u64();
      const std::string_view data = in.str();
      const std::uint64_t sent = in.u64();
      in.done();
      const auto file = writer(client, id);
      check_payload(file->path(), "bytes received from process " + std::to_string(client) + " to write at offset " + std::to_string(offset), data, sent);
      file->write_at(offset, as_bytes_of(data));
      break;
    }
    case Op::allocate:
    case Op::truncate: {
      const std::uint64_t id = in.u64(), size = in.u64();
      in.done();
      if (op == Op::allocate) writer(client, id)->allocate(size);
      else writer(client, id)->truncate(size);
      break;
    }
    case Op::sync:
    case Op::close: {
      const std::uint64_t id = in.u64();
      in.done();
      if (op == Op::sync) writer(client, id)->sync();
      else writer(client, id)->close();
      break;
    }
    case Op::read_size: {
      const std::uint64_t id = in.u64();
      in.done();
      out.u64(reader(client, id)->size());
      break;
    }
    case Op::read_at: {
      const std::uint64_t id = in.u64(), offset = in.u64(), length = in.u64();
      in.done();
      if (length > kMaxRemotePiece) in.fail("a read of at most " + std::to_string(kMaxRemotePiece) + " bytes", std::to_string(length) + " bytes");
      const auto file = reader(client, id);
      const auto got = out.str_space(static_cast<std::uint32_t>(length));
      file->read_at(offset, got);
      out.u64(xxh3_64(got));
      break;
    }
    case Op::release: {
      const std::uint64_t id = in.u64();
      in.done();
      release(client, id);  // closed or unlocked here, outside the map's mutex
      break;
    }
    default:
      break;  // the ops that take one path, above
  }
  return out.take();
}

bool FileService::State::takes_one_path(Op op) noexcept {
  switch (op) {
    case Op::create:
    case Op::open_read:
    case Op::create_dir:
    case Op::create_dirs:
    case Op::sync_dir:
    case Op::remove_all:
    case Op::list_dir:
    case Op::stat:
    case Op::free_space:
      return true;
    default:
      return false;
  }
}

void FileService::State::on_path(int client, Op op, const std::string& path, Encoder& out) {
  switch (op) {
    case Op::create:
      out.u64(add({client, std::shared_ptr<WritableFile>(fs.create(path, WriteOptions{})), nullptr, nullptr}));  // always buffered
      return;
    case Op::open_read:
      out.u64(add({client, nullptr, std::shared_ptr<ReadableFile>(fs.open_read(path)), nullptr}));
      return;
    case Op::create_dir: return fs.create_dir(path);
    case Op::create_dirs: return fs.create_dirs(path);
    case Op::sync_dir: return fs.sync_dir(path);
    case Op::remove_all: return fs.remove_all(path);
    case Op::list_dir: {
      const auto entries = fs.list_dir(path);
      out.u32(static_cast<std::uint32_t>(entries.size()));
      for (const auto& e : entries) out.u8(static_cast<std::uint8_t>(e.type)).str(e.name);
      return;
    }
    case Op::stat:
      if (const auto st = fs.stat(path); out.flag(st.has_value()).last_flag())
        out.u8(static_cast<std::uint8_t>(st->type)).u64(st->size).u64(st->device).u64(st->inode).i64(st->mtime_ns);
      return;
    case Op::free_space:
      if (const auto space = fs.free_space(path); out.flag(space.has_value()).last_flag()) out.u64(*space);
      return;
    default:
      return;
  }
}

FileService::FileService(FileSystem& local) : state_(std::make_unique<State>(local)) {}

FileService::~FileService() = default;

std::string FileService::handle(int client, std::string_view request) {
  try {
    try {
      return state_->execute(client, request);
    } catch (...) {
      return error_reply(to_error(std::current_exception()));
    }
  } catch (...) {
    // Out of memory while encoding the error: a reply the client cannot decode, which it
    // reports as Errc::comm_error.
    return {};
  }
}

std::size_t FileService::open_handles() const {
  std::lock_guard lock(state_->mu);
  return state_->held.size();
}

std::optional<Error> reply_error(std::string_view reply) {
  try {
    Decoder in(reply, "file reply");
    const std::uint8_t status = in.u8();
    if (status == kOk) return std::nullopt;
    if (status != kFailed) in.fail("status 0 or 1", std::to_string(status));
    return decode_error(in);
  } catch (const Error& e) {
    return e;
  }
}

// ---- the client ---------------------------------------------------------------------------

namespace {

// A successful reply, positioned after its status byte; constructing it from a failed one
// throws the error it carries. Not movable: `in` looks into `bytes`.
struct Reply {
  std::string bytes;
  Decoder in;
  explicit Reply(std::string b) : bytes(std::move(b)), in(bytes, "file reply") {
    if (auto e = reply_error(bytes)) throw std::move(*e);
    in.u8();
  }
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
};

// One peer through one transport.
struct Link {
  FileTransport* transport;
  int peer;

  Reply call(Encoder& request) const {
    std::string reply;
    try {
      reply = transport->call(peer, request.take());
    } catch (...) {
      // Whatever stopped the transport is a communication failure, whatever it threw.
      const Error e = to_error(std::current_exception());
      if (e.code() == Errc::comm_error) throw e;
      throw Error(Errc::comm_error, e.file(), "file request to process " + std::to_string(peer) + " failed: " + e.what());
    }
    return Reply(std::move(reply));
  }
  // A request whose reply carries nothing.
  void run(Encoder& request) const { call(request).in.done(); }
  // Releases a handle; for destructors, so it drops every error.
  void release(std::uint64_t id) const noexcept {
    try {
      Encoder r;
      r.op(Op::release).u64(id);
      run(r);
    } catch (...) {
    }
  }
};

class RemoteWritableFile final : public WritableFile {
 public:
  RemoteWritableFile(Link link, std::uint64_t id, std::string path) : link_(link), id_(id), path_(std::move(path)) {}
  ~RemoteWritableFile() override { link_.release(id_); }
  void write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    // An empty write still goes once: the server's file decides what it does.
    do {
      const auto piece = data.first(std::min(data.size(), kMaxRemotePiece));
      Encoder r;
      r.op(Op::write_at).u64(id_).u64(offset).bytes(piece).u64(xxh3_64(piece));
      link_.run(r);
      data = data.subspan(piece.size());
      offset += piece.size();
    } while (!data.empty());
  }
  void allocate(std::uint64_t size) override { sized(Op::allocate, size); }
  void truncate(std::uint64_t size) override { sized(Op::truncate, size); }
  void sync() override {
    Encoder r;
    r.op(Op::sync).u64(id_);
    link_.run(r);
  }
  void close() override {
    if (closed_) return;
    Encoder r;
    r.op(Op::close).u64(id_);
    link_.run(r);
    closed_ = true;
  }
  int native_handle() const noexcept override { return -1; }
  bool is_direct() const noexcept override { return false; }
  const std::string& path() const noexcept override { return path_; }

 private:
  void sized(Op op, std::uint64_t size) {
    Encoder r;
    r.op(op).u64(id_).u64(size);
    link_.run(r);
  }
  Link link_;
  std::uint64_t id_;
  std::string path_;
  bool closed_ = false;
};

class RemoteReadableFile final : public ReadableFile {
 public:
  RemoteReadableFile(Link link, std::uint64_t id, std::string path) : link_(link), id_(id), path_(std::move(path)) {}
  ~RemoteReadableFile() override { link_.release(id_); }
  std::uint64_t size() const override {
    Encoder r;
    r.op(Op::read_size).u64(id_);
    Reply reply = link_.call(r);
    const std::uint64_t n = reply.in.u64();
    reply.in.done();
    return n;
  }
  void read_at(std::uint64_t offset, std::span<std::byte> data) const override {
    do {  // an empty read goes once too, as the empty write
      const auto piece = data.first(std::min(data.size(), kMaxRemotePiece));
      Encoder r;
      r.op(Op::read_at).u64(id_).u64(offset).u64(piece.size());
      Reply reply = link_.call(r);
      const std::string_view got = reply.in.str();
      const std::uint64_t sent = reply.in.u64();
      reply.in.done();
      if (got.size() != piece.size()) reply.in.fail(std::to_string(piece.size()) + " bytes read", std::to_string(got.size()) + " bytes");
      check_payload(path_, "bytes received from the process serving it, read at offset " + std::to_string(offset), got, sent);
      std::memcpy(piece.data(), got.data(), got.size());
      data = data.subspan(piece.size());
      offset += piece.size();
    } while (!data.empty());
  }
  const std::string& path() const noexcept override { return path_; }

 private:
  Link link_;
  std::uint64_t id_;
  std::string path_;
};

class RemoteLock final : public FileLock {
 public:
  RemoteLock(Link link, std::uint64_t id) : link_(link), id_(id) {}
  ~RemoteLock() override { link_.release(id_); }

 private:
  Link link_;
  std::uint64_t id_;
};

class RoutedFileSystem final : public FileSystem {
 public:
  RoutedFileSystem(FileSystem& local, FileTransport& transport, std::vector<FileRoute> routes)
      : local_(local), transport_(transport), routes_(std::move(routes)) {
    for (auto& r : routes_)
      while (r.root.size() > 1 && r.root.back() == '/') r.root.pop_back();
    // Longest root first: the first match is the most specific route.
    std::stable_sort(routes_.begin(), routes_.end(), [](const FileRoute& a, const FileRoute& b) { return a.root.size() > b.root.size(); });
  }

  std::unique_ptr<WritableFile> create(const std::string& path, const WriteOptions& opts) override {
    return forward(
        Op::create, path, [&] { return local_.create(path, opts); },
        [&](Decoder& in, const Link& link) -> std::unique_ptr<WritableFile> { return std::make_unique<RemoteWritableFile>(link, in.u64(), path); });
  }
  std::unique_ptr<ReadableFile> open_read(const std::string& path) override {
    return forward(
        Op::open_read, path, [&] { return local_.open_read(path); },
        [&](Decoder& in, const Link& link) -> std::unique_ptr<ReadableFile> { return std::make_unique<RemoteReadableFile>(link, in.u64(), path); });
  }
  void create_dir(const std::string& path) override { forward(Op::create_dir, path, [&] { local_.create_dir(path); }, nothing); }
  void create_dirs(const std::string& path) override { forward(Op::create_dirs, path, [&] { local_.create_dirs(path); }, nothing); }
  void sync_dir(const std::string& path) override { forward(Op::sync_dir, path, [&] { local_.sync_dir(path); }, nothing); }
  void remove_all(const std::string& path) override { forward(Op::remove_all, path, [&] { local_.remove_all(path); }, nothing); }
  void rename(const std::string& from, const std::string& to) override {
    const auto a = route(from), b = route(to);
    const int pa = a ? a->peer : -1, pb = b ? b->peer : -1;
    if (pa != pb)
      throw Error(Errc::invalid_argument, from, "rename " + from + " -> " + to + " across processes", "both paths on " + where(pa),
                  "the target on " + where(pb));
    if (!a) return local_.rename(from, to);
    Encoder r;
    r.op(Op::rename).str(from).str(to);
    a->run(r);
  }
  std::vector<DirEntry> list_dir(const std::string& path) override {
    return forward(
        Op::list_dir, path, [&] { return local_.list_dir(path); },
        [](Decoder& in, const Link&) {
          const std::uint32_t n = in.u32();
          std::vector<DirEntry> entries;
          entries.reserve(std::min<std::size_t>(n, in.left() / 5));  // 5 bytes at least per entry
          for (std::uint32_t i = 0; i < n; ++i) {
            const EntryType type = in.type();
            entries.push_back({std::string(in.str()), type});
          }
          return entries;
        });
  }
  std::optional<FileStat> stat(const std::string& path) override {
    return forward(
        Op::stat, path, [&] { return local_.stat(path); },
        [](Decoder& in, const Link&) -> std::optional<FileStat> {
          if (!in.flag()) return std::nullopt;
          FileStat s{};
          s.type = in.type();
          s.size = in.u64();
          s.device = in.u64();
          s.inode = in.u64();
          s.mtime_ns = in.i64();
          return s;
        });
  }
  std::unique_ptr<FileLock> try_lock(const std::string& path, std::string_view record) override {
    const auto link = route(path);
    if (!link) return local_.try_lock(path, record);
    Encoder r;
    r.op(Op::try_lock).str(path).str(record);
    Reply reply = link->call(r);
    std::unique_ptr<FileLock> lock;
    if (reply.in.flag()) lock = std::make_unique<RemoteLock>(*link, reply.in.u64());
    reply.in.done();  // a reply with trailing bytes: the lock just made releases it again
    return lock;
  }
  std::optional<std::uint64_t> free_space(const std::string& path) noexcept override {
    try {
      return forward(
          Op::free_space, path, [&] { return local_.free_space(path); },
          [](Decoder& in, const Link&) { return in.flag() ? std::optional<std::uint64_t>(in.u64()) : std::nullopt; });
    } catch (...) {
      return std::nullopt;
    }
  }

 private:
  static void nothing(Decoder&, const Link&) {}

  // The one path of every call on one path: `local` when `path` is not routed; else `op` with
  // `path` to its peer, the reply's results read by `decode`, which must read all of them.
  template <class Local, class Decode>
  std::invoke_result_t<Local&> forward(Op op, const std::string& path, Local&& local, Decode&& decode) {
    const auto link = route(path);
    if (!link) return local();
    Encoder r;
    r.op(op).str(path);
    Reply reply = link->call(r);
    if constexpr (std::is_void_v<decltype(decode(reply.in, *link))>) {
      decode(reply.in, *link);
      reply.in.done();
    } else {
      auto result = decode(reply.in, *link);
      reply.in.done();
      return result;
    }
  }
  // The peer `path` goes to, or nullopt for local_.
  std::optional<Link> route(const std::string& path) const noexcept {
    for (const auto& r : routes_) {
      const std::string_view root = r.root;
      const bool below = root == "/" ? path.starts_with('/')
                                     : path.size() > root.size() && path.starts_with(root) && path[root.size()] == '/';
      if (path == root || below) return Link{&transport_, r.peer};
    }
    return std::nullopt;
  }
  static std::string where(int peer) { return peer < 0 ? "this process" : "process " + std::to_string(peer); }

  FileSystem& local_;
  FileTransport& transport_;
  std::vector<FileRoute> routes_;
};

}  // namespace

std::unique_ptr<FileSystem> make_routed_file_system(FileSystem& local, FileTransport& transport, std::vector<FileRoute> routes) {
  return std::make_unique<RoutedFileSystem>(local, transport, std::move(routes));
}

// ---- the loopback transport ---------------------------------------------------------------

LoopbackFileTransport::LoopbackFileTransport(std::vector<FileService*> services, int self) : services_(std::move(services)), self_(self) {}

std::string LoopbackFileTransport::call(int peer, std::string request) {
  if (peer < 0 || static_cast<std::size_t>(peer) >= services_.size() || !services_[static_cast<std::size_t>(peer)])
    throw Error(Errc::comm_error, {}, "file request to process " + std::to_string(peer), "a process with a FileService", "none");
  return services_[static_cast<std::size_t>(peer)]->handle(self_, request);
}

}  // namespace ckpt
