// SPDX-License-Identifier: Apache-2.0
// The resume path of a real training program against hostile shard headers: ckpt-demo
// --resume (which loads each rank's optimizer state with load_into, verify full) on a root
// whose latest shard's safetensors header was rewritten and resealed (the manifest's size and
// checksums recomputed to match), so that only the header check stands between it and the
// training state. Each must end the program with its typed error naming the shard file.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "ckpt/format/manifest.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/testing/memory_file_system.hpp"
#include "hostile/corpus.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

std::string le64(std::uint64_t n) {
  std::string f(8, '\0');
  for (int i = 0; i < 8; ++i) f[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return f;
}

// A damage of the rank-1 shard: (JSON header text, data section) -> the new file.
struct HeaderDamage {
  std::string name;
  std::function<std::string(const std::string& json, const std::string& data)> make;
};

// The header's tensors in data order: (name, entry).
std::vector<std::pair<std::string, json::object>> in_data_order(const json::object& h) {
  std::vector<std::pair<std::string, json::object>> out;
  for (const auto& kv : h)
    if (kv.key() != "__metadata__") out.emplace_back(std::string(kv.key()), kv.value().as_object());
  auto begin = [](const json::object& t) { return t.at("data_offsets").as_array()[0].to_number<std::uint64_t>(); };
  std::sort(out.begin(), out.end(), [&](const auto& a, const auto& b) { return begin(a.second) < begin(b.second); });
  return out;
}

// The first tensor of a dtype with a non-zero size (the demo's shards hold F32 tensors).
std::string first_nonempty(const json::object& h, std::string_view dtype) {
  for (const auto& [name, t] : in_data_order(h)) {
    const auto& o = t.at("data_offsets").as_array();
    if (t.at("dtype").as_string() == dtype && o[1].to_number<std::uint64_t>() > o[0].to_number<std::uint64_t>()) return name;
  }
  FAIL("no " << dtype << " tensor in the header");
  return {};
}

// The header re-serialised after `edit`, padded with spaces to its old length when shorter.
HeaderDamage edited(std::string name, std::function<void(json::object&)> edit) {
  return {std::move(name), [edit](const std::string& text, const std::string& data) {
            json::object h = json::parse(text).as_object();
            edit(h);
            std::string j = json::serialize(h);
            const std::size_t keep = 8 + text.size() <= 4096 ? 4096 - 8 : text.size();
            if (j.size() < keep) j.resize(keep, ' ');
            return le64(j.size()) + j + data;
          }};
}

// The header as it was, with another 8-byte length in front.
HeaderDamage length(std::string name, std::function<std::uint64_t(std::uint64_t file_size)> n) {
  return {std::move(name), [n](const std::string& text, const std::string& data) {
            std::string j = text;
            j.resize(4096 - 8 > j.size() ? 4096 - 8 : j.size(), ' ');
            const std::uint64_t size = 8 + j.size() + data.size();
            return le64(n(size)) + j + data;
          }};
}

std::vector<HeaderDamage> damages() {
  auto offsets = [](json::object& h, const std::string& name) -> json::array& { return h[name].as_object()["data_offsets"].as_array(); };
  return {
      length("length 0", [](std::uint64_t) { return 0; }),
      length("length 7", [](std::uint64_t) { return 7; }),
      length("length one byte past the file", [](std::uint64_t size) { return size - 8 + 1; }),
      edited("offsets overlapping the neighbour's",
             [=](json::object& h) {
               auto& o = offsets(h, in_data_order(h)[1].first);
               o[0] = o[0].to_number<std::uint64_t>() - 4;
               o[1] = o[1].to_number<std::uint64_t>() - 4;
             }),
      edited("offsets swapped",
             [=](json::object& h) {
               auto& o = offsets(h, first_nonempty(h, "F32"));
               std::swap(o[0], o[1]);
             }),
      edited("offsets past the end",
             [=](json::object& h) {
               auto& o = offsets(h, first_nonempty(h, "F32"));
               const std::uint64_t len = o[1].to_number<std::uint64_t>() - o[0].to_number<std::uint64_t>();
               o = json::array{1ull << 40, (1ull << 40) + len};
             }),
      {"an offset of 2^64",
       [](const std::string& text, const std::string& data) {
         // 18446744073709551616 does not fit 64 bits: written as text, as a hostile tool would.
         json::object h = json::parse(text).as_object();
         const std::string victim = first_nonempty(h, "F32");
         std::string j = json::serialize(h);
         const auto& o = h[victim].as_object()["data_offsets"].as_array();
         const std::string from = "[" + json::serialize(o[0]) + "," + json::serialize(o[1]) + "]";
         const auto at = j.find(from, j.find("\"" + victim + "\""));
         REQUIRE(at != std::string::npos);
         j.replace(at, from.size(), "[" + json::serialize(o[0]) + ",18446744073709551616]");
         j.resize(std::max<std::size_t>(j.size(), 4096 - 8), ' ');
         return le64(j.size()) + j + data;
       }},
      edited("dtype F8", [=](json::object& h) { h[first_nonempty(h, "F32")].as_object()["dtype"] = "F8"; }),
      edited("a shape whose byte count wraps to the right size",
             [=](json::object& h) {
               // (2^62 + n) x 4 bytes = 2^64 + 4n: the right byte count modulo 2^64.
               auto& t = h[first_nonempty(h, "F32")].as_object();
               const auto& o = t["data_offsets"].as_array();
               const std::uint64_t n = (o[1].to_number<std::uint64_t>() - o[0].to_number<std::uint64_t>()) / 4;
               t["shape"] = json::array{(1ull << 62) + n};
             }),
  };
}

struct Outcome {
  int status = 0;
  std::string out;
};
Outcome run(const std::string& cmd) {
  Outcome o;
  o.out = test::run_command(cmd + " 2>&1", &o.status);
  return o;
}

}  // namespace

