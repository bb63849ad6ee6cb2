// ckpt: inspect, check, reshard, export and compare checkpoints on disk.
//
//   ckpt ls ROOT                         list checkpoints with step, size and state
//   ckpt inspect DIR                     manifest summary and tensor table
//   ckpt verify DIR [--full]             check every shard; exit 0 only if all verify
//   ckpt reshard SRC DST --world-size M  the checkpoint at another world size, streamed
//   ckpt consolidate SRC OUT             the full model as Hugging Face safetensors
//   ckpt prune ROOT --keep K             remove all but the newest K checkpoints
//   ckpt diff A B                        per-tensor equal / max abs difference
//
// Every command takes --json and --help; `ckpt --help` documents the exit codes.
#include <unistd.h>

#include <boost/json.hpp>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/io/commit.hpp"
#include "ckpt/io/layout.hpp"
#include "ckpt/io/reader.hpp"
#include "ckpt/io/reshard.hpp"
#include "ckpt/io/shard_stream.hpp"

namespace json = boost::json;
using namespace ckpt;

namespace {

constexpr int kExitOk = 0, kExitBad = 1, kExitUsage = 2, kExitDiffer = 3;

const char* kHelp = R"(ckpt: inspect, check, reshard, export and compare ckpt checkpoints

usage: ckpt <command> [options]        ckpt <command> --help    ckpt help <command>

commands:
  ls ROOT            list the checkpoints under ROOT: step, world size, size, state
  inspect DIR        the manifest of a checkpoint and its tensor table
  verify DIR         check every shard's checksums (a progress bar on a terminal)
  reshard SRC DST    write checkpoint SRC at another world size (--world-size M) as a new
                     checkpoint under the root DST, streaming through a bounded buffer
  consolidate SRC OUT
                     write the full model (fp32 master weights by default) as safetensors
                     in the Hugging Face layout, one file or several plus an index
  prune ROOT         remove all but the newest K checkpoints (--keep K), never `latest`
  diff A B           compare two checkpoints tensor by tensor: equal, or the largest
                     absolute difference; shape and dtype mismatches are reported

DIR, SRC, A and B are a checkpoint directory (step-N) or a root (then the checkpoint its
`latest` names). Every command takes --json: one JSON object on stdout, for scripts.

exit codes:
  0  success (verify: every shard verified; diff: every tensor equal)
  1  failure: a bad or unreadable checkpoint, or an I/O error; the typed error is printed
     (code, file, expected and actual value), and with --json it is the output:
     {"ok": false, "error": {"code", "file", "detail", "expected", "actual", "message"}}
  2  usage error (unknown command or option, missing argument)
  3  diff: the checkpoints differ
)";

