// SPDX-License-Identifier: Apache-2.0
// ckpt: inspect, check, reshard, export and compare checkpoints on disk.
//
//   ckpt ls ROOT                         list checkpoints with step, size and state
//   ckpt inspect DIR [STEP]              manifest summary and tensor table
//   ckpt verify DIR [--verify fast|full] check every shard; exit 0 only if all verify
//   ckpt repair DIR [--step N] [--full]  rebuild lost shards of a checkpoint across node roots
//   ckpt reshard SRC DST --world-size M  the checkpoint at another world size, streamed
//   ckpt consolidate SRC OUT             the full model as Hugging Face safetensors
//   ckpt prune ROOT --keep K             remove all but the newest K checkpoints (s3 roots: also
//                                        --leftovers-older-than SECONDS, the leftover collector)
//   ckpt diff A B                        per-tensor equal / max abs difference
//   ckpt get DIR TENSOR --out FILE.npy   one tensor as a NumPy .npy file, reading only its chunks
//
// DIR, ROOT, SRC may also be a node set (DIR/node-0, DIR/node-1, ...: a checkpoint across node
// roots, store/nodes/node_commit.hpp): ls, inspect and verify then show its scheme and health, repair
// rebuilds what its redundancy covers, prune removes a step on every node, and the commands
// that read tensors read through CheckpointReader, which never takes a redundancy block for a
// shard.
//
// ls, inspect, verify, get and prune also take an object store, s3://bucket/prefix (inspect,
// verify and get also .../step-N): its committed steps, read through store/object/object_commit.hpp in
// ranged GETs, printed by the same code as local checkpoints.
//
// Every command takes --json (its output's fields: docs/json-output.md) and --help; `ckpt
// --help` documents the exit codes. Each command is declared once (declare_<command>: its
// arguments, options, help text) and runs in its own function (cmd_<command>).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <boost/json.hpp>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/format/boost_json.hpp"
#include "ckpt/format/manifest_limits.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/mapped.hpp"
#include "ckpt/store/nodes/node_commit.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/nodes/redundancy_io.hpp"
#include "ckpt/ops/reshard.hpp"
#include "ckpt/objstore/s3.hpp"
#include "ckpt/store/root_lock.hpp"
#include "ckpt/read/slice_load.hpp"
#include "ckpt/read/range_reader.hpp"
#include "ckpt/store/recovery.hpp"
#include "ckpt/store/store.hpp"
#include "cli.hpp"
#include "json_output.hpp"
#include "npy.hpp"
#include "table.hpp"

namespace json = boost::json;
using namespace ckpt;
using ckpt::tool::Table;

namespace {

constexpr int kExitOk = 0, kExitBad = 1, kExitUsage = cli::kExitUsage, kExitDiffer = 3, kExitRotated = 4;

const char* kDescription = "ckpt: inspect, check, reshard, export and compare ckpt checkpoints";

const char* kFooter = R"(DIR, SRC, A and B are a checkpoint directory (step-N) or a root (then the checkpoint its
`latest` names), or a node set: a directory holding node roots node-0, node-1, ... (a
checkpoint across node-local roots; then the checkpoint the newest of their `latest` files
names), a memory root mem://NAME (docs/memory.md) or an object store s3://bucket/prefix. Every
command takes --json: one JSON object on stdout, for scripts, whose first field "schema"
names the output and the version of its format ("ckpt.ls/1"; a failure's is "ckpt.error/1");
every field of each: docs/json-output.md.
`ckpt COMMAND --help` and `ckpt help COMMAND` show a command's options and an example.

exit codes:
  0  success (verify: every shard verified, and every redundancy block of a node set;
     diff: every tensor equal; repair: everything rebuilt, or nothing to rebuild;
     recover --plan: a checkpoint to recover from was found)
  1  failure: a bad or unreadable checkpoint, or an I/O error; the typed error is printed
     (code, file, expected and actual value), and with --json it is the output:
     {"schema": "ckpt.error/1", "ok": false, "error": {"code", "file", "detail", "expected",
     "actual", "message"}}
     where "code" is the error's identifier ("checksum_mismatch", "not_found", ...: the
     `code` of the Python exceptions too)
  2  usage error (unknown command or option, missing or malformed argument); with --json:
     {"ok": false, "error": {"code": "usage", "message", ...}}
  3  diff: the checkpoints differ
  4  verify, inspect, get, diff, reshard, consolidate: the checkpoint being read was
     rotated away (a job saving to its root committed newer ones and removed it) on every
     try, or was named by its directory; nothing is wrong with it. Read from a root, a
     checkpoint rotated away is read again as `latest` names it then, up to 3 tries; the
     ones rotated away are listed ("rotated_away" in --json). With --json:
     {"ok": false, "rotated_away": [...], "error": {"code": "rotated_away", ...}}
)";

