// SPDX-License-Identifier: Apache-2.0
// The run identity of a root; the format and its rules are in run_identity.hpp.
#include "ckpt/store/run_identity.hpp"

#include <random>

#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/fs/small_file.hpp"
#include "ckpt/fs/layout.hpp"

namespace ckpt {

std::string random_id() {
  std::random_device rd;
  const std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  static constexpr char hex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 0; i < 16; ++i) out[static_cast<std::size_t>(i)] = hex[(v >> (60 - 4 * i)) & 15];
  return out;
}

bool is_valid_id(std::string_view id) noexcept {
  bool ok = !id.empty() && id.size() <= 64;
  for (char c : id) ok = ok && ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_');
  return ok;
}

std::optional<std::string> read_run_identity(FileSystem& fs, const std::string& root) {
  const std::string path = join_path(root, kRunIdentityName);
  if (!fs.stat(root) || !fs.stat(path)) return std::nullopt;
  const std::string text = detail::read_small_file(fs, path, 4096, Errc::malformed_manifest);
  std::string_view rest = text;
  while (!rest.empty()) {
    const std::size_t eol = std::min(rest.find('\n'), rest.size());
    const std::string_view line = rest.substr(0, eol);
    rest.remove_prefix(std::min(eol + 1, rest.size()));
    if (!line.starts_with("run ")) continue;
    const std::string_view run = line.substr(4);
    if (!is_valid_id(run)) throw Error(Errc::malformed_manifest, path, "run identity", "1..64 of [A-Za-z0-9_-]", std::string(run.substr(0, 80)));
    return std::string(run);
  }
  throw Error(Errc::malformed_manifest, path, "no `run` line", "run <identity>", text.substr(0, 80));
}

void write_run_identity(FileSystem& fs, const RootLock& lock, const std::string& run) {
  if (!is_valid_id(run)) throw Error(Errc::invalid_argument, lock.root(), "run identity", "1..64 of [A-Za-z0-9_-]", run);
  const std::string temp = join_path(lock.root(), temporary_name(kRunIdentityName));
  detail::write_small_file(fs, temp, "run " + run + "\nsince " + utc_now_rfc3339() + "\n");
  try {
    fs.rename(temp, join_path(lock.root(), kRunIdentityName));
  } catch (...) {
    fs.remove_all(temp);
    throw;
  }
  fs.sync_dir(lock.root());
}

std::string establish_run_identity(FileSystem& fs, const RootLock& lock) {
  if (auto run = read_run_identity(fs, lock.root())) return *run;
  std::string run = random_id();
  write_run_identity(fs, lock, run);
  log_event(LogLevel::info, "run_identity_created", lock.root() + ": this root's run identity is " + run + " (" + std::string(kRunIdentityName) + ")");
  return run;
}

}  // namespace ckpt