// Per-command help: usage, what it does, options, an example.
const std::map<std::string, const char*> kCommandHelp = {
    {"ls", R"(usage: ckpt ls ROOT [--verify none|fast|full] [--json]

List every checkpoint directory under ROOT (and temporaries of saves in progress): name,
step, world size, size and state (complete, in progress, corrupt), marking the one `latest`
names. Without --verify only the manifests and shard sizes are checked; with it every shard
is read and checked too. Exit 1 if any checkpoint is corrupt.

example:
  ckpt ls /ckpts/run1 --verify fast
)"},
    {"inspect", R"(usage: ckpt inspect DIR [--json]

Show the manifest of checkpoint DIR (a step-N directory, or a root: its latest): step,
world size, sizes, training metadata, the shard table and the tensor index. --json prints
the whole manifest.

example:
  ckpt inspect /ckpts/run1/step-0000000010
)"},
    {"verify", R"(usage: ckpt verify DIR [--full] [--json]

Read every shard of DIR (or a root's latest) and check it: the XXH3 of every chunk
(default), or also the SHA-256 and XXH3 of every whole file (--full), and every shard
header against the manifest. A progress bar is drawn on a terminal, never into a pipe.

example:
  ckpt verify --full /ckpts/run1/step-0000000010
)"},
    {"reshard", R"(usage: ckpt reshard SRC DST --world-size M [--buffer-mb N] [--verify none|fast|full] [--json]

Write checkpoint SRC (written at any world size N) as a new checkpoint at world size M,
with the same step, under the root DST (created if absent; its `latest` then names the new
checkpoint). Each new rank's shard holds its slice of the flat optimizer state (the
tensors training.flat_tensors names, padded with zeros to a multiple of M), rank 0 also the
replicated tensors; per-rank metadata is remapped (docs/resharding.md). The new checkpoint
has its own checksums and goes through the durable commit; a corrupt source fails with the
typed error and leaves nothing behind.

  --world-size M   the new world size (required)
  --buffer-mb N    memory for data in flight, MiB (default 256): peak memory stays near
                   this plus one or two checksum chunks (4 MiB each by default), whatever
                   the checkpoint's size
  --verify MODE    of the source: fast (default) checks the XXH3 of every chunk read,
                   full also every file's SHA-256 first, none only sizes and headers

example:
  ckpt reshard /ckpts/run1 /ckpts/run1-8 --world-size 8
)"},
    {"consolidate", R"(usage: ckpt consolidate SRC OUT [--dtype f32|f16|bf16] [--max-file-size SIZE] [--tensor NAME]
                        [--buffer-mb N] [--verify none|fast|full] [--json]

Write the full model of checkpoint SRC into the new directory OUT in the Hugging Face
layout: every tensor of the model (training.param_layout) reassembled from the shards of
the flat tensor NAME (default optim.master, the fp32 master weights), cast to --dtype,
into OUT/model.safetensors, or, when the tensors exceed SIZE bytes, into
OUT/model-0000k-of-0000n.safetensors plus OUT/model.safetensors.index.json. Streams through
a bounded buffer; OUT appears only when complete.

  --dtype T            f32 (default: the tensor's own), f16 or bf16
  --max-file-size SIZE tensor bytes per file, e.g. 5G, 500M, 64K (default: one file)
  --tensor NAME        the flat tensor to export (default optim.master)
  --buffer-mb N        memory for data in flight, MiB (default 256)
  --verify MODE        of the source, as for reshard (default fast)

example:
  ckpt consolidate /ckpts/run1 /models/run1 --dtype bf16 --max-file-size 5G
)"},
    {"prune", R"(usage: ckpt prune ROOT --keep K [--dry-run] [--json]

Keep the newest K checkpoints of ROOT that open (manifest and shard sizes good) and the one
`latest` names; remove every checkpoint older than the K-th kept one. Each removal is
durable and crash-safe (renamed to a temporary, the root fsynced, then deleted). Corrupt
checkpoints newer than the K-th are left for inspection; temporaries of a save in progress
are never touched.

  --keep K     checkpoints to keep, K >= 1 (required)
  --dry-run    say what would be removed, remove nothing

example:
  ckpt prune /ckpts/run1 --keep 3
)"},
    {"diff", R"(usage: ckpt diff A B [--json]

Compare two checkpoints tensor by tensor. The flat optimizer tensors (training.flat_tensors)
are compared over the whole flat space, so checkpoints of different world sizes compare
(a checkpoint and its reshard are equal); other tensors by name and rank. Each tensor is
equal, differs (float types: the largest absolute difference and the number of differing
elements; a NaN against a number counts as an infinite difference), has a shape or dtype
mismatch, or is only in A or only in B. Exit 0 if everything is equal, 3 if not.

example:
  ckpt diff /ckpts/run1/step-0000000010 /ckpts/run1/step-0000000020
)"},
};

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> values;  // --name value
  bool json = false, help = false;
  bool flag(const std::string& f) const { return values.count(f) != 0; }
  std::optional<std::string> get(const std::string& f) const {
    const auto it = values.find(f);
    return it == values.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
};

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "ckpt: " << msg << "\nrun 'ckpt --help' for usage\n";
  std::exit(kExitUsage);
}