std::string human_bytes(std::uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string shape_str(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The error object of --json, one shape for every failure: a typed error's `code` is its
// errc_id ("checksum_mismatch", the Python exceptions' `code` too); the tool's own are "usage"
// and "rotated_away" (docs/json-output.md).
json::object error_fields(std::string_view code, const std::string& file, const std::string& detail, const std::string& expected,
                          const std::string& actual, const std::string& message) {
  return {{"code", code}, {"file", file}, {"detail", detail}, {"expected", expected}, {"actual", actual}, {"message", message}};
}

json::object error_json(const Error& e) {
  return error_fields(errc_id(e.code()), e.file(), e.detail(), e.expected(), e.actual(), e.what());
}

// A progress bar on stderr, only when it is a terminal and the output is for people: a pipe
// or a log file gets no carriage-return noise.
class ProgressBar {
 public:
  ProgressBar(const char* label, bool enabled) : label_(label), on_(enabled && ::isatty(STDERR_FILENO)) {}
  ~ProgressBar() { done(); }
  ProgressFn fn() {
    if (!on_) return {};
    return [this](std::uint64_t done, std::uint64_t total) {
      const int pct = total ? static_cast<int>(done * 100 / total) : 100;
      if (pct == last_) return;
      last_ = pct;
      const int filled = pct * 40 / 100;
      std::fprintf(stderr, "\r%s [%s%s] %3d%%", label_, std::string(static_cast<std::size_t>(filled), '#').c_str(),
                   std::string(static_cast<std::size_t>(40 - filled), '.').c_str(), pct);
    };
  }
  void done() {
    if (on_ && last_ >= 0) std::fprintf(stderr, "\n");
    last_ = -1;
  }

 private:
  const char* label_;
  bool on_;
  int last_ = -1;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- node sets ---------------------------------------------------------------------------
//
// A checkpoint across node roots (store/nodes/node_commit.hpp, docs/format.md "Nodes and redundancy"):
// DIR holds the node roots DIR/node-0, DIR/node-1, ..., each a checkpoint root with its part
// of every step (its ranks' shards, the redundancy blocks placed on it, the manifest), and no
// `latest` of its own.

std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// "1 more node loss", "0 more node losses", or "lost" (a shard the scheme cannot rebuild).
std::string survives_text(const NodeCheckpointHealth& h) {
  if (!h.recoverable()) return "lost";
  const int n = h.min_margin();
  return std::to_string(n) + " more node loss" + (n == 1 ? "" : "es");
}

// complete (every file good), degraded (bad files the scheme rebuilds: `ckpt repair`), or
// corrupt (a shard lost beyond the scheme).
std::string node_state(const NodeCheckpointHealth& h) { return h.healthy() ? "complete" : h.recoverable() ? "degraded" : "corrupt"; }

std::string ints_text(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

// One line per bad file ("shard of rank 1 on node 1: missing shard: ..."), then what the
// scheme can do about them.
std::vector<std::string> health_notes(const NodeCheckpointHealth& h, const std::string& set_dir) {
  std::vector<std::string> out;
  for (const auto* f : h.bad_files()) out.push_back(f->what + " on node " + std::to_string(f->node) + ": " + f->error);
  const std::string scheme = redundancy_name(h.manifest.nodes->scheme);
  if (!h.recoverable())
    out.push_back(scheme + " cannot rebuild rank" + (h.lost_ranks.size() == 1 ? " " : "s ") + ints_text(h.lost_ranks) + ": it survives at most " +
                  std::to_string(tolerated_node_losses(h.manifest.nodes->scheme)) + " lost node(s) per " +
                  (h.manifest.nodes->scheme.kind == RedundancyScheme::Kind::reed_solomon ? "stripe" : "shard"));
  else if (!h.bad_ranks.empty() || std::any_of(h.blocks.begin(), h.blocks.end(), [](const MemberHealth& b) { return !b.ok; }))
    out.push_back(scheme + " can rebuild " + (h.bad_ranks.empty() ? std::string("them") : "rank" + std::string(h.bad_ranks.size() == 1 ? " " : "s ") + ints_text(h.bad_ranks)) +
                  ": ckpt repair " + set_dir);
  else if (!h.healthy())
    out.push_back("the other nodes' copies of the manifest restore it: ckpt repair " + set_dir);
  return out;
}

json::array ints_json(const std::vector<int>& v) {
  json::array a;
  for (int x : v) a.push_back(x);
  return a;
}

json::array strings_json(const std::vector<std::string>& v) {
  json::array a;
  for (const auto& x : v) a.emplace_back(x);
  return a;
}

// The first bad file's error, in the shape of error_json, for the {"ok": false, "error"} of
// --json.
json::object first_bad_json(const NodeCheckpointHealth& h) {
  for (const auto* f : h.bad_files())
    return error_fields(errc_id(f->code), f->path, f->what + " on node " + std::to_string(f->node), "", "", f->error);
  return {};
}

// The health of a checkpoint across nodes, for --json.
json::object health_json(const NodeCheckpointHealth& h) {
  json::array bad;
  for (const auto* f : h.bad_files()) bad.push_back(json::object{{"what", f->what}, {"node", f->node}, {"path", f->path}, {"error", f->error}});
  return {{"state", node_state(h)},
          {"healthy", h.healthy()},
          {"recoverable", h.recoverable()},
          {"survives", h.recoverable() ? json::value(h.min_margin()) : json::value(nullptr)},
          {"margins", ints_json(h.margins)},
          {"bad_ranks", ints_json(h.bad_ranks)},
          {"lost_ranks", ints_json(h.lost_ranks)},
          {"bad", bad}};
}

std::uint64_t redundancy_bytes(const Manifest& m) {
  std::uint64_t b = 0;
  for (const auto& r : m.redundancy) b += r.size;
  return b;
}


// ---- reading a root a job saves to ------------------------------------------------------
//
// A job saving to ROOT commits newer checkpoints and rotates old ones away (renamed to a
// temporary, then removed) while a command reads ROOT: the checkpoint `latest` named when the
// command began can vanish under it, and its next open fails (no manifest, missing shard, no
// such file). That is no damage, and must not read as damage. Each command that reads
// checkpoints of plain roots notes them in a LiveReads; when it fails and a noted checkpoint
// was rotated away (rotated_away: its directory gone, `latest` naming a newer step), the
// command runs again on what `latest` names then (kRotationAttempts in all). A checkpoint
// the user named by its directory, or one rotated away on every try, ends the command with
// exit status kExitRotated (RotatedAway), never with exit 1.

constexpr int kRotationAttempts = 3;

// The command's checkpoint `dir` was rotated away: named by the user, or on every try.
struct RotatedAway {
  std::string dir, latest;           // what was read; what `latest` names now
  std::vector<std::string> rotated;  // every checkpoint rotated away, in order
  bool named = false;                // `dir` was the user's, not a root's latest
};

class LiveReads {
 public:
  // Before the checkpoint directory `dir` (named by the user) is opened.
  void note_dir(const std::string& dir) {
    const std::filesystem::path p(strip_slashes(dir));
    const std::string parent = p.parent_path().string();
    reads_.push_back({parent.empty() ? "." : parent, p.filename().string(), true});
  }
  // Before the checkpoint ROOT/latest names is opened; `name` what it named just before.
  std::size_t note_latest(const std::string& root, std::string name) {
    reads_.push_back({root, std::move(name), false});
    return reads_.size() - 1;
  }
  // The checkpoint of note `i` that was opened (`latest` may have moved meanwhile).
  void opened(std::size_t i, std::string name) { reads_[i].name = std::move(name); }
  // The checkpoints rotated away in earlier tries ("ROOT/step-N"), for --json.
  json::array rotated_json() const { return strings_json(rotated_); }

  // Runs `body`, once more on each checkpoint rotated away under it (see above).
  template <class Body>
  int run(Body&& body) {
    for (int attempt = 1;; ++attempt) {
      reads_.clear();
      try {
        return body();
      } catch (...) {
        FileSystem& fs = posix_file_system();
        const auto gone = std::find_if(reads_.begin(), reads_.end(),
                                       [&](const Read& r) { return !r.name.empty() && rotated_away(fs, r.root, r.name); });
        if (gone == reads_.end()) throw;
        const std::string dir = join_path(gone->root, gone->name), latest = read_latest(fs, gone->root).value_or("");
        rotated_.push_back(dir);
        if (gone->named || attempt == kRotationAttempts) throw RotatedAway{dir, latest, rotated_, gone->named};
        std::fprintf(stderr, "ckpt: %s was rotated away while it was read (a save committed %s and removed it): reading %s\n",
                     dir.c_str(), latest.c_str(), latest.c_str());
      }
    }
  }

 private:
  struct Read {
    std::string root, name;
    bool named = false;
  };
  std::vector<Read> reads_;
  std::vector<std::string> rotated_;
};


// The --json outputs: each command's, and "error" for the {"ok": false, "error"} of a command
// that failed. Each is printed with "schema": "ckpt.OUTPUT/VERSION" (json_output.hpp); the
// version changes when a field is removed or changes meaning, never when one is added. Every
// field of each: docs/json-output.md, held to these outputs by tests/apps/test_json_output.cpp.
struct JsonOutput {
  std::string_view name;
  int version;
};
constexpr JsonOutput kJsonOutputs[] = {{"ls", 1},   {"inspect", 1}, {"verify", 1}, {"repair", 1},  {"reshard", 1}, {"consolidate", 1},
                                       {"prune", 1}, {"diff", 1},    {"get", 1},    {"recover", 1}, {"error", 1}};

// Prints `body` as the one line of output `output` (a name of kJsonOutputs).
void print_json(std::string_view output, const json::object& body) {
  const auto* o = std::find_if(std::begin(kJsonOutputs), std::end(kJsonOutputs), [&](const JsonOutput& j) { return j.name == output; });
  if (o == std::end(kJsonOutputs)) throw std::logic_error("no --json output named " + std::string(output));
  std::cout << json::serialize(cli::with_schema("ckpt." + std::string(output), o->version, body)) << "\n";
}

// A failed command's output: {"ok": false, "error": {...}}, and the checkpoints rotated away
// under it when that is why it failed.
void print_json_error(const json::object& error, const json::array* rotated_away = nullptr) {
  json::object o{{"ok", false}};
  if (rotated_away) o["rotated_away"] = *rotated_away;
  o["error"] = error;
  print_json("error", o);
}

// ---- declarations shared by the commands ------------------------------------------------

// What every command takes.
struct Common {
  bool json = false;
};

// A declared command: its CLI11 subcommand and the body that runs it.
struct Command {
  CLI::App* app;
  std::shared_ptr<const Common> common;
  std::function<int()> run;
};

// Adds command `name` with its one-line description (the command list of `ckpt --help`), its
// footer (what it does in full, and an example) and the --json flag.
CLI::App* add_command(CLI::App& app, const std::string& name, const std::string& description, const std::string& footer,
                      Common& common) {
  CLI::App* c = app.add_subcommand(name, description);
  c->footer(footer);
  c->add_flag("--json", common.json, "print one JSON object on stdout, for scripts");
  return c;
}

// Binds `args` to its command: the body runs with the parsed values.
template <class Args, class Body>
Command bind(CLI::App* c, std::shared_ptr<Args> args, Body body) {
  return {c, args, [args, body] { return body(*args); }};
}

CLI::Option* add_path(CLI::App& c, const std::string& name, std::string& target, const std::string& description) {
  return c.add_option(name, target, description)->required()->type_name("");
}

// The one spelling of a verify mode: --verify none|fast|full.
CLI::Option* add_verify_option(CLI::App& c, std::string& target, const std::string& description) {
  return c.add_option("--verify", target, description)->check(CLI::IsMember({"none", "fast", "full"}))->option_text("MODE");
}
Verify verify_of(const std::string& mode) { return parse_verify(mode).value(); }  // checked by add_verify_option

// --buffer-mb N, the reshard / consolidate buffer in MiB, into bytes.
CLI::Option* add_buffer_option(CLI::App& c, std::uint64_t& bytes) {
  return c.add_option_function<std::uint64_t>("--buffer-mb", [&bytes](std::uint64_t mb) { bytes = mb << 20; },
                                               "memory for data in flight, MiB (default " + std::to_string(bytes >> 20) +
                                                   "): peak memory stays near\nthis plus one or two checksum chunks "
                                                   "(4 MiB each by default),\nwhatever the checkpoint's size")
      ->check(cli::integer_in(1, 1 << 20))
      ->option_text("N");
}

// ---- ls, inspect, verify ----------------------------------------------------------------

// The step `latest` of `store` names; Errc::not_found naming the root when there is none.
std::uint64_t latest_of(CheckpointStore& store) {
  if (const auto step = store.latest()) return *step;
  throw Error(Errc::not_found, store.root(), "no committed checkpoint: no latest", "a `latest` naming a checkpoint", "none");
}

// Runs `body(step)` on the checkpoint `located` names, or on its store's latest; when a read
// fails because rotation removed that step (a job saving to the store committed newer ones),
// once more on what `latest` names then (kRotationAttempts in all), else RotatedAway. `rotated`
// collects the steps rotated away, as errors name them.
template <class Body>
int on_live_step(CheckpointStore& store, std::optional<std::uint64_t> named, std::vector<std::string>& rotated, Body&& body) {
  // A checkpoint named that is not there when the command begins is the user's not_found,
  // never "rotated away".
  if (named) (void)store.manifest(*named);
  for (int attempt = 1;; ++attempt) {
    const std::uint64_t step = named ? *named : latest_of(store);
    try {
      return body(step);
    } catch (...) {
      if (!store.rotated_away(step)) throw;
      rotated.push_back(store.name_of(step));
      std::string now;
      try {
        if (const auto l = store.latest()) now = checkpoint_dir_name(*l);
      } catch (const Error&) {
      }
      if (named || attempt == kRotationAttempts) throw RotatedAway{store.name_of(step), now, rotated, named.has_value()};
      std::fprintf(stderr, "ckpt: %s was rotated away while it was read (a save committed %s and removed it): reading %s\n",
                   store.name_of(step).c_str(), now.c_str(), now.c_str());
    }
  }
}

struct LsArgs : Common {
  std::string root, verify = "none";
};

// "10" or "step-0000000010": the checkpoint's directory name; invalid_argument otherwise.
std::string step_dir_name(const std::string& text, const std::string& where) {
  if (parse_checkpoint_dir_name(text)) return text;
  if (!text.empty() && text.size() <= 10 && text.find_first_not_of("0123456789") == std::string::npos)
    return checkpoint_dir_name(std::stoull(text));
  throw Error(Errc::invalid_argument, where, "STEP", "a step number or a step-N name", "'" + text + "'");
}


// ls of any root (open_store decides its kind): every checkpoint and save in progress, checked
// per --verify; a node set's also with its layout, scheme and health.
int cmd_ls(const LsArgs& a) {
  const auto store = open_store(a.root);
  const auto list = store->list(verify_of(a.verify));
  const bool nodes = store->kind() == StoreKind::node_set;
  bool any_bad = false;
  json::array out;
  Table table = nodes ? Table({{"NAME"}, {"STEP", true}, {"WORLD", true}, {"NODES", true}, {"SCHEME"}, {"SIZE", true}, {"SURVIVES"}, {"STATE"}})
                      : Table({{"NAME"}, {"STEP", true}, {"WORLD", true}, {"SIZE", true}, {"STATE"}});
  for (const auto& c : list) {
    // A degraded checkpoint (files the redundancy rebuilds) is reported as bad too: exit 1.
    any_bad |= c.state == CheckpointState::corrupt || c.state == CheckpointState::degraded;
    const std::string state = std::string(checkpoint_state_name(c.state)) + (c.is_latest ? " (latest)" : "");
    json::object o{{"name", c.name},
                   {"step", c.step ? json::value(*c.step) : json::value(nullptr)},
                   {"world_size", c.world_size},
                   {"bytes", c.bytes},
                   {"state", checkpoint_state_name(c.state)},
                   {"latest", c.is_latest},
                   {"error", c.error}};
    if (c.health && c.manifest && c.manifest->nodes) {
      const NodeLayout& l = *c.manifest->nodes;
      o["nodes"] = l.nodes;
      o["ranks_per_node"] = l.ranks_per_node;
      o["redundancy"] = redundancy_name(l.scheme);
      o["redundancy_bytes"] = c.redundancy_bytes;
      o["health"] = health_json(*c.health);
      table.row({c.name, std::to_string(*c.step), std::to_string(c.world_size), std::to_string(l.nodes), redundancy_name(l.scheme),
                 human_bytes(c.bytes), survives_text(*c.health), state});
      for (const auto& n : health_notes(*c.health, store->root())) table.note(n);
    } else {
      if (!c.run_id.empty()) {
        o["run"] = c.run;
        o["run_id"] = c.run_id;
      }
      const std::string step = c.step ? std::to_string(*c.step) : "-", world = c.world_size ? std::to_string(c.world_size) : "-";
      if (nodes) table.row({c.name, step, world, "-", "-", c.manifest ? human_bytes(c.bytes) : "-", "-", state});
      else table.row({c.name, step, world, human_bytes(c.bytes), state});
      if (!c.error.empty()) table.note(c.error);
    }
    out.push_back(std::move(o));
  }
  if (a.json) print_json("ls", json::object{{"ok", !any_bad}, {"root", store->root()}, {"checkpoints", out}});
  else table.print();
  return any_bad ? kExitBad : kExitOk;
}

Command declare_ls(CLI::App& app) {
  auto a = std::make_shared<LsArgs>();
  CLI::App* c = add_command(app, "ls", "list the checkpoints under ROOT: step, world size, size, state", R"(
List every checkpoint directory under ROOT (and temporaries of saves in progress): name,
step, world size, size and state (complete, in progress, corrupt), marking the one `latest`
names. Without --verify only the manifests and shard sizes are checked; with it every shard
is read and checked too. Exit 1 if any checkpoint is corrupt, or if ROOT is not a checkpoint
root (no `latest`, no step-N directory, no temporary: Errc::not_found naming it).

ROOT may be an object store, s3://bucket/prefix (endpoint from AWS_ENDPOINT_URL, region
from AWS_REGION, credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
AWS_SESSION_TOKEN, else the AWS_PROFILE profile of ~/.aws/credentials and ~/.aws/config,
else AWS_CONTAINER_CREDENTIALS_FULL_URI): then every committed step (one with
a tier manifest, docs/object-store.md) is listed, its shards read in ranged GETs per --verify.

ROOT may be a node set (DIR/node-0, DIR/node-1, ...: a checkpoint across node roots): then
every step on any node root is listed with its node count, redundancy scheme and how many
more node losses it survives, and each bad shard or block (missing, or failing the checks
of --verify) with whether the scheme can rebuild it; exit 1 if any file is bad.

example:
  ckpt ls /ckpts/run1 --verify fast
)",
                            *a);
  add_path(*c, "ROOT", a->root, "a checkpoint root, a node set, or s3://bucket/prefix");
  add_verify_option(*c, a->verify, "none (default): manifests and shard sizes; fast: also the XXH3\nof every chunk; full: also every file's SHA-256");
  return bind(c, a, cmd_ls);
}

struct InspectArgs : Common {
  std::string dir, step;
};


// A checkpoint written by `ckpt reshard`: the world size it came from and how its bytes were
// checked since a job saved them (training.resharded_from.source_verify, docs/format.md), for
// inspect and verify. nullopt for any other checkpoint.
struct ReshardedFrom {
  std::optional<int> world_size;
  std::optional<Verify> source_verify;  // nullopt: resharded before the field was recorded
};
std::optional<ReshardedFrom> resharded_from(const Manifest& m, const std::string& file) {
  const json::value* from = json_of(m.training).if_contains("resharded_from");
  if (!from || !from->is_object()) return std::nullopt;
  ReshardedFrom out;
  if (const json::value* w = from->as_object().if_contains("world_size"); w && w->is_int64()) out.world_size = static_cast<int>(w->as_int64());
  out.source_verify = resharded_source_verify(m, file);
  return out;
}

// "resharded from world size 4, its source read with --verify none: ..." (one line).
std::string resharded_text(const ReshardedFrom& r) {
  std::string t = "resharded from " + (r.world_size ? "world size " + std::to_string(*r.world_size) : std::string("another checkpoint"));
  if (!r.source_verify) return t + " (how its source was checked is not recorded)";
  if (*r.source_verify == Verify::none)
    return t + ", its source read with --verify none: its bytes were copied unchecked, and its checksums say only that they are "
               "what was copied, not that the source was sound";
  return t + ", its source checked as it was read (" + std::string(verify_name(*r.source_verify)) + ")";
}

json::value source_verify_json(const std::optional<ReshardedFrom>& r) {
  if (!r || !r->source_verify) return nullptr;
  return json::string(verify_name(*r->source_verify));
}

// The text of `ckpt inspect`: the manifest summary, the shard table and the tensor index; for
// a checkpoint across nodes (`h` set) also its layout, where each shard and block lives, the
// stripes and the health of every file; for one on an object store (`tier` set) also the run
// that committed it and when.
void print_inspect(const std::string& dir, const Manifest& m, const NodeCheckpointHealth* h, const std::string& set_dir = {},
                   const ObjectManifest* tier = nullptr) {
  std::uint64_t total = 0;
  for (const auto& s : m.shards) total += s.size;
  std::printf("checkpoint  %s\nstep        %llu\nworld size  %d\ncreated     %s\nwall clock  %.3f s\n", dir.c_str(),
              static_cast<unsigned long long>(m.step), m.world_size, m.created_at.c_str(), m.wall_clock_seconds);
  if (tier)
    std::printf("run         %s\nwriter id   %s\ncommitted   %s (the object store's tier manifest)\n",
                tier->run.empty() ? "(not recorded: committed before run identities)" : tier->run.c_str(), tier->run_id.c_str(),
                tier->committed_at.c_str());
  const std::string files = m.has_file_parts() ? " (" + std::to_string(m.shards.size()) + " files)" : "";
  std::printf("size        %s in %d shards%s, chunk %s\nparameters  %llu (flat)\n", human_bytes(total).c_str(), m.world_size, files.c_str(),
              human_bytes(m.chunk_size).c_str(), static_cast<unsigned long long>(m.param_numel));
  if (const auto from = resharded_from(m, join_path(dir, kManifestName))) std::printf("origin      %s\n", resharded_text(*from).c_str());
  if (h) {
    const NodeLayout& l = *m.nodes;
    std::printf("nodes       %d, %d rank%s per node\nredundancy  %s (survives %d lost node%s), %s in %zu blocks\n", l.nodes, l.ranks_per_node,
                l.ranks_per_node == 1 ? "" : "s", redundancy_name(l.scheme).c_str(), tolerated_node_losses(l.scheme),
                tolerated_node_losses(l.scheme) == 1 ? "" : "s", human_bytes(redundancy_bytes(m)).c_str(), m.redundancy.size());
    std::printf("health      %s: survives %s (sizes checked; ckpt verify reads the checksums)\n", node_state(*h).c_str(),
                survives_text(*h).c_str());
    for (const auto& n : health_notes(*h, set_dir)) std::printf("            %s\n", n.c_str());
  }
  if (!m.training.empty()) {
    // param_layout runs to one entry per model tensor: summarised, the rest printed whole.
    json::object tr = json_of(m.training);
    if (const auto* pl = tr.if_contains("param_layout"); pl && pl->is_array())
      tr["param_layout"] = std::to_string(pl->as_array().size()) + " tensors (ckpt inspect --json shows them)";
    std::printf("training    %s\n", json::serialize(tr).c_str());
  }
  std::printf("\n");
  const auto state = [](const MemberHealth& f) { return f.ok ? std::string("ok") : std::string(errc_name(f.code)); };
  if (h) {
    Table shards({{"RANK"}, {"NODE", true}, {"SHARD"}, {"SIZE", true}, {"PARAM OFF", true}, {"PARAM NUMEL", true}, {"SHA-256"}, {"STATE"}});
    for (const auto& s : m.shards)
      shards.row({std::to_string(s.rank), std::to_string(m.nodes->node_of(s.rank)), s.path, human_bytes(s.size), std::to_string(s.param_shard_offset),
                  std::to_string(s.param_shard_numel), s.sha256.substr(0, 16) + "...", state(h->shards[static_cast<std::size_t>(s.rank)])});
    shards.print();
    if (!m.redundancy.empty()) {
      std::printf("\n");
      Table blocks({{"KIND"}, {"NODE", true}, {"STRIPE", true}, {"WHAT"}, {"FILE"}, {"SIZE", true}, {"SHA-256"}, {"STATE"}});
      for (std::size_t i = 0; i < m.redundancy.size(); ++i) {
        const auto& b = m.redundancy[i];
        const bool parity = b.kind == RedundancyBlock::Kind::parity;
        blocks.row({parity ? "parity" : "replica", std::to_string(b.node), parity ? std::to_string(b.stripe) : "-",
                    parity ? "parity " + std::to_string(b.index) : "copy of rank " + std::to_string(b.rank), b.path, human_bytes(b.size),
                    b.sha256.substr(0, 16) + "...", state(h->blocks[i])});
      }
      blocks.print();
    }
    std::vector<std::uint64_t> sizes;
    for (const auto& s : m.shards) sizes.push_back(s.size);
    if (const auto stripes = rs_stripes(*m.nodes, sizes); !stripes.empty()) {
      std::printf("\n");
      Table table({{"STRIPE", true}, {"DATA (NODE:PIECE)"}, {"PARITY ON NODES"}, {"LENGTH", true}, {"SURVIVES"}});
      for (const auto& st : stripes) {
        std::string data, parity;
        for (const auto& p : st.data) data += (data.empty() ? "" : " ") + std::to_string(p.node) + ":" + std::to_string(p.index);
        const int margin = h->margins[static_cast<std::size_t>(st.index)];
        table.row({std::to_string(st.index), data, ints_text(st.parity_nodes), human_bytes(st.length),
                   margin < 0 ? "lost" : std::to_string(margin) + " more node loss" + (margin == 1 ? "" : "es")});
      }
      table.print();
    }
  } else {
    Table shards({{"RANK"}, {"SHARD"}, {"SIZE", true}, {"PARAM OFF", true}, {"PARAM NUMEL", true}, {"SHA-256"}});
    // A rank's further files (max_file_bytes) carry no param range: its first file has it.
    for (const auto& s : m.shards)
      shards.row({std::to_string(s.rank), s.path, human_bytes(s.size), s.part == 0 ? std::to_string(s.param_shard_offset) : "-",
                  s.part == 0 ? std::to_string(s.param_shard_numel) : "-", s.sha256.substr(0, 16) + "..."});
    shards.print();
  }
  std::printf("\n");
  Table tensors({{"RANK"}, {"TENSOR"}, {"DTYPE"}, {"SHAPE"}, {"BYTES", true}, {"OFFSET", true}});
  for (const auto& t : m.tensors)
    tensors.row({std::to_string(t.rank), t.name, std::string(dtype_name(t.dtype)), shape_str(t.shape), std::to_string(t.end - t.begin),
                 std::to_string(t.begin)});
  tensors.print();
}

// inspect --json, one shape whatever DIR is: the manifest, with what the kind records besides
// (a node set's health, an object store's tier manifest) and the checkpoints rotated away
// under earlier tries (none for a checkpoint named by its directory).
json::object inspect_json(const std::string& dir, const Manifest& m, const NodeCheckpointHealth* health, const ObjectManifest* tier,
                          const std::vector<std::string>& rotated) {
  json::object o{{"ok", true}, {"dir", dir}, {"manifest", json::parse(encode_manifest(m))}};
  if (health) o["health"] = health_json(*health);
  if (tier)
    o["tier"] = {{"run", tier->run}, {"run_id", tier->run_id}, {"committed_at", tier->committed_at}, {"data_prefix", tier->data_prefix},
                 {"manifest_sha256", tier->manifest_sha256}, {"bytes", tier->bytes}};
  o["rotated_away"] = strings_json(rotated);
  return o;
}

// inspect of a checkpoint on an object store: its tier manifest and checkpoint manifest
// (open_object_checkpoint: sizes and the manifest's SHA-256 checked), no shard read.
// inspect, one body over any store: the manifest summary, the shard table and the tensor
// index; with what the kind records besides (a node set's layout and health by sizes, an
// object store's tier manifest).
int cmd_inspect(const InspectArgs& a) {
  LocatedCheckpoint at = locate_checkpoint(a.dir);
  if (!a.step.empty()) {
    if (at.step || !at.store)
      throw Error(Errc::invalid_argument, a.dir, "STEP with a checkpoint", "DIR a root, a node set, a node root or s3://bucket/prefix",
                  "a checkpoint " + (at.step ? checkpoint_dir_name(*at.step) : at.dir));
    at.step = parse_checkpoint_dir_name(step_dir_name(a.step, a.dir));
  }
  if (!at.store) {
    const auto reader = CheckpointReader::open(posix_file_system(), at.dir);
    if (a.json) print_json("inspect", inspect_json(reader.dir(), reader.manifest(), nullptr, nullptr, {}));
    else print_inspect(reader.dir(), reader.manifest(), nullptr);
    return kExitOk;
  }
  CheckpointStore& store = *at.store;
  std::vector<std::string> rotated;
  return on_live_step(store, at.step, rotated, [&](std::uint64_t step) {
    const StoredCheckpoint c = store.describe(step);
    const std::string dir = store.name_of(step);
    if (a.json) {
      print_json("inspect", inspect_json(dir, *c.manifest, c.health.get(), c.tier.get(), rotated));
    } else {
      print_inspect(dir, *c.manifest, c.health.get(), store.root(), c.tier.get());
    }
    return kExitOk;
  });
}

Command declare_inspect(CLI::App& app) {
  auto a = std::make_shared<InspectArgs>();
  CLI::App* c = add_command(app, "inspect", "the manifest of a checkpoint and its tensor table", R"(
Show the manifest of checkpoint DIR (a step-N directory, or a root: its latest, or with
STEP that step's): step, world size, sizes, training metadata, the shard table and the
tensor index. --json prints the whole manifest. For a node set (DIR/node-0, DIR/node-1, ...,
a checkpoint across node roots) also the layout (nodes, ranks per node, redundancy scheme),
each shard's node, each redundancy block (kind, node, stripe, size), the stripes of an rs
scheme and how many more node losses each survives, and the state of every file (sizes
checked; ckpt verify reads the checksums).

DIR may be an object store, s3://bucket/prefix (its latest, or with STEP that step's) or
s3://bucket/prefix/step-N: then the step's tier manifest and checkpoint manifest are read
(the manifest's size and SHA-256 checked against the tier manifest; no shard is read) and
also the run id and commit time of the tier manifest are shown (--json: "tier"). A step not
committed there is exit 1, not_found naming its tier manifest object.

example:
  ckpt inspect /ckpts/run1/step-0000000010
  ckpt inspect /local/run1 20          # a node set: step 20 across its node roots
  ckpt inspect s3://bucket/run1/step-0000000020
)",
                            *a);
  add_path(*c, "DIR", a->dir, "a checkpoint directory, a root (its latest), a node set (the\nnewest latest of its node roots), or s3://bucket/prefix[/step-N]");
  c->add_option("STEP", a->step, "with a root or a node set: the checkpoint of step STEP (10 or\nstep-0000000010) instead of the latest")->type_name("");
  return bind(c, a, cmd_inspect);
}

struct VerifyArgs : Common {
  std::string dir, verify = "fast";
  bool full = false;
};

const char* verify_how(Verify mode) {
  return mode == Verify::full ? "full (xxh3 per chunk + sha256)" : mode == Verify::fast ? "fast (xxh3 per chunk)" : "none (sizes and headers)";
}

// DIR may be a checkpoint directory, a checkpoint of a store (ROOT/step-N, DIR/node-n/step-N),
// or a store (its latest): located as every command locates it, read through the store. With
// `live`, the checkpoint is noted there before it is opened.
CheckpointReader open_dir_or_root(const std::string& path, LiveReads* live = nullptr) {
  const LocatedCheckpoint at = locate_checkpoint(path);
  if (!at.store) return CheckpointReader::open(posix_file_system(), at.dir);
  CheckpointStore& store = *at.store;
  if (at.step) {
    if (live) live->note_dir(path);
    return store.open(*at.step);
  }
  std::optional<std::uint64_t> named;
  try {
    named = store.latest();
  } catch (const Error&) {  // latest_of reports it
  }
  const std::size_t note = live ? live->note_latest(store.root(), named ? checkpoint_dir_name(*named) : "") : 0;
  const std::uint64_t step = latest_of(store);
  if (live) live->opened(note, checkpoint_dir_name(step));
  return store.open(step);
}

// verify, one body over any store: every shard read and checked (a node set: every shard,
// redundancy block and manifest copy on its node, the bad ones listed with what the scheme
// can rebuild, then the shard headers). Exit 1 when anything is bad.
int cmd_verify(const VerifyArgs& a) {
  const std::string mode_name = a.full ? "full" : a.verify;
  const Verify mode = verify_of(mode_name);
  const LocatedCheckpoint at = locate_checkpoint(a.dir);
  std::vector<std::string> rotated;
  // What was verified, printed the same way for every kind.
  const auto report = [&](const std::string& dir, const Manifest& m) {
    std::uint64_t total = 0;
    for (const auto& s : m.shards) total += s.size;
    const auto from = resharded_from(m, join_path(dir, kManifestName));
    if (a.json) {
      print_json("verify", json::object{{"ok", true}, {"dir", dir}, {"mode", mode_name}, {"shards", m.shards.size()},
                              {"bytes", total}, {"source_verify", source_verify_json(from)}, {"rotated_away", strings_json(rotated)}});
    } else {
      std::printf("OK %s: %zu shards, %s verified, %s\n", dir.c_str(), m.shards.size(), human_bytes(total).c_str(), verify_how(mode));
      if (from) std::printf("%s %s\n", from->source_verify == Verify::none ? "warning:" : "note:", resharded_text(*from).c_str());
    }
    return kExitOk;
  };
  if (!at.store) {
    const auto reader = CheckpointReader::open(posix_file_system(), at.dir);
    {
      ProgressBar bar("verifying", !a.json);
      reader.verify(mode, bar.fn());
    }
    return report(reader.dir(), reader.manifest());
  }
  CheckpointStore& store = *at.store;
  return on_live_step(store, at.step, rotated, [&](std::uint64_t step) {
    const std::string dir = store.name_of(step);
    const auto h = store.health(step, mode);
    if (!h) {
      {
        ProgressBar bar("verifying", !a.json);
        store.verify(step, mode, bar.fn());
      }
      return report(dir, *store.manifest(step));
    }
    // A node set: the health of every file, then the shard headers through the reader.
    if (h->healthy()) store.verify(step, Verify::none);
    const Manifest& m = h->manifest;
    std::uint64_t total = 0;
    for (const auto& s : m.shards) total += s.size;
    const auto bad_blocks = std::count_if(h->blocks.begin(), h->blocks.end(), [](const MemberHealth& b) { return !b.ok; });
    const auto bad_copies = std::count_if(h->manifests.begin(), h->manifests.end(), [](const MemberHealth& f) { return !f.ok; });
    if (a.json) {
      json::object o{{"ok", h->healthy()}, {"dir", dir}, {"checkpoint", checkpoint_dir_name(step)}, {"mode", mode_name},
                     {"redundancy", redundancy_name(m.nodes->scheme)}, {"shards", m.shards.size()}, {"blocks", m.redundancy.size()},
                     {"bytes", total}, {"redundancy_bytes", redundancy_bytes(m)}, {"health", health_json(*h)},
                     {"source_verify", source_verify_json(resharded_from(m, join_path(dir, kManifestName)))},
                     {"rotated_away", strings_json(rotated)}};
      if (!h->healthy()) o["error"] = first_bad_json(*h);
      print_json("verify", o);
    } else if (h->healthy()) {
      std::printf("OK %s: %zu shards (%s) and %zu redundancy blocks (%s) verified, %s; %s survives %s\n", dir.c_str(), m.shards.size(),
                  human_bytes(total).c_str(), m.redundancy.size(), human_bytes(redundancy_bytes(m)).c_str(), verify_how(mode),
                  redundancy_name(m.nodes->scheme).c_str(), survives_text(*h).c_str());
    } else {
      std::printf("BAD %s: %zu of %zu shards, %zu of %zu redundancy blocks and %zu of %zu manifest copies bad, %s\n", dir.c_str(),
                  h->bad_ranks.size(), m.shards.size(), static_cast<std::size_t>(bad_blocks), m.redundancy.size(),
                  static_cast<std::size_t>(bad_copies), h->manifests.size(), verify_how(mode));
      for (const auto& n : health_notes(*h, store.root())) std::printf("  %s\n", n.c_str());
    }
    return h->healthy() ? kExitOk : kExitBad;
  });
}

Command declare_verify(CLI::App& app) {
  auto a = std::make_shared<VerifyArgs>();
  CLI::App* c = add_command(app, "verify", "check every shard's checksums (a progress bar on a terminal)", R"(
Read every shard of DIR (or a root's latest) and check it: the XXH3 of every chunk
(--verify fast, the default), or also the SHA-256 and XXH3 of every whole file (--verify
full, or --full), and every shard header against the manifest (--verify none: only that and
the sizes). A progress bar is drawn on a terminal, never into a pipe.

For a node set (DIR/node-0, DIR/node-1, ...: a checkpoint across node roots; DIR/node-n or
DIR/node-n/step-N name the same) every shard, every redundancy block and every node's copy
of the manifest is checked on its node; a bad or missing one is listed (what, node, the typed error), with whether the
scheme (replicate:F, rs:K+M) can rebuild the bad shards (ckpt repair DIR) or not. Exit 1
if any file is bad, rebuildable or not.

DIR may be an object store, s3://bucket/prefix: then the step its `latest` names is read in
ranged GETs and checked the same way, nothing written (docs/object-store.md).

A root a job saves to may rotate its checkpoint away while it is read: that is not damage.
The checkpoint `latest` names then is verified instead (up to 3 tries; --json lists the ones
rotated away in "rotated_away"); a checkpoint named by its directory, or rotated away on
every try, is exit 4, "rotated away", never exit 1. A checkpoint written by ckpt reshard
says how its source was checked (--json: "source_verify"); one resharded with --verify none
gets a warning: its checksums say only that its bytes are what was copied.

exit: 0 verified, 1 damaged or unreadable, 4 rotated away while it was read (see ckpt --help).

example:
  ckpt verify --verify full /ckpts/run1/step-0000000010
)",
                            *a);
  add_path(*c, "DIR", a->dir, "a checkpoint directory, a root (its latest), a node set\n(the newest latest of its node roots), or s3://bucket/prefix (its latest)");
  auto* mode = add_verify_option(*c, a->verify, "fast (default): the XXH3 of every chunk; full: also every file's\nSHA-256; none: sizes and shard headers only");
  c->add_flag("--full", a->full, "the same as --verify full")->excludes(mode);
  return bind(c, a, cmd_verify);
}

// ---- repair -----------------------------------------------------------------------------

struct RepairArgs : Common {
  std::string dir, verify = "fast";
  std::optional<std::uint64_t> step;
  bool full = false;
};

// repair over any store: what its redundancy rebuilds of the checkpoint (a node set's shards,
// blocks and manifest copies), under its writer (every node root's lock; the crash cleanup
// first). A store that keeps no redundancy has nothing to rebuild.
int cmd_repair(const RepairArgs& a) {
  LocatedCheckpoint at = locate_checkpoint(a.dir);
  if (a.step) {
    if (at.step && *at.step != *a.step)
      throw Error(Errc::invalid_argument, a.dir, "--step with a checkpoint directory", checkpoint_dir_name(*at.step), checkpoint_dir_name(*a.step));
    at.step = a.step;
  }
  const auto nothing_to_rebuild = [&] {
    return Error(Errc::invalid_argument, a.dir,
                 "nothing to rebuild: a checkpoint in one root has no redundancy (ckpt repair rebuilds the shards of a checkpoint "
                 "across node roots from its replicas or parity)",
                 "a node set DIR/node-0, DIR/node-1, ... saved with redundancy", "a single checkpoint root or checkpoint directory");
  };
  if (!at.store) throw nothing_to_rebuild();
  CheckpointStore& store = *at.store;
  const std::uint64_t step = at.step ? *at.step : latest_of(store);
  const std::string name = checkpoint_dir_name(step);
  const auto before = store.health(step, Verify::none);
  if (!before) throw nothing_to_rebuild();
  const std::string mode_name = a.full ? "full" : a.verify;
  const Verify mode = verify_of(mode_name);
  const auto writer = store.writer();  // Errc::busy: a writer (a training run, another repair) holds a node root
  // The repair logs each rebuilt file, which this prints on stdout: its other log lines
  // still go to stderr.
  std::vector<std::string> logged;
  std::vector<RepairReport> reports;
  const LogSink previous = set_log_sink([&logged](std::string_view l) { logged.emplace_back(l); });
  try {
    reports = writer->repair(step, mode);
  } catch (...) {
    set_log_sink(previous);
    for (const auto& l : logged) log_line(l);
    throw;
  }
  set_log_sink(previous);
  RepairReport rep;
  for (auto& r : reports) {
    rep.rebuilt_ranks.insert(rep.rebuilt_ranks.end(), r.rebuilt_ranks.begin(), r.rebuilt_ranks.end());
    rep.lines.insert(rep.lines.end(), r.lines.begin(), r.lines.end());
  }
  for (const auto& l : logged)
    if (std::none_of(rep.lines.begin(), rep.lines.end(), [&](const std::string& r) { return l == name + ": " + r; })) log_line(l);
  const auto after = store.health(step, Verify::none);
  const Manifest& m = after->manifest;
  const std::string scheme = redundancy_name(m.nodes->scheme);
  if (a.json) {
    print_json("repair", json::object{{"ok", true}, {"dir", store.root()}, {"checkpoint", name}, {"redundancy", scheme},
                            {"mode", mode_name}, {"rebuilt_ranks", ints_json(rep.rebuilt_ranks)}, {"rebuilt", strings_json(rep.lines)},
                            {"health", health_json(*after)}});
    return kExitOk;
  }
  if (rep.nothing_to_do()) {
    std::printf("nothing to repair: %s on %d node roots is whole (%zu shards, %zu redundancy blocks, %s); %s survives %s\n", name.c_str(),
                m.nodes->nodes, m.shards.size(), m.redundancy.size(), verify_how(mode), scheme.c_str(), survives_text(*after).c_str());
    return kExitOk;
  }
  for (const auto& l : rep.lines) std::printf("%s\n", l.c_str());
  std::printf("repaired %s: %zu file%s rebuilt, each checked against the manifest's SHA-256; %s survives %s\n", name.c_str(),
              rep.lines.size(), rep.lines.size() == 1 ? "" : "s", scheme.c_str(), survives_text(*after).c_str());
  return kExitOk;
}

Command declare_repair(CLI::App& app) {
  auto a = std::make_shared<RepairArgs>();
  CLI::App* c = add_command(app, "repair", "rebuild the lost or damaged shards and redundancy blocks of a\ncheckpoint across node roots from its replicas or parity", R"(
Rebuild every missing or damaged file (a shard, a parity block, a replica) of the latest
checkpoint of the node set DIR (DIR/node-0, DIR/node-1, ...; or of step N with --step)
from the replicas (replicate:F) or by Reed-Solomon decoding of the surviving data and
parity of its stripes (rs:K+M). Each rebuilt file is checked against the manifest's SHA-256
before it is renamed into place and fsynced; a lost node root gets its checkpoint
directory back (with the manifest, and `latest` if it had none), and a node's missing or
damaged copy of manifest.json is rewritten as the bytes the other nodes hold. What a killed
repair or writer left behind (temporaries) is removed first. Holds the writer lock of
every node root (Errc::busy if a training run or another repair holds one). Prints one line
per rebuilt file: what, where, from what. Damage is found as ckpt verify finds it
(--verify): the XXH3 of every chunk, or with full also the SHA-256 of every file.

More lost than the scheme survives (e.g. two nodes with rs:3+1) is exit 1 with
Errc::missing_shard naming the lost ranks, their nodes and the scheme's limit, and nothing is
written. A single root (no node set) has no redundancy: exit 1 with Errc::invalid_argument.

example:
  rm -rf /local/run1/node-1       # a node lost
  ckpt repair /local/run1         # rebuilds node-1's shards and parity from the other nodes
  ckpt verify /local/run1
)",
                            *a);
  add_path(*c, "DIR", a->dir, "a node set (or one of its node roots, or DIR/node-n/step-N)");
  c->add_option_function<std::uint64_t>("--step", [a](std::uint64_t s) { a->step = s; }, "the checkpoint of step N (default: the newest latest of the node roots)")
      ->check(cli::integer_in(0, static_cast<long double>(kMaxStep)))
      ->option_text("N");
  auto* mode = add_verify_option(*c, a->verify, "how damage is found: fast (default) the XXH3 of every chunk; full\nalso every file's SHA-256; none only missing files and sizes");
  c->add_flag("--full", a->full, "the same as --verify full")->excludes(mode);
  return bind(c, a, cmd_repair);
}

// ---- reshard, consolidate -------------------------------------------------------------

struct ReshardArgs : Common {
  std::string src, dst, verify = "fast";
  ReshardOptions opt;
};

int cmd_reshard(const ReshardArgs& a) {
  ReshardOptions opt = a.opt;
  opt.verify = verify_of(a.verify);
  if (const auto dst = locate_checkpoint(a.dst); dst.store && dst.store->kind() == StoreKind::node_set)
    throw Error(Errc::invalid_argument, a.dst, "reshard writes its checkpoint into one root, not across node roots", "DST a checkpoint root",
                dst.node_root ? "one node root of the node set " + dst.store->root() : std::string("a node set"));
  LiveReads live;
  return live.run([&] {
    const auto source = open_dir_or_root(a.src, &live);
    const auto t0 = std::chrono::steady_clock::now();
    ReshardResult r;
    {
      ProgressBar bar("resharding", !a.json);
      opt.progress = bar.fn();
      r = reshard_checkpoint(posix_file_system(), source, a.dst, opt);
    }
    const double secs = seconds_since(t0);
    const Manifest& m = r.manifest;
    if (a.json) {
      json::array shards;
      for (const auto& s : m.shards)
        shards.push_back(json::object{{"rank", s.rank}, {"path", s.path}, {"size", s.size}, {"sha256", s.sha256},
                                      {"param_shard_offset", s.param_shard_offset}, {"param_shard_numel", s.param_shard_numel}});
      print_json("reshard", json::object{{"ok", true}, {"source", source.dir()}, {"dir", r.dir}, {"step", m.step},
                              {"from_world_size", source.manifest().world_size}, {"world_size", m.world_size},
                              {"param_numel", m.param_numel}, {"bytes_read", r.bytes_read}, {"bytes_written", r.bytes_written},
                              {"buffer_bytes", opt.buffer_bytes}, {"seconds", secs}, {"shards", shards},
                              {"source_verify", verify_name(r.source_verify)}, {"rotated_away", live.rotated_json()}});
      return kExitOk;
    }
    std::printf("resharded step %llu from world size %d to %d: %s\n", static_cast<unsigned long long>(m.step),
                source.manifest().world_size, m.world_size, r.dir.c_str());
    std::printf("read %s, wrote %s in %zu shards through a %s buffer, %.2f s\n", human_bytes(r.bytes_read).c_str(),
                human_bytes(r.bytes_written).c_str(), m.shards.size(), human_bytes(opt.buffer_bytes).c_str(), secs);
    const std::string weaker = r.source_verify < opt.verify ? "; the source is itself a reshard whose source was checked only as " +
                                                                   std::string(verify_name(r.source_verify)) + " (recorded as such)"
                                                             : "";
    std::printf("source checked: %s%s\n", verify_how(opt.verify), weaker.c_str());
    Table table({{"RANK"}, {"SHARD"}, {"SIZE", true}, {"PARAM OFF", true}, {"PARAM NUMEL", true}});
    for (const auto& s : m.shards)
      table.row({std::to_string(s.rank), s.path, human_bytes(s.size), std::to_string(s.param_shard_offset), std::to_string(s.param_shard_numel)});
    table.print();
    return kExitOk;
  });
}

Command declare_reshard(CLI::App& app) {
  auto a = std::make_shared<ReshardArgs>();
  CLI::App* c = add_command(app, "reshard", "write checkpoint SRC at another world size (--world-size M) as a new\ncheckpoint under the root DST, streaming through a bounded buffer", R"(
Write checkpoint SRC (written at any world size N) as a new checkpoint at world size M,
with the same step, under the root DST (created if absent; its `latest` then names the new
checkpoint). A trainer checkpoint's new ranks each hold their slice of the flat optimizer
state (the tensors training.flat_tensors names, padded with zeros to a multiple of M), rank
0 also its other tensors. Any other checkpoint's sliced tensors are re-split along the
dimension they were split on, replicated tensors stay replicated (written once), rank-local
ones stay on their rank while it exists; per-rank metadata is remapped (docs/resharding.md). The new checkpoint
has its own checksums and goes through the durable commit; a corrupt source fails with the
typed error and leaves nothing behind (--verify fast or full). --verify none copies the
source unchecked: a line on stderr says so, and the new manifest records how its source was
checked (training.resharded_from.source_verify, shown by ckpt inspect and ckpt verify), so
checksums computed over damaged bytes never pass for a check of the source.
SRC may be a node set (read through its node roots; the new checkpoint is a plain one in
DST); DST may not be a node set or one of its node roots (Errc::invalid_argument).

example:
  ckpt reshard /ckpts/run1 /ckpts/run1-8 --world-size 8
)",
                            *a);
  add_path(*c, "SRC", a->src, "the checkpoint to reshard: a step-N directory, or a root (its\nlatest)");
  add_path(*c, "DST", a->dst, "the root the new checkpoint goes under");
  cli::add_int_option(*c, "--world-size", a->opt.world_size, 1, 1 << 20, "M", "the new world size")->required();
  add_buffer_option(*c, a->opt.buffer_bytes);
  add_verify_option(*c, a->verify, "of the source: fast (default) checks the XXH3 of every chunk\nread, full also every file's SHA-256 first, none only sizes and\nheaders");
  return bind(c, a, cmd_reshard);
}

struct ConsolidateArgs : Common {
  std::string src, out, dtype, verify = "fast";
  ConsolidateOptions opt;
};

// The directories of `path` that do not exist yet, the outermost last.
std::vector<std::filesystem::path> missing_dirs(const std::filesystem::path& path) {
  std::vector<std::filesystem::path> out;
  for (auto p = path; !p.empty() && !posix_file_system().stat(p.string()); p = p.parent_path()) {
    out.push_back(p);
    if (p == p.parent_path()) break;
  }
  return out;
}

int cmd_consolidate(const ConsolidateArgs& a) {
  ConsolidateOptions opt = a.opt;
  if (a.dtype == "f32") opt.dtype = DType::F32;
  else if (a.dtype == "f16") opt.dtype = DType::F16;
  else if (a.dtype == "bf16") opt.dtype = DType::BF16;
  opt.verify = verify_of(a.verify);
  LiveReads live;
  return live.run([&] {
    const auto source = open_dir_or_root(a.src, &live);
    // OUT's parent is created like reshard's DST: made here, and removed again if nothing is written into it.
    FileSystem& fs = posix_file_system();
    const auto created = missing_dirs(std::filesystem::path(a.out).parent_path());
    if (!created.empty()) {
      fs.create_dirs(created.front().string());
      const auto above = created.back().parent_path();
      fs.sync_dir(above.empty() ? "." : above.string());
    }
    const auto t0 = std::chrono::steady_clock::now();
    ConsolidateResult r;
    try {
      ProgressBar bar("consolidating", !a.json);
      opt.progress = bar.fn();
      r = consolidate_checkpoint(fs, source, a.out, opt);
    } catch (...) {
      if (!created.empty()) fs.remove_all(created.back().string());
      throw;
    }
    const double secs = seconds_since(t0);
    std::size_t tensors = 0;
    for (const auto& f : r.files) tensors += f.tensors.size();
    // What was exported: a trainer checkpoint's flat tensor, or every global tensor.
    const std::string from = source.manifest().training.contains("flat_tensors") ? opt.tensor : "global tensors";
    if (a.json) {
      const auto listed = [](const std::vector<ConsolidatedFile>& fs) {
        json::array out;
        for (const auto& f : fs) {
          out.push_back(json::object{{"name", f.name}, {"size", f.size}, {"tensors", strings_json(f.tensors)}});
        }
        return out;
      };
      const json::array files = listed(r.files), optimizer_files = listed(r.optimizer_files);
      print_json("consolidate", json::object{{"ok", true}, {"source", source.dir()}, {"dir", r.dir}, {"dtype", dtype_name(r.dtype)},
                              {"tensor", from}, {"tensors", tensors}, {"total_size", r.total_size},
                              {"index", r.index ? json::value(*r.index) : json::value(nullptr)},
                              {"config", r.config ? json::value(*r.config) : json::value(nullptr)}, {"files", files},
                              {"optimizer_files", optimizer_files}, {"optimizer_size", r.optimizer_size},
                              {"optimizer_index", r.optimizer_index ? json::value(*r.optimizer_index) : json::value(nullptr)},
                              {"left_out", r.left_out}, {"source_verify", verify_name(r.source_verify)},
                              {"bytes_read", r.bytes_read}, {"seconds", secs}, {"rotated_away", live.rotated_json()}});
      return kExitOk;
    }
    std::printf("consolidated %zu tensors of %s (%s, %s of %s) into %s in %.2f s\n", tensors, source.dir().c_str(),
                from.c_str(), human_bytes(r.total_size).c_str(), std::string(dtype_name(r.dtype)).c_str(), r.dir.c_str(), secs);
    Table table({{"FILE"}, {"SIZE", true}, {"TENSORS"}}, "  ");
    for (const auto& f : r.files) table.row({f.name, human_bytes(f.size), std::to_string(f.tensors.size()) + " tensors"});
    if (r.index) table.row({*r.index, "", "weight map of " + std::to_string(tensors) + " tensors"});
    std::size_t optimizer_tensors = 0;
    for (const auto& f : r.optimizer_files) {
      table.row({f.name, human_bytes(f.size), std::to_string(f.tensors.size()) + " optimizer tensors"});
      optimizer_tensors += f.tensors.size();
    }
    if (r.optimizer_index) table.row({*r.optimizer_index, "", "weight map of " + std::to_string(optimizer_tensors) + " tensors"});
    table.print();
    if (r.left_out) std::printf("left out %zu optimizer tensors (--with-optimizer keeps them)\n", r.left_out);
    return kExitOk;
  });
}

Command declare_consolidate(CLI::App& app) {
  auto a = std::make_shared<ConsolidateArgs>();
  CLI::App* c = add_command(app, "consolidate", "write the full model (fp32 master weights by default) as safetensors\nin the Hugging Face layout, one file or several plus an index", R"(
Write the full model of checkpoint SRC into the new directory OUT in the Hugging Face
layout: for a trainer checkpoint, every tensor of the model (training.param_layout)
reassembled from the shards of the flat tensor NAME (default optim.master, the fp32 master
weights); for any other, every global tensor (sliced, replicated, or stored whole on one
rank; rank-local tensors left out) under its global name. Float tensors are cast to
--dtype. Into OUT/model.safetensors, or, when the tensors exceed SIZE bytes, into
OUT/model-0000k-of-0000n.safetensors plus OUT/model.safetensors.index.json. Optimizer
state (the trainer's other flat tensors, tensors named optim.*) is left out unless
--with-optimizer: then it goes into OUT/optimizer*.safetensors the same way. Streams through
a bounded buffer; OUT appears only when complete, and its parent is created if absent.

example:
  ckpt consolidate /ckpts/run1 /models/run1 --dtype bf16 --max-file-size 1.5G
)",
                            *a);
  add_path(*c, "SRC", a->src, "the checkpoint to export: a step-N directory, or a root (its\nlatest)");
  add_path(*c, "OUT", a->out, "the new directory (must not exist)");
  c->add_option("--dtype", a->dtype, "f32, f16 or bf16 (default: the tensor's own)")
      ->check(CLI::IsMember({"f32", "f16", "bf16"}).description(""))
      ->option_text("T");
  cli::add_size_option(*c, "--max-file-size", a->opt.max_file_size, "tensor bytes per file, e.g. 5G, 1.5G, 500M, 64K (default: one\nfile)");
  c->add_option("--tensor", a->opt.tensor, "the flat tensor to export (default " + a->opt.tensor + ")")->option_text("NAME");
  auto* weights = c->add_flag("--only-weights")->description("leave the optimizer state out (the default)");
  c->add_flag("--with-optimizer", a->opt.with_optimizer, "also write the optimizer state, in its own dtype, into\noptimizer.safetensors (or optimizer-0000k-of-0000n + index)")
      ->excludes(weights);
  add_buffer_option(*c, a->opt.buffer_bytes);
  add_verify_option(*c, a->verify, "of the source, as for reshard (default fast); recorded in every\nfile's __metadata__ as ckpt.source_verify");
  return bind(c, a, cmd_consolidate);
}

// ---- prune ----------------------------------------------------------------------------

struct PruneArgs : Common {
  std::string root;
  std::uint64_t keep = 0;  // 0: not given (then only --leftovers-older-than runs)
  bool dry_run = false;
  std::optional<std::uint64_t> leftovers_older_than;  // seconds; s3 roots only
};

// A checkpoint as prune sees it.
struct PruneEntry {
  std::string name;
  bool ok = false;  // opens (complete; across nodes: every shard there or rebuildable)
  bool is_latest = false;
  std::uint64_t bytes = 0;
  std::string state;
};

// Keeps the newest a.keep good checkpoints of `list` (newest first) and the latest, removes
// the older ones through `remove` (unless --dry-run), and reports what it did, with the
// leftovers an object store's collection removed (`leftovers`) if it ran. Without --keep
// (a.keep 0) no checkpoint is touched.
int prune_list(const PruneArgs& a, const std::string& root, const std::vector<PruneEntry>& list,
               const std::function<void(const std::string&)>& remove, const LeftoverReport* leftovers = nullptr) {
  const std::uint64_t keep = a.keep;
  const bool dry = a.dry_run;
  std::uint64_t good = 0;
  json::array kept, removed;
  std::vector<std::string> kept_lines, removed_lines;
  for (const auto& c : list) {
    if (!keep) break;  // without --keep no checkpoint is kept or removed
    const bool past = good >= keep;
    const std::string note = c.is_latest ? " (latest)" : (!c.ok ? " (corrupt)" : "");
    if (!past || c.is_latest) {
      good += c.ok;
      kept.push_back(json::object{{"name", c.name}, {"latest", c.is_latest}, {"state", c.state}});
      kept_lines.push_back(c.name + note);
      continue;
    }
    if (!dry) remove(c.name);
    removed.push_back(json::object{{"name", c.name}, {"bytes", c.bytes}, {"state", c.state}});
    removed_lines.push_back(c.name + note + ", " + human_bytes(c.bytes));
  }
  if (a.json) {
    json::object o{{"ok", true}, {"root", root}, {"keep", keep}, {"dry_run", dry}, {"kept", kept}, {"removed", removed}};
    if (leftovers) {
      o["leftovers"] = {{"older_than_seconds", *a.leftovers_older_than}, {"removed", strings_json(leftovers->removed)}, {"aborted", strings_json(leftovers->aborted)},
                        {"kept_young", leftovers->kept_young}};
    }
    print_json("prune", o);
    return kExitOk;
  }
  for (const auto& l : kept_lines) std::printf("kept     %s\n", l.c_str());
  for (const auto& l : removed_lines) std::printf("%s %s\n", dry ? "would remove" : "removed ", l.c_str());
  if (keep && removed_lines.empty())
    std::printf("nothing to remove: %zu checkpoints, keeping %llu\n", list.size(), static_cast<unsigned long long>(keep));
  if (leftovers) {
    for (const auto& k : leftovers->removed) std::printf("removed  leftover %s\n", k.c_str());
    for (const auto& k : leftovers->aborted) std::printf("aborted  multipart upload %s\n", k.c_str());
    std::printf("leftovers: %zu object%s removed, %zu upload%s aborted, %llu younger than %llu s kept\n", leftovers->removed.size(),
                leftovers->removed.size() == 1 ? "" : "s", leftovers->aborted.size(), leftovers->aborted.size() == 1 ? "" : "s",
                static_cast<unsigned long long>(leftovers->kept_young), static_cast<unsigned long long>(*a.leftovers_older_than));
  }
  return kExitOk;
}

// prune, one body over any store: under the store's writer (a directory's lock, every node
// root's, or an object store's writer lease: Errc::busy while a job writes to it; without
// the kind's crash cleanup), the committed steps newest first, each one that opens (complete, or
// degraded: a node set's redundancy rebuilds it) counted, removed through the writer.
int cmd_prune(const PruneArgs& a) {
  const std::string root = strip_slashes(a.root);
  if (const auto at = locate_checkpoint(root); at.node_root) {
    const std::string& set = at.store->root();
    throw Error(Errc::invalid_argument, root,
                "one node root of the node set " + set + ": pruning it alone would leave the other nodes' parts of its checkpoints",
                "the node set (ckpt prune " + set + " removes a step on every node root)", "its node root " + root);
  }
  const auto store = open_store(root);
  (void)store->list(Verify::none);  // Errc::not_found before anything is taken: no checkpoint root there
  std::unique_ptr<StoreWriter> writer;
  if (!a.dry_run) writer = store->writer({.lead = true, .clean_up = false});
  std::optional<LeftoverReport> leftovers;
  if (a.leftovers_older_than) {
    leftovers = writer->collect_leftovers(std::chrono::seconds(static_cast<std::int64_t>(*a.leftovers_older_than)));
    if (!leftovers)
      throw Error(Errc::invalid_argument, root, "--leftovers-older-than collects what commits to an object store left",
                  "an s3://bucket/prefix root", "a " + std::string(store_kind_name(store->kind())) + " (its temporaries are removed by the next writer)");
  }
  std::vector<PruneEntry> entries;
  const auto list = store->list(Verify::none);
  for (auto it = list.rbegin(); it != list.rend(); ++it) {  // newest first
    if (!it->step) continue;                                 // a save in progress (or a crashed one's, removed by its next writer)
    const bool opens = it->state == CheckpointState::complete || it->state == CheckpointState::degraded;
    entries.push_back({it->name, opens, it->is_latest, it->bytes + it->redundancy_bytes, std::string(checkpoint_state_name(it->state))});
  }
  return prune_list(
      a, root, entries, [&](const std::string& name) { writer->remove(*parse_checkpoint_dir_name(name)); }, leftovers ? &*leftovers : nullptr);
}

Command declare_prune(CLI::App& app) {
  auto a = std::make_shared<PruneArgs>();
  CLI::App* c = add_command(app, "prune", "remove all but the newest K checkpoints (--keep K), never `latest`", R"(
Keep the newest K checkpoints of ROOT that open (manifest and shard sizes good) and the one
`latest` names; remove every checkpoint older than the K-th kept one. Each removal is
durable and crash-safe (renamed to a temporary, the root fsynced, then deleted). Corrupt
checkpoints newer than the K-th are left for inspection; temporaries of a save in progress
are never touched: prune holds the store's writer while it runs (a directory's lock, every
node root's, or an object store's writer lease: Errc::busy while a job writes there; a lease
a job that died left is taken over once it went a whole period unrenewed), and removes only
the steps it names (what a writer that died left is the next writer's to remove). On a node set (DIR/node-0, DIR/node-1, ...) a step is removed on every
node root, holding every node root's lock; a degraded step (a shard missing that its
redundancy rebuilds) counts as one that opens. A single node root DIR/node-n is refused
(prune the node set instead). On an object store, s3://bucket/prefix, a step's tier manifest
is removed first (from then on it does not exist for readers), then its data.

--leftovers-older-than SECONDS (s3:// roots only; with or without --keep) first collects
what failed or killed commits left there: every object under step-N/<run>/ that no tier
manifest commits, and every multipart upload never completed, that the server dates more
than SECONDS ago; each removed is printed. SECONDS must exceed the longest commit to that
root (hours, not seconds): the data of a commit still uploading would be collected. It does
not take --dry-run.

example:
  ckpt prune /ckpts/run1 --keep 3
  ckpt prune s3://bucket/run1 --keep 3 --leftovers-older-than 86400
)",
                            *a);
  add_path(*c, "ROOT", a->root, "a checkpoint root, a node set, or s3://bucket/prefix");
  auto* keep = cli::add_int_option(*c, "--keep", a->keep, std::uint64_t{1}, std::uint64_t{1} << 30, "K", "checkpoints to keep, K >= 1");
  auto* dry = c->add_flag("--dry-run", a->dry_run, "say what would be removed, remove nothing");
  auto* leftovers = c->add_option_function<std::uint64_t>("--leftovers-older-than", [a](std::uint64_t s) { a->leftovers_older_than = s; },
                                                          "s3 roots: also remove leftovers of failed commits older than\nSECONDS")
                        ->check(cli::integer_in(0, static_cast<long double>(std::uint64_t{1} << 40)))
                        ->option_text("SECONDS")
                        ->excludes(dry);
  c->parse_complete_callback([c, keep, leftovers] {
    if (c->parsed() && keep->count() == 0 && leftovers->count() == 0) throw CLI::RequiredError("--keep (or --leftovers-older-than)");
  });
  return bind(c, a, cmd_prune);
}

