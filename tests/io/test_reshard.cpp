// SPDX-License-Identifier: Apache-2.0
// Resharding and consolidation (lib/ckpt/ops/reshard.hpp) and the streaming shard I/O under
// them (lib/ckpt/read/range_reader.hpp, lib/ckpt/shard/shard_writer.hpp), on checkpoints shaped like the trainer's: flat fp32
// tensors sliced across ranks with zero padding, replicated tensors on rank 0, per-rank
// metadata.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cstring>
#include <filesystem>
#include <map>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/dist/communicator.hpp"
#include "ckpt/hash/xxh3.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/ops/reshard.hpp"
#include "ckpt/read/range_reader.hpp"
#include "ckpt/shard/shard_writer.hpp"
#include "io_fixture.hpp"
#include "test_reshard_safetensors.hpp"

using namespace ckpt;
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

const std::vector<std::string> kFlat = {"optim.master", "optim.m", "optim.v"};

// The state of a "model" of P parameters: three flat tensors and two replicated ones.
struct FlatModel {
  std::uint64_t P = 0;
  std::vector<std::vector<float>> flat;  // per kFlat entry, P values
  std::vector<std::uint16_t> w16;        // model.w, F16 [P]
  std::vector<std::int64_t> counters{7, -3};

  explicit FlatModel(std::uint64_t p, std::uint64_t seed = 1) : P(p), w16(p) {
    for (std::size_t k = 0; k < kFlat.size(); ++k) {
      const auto bytes = test::random_bytes(P * 4, seed * 10 + k);
      std::vector<float> v(P);
      for (std::uint64_t i = 0; i < P; ++i) v[i] = static_cast<float>(bytes[i * 4]) / 7.0f - static_cast<float>(bytes[i * 4 + 1]) / 11.0f;
      flat.push_back(std::move(v));
    }
    for (std::uint64_t i = 0; i < P; ++i) w16[i] = f32_to_f16(flat[0][i]);
  }

  // emb [k, 61], w [rest - 2], b [2]: tensors of several ranks, tiling [0, P).
  json::array param_layout() const {
    const std::uint64_t k = P / 122, emb = 61 * k, w = P - emb - 2;
    return {json::object{{"name", "emb"}, {"shape", json::array{k, 61}}, {"offset", 0}, {"numel", emb}},
            json::object{{"name", "w"}, {"shape", json::array{w}}, {"offset", emb}, {"numel", w}},
            json::object{{"name", "b"}, {"shape", json::array{2}}, {"offset", emb + w}, {"numel", 2}}};
  }

  json::object training() const {
    return {{"flat_tensors", json::array{"optim.master", "optim.m", "optim.v"}},
            {"num_params", P},
            {"rank_local_metadata", json::array{"rng"}},
            {"param_layout", param_layout()},
            {"config", {{"any", "thing"}}}};
  }

  // Saves the state as `world` ranks would (ZeRO: P padded to a multiple of world).
  Manifest save(const std::string& root, int world, std::uint64_t step = 10, std::uint64_t chunk = 4096) const {
    const std::uint64_t padded = padded_numel(P, world);
    std::vector<std::vector<std::vector<float>>> slices(static_cast<std::size_t>(world));
    SaveRequest req;
    req.step = step;
    req.wall_clock_seconds = 3.5;
    req.chunk_size = chunk;
    req.param_numel = padded;
    req.training = to_json_object(training());
    for (int r = 0; r < world; ++r) {
      const auto range = dist::shard_range(padded, world, r);
      auto& mine = slices[static_cast<std::size_t>(r)];
      RankState rs;
      for (std::size_t k = 0; k < kFlat.size(); ++k) {
        mine.emplace_back(range.numel, 0.0f);
        for (std::uint64_t i = 0; i < range.numel; ++i)
          if (range.offset + i < P) mine.back()[i] = flat[k][range.offset + i];
      }
      for (std::size_t k = 0; k < kFlat.size(); ++k) rs.tensors.push_back({kFlat[k], DType::F32, {range.numel}, std::as_bytes(std::span(mine[k]))});
      if (r == 0) {
        rs.tensors.push_back({"model.w", DType::F16, {P}, std::as_bytes(std::span(w16))});
        rs.tensors.push_back({"model.counters", DType::I64, {2}, std::as_bytes(std::span(counters))});
      }
      rs.param_shard_offset = range.offset;
      rs.param_shard_numel = range.numel;
      const auto ru = static_cast<std::uint64_t>(r);
      json_of(rs.metadata) = {{"data_position", 96}, {"rng", json::array{ru * 4, ru * 4 + 1, ru * 4 + 2, ru * 4 + 3}}};
      req.ranks.push_back(std::move(rs));
    }
    return save_checkpoint_sync(posix_file_system(), root, req);
  }
};

