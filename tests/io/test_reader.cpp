// SPDX-License-Identifier: Apache-2.0
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <atomic>
#include <filesystem>
#include <functional>

#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/store/local/commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/mapped.hpp"
#include "ckpt/read/range_reader.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/hash/file_digest.hpp"
#include <cstring>
#include "io/io_fixture.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
using Saved = test::SavedCheckpoint;

Error load_error(const std::string& root, std::optional<int> world = {}, Verify v = Verify::fast) {
  try {
    auto opened = open_latest(posix_file_system(), root, {.expected_world_size = world});
    for (int r = 0; r < opened.reader.manifest().world_size; ++r) opened.reader.load_shard(r, v);
  } catch (const Error& e) {
    return e;
  }
  FAIL("loaded a bad checkpoint");
  return Error(Errc::aborted, "", "");
}

void flip_byte(const fs::path& p, std::size_t at) {
  auto b = test::read_all(p);
  b.at(at) ^= 0x20;
  test::write_all(p, b);
}
}  // namespace

TEST_CASE("world size mismatch fails loudly naming both sizes") {
  Saved s(4);
  const Error e = load_error(s.root(), 8);
  CHECK(e.code() == Errc::world_size_mismatch);
  CHECK(e.expected() == "8");
  CHECK(e.actual() == "4");
  CHECK(std::string(e.what()).find("world size 4") != std::string::npos);
  CHECK(e.file() == (s.ckpt_dir() / "manifest.json").string());
}

TEST_CASE("a missing shard is refused before anything is read") {
  Saved s(3);
  fs::remove(s.shard(2));
  const Error e = load_error(s.root());
  CHECK(e.code() == Errc::missing_shard);
  CHECK(e.file() == s.shard(2).string());
  CHECK(e.actual() == "missing");
}

TEST_CASE("a truncated shard is refused with expected and actual sizes") {
  Saved s;
  const auto size = fs::file_size(s.shard(1));
  for (std::uint64_t keep : {std::uint64_t{0}, std::uint64_t{7}, std::uint64_t{100}, size - 1}) {
    fs::resize_file(s.shard(1), keep);
    const Error e = load_error(s.root());
    CHECK(e.code() == Errc::size_mismatch);
    CHECK(e.expected() == std::to_string(size) + " bytes");
    CHECK(e.actual() == std::to_string(keep) + " bytes");
  }
}

TEST_CASE("a flipped byte anywhere in a shard is caught by the fast checksum with its chunk") {
  Saved s;
  const auto size = fs::file_size(s.shard(0));
  // Header length, JSON header, padding, first data byte, a chunk boundary, the last byte.
  for (std::size_t at : {std::size_t{0}, std::size_t{3}, std::size_t{9}, std::size_t{200}, std::size_t{4095}, std::size_t{4096},
                         std::size_t{8191}, std::size_t{8192}, static_cast<std::size_t>(size - 1)}) {
    CAPTURE(at);
    flip_byte(s.shard(0), at);
    const Error e = load_error(s.root());
    CHECK(e.code() == Errc::checksum_mismatch);
    CHECK(e.file() == s.shard(0).string());
    CHECK(e.detail().find("chunk " + std::to_string(at / 4096) + " of") != std::string::npos);
    CHECK(e.expected() != e.actual());
    flip_byte(s.shard(0), at);  // restore
  }
  CHECK_NOTHROW(open_latest(posix_file_system(), s.root()).reader.verify(Verify::full));
}

TEST_CASE("full verification catches a corruption the recorded chunk digests were forged to hide") {
  Saved s;
  // Rewrite the manifest so its chunk digests match a tampered shard: only SHA-256 can tell.
  flip_byte(s.shard(0), 5000);
  Manifest m = s.m;
  FileHasher h(m.chunk_size, false);
  const auto bytes = test::read_all(s.shard(0));
  h.update(std::as_bytes(std::span(bytes)));
  const auto d = h.finish();
  m.shards[0].chunk_xxh3 = d.chunk_xxh3;
  test::write_all(s.ckpt_dir() / "manifest.json",
                  [&] { auto t = encode_manifest(m); return std::vector<std::uint8_t>(t.begin(), t.end()); }());
  CHECK_NOTHROW(open_latest(posix_file_system(), s.root()).reader.load_shard(0, Verify::fast));
  const Error e = load_error(s.root(), {}, Verify::full);
  CHECK(e.code() == Errc::checksum_mismatch);
  CHECK(e.detail() == "sha256 of the whole file");
  CHECK(e.expected() == s.m.shards[0].sha256);
}