// ---- diff -----------------------------------------------------------------------------

double load_as_double(DType t, const std::byte* p) noexcept {
  auto get = [p]<class T>(T) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  };
  switch (t) {
    case DType::F16: return f16_to_f32(get(std::uint16_t{}));
    case DType::BF16: return bf16_to_f32(get(std::uint16_t{}));
    case DType::F32: return get(float{});
    case DType::F64: return get(double{});
    case DType::I8: return get(std::int8_t{});
    case DType::I16: return get(std::int16_t{});
    case DType::I32: return get(std::int32_t{});
    case DType::I64: return static_cast<double>(get(std::int64_t{}));
    case DType::U8:
    case DType::BOOL: return get(std::uint8_t{});
    case DType::U16: return get(std::uint16_t{});
    case DType::U32: return get(std::uint32_t{});
    case DType::U64: return static_cast<double>(get(std::uint64_t{}));
  }
  return 0;
}

struct TensorDiff {
  std::string name;
  std::optional<int> rank;  // nullopt: a flat tensor, compared over the whole flat space
  std::string status;       // equal, differs, shape mismatch, dtype mismatch, only in A, only in B
  std::string detail;
  double max_abs = 0;
  std::uint64_t differing = 0;
};

// Compares two byte streams of `numel` elements of type `t`, fetched piece by piece.
void compare_stream(DType t, std::uint64_t numel, const std::function<void(std::uint64_t, std::span<std::byte>)>& read_a,
                    const std::function<void(std::uint64_t, std::span<std::byte>)>& read_b, TensorDiff& d) {
  constexpr std::uint64_t kPieceBytes = 8ull << 20;
  const std::uint64_t es = dtype_size(t), per = kPieceBytes / es;
  std::vector<std::byte> pa, pb;
  for (std::uint64_t done = 0; done < numel;) {
    const std::uint64_t n = std::min(per, numel - done);
    pa.resize(static_cast<std::size_t>(n * es));
    pb.resize(pa.size());
    read_a(done, pa);
    read_b(done, pb);
    if (std::memcmp(pa.data(), pb.data(), pa.size()) != 0) {
      for (std::uint64_t i = 0; i < n; ++i) {
        if (std::memcmp(pa.data() + i * es, pb.data() + i * es, es) == 0) continue;
        const double x = load_as_double(t, pa.data() + i * es), y = load_as_double(t, pb.data() + i * es);
        if (std::isnan(x) && std::isnan(y)) continue;  // two NaNs (different payloads) are the same value
        ++d.differing;
        const double diff = std::isnan(x) || std::isnan(y) ? std::numeric_limits<double>::infinity() : std::abs(x - y);
        d.max_abs = std::max(d.max_abs, diff);
      }
    }
    done += n;
  }
  d.status = d.differing ? "differs" : "equal";
}

