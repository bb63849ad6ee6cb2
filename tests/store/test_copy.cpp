// SPDX-License-Identifier: Apache-2.0
// The copy between stores (store/copy.hpp) where it fails or is handed pieces out of order:
// what the conformance suite's copy case does not reach.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "ckpt/core/error.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/copy.hpp"
#include "ckpt/store/store.hpp"
#include "io/io_fixture.hpp"

namespace {

using namespace ckpt;
namespace fs = std::filesystem;

bool has_temporary(const fs::path& root) {
  for (const auto& e : fs::directory_iterator(root))
    if (is_temporary_name(e.path().filename().string())) return true;
  return false;
}

// Rewrites the source's manifest with rank 0's whole-file SHA-256 replaced: every chunk's
// XXH3 still matches, only a whole-file check can tell.
void forge_sha256(const test::SavedCheckpoint& src) {
  Manifest m = src.m;
  std::string& sha = m.shards.front().sha256;
  sha[0] = sha[0] == '0' ? '1' : '0';
  const std::string text = encode_manifest(m);
  test::write_all(src.ckpt_dir() / "manifest.json", std::vector<std::uint8_t>(text.begin(), text.end()));
}

// A target that keeps what it is given in memory, and hands every piece of a shard to the
// check last piece first: the order an object store's parallel part uploads may take.
class ReversedTarget final : public StepTarget {
 public:
  explicit ReversedTarget(std::uint64_t step) : step_(step) {}
  ~ReversedTarget() override { abort(); }
  std::uint64_t step() const noexcept override { return step_; }
  const std::string& shard_dir(int) const override { throw Error(Errc::invalid_argument, "memory", "no files"); }
  FileSystem* file_system() const noexcept override { return nullptr; }
  void write_shard(int rank, const std::string&, const ReadableFile& source, const PieceCheck& check, PieceSize pieces) override {
    std::vector<std::byte> all(source.size());
    source.read_at(0, all);
    const std::uint64_t piece = std::max<std::uint64_t>(pieces.bytes / pieces.multiple, 1) * pieces.multiple;
    std::vector<std::uint64_t> starts;
    for (std::uint64_t at = 0; at < all.size(); at += piece) starts.push_back(at);
    std::reverse(starts.begin(), starts.end());
    for (const std::uint64_t at : starts)
      check(at, std::span<const std::byte>(all).subspan(at, std::min<std::uint64_t>(piece, all.size() - at)));
    pieces_ += starts.size();
    shards[rank] = std::move(all);
  }
  std::map<int, std::vector<std::byte>> shards;
  std::string committed_text;
  std::size_t pieces_ = 0;

 protected:
  std::string commit_step(Manifest, std::vector<RedundancyBlock>, std::string text) override {
    committed_text = std::move(text);
    return "memory";
  }
  void abort_step() noexcept override {}

 private:
  std::uint64_t step_;
};

TEST_CASE("a copy of a checkpoint with a flipped byte is refused naming the source file and chunk, and the destination keeps what it had") {
  const test::SavedCheckpoint older(2, 5);
  const test::SavedCheckpoint src(2, 10);
  const test::TempDir out;
  const auto dst = open_store((out / "durable").string());
  copy_checkpoint(*open_store(older.root()), 5, *dst->writer());
  REQUIRE(dst->latest() == std::optional<std::uint64_t>(5));

  // A byte in the middle of rank 1's second chunk.
  const ShardRecord& s = src.m.shards[1];
  REQUIRE(s.chunk_xxh3.size() >= 2);
  auto bytes = test::read_all(src.shard(1));
  bytes[static_cast<std::size_t>(src.m.chunk_size + 3)] ^= 0x40;
  test::write_all(src.shard(1), bytes);

  for (const Verify v : {Verify::fast, Verify::full}) {
    CAPTURE(static_cast<int>(v));
    const Error e = test::expect_error([&] { copy_checkpoint(*open_store(src.root()), 10, *dst->writer(), {.verify = v, .parallel_shards = 2}); });
    CHECK(e.code() == Errc::checksum_mismatch);
    CHECK(e.file() == src.shard(1).string());
    CHECK(std::string(e.what()).find("xxh3 of chunk 1 of " + std::to_string(s.chunk_xxh3.size())) != std::string::npos);
    // Nothing of step 10 at the destination; its latest and its checkpoint as they were.
    CHECK(dst->steps() == std::vector<std::uint64_t>{5});
    CHECK(dst->latest() == std::optional<std::uint64_t>(5));
    CHECK_FALSE(has_temporary(out / "durable"));
    dst->verify(5, Verify::full);
  }
  // Without verification the bytes go across as they are (and the destination's readers catch them).
  copy_checkpoint(*open_store(src.root()), 10, *dst->writer(), {.verify = Verify::none, .copy_record = false});
  CHECK(test::expect_error([&] { dst->verify(10, Verify::fast); }).code() == Errc::checksum_mismatch);
}

TEST_CASE("Verify::full checks each file's SHA-256 in file order whatever order the pieces arrive in, and fast the chunks only") {
  const test::SavedCheckpoint src(2, 10);
  const auto source = open_store(src.root());
  {
    ReversedTarget t(10);
    const CopyReport r = copy_into(*source, 10, t, {.verify = Verify::full, .piece_bytes = src.m.chunk_size});
    CHECK(r.sha256_verified);
    CHECK(t.pieces_ > src.m.shards.size());  // several pieces per shard, handed over last first
    for (const auto& sh : src.m.shards) {
      const auto want = test::read_all(src.shard(sh.rank));
      REQUIRE(t.shards.at(sh.rank).size() == want.size());
      CHECK(std::memcmp(t.shards.at(sh.rank).data(), want.data(), want.size()) == 0);
    }
    const auto manifest = test::read_all(src.ckpt_dir() / "manifest.json");
    CHECK(t.committed_text == std::string(manifest.begin(), manifest.end()));  // the source's bytes
  }
  forge_sha256(src);
  {
    ReversedTarget t(10);
    const Error e = test::expect_error([&] { copy_into(*source, 10, t, {.verify = Verify::full, .piece_bytes = src.m.chunk_size}); });
    CHECK(e.code() == Errc::checksum_mismatch);
    CHECK(std::string(e.what()).find("sha256 of the whole file") != std::string::npos);
  }
  ReversedTarget fast(10);
  CHECK(copy_into(*source, 10, fast, {.verify = Verify::fast, .piece_bytes = src.m.chunk_size}).chunks_verified > 0);
}

TEST_CASE("copy options out of range are refused before anything is written") {
  const test::SavedCheckpoint src(2, 10);
  const test::TempDir out;
  const auto dst = open_store((out / "d").string());
  for (const int n : {0, 65}) {
    const Error e = test::expect_error([&] { copy_checkpoint(*open_store(src.root()), 10, *dst->writer(), {.parallel_shards = n}); });
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(std::string(e.what()).find("parallel_shards") != std::string::npos);
  }
  CHECK(dst->steps().empty());
  CHECK(test::expect_error([&] { copy_checkpoint(*open_store(src.root()), 11, *dst->writer()); }).code() == Errc::not_found);
  CHECK_FALSE(has_temporary(out / "d"));
}

}  // namespace