TEST_CASE("a shard that is a symlink is refused as unsafe") {
  Saved s;
  test::TempDir elsewhere;
  fs::copy_file(s.shard(1), elsewhere / "outside");
  fs::remove(s.shard(1));
  fs::create_symlink(elsewhere / "outside", s.shard(1));
  const Error e = load_error(s.root());
  CHECK(e.code() == Errc::unsafe_path);
  CHECK(e.actual() == "symlink");
}

TEST_CASE("a manifest pointing outside its directory is refused as unsafe") {
  Saved s;
  auto text = test::read_all(s.ckpt_dir() / "manifest.json");
  std::string t(text.begin(), text.end());
  const std::string from = "\"" + s.m.shards[0].path + "\"";
  t.replace(t.find(from), from.size(), "\"../../etc/passwd\"");
  test::write_all(s.ckpt_dir() / "manifest.json", std::vector<std::uint8_t>(t.begin(), t.end()));
  const Error e = load_error(s.root());
  CHECK(e.code() == Errc::unsafe_path);
  CHECK(e.actual() == "'../../etc/passwd'");
}

TEST_CASE("a shard header that disagrees with the manifest index is refused naming the tensor and the field") {
  Saved s;
  Manifest m = s.m;
  const std::vector<std::uint64_t> shape = m.tensors[0].shape;
  m.tensors[0].shape.push_back(1);  // same bytes, different shape
  auto t = encode_manifest(m);
  test::write_all(s.ckpt_dir() / "manifest.json", std::vector<std::uint8_t>(t.begin(), t.end()));
  const Error e = load_error(s.root());
  CHECK(e.code() == Errc::malformed_shard);
  CHECK(e.file() == s.shard(m.tensors[0].rank).string());
  CHECK(e.detail() == "tensor '" + m.tensors[0].name + "' disagrees with the manifest index in its shape");
  CHECK(e.expected() == format_index(m.tensors[0].shape));
  CHECK(e.actual() == format_index(shape));
}

TEST_CASE("a manifest index that calls an F32 tensor I32 is refused by every read path at every verify level, naming the field") {
  // The index edited, the shard intact: the float bits would otherwise be handed out as int32.
  Saved s;
  test::write_index_dtype(s.ckpt_dir(), s.m, "f32", 1, DType::I32);
  const std::string shard = s.shard(1).string();
  auto refused = [&](const char* what, const std::function<void()>& f) {
    CAPTURE(what);
    const Error e = test::error_of(f);
    CHECK(e.code() == Errc::malformed_shard);
    CHECK(e.file() == shard);
    CHECK(e.detail() == "tensor 'f32' disagrees with the manifest index in its dtype");
    CHECK(e.expected() == "I32");
    CHECK(e.actual() == "F32");
  };
  for (const Verify mode : {Verify::none, Verify::fast, Verify::full}) {
    CAPTURE(verify_name(mode));
    const CheckpointReader reader = s.open();  // a reader of its own: nothing checked yet
    refused("read_tensor", [&] { reader.read_tensor("f32", 1, mode); });
    refused("read_tensor of another tensor of the shard", [&] { reader.read_tensor("u8", 1, mode); });
    refused("read_tensor_range", [&] { reader.read_tensor_range("f32", 1, 0, 1, mode); });
    refused("ShardRangeReader", [&] { (void)ShardRangeReader(reader, 1, mode); });
    refused("stream_shard", [&] { reader.stream_shard(1, mode, [](std::uint64_t, std::span<const std::byte>) { FAIL("a chunk reached the sink"); }); });
    refused("MappedShard", [&] { (void)MappedShard(reader, 1, mode); });
    refused("load_shard", [&] { reader.load_shard(1, mode); });
    refused("verify_shard", [&] { reader.verify_shard(1, mode); });
    refused("check_shard_header", [&] { reader.check_shard_header(1, mode); });
    CHECK_NOTHROW(reader.check_shard_header(0, mode));  // rank 0's index is untouched
  }
}

TEST_CASE("a shard header is read and checked once per reader and its copies, not once per tensor read") {
  Saved s;
  test::CountingFileSystem counting(posix_file_system());
  const CheckpointReader reader = CheckpointReader::open(counting, s.ckpt_dir().string());
  std::uint64_t data_start = s.m.shards[1].size;
  for (const auto& t : s.m.tensors)
    if (t.rank == 1) data_start = std::min(data_start, t.begin);
  const TensorRecord& u8 = *s.m.find_tensor("u8", 1);
  // The first read: the header (its 8-byte length, then the rest) and the tensor's bytes.
  std::uint64_t before = counting.bytes;
  reader.read_tensor("u8", 1, Verify::none);
  CHECK(counting.bytes - before == data_start + (u8.end - u8.begin));
  // Every later read of this reader, or of a copy of it, reads the tensor alone.
  const CheckpointReader copy = reader;
  for (int i = 0; i < 10; ++i) {
    before = counting.bytes;
    (i % 2 ? copy : reader).read_tensor("u8", 1, Verify::none);
    CHECK(counting.bytes - before == u8.end - u8.begin);
  }
  // Another reader of the same checkpoint checks for itself.
  const CheckpointReader other = CheckpointReader::open(counting, s.ckpt_dir().string());
  before = counting.bytes;
  other.read_tensor("u8", 1, Verify::none);
  CHECK(counting.bytes - before == data_start + (u8.end - u8.begin));
}