struct DiffArgs : Common {
  std::string a, b, verify = "fast";
};

// Records a dtype or shape mismatch of A's (ta, sa) and B's (tb, sb) in `d`; false if none.
bool type_mismatch(DType ta, const std::vector<std::uint64_t>& sa, DType tb, const std::vector<std::uint64_t>& sb, TensorDiff& d) {
  if (ta != tb) {
    d.status = "dtype mismatch";
    d.detail = std::string(dtype_name(ta)) + " vs " + std::string(dtype_name(tb));
  } else if (sa != sb) {
    d.status = "shape mismatch";
    d.detail = shape_str(sa) + " vs " + shape_str(sb);
  }
  return !d.status.empty();
}

int diff_checkpoints(const DiffArgs& a, LiveReads& live) {
  const auto ra = open_dir_or_root(a.a, &live), rb = open_dir_or_root(a.b, &live);
  const Manifest &ma = ra.manifest(), &mb = rb.manifest();
  const Verify mode = verify_of(a.verify);
  for (const auto* r : {&ra, &rb}) verify_headers(*r, mode);
  // Flat tensors compare in the flat space when both checkpoints describe it the same way.
  std::optional<FlatReader> fa, fb;
  std::vector<std::string> flat;
  std::string flat_note;
  try {
    const FlatLayout la = flat_layout(ma), lb = flat_layout(mb);
    if (la.tensors == lb.tensors && la.num_params == lb.num_params) {
      fa.emplace(ra, la, mode);
      fb.emplace(rb, lb, mode);
      flat = la.tensors;
    } else {
      flat_note = "flat layouts differ: flat tensors compared rank by rank";
    }
  } catch (const Error& e) {
    if (e.code() != Errc::invalid_argument) throw;  // no flat layout recorded: compare global tensors
  }
  auto is_flat = [&](const std::string& n) { return std::find(flat.begin(), flat.end(), n) != flat.end(); };
  std::vector<TensorDiff> diffs;
  // Without flat layouts on both sides: the global tensors (sliced, replicated, single) are
  // compared whole, whatever world size and split stored them; the rest by name and rank.
  std::set<const TensorRecord*> covered;
  std::vector<GlobalTensor> ga, gb;
  if (!fa && flat_note.empty()) {
    ga = global_tensors(ma);
    gb = global_tensors(mb);
    const auto read_global = [mode](const CheckpointReader& r, const std::vector<GlobalTensor>& gs, const GlobalTensor& g) {
      return [&r, &gs, &g, mode](std::uint64_t at, std::span<std::byte> out) {
        const std::uint64_t es = dtype_size(g.dtype);
        std::vector<SliceTarget> targets;
        std::uint64_t pos = 0;
        for (auto& b : boxes_of_range(g.shape, at, out.size() / es)) {
          const std::uint64_t n = shape_numel(b.lengths) * es;
          targets.push_back({g.name, g.dtype, std::move(b.offsets), std::move(b.lengths), out.subspan(pos, n)});
          pos += n;
        }
        load_slices(r, gs, targets, mode);
      };
    };
    for (const auto& g : gb)
      for (const auto& p : g.pieces) covered.insert(p.record);
    for (const auto& g : ga) {
      for (const auto& p : g.pieces) covered.insert(p.record);
      TensorDiff d{g.name, std::nullopt, "", "", 0, 0};
      const auto u = std::find_if(gb.begin(), gb.end(), [&](const GlobalTensor& h) { return h.name == g.name; });
      if (u == gb.end()) {
        d.status = "only in A";
      } else if (!type_mismatch(g.dtype, g.shape, u->dtype, u->shape, d)) {
        compare_stream(g.dtype, shape_numel(g.shape), read_global(ra, ga, g), read_global(rb, gb, *u), d);
      }
      diffs.push_back(std::move(d));
    }
    for (const auto& g : gb)
      if (std::none_of(ga.begin(), ga.end(), [&](const GlobalTensor& h) { return h.name == g.name; }))
        diffs.push_back({g.name, std::nullopt, "only in B", "", 0, 0});
  }
  for (const auto& name : flat) {
    TensorDiff d{name, std::nullopt, "", "", 0, 0};
    const DType ta = fa->dtype(name), tb = fb->dtype(name);
    if (ta != tb) {
      d.status = "dtype mismatch";
      d.detail = std::string(dtype_name(ta)) + " vs " + std::string(dtype_name(tb));
    } else {
      compare_stream(
          ta, fa->layout().num_params, [&](std::uint64_t at, std::span<std::byte> out) { fa->read(name, at, out); },
          [&](std::uint64_t at, std::span<std::byte> out) { fb->read(name, at, out); }, d);
    }
    diffs.push_back(std::move(d));
  }
  // Everything else by (name, rank), in A's index order, then what only B has.
  std::map<std::pair<std::string, int>, bool> seen;
  std::optional<ShardRangeReader> sa, sb;
  auto reader_for = [mode](std::optional<ShardRangeReader>& cur, const CheckpointReader& r, int rank) -> ShardRangeReader& {
    if (!cur || cur->rank() != rank) cur.emplace(r, rank, mode);
    return *cur;
  };
  for (const auto& t : ma.tensors) {
    if (is_flat(t.name) || covered.count(&t)) continue;
    seen[{t.name, t.rank}] = true;
    TensorDiff d{t.name, t.rank, "", "", 0, 0};
    const TensorRecord* u = mb.find_tensor(t.name, t.rank);
    if (!u) {
      d.status = "only in A";
    } else if (!type_mismatch(t.dtype, t.shape, u->dtype, u->shape, d)) {
      const std::uint64_t es = dtype_size(t.dtype);
      compare_stream(
          t.dtype, (t.end - t.begin) / es,
          [&](std::uint64_t at, std::span<std::byte> out) { reader_for(sa, ra, t.rank).read(t.begin + at * es, out); },
          [&](std::uint64_t at, std::span<std::byte> out) { reader_for(sb, rb, u->rank).read(u->begin + at * es, out); }, d);
    }
    diffs.push_back(std::move(d));
  }
  for (const auto& t : mb.tensors)
    if (!is_flat(t.name) && !covered.count(&t) && !seen.count({t.name, t.rank})) diffs.push_back({t.name, t.rank, "only in B", "", 0, 0});

  bool equal = true;
  for (const auto& d : diffs) equal &= d.status == "equal";
  if (a.json) {
    json::array out;
    for (const auto& d : diffs) {
      json::object o{{"name", d.name}, {"rank", d.rank ? json::value(*d.rank) : json::value(nullptr)}, {"flat", !d.rank}, {"status", d.status}};
      if (!d.detail.empty()) o["detail"] = d.detail;
      if (d.status == "differs" || d.status == "equal") {
        o["max_abs_diff"] = std::isinf(d.max_abs) ? json::value("inf") : json::value(d.max_abs);
        o["differing"] = d.differing;
      }
      out.push_back(std::move(o));
    }
    print_json("diff", json::object{{"ok", true}, {"a", ra.dir()}, {"b", rb.dir()}, {"equal", equal},
                            {"step", json::array{ma.step, mb.step}}, {"world_size", json::array{ma.world_size, mb.world_size}},
                            {"tensors", out}, {"rotated_away", live.rotated_json()}});
    return equal ? kExitOk : kExitDiffer;
  }
  std::printf("A %s (step %llu, world size %d)\nB %s (step %llu, world size %d)\n", ra.dir().c_str(),
              static_cast<unsigned long long>(ma.step), ma.world_size, rb.dir().c_str(), static_cast<unsigned long long>(mb.step),
              mb.world_size);
  if (!flat_note.empty()) std::printf("%s\n", flat_note.c_str());
  std::printf("\n");
  Table table({{"TENSOR"}, {"RANK"}, {"STATUS"}, {"MAX ABS DIFF (ELEMENTS DIFFERING)"}});
  std::size_t n_equal = 0;
  for (const auto& d : diffs) {
    n_equal += d.status == "equal";
    char extra[96] = "";
    if (d.status == "differs") std::snprintf(extra, sizeof extra, "%.6g (%llu)", d.max_abs, static_cast<unsigned long long>(d.differing));
    table.row({d.name, d.rank ? std::to_string(*d.rank) : (fa ? "flat" : "global"), d.status, extra + d.detail});
  }
  table.print();
  std::printf("\n%zu of %zu tensors equal: %s\n", n_equal, diffs.size(), equal ? "the checkpoints are equal" : "the checkpoints differ");
  return equal ? kExitOk : kExitDiffer;
}

