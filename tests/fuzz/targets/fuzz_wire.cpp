// SPDX-License-Identifier: Apache-2.0
// The messages processes of one job exchange (what another process, broken or hostile, may
// send): the commit coordination's reports, outcomes and shard sizes (runtime/wire.hpp),
// an error as JSON (core/error.hpp), and the file calls of a routed file system, both ends
// (fs/remote_file_system.hpp). The first input byte chooses the message kind (mod 8), the rest
// is the message:
//
//   0 rank report     decode_rank_report
//   1 outcome         decode_outcome
//   2 error           error_from_json; the error also crosses the file wire (a server's stat
//                     throws it, the client rethrows it)
//   3 shard sizes     byte 1: the world size (1..8); then the processes' messages, '\n' apart
//   4 file requests   requests to a FileService over a capped MemoryFileSystem, each
//                     [u8 client][u16 length][bytes]
//   5 file replies    replies a routed file system gets for a fixed sequence of calls
//                     (support/file_calls.hpp), each [u16 length][bytes]
//   6 file calls      a sequence of calls (bytes chosen below) through a routed file system
//                     to a FileService, and the same calls on a MemoryFileSystem directly
//   7 vote, run start decode_vote (and each report in it), decode_run_start
//
// Properties: a refusal is a ckpt::Error of the kind's code (comm_error; a report's manifest part
// may be refused with the manifest's own code); what decodes encodes back to a message that
// decodes to the same value (reports and outcomes: the same JSON, doubles within 4 ulps;
// errors: every field; shard sizes: every size); a FileService's reply always decodes; a
// routed file system gives the results and errors the file system it routes to gives.
#include <boost/json.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/remote_file_system.hpp"
#include "ckpt/runtime/wire.hpp"
#include "ckpt/testing/capped_file_system.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "fuzz/support/file_calls.hpp"
#include "fuzz_common.hpp"

using namespace ckpt;
using namespace ckpt::testing;
using fuzz::require;

namespace {

// Reads the input front to back; past the end, zeros (and empty strings).
struct Bytes {
  std::string_view in;
  std::size_t pos = 0;
  bool more() const noexcept { return pos < in.size(); }
  std::uint8_t u8() { return pos < in.size() ? static_cast<std::uint8_t>(in[pos++]) : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::string_view take(std::size_t n) {
    const std::string_view s = in.substr(std::min(pos, in.size()), n);
    pos += s.size();
    return s;
  }
};

bool same_error(const Error& a, const Error& b) {
  return a.code() == b.code() && a.file() == b.file() && a.detail() == b.detail() && a.expected() == b.expected() &&
         a.actual() == b.actual() && a.sys_errno() == b.sys_errno();
}

void check_comm_error(const Error& e, std::initializer_list<Errc> also = {}) {
  bool ok = e.code() == Errc::comm_error;
  for (Errc c : also) ok |= e.code() == c;
  require(ok, std::string("unexpected error code: ") + e.what());
}

// A report's text, its manifest part parsed too, so that doubles compare within ulps.
boost::json::value report_json(const std::string& text) {
  boost::json::parse_options any_bytes;
  any_bytes.allow_invalid_utf8 = true;  // an error's strings are bytes (error_to_json)
  boost::json::value v = boost::json::parse(text, {}, any_bytes);
  if (auto* part = v.as_object().if_contains("part")) *part = boost::json::parse(part->as_string());
  return v;
}

void rank_report(std::string_view text) {
  RankReport r;
  try {
    r = detail::decode_rank_report(text);
  } catch (const Error& e) {
    return check_comm_error(e, {Errc::malformed_manifest, Errc::unsupported_schema, Errc::unsafe_path});
  }
  const std::string again = detail::encode_rank_report(7, r);
  try {
    const std::string twice = detail::encode_rank_report(7, detail::decode_rank_report(again));
    require(fuzz::same_json(report_json(again), report_json(twice)), "a report reads back differently: " + again + " / " + twice);
  } catch (const Error& e) {
    fuzz::finding(std::string("an accepted report does not read back: ") + e.what());
  }
}

void outcome(std::string_view text) {
  CommitOutcome o;
  try {
    o = detail::decode_outcome(text);
  } catch (const Error& e) {
    return check_comm_error(e);
  }
  const std::string again = detail::encode_outcome(o);
  try {
    require(detail::encode_outcome(detail::decode_outcome(again)) == again, "an outcome reads back differently: " + again);
  } catch (const Error& e) {
    fuzz::finding(std::string("an accepted outcome does not read back: ") + e.what());
  }
}

// A process's vote (and the reports in it), and the same text as process 0's word at the
// start of a run.
void vote_and_start(std::string_view text) {
  try {
    const detail::Vote v = detail::decode_vote(text);
    const std::string again = detail::encode_vote(v.step, v.reports);
    const detail::Vote back = detail::decode_vote(again);
    require(back.step == v.step && back.reports == v.reports, "a vote reads back differently: " + again);
    for (const auto& r : v.reports) rank_report(r);
  } catch (const Error& e) {
    check_comm_error(e);
  }
  try {
    const std::string id = detail::decode_run_start(text);
    require(detail::encode_run_start(id) == text, "a run start reads back differently");
  } catch (const Error& e) {
    // Process 0's error, as it sent it (any code), or comm_error for text that is neither.
    if (!text.starts_with('-')) check_comm_error(e);
  }
}

// A file system whose stat throws a given error (for the error's trip over the file wire).
class ThrowingFileSystem final : public FileSystemWrapper {
 public:
  ThrowingFileSystem(FileSystem& target, const Error& e) : FileSystemWrapper(target), e_(e) {}
  std::optional<FileStat> stat(const std::string&) override { throw e_; }