TEST_CASE("ckpt-demo --resume refuses a latest shard whose header was rewritten and resealed, naming the shard") {
  const std::string demo = test::demo_program();
  test::TempDir dir("ckpt-hostile-resume");
  const std::string good = (dir / "good").string();
  // Two ranks, one save at step 2: the root every case copies.
  const Outcome made = run(demo + " --world-size 2 --steps 2 --save-every 2 --dir " + good);
  REQUIRE_MESSAGE(made.status == 0, made.out);
  const std::string step = checkpoint_dir_name(2);
  const Manifest m = CheckpointReader::open(posix_file_system(), join_path(good, step)).manifest();
  // The undamaged root resumes: what follows fails because of the damage alone.
  {
    const std::string copy = (dir / "undamaged").string();
    fs::copy(good, copy, fs::copy_options::recursive);
    const Outcome o = run(demo + " --world-size 2 --steps 3 --save-every 2 --resume --dir " + copy);
    CHECK_MESSAGE(o.status == 0, o.out);
  }
  int n = 0;
  for (const auto& d : damages()) {
    CAPTURE(d.name);
    const std::string root = (dir / ("case-" + std::to_string(n++))).string();
    fs::copy(good, root, fs::copy_options::recursive);
    const std::string ckpt = join_path(root, step), shard = join_path(ckpt, m.shard(1).path), manifest = join_path(ckpt, kManifestName);
    // The two files through the corpus's tools (reseal recomputes rank 1's size and checksums).
    testing::MemoryFileSystem mem;
    for (const auto& p : {shard, manifest}) {
      const auto b = test::read_all(p);
      mem.put_file(p, std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
    }
    mem.put_file(shard, d.make(hostile::shard_json(mem, shard), hostile::shard_data(mem, shard)));
    hostile::reseal(mem, ckpt, 1);
    for (const auto& p : {shard, manifest}) {
      const auto b = mem.file_bytes(p).value();
      test::write_all(p, std::vector<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(b.data()),
                                                   reinterpret_cast<const std::uint8_t*>(b.data()) + b.size()));
    }
    const Outcome o = run(demo + " --world-size 2 --steps 3 --save-every 2 --resume --dir " + root);
    CAPTURE(o.out);
    CHECK(o.status != 0);
    CHECK(o.status < 128);
    CHECK(o.out.find("malformed shard") != std::string::npos);
    CHECK(o.out.find(shard) != std::string::npos);
    CHECK(o.out.find("terminate called") == std::string::npos);
    // Nothing was committed over it: latest still names the damaged step.
    const auto latest = test::read_all(join_path(root, std::string(kLatestName)));
    CHECK(std::string(latest.begin(), latest.end()) == step + "\n");
  }
}