int cmd_diff(const DiffArgs& a) {
  LiveReads live;
  return live.run([&] { return diff_checkpoints(a, live); });
}


Command declare_diff(CLI::App& app) {
  auto a = std::make_shared<DiffArgs>();
  CLI::App* c = add_command(app, "diff", "compare two checkpoints tensor by tensor: equal, or the largest\nabsolute difference; shape and dtype mismatches are reported", R"(
Compare two checkpoints tensor by tensor. The flat optimizer tensors (training.flat_tensors)
are compared over the whole flat space; in checkpoints without them, every global tensor
(sliced, replicated, or stored whole on one rank: docs/format.md) is compared whole under
its global name; so checkpoints of different world sizes and splits compare (a checkpoint
and its reshard are equal). Other tensors (rank-local ones) by name and rank. Each tensor is
equal, differs (float types: the largest absolute difference and the number of differing
elements; a NaN against a number counts as an infinite difference), has a shape or dtype
mismatch, or is only in A or only in B. Exit 0 if everything is equal, 3 if not.

example:
  ckpt diff /ckpts/run1/step-0000000010 /ckpts/run1/step-0000000020
)",
                            *a);
  add_path(*c, "A", a->a, "a checkpoint directory, or a root (its latest)");
  add_path(*c, "B", a->b, "a checkpoint directory, or a root (its latest)");
  add_verify_option(*c, a->verify, "fast (default): the XXH3 of every chunk read; full: also each\nwhole shard's SHA-256 first; none: sizes and shard headers only");
  return bind(c, a, cmd_diff);
}