std::vector<float> floats(std::span<const std::byte> b) {
  std::vector<float> v(b.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// Checks that every rank of the checkpoint in `dir` holds exactly its slice of `model`'s
// flat state for its world size, zeros in the padding.
void check_slices(const FlatModel& model, const std::string& dir) {
  const auto reader = CheckpointReader::open(posix_file_system(), dir);
  const Manifest& m = reader.manifest();
  CHECK(m.param_numel == padded_numel(model.P, m.world_size));
  for (int r = 0; r < m.world_size; ++r) {
    CAPTURE(r);
    const auto shard = reader.load_shard(r, Verify::full);
    const auto range = flat_slice(model.P, m.world_size, r);
    CHECK(shard.record.param_shard_offset == range.offset);
    CHECK(shard.record.param_shard_numel == range.numel);
    for (std::size_t k = 0; k < kFlat.size(); ++k) {
      const auto got = floats(shard.tensor(kFlat[k]).data);
      REQUIRE(got.size() == range.numel);
      for (std::uint64_t i = 0; i < range.numel; ++i) {
        const float want = range.offset + i < model.P ? model.flat[k][range.offset + i] : 0.0f;
        if (std::memcmp(&got[i], &want, 4) != 0) FAIL_CHECK("tensor " << kFlat[k] << " element " << range.offset + i);
      }
    }
  }
}

// Every entry under `dir` (recursively), with the contents of the files; of the root's writer
// lock only its presence (each writer rewrites its record).
std::map<std::string, std::vector<std::uint8_t>> files_of(const fs::path& dir) {
  std::map<std::string, std::vector<std::uint8_t>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const bool contents = e.is_regular_file() && e.path() != dir / kLockName;
    out[fs::relative(e.path(), dir).string()] = contents ? test::read_all(e.path()) : std::vector<std::uint8_t>{};
  }
  return out;
}

void flip(const fs::path& p, std::uint64_t at) {
  auto b = test::read_all(p);
  b.at(at) ^= 0x40;
  test::write_all(p, b);
}

std::string step_dir(const fs::path& root, std::uint64_t step = 10) { return (root / checkpoint_dir_name(step)).string(); }

ReshardResult reshard(const std::string& src_dir, const fs::path& dst_root, int world, std::uint64_t buffer = kDefaultReshardBuffer) {
  const auto src = CheckpointReader::open(posix_file_system(), src_dir);
  return reshard_checkpoint(posix_file_system(), src, dst_root.string(), {.world_size = world, .buffer_bytes = buffer});
}

}  // namespace

// ---- streaming shard I/O ----------------------------------------------------------------

TEST_CASE("plan_shard_specs lays out a shard exactly as plan_shard does") {
  test::Fixture fx(1, 3);
  const auto& views = fx.request.ranks[0].tensors;
  std::vector<TensorSpec> specs;
  for (const auto& v : views) specs.push_back({v.name, v.dtype, v.shape});
  const std::map<std::string, std::string> meta{{"ckpt.rank", "0"}, {"k", "v"}};
  const ShardHeader a = plan_shard(views, meta), b = plan_shard_specs(specs, meta);
  CHECK(encode_shard_header(a) == encode_shard_header(b));
  CHECK(a.data_size == b.data_size);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    CHECK(a.tensors[i].name == b.tensors[i].name);
    CHECK(a.tensors[i].begin == b.tensors[i].begin);
    CHECK(a.tensors[i].end == b.tensors[i].end);
  }
}

TEST_CASE("a shard streamed in pieces of any size is byte-identical to one written whole as an image") {
  test::TempDir dir;
  test::Fixture fx(1, 3);
  const auto& views = fx.request.ranks[0].tensors;
  const std::map<std::string, std::string> meta{{"ckpt.rank", "0"}};
  fs::create_directory(dir / "whole");
  // The asynchronous writers' way: the whole file image in memory, written by the caller
  // while the writer hashes it.
  const ShardHeader planned = plan_shard(views, meta);
  std::vector<std::byte> image(planned.file_size());
  const std::string head = encode_shard_header(planned);
  std::memcpy(image.data(), head.data(), head.size());
  for (const auto& t : planned.tensors)
    for (const auto& v : views)
      if (v.name == t.name && !v.data.empty()) std::memcpy(image.data() + planned.data_start + t.begin, v.data.data(), v.data.size());
  ShardWriter iw = ShardWriter::image(posix_file_system(), (dir / "whole").string(), "rank-00000-of-00001.safetensors", planned,
                                      {.chunk_size = 4096});
  iw.file().write_at(0, image);
  iw.hash(image);
  iw.mark_written(image.size());
  const ShardReport whole = iw.finish(0);
  for (std::size_t piece : {1u, 7u, 4095u, 4096u, 100000u}) {
    CAPTURE(piece);
    const fs::path d = dir / ("p" + std::to_string(piece));
    fs::create_directory(d);
    std::vector<TensorSpec> specs;
    for (const auto& v : views) specs.push_back({v.name, v.dtype, v.shape});
    ShardWriter w = ShardWriter::stream(posix_file_system(), d.string(), whole.shard.path, specs, meta, {.chunk_size = 4096});
    std::vector<std::byte> data;  // the data section, in the planned order
    for (const auto& t : w.header().tensors)
      for (const auto& v : views)
        if (v.name == t.name) data.insert(data.end(), v.data.begin(), v.data.end());
    for (std::size_t at = 0; at < data.size(); at += piece) w.write(std::span(data).subspan(at, std::min(piece, data.size() - at)));
    const ShardReport streamed = w.finish(0);
    CHECK(streamed.shard.sha256 == whole.shard.sha256);
    CHECK(streamed.shard.chunk_xxh3 == whole.shard.chunk_xxh3);
    CHECK(streamed.tensors.size() == whole.tensors.size());
    CHECK(test::read_all(d / whole.shard.path) == test::read_all(dir / "whole" / whole.shard.path));
  }
}

