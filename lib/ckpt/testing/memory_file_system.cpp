// SPDX-License-Identifier: Apache-2.0
#include "ckpt/testing/memory_file_system.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include "ckpt/core/error.hpp"

namespace ckpt::testing {

namespace {

// Symlinks followed while resolving one path before giving up with ELOOP (Linux: 40).
constexpr int kMaxSymlinkHops = 40;
// Largest file this in-memory tree holds: a write past it is EFBIG, not an allocation of
// whatever offset a caller (or a fuzzer) came up with.
constexpr std::uint64_t kMaxFileBytes = 4ull << 30;

struct Node {
  EntryType type = EntryType::file;
  std::vector<std::byte> data;  // regular file
  std::string target;           // symlink
  std::map<std::string, std::shared_ptr<Node>, std::less<>> children;  // directory, sorted by name
  bool locked = false;          // a FileLock holds it (try_lock); not copied by clone()
  // FileStat's identity: inode numbers unique across every instance (a cache keyed on them
  // never takes one tree's file for another's), and a version bumped by every change of
  // the bytes, standing for the modification time.
  std::uint64_t inode = next_number();
  std::uint64_t version = next_number();

  static std::uint64_t next_number() {
    static std::atomic<std::uint64_t> counter{0};
    return ++counter;
  }
  void touch() { version = next_number(); }
};

std::shared_ptr<Node> make_node(EntryType t) {
  auto n = std::make_shared<Node>();
  n->type = t;
  return n;
}

std::shared_ptr<Node> deep_copy(const Node& n) {
  auto out = std::make_shared<Node>();
  out->type = n.type;
  out->data = n.data;
  out->target = n.target;
  for (const auto& [name, child] : n.children) out->children.emplace(name, deep_copy(*child));
  return out;
}

std::deque<std::string> split(std::string_view path) {
  std::deque<std::string> out;
  std::size_t i = 0;
  while (i < path.size()) {
    const std::size_t j = std::min(path.find('/', i), path.size());
    if (j > i && path.substr(i, j - i) != ".") out.emplace_back(path.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// A failed lookup, carried as the errno the POSIX call would have set.
struct LookupError {
  int err;
};

// Where a path leads: the directory holding the last component and its name, and the entry
// of that name if it exists. `dir` is null when the path names the root (or ends in "..").
struct Resolved {
  std::shared_ptr<Node> dir;
  std::string name;
  std::shared_ptr<Node> node;
};

}  // namespace

struct MemoryFileSystem::State {
  mutable std::mutex mu;
  std::shared_ptr<Node> root = make_node(EntryType::directory);

  // Walks `path` from the root, following symlinks in the middle of the path (and in the last
  // component only when `follow_last`). Throws LookupError (ENOENT, ENOTDIR, ELOOP).
  Resolved resolve(std::string_view path, bool follow_last) const {
    std::vector<std::shared_ptr<Node>> stack{root};
    std::deque<std::string> todo = split(path);
    int hops = 0;
    while (!todo.empty()) {
      const std::string c = std::move(todo.front());
      todo.pop_front();
      const bool last = todo.empty();
      if (c == "..") {
        if (stack.size() > 1) stack.pop_back();
        continue;
      }
      Node& cur = *stack.back();
      const auto it = cur.children.find(c);
      if (it == cur.children.end()) {
        if (last) return {stack.back(), c, nullptr};
        throw LookupError{ENOENT};
      }
      const std::shared_ptr<Node> n = it->second;
      if (n->type == EntryType::symlink && (!last || follow_last)) {
        if (++hops > kMaxSymlinkHops) throw LookupError{ELOOP};
        if (!n->target.empty() && n->target.front() == '/') stack.resize(1);
        auto parts = split(n->target);
        todo.insert(todo.begin(), parts.begin(), parts.end());
        continue;
      }
      if (last) return {stack.back(), c, n};
      if (n->type != EntryType::directory) throw LookupError{ENOTDIR};
      stack.push_back(n);
    }
    return {nullptr, {}, stack.back()};
  }

  // resolve() for a call that reports failures as `action` failed on `path`.
  Resolved resolve_or_throw(const std::string& path, bool follow_last, std::string_view action) const {
    try {
      return resolve(path, follow_last);
    } catch (const LookupError& e) {
      throw_errno(e.err, action, path);
    }
  }

  // Replaces (or adds) the entry at `path`, creating missing parent directories.
  void put(const std::string& path, std::shared_ptr<Node> node) {
    auto parts = split(path);
    if (parts.empty()) throw_errno(EEXIST, "put", path);
    std::shared_ptr<Node> dir = root;
    std::string prefix;
    for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
      prefix += "/" + parts[i];
      Resolved r = resolve_or_throw(prefix, true, "put");
      if (!r.node) {
        r.node = make_node(EntryType::directory);
        r.dir->children[r.name] = r.node;
      } else if (r.node->type != EntryType::directory) {
        throw_errno(ENOTDIR, "put", prefix);
      }
      dir = r.node;
    }
    dir->children[parts.back()] = std::move(node);
  }
};

namespace {

class MemoryWritableFile final : public WritableFile {
 public:
  MemoryWritableFile(std::shared_ptr<void> keep_state, std::mutex& mu, std::shared_ptr<Node> node, std::string path)
      : keep_(std::move(keep_state)), mu_(mu), node_(std::move(node)), path_(std::move(path)) {}

  void write_at(std::uint64_t offset, std::span<const std::byte> data) override {
    std::lock_guard lk(mu_);
    check_open("pwrite");
    std::uint64_t end;
    if (__builtin_add_overflow(offset, data.size(), &end) || end > kMaxFileBytes) throw_errno(EFBIG, "pwrite", path_);
    if (end > node_->data.size()) node_->data.resize(static_cast<std::size_t>(end));
    if (!data.empty()) std::memcpy(node_->data.data() + offset, data.data(), data.size());
    node_->touch();
  }
  void allocate(std::uint64_t size) override {
    std::lock_guard lk(mu_);
    check_open("fallocate");
    // posix_fallocate extends the file to `size` when it is shorter, never shrinks it.
    if (size > kMaxFileBytes) throw_errno(EFBIG, "fallocate", path_);
    if (size > node_->data.size()) node_->data.resize(static_cast<std::size_t>(size));
    node_->touch();
  }
  void truncate(std::uint64_t size) override {
    std::lock_guard lk(mu_);
    check_open("ftruncate");
    if (size > kMaxFileBytes) throw_errno(EFBIG, "ftruncate", path_);
    node_->data.resize(static_cast<std::size_t>(size));
    node_->touch();
  }
  void sync() override {
    std::lock_guard lk(mu_);
    check_open("fsync");
  }
  void close() override {
    std::lock_guard lk(mu_);
    open_ = false;
  }
  int native_handle() const noexcept override { return -1; }
  bool is_direct() const noexcept override { return false; }
  const std::string& path() const noexcept override { return path_; }

 private:
  void check_open(std::string_view action) const {
    if (!open_) throw_errno(EBADF, action, path_);
  }
  std::shared_ptr<void> keep_;  // the State owning mu_
  std::mutex& mu_;
  std::shared_ptr<Node> node_;
  std::string path_;
  bool open_ = true;
};

class MemoryReadableFile final : public ReadableFile {
 public:
  MemoryReadableFile(std::shared_ptr<void> keep_state, std::mutex& mu, std::shared_ptr<Node> node, std::string path,
                     std::uint64_t size)
      : keep_(std::move(keep_state)), mu_(mu), node_(std::move(node)), path_(std::move(path)), size_(size) {}

  std::uint64_t size() const override { return size_; }
  void read_at(std::uint64_t offset, std::span<std::byte> data) const override {
    std::lock_guard lk(mu_);
    const std::uint64_t have = node_->data.size();
    std::uint64_t end;
    if (__builtin_add_overflow(offset, data.size(), &end) || end > have)
      throw Error(Errc::size_mismatch, path_, "file ended early",
                  "at least " + (end >= offset ? std::to_string(end) : std::string("2^64")) + " bytes",
                  std::to_string(std::min(offset, have)) + " bytes");
    if (!data.empty()) std::memcpy(data.data(), node_->data.data() + offset, data.size());
  }
  const std::string& path() const noexcept override { return path_; }

 private:
  std::shared_ptr<void> keep_;
  std::mutex& mu_;
  std::shared_ptr<Node> node_;
  std::string path_;
  std::uint64_t size_;
};

// Held on a node, as flock is held on an inode: the lock follows the file through renames.
class MemoryFileLock final : public FileLock {
 public:
  MemoryFileLock(std::shared_ptr<void> keep_state, std::mutex& mu, std::shared_ptr<Node> node)
      : keep_(std::move(keep_state)), mu_(mu), node_(std::move(node)) {}
  ~MemoryFileLock() override {
    std::lock_guard lk(mu_);
    node_->locked = false;
  }

 private:
  std::shared_ptr<void> keep_;
  std::mutex& mu_;
  std::shared_ptr<Node> node_;
};

// True if `target` is `from` or lies anywhere below it.
bool contains(const Node& from, const Node* target) {
  if (&from == target) return true;
  for (const auto& [name, child] : from.children)
    if (child->type == EntryType::directory && contains(*child, target)) return true;
  return false;
}

}  // namespace

MemoryFileSystem::MemoryFileSystem() : state_(std::make_shared<State>()) {}
MemoryFileSystem::~MemoryFileSystem() = default;
MemoryFileSystem::MemoryFileSystem(MemoryFileSystem&&) noexcept = default;
MemoryFileSystem& MemoryFileSystem::operator=(MemoryFileSystem&&) noexcept = default;

MemoryFileSystem MemoryFileSystem::clone() const {
  MemoryFileSystem out;
  std::lock_guard lk(state_->mu);
  out.state_->root = deep_copy(*state_->root);
  return out;
}

std::unique_ptr<WritableFile> MemoryFileSystem::create(const std::string& path, const WriteOptions&) {
  std::lock_guard lk(state_->mu);
  Resolved r = state_->resolve_or_throw(path, false, "open");
  if (r.node) throw_errno(r.dir ? EEXIST : EISDIR, "open", path);  // O_EXCL: a symlink counts as existing
  auto node = make_node(EntryType::file);
  r.dir->children[r.name] = node;
  return std::make_unique<MemoryWritableFile>(state_, state_->mu, std::move(node), path);
}

std::unique_ptr<ReadableFile> MemoryFileSystem::open_read(const std::string& path) {
  std::lock_guard lk(state_->mu);
  Resolved r;
  try {
    r = state_->resolve(path, false);
  } catch (const LookupError& e) {
    if (e.err == ENOENT) throw Error(Errc::not_found, path, "open failed: no such file", {}, {}, ENOENT);
    // As with O_NOFOLLOW, a symlink loop anywhere in the path cannot be told from a final symlink.
    if (e.err == ELOOP) throw Error(Errc::unsafe_path, path, "is a symlink", "regular file", "symlink");
    throw_errno(e.err, "open", path);
  }
  if (!r.node) throw Error(Errc::not_found, path, "open failed: no such file", {}, {}, ENOENT);
  if (r.node->type == EntryType::symlink) throw Error(Errc::unsafe_path, path, "is a symlink", "regular file", "symlink");
  if (r.node->type != EntryType::file)
    throw Error(Errc::unsafe_path, path, "not a regular file", "regular file", "other file type");
  const std::uint64_t size = r.node->data.size();
  return std::make_unique<MemoryReadableFile>(state_, state_->mu, r.node, path, size);
}

void MemoryFileSystem::create_dir(const std::string& path) {
  std::lock_guard lk(state_->mu);
  Resolved r = state_->resolve_or_throw(path, false, "mkdir");
  if (r.node) throw_errno(EEXIST, "mkdir", path);
  r.dir->children[r.name] = make_node(EntryType::directory);
}

void MemoryFileSystem::create_dirs(const std::string& path) {
  std::lock_guard lk(state_->mu);
  const auto parts = split(path);
  std::string prefix;
  for (const auto& p : parts) {
    prefix += "/" + p;
    Resolved r = state_->resolve_or_throw(prefix, true, "mkdir -p");
    if (!r.node) r.dir->children[r.name] = make_node(EntryType::directory);
    else if (r.node->type != EntryType::directory) throw_errno(EEXIST, "mkdir -p", path);
  }
}

void MemoryFileSystem::sync_dir(const std::string& path) {
  std::lock_guard lk(state_->mu);
  Resolved r = state_->resolve_or_throw(path, true, "open directory");
  if (!r.node) throw_errno(ENOENT, "open directory", path);
  if (r.node->type != EntryType::directory) throw_errno(ENOTDIR, "open directory", path);
}

void MemoryFileSystem::rename(const std::string& from, const std::string& to) {
  std::lock_guard lk(state_->mu);
  const std::string action = "rename to " + to;
  Resolved src = state_->resolve_or_throw(from, false, action);
  if (!src.node) throw_errno(ENOENT, action, from);
  if (!src.dir) throw_errno(EBUSY, action, from);
  Resolved dst = state_->resolve_or_throw(to, false, action);
  if (!dst.dir) throw_errno(EBUSY, action, from);
  if (dst.node == src.node) return;  // the same entry: rename(2) does nothing
  const bool src_dir = src.node->type == EntryType::directory;
  if (src_dir && contains(*src.node, dst.dir.get())) throw_errno(EINVAL, action, from);
  if (dst.node) {
    const bool dst_dir = dst.node->type == EntryType::directory;
    if (src_dir && !dst_dir) throw_errno(ENOTDIR, action, from);
    if (!src_dir && dst_dir) throw_errno(EISDIR, action, from);
    if (dst_dir && !dst.node->children.empty()) throw_errno(ENOTEMPTY, action, from);
  }
  std::shared_ptr<Node> moving = src.node;
  src.dir->children.erase(src.name);
  dst.dir->children[dst.name] = std::move(moving);
}

void MemoryFileSystem::remove_all(const std::string& path) {
  std::lock_guard lk(state_->mu);
  Resolved r;
  try {
    r = state_->resolve(path, false);
  } catch (const LookupError& e) {
    if (e.err == ENOENT || e.err == ENOTDIR) return;  // absent
    throw_errno(e.err, "remove", path);
  }
  if (!r.node) return;
  if (!r.dir) throw_errno(EBUSY, "remove", path);
  r.dir->children.erase(r.name);  // open files keep their node alive
}

std::vector<DirEntry> MemoryFileSystem::list_dir(const std::string& path) {
  std::lock_guard lk(state_->mu);
  Resolved r;
  try {
    r = state_->resolve(path, true);
  } catch (const LookupError& e) {
    if (e.err == ENOENT) throw Error(Errc::not_found, path, "no such directory", {}, {}, ENOENT);
    throw_errno(e.err, "opendir", path);
  }
  if (!r.node) throw Error(Errc::not_found, path, "no such directory", {}, {}, ENOENT);
  if (r.node->type != EntryType::directory) throw_errno(ENOTDIR, "opendir", path);
  std::vector<DirEntry> out;
  out.reserve(r.node->children.size());
  for (const auto& [name, child] : r.node->children) out.push_back({name, child->type});
  return out;
}

std::optional<FileStat> MemoryFileSystem::stat(const std::string& path) {
  std::lock_guard lk(state_->mu);
  Resolved r;
  try {
    r = state_->resolve(path, false);
  } catch (const LookupError& e) {
    if (e.err == ENOENT || e.err == ENOTDIR) return std::nullopt;
    throw_errno(e.err, "lstat", path);
  }
  if (!r.node) return std::nullopt;
  switch (r.node->type) {
    case EntryType::file:
      return FileStat{.type = EntryType::file, .size = r.node->data.size(), .inode = r.node->inode,
                      .mtime_ns = static_cast<std::int64_t>(r.node->version)};
    case EntryType::symlink: return FileStat{.type = EntryType::symlink, .size = r.node->target.size(), .inode = r.node->inode};
    default: return FileStat{.type = r.node->type, .size = 0, .inode = r.node->inode};
  }
}

std::unique_ptr<FileLock> MemoryFileSystem::try_lock(const std::string& path, std::string_view record) {
  std::lock_guard lk(state_->mu);
  Resolved r = state_->resolve_or_throw(path, false, "open");
  if (!r.dir) throw Error(Errc::unsafe_path, path, "lock file is a directory", "regular file", "directory");
  if (!r.node) {
    r.node = make_node(EntryType::file);
    r.dir->children[r.name] = r.node;
  }
  if (r.node->type == EntryType::symlink) throw Error(Errc::unsafe_path, path, "lock file is a symlink", "regular file", "symlink");
  if (r.node->type != EntryType::file)
    throw Error(Errc::unsafe_path, path, "lock file is not a regular file", "regular file", "other file type");
  if (r.node->locked) return nullptr;
  r.node->locked = true;
  const auto bytes = std::as_bytes(std::span(record.data(), record.size()));
  r.node->data.assign(bytes.begin(), bytes.end());
  r.node->touch();
  return std::make_unique<MemoryFileLock>(state_, state_->mu, r.node);
}

void MemoryFileSystem::put_file(const std::string& path, std::span<const std::byte> bytes) {
  auto n = make_node(EntryType::file);
  n->data.assign(bytes.begin(), bytes.end());
  std::lock_guard lk(state_->mu);
  state_->put(path, std::move(n));
}

void MemoryFileSystem::put_file(const std::string& path, std::string_view bytes) {
  put_file(path, std::as_bytes(std::span(bytes.data(), bytes.size())));
}

void MemoryFileSystem::put_symlink(const std::string& path, const std::string& target) {
  auto n = make_node(EntryType::symlink);
  n->target = target;
  std::lock_guard lk(state_->mu);
  state_->put(path, std::move(n));
}

void MemoryFileSystem::put_special(const std::string& path) {
  std::lock_guard lk(state_->mu);
  state_->put(path, make_node(EntryType::other));
}

std::optional<std::vector<std::byte>> MemoryFileSystem::file_bytes(const std::string& path) const {
  std::lock_guard lk(state_->mu);
  try {
    const Resolved r = state_->resolve(path, false);
    if (r.node && r.node->type == EntryType::file) return r.node->data;
  } catch (const LookupError&) {
  }
  return std::nullopt;
}

std::optional<std::string> MemoryFileSystem::symlink_target(const std::string& path) const {
  std::lock_guard lk(state_->mu);
  try {
    const Resolved r = state_->resolve(path, false);
    if (r.node && r.node->type == EntryType::symlink) return r.node->target;
  } catch (const LookupError&) {
  }
  return std::nullopt;
}

std::uint64_t MemoryFileSystem::total_file_bytes() const {
  std::lock_guard lk(state_->mu);
  std::uint64_t total = 0;
  std::function<void(const Node&)> walk = [&](const Node& n) {
    total += n.data.size();
    for (const auto& [name, child] : n.children) walk(*child);
  };
  walk(*state_->root);
  return total;
}

}  // namespace ckpt::testing