 private:
  Error e_;
};

void error_json(std::string_view text) {
  const Error e = error_from_json(text);
  const Error back = error_from_json(error_to_json(e));
  require(same_error(e, back), std::string("an error reads back differently from its JSON: ") + e.what() + " / " + back.what());
  MemoryFileSystem served, elsewhere;
  ThrowingFileSystem throwing(served, e);
  FileService service(throwing);
  LoopbackFileTransport loop({nullptr, &service});
  const auto routed = make_routed_file_system(elsewhere, loop, {{"/r", 1}});
  try {
    routed->stat("/r/x");
    fuzz::finding("a throwing stat returned");
  } catch (const Error& got) {
    require(same_error(e, got), std::string("an error crosses the file wire changed: ") + e.what() + " / " + got.what());
  }
}

void shard_sizes(Bytes in) {
  const int world = 1 + in.u8() % 8;
  std::vector<std::string> messages;
  const std::string_view rest = in.take(std::string_view::npos);
  for (std::size_t at = 0;;) {
    const auto nl = rest.find('\n', at);
    messages.emplace_back(rest.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at));
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }
  detail::ShardSizes got;
  try {
    got = detail::decode_shard_sizes(messages, world, 12);
  } catch (const Error& e) {
    check_comm_error(e);
    return require(e.detail() == "shard sizes of step 12", std::string("error does not name the step: ") + e.what());
  }
  if (got.failed) {
    const auto back = detail::decode_shard_sizes(std::vector<std::string>{detail::encode_sizes_failure(*got.failed)}, world, 12);
    return require(back.failed == got.failed, "a failure reads back differently");
  }
  require(got.sizes.size() == static_cast<std::size_t>(world), "one size per rank");
  // The same sizes sent by one process per rank, in reverse order.
  std::vector<std::string> again;
  for (int r = world - 1; r >= 0; --r) {
    const std::pair<int, std::uint64_t> one{r, got.sizes[static_cast<std::size_t>(r)]};
    again.push_back(detail::encode_shard_sizes(std::span(&one, 1)));
  }
  try {
    require(detail::decode_shard_sizes(again, world, 12).sizes == got.sizes, "shard sizes read back differently");
  } catch (const Error& e) {
    fuzz::finding(std::string("accepted shard sizes do not read back: ") + e.what());
  }
}

// The tree every file-wire mode serves: /r/d/f (7 bytes), /r/g (empty), and a symlink.
MemoryFileSystem served_tree() {
  MemoryFileSystem fs;
  fs.create_dirs("/r/d");
  fs.put_file("/r/d/f", std::string_view("payload"));
  fs.put_file("/r/g", std::string_view());
  fs.put_symlink("/r/l", "d/f");
  return fs;
}

void file_requests(Bytes in) {
  MemoryFileSystem served = served_tree();
  CappedFileSystem capped(served);
  FileService service(capped);
  for (int i = 0; i < 64 && in.more(); ++i) {
    const int client = in.u8() % 3;
    const std::string_view request = in.take(in.u16());
    const std::string reply = service.handle(client, request);
    const auto e = reply_error(reply);
    require(!e || e->detail().find("undecodable file reply") == std::string::npos, "a reply that does not decode: " + std::string(e ? e->what() : ""));
  }
}

// Hands out the input's replies in turn, whatever was asked; none left: the peer is gone.
class ScriptedTransport final : public FileTransport {
 public:
  explicit ScriptedTransport(Bytes& in) : in_(in) {}
  std::string call(int, std::string) override {
    if (!in_.more()) throw Error(Errc::comm_error, {}, "no more replies");
    std::string reply(in_.take(in_.u16()));
    last_size = reply.size();
    return reply;
  }
  std::size_t last_size = 0;