TEST_CASE("a header damaged without a reseal is the checksum mismatch of its chunk with verify fast, malformed with none") {
  Saved s;
  // "dtype" becomes "Dtype" in the JSON: a field no header may have.
  const auto file = test::read_all(s.shard(1));
  const std::string text(file.begin(), file.end());
  flip_byte(s.shard(1), text.find("\"dtype\"") + 1);
  const CheckpointReader reader = s.open();
  for (const Verify mode : {Verify::fast, Verify::full}) {
    const Error e = test::error_of([&] { reader.read_tensor("u8", 1, mode); });
    CHECK(e.code() == Errc::checksum_mismatch);
    CHECK(e.file() == s.shard(1).string());
    CHECK(e.detail().starts_with("xxh3 of chunk 0 of "));
  }
  const Error e = test::error_of([&] { reader.read_tensor("u8", 1, Verify::none); });
  CHECK(e.code() == Errc::malformed_shard);
  CHECK(e.file() == s.shard(1).string());
}

TEST_CASE("a missing or bad latest is reported, and fallback finds the newest good checkpoint") {
  test::TempDir dir;
  const std::string root = dir.path().string();
  test::Fixture a(1, 1), b(1, 2);
  save_checkpoint_sync(posix_file_system(), root, a.request);
  const Manifest mb = save_checkpoint_sync(posix_file_system(), root, b.request);
  // Corrupt the newest checkpoint: latest names it.
  flip_byte(dir / "step-0000000002" / mb.shards[0].path, 5000);
  CHECK(load_error(root).code() == Errc::checksum_mismatch);
  auto opened = open_latest(posix_file_system(), root, {.fallback = true});
  CHECK(opened.name == "step-0000000001");
  CHECK(opened.fell_back);
  CHECK(opened.note.find("checksum mismatch") != std::string::npos);
  // latest missing entirely.
  fs::remove(dir / "latest");
  try {
    open_latest(posix_file_system(), root);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::not_found);
  }
  CHECK(open_latest(posix_file_system(), root, {.fallback = true}).name == "step-0000000001");
  // latest with garbage.
  test::write_all(dir / "latest", {'.', '.', '/', 'x'});
  CHECK(load_error(root).code() == Errc::malformed_manifest);
  CHECK(open_latest(posix_file_system(), root, {.fallback = true}).name == "step-0000000001");
}

TEST_CASE("a single tensor is read by name from the chunks that cover it, verified") {
  Saved s(2);
  auto reader = open_latest(posix_file_system(), s.root()).reader;
  const auto got = reader.read_tensor("f32", 1);
  const auto& want = s.fx.payload[1].blobs[2];
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), want.size()) == 0);
  CHECK(reader.read_tensor("empty", 0).empty());
  CHECK_THROWS_AS(reader.read_tensor("nope", 0), Error);
  // A flipped byte in another chunk of the same shard does not affect this read...
  const TensorRecord* t = reader.manifest().find_tensor("f32", 1);
  const std::uint64_t outside = t->end + 4096 < s.m.shards[1].size ? t->end + 4096 : 0;
  if (outside) {
    flip_byte(s.shard(1), outside);
    CHECK(reader.read_tensor("f32", 1).size() == want.size());
    flip_byte(s.shard(1), outside);
  }
  // ...but one inside its range is caught.
  flip_byte(s.shard(1), t->begin + 1);
  try {
    reader.read_tensor("f32", 1);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::checksum_mismatch);
  }
}

TEST_CASE("ls reports complete, in-progress and corrupt checkpoints") {
  Saved s(1, 3);
  test::Fixture b(1, 5);
  const Manifest mb = save_checkpoint_sync(posix_file_system(), s.root(), b.request);
  fs::create_directory(s.dir / ".tmp-step-0000000004-1-0");
  fs::resize_file(s.dir / "step-0000000005" / mb.shards[0].path, 10);
  const auto list = list_checkpoints(posix_file_system(), s.root(), Verify::fast);
  REQUIRE(list.size() == 3);
  CHECK(list[0].state == CheckpointState::in_progress);
  CHECK(list[1].state == CheckpointState::complete);
  CHECK(list[1].step == 3u);
  CHECK(list[2].state == CheckpointState::corrupt);
  CHECK(list[2].is_latest);
  CHECK(list[2].error.find("size mismatch") != std::string::npos);
}
