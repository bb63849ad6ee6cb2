// SPDX-License-Identifier: Apache-2.0
// ckpt reshard and consolidate on checkpoints the trainer did not write: the README's
// synchronous-core snippet, the training-loop example, and tensor-parallel style layouts
// described with slice / replicated / rank_local.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <filesystem>
#include <numeric>

#include "ckpt/ckpt.hpp"
#include "ckpt/read/slice_load.hpp"
#include "ckpt_tool_fixture.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using test::ckpt_run;
namespace fs = std::filesystem;

namespace {
const std::string kBin = std::string(CKPT_TEST_BINARY_DIR) + "/bin/";

// The README's synchronous-core snippet, as written there, at world 4.
void readme_snippet(const std::string& root, std::vector<std::vector<float>>& master) {
  const int world = 4;
  const std::uint64_t n = 1000, total_params = n * world;
  std::vector<std::uint64_t> offset;
  for (int r = 0; r < world; ++r) {
    master.emplace_back(n);
    std::iota(master.back().begin(), master.back().end(), static_cast<float>(r * n));
    offset.push_back(static_cast<std::uint64_t>(r) * n);
  }
  ckpt::SaveRequest req;  // all ranks' state, saved from one thread
  req.step = 10;
  req.param_numel = total_params;
  for (int r = 0; r < world; ++r) {
    ckpt::RankState rs;
    rs.tensors = {{"master", ckpt::DType::F32, {n}, std::as_bytes(std::span(master[r])), std::nullopt}};
    rs.param_shard_offset = offset[r];
    rs.param_shard_numel = n;
    req.ranks.push_back(std::move(rs));
  }
  ckpt::save_checkpoint_sync(ckpt::posix_file_system(), root, req);  // durable when it returns
}

// The tensor `name` of a safetensors file, as floats.
std::vector<float> tensor_of(const fs::path& file, const std::string& name, std::vector<std::uint64_t>* shape = nullptr) {
  const auto bytes = test::read_all(file);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[static_cast<std::size_t>(i)];
  const auto header = boost::json::parse(std::string_view(reinterpret_cast<const char*>(bytes.data()) + 8, n)).as_object();
  const auto& t = header.at(name).as_object();
  const auto& off = t.at("data_offsets").as_array();
  if (shape) {
    shape->clear();
    for (const auto& d : t.at("shape").as_array()) shape->push_back(d.to_number<std::uint64_t>());
  }
  const std::size_t b = 8 + n + off[0].to_number<std::size_t>(), e = 8 + n + off[1].to_number<std::size_t>();
  std::vector<float> out((e - b) / 4);
  std::memcpy(out.data(), bytes.data() + b, e - b);
  return out;
}
}  // namespace

TEST_CASE("the README's synchronous-core checkpoint consolidates, reshards and compares equal to its reshard") {
  test::TempDir dir;
  std::vector<std::vector<float>> master;
  readme_snippet((dir / "run1").string(), master);
  auto r = ckpt_run("consolidate " + (dir / "run1").string() + " " + (dir / "model").string());
  INFO(r.out);
  REQUIRE(r.status == 0);
  CHECK(r.out.find("cannot be resharded") == std::string::npos);
  std::vector<std::uint64_t> shape;
  const auto whole = tensor_of(dir / "model" / "model.safetensors", "master", &shape);
  CHECK(shape == std::vector<std::uint64_t>{4000});
  std::vector<float> expect(4000);
  std::iota(expect.begin(), expect.end(), 0.0f);
  CHECK(whole == expect);
  CHECK_FALSE(fs::exists(dir / "model" / "config.json"));  // no training.config recorded
  r = ckpt_run("reshard " + (dir / "run1").string() + " " + (dir / "run3").string() + " --world-size 3");
  REQUIRE(r.status == 0);
  const auto three = CheckpointReader::open(posix_file_system(), (dir / "run3" / "step-0000000010").string());
  CHECK(three.manifest().world_size == 3);
  CHECK(three.manifest().find_tensor("master", 2)->sharding == slice_of("master", {4000}, {2667}, {1333}));
  r = ckpt_run("reshard " + (dir / "run3").string() + " " + (dir / "back").string() + " --world-size 4");
  REQUIRE(r.status == 0);
  for (int k = 0; k < 4; ++k) {
    const auto back = CheckpointReader::open(posix_file_system(), (dir / "back" / "step-0000000010").string());
    const auto s = back.load_shard(k, Verify::full);
    REQUIRE(s.tensors.size() == 1);
    CHECK(std::memcmp(s.tensors[0].data.data(), master[static_cast<std::size_t>(k)].data(), 4000) == 0);
  }
  r = ckpt_run("diff " + (dir / "run1").string() + " " + (dir / "run3").string());
  INFO(r.out);
  CHECK(r.status == 0);
}

TEST_CASE("the training-loop example's checkpoint consolidates") {
  test::TempDir dir;
  int status = -1;
  test::run_command(kBin + "ckpt-training-loop --dir " + (dir / "loop").string() + " --steps 4 --every 2 >/dev/null 2>&1", &status);
  REQUIRE(status == 0);
  const auto r = ckpt_run("consolidate " + (dir / "loop").string() + " " + (dir / "model").string() + " --json");
  INFO(r.out);
  REQUIRE(r.status == 0);
  std::vector<std::uint64_t> shape;
  tensor_of(dir / "model" / "model.safetensors", "weights", &shape);
  CHECK(shape == std::vector<std::uint64_t>{4u << 18});
}