// Options of each command: name -> takes a value.
const std::map<std::string, std::map<std::string, bool>> kOptions = {
    {"ls", {{"--verify", true}}},
    {"inspect", {}},
    {"verify", {{"--full", false}}},
    {"reshard", {{"--world-size", true}, {"--buffer-mb", true}, {"--verify", true}}},
    {"consolidate", {{"--dtype", true}, {"--max-file-size", true}, {"--tensor", true}, {"--buffer-mb", true}, {"--verify", true}}},
    {"prune", {{"--keep", true}, {"--dry-run", false}}},
    {"diff", {}},
};

Args parse(const std::string& cmd, int argc, char** argv, int from) {
  const auto& known = kOptions.at(cmd);
  Args a;
  for (int i = from; i < argc; ++i) {
    std::string s = argv[i];
    if (s == "--json") a.json = true;
    else if (s == "--help" || s == "-h") a.help = true;
    else if (s.starts_with("--")) {
      std::optional<std::string> inline_value;
      if (const auto eq = s.find('='); eq != std::string::npos) inline_value = s.substr(eq + 1), s = s.substr(0, eq);
      const auto it = known.find(s);
      if (it == known.end()) usage("unknown option " + s + " for '" + cmd + "'");
      if (!it->second) {
        if (inline_value) usage(s + " takes no value");
        a.values[s] = "";
      } else if (inline_value) {
        a.values[s] = *inline_value;
      } else {
        if (++i >= argc) usage(s + " needs a value");
        a.values[s] = argv[i];
      }
    } else a.positional.push_back(s);
  }
  return a;
}

std::uint64_t parse_count(const std::string& opt, const std::string& v, std::uint64_t min, std::uint64_t max) {
  std::size_t pos = 0;
  unsigned long long n = 0;
  try {
    if (v.empty() || v[0] == '-') throw std::invalid_argument(v);
    n = std::stoull(v, &pos);
  } catch (...) {
    usage(opt + " needs an integer, got '" + v + "'");
  }
  if (pos != v.size()) usage(opt + " needs an integer, got '" + v + "'");
  if (n < min || n > max) usage(opt + " must be " + std::to_string(min) + ".." + std::to_string(max) + ", got " + v);
  return n;
}

// "123", "64K", "500M", "5G" (binary multiples; KB/KiB/MB/MiB/GB/GiB spellings too).
std::uint64_t parse_size(const std::string& opt, const std::string& v) {
  std::size_t digits = 0;
  while (digits < v.size() && std::isdigit(static_cast<unsigned char>(v[digits]))) ++digits;
  if (digits == 0) usage(opt + " needs a size such as 5G, 500M or 1048576, got '" + v + "'");
  std::string unit = v.substr(digits);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  std::uint64_t mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1ull << 10;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1ull << 20;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1ull << 30;
  else if (unit == "T" || unit == "TB" || unit == "TIB") mult = 1ull << 40;
  else usage(opt + ": unknown unit '" + v.substr(digits) + "'");
  const std::uint64_t n = parse_count(opt, v.substr(0, digits), 1, std::numeric_limits<std::uint64_t>::max() >> 40);
  return n * mult;
}

Verify verify_mode(const Args& a, Verify dflt) {
  const auto v = a.get("--verify");
  if (!v) return dflt;
  const auto mode = parse_verify(*v);
  if (!mode) usage("--verify must be none, fast or full");
  return *mode;
}

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