// ---- get ------------------------------------------------------------------------------

struct GetArgs : Common {
  std::string dir, tensor, out, verify = "fast";
  std::optional<int> rank;
};

// Writes `parts` to `path` whole, or nothing: into a temporary beside it, renamed over it at
// the end (an existing file is replaced only by a complete one). Errors name `path`.
void write_file_atomically(const std::string& path, std::initializer_list<std::span<const std::byte>> parts) {
  const std::string temp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno(errno, "open for writing", path);
  auto fail = [&](int err, const char* action) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw_errno(err, action, path);
  };
  for (auto part : parts) {
    while (!part.empty()) {
      const ssize_t n = ::write(fd, part.data(), part.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(errno, "write");
      part = part.subspan(static_cast<std::size_t>(n));
    }
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw_errno(err, "close", path);
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw_errno(err, "rename", path);
  }
}

// Without --rank: the lowest rank holding the tensor (rank 0 if none does: its error lists
// what rank 0 holds).
int rank_of(const GetArgs& a, const Manifest& m) {
  if (a.rank) return *a.rank;
  int rank = 0;
  for (int r = m.world_size - 1; r >= 0; --r)
    if (m.find_tensor(a.tensor, r)) rank = r;
  return rank;
}

// A tensor `ckpt get` read, from a mapped shard or an object store, and what reading it checked.
struct GotTensor {
  std::string dir;
  int rank = 0;
  const TensorRecord* record;  // name, dtype, shape
  std::span<const std::byte> data;
  bool mapped = false;
  std::uint64_t chunks_checked = 0, bytes_checked = 0, shard_size = 0;
  json::array rotated_away;  // checkpoints rotated away under earlier tries (LiveReads)
};

