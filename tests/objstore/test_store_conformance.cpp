// SPDX-License-Identifier: Apache-2.0
// The conformance suite (store/conformance.hpp) over the object store, on the real RGW: the
// same cases as a directory and the node sets pass (tests/store/test_conformance.cpp).
#include "store/conformance.hpp"

#include "ckpt/store/object/object_commit.hpp"
#include "objstore/rgw_fixture.hpp"

namespace {

using namespace ckpt;

struct ObjectStoreKind {
  static constexpr const char* name = "object store";
  static constexpr int world = 2;
  static constexpr bool file_backed = false;
  S3Options options = test::rgw_options(test::unique_prefix("conformance"));
  std::unique_ptr<ObjectStore> client = open_s3(options);
  std::unique_ptr<CheckpointStore> open() {
    StoreOptions o;
    o.object_store = client.get();
    auto s = open_store(options.root, o);
    REQUIRE(s->kind() == StoreKind::object_store);
    return s;
  }
  // The checkpoint manifest the tier manifest commits, rewritten: its SHA-256 no longer matches.
  void damage_manifest(std::uint64_t step) {
    const ObjectManifest tier = read_object_manifest(*client, step);
    client->put(tier.data_prefix + "manifest.json", test::bytes_of("{not json"));
  }
  void leave_crashed_save(std::uint64_t) {}
  bool has_leftovers() { return false; }
};

}  // namespace

TEST_CASE_TEMPLATE_INVOKE(store_conformance, ObjectStoreKind);

namespace {

// Counts the bytes ranged GETs return.
class CountingStore : public ckpt::ObjectStoreWrapper {
 public:
  using ObjectStoreWrapper::ObjectStoreWrapper;
  std::atomic<std::uint64_t> got{0};
  void get_range(std::string_view key, std::uint64_t offset, std::span<std::byte> out) override {
    ObjectStoreWrapper::get_range(key, offset, out);
    got += out.size();
  }
};

}  // namespace

TEST_CASE("an object store's listing without a verify level downloads manifests and shard headers, not the shards") {
  using namespace ckpt;
  ObjectStoreKind kind;
  CountingStore counting(*kind.client);
  StoreOptions o;
  o.object_store = &counting;
  auto store = open_store(kind.options.root, o);
  std::uint64_t shard_bytes = 0;
  {
    auto w = store->writer();
    for (std::uint64_t step = 1; step <= 3; ++step) {
      const test::SourceCheckpoint src(2, step);
      test::put_checkpoint(*w, src);
      for (const auto& s : src.manifest().shards) shard_bytes += s.size;
    }
  }
  counting.got = 0;
  const auto list = store->list(Verify::none);
  REQUIRE(list.size() == 3);
  for (const auto& c : list) CHECK(c.state == CheckpointState::complete);
  const std::uint64_t listed = counting.got.load();
  MESSAGE("listing 3 checkpoints of " << shard_bytes << " shard bytes downloaded " << listed << " bytes");
  // The manifests and each shard's header (its first few KiB) only: before, a listing
  // downloaded every shard whole (here 74 KB of shards, 33 KB of headers and manifests).
  CHECK(listed < shard_bytes);
  counting.got = 0;
  (void)store->list(Verify::fast);
  CHECK(counting.got.load() >= shard_bytes);  // every byte, with a verify level
}

#include "ckpt/store/copy.hpp"
#include "support/node_checkpoint.hpp"
#include "ckpt/runtime/checkpointer.hpp"

TEST_CASE("a node set's checkpoint goes to the object store as one of one root, verified in full, and comes back into a node set of its layout with its parity computed again") {
  using namespace ckpt;
  ObjectStoreKind kind;
  const test::TempDir dir;
  const test::Fixture fx(3, 10);
  RedundancyScheme rs{};
  rs.kind = RedundancyScheme::Kind::reed_solomon;
  rs.k = 2, rs.m = 1;
  const Manifest m = test::save_node_checkpoint(posix_file_system(), (dir / "set").string(), 3, rs, fx.request);
  const auto set = open_store((dir / "set").string());
  REQUIRE(set->kind() == StoreKind::node_set);
  const auto object = kind.open();
  const CopyReport up = copy_checkpoint(*set, 10, *object->writer(), {.verify = Verify::full});
  CHECK(up.sha256_verified);
  const auto there = object->manifest(10);
  CHECK_FALSE(there->nodes);
  CHECK(there->redundancy.empty());
  CHECK(there->shards.size() == m.shards.size());
  object->verify(10, Verify::full);
  // Back into a fresh node set of the same layout: every shard as it was, the parity recomputed
  // and whole (a node lost from it is rebuilt).
  const auto back = open_store((dir / "back").string(), {.nodes = m.nodes});
  copy_checkpoint(*object, 10, *back->writer(), {.verify = Verify::full, .parallel_shards = 3});
  const auto h = back->health(10, Verify::full);
  REQUIRE(h);
  CHECK(h->healthy());
  CHECK(back->manifest(10)->redundancy.size() == m.redundancy.size());
  for (const auto& s : m.shards) {
    const auto a = set->shard(10, s), b = back->shard(10, s);
    std::vector<std::byte> x(a->size()), y(b->size());
    a->read_at(0, x);
    b->read_at(0, y);
    CHECK(x == y);
  }
  std::filesystem::remove_all(dir / "back" / "node-1");
  const auto reports = open_store((dir / "back").string())->writer()->repair(10, Verify::full);
  CHECK_FALSE(reports.empty());
  CHECK(open_store((dir / "back").string())->health(10, Verify::full)->healthy());
}

TEST_CASE("a checkpoint with a rank in several files goes to the object store and back file by file, each tensor read from its file") {
  using namespace ckpt;
  ObjectStoreKind kind;
  const test::TempDir dir;
  // Rank 0's "a" and "b" (16 KiB each) in two files (max_file_bytes 16 KiB).
  const auto a = test::random_bytes(16384, 1), b = test::random_bytes(16384, 2);
  {
    Checkpointer ckpt({.root = (dir.path() / "local").string(), .world_size = 1, .max_file_bytes = 16384});
    const std::vector<TensorView> views{{"a", DType::U8, {a.size()}, std::as_bytes(std::span(a))}, {"b", DType::U8, {b.size()}, std::as_bytes(std::span(b))}};
    ckpt.save_sync(0, 10, views, SaveInfo{});
  }
  const auto local = open_store((dir.path() / "local").string());
  const auto object = kind.open();
  copy_checkpoint(*local, 10, *object->writer(), {.verify = Verify::full});
  const auto there = object->manifest(10);
  REQUIRE(there->shards.size() == 2);
  CHECK(there->schema_version == 3);
  object->verify(10, Verify::full);
  const ObjectCheckpoint ck = open_object_checkpoint(*kind.client, 10);
  for (const Verify v : {Verify::none, Verify::fast, Verify::full}) {
    const ObjectTensor got = read_object_tensor(*kind.client, ck, 0, "b", v, 1 << 20);
    CHECK(got.record.part == 1);
    CHECK(std::equal(got.data.begin(), got.data.end(), reinterpret_cast<const std::byte*>(b.data())));
  }
  // And back into a directory: both files, verified.
  const auto back = open_store((dir.path() / "back").string());
  copy_checkpoint(*object, 10, *back->writer(), {.verify = Verify::full});
  const CheckpointReader reader = back->open(10, 1);
  reader.verify(Verify::full);
  const auto got = reader.read_tensor("a", 0);
  CHECK(std::equal(got.begin(), got.end(), reinterpret_cast<const std::byte*>(a.data())));
}