TEST_CASE("the streaming writer refuses more bytes than planned and an incomplete finish") {
  test::TempDir dir;
  const std::vector<TensorSpec> specs{{"x", DType::F32, {4}}};
  ShardWriter w = ShardWriter::stream(posix_file_system(), dir.path().string(), "s.safetensors", specs, {});
  const std::uint64_t file_size = w.header().file_size();
  const std::vector<std::byte> bytes(20);
  CHECK_THROWS_AS(w.write(bytes), Error);
  CHECK(w.remaining() == 16);
  w.write(std::span(bytes).first(8));
  try {
    w.finish(0);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.expected() == std::to_string(file_size) + " bytes");
    CHECK(e.actual() == std::to_string(file_size - 8) + " bytes");
  }
  w.write_zeros(8);
  CHECK(w.finish(0).shard.size == w.header().file_size());
}

TEST_CASE("read_tensor_range returns a sub-range and checks only the chunks it reads") {
  test::TempDir dir;
  const FlatModel model(5003);
  const Manifest m = model.save(dir.path().string(), 1);
  const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir.path()));
  const auto got = floats(reader.read_tensor_range("optim.m", 0, 1500, 2000));
  REQUIRE(got.size() == 2000);
  CHECK(std::memcmp(got.data(), model.flat[1].data() + 1500, 2000 * 4) == 0);
  CHECK_THROWS_AS(reader.read_tensor_range("optim.m", 0, 5000, 4), Error);
  // A flipped byte in a chunk the range does not touch goes unnoticed; in one it touches,
  // it is a checksum mismatch naming that chunk.
  const TensorRecord* t = m.find_tensor("optim.m", 0);
  const fs::path shard = fs::path(step_dir(dir.path())) / m.shards[0].path;
  flip(shard, t->begin + 4 * 4900);
  CHECK_NOTHROW(reader.read_tensor_range("optim.m", 0, 0, 100));
  try {
    reader.read_tensor_range("optim.m", 0, 4800, 200);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::checksum_mismatch);
    CHECK(e.file() == shard.string());
    CHECK(e.detail().find("chunk") != std::string::npos);
  }
}

// ---- the flat space -------------------------------------------------------------------

TEST_CASE("a flat reader returns any range of the flat space, zeros past num_params") {
  test::TempDir dir;
  const FlatModel model(5003);
  for (int world : {1, 3, 4, 8}) {
    CAPTURE(world);
    const fs::path root = dir / ("w" + std::to_string(world));
    model.save(root.string(), world);
    const auto reader = CheckpointReader::open(posix_file_system(), step_dir(root));
    FlatReader flat(reader, flat_layout(reader.manifest()));
    const std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges = {{0, 5003}, {0, 1}, {624, 3}, {1250, 1300}, {4999, 20}, {5003, 5}, {17, 4000}};
    for (const auto& [first, count] : ranges) {
      CAPTURE(first);
      std::vector<float> got(count, -1.0f);
      flat.read("optim.v", first, std::as_writable_bytes(std::span(got)));
      for (std::uint64_t i = 0; i < count; ++i) {
        const float want = first + i < model.P ? model.flat[2][first + i] : 0.0f;
        if (std::memcmp(&got[i], &want, 4) != 0) FAIL_CHECK("element " << first + i);
      }
    }
  }
}

TEST_CASE("a flat reader refuses shards that do not tile the flat space") {
  test::TempDir dir;
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
  SaveRequest req;
  req.step = 1;
  req.param_numel = 2000;
  json_of(req.training) = {{"flat_tensors", json::array{"x"}}};
  RankState r0, r1;
  r0.tensors = {{"x", DType::F32, {1000}, std::as_bytes(std::span(a))}};
  r1.tensors = {{"x", DType::F32, {1000}, std::as_bytes(std::span(b))}};
  r0.param_shard_offset = 0, r0.param_shard_numel = 1000;
  r1.param_shard_offset = 500, r1.param_shard_numel = 1000;  // overlaps rank 0
  req.ranks = {r0, r1};
  save_checkpoint_sync(posix_file_system(), dir.path().string(), req);
  const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir.path(), 1));
  try {
    FlatReader flat(reader, flat_layout(reader.manifest()));
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::malformed_manifest);
    CHECK(e.detail() == "shards[1].param_shard_offset");
    CHECK(e.expected() == "1000 (shards tile the flat space)");
    CHECK(e.actual() == "500");
  }
}

