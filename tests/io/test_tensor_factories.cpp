// SPDX-License-Identifier: Apache-2.0
// The API that states less by hand: ckpt::tensor and ckpt::load_target infer the dtype from
// the element type (dtype_of) and the shape from the element count, and the calls that take a
// FileSystem have overloads on the POSIX one. A save stated with them loads back, through
// them, into the caller's memory, equal.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "ckpt/core/error.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/store/store.hpp"
#include "support/test_support.hpp"

using namespace ckpt;

static_assert(dtype_of<float>() == DType::F32);
static_assert(dtype_of<const double>() == DType::F64);
static_assert(dtype_of<std::int8_t>() == DType::I8);
static_assert(dtype_of<std::int16_t>() == DType::I16);
static_assert(dtype_of<std::int32_t>() == DType::I32);
static_assert(dtype_of<std::int64_t>() == DType::I64);
static_assert(dtype_of<std::uint8_t>() == DType::U8);
static_assert(dtype_of<std::uint16_t>() == DType::U16);
static_assert(dtype_of<std::uint32_t>() == DType::U32);
static_assert(dtype_of<std::uint64_t>() == DType::U64);
static_assert(dtype_of<bool>() == DType::BOOL);

TEST_CASE("ckpt::tensor infers dtype and shape, takes another shape of the same count, and refuses one of another count") {
  std::vector<float> w(12, 1.5f);
  const TensorView t = tensor("w", w);
  CHECK(t.name == "w");
  CHECK(t.dtype == DType::F32);
  CHECK(t.shape == std::vector<std::uint64_t>{12});
  CHECK(t.data.data() == reinterpret_cast<const std::byte*>(w.data()));
  CHECK(t.data.size() == 48);
  CHECK_FALSE(t.sharding.has_value());
  const TensorView m = tensor("m", std::span<float>(w), {3, 4}, rank_local());
  CHECK(m.shape == std::vector<std::uint64_t>{3, 4});
  CHECK(m.sharding.has_value());
  const std::int64_t counter = 7;
  const TensorView c = tensor("step", std::span<const std::int64_t>(&counter, 1));
  CHECK(c.dtype == DType::I64);
  const Error e = test::expect_error([&] { (void)tensor("w", w, {5, 5}); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.file() == "w");
  CHECK(e.expected() == "12 elements");
  CHECK(e.actual() == "25 elements");
}

TEST_CASE("a save stated with ckpt::tensor loads back through ckpt::load_target and the default file system, equal") {
  test::TempDir dir;
  const std::string root = (dir.path() / "root").string();
  std::vector<float> w(1000);
  std::vector<std::uint16_t> ids(64);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.25f;
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::uint16_t>(i * 3);
  SaveRequest req;
  req.step = 5;
  req.param_numel = w.size();
  RankState rs;
  rs.tensors = {tensor("w", w, {10, 100}), tensor("ids", ids)};
  rs.param_shard_numel = w.size();
  req.ranks.push_back(std::move(rs));
  save_checkpoint_sync(root, req);
  CHECK(read_latest(root) == std::optional<std::string>("step-0000000005"));
  CHECK(list_checkpoints(root).size() == 1);
  auto opened = open_latest(root, {.expected_world_size = 1});
  std::vector<float> w_back(1000, -1.0f);
  std::vector<std::uint16_t> ids_back(64, 0);
  const LoadTarget into[] = {load_target("w", w_back, {10, 100}), load_target("ids", ids_back)};
  CHECK(into[0].dtype == DType::F32);
  CHECK(into[1].dtype == DType::U16);
  load_into(opened.reader, 0, into, Verify::full);
  CHECK(w_back == w);
  CHECK(ids_back == ids);
  // A target whose inferred dtype is not the tensor's is refused, as any LoadTarget is.
  std::vector<double> wrong(1000);
  const LoadTarget bad[] = {load_target("w", wrong, {10, 100})};
  const Error e = test::expect_error([&] { load_into(opened.reader, 0, bad, Verify::fast); });
  CHECK(e.code() != Errc::io_error);
  CHECK(std::string(e.what()).find("F32") != std::string::npos);
  const auto step = open_step(root, 5, 1);
  CHECK(step.manifest().step == 5);
}
