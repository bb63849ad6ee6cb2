// ckpt: inspect and check checkpoints on disk.
//
//   ckpt ls ROOT [--verify MODE] [--json]   list checkpoints with step, size and state
//   ckpt inspect DIR [--json]               manifest summary and tensor table
//   ckpt verify DIR [--full] [--json]       check every shard; exit 0 only if all verify
#include <unistd.h>

#include <boost/json.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/io/layout.hpp"
#include "ckpt/io/reader.hpp"

namespace json = boost::json;
using namespace ckpt;

namespace {

constexpr int kExitOk = 0, kExitBad = 1, kExitUsage = 2;

const char* kHelp = R"(ckpt: inspect and check ckpt checkpoints

usage: ckpt <command> [options]

commands:
  ls ROOT [--verify none|fast|full] [--json]
        List the checkpoints under ROOT: step, world size, size, state (complete,
        in progress, corrupt) and which one `latest` names. Without --verify only the
        manifests and shard sizes are checked.
  inspect DIR [--json]
        Show the manifest of checkpoint DIR (a step-N directory, or a root: its latest)
        and its tensor table.
  verify DIR [--full] [--json]
        Read every shard of DIR (or a root's latest) and check it: XXH3 of every chunk
        (default), or also SHA-256 of every file (--full). A progress bar is drawn on a
        terminal.
  help, --help
        This text (also after any command: ckpt verify --help).

exit codes:
  0  success (verify: every shard verified)
  1  the checkpoint is bad or could not be read (the typed error is printed)
  2  usage error
)";

struct Args {
  std::vector<std::string> positional;
  bool json = false, full = false, help = false;
  std::string verify = "none";
};

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "ckpt: " << msg << "\nrun 'ckpt --help' for usage\n";
  std::exit(kExitUsage);
}

Args parse(int argc, char** argv, int from) {
  Args a;
  for (int i = from; i < argc; ++i) {
    const std::string s = argv[i];
    if (s == "--json") a.json = true;
    else if (s == "--full") a.full = true;
    else if (s == "--help" || s == "-h") a.help = true;
    else if (s == "--verify") {
      if (++i >= argc) usage("--verify needs a mode");
      a.verify = argv[i];
    } else if (s.starts_with("--")) usage("unknown option " + s);
    else a.positional.push_back(s);
  }
  return a;
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

// DIR may be a checkpoint directory or a root (then its latest).
CheckpointReader open_dir_or_root(const std::string& path) {
  FileSystem& fs = posix_file_system();
  if (fs.stat(join_path(path, kManifestName))) return CheckpointReader::open(fs, path);
  if (fs.stat(join_path(path, kLatestName))) return open_latest(fs, path).reader;
  return CheckpointReader::open(fs, path);  // reports the missing manifest
}

int cmd_ls(const Args& a) {
  if (a.positional.size() != 1) usage("ls takes one ROOT");
  const auto mode = parse_verify(a.verify);
  if (!mode) usage("--verify must be none, fast or full");
  const auto list = list_checkpoints(posix_file_system(), a.positional[0], *mode);
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
  if (a.json) std::cout << json::serialize(json::object{{"root", a.positional[0]}, {"checkpoints", out}}) << "\n";
  return any_corrupt ? kExitBad : kExitOk;
}

int cmd_inspect(const Args& a) {
  if (a.positional.size() != 1) usage("inspect takes one DIR");
  const auto reader = open_dir_or_root(a.positional[0]);
  const Manifest& m = reader.manifest();
  if (a.json) {
    std::cout << json::serialize(json::object{{"dir", reader.dir()}, {"manifest", json::parse(encode_manifest(m))}}) << "\n";
    return kExitOk;
  }
  std::uint64_t total = 0;
  for (const auto& s : m.shards) total += s.size;
  std::printf("checkpoint  %s\nstep        %llu\nworld size  %d\ncreated     %s\nwall clock  %.3f s\n", reader.dir().c_str(),
              static_cast<unsigned long long>(m.step), m.world_size, m.created_at.c_str(), m.wall_clock_seconds);
  std::printf("size        %s in %zu shards, chunk %s\nparameters  %llu (flat)\n", human_bytes(total).c_str(), m.shards.size(),
              human_bytes(m.chunk_size).c_str(), static_cast<unsigned long long>(m.param_numel));
  if (!m.training.empty()) std::printf("training    %s\n", json::serialize(m.training).c_str());
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
  const Verify mode = a.full ? Verify::full : Verify::fast;
  const auto reader = open_dir_or_root(a.positional[0]);
  const bool bar = !a.json && ::isatty(STDERR_FILENO);
  int last = -1;
  ProgressFn progress;
  if (bar)
    progress = [&](std::uint64_t done, std::uint64_t total) {
      const int pct = total ? static_cast<int>(done * 100 / total) : 100;
      if (pct == last) return;
      last = pct;
      const int filled = pct * 40 / 100;
      std::fprintf(stderr, "\rverifying [%s%s] %3d%%", std::string(static_cast<std::size_t>(filled), '#').c_str(),
                   std::string(static_cast<std::size_t>(40 - filled), '.').c_str(), pct);
    };
  try {
    reader.verify(mode, progress);
  } catch (...) {
    if (bar) std::fprintf(stderr, "\n");
    throw;
  }
  if (bar) std::fprintf(stderr, "\n");
  std::uint64_t total = 0;
  for (const auto& s : reader.manifest().shards) total += s.size;
  const char* how = a.full ? "full (xxh3 per chunk + sha256)" : "fast (xxh3 per chunk)";
  if (a.json)
    std::cout << json::serialize(json::object{{"dir", reader.dir()}, {"ok", true}, {"mode", a.full ? "full" : "fast"},
                                              {"shards", reader.manifest().shards.size()}, {"bytes", total}})
              << "\n";
  else
    std::printf("OK %s: %zu shards, %s verified, %s\n", reader.dir().c_str(), reader.manifest().shards.size(),
                human_bytes(total).c_str(), how);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage("no command");
  std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::cout << kHelp;
    return kExitOk;
  }
  const Args a = parse(argc, argv, 2);
  if (a.help) {
    std::cout << kHelp;
    return kExitOk;
  }
  try {
    if (cmd == "ls") return cmd_ls(a);
    if (cmd == "inspect") return cmd_inspect(a);
    if (cmd == "verify") return cmd_verify(a);
  } catch (const Error& e) {
    if (a.json) std::cout << json::serialize(json::object{{"ok", false}, {"error", error_json(e)}}) << "\n";
    std::cerr << "ckpt " << cmd << ": " << e.what() << "\n";
    return kExitBad;
  } catch (const std::exception& e) {
    std::cerr << "ckpt " << cmd << ": " << e.what() << "\n";
    return kExitBad;
  }
  usage("unknown command '" + cmd + "'");
}