// ---- reshard --------------------------------------------------------------------------

TEST_CASE("resharding N to M and back to N returns byte-identical flat state for N, M in 1, 2, 3, 4, 8") {
  const FlatModel model(5003);
  for (int n : {1, 2, 3, 4, 8}) {
    test::TempDir dir;
    const fs::path src_root = dir / "src";
    const Manifest original = model.save(src_root.string(), n);
    for (int m : {1, 2, 3, 4, 8}) {
      CAPTURE(n);
      CAPTURE(m);
      const fs::path mid = dir / ("to" + std::to_string(m)), back = dir / ("back" + std::to_string(m));
      const auto there = reshard(step_dir(src_root), mid, m);
      CHECK(there.manifest.world_size == m);
      check_slices(model, there.dir);
      const auto again = reshard(there.dir, back, n);
      check_slices(model, again.dir);
      // Byte-identical flat state, and indeed byte-identical shard files.
      const auto a = CheckpointReader::open(posix_file_system(), step_dir(src_root));
      const auto b = CheckpointReader::open(posix_file_system(), again.dir);
      for (int r = 0; r < n; ++r)
        for (const auto& name : kFlat) CHECK(a.read_tensor(name, r) == b.read_tensor(name, r));
      for (int r = 0; r < n; ++r) CHECK(again.manifest.shard(r).sha256 == original.shard(r).sha256);
    }
  }
}

TEST_CASE("every resharded checkpoint passes full verification and describes itself") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 4);
  for (int m : {1, 3, 8}) {
    CAPTURE(m);
    const auto out = reshard(step_dir(dir / "src"), dir / ("m" + std::to_string(m)), m);
    const auto reader = CheckpointReader::open(posix_file_system(), out.dir, m);
    CHECK_NOTHROW(reader.verify(Verify::full));
    const Manifest& man = reader.manifest();
    CHECK(man.step == 10);
    CHECK(man.wall_clock_seconds == 3.5);
    CHECK(read_latest(posix_file_system(), (dir / ("m" + std::to_string(m))).string()) == checkpoint_dir_name(10));
    const FlatLayout layout = flat_layout(man);
    CHECK(layout.tensors == kFlat);
    CHECK(layout.num_params == 5003);
    CHECK(json_of(man.training).at("resharded_from").at("world_size").as_int64() == 4);
    CHECK(json_of(man.training).at("config") == model.training().at("config"));
    // Replicated tensors land on the new rank 0 only, unchanged.
    const auto shard0 = reader.load_shard(0);
    CHECK(std::memcmp(shard0.tensor("model.w").data.data(), model.w16.data(), model.P * 2) == 0);
    for (int r = 1; r < m; ++r) CHECK(man.find_tensor("model.w", r) == nullptr);
  }
}

TEST_CASE("per-rank metadata keeps global keys on every rank and rank-local keys on their rank") {
  test::TempDir dir;
  const FlatModel model(5003);
  const Manifest m4 = model.save(dir.path().string(), 4);
  const auto meta = remap_rank_metadata(m4, 6);
  REQUIRE(meta.size() == 6);
  for (int r = 0; r < 6; ++r) {
    CAPTURE(r);
    const auto& o = json_of(meta[static_cast<std::size_t>(r)]);
    CHECK(o.at("data_position").as_int64() == 96);  // global: the same samples consumed
    if (r < 4) CHECK(o.at("rng") == json_of(m4.shard(r).metadata).at("rng"));
    else CHECK(o.if_contains("rng") == nullptr);     // the consumer derives a fresh stream
  }
  // A key whose values differ between ranks is rank-local even if not declared so.
  Manifest odd = m4;
  json_of(odd.training).erase("rank_local_metadata");
  json_of(odd.shards[2].metadata)["shuffle"] = 5;
  for (int r : {0, 1, 3}) json_of(odd.shards[static_cast<std::size_t>(r)].metadata)["shuffle"] = 1;
  const auto meta2 = remap_rank_metadata(odd, 2);
  CHECK(json_of(meta2[1]).at("shuffle").as_int64() == 1);
  CHECK(json_of(meta2[1]).at("rng") == json_of(odd.shard(1).metadata).at("rng"));
}

TEST_CASE("reshard through a small buffer writes the same checkpoint as through a large one") {
  test::TempDir dir;
  const FlatModel model(200003);  // 800 KB per flat tensor: many pieces of 64 KiB
  model.save((dir / "src").string(), 3, 10, 64 << 10);
  const auto small = reshard(step_dir(dir / "src"), dir / "small", 4, kMinReshardBuffer);
  const auto large = reshard(step_dir(dir / "src"), dir / "large", 4);
  for (int r = 0; r < 4; ++r) CHECK(small.manifest.shard(r).sha256 == large.manifest.shard(r).sha256);
  check_slices(model, small.dir);
}