json::object error_json(const Error& e) {
  return {{"code", errc_name(e.code())}, {"file", e.file()}, {"detail", e.detail()},
          {"expected", e.expected()},   {"actual", e.actual()}, {"message", e.what()}};
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

// DIR may be a checkpoint directory or a root (then its latest).
CheckpointReader open_dir_or_root(const std::string& path) {
  FileSystem& fs = posix_file_system();
  if (fs.stat(join_path(path, kManifestName))) return CheckpointReader::open(fs, path);
  if (fs.stat(join_path(path, kLatestName))) return open_latest(fs, path).reader;
  return CheckpointReader::open(fs, path);  // reports the missing manifest
}

void print_json(const json::value& v) { std::cout << json::serialize(v) << "\n"; }

// ---- ls, inspect, verify ----------------------------------------------------------------

int cmd_ls(const Args& a) {
  if (a.positional.size() != 1) usage("ls takes one ROOT");
  const Verify mode = verify_mode(a, Verify::none);
  const auto list = list_checkpoints(posix_file_system(), a.positional[0], mode);
  bool any_corrupt = false;
  json::array out;
  if (!a.json) std::printf("%-34s %10s %6s %11s  %s\n", "NAME", "STEP", "WORLD", "SIZE", "STATE");
  for (const auto& c : list) {
    any_corrupt |= c.state == CheckpointState::corrupt;
    if (a.json) {
      out.push_back(json::object{{"name", c.name},
                                 {"step", c.step ? json::value(*c.step) : json::value(nullptr)},
                                 {"world_size", c.world_size},
                                 {"bytes", c.bytes},
                                 {"state", checkpoint_state_name(c.state)},
                                 {"latest", c.is_latest},
                                 {"error", c.error}});
      continue;
    }
    std::printf("%-34s %10s %6s %11s  %s%s\n", c.name.c_str(), c.step ? std::to_string(*c.step).c_str() : "-",
                c.world_size ? std::to_string(c.world_size).c_str() : "-", human_bytes(c.bytes).c_str(),
                std::string(checkpoint_state_name(c.state)).c_str(), c.is_latest ? " (latest)" : "");
    if (!c.error.empty()) std::printf("    %s\n", c.error.c_str());
  }
  if (a.json) print_json(json::object{{"ok", !any_corrupt}, {"root", a.positional[0]}, {"checkpoints", out}});
  return any_corrupt ? kExitBad : kExitOk;
}

int cmd_inspect(const Args& a) {
  if (a.positional.size() != 1) usage("inspect takes one DIR");
  const auto reader = open_dir_or_root(a.positional[0]);
  const Manifest& m = reader.manifest();
  if (a.json) {
    print_json(json::object{{"ok", true}, {"dir", reader.dir()}, {"manifest", json::parse(encode_manifest(m))}});
    return kExitOk;
  }
  std::uint64_t total = 0;
  for (const auto& s : m.shards) total += s.size;
  std::printf("checkpoint  %s\nstep        %llu\nworld size  %d\ncreated     %s\nwall clock  %.3f s\n", reader.dir().c_str(),
              static_cast<unsigned long long>(m.step), m.world_size, m.created_at.c_str(), m.wall_clock_seconds);
  std::printf("size        %s in %zu shards, chunk %s\nparameters  %llu (flat)\n", human_bytes(total).c_str(), m.shards.size(),
              human_bytes(m.chunk_size).c_str(), static_cast<unsigned long long>(m.param_numel));
  if (!m.training.empty()) {
    // param_layout runs to one entry per model tensor: summarised, the rest printed whole.
    json::object tr = m.training;
    if (const auto* pl = tr.if_contains("param_layout"); pl && pl->is_array())
      tr["param_layout"] = std::to_string(pl->as_array().size()) + " tensors (ckpt inspect --json shows them)";
    std::printf("training    %s\n", json::serialize(tr).c_str());
  }
  std::printf("\n%-5s %-34s %11s %12s %12s  %s\n", "RANK", "SHARD", "SIZE", "PARAM OFF", "PARAM NUMEL", "SHA-256");
  for (const auto& s : m.shards)
    std::printf("%-5d %-34s %11s %12llu %12llu  %.16s...\n", s.rank, s.path.c_str(), human_bytes(s.size).c_str(),
                static_cast<unsigned long long>(s.param_shard_offset), static_cast<unsigned long long>(s.param_shard_numel),
                s.sha256.c_str());
  std::printf("\n%-5s %-32s %-5s %-18s %11s %s\n", "RANK", "TENSOR", "DTYPE", "SHAPE", "BYTES", "OFFSET");
  for (const auto& t : m.tensors)
    std::printf("%-5d %-32s %-5s %-18s %11llu %llu\n", t.rank, t.name.c_str(), std::string(dtype_name(t.dtype)).c_str(),
                shape_str(t.shape).c_str(), static_cast<unsigned long long>(t.end - t.begin),
                static_cast<unsigned long long>(t.begin));
  return kExitOk;
}

int cmd_verify(const Args& a) {
  if (a.positional.size() != 1) usage("verify takes one DIR");
  const bool full = a.flag("--full");
  const Verify mode = full ? Verify::full : Verify::fast;
  const auto reader = open_dir_or_root(a.positional[0]);
  {
    ProgressBar bar("verifying", !a.json);
    reader.verify(mode, bar.fn());
  }
  std::uint64_t total = 0;
  for (const auto& s : reader.manifest().shards) total += s.size;
  const char* how = full ? "full (xxh3 per chunk + sha256)" : "fast (xxh3 per chunk)";
  if (a.json)
    print_json(json::object{{"ok", true}, {"dir", reader.dir()}, {"mode", full ? "full" : "fast"},
                            {"shards", reader.manifest().shards.size()}, {"bytes", total}});
  else
    std::printf("OK %s: %zu shards, %s verified, %s\n", reader.dir().c_str(), reader.manifest().shards.size(),
                human_bytes(total).c_str(), how);
  return kExitOk;
}

// ---- reshard, consolidate -------------------------------------------------------------

int cmd_reshard(const Args& a) {
  if (a.positional.size() != 2) usage("reshard takes SRC and DST");
  const auto world = a.get("--world-size");
  if (!world) usage("reshard needs --world-size M");
  ReshardOptions opt;
  opt.world_size = static_cast<int>(parse_count("--world-size", *world, 1, 1u << 20));
  if (const auto b = a.get("--buffer-mb")) opt.buffer_bytes = parse_count("--buffer-mb", *b, 1, 1u << 20) << 20;
  opt.verify = verify_mode(a, Verify::fast);
  const auto source = open_dir_or_root(a.positional[0]);
  const auto t0 = std::chrono::steady_clock::now();
  ReshardResult r;
  {
    ProgressBar bar("resharding", !a.json);
    opt.progress = bar.fn();
    r = reshard_checkpoint(posix_file_system(), source, a.positional[1], opt);
  }
  const double secs = seconds_since(t0);
  const Manifest& m = r.manifest;
  if (a.json) {
    json::array shards;
    for (const auto& s : m.shards)
      shards.push_back(json::object{{"rank", s.rank}, {"path", s.path}, {"size", s.size}, {"sha256", s.sha256},
                                    {"param_shard_offset", s.param_shard_offset}, {"param_shard_numel", s.param_shard_numel}});
    print_json(json::object{{"ok", true}, {"source", source.dir()}, {"dir", r.dir}, {"step", m.step},
                            {"from_world_size", source.manifest().world_size}, {"world_size", m.world_size},
                            {"param_numel", m.param_numel}, {"bytes_read", r.bytes_read}, {"bytes_written", r.bytes_written},
                            {"buffer_bytes", opt.buffer_bytes}, {"seconds", secs}, {"shards", shards}});
    return kExitOk;
  }
  std::printf("resharded step %llu from world size %d to %d: %s\n", static_cast<unsigned long long>(m.step),
              source.manifest().world_size, m.world_size, r.dir.c_str());
  std::printf("read %s, wrote %s in %zu shards through a %s buffer, %.2f s\n", human_bytes(r.bytes_read).c_str(),
              human_bytes(r.bytes_written).c_str(), m.shards.size(), human_bytes(opt.buffer_bytes).c_str(), secs);
  std::printf("%-5s %-34s %11s %12s %12s\n", "RANK", "SHARD", "SIZE", "PARAM OFF", "PARAM NUMEL");
  for (const auto& s : m.shards)
    std::printf("%-5d %-34s %11s %12llu %12llu\n", s.rank, s.path.c_str(), human_bytes(s.size).c_str(),
                static_cast<unsigned long long>(s.param_shard_offset), static_cast<unsigned long long>(s.param_shard_numel));
  return kExitOk;
}

int cmd_consolidate(const Args& a) {
  if (a.positional.size() != 2) usage("consolidate takes SRC and OUT");
  ConsolidateOptions opt;
  if (const auto d = a.get("--dtype")) {
    if (*d == "f32") opt.dtype = DType::F32;
    else if (*d == "f16") opt.dtype = DType::F16;
    else if (*d == "bf16") opt.dtype = DType::BF16;
    else usage("--dtype must be f32, f16 or bf16");
  }
  if (const auto s = a.get("--max-file-size")) opt.max_file_size = parse_size("--max-file-size", *s);
  if (const auto t = a.get("--tensor")) opt.tensor = *t;
  if (const auto b = a.get("--buffer-mb")) opt.buffer_bytes = parse_count("--buffer-mb", *b, 1, 1u << 20) << 20;
  opt.verify = verify_mode(a, Verify::fast);
  const auto source = open_dir_or_root(a.positional[0]);
  const auto t0 = std::chrono::steady_clock::now();
  ConsolidateResult r;
  {
    ProgressBar bar("consolidating", !a.json);
    opt.progress = bar.fn();
    r = consolidate_checkpoint(posix_file_system(), source, a.positional[1], opt);
  }
  const double secs = seconds_since(t0);
  std::size_t tensors = 0;
  for (const auto& f : r.files) tensors += f.tensors.size();
  if (a.json) {
    json::array files;
    for (const auto& f : r.files) {
      json::array names;
      for (const auto& t : f.tensors) names.emplace_back(t);
      files.push_back(json::object{{"name", f.name}, {"size", f.size}, {"tensors", names}});
    }
    print_json(json::object{{"ok", true}, {"source", source.dir()}, {"dir", r.dir}, {"dtype", dtype_name(r.dtype)},
                            {"tensor", opt.tensor}, {"tensors", tensors}, {"total_size", r.total_size},
                            {"index", r.index ? json::value(*r.index) : json::value(nullptr)}, {"files", files},
                            {"bytes_read", r.bytes_read}, {"seconds", secs}});
    return kExitOk;
  }
  std::printf("consolidated %zu tensors of %s (%s, %s of %s) into %s in %.2f s\n", tensors, source.dir().c_str(),
              opt.tensor.c_str(), human_bytes(r.total_size).c_str(), std::string(dtype_name(r.dtype)).c_str(), r.dir.c_str(), secs);
  for (const auto& f : r.files)
    std::printf("  %-36s %11s  %zu tensors\n", f.name.c_str(), human_bytes(f.size).c_str(), f.tensors.size());
  if (r.index) std::printf("  %-36s  weight map of %zu tensors\n", r.index->c_str(), tensors);
  return kExitOk;
}

// ---- prune ----------------------------------------------------------------------------

int cmd_prune(const Args& a) {
  if (a.positional.size() != 1) usage("prune takes one ROOT");
  const auto keep_s = a.get("--keep");
  if (!keep_s) usage("prune needs --keep K");
  const std::uint64_t keep = parse_count("--keep", *keep_s, 1, 1u << 30);
  const bool dry = a.flag("--dry-run");
  const std::string& root = a.positional[0];
  FileSystem& fs = posix_file_system();
  if (!fs.stat(root)) throw Error(Errc::not_found, root, "no such checkpoint root");
  const auto lock = dry ? std::optional<RootLock>() : std::optional<RootLock>(std::in_place, fs, root);  // busy: a writer is live
  auto list = list_checkpoints(fs, root, Verify::none);
  std::erase_if(list, [](const CheckpointInfo& c) { return !c.step; });  // temporaries: maybe a live save
  std::reverse(list.begin(), list.end());                                // newest first
  std::uint64_t good = 0;
  json::array kept, removed;
  std::vector<std::string> kept_lines, removed_lines;
  for (const auto& c : list) {
    const bool past = good >= keep;
    const bool ok = c.state == CheckpointState::complete;
    const std::string note = c.is_latest ? " (latest)" : (!ok ? " (corrupt)" : "");
    if (!past || c.is_latest) {
      good += ok;
      kept.push_back(json::object{{"name", c.name}, {"latest", c.is_latest}, {"state", checkpoint_state_name(c.state)}});
      kept_lines.push_back(c.name + note);
      continue;
    }
    if (!dry) remove_checkpoint(fs, root, c.name);
    removed.push_back(json::object{{"name", c.name}, {"bytes", c.bytes}, {"state", checkpoint_state_name(c.state)}});
    removed_lines.push_back(c.name + note + ", " + human_bytes(c.bytes));
  }
  if (a.json) {
    print_json(json::object{{"ok", true}, {"root", root}, {"keep", keep}, {"dry_run", dry}, {"kept", kept}, {"removed", removed}});
    return kExitOk;
  }
  for (const auto& l : kept_lines) std::printf("kept     %s\n", l.c_str());
  for (const auto& l : removed_lines) std::printf("%s %s\n", dry ? "would remove" : "removed ", l.c_str());
  if (removed_lines.empty()) std::printf("nothing to remove: %zu checkpoints, keeping %llu\n", list.size(), static_cast<unsigned long long>(keep));
  return kExitOk;
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

int cmd_diff(const Args& a) {
  if (a.positional.size() != 2) usage("diff takes A and B");
  const auto ra = open_dir_or_root(a.positional[0]), rb = open_dir_or_root(a.positional[1]);
  const Manifest &ma = ra.manifest(), &mb = rb.manifest();
  for (const auto* r : {&ra, &rb}) verify_headers(*r, Verify::fast);
  // Flat tensors compare in the flat space when both checkpoints describe it the same way.
  std::optional<FlatReader> fa, fb;
  std::vector<std::string> flat;
  std::string flat_note;
  try {
    const FlatLayout la = flat_layout(ma), lb = flat_layout(mb);
    if (la.tensors == lb.tensors && la.num_params == lb.num_params) {
      fa.emplace(ra, la);
      fb.emplace(rb, lb);
      flat = la.tensors;
    } else {
      flat_note = "flat layouts differ: flat tensors compared rank by rank";
    }
  } catch (const Error& e) {
    if (e.code() != Errc::invalid_argument) throw;  // no flat layout recorded: compare by rank
  }
  auto is_flat = [&](const std::string& n) { return std::find(flat.begin(), flat.end(), n) != flat.end(); };
  std::vector<TensorDiff> diffs;
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
  auto reader_for = [](std::optional<ShardRangeReader>& cur, const CheckpointReader& r, int rank) -> ShardRangeReader& {
    if (!cur || cur->rank() != rank) cur.emplace(r, rank, Verify::fast);
    return *cur;
  };
  for (const auto& t : ma.tensors) {
    if (is_flat(t.name)) continue;
    seen[{t.name, t.rank}] = true;
    TensorDiff d{t.name, t.rank, "", "", 0, 0};
    const TensorRecord* u = mb.find_tensor(t.name, t.rank);
    if (!u) {
      d.status = "only in A";
    } else if (t.dtype != u->dtype) {
      d.status = "dtype mismatch";
      d.detail = std::string(dtype_name(t.dtype)) + " vs " + std::string(dtype_name(u->dtype));
    } else if (t.shape != u->shape) {
      d.status = "shape mismatch";
      d.detail = shape_str(t.shape) + " vs " + shape_str(u->shape);
    } else {
      const std::uint64_t es = dtype_size(t.dtype);
      compare_stream(
          t.dtype, (t.end - t.begin) / es,
          [&](std::uint64_t at, std::span<std::byte> out) { reader_for(sa, ra, t.rank).read(t.begin + at * es, out); },
          [&](std::uint64_t at, std::span<std::byte> out) { reader_for(sb, rb, u->rank).read(u->begin + at * es, out); }, d);
    }
    diffs.push_back(std::move(d));
  }
  for (const auto& t : mb.tensors)
    if (!is_flat(t.name) && !seen.count({t.name, t.rank})) diffs.push_back({t.name, t.rank, "only in B", "", 0, 0});

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
    print_json(json::object{{"ok", true}, {"a", ra.dir()}, {"b", rb.dir()}, {"equal", equal},
                            {"step", json::array{ma.step, mb.step}}, {"world_size", json::array{ma.world_size, mb.world_size}},
                            {"tensors", out}});
    return equal ? kExitOk : kExitDiffer;
  }
  std::printf("A %s (step %llu, world size %d)\nB %s (step %llu, world size %d)\n", ra.dir().c_str(),
              static_cast<unsigned long long>(ma.step), ma.world_size, rb.dir().c_str(), static_cast<unsigned long long>(mb.step),
              mb.world_size);
  if (!flat_note.empty()) std::printf("%s\n", flat_note.c_str());
  std::printf("\n%-32s %-5s %-15s %s\n", "TENSOR", "RANK", "STATUS", "MAX ABS DIFF (ELEMENTS DIFFERING)");
  std::size_t n_equal = 0;
  for (const auto& d : diffs) {
    n_equal += d.status == "equal";
    char extra[96] = "";
    if (d.status == "differs") std::snprintf(extra, sizeof extra, "%.6g (%llu)", d.max_abs, static_cast<unsigned long long>(d.differing));
    std::printf("%-32s %-5s %-15s %s%s\n", d.name.c_str(), d.rank ? std::to_string(*d.rank).c_str() : "flat", d.status.c_str(), extra,
                d.detail.c_str());
  }
  std::printf("\n%zu of %zu tensors equal: %s\n", n_equal, diffs.size(), equal ? "the checkpoints are equal" : "the checkpoints differ");
  return equal ? kExitOk : kExitDiffer;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage("no command");
  std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h") {
    std::cout << kHelp;
    return kExitOk;
  }
  if (cmd == "help") {
    if (argc >= 3) {
      const auto it = kCommandHelp.find(argv[2]);
      if (it == kCommandHelp.end()) usage("no command '" + std::string(argv[2]) + "'");
      std::cout << it->second;
    } else {
      std::cout << kHelp;
    }
    return kExitOk;
  }
  if (!kOptions.count(cmd)) usage("unknown command '" + cmd + "'");
  const Args a = parse(cmd, argc, argv, 2);
  if (a.help) {
    std::cout << kCommandHelp.at(cmd);
    return kExitOk;
  }
  try {
    if (cmd == "ls") return cmd_ls(a);
    if (cmd == "inspect") return cmd_inspect(a);
    if (cmd == "verify") return cmd_verify(a);
    if (cmd == "reshard") return cmd_reshard(a);
    if (cmd == "consolidate") return cmd_consolidate(a);
    if (cmd == "prune") return cmd_prune(a);
    if (cmd == "diff") return cmd_diff(a);
  } catch (const Error& e) {
    if (a.json) print_json(json::object{{"ok", false}, {"error", error_json(e)}});
    std::cerr << "ckpt " << cmd << ": " << e.what() << "\n";
    return kExitBad;
  } catch (const std::exception& e) {
    if (a.json) print_json(json::object{{"ok", false}, {"error", {{"code", "error"}, {"message", e.what()}}}});
    std::cerr << "ckpt " << cmd << ": " << e.what() << "\n";
    return kExitBad;
  }
  usage("unknown command '" + cmd + "'");
}
