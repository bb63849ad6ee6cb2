// Writes the fuzzers' seed corpus: tests/fuzz/corpus/{manifest,shard_header,checkpoint}/.
//   fuzz_make_seeds OUT_DIR
// From a small good checkpoint root (tests/hostile/corpus.hpp, make_good_root(small)) it
// writes the good manifest, shard files and whole checkpoint, then the same for a selection
// of hostile cases (one in kStride of each category but the 100k ones, whose inputs exceed
// the fuzzers' max_len; one in kBundleStride for whole checkpoints, which are larger). Shard headers are written compact (unpadded) as well, and as
// header-only inputs for the JSON mode of fuzz_shard_header.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "ckpt/io/layout.hpp"
#include "hostile/corpus.hpp"

using namespace ckpt;
using namespace ckpt::testing;
namespace fs = std::filesystem;

namespace {
constexpr std::size_t kStride = 4, kBundleStride = 12;

void write(const fs::path& p, std::string_view bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string slug(const std::string& s) {
  std::string out;
  for (char c : s) out += (std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  return out.substr(0, 80);
}

// The compact form of a shard: the JSON without its padding, the data unchanged.
std::string compact(const std::string& file) {
  if (file.size() < 8) return file;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<std::size_t>(i)]);
  if (n > file.size() - 8) return file;
  std::string json = file.substr(8, n);
  while (!json.empty() && json.back() == ' ') json.pop_back();
  return hostile::shard_bytes(json, file.substr(8 + n));
}

// The fuzz_checkpoint input for the latest checkpoint directory of `mem`.
std::string bundle(MemoryFileSystem& mem, const std::string& dir, unsigned char flags, bool compact_shards) {
  std::string out(1, static_cast<char>(flags));
  const std::string mpath = join_path(dir, kManifestName);
  if (const auto m = mem.file_bytes(mpath)) out.append(reinterpret_cast<const char*>(m->data()), m->size());
  for (const auto& e : mem.list_dir(dir)) {
    if (e.name == kManifestName) continue;
    const std::string p = join_path(dir, e.name);
    if (e.type == EntryType::symlink) {
      out += "\n@@file@@ " + e.name + " -> " + *mem.symlink_target(p) + "\n";
    } else if (const auto b = mem.file_bytes(p)) {
      const std::string bytes(reinterpret_cast<const char*>(b->data()), b->size());
      out += "\n@@file@@ " + e.name + "\n" + (compact_shards ? compact(bytes) : bytes);
    }
  }
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const hostile::GoodRoot good = hostile::make_good_root(/*small=*/true);
  MemoryFileSystem pristine = good.fs.clone();
  const std::string shard1 = good.shard_path(1);
  const std::string good_shard = hostile::read_text(pristine, shard1);

  write(out / "manifest/good", hostile::read_text(pristine, good.manifest_path()));
  write(out / "manifest/good_previous", hostile::read_text(pristine, join_path(good.previous_dir, kManifestName)));
  write(out / "shard_header/good", good_shard);
  write(out / "shard_header/good_compact", compact(good_shard));
  write(out / "shard_header/json_two_tensors", std::string(R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[],"data_offsets":[8,9]}})") + '\x09');
  write(out / "shard_header/json_empty_tensor", std::string(R"({"e":{"dtype":"BF16","shape":[0,3],"data_offsets":[0,0]}})") + '\x00');
  write(out / "checkpoint/good", bundle(pristine, good.latest_dir, 0, false));
  write(out / "checkpoint/good_resealed_compact", bundle(pristine, good.latest_dir, 1, true));
  write(out / "checkpoint/good_all_calls", bundle(pristine, good.latest_dir, 0x1e, false));

  // Inputs behind the fixes this corpus led to (see the report of issue 7), always kept.
  const std::set<std::string> always = {"training holding 1e400", "step = 10, the previous directory's",
                                        "manifest is a special file", "latest a special file"};
  std::map<std::string, std::size_t> seen;
  std::size_t written = 0;
  for (const auto& c : hostile::all_cases(good)) {
    const std::size_t index = seen[c.category]++;
    const bool keep = always.count(c.name) > 0;
    if (c.category == "huge" || (index % kStride != 0 && !keep)) continue;
    MemoryFileSystem mem = good.fs.clone();
    try {
      c.damage(mem);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "skipped %s: %s: %s\n", c.category.c_str(), c.name.c_str(), e.what());
      continue;
    }
    const std::string name = slug(c.category + "_" + c.name);
    const auto manifest = mem.file_bytes(good.manifest_path());
    const std::string mtext = manifest ? std::string(reinterpret_cast<const char*>(manifest->data()), manifest->size()) : "";
    if (manifest && mtext != hostile::read_text(pristine, good.manifest_path()) && mtext.size() < 65536)
      write(out / "manifest" / name, mtext);
    if (const auto shard = mem.file_bytes(shard1)) {
      const std::string s(reinterpret_cast<const char*>(shard->data()), shard->size());
      if (s != good_shard && s.size() < 65536) write(out / "shard_header" / name, c.category == "header" ? compact(s) : s);
    }
    if (c.category != "latest" && (index % kBundleStride == 0 || keep)) {
      // Resealed where the case is about structure; the calls vary from seed to seed.
      const unsigned char calls = static_cast<unsigned char>((written % 16) << 1);
      const std::string b = bundle(mem, good.latest_dir, (c.category == "header" || c.category == "index" ? 1 : 0) | calls, false);
      if (b.size() < 131072) write(out / "checkpoint" / name, b);
    }
    ++written;
  }
  // A 2^30 chunk size with valid checksums: verify() used to allocate a whole chunk of scratch.
  {
    MemoryFileSystem mem = good.fs.clone();
    auto m = hostile::manifest_object(mem, good.latest_dir);
    m["chunk_size"] = 1u << 30;
    hostile::write_manifest_object(mem, good.latest_dir, m);
    for (int r = 0; r < hostile::kWorld; ++r) hostile::reseal(mem, good.latest_dir, r);
    write(out / "checkpoint/finding_chunk_size_2_30", bundle(mem, good.latest_dir, 0, false));
    write(out / "manifest/finding_chunk_size_2_30", hostile::read_text(mem, good.manifest_path()));
  }
  std::printf("seeds from %zu hostile cases written under %s\n", written, out.c_str());
  return 0;
}