TEST_CASE("a corrupt source shard makes reshard fail with a checksum mismatch and leave nothing") {
  test::TempDir dir;
  const FlatModel model(5003);
  const Manifest m = model.save((dir / "src").string(), 4);
  const fs::path bad_shard = fs::path(step_dir(dir / "src")) / m.shards[2].path;
  // A flipped byte in the data, then one in the header's JSON: both are checksum mismatches.
  for (const std::uint64_t at : {m.find_tensor("optim.m", 2)->begin + 100, std::uint64_t{20}}) {
    CAPTURE(at);
    flip(bad_shard, at);
    try {
      reshard(step_dir(dir / "src"), dir / "new", 8);  // into a new root: it is gone afterwards
      FAIL("no throw");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::checksum_mismatch);
      CHECK(e.file() == bad_shard.string());
    }
    CHECK(!fs::exists(dir / "new"));
    flip(bad_shard, at);  // repaired
  }
  flip(bad_shard, m.find_tensor("optim.m", 2)->begin + 100);
  // Into an existing root: its checkpoints and `latest` are untouched, no temporary is left.
  const FlatModel other(5003, 2);
  other.save((dir / "old").string(), 2, 5);
  const auto before = files_of(dir / "old");
  CHECK_THROWS_AS(reshard(step_dir(dir / "src"), dir / "old", 3), Error);
  CHECK(files_of(dir / "old") == before);  // nothing added (no temporary), nothing changed
}

TEST_CASE("a corrupt source is refused by reshard with verify fast and full, and copied only with verify none, logged and recorded") {
  test::TempDir dir;
  const FlatModel model(5003);
  const Manifest m = model.save((dir / "src").string(), 4);
  const fs::path bad_shard = fs::path(step_dir(dir / "src")) / m.shards[2].path;
  flip(bad_shard, m.find_tensor("optim.m", 2)->begin + 100);
  const auto src = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
  for (const Verify mode : {Verify::fast, Verify::full}) {
    CAPTURE(verify_name(mode));
    const Error e = test::expect_error([&] { reshard_checkpoint(posix_file_system(), src, (dir / "new").string(), {.world_size = 3, .verify = mode}); });
    CHECK(e.code() == Errc::checksum_mismatch);
    CHECK(e.file() == bad_shard.string());
    CHECK(!fs::exists(dir / "new"));
  }
  test::LogCapture log;
  const auto out = reshard_checkpoint(posix_file_system(), src, (dir / "new").string(), {.world_size = 3, .verify = Verify::none});
  CHECK(log.matching({step_dir(dir / "src"), "reshard with verify none: the source's checksums are not checked"}).size() == 1);
  CHECK(out.source_verify == Verify::none);
  const auto copy = CheckpointReader::open(posix_file_system(), out.dir);
  CHECK(json_of(copy.manifest().training).at("resharded_from").at("source_verify").as_string() == "none");
  CHECK(resharded_source_verify(copy.manifest()) == Verify::none);
  // Its own checksums hold (they are of what was copied): only the record tells.
  CHECK_NOTHROW(copy.verify(Verify::full));
}

TEST_CASE("source_verify records the weakest check since a job saved the bytes: a reshard of an unchecked reshard stays unchecked") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 4);
  const auto src = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
  CHECK(resharded_source_verify(src.manifest()) == std::nullopt);  // a job's own checkpoint records none
  const auto checked = [&](const std::string& from, const std::string& to, Verify mode) {
    const auto reader = CheckpointReader::open(posix_file_system(), from);
    return reshard_checkpoint(posix_file_system(), reader, (dir / to).string(), {.world_size = 2, .verify = mode});
  };
  CHECK(checked(step_dir(dir / "src"), "full", Verify::full).source_verify == Verify::full);
  CHECK(checked(step_dir(dir / "src"), "fast", Verify::fast).source_verify == Verify::fast);
  const auto none = checked(step_dir(dir / "src"), "none", Verify::none);
  CHECK(none.source_verify == Verify::none);
  const auto again = checked(none.dir, "again", Verify::full);
  CHECK(again.source_verify == Verify::none);
  CHECK(json_of(again.manifest.training).at("resharded_from").at("source_verify").as_string() == "none");
  CHECK(checked(step_dir(dir / "full"), "full-fast", Verify::fast).source_verify == Verify::fast);
}

TEST_CASE("a resharded manifest without source_verify still loads, and a malformed one is refused naming the field") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 4);
  const auto out = reshard(step_dir(dir / "src"), dir / "new", 2);
  const fs::path manifest = fs::path(out.dir) / kManifestName;
  auto text = test::read_all(manifest);
  auto o = json::parse(std::string(text.begin(), text.end())).as_object();
  o["training"].as_object()["resharded_from"].as_object().erase("source_verify");  // as reshard wrote it before the field
  const auto write = [&](const json::object& v) {
    const std::string t = json::serialize(v);
    test::write_all(manifest, std::vector<std::uint8_t>(t.begin(), t.end()));
  };
  write(o);
  const auto older = CheckpointReader::open(posix_file_system(), out.dir);
  CHECK_NOTHROW(older.verify(Verify::full));
  CHECK(resharded_source_verify(older.manifest()) == std::nullopt);
  o["training"].as_object()["resharded_from"].as_object()["source_verify"] = "thorough";
  write(o);
  const auto odd = CheckpointReader::open(posix_file_system(), out.dir);
  const Error e = test::expect_error([&] { resharded_source_verify(odd.manifest(), odd.manifest_path()); });
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == manifest.string());
  CHECK(e.detail() == "training.resharded_from.source_verify");
  CHECK(e.actual() == "\"thorough\"");
  // A reshard of it is refused before anything is written.
  CHECK(test::expect_error([&] { reshard(out.dir, dir / "next", 3); }).code() == Errc::malformed_manifest);
  CHECK(!fs::exists(dir / "next"));
}