TEST_CASE("a tensor-parallel style checkpoint reshards 2 to 3 to 2 byte-identical and consolidates under global names") {
  // Column slices of "qkv" [6, 8], row slices of "proj" [8, 6] (uneven at 3), a replicated
  // bias, a rank-local RNG.
  test::TempDir dir;
  const auto fill = [](std::uint64_t n, float base) {
    std::vector<float> v(n);
    std::iota(v.begin(), v.end(), base);
    return v;
  };
  const std::vector<float> qkv = fill(48, 0), proj = fill(48, 100), bias = fill(6, 500);
  const auto box = [](const std::vector<float>& g, std::uint64_t C, const TensorSharding& d) {
    std::vector<float> out;
    for (std::uint64_t i = 0; i < d.lengths[0]; ++i)
      for (std::uint64_t j = 0; j < d.lengths[1]; ++j) out.push_back(g[(d.offsets[0] + i) * C + d.offsets[1] + j]);
    return out;
  };
  std::vector<std::vector<float>> keep;
  std::vector<std::uint64_t> rng{11, 22};
  SaveRequest req;
  req.step = 5;
  for (int r = 0; r < 2; ++r) {
    const TensorSharding a = column_slice("qkv", 6, 8, r, 2), b = row_slice("proj", 8, 6, r, 2);
    keep.push_back(box(qkv, 8, a));
    keep.push_back(box(proj, 6, b));
    RankState rs;
    rs.tensors.push_back({"qkv.part", DType::F32, a.lengths, std::as_bytes(std::span(keep[keep.size() - 2])), a});
    rs.tensors.push_back({"proj.part", DType::F32, b.lengths, std::as_bytes(std::span(keep.back())), b});
    rs.tensors.push_back({"bias", DType::F32, {6}, std::as_bytes(std::span(bias)), replicated({0, 1})});
    rs.tensors.push_back({"rng", DType::U64, {1}, std::as_bytes(std::span(rng).subspan(static_cast<std::size_t>(r), 1)), rank_local()});
    req.ranks.push_back(std::move(rs));
  }
  save_checkpoint_sync(posix_file_system(), (dir / "tp2").string(), req);
  REQUIRE(ckpt_run("reshard " + (dir / "tp2").string() + " " + (dir / "tp3").string() + " --world-size 3").status == 0);
  const auto three = CheckpointReader::open(posix_file_system(), (dir / "tp3" / "step-0000000005").string());
  CHECK(three.manifest().find_tensor("qkv.part", 2)->sharding == column_slice("qkv", 6, 8, 2, 3));  // kept along columns
  CHECK(three.manifest().find_tensor("proj.part", 2)->sharding == row_slice("proj", 8, 6, 2, 3));
  CHECK(three.manifest().find_tensor("bias", 0)->sharding->holders == std::vector<int>{0, 1, 2});
  CHECK(three.manifest().find_tensor("rng", 2) == nullptr);  // rank-local: rank 2 is new
  REQUIRE(ckpt_run("reshard " + (dir / "tp3").string() + " " + (dir / "back").string() + " --world-size 2").status == 0);
  const auto back = CheckpointReader::open(posix_file_system(), (dir / "back" / "step-0000000005").string());
  const auto orig = CheckpointReader::open(posix_file_system(), (dir / "tp2" / "step-0000000005").string());
  for (int r = 0; r < 2; ++r) {
    // Rank 1 got the bias back through its holders, so compare by index entries.
    for (const auto& t : orig.manifest().tensors) {
      if (t.rank != r) continue;
      CAPTURE(t.name);
      const TensorRecord* u = back.manifest().find_tensor(t.name, r);
      REQUIRE(u);
      CHECK(u->sharding == t.sharding);
      CHECK(back.read_tensor(t.name, r) == orig.read_tensor(t.name, r));
    }
  }
  auto r = ckpt_run("diff " + (dir / "tp2").string() + " " + (dir / "tp3").string());
  INFO(r.out);
  CHECK(r.status == 0);
  r = ckpt_run("consolidate " + (dir / "tp3").string() + " " + (dir / "model").string());
  REQUIRE(r.status == 0);
  CHECK(tensor_of(dir / "model" / "model.safetensors", "qkv") == qkv);
  CHECK(tensor_of(dir / "model" / "model.safetensors", "proj") == proj);
  CHECK(tensor_of(dir / "model" / "model.safetensors", "bias") == bias);
  // An independent reader (numpy, written from docs/format.md alone) reassembles the same.
  int status = -1;
  test::run_command("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1", &status);
  if (status != 0) {
    MESSAGE("no python3 with numpy: the independent reassembly is skipped");
    return;
  }
  const std::string out = test::run_command("/usr/bin/python3 " + std::string(CKPT_SOURCE_DIR) + "/tests/tools/reassemble_numpy.py " +
                                                (dir / "tp3" / "step-0000000005").string() + " " + (dir / "model" / "model.safetensors").string() + " 2>&1",
                                            &status);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("qkv: equal [6, 8]") != std::string::npos);
  CHECK(out.find("proj: equal [8, 6]") != std::string::npos);
  CHECK(out.find("bias: equal [6]") != std::string::npos);
}