 private:
  Bytes& in_;
};

void file_replies(Bytes in) {
  MemoryFileSystem elsewhere;
  ScriptedTransport script(in);
  const auto fs = make_routed_file_system(elsewhere, script, {{"/r", 1}});
  // A listing costs at least 5 bytes of its reply per entry (type, name length): its size is
  // bounded by what the peer sent, never by a count the peer names.
  fuzz::fixed_file_calls(*fs, [&](const std::vector<DirEntry>& entries) {
    require(entries.size() <= script.last_size / 5, "more entries than the reply had bytes");
  });
}

// ---- mode 6: the same calls through the wire and directly ----

const char* const kPaths[] = {"/r", "/r/d", "/r/d/f", "/r/g", "/r/l", "/r/n", "/r/n/m", "/r/d/h"};

struct Side {
  FileSystem* fs;
  std::vector<std::unique_ptr<WritableFile>> writers;
  std::vector<std::unique_ptr<ReadableFile>> readers;
  std::vector<std::unique_ptr<FileLock>> locks;
};

// What a call gave: its result or its error, as text to compare.
template <class F>
std::string outcome_of(F&& f) {
  try {
    return "ok " + f();
  } catch (const Error& e) {
    return std::string("error ") + errc_name(e.code()).data() + ": " + e.what();
  }
}

std::string run_call(Side& s, std::uint8_t op, std::uint8_t a, std::uint8_t b, std::string_view data) {
  const std::string p = kPaths[a % std::size(kPaths)], q = kPaths[b % std::size(kPaths)];
  auto writer = [&](std::uint8_t i) -> WritableFile& {
    if (s.writers.empty()) throw Error(Errc::invalid_argument, {}, "no writer");
    return *s.writers[i % s.writers.size()];
  };
  auto reader = [&](std::uint8_t i) -> ReadableFile& {
    if (s.readers.empty()) throw Error(Errc::invalid_argument, {}, "no reader");
    return *s.readers[i % s.readers.size()];
  };
  const auto bytes = std::as_bytes(std::span(data.data(), data.size()));
  return outcome_of([&]() -> std::string {
    switch (op % 16) {
      case 0: s.writers.push_back(s.fs->create(p, {})); return "";
      case 1: s.readers.push_back(s.fs->open_read(p)); return "";
      case 2: s.fs->create_dir(p); return "";
      case 3: s.fs->create_dirs(p); return "";
      case 4: s.fs->rename(p, q); return "";
      case 5: s.fs->remove_all(p); return "";
      case 6: {
        std::string out;
        for (const auto& e : s.fs->list_dir(p)) out += e.name + "/" + std::to_string(static_cast<int>(e.type)) + " ";
        return out;
      }
      case 7: {
        const auto st = s.fs->stat(p);
        return st ? std::to_string(static_cast<int>(st->type)) + " " + std::to_string(st->size) : "none";
      }
      case 8: {
        auto lock = s.fs->try_lock(p, data);
        const bool got = lock != nullptr;
        if (lock) s.locks.push_back(std::move(lock));
        return got ? "locked" : "busy";
      }
      case 9: writer(a).write_at(b % 64, bytes); return "";
      case 10: writer(a).truncate(b % 64); return "";
      case 11: writer(a).allocate(b % 64); return "";
      case 12: writer(a).close(); return "";
      case 13: {
        std::string out(b % 16, '\0');
        reader(a).read_at(data.size() % 8, std::as_writable_bytes(std::span(out.data(), out.size())));
        return out;
      }
      case 14: return std::to_string(reader(a).size());
      default:
        // Drop a handle: releases it on the server.
        if (!s.writers.empty() && a % 2 == 0) s.writers.erase(s.writers.begin() + (b % s.writers.size()));
        else if (!s.readers.empty()) s.readers.erase(s.readers.begin() + (b % s.readers.size()));
        else if (!s.locks.empty()) s.locks.pop_back();
        return "";
    }
  });
}

std::string tree_of(MemoryFileSystem& fs, const std::string& dir) {
  std::string out;
  for (const auto& e : fs.list_dir(dir)) {
    const std::string p = (dir == "/" ? "" : dir) + "/" + e.name;
    out += p + " " + std::to_string(static_cast<int>(e.type));
    if (e.type == EntryType::directory) out += "\n" + tree_of(fs, p);
    else if (const auto b = fs.file_bytes(p)) out += " " + std::string(reinterpret_cast<const char*>(b->data()), b->size()) + "\n";
    else out += "\n";
  }
  return out;
}

void file_calls(Bytes in) {
  MemoryFileSystem served = served_tree(), direct = served_tree(), elsewhere;
  FileService service(served);
  LoopbackFileTransport loop({nullptr, &service});
  {
    const auto routed = make_routed_file_system(elsewhere, loop, {{"/r", 1}});
    Side wire{routed.get(), {}, {}, {}}, local{&direct, {}, {}, {}};
    for (int i = 0; i < 48 && in.more(); ++i) {
      const std::uint8_t op = in.u8(), a = in.u8(), b = in.u8();
      const std::string_view data = in.take(in.u8() % 32);
      const std::string got = run_call(wire, op, a, b, data), want = run_call(local, op, a, b, data);
      require(got == want, "call " + std::to_string(op % 16) + " through the wire: " + got + "; directly: " + want);
    }
  }
  require(service.open_handles() == 0, "handles left open on the server after the client dropped them");
  require(tree_of(served, "/") == tree_of(direct, "/"), "the trees differ after the same calls");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view msg(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 8) {
    case 0: rank_report(msg); break;
    case 1: outcome(msg); break;
    case 2: error_json(msg); break;
    case 3: shard_sizes(Bytes{msg}); break;
    case 4: file_requests(Bytes{msg}); break;
    case 5: file_replies(Bytes{msg}); break;
    case 7: vote_and_start(msg); break;
    default: file_calls(Bytes{msg}); break;
  }
  return 0;
}