TEST_CASE("reshard refuses per-rank tensors that say neither that they are flat nor what they are") {
  test::TempDir dir;
  test::Fixture fx(2, 10);
  save_checkpoint_sync(posix_file_system(), (dir / "src").string(), fx.request);
  try {
    reshard(step_dir(dir / "src"), dir / "dst", 3);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.expected() == "a sharding description, or training.flat_tensors");
    CHECK(e.detail().find("has its name on several ranks and no sharding description") != std::string::npos);
  }
  CHECK(!fs::exists(dir / "dst"));
}

TEST_CASE("reshard refuses a destination that already holds the step") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 2);
  reshard(step_dir(dir / "src"), dir / "dst", 3);
  const auto before = files_of(dir / "dst" / checkpoint_dir_name(10));
  try {
    reshard(step_dir(dir / "src"), dir / "dst", 4);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.detail().find("already exists") != std::string::npos);
  }
  CHECK(files_of(dir / "dst" / checkpoint_dir_name(10)) == before);
}

TEST_CASE("reshard refuses a destination whose latest names a newer checkpoint") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 2, 10);
  model.save((dir / "dst").string(), 2, 20);
  const auto before = files_of(dir / "dst");
  try {
    reshard(step_dir(dir / "src"), dir / "dst", 3);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(e.actual() == checkpoint_dir_name(20));
  }
  CHECK(files_of(dir / "dst") == before);
}

TEST_CASE("reshard into a root another writer holds fails with busy before touching it") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 2, 10);
  model.save((dir / "dst").string(), 2, 5);
  const auto before = files_of(dir / "dst");
  const RootLock job(posix_file_system(), (dir / "dst").string());  // a job saving there
  const Error e = test::error_of([&] { reshard(step_dir(dir / "src"), dir / "dst", 3); });
  CHECK(e.code() == Errc::busy);
  CHECK(e.file() == (dir / "dst").string());
  CHECK(e.actual().starts_with("pid " + std::to_string(::getpid()) + " "));
  CHECK(files_of(dir / "dst") == before);
}

// ---- consolidate ----------------------------------------------------------------------

TEST_CASE("consolidate writes one safetensors file whose tensors equal the concatenated master shards") {
  test::TempDir dir;
  const FlatModel model(5003);
  const Manifest m = model.save((dir / "src").string(), 3);
  const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
  const auto res = consolidate_checkpoint(posix_file_system(), reader, (dir / "out").string(), {});
  CHECK(!res.index);
  REQUIRE(res.files.size() == 1);
  CHECK(res.files[0].name == "model.safetensors");
  const auto st = test::parse_safetensors_independently(test::read_all(dir / "out" / "model.safetensors"));
  CHECK(st.metadata.at("format") == "pt");
  // The reference: the master shards of the checkpoint as written, concatenated.
  std::vector<float> master;
  for (int r = 0; r < 3; ++r) {
    const auto f = floats(reader.read_tensor("optim.master", r));
    master.insert(master.end(), f.begin(), f.end());
  }
  std::uint64_t covered = 0;
  for (const auto& p : model.param_layout()) {
    const std::string name(p.at("name").as_string());
    CAPTURE(name);
    const auto& t = st.tensors.at(name);
    CHECK(t.dtype == "F32");
    CHECK(t.shape == json::value_to<std::vector<std::uint64_t>>(p.at("shape")));
    const auto off = p.at("offset").to_number<std::uint64_t>(), n = p.at("numel").to_number<std::uint64_t>();
    CHECK(std::memcmp(t.bytes.data(), master.data() + off, n * 4) == 0);
    covered += n;
  }
  CHECK(covered == model.P);
  CHECK(st.tensors.size() == 3);
}