// Writes the tensor to --out as .npy (whole or not at all) and reports it.
int write_npy(const GetArgs& a, Verify mode, const GotTensor& g) {
  const TensorRecord& v = *g.record;
  const auto preamble = tool::npy_preamble(v.dtype, v.shape);
  if (!preamble)
    throw Error(Errc::invalid_argument, a.out, "a .npy version 1.0 header for tensor '" + a.tensor + "'", "at most 65535 bytes",
                std::to_string(v.shape.size()) + " dimensions");
  const auto header = std::as_bytes(std::span(preamble->data(), preamble->size()));
  // --out -: the .npy on standard output (for a pipe), and what is said about it on stderr.
  const bool to_stdout = a.out == "-";
  if (to_stdout) {
    for (const auto part : {header, g.data})
      if (!part.empty() && std::fwrite(part.data(), 1, part.size(), stdout) != part.size())
        throw Error(Errc::io_error, "standard output", "writing tensor '" + a.tensor + "' as .npy", {}, {}, errno);
    if (std::fflush(stdout) != 0) throw Error(Errc::io_error, "standard output", "writing tensor '" + a.tensor + "' as .npy", {}, {}, errno);
  } else {
    write_file_atomically(a.out, {header, g.data});
  }
  FILE* report = to_stdout ? stderr : stdout;
  const std::string descr(tool::npy_descr(v.dtype));
  const bool bf16 = v.dtype == DType::BF16;
  if (a.json) {
    json::array shape;
    for (const auto d : v.shape) shape.push_back(d);
    print_json("get", json::object{{"ok", true}, {"dir", g.dir}, {"tensor", v.name}, {"rank", g.rank},
                            {"dtype", dtype_name(v.dtype)}, {"descr", descr}, {"bf16_as_raw_u2", bf16},
                            {"shape", shape}, {"bytes", g.data.size()}, {"out", a.out}, {"verify", a.verify},
                            {"mapped", g.mapped}, {"chunks_checked", g.chunks_checked},
                            {"bytes_checked", g.bytes_checked}, {"rotated_away", g.rotated_away}});
    return kExitOk;
  }
  std::fprintf(report, "wrote %s (rank %d, %s %s, %s) to %s as '%s'\n", v.name.c_str(), g.rank, std::string(dtype_name(v.dtype)).c_str(),
              shape_str(v.shape).c_str(), human_bytes(g.data.size()).c_str(), a.out.c_str(), descr.c_str());
  if (mode == Verify::fast)
    std::fprintf(report, "verified: %llu chunk%s (%s) of %s checked, xxh3\n", static_cast<unsigned long long>(g.chunks_checked),
                g.chunks_checked == 1 ? "" : "s", human_bytes(g.bytes_checked).c_str(), human_bytes(g.shard_size).c_str());
  else if (mode == Verify::full)
    std::fprintf(report, "verified: the whole shard (%s), xxh3 per chunk + sha256\n", human_bytes(g.shard_size).c_str());
  else
    std::fprintf(report, "not verified (--verify none)\n");
  if (bf16) std::fprintf(report, "note: numpy has no bfloat16: the raw bits are written as '<u2' (see ckpt get --help)\n");
  return kExitOk;
}

