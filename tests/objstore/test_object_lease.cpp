// SPDX-License-Identifier: Apache-2.0
// The writer lease of an object-store root and the run identity its commits record, against
// the real RGW: a lease taken, renewed and released; a second writer refused naming both; a
// lease left unrenewed taken over after it expired and one more period, and its old holder
// then unable to commit; `latest` and the tier manifests naming the run, and stores written
// before run identities still read. Periods of about a second keep each case to seconds.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "ckpt/core/error.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/store/object/object_lease.hpp"
#include "ckpt/store/run_identity.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/store/tiers.hpp"
#include "ckpt/testing/fault_object_store.hpp"
#include "io/io_fixture.hpp"
#include "objstore/rgw_fixture.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
using namespace std::chrono_literals;
using test::bytes_of;
using Fault = testing::FaultInjectionObjectStore::Fault;
using Op = testing::FaultInjectionObjectStore::Op;

namespace {

constexpr ObjectLeaseOptions kShort{.period = 1000ms, .renew_every = 250ms};

// Lets the injected hangs go when the test ends, however it ends, so that a lease's renewal
// thread stuck in one can be joined.
struct Unhang {
  testing::FaultInjectionObjectStore& faults;
  ~Unhang() { faults.release_hangs(); }
};

LeaseRecord lease_of(ObjectStore& store) {
  const auto l = read_object_lease(store);
  REQUIRE(l.has_value());
  return l->record;
}

// A local root under `local` holding the committed steps `steps` of a 2-rank fixture.
std::string saved_root(const test::TempDir& local, std::initializer_list<std::uint64_t> steps) {
  const std::string root = (local / "root").string();
  for (const std::uint64_t step : steps) {
    test::Fixture fx(2, step);
    save_checkpoint_sync(posix_file_system(), root, fx.request);
  }
  return root;
}

// Waits until the lease's expires_at has passed by this host's clock.
void wait_until_expired(ObjectStore& store) {
  const auto expires = parse_rfc3339(lease_of(store).expires_at);
  REQUIRE(expires.has_value());
  std::this_thread::sleep_until(*expires + 50ms);
}

}  // namespace

TEST_CASE("a writer lease is created when there is none, renewed while it is held, and marked released when it is let go") {
  auto store = test::rgw_store("lease");
  std::string first_etag;
  {
    ObjectLease lease(*store, "run-a", kShort);
    const auto taken = read_object_lease(*store);
    REQUIRE(taken.has_value());
    CHECK(taken->record.run == "run-a");
    CHECK(taken->record.holder == lease.holder());
    CHECK(taken->record.pid == static_cast<long>(::getpid()));
    CHECK(taken->record.period == 1000ms);
    CHECK(!taken->record.released);
    CHECK(parse_rfc3339(taken->record.expires_at) > std::chrono::system_clock::now());
    first_etag = taken->etag;
    std::this_thread::sleep_for(700ms);  // two renewals or more
    const auto renewed = read_object_lease(*store);
    CHECK(renewed->etag != first_etag);
    CHECK(renewed->record.acquired_at == taken->record.acquired_at);
    CHECK(renewed->record.renewed_at > taken->record.renewed_at);
    lease.check();  // held
  }
  const LeaseRecord after = lease_of(*store);
  CHECK(after.released);
  CHECK(after.run == "run-a");
}

TEST_CASE("a second writer is refused with busy naming the holder and itself, and the holder keeps its lease") {
  auto store = test::rgw_store("lease-busy");
  ObjectLease first(*store, "run-a", kShort);
  const auto t0 = std::chrono::steady_clock::now();
  const Error e = test::error_of([&] { ObjectLease second(*store, "run-b", kShort); });
  CHECK(std::chrono::steady_clock::now() - t0 < 500ms);  // refused at once, not after a wait
  CHECK(e.code() == Errc::busy);
  CHECK(e.file() == store->name_of("lease"));
  CHECK(e.detail().find("this writer, run run-b (holder ") != std::string::npos);
  CHECK(e.detail().find(" is refused") != std::string::npos);
  CHECK(e.actual().starts_with("run run-a (holder " + first.holder() + ", pid " + std::to_string(::getpid())));
  CHECK(e.actual().find(", expires 20") != std::string::npos);
  first.check();
  CHECK(lease_of(*store).holder == first.holder());
}