TEST_CASE("consolidate leaves the optimizer state out unless asked, then writes it per model tensor into files of its own") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 3);
  const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
  const auto plain = consolidate_checkpoint(posix_file_system(), reader, (dir / "plain").string(), {});
  CHECK(plain.left_out == 6);  // optim.m and optim.v of the 3 model tensors
  CHECK(plain.optimizer_files.empty());
  CHECK(plain.optimizer_size == 0);
  CHECK_FALSE(fs::exists(dir / "plain" / "optimizer.safetensors"));
  // With the optimizer, split at 12000 bytes: two files and an index, as the weights'.
  const auto res = consolidate_checkpoint(posix_file_system(), reader, (dir / "full").string(),
                                          {.with_optimizer = true, .max_file_size = 12000});
  CHECK(res.left_out == 0);
  CHECK(res.total_size == model.P * 4);
  CHECK(res.optimizer_size == 2 * model.P * 4);
  REQUIRE(res.optimizer_index);
  CHECK(*res.optimizer_index == "optimizer.safetensors.index.json");
  std::map<std::string, std::vector<std::uint8_t>> stored;  // every optimizer tensor, from the files
  for (const auto& f : res.optimizer_files) {
    CHECK(f.name.starts_with("optimizer-"));
    const auto st = test::parse_safetensors_independently(test::read_all(dir / "full" / f.name));
    for (const auto& [name, t] : st.tensors) stored[name] = t.bytes;
  }
  CHECK(stored.size() == 6);
  for (const std::string flat : {"optim.m", "optim.v"}) {
    std::vector<float> whole;  // the reference: the flat tensor's shards as written, concatenated
    for (int r = 0; r < 3; ++r) {
      const auto f = floats(reader.read_tensor(flat, r));
      whole.insert(whole.end(), f.begin(), f.end());
    }
    for (const auto& p : model.param_layout()) {
      const std::string name = flat + "." + std::string(p.at("name").as_string());
      CAPTURE(name);
      REQUIRE(stored.count(name));
      const auto off = p.at("offset").to_number<std::uint64_t>(), n = p.at("numel").to_number<std::uint64_t>();
      REQUIRE(stored[name].size() == n * 4);
      CHECK(std::memcmp(stored[name].data(), whole.data() + off, n * 4) == 0);
    }
  }
  // The weights are the same files as without the optimizer.
  CHECK(res.index);
  CHECK(fs::exists(dir / "full" / "optimizer.safetensors.index.json"));
}

TEST_CASE("consolidate splits the model into files with a weight-map index past max_file_size") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 2);
  const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
  // emb (10004 bytes) and w (10000) do not fit one 12000-byte file together; w and b do.
  const auto res = consolidate_checkpoint(posix_file_system(), reader, (dir / "out").string(), {.max_file_size = 12000});
  REQUIRE(res.index);
  REQUIRE(res.files.size() == 2);
  CHECK(res.files[0].name == "model-00001-of-00002.safetensors");
  CHECK(res.files[1].name == "model-00002-of-00002.safetensors");
  const auto index = json::parse([&] {
                       const auto b = test::read_all(dir / "out" / "model.safetensors.index.json");
                       return std::string(b.begin(), b.end());
                     }()).as_object();
  CHECK(index.at("metadata").at("total_size").to_number<std::uint64_t>() == model.P * 4);
  const auto& wm = index.at("weight_map").as_object();
  CHECK(wm.size() == 3);
  std::uint64_t total = 0;
  for (const auto& kv : wm) {
    const auto st = test::parse_safetensors_independently(test::read_all(dir / "out" / std::string(kv.value().as_string())));
    REQUIRE(st.tensors.count(std::string(kv.key())));
    total += st.tensors.at(std::string(kv.key())).bytes.size();
  }
  CHECK(total == model.P * 4);
}

TEST_CASE("consolidate casts the master weights to f16 and bf16 on request") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 4);
  const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
  for (DType t : {DType::F16, DType::BF16}) {
    CAPTURE(dtype_name(t));
    const fs::path out = dir / std::string(dtype_name(t));
    consolidate_checkpoint(posix_file_system(), reader, out.string(), {.dtype = t, .buffer_bytes = kMinReshardBuffer});
    const auto st = test::parse_safetensors_independently(test::read_all(out / "model.safetensors"));
    const auto& w = st.tensors.at("w");
    CHECK(w.dtype == dtype_name(t));
    const std::uint64_t off = model.param_layout()[1].at("offset").to_number<std::uint64_t>();
    for (std::size_t i = 0; i < w.bytes.size() / 2; ++i) {
      std::uint16_t h;
      std::memcpy(&h, w.bytes.data() + 2 * i, 2);
      const float f = model.flat[0][off + i];
      if (h != (t == DType::F16 ? f32_to_f16(f) : f32_to_bf16(f))) FAIL_CHECK("element " << i);
    }
  }
}

namespace {
// A 2-rank checkpoint of `model` under `root` with a flipped byte in rank 1's master weights;
// returns that shard file.
fs::path save_with_corrupt_master(const FlatModel& model, const fs::path& root) {
  const Manifest m = model.save(root.string(), 2);
  const fs::path bad_shard = fs::path(step_dir(root)) / m.shards[1].path;
  flip(bad_shard, m.find_tensor("optim.master", 1)->end - 3);
  return bad_shard;
}
}  // namespace

