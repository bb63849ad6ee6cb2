// SPDX-License-Identifier: Apache-2.0
// Shared by the io tests: a checkpoint with every dtype, empty and odd-sized tensors.
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/testing/fault_injection.hpp"
#include "support/test_support.hpp"

namespace ckpt::test {

struct RankPayload {
  std::vector<std::vector<std::uint8_t>> blobs;
};

/// Tensors for `world` ranks at `step`; payload bytes depend on (rank, step).
struct Fixture {
  std::vector<RankPayload> payload;
  SaveRequest request;

  Fixture(int world, std::uint64_t step, std::uint64_t chunk = 4096) {
    struct Spec {
      const char* name;
      DType t;
      std::vector<std::uint64_t> shape;
    };
    const std::vector<Spec> specs = {{"f16", DType::F16, {3, 5}},     {"bf16", DType::BF16, {7}},   {"f32", DType::F32, {33, 31}},
                                     {"f64", DType::F64, {5}},        {"i32", DType::I32, {1}},     {"i64", DType::I64, {2, 2}},
                                     {"u8", DType::U8, {4097}},       {"empty", DType::F32, {0}},   {"scalar", DType::F32, {}}};
    payload.resize(static_cast<std::size_t>(world));
    request.step = step;
    request.wall_clock_seconds = 12.5;
    request.chunk_size = chunk;
    request.param_numel = 1000u * static_cast<std::uint64_t>(world);
    json_of(request.training)["lr"] = 0.001;
    for (int r = 0; r < world; ++r) {
      RankState rs;
      auto& p = payload[static_cast<std::size_t>(r)];
      for (const auto& s : specs) {
        std::uint64_t n = 1;
        for (auto d : s.shape) n *= d;
        p.blobs.push_back(random_bytes(n * dtype_size(s.t), step * 1000 + static_cast<std::uint64_t>(r) * 17 + p.blobs.size()));
      }
      for (std::size_t i = 0; i < specs.size(); ++i)
        rs.tensors.push_back({specs[i].name, specs[i].t, specs[i].shape, std::as_bytes(std::span(p.blobs[i]))});
      rs.param_shard_offset = 1000u * static_cast<std::uint64_t>(r);
      rs.param_shard_numel = 1000;
      json_of(rs.metadata)["data_position"] = static_cast<std::int64_t>(step * 4 + static_cast<std::uint64_t>(r));
      request.ranks.push_back(std::move(rs));
    }
  }
};

/// The mutating file-system operations one synchronous save of `request` performs, counted on
/// a scratch root: the tests that cut a save after each of them (a crash, a power loss) walk
/// k = 0..this.
inline std::uint64_t mutations_of_one_save(const SaveRequest& request) {
  testing::FaultInjectionFileSystem counter(posix_file_system());
  TempDir probe;
  save_checkpoint_sync(counter, probe.path().string(), request);
  return counter.mutations();
}

/// The fixture's checkpoint of `world` ranks at `step` (every dtype), saved in a fresh root.
struct SavedCheckpoint {
  TempDir dir;
  Fixture fx;
  Manifest m;
  explicit SavedCheckpoint(int world = 2, std::uint64_t step = 10) : fx(world, step) {
    m = save_checkpoint_sync(posix_file_system(), dir.path().string(), fx.request);
  }
  std::string root() const { return dir.path().string(); }
  std::filesystem::path ckpt_dir() const { return dir / checkpoint_dir_name(m.step); }
  std::filesystem::path shard(int r) const { return ckpt_dir() / m.shards[static_cast<std::size_t>(r)].path; }
  CheckpointReader open() const { return CheckpointReader::open(posix_file_system(), ckpt_dir().string()); }
  /// The saved bytes of tensor `name` of rank r (fails the test if there is none).
  std::span<const std::byte> saved(int r, std::string_view name) const {
    for (const auto& t : fx.request.ranks[static_cast<std::size_t>(r)].tensors)
      if (t.name == name) return t.data;
    FAIL("no tensor " << name << " in the fixture");
    return {};
  }
};

/// Counts the bytes read through the files it opens.
class CountingFileSystem : public FileSystemWrapper {
 public:
  using FileSystemWrapper::FileSystemWrapper;
  std::atomic<std::uint64_t> bytes{0};
  std::unique_ptr<ReadableFile> open_read(const std::string& path) override {
    struct Counted : ReadableFile {
      std::unique_ptr<ReadableFile> f;
      std::atomic<std::uint64_t>* n;
      std::uint64_t size() const override { return f->size(); }
      void read_at(std::uint64_t off, std::span<std::byte> d) const override {
        f->read_at(off, d);
        *n += d.size();
      }
      const std::string& path() const noexcept override { return f->path(); }
    };
    auto c = std::make_unique<Counted>();
    c->f = target().open_read(path);
    c->n = &bytes;
    return c;
  }
};

/// Rewrites the manifest.json of checkpoint directory `dir` as `m` with rank's tensor `name`
/// given another dtype: an edited index over an intact shard, whose own header still says
/// what was saved (use a dtype of the same element size, or decode_manifest refuses it).
inline void write_index_dtype(const std::filesystem::path& dir, Manifest m, std::string_view name, int rank, DType dtype) {
  for (auto& t : m.tensors)
    if (t.name == name && t.rank == rank) t.dtype = dtype;
  const std::string text = encode_manifest(m);
  write_all(dir / "manifest.json", std::vector<std::uint8_t>(text.begin(), text.end()));
}

}  // namespace ckpt::test
