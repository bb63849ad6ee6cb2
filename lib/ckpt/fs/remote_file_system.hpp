// SPDX-License-Identifier: Apache-2.0
// A FileSystem whose paths under some roots live in another process.
//
// Checkpoints across node-local roots (DIR/node-n): under MPI, node n's root is reachable only
// by the processes on node n. The commit, rotation and repair code (store/nodes/node_commit.hpp,
// store/nodes/redundancy_io.hpp) takes one FileSystem& and a list of node roots; given the routed file
// system made here, in which node m's root forwards every call to a FileService in a process
// on node m, that code runs unchanged from one process while every byte moves over the
// transport instead of a shared file system.
//
// The parts:
//   client (make_routed_file_system)  --request-->  FileTransport  -->  FileService::handle
//   (one process)                     <--reply---                       (the owner of the files)
// The transport (MPI, a socket, LoopbackFileTransport in a test) only moves opaque byte
// strings; this file owns the wire format and both ends of it.
//
// Wire format (binary, every integer little-endian; a string is a u32 length then its bytes):
//   request: u8 version (2), u8 op, then the op's fields: paths as strings, offsets, sizes and
//            handle ids as u64, a write's payload as a string followed by its XXH3-64 (u64);
//            a read's reply carries the bytes read the same way, string then XXH3-64.
// Every payload is checked against its XXH3-64 where it arrives, before it is written or
// used: a mismatch is Errc::checksum_mismatch naming the file (a bit flipped on the way
// between nodes never reaches a file or a caller's buffer).
//   reply:   u8 status: 0 ok, then the op's results; 1 error, then i32 code, strings file,
//            detail, expected, actual, i32 errno (a ckpt::Error field by field).
// Both ends decode defensively: every length is checked against what is left of the message,
// trailing bytes are refused, a path may hold no NUL byte, a read asks for at most
// kMaxRemotePiece bytes. A request that does not decode is answered with Errc::comm_error;
// a reply that does not decode is thrown by the client as Errc::comm_error.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/file_system.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// The largest payload one request or reply carries: a longer read_at or write_at is cut into
/// requests of at most this many bytes, sent one after the other.
inline constexpr std::size_t kMaxRemotePiece = std::size_t{16} << 20;

/// How a routed file system reaches another process.
class FileTransport {
 public:
  virtual ~FileTransport() = default;
  /// Sends `request` to process `peer` and returns the reply that peer's FileService::handle
  /// produced. Blocks until it arrives. Thread-safe: concurrent calls from several threads each
  /// get their own reply. Throws Errc::comm_error if the peer cannot be reached.
  virtual std::string call(int peer, std::string request) = 0;
};

/// The serving side, in the process that owns the files: executes requests against `local`,
/// holding the files opened and the locks taken for its clients until they release them.
/// A handle (an open file, a lock) belongs to the client that opened it: another client
/// naming it gets Errc::comm_error, as for a handle that was never opened.
class FileService {
 public:
  explicit FileService(FileSystem& local);
  ~FileService();  // closes what clients left open, releases their locks
  FileService(const FileService&) = delete;
  FileService& operator=(const FileService&) = delete;

  /// Executes one request from process `client`. Never throws: a failure (a ckpt::Error, or any
  /// exception, typed with to_error) travels in the reply and is rethrown by the client with the
  /// same code, file, detail, expected, actual and errno. A request that does not decode is
  /// answered with Errc::comm_error. Thread-safe: requests on distinct handles run in
  /// parallel (the map of handles is locked only to look one up).
  std::string handle(int client, std::string_view request);

  /// How many files and locks clients hold open here now (for tests of their release).
  std::size_t open_handles() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// The error a reply of FileService::handle carries, nullopt for a success; a reply that does
/// not decode is an Errc::comm_error. For transports and tests that look into replies.
std::optional<Error> reply_error(std::string_view reply);

/// Paths equal to `root` or below `root + "/"` go to process `peer`.
struct FileRoute {
  std::string root;
  int peer = 0;
};

/// A FileSystem that sends every call on a routed path to that route's peer (through
/// `transport`) and every other call to `local`. Both must outlive it. Paths travel
/// unchanged (the peer sees the same path the caller passed); when routes nest, the longest
/// root that matches wins; a root's trailing '/' is ignored. Thread-safe as far as `local`
/// and `transport` are. What a routed path gets:
///   - create: the remote file is always opened buffered (WriteOptions::direct is cleared), so
///     is_direct() is false and callers never need aligned buffers; native_handle() is -1.
///     write_at, allocate, truncate, sync and close forward to the file the server holds (by
///     a handle id); destroying the WritableFile releases the server's handle (closing the
///     file if close() was not called; errors of that release are dropped, as a destructor
///     must). write_at is thread-safe for disjoint ranges, as the server's file is.
///   - open_read: size() and read_at forward to the file the server holds, which keeps its
///     bytes after a rename or removal there; destroying it releases the server's handle.
///   - read_at and write_at longer than kMaxRemotePiece are cut into pieces of at most that.
///   - create_dir, create_dirs, sync_dir, remove_all, list_dir, stat (FileStat with device,
///     inode and mtime as the server saw them) and free_space forward as they are.
///   - rename: both paths must route to the same place (the same peer, or both local), else
///     Errc::invalid_argument naming both.
///   - try_lock: the server takes the lock and holds it on behalf of the client; destroying
///     the client's FileLock releases it on the server. nullptr when someone holds it (a
///     lock taken in the server's process, or by another client, counts).
///   - errors: what the server's file system throws is rethrown here with the same code, file,
///     detail, expected, actual and errno; a transport failure is Errc::comm_error.
std::unique_ptr<FileSystem> make_routed_file_system(FileSystem& local, FileTransport& transport, std::vector<FileRoute> routes);

/// A transport inside one process, for tests: call(peer, r) runs services[peer]->handle(self, r).
/// A peer out of range or without a service (nullptr) cannot be reached: Errc::comm_error.
class LoopbackFileTransport : public FileTransport {
 public:
  explicit LoopbackFileTransport(std::vector<FileService*> services, int self = 0);
  std::string call(int peer, std::string request) override;

 private:
  std::vector<FileService*> services_;
  int self_;
};

}  // namespace ckpt
CKPT_API_END