TEST_CASE("a released lease is taken at once by the next writer") {
  auto store = test::rgw_store("lease-released");
  { ObjectLease first(*store, "run-a", kShort); }
  const auto t0 = std::chrono::steady_clock::now();
  ObjectLease second(*store, "run-b", kShort);
  CHECK(std::chrono::steady_clock::now() - t0 < 500ms);
  CHECK(lease_of(*store).holder == second.holder());
  CHECK(lease_of(*store).run == "run-b");
}

TEST_CASE("a lease left unrenewed is taken over one period after it expired, and its old holder then fails its check and its renewal with busy") {
  auto raw = test::rgw_store("lease-takeover");
  testing::FaultInjectionObjectStore faults(*raw);
  ObjectLease old(faults, "run-a", kShort);
  const Unhang unhang{faults};
  faults.inject(Op::put, Fault::hang, 1000);  // its renewals never reach the store: a stopped or cut-off holder
  wait_until_expired(*raw);
  // Its own clock says the lease lapsed (3/4 of the period without a renewal).
  const Error lapsed = test::error_of([&] { old.check(); });
  CHECK(lapsed.code() == Errc::busy);
  CHECK(lapsed.detail().find("the lease lapsed: no renewal succeeded for 3/4 of its 1 s period") != std::string::npos);

  const auto t0 = std::chrono::steady_clock::now();
  ObjectLease successor(*raw, "run-b", kShort);
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= 1000ms);  // watched one whole period
  CHECK(waited < 3000ms);
  CHECK(lease_of(*raw).holder == successor.holder());

  faults.release_hangs();  // the old holder reaches the store again: its next renewal meets the successor's lease
  for (int i = 0; i < 100 && !old.lost(); ++i) std::this_thread::sleep_for(20ms);
  REQUIRE(old.lost());
  const Error lost = test::error_of([&] { old.check(); });
  CHECK(lost.code() == Errc::busy);
  CHECK(lost.detail().find("the lease was taken over: this writer, run run-a (holder " + old.holder()) != std::string::npos);
  CHECK(lost.actual().starts_with("run run-b (holder " + successor.holder()));
  successor.check();
  CHECK(lease_of(*raw).holder == successor.holder());
}

TEST_CASE("a commit whose lease lapsed uploads nothing and commits nothing") {
  test::TempDir local;
  const std::string root = saved_root(local, {10});
  auto raw = test::rgw_store("lease-fence");
  testing::FaultInjectionObjectStore faults(*raw);
  ObjectLease lease(faults, "run-a", kShort);
  const Unhang unhang{faults};
  faults.inject(Op::put, Fault::hang, 1);  // the next renewal hangs until the end of the test
  std::this_thread::sleep_for(1000ms);
  const Error e = test::error_of([&] {
    commit_to_object_store(posix_file_system(), root, 10, *raw,
                           {.run = "run-a", .holder = lease.holder(), .fence = [&] { lease.check(); }});
  });
  CHECK(e.code() == Errc::busy);
  CHECK(e.detail().find("the lease lapsed") != std::string::npos);
  CHECK(raw->list("step-").objects.empty());
  CHECK(!read_object_latest(*raw).has_value());
}

TEST_CASE("a commit records its run in the tier manifest and its run and holder in latest") {
  test::TempDir local;
  const std::string root = saved_root(local, {10});
  auto store = test::rgw_store("run-identity");
  commit_to_object_store(posix_file_system(), root, 10, *store, {.run = "run-a", .holder = "holder-1"});
  CHECK(read_object_manifest(*store, 10).run == "run-a");
  const auto latest = read_object_latest(*store);
  CHECK(latest->step == 10);
  CHECK(latest->run == "run-a");
  CHECK(latest->holder == "holder-1");
  CHECK(test::text_of(store->get("latest")) == "step-0000000010\nrun run-a\nholder holder-1\n");
}