// get, one body over any store: the tensor's view from the rank's shard (MappedShard: mapped
// where the store keeps files this process can map, else read through the store's file
// system, only the chunks covering it, each checked per --verify), written as .npy.
int cmd_get(const GetArgs& a) {
  if (a.out == "-" && a.json) throw cli::UsageError("--out - writes the tensor to standard output, where --json would write too");
  const Verify mode = verify_of(a.verify);
  const LocatedCheckpoint at = locate_checkpoint(a.dir);
  const auto got = [&](const std::string& dir, const CheckpointReader& reader, json::array rotated) {
    const int rank = rank_of(a, reader.manifest());
    check_rank(rank, reader.manifest().world_size, "rank", reader.dir());
    // The file of the rank's shard that holds the tensor (unknown: the first, whose error
    // lists what it holds).
    const Manifest& m = reader.manifest();
    const TensorRecord* rec = m.find_tensor(a.tensor, rank);
    const MappedShard shard(reader, rec ? m.file_of(*rec) : m.rank_record(rank), mode);
    const TensorView v = shard.tensor(a.tensor);  // a missing tensor: not_found listing the rank's
    const MappedShardStats st = shard.stats();
    return write_npy(a, mode, {dir, rank, reader.manifest().find_tensor(a.tensor, rank), v.data, shard.is_mapped(),
                               st.chunks_checked, st.bytes_checked, shard.size(), std::move(rotated)});
  };
  if (!at.store) {
    const auto reader = CheckpointReader::open(posix_file_system(), at.dir);
    return got(reader.dir(), reader, {});
  }
  CheckpointStore& store = *at.store;
  std::vector<std::string> rotated;
  return on_live_step(store, at.step, rotated, [&](std::uint64_t step) {
    return got(store.name_of(step), store.open(step), strings_json(rotated));
  });
}

Command declare_get(CLI::App& app) {
  auto a = std::make_shared<GetArgs>();
  CLI::App* c = add_command(app, "get", "write one tensor as a NumPy .npy file (--out FILE), reading only\nthe chunks that hold it", R"(
Write tensor TENSOR of checkpoint DIR (a step-N directory, or a root: its latest) to FILE in
the NumPy .npy format (version 1.0), readable with numpy.load. The shard is memory-mapped and
only the checksum chunks that cover the tensor are read and checked (--verify fast, the
default); --verify full checks the whole shard's SHA-256 first, --verify none nothing. Without
--rank the lowest rank that holds TENSOR is used. FILE is replaced only by a complete file.
dtypes map to numpy's: F16 '<f2', F32 '<f4', F64 '<f8', I8..I64 '|i1'..'<i8', U8..U64
'|u1'..'<u8', BOOL '|b1'. BF16 has no numpy dtype: its raw bits are written as '<u2'
(ml_dtypes.bfloat16 views them as numbers; or (a.astype('<u4') << 16).view('<f4')).
A missing tensor is exit 1, with the tensors the rank holds in the message.

DIR may be an object store, s3://bucket/prefix (its latest) or s3://bucket/prefix/step-N:
then only the checksum chunks that cover the tensor are fetched, in ranged GETs, and each
chunk's XXH3 is checked before its bytes are used (--verify full: the whole shard object's
SHA-256 first); an object rewritten since its commit is exit 1, checksum_mismatch naming the
object and the chunk, and FILE is not written.

example:
  ckpt get /ckpts/run1 model.wte --rank 0 --out wte.npy
  python3 -c 'import numpy; print(numpy.load("wte.npy").shape)'
)",
                            *a);
  add_path(*c, "DIR", a->dir, "a checkpoint directory, a root (its latest), or s3://bucket/prefix[/step-N]");
  add_path(*c, "TENSOR", a->tensor, "the tensor's name (ckpt inspect lists them)");
  c->add_option_function<int>("--rank", [a](int r) { a->rank = r; }, "the rank whose shard holds it (default: the lowest that does)")
      ->check(cli::integer_in(0, (1 << 20) - 1))
      ->option_text("R");
  c->add_option("--out", a->out, "the .npy file to write; - writes it to standard output (and the\nreport to stderr; not with --json)")->required()->option_text("FILE");
  add_verify_option(*c, a->verify, "fast (default): the XXH3 of the chunks holding the tensor; full:\nalso the whole shard's SHA-256 first; none: no checksum");
  return bind(c, a, cmd_get);
}

// ---- recover --------------------------------------------------------------------------

struct RecoverArgs : Common {
  std::vector<std::string> roots;
  bool plan = false;
  std::string verify = "none";
  std::optional<int> world_size;
};

json::object candidate_json(const RecoveryCandidate& c) {
  json::object o{{"level", c.level},
                 {"root", c.root},
                 {"kind", std::string(recovery_level_name(c.kind))},
                 {"step", c.step},
                 {"name", checkpoint_dir_name(c.step)},
                 {"fetch", std::string(recovery_fetch_name(c.fetch))},
                 {"bytes", c.bytes},
                 {"usable", c.usable()}};
  if (!c.usable()) o["passed_over"] = c.passed_over;
  return o;
}

// recover --plan: survey every level, print the plan, load nothing.
int cmd_recover(const RecoverArgs& a) {
  if (!a.plan)
    throw Error(Errc::invalid_argument, {}, "ckpt recover without --plan", "--plan (the recovery itself is a resume: ckpt-demo --resume auto, "
                "Trainer::resume_or_start, ckpt.Checkpointer.resume)", "no --plan");
  const RecoveryPlan plan = plan_recovery(a.roots, {.expected_world_size = a.world_size, .verify = verify_of(a.verify)});
  if (a.json) {
    json::array candidates, levels, roots;
    for (const auto& c : plan.candidates) candidates.push_back(candidate_json(c));
    for (const auto& e : plan.level_errors)
      levels.push_back(json::object{{"level", e.level}, {"root", e.root}, {"code", std::string(errc_id(e.code))}, {"error", e.error}});
    for (const auto& r : plan.roots) roots.emplace_back(r);
    json::object out{{"ok", plan.chosen.has_value()},
                     {"levels", roots},
                     {"candidates", candidates},
                     {"level_errors", levels},
                     {"discover_seconds", std::chrono::duration<double>(plan.discover).count()},
                     {"summary", plan.summary()}};
    out["chosen"] = plan.chosen ? json::value(candidate_json(*plan.chosen)) : json::value(nullptr);
    print_json("recover", out);
  } else {
    std::printf("%-5s %-12s %-40s %-16s %-8s %s\n", "LEVEL", "KIND", "ROOT", "STEP", "FETCH", "STATE");
    for (const auto& c : plan.candidates)
      std::printf("%-5zu %-12s %-40s %-16s %-8s %s\n", c.level, std::string(recovery_level_name(c.kind)).c_str(), c.root.c_str(),
                  checkpoint_dir_name(c.step).c_str(), std::string(recovery_fetch_name(c.fetch)).c_str(),
                  c.usable() ? "chosen" : ("passed over: " + c.passed_over).c_str());
    for (const auto& e : plan.level_errors)
      std::printf("%-5zu %-12s %-40s %-16s %-8s %s\n", e.level, "-", e.root.c_str(), "-", "-", e.error.c_str());
    std::printf("plan: %s (surveyed in %.3f s)\n", plan.summary().c_str(), std::chrono::duration<double>(plan.discover).count());
  }
  return plan.chosen ? kExitOk : kExitBad;
}

Command declare_recover(CLI::App& app) {
  auto a = std::make_shared<RecoverArgs>();
  CLI::App* c = add_command(app, "recover", "plan a resume across the levels that hold a run's checkpoints\n(--plan: memory, disk, durable tier; loads nothing)", R"(
Survey every ROOT given, cheapest level first (a memory root mem://NAME, a local directory or
node set, a durable directory or s3://bucket/prefix), and print the plan a resume follows:
the newest step that is complete on some level (or that a node set's redundancy rebuilds),
fetched from the first level that holds it usable, and every newer candidate passed over
with the reason. The survey reads manifests, directory entries and sizes (--verify fast or
full: also the shards' checksums); it writes nothing and loads nothing.

Exit status 0 when a checkpoint to recover from was found, 1 when none was (the levels'
errors say why). --json prints the plan as one object: chosen, candidates, level_errors,
discover_seconds, summary.

example:
  ckpt recover --plan mem://run /nvme/run s3://bucket/run
)",
                            *a);
  c->add_option("ROOT", a->roots, "the levels, cheapest first")->required()->type_name("");
  c->add_flag("--plan", a->plan, "print the plan without loading anything");
  add_verify_option(*c, a->verify, "none (default): manifests and sizes; fast: also every chunk's XXH3;\nfull: also every file's SHA-256");
  c->add_option_function<int>("--world-size", [a](int w) { a->world_size = w; }, "pass over a checkpoint saved at another world size")
      ->check(cli::integer_in(1, 1 << 20))
      ->option_text("N");
  return bind(c, a, cmd_recover);
}

// ---- the command line -----------------------------------------------------------------

// A usage error, as text on stderr, and with --json anywhere on the command line also as the
// JSON output (the parse failed, so the flag itself may not have been read).
cli::UsageReporter usage_reporter(int argc, char** argv) {
  const bool json = std::any_of(argv + 1, argv + argc, [](const char* s) { return std::strcmp(s, "--json") == 0; });
  return [json](const std::string& command, const std::string& message) {
    if (json) print_json_error(error_fields("usage", "", message, "", "", message));
    cli::print_usage_error(command, message);
  };
}

// `ckpt help [COMMAND]`: the same text as `ckpt [COMMAND] --help`.
Command declare_help(CLI::App& app, const std::vector<Command>& commands) {
  auto topic = std::make_shared<std::string>();
  std::vector<std::string> names;
  for (const auto& c : commands) names.push_back(c.app->get_name());
  CLI::App* c = app.add_subcommand("help", "the help of COMMAND, or this text");
  c->add_option("COMMAND", *topic, "a command")->check(CLI::IsMember(names))->type_name("");
  return {c, std::make_shared<Common>(), [&app, topic] {
            if (topic->empty()) std::cout << app.get_formatter()->make_help(&app, app.get_name(), CLI::AppFormatMode::Normal);
            else std::cout << app.get_subcommand(*topic)->help(app.get_name());
            return kExitOk;
          }};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(kDescription, "ckpt");
  cli::setup(app);
  app.footer(kFooter);
  app.require_subcommand(1);
  std::vector<Command> commands = {declare_ls(app),      declare_inspect(app),     declare_verify(app), declare_repair(app),
                                   declare_reshard(app), declare_consolidate(app), declare_prune(app),  declare_diff(app),
                                   declare_get(app),     declare_recover(app)};
  commands.push_back(declare_help(app, commands));
  const auto report = usage_reporter(argc, argv);
  if (const auto rc = cli::parse(app, argc, argv, report)) return *rc;
  const auto it = std::find_if(commands.begin(), commands.end(), [](const Command& c) { return c.app->parsed(); });
  const std::string name = "ckpt " + it->app->get_name();
  try {
    return it->run();
  } catch (const cli::UsageError& e) {  // options that contradict each other, found by the command
    report(name, e.what());
    return kExitUsage;
  } catch (const RotatedAway& r) {
    const std::string message =
        "rotated away: " + r.dir + ": removed by the rotation of a save into its root while it was read (latest names " + r.latest +
        " now)" + (r.named ? "" : "; rotated away on each of " + std::to_string(r.rotated.size()) + " tries") +
        ": not damage; read it again, or read a checkpoint the rotation keeps";
    if (it->common->json) {
      const json::array rotated = strings_json(r.rotated);
      print_json_error(error_fields("rotated_away", r.dir, "removed by rotation while it was read", "", r.latest, message), &rotated);
    }
    std::cerr << name << ": " << message << "\n";
    return kExitRotated;
  } catch (const Error& e) {
    if (it->common->json) print_json_error(error_json(e));
    std::cerr << name << ": " << e.what() << "\n";
    return kExitBad;
  } catch (...) {  // std::filesystem, std::bad_alloc, ...: typed like the library's own errors
    const Error e = to_error(std::current_exception());
    if (it->common->json) print_json_error(error_json(e));
    std::cerr << name << ": " << e.what() << "\n";
    return kExitBad;
  }
}
