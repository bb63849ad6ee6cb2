// SPDX-License-Identifier: Apache-2.0
// A whole checkpoint built from the fuzz input in a MemoryFileSystem, then opened, verified
// and loaded the way a user would. Input layout (what tests/fuzz/tools/make_seeds.cpp writes):
//
//   byte 0            flags: bit 0 reseal (rewrite every shard's size and checksums in the
//                     manifest to match its file, so the fuzzer gets past the checksums to
//                     the header and index checks); the others choose the calls, so that
//                     one run stays short: bit 1 verify(none), bit 2 verify(full) (else
//                     fast), bit 3 load_shard(full) too, bit 4 open_latest with fallback and
//                     list_checkpoints. open, load_shard(fast) and read_tensor always run.
//   bytes 1..         the text of manifest.json, up to the first separator
//   "\n@@file@@ NAME\n" then the bytes of file NAME in the checkpoint directory, repeated;
//                     "NAME -> TARGET" makes NAME a symlink instead
//
// The directory is /fz/root/step-0000000020 and /fz/root/latest names it. Every call may
// refuse with a ckpt::Error naming a file; nothing else may escape, and what loads must be
// self-consistent: a tensor read alone equals the same tensor of the loaded shard.
#include <boost/json.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/store/store.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "fuzz_common.hpp"
#include "fuzz/support/bundle.hpp"
#include "fuzz/support/reseal.hpp"

using namespace ckpt;
using namespace ckpt::testing;
using fuzz::require;

namespace {
const std::string kRoot = "/fz/root";
const std::string kDir = kRoot + "/step-0000000020";

void reseal(MemoryFileSystem& fs, std::string& manifest) {
  boost::system::error_code ec;
  boost::json::parse_options opt;
  opt.max_depth = 32;
  boost::json::value v = boost::json::parse(manifest, ec, {}, opt);
  if (ec || !v.is_object()) return;
  auto& o = v.as_object();
  const auto chunk = fuzz::chunk_size_of(o);
  if (!chunk) return;
  auto* shards = o.if_contains("shards");
  if (!shards || !shards->is_array()) return;
  for (auto& s : shards->as_array()) {
    if (!s.is_object() || !s.as_object().contains("path") || !s.as_object()["path"].is_string()) continue;
    auto& so = s.as_object();
    const std::string name(so["path"].as_string());
    if (name.empty() || name.find('/') != std::string::npos) continue;
    if (const auto bytes = fs.file_bytes(join_path(kDir, name))) fuzz::reseal_entry(so, *bytes, *chunk);
  }
  manifest = boost::json::serialize(v);
}

MemoryFileSystem build(std::string_view in, bool reseal_manifest) {
  MemoryFileSystem fs;
  fs.create_dirs(kDir);
  fs.put_file(join_path(kRoot, "latest"), std::string_view("step-0000000020\n"));
  std::string manifest(fuzz::split_bundle(in, [&](std::string_view name, std::string_view body) {
    if (name.empty() || name.size() > 255) return;
    try {
      if (const auto arrow = name.find(" -> "); arrow != std::string_view::npos)
        fs.put_symlink(join_path(kDir, name.substr(0, arrow)), std::string(name.substr(arrow + 4)));
      else
        fs.put_file(join_path(kDir, name), body);
    } catch (const Error&) {
      // A name that cannot be placed ("a/b" under a file "a"): the checkpoint just lacks it.
    }
  }));
  if (reseal_manifest) reseal(fs, manifest);
  fs.put_file(join_path(kDir, kManifestName), manifest);
  return fs;
}

template <class F>
void refusable(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    require(!e.file().empty() && e.file().starts_with("/fz/"), std::string("error does not name a file: ") + e.what());
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const unsigned flags = data[0];
  MemoryFileSystem fs = build(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), flags & 1);
  refusable([&] {
    const CheckpointReader reader = CheckpointReader::open(fs, kDir);
    const Manifest& m = reader.manifest();
    if (flags & 2) refusable([&] { reader.verify(Verify::none); });
    refusable([&] { reader.verify(flags & 4 ? Verify::full : Verify::fast); });
    for (int r = 0; r < m.world_size && r < 8; ++r) {
      std::optional<LoadedShard> shard;
      refusable([&] { shard.emplace(reader.load_shard(r, Verify::fast)); });
      if (flags & 8) refusable([&] { reader.load_shard(r, Verify::full); });
      if (!shard) continue;
      require(shard->file_bytes().size() == m.shard(r).size, "loaded shard size");
      int reads = 0;
      for (const auto& t : shard->tensors) {
        const auto* rec = m.find_tensor(t.name, r);
        require(rec != nullptr, "a loaded tensor is in the index");
        require(t.data.data() >= shard->file_bytes().data() && t.data.data() + t.data.size() <= shard->file_bytes().data() + shard->file_bytes().size(),
                "tensor bytes inside the shard");
        if (++reads > 16) continue;
        for (Verify v : {Verify::none, Verify::fast}) {
          std::vector<std::byte> alone;
          bool read = false;
          refusable([&] {
            alone = reader.read_tensor(t.name, r, v);
            read = true;
          });
          require(!read || std::equal(alone.begin(), alone.end(), t.data.begin(), t.data.end()),
                  "read_tensor differs from the loaded shard: " + t.name);
        }
      }
    }
  });
  if (flags & 16) {
    refusable([&] { open_latest(fs, kRoot, {.fallback = true}); });
    refusable([&] { list_checkpoints(fs, kRoot, Verify::fast); });
  }
  return 0;
}