TEST_CASE("a store written before run identities reads with no run: a latest of one line and a tier manifest without run") {
  test::TempDir local;
  const std::string root = saved_root(local, {10});
  auto store = test::rgw_store("run-identity-old");
  commit_to_object_store(posix_file_system(), root, 10, *store, {.move_latest = false});
  store->put("latest", bytes_of("step-0000000010\n"));  // what an older ckpt wrote
  const std::string tier = test::text_of(store->get("step-0000000010/manifest.json"));
  CHECK(tier.find("\"run\"") == std::string::npos);
  CHECK(read_object_manifest(*store, 10).run.empty());
  const auto latest = read_object_latest(*store);
  CHECK(latest->step == 10);
  CHECK(latest->run.empty());
  CHECK(latest->holder.empty());
  test::TempDir into;
  const TieredCheckpoint t = open_latest_tiered(posix_file_system(), (into / "r").string(), *store, {.verify = Verify::full});
  CHECK(t.opened.name == "step-0000000010");
  CHECK(t.adopted_run.empty());
}

namespace {

// A store on which another writer (holder "holder-b" of run "run-a", a successor that adopted
// the run) moves `latest` to step 30 just before the next conditional put of `latest`.
class LatestThief final : public ObjectStoreWrapper {
 public:
  using ObjectStoreWrapper::ObjectStoreWrapper;
  std::string put(std::string_view key, std::span<const std::byte> data, const WriteCondition& when) override {
    if (key == "latest" && when.kind == WriteCondition::Kind::matches && !stolen_) {
      stolen_ = true;
      base().put("latest", bytes_of("step-0000000030\nrun run-a\nholder holder-b\n"));
    }
    return ObjectStoreWrapper::put(key, data, when);
  }

 private:
  bool stolen_ = false;
};

}  // namespace

TEST_CASE("a latest swap that meets another holder's latest stops with busy naming both holders, and latest stays the other's") {
  test::TempDir local;
  const std::string root = saved_root(local, {10, 20});
  auto store = test::rgw_store("latest-thief");
  commit_to_object_store(posix_file_system(), root, 10, *store, {.run = "run-a", .holder = "holder-a"});
  commit_to_object_store(posix_file_system(), root, 20, *store, {.move_latest = false, .run = "run-a", .holder = "holder-a"});
  LatestThief thief(*store);
  const Error e = test::error_of([&] { move_object_latest(thief, 20, "run-a", "holder-a"); });
  CHECK(e.code() == Errc::busy);
  CHECK(e.file() == store->name_of("latest"));
  CHECK(e.detail().find("latest was moved to step-0000000030 by another writer while writer holder-a of run run-a moved it to step-0000000020") !=
        std::string::npos);
  CHECK(e.expected() == "holder holder-a");
  CHECK(e.actual() == "holder holder-b of run run-a");
  CHECK(read_object_latest(*store)->holder == "holder-b");
}

TEST_CASE("a root's run identity is drawn once, kept, and replaced only by a write under its lock") {
  test::TempDir dir;
  const std::string root = (dir / "root").string();
  CHECK(!read_run_identity(posix_file_system(), root).has_value());
  std::string first;
  {
    const RootLock lock(posix_file_system(), root);
    first = establish_run_identity(posix_file_system(), lock);
    CHECK(is_valid_id(first));
    CHECK(establish_run_identity(posix_file_system(), lock) == first);
  }
  CHECK(read_run_identity(posix_file_system(), root) == first);
  {
    const RootLock lock(posix_file_system(), root);
    write_run_identity(posix_file_system(), lock, "adopted-run");
    CHECK(test::error_of([&] { write_run_identity(posix_file_system(), lock, "not/valid"); }).code() == Errc::invalid_argument);
  }
  CHECK(read_run_identity(posix_file_system(), root) == "adopted-run");
  test::write_all(std::filesystem::path(root) / ".run", {'x'});
  const Error e = test::error_of([&] { read_run_identity(posix_file_system(), root); });
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == root + "/.run");
}