TEST_CASE("a corrupt source shard makes consolidate fail with a checksum mismatch and leave no output, with verify fast and full") {
  test::TempDir dir;
  const FlatModel model(5003);
  const fs::path bad_shard = save_with_corrupt_master(model, dir / "src");
  const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
  fs::create_directory(dir / "models");
  for (const Verify mode : {Verify::fast, Verify::full}) {
    CAPTURE(verify_name(mode));
    try {
      consolidate_checkpoint(posix_file_system(), reader, (dir / "models" / "out").string(), {.max_file_size = 12000, .verify = mode});
      FAIL("no throw");
    } catch (const Error& e) {
      CHECK(e.code() == Errc::checksum_mismatch);
      CHECK(e.file() == bad_shard.string());
    }
    CHECK(fs::is_empty(dir / "models"));  // neither the output nor its temporary
  }
}

TEST_CASE("consolidate with verify none copies a corrupt source only when asked, logs it, and every file records how its source was checked") {
  test::TempDir dir;
  const FlatModel model(5003);
  save_with_corrupt_master(model, dir / "src");
  const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
  test::LogCapture log;
  const auto res = consolidate_checkpoint(posix_file_system(), reader, (dir / "out").string(), {.max_file_size = 12000, .verify = Verify::none});
  CHECK(log.matching({"consolidate with verify none: the source's checksums are not checked"}).size() == 1);
  CHECK(res.source_verify == Verify::none);
  REQUIRE(res.files.size() > 1);
  for (const auto& f : res.files) {
    CAPTURE(f.name);
    const auto st = test::parse_safetensors_independently(test::read_all(dir / "out" / f.name));
    CHECK(st.metadata.at("format") == "pt");
    CHECK(st.metadata.at("ckpt.source_verify") == "none");
  }
  // A sound source read with the default check says so.
  model.save((dir / "clean").string(), 2);
  const auto clean = CheckpointReader::open(posix_file_system(), step_dir(dir / "clean"));
  CHECK(consolidate_checkpoint(posix_file_system(), clean, (dir / "model").string(), {}).source_verify == Verify::fast);
  CHECK(test::parse_safetensors_independently(test::read_all(dir / "model" / "model.safetensors")).metadata.at("ckpt.source_verify") == "fast");
}

TEST_CASE("a consolidate killed midway leaves a temporary that the next run removes, and a live one's is kept") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 2);
  fs::create_directory(dir / "models");
  const std::string out = (dir / "models" / "out").string();
  // A consolidate into OUT, killed after its first piece is written.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
      consolidate_checkpoint(posix_file_system(), reader, out,
                             {.buffer_bytes = kMinReshardBuffer, .progress = [](std::uint64_t, std::uint64_t) { ::raise(SIGKILL); }});
    } catch (...) {
    }
    ::_exit(3);  // not reached: killed in the progress callback
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir / "models")) left.push_back(e.path().filename().string());
  REQUIRE(left.size() == 1);
  CHECK(left[0].starts_with(".tmp-out@" + host_name() + "-" + std::to_string(child) + "-"));
  CHECK(is_abandoned_temporary(left[0], "out"));
  // What the next run must keep: a live process's temporary for OUT (this one's), another
  // host's, and another output's.
  const std::string live = host_temporary_name("out");
  const std::string other_host = ".tmp-out@elsewhere-" + std::to_string(child) + "-0";
  const std::string other_out = ".tmp-export@" + host_name() + "-" + std::to_string(child) + "-0";
  for (const auto& n : {live, other_host, other_out}) fs::create_directory(dir / "models" / n);
  test::LogCapture log;
  const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
  consolidate_checkpoint(posix_file_system(), reader, out, {});
  CHECK(log.matching({"removing " + left[0], "left by a consolidate that is gone"}).size() == 1);
  CHECK_FALSE(fs::exists(dir / "models" / left[0]));
  for (const auto& n : {live, other_host, other_out}) CHECK(fs::is_directory(dir / "models" / n));
  CHECK(test::parse_safetensors_independently(test::read_all(dir / "models" / "out" / "model.safetensors")).tensors.size() == 3);
}

TEST_CASE("consolidate refuses an existing output directory") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save((dir / "src").string(), 2);
  const auto reader = CheckpointReader::open(posix_file_system(), step_dir(dir / "src"));
  fs::create_directory(dir / "out");
  test::write_all(dir / "out" / "keep.txt", {'k'});
  CHECK_THROWS_AS(consolidate_checkpoint(posix_file_system(), reader, (dir / "out").string(), {}), Error);
  CHECK(test::read_all(dir / "out" / "keep.txt") == std::vector<std::uint8_t>{'k'});
}

// ---- removal --------------------------------------------------------------------------

TEST_CASE("remove_checkpoint removes a checkpoint and refuses the one latest names") {
  test::TempDir dir;
  const FlatModel model(5003);
  model.save(dir.path().string(), 2, 5);
  model.save(dir.path().string(), 2, 6);
  CHECK_THROWS_AS(remove_checkpoint(posix_file_system(), dir.path().string(), checkpoint_dir_name(6)), Error);
  remove_checkpoint(posix_file_system(), dir.path().string(), checkpoint_dir_name(5));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path())) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{".lock", "latest", checkpoint_dir_name(6)});
  try {
    remove_checkpoint(posix_file_system(), dir.path().string(), checkpoint_dir_name(5));
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::not_found);
  }
}
