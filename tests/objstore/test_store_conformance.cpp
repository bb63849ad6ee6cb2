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
