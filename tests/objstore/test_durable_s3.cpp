// SPDX-License-Identifier: Apache-2.0
// The background durable tier with an s3:// root: committed local checkpoints replicated to
// the real RGW with the object-store commit and rotated there; a failing store counted and
// retried, never thrown.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/store/store.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/core/log.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/store/object/object_lease.hpp"
#include "ckpt/store/object/object_commit.hpp"
#include "ckpt/ops/save.hpp"
#include "ckpt/store/tiers.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/runtime/tiering.hpp"
#include "ckpt/testing/fault_object_store.hpp"
#include "io/io_fixture.hpp"
#include "objstore/rgw_fixture.hpp"

using namespace ckpt;
using Fault = testing::FaultInjectionObjectStore::Fault;
using Op = testing::FaultInjectionObjectStore::Op;

namespace {

void save_step(const std::string& root, std::uint64_t step) {
  test::Fixture fx(2, step);
  save_checkpoint_sync(posix_file_system(), root, fx.request);
}

}  // namespace

TEST_CASE("the durable tier replicates committed steps to an s3 root, moves latest there and rotates it") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  const S3Options o = test::rgw_options(test::unique_prefix("durable"));
  auto store = make_s3_object_store(o);
  {
    DurableReplicator rep(posix_file_system(), root, {.root = o.root, .keep_last = 2, .object_store = store.get()});
    for (std::uint64_t s = 1; s <= 4; ++s) {
      save_step(root, s);
      rep.submit(s);
      rep.wait_idle();
    }
    const DurableStats st = rep.stats();
    CHECK(st.copies == 4);
    CHECK(st.failures == 0);
    CHECK(st.last_step == 4u);
    CHECK(st.rotated == 2);
    CHECK(st.bytes > 0);
  }
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{3, 4});
  CHECK(read_object_latest(*store)->step == 4);
  test::TempDir into;
  restore_from_object_store(*store, 4, posix_file_system(), (into / "r").string(), {.verify = Verify::full});
}

TEST_CASE("the durable s3 tier collects a leftover older than its grace after its next commit, keeps a younger one, logs and counts it") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  const S3Options o = test::rgw_options(test::unique_prefix("durable-leftovers"));
  auto store = make_s3_object_store(o);
  const std::string old_key = "step-0000000007/deadrun/rank-00000-of-00002.safetensors";
  const std::string young_key = "step-0000000008/liverun/rank-00000-of-00002.safetensors";
  store->put(old_key, test::bytes_of("what a killed commit left"));
  // Older than the 4 s grace; the young one stays younger through the commit (the server's
  // dates are cut to whole seconds, so it may look up to 1 s older than it is).
  std::this_thread::sleep_for(std::chrono::seconds(5));
  store->put(young_key, test::bytes_of("a commit still uploading"));
  std::vector<std::string> logged;
  std::mutex mu;
  const LogSink previous = set_log_sink([&](std::string_view l) {
    std::lock_guard lock(mu);
    logged.emplace_back(l);
  });
  DurableStats st;
  {
    DurableReplicator rep(posix_file_system(), root, {.root = o.root, .object_store = store.get(), .leftover_grace = std::chrono::seconds(4)});
    save_step(root, 10);
    rep.submit(10);
    rep.wait_idle();
    st = rep.stats();
  }
  set_log_sink(previous);
  CHECK(st.copies == 1);
  CHECK(st.leftovers_collected == 1);
  CHECK(store->list("step-0000000007/").objects.empty());
  CHECK(store->list("step-0000000008/").objects.size() == 1);
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{10});
  REQUIRE(logged.size() == 1);
  CHECK(logged[0] == "durable tier: collected 1 leftover object(s) and aborted 0 multipart upload(s) older than 4 s under " + o.root + ": " + old_key);
}

TEST_CASE("a durable tier's leftover grace defaults to one hour and a negative one is invalid_argument") {
  CHECK(DurableTierOptions{}.leftover_grace == std::chrono::hours(1));
  test::TempDir local;
  try {
    DurableReplicator rep(posix_file_system(), (local / "root").string(), {.root = "s3://b/p", .leftover_grace = std::chrono::seconds(-1)});
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == Errc::invalid_argument);
    CHECK(std::string(e.what()) == "invalid argument: DurableTierOptions.leftover_grace must be >= 0");
  }
}

TEST_CASE("a durable s3 tier whose store fails is counted with the typed error and retried, never thrown") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  const S3Options o = test::rgw_options(test::unique_prefix("durable-fail"));
  auto s3 = make_s3_object_store(o);
  testing::FaultInjectionObjectStore faults(*s3);
  faults.inject(Op::put, Fault::server_error, 1);  // the first attempt's first put
  DurableReplicator rep(posix_file_system(), root,
                        {.root = o.root, .max_attempts = 2, .retry_backoff = std::chrono::milliseconds(1), .object_store = &faults});
  save_step(root, 7);
  rep.submit(7);
  rep.wait_idle();
  const DurableStats st = rep.stats();
  CHECK(st.failures == 1);
  CHECK(st.copies == 1);
  CHECK(st.last_error_code == Errc::io_error);
  CHECK(st.last_error.find("HTTP 500 InternalError") != std::string::npos);
  CHECK(read_object_latest(*s3)->step == 7);
}

TEST_CASE("a durable s3 tier without credentials is refused when it is made, before any training, naming the variables") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
  const Error e = test::error_of([&] { DurableReplicator rep(posix_file_system(), root, {.root = "s3://nobody-bucket/x"}); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.file() == "s3://nobody-bucket/x");
  CHECK(e.detail().find("AWS_ACCESS_KEY_ID") != std::string::npos);
  // The same through a Checkpointer: its constructor throws, nothing is written locally.
  const Error c = test::error_of([&] {
    CheckpointerOptions o{.root = root, .world_size = 1};
    o.durable = DurableTierOptions{.root = "s3://nobody-bucket/x"};
    Checkpointer ck(std::move(o));
  });
  CHECK(c.code() == Errc::invalid_argument);
  CHECK(!std::filesystem::exists(root));
}

TEST_CASE("a durable s3 tier whose server refuses the connection fails its copies, counted and given up, and training goes on") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  S3Options o;
  o.root = "s3://nobody-bucket/x";
  o.endpoint = "http://127.0.0.1:1";
  o.access_key = "a";
  o.secret_key = "b";
  o.retry.max_attempts = 1;
  const auto store = open_s3(o);
  DurableReplicator rep(posix_file_system(), root, {.root = o.root, .max_attempts = 1, .object_store = store.get()});
  save_step(root, 3);
  rep.submit(3);
  rep.wait_idle();
  const DurableStats st = rep.stats();
  CHECK(st.given_up == 1);
  CHECK(st.copies == 0);
  CHECK(st.last_error_code == Errc::io_error);
  CHECK(st.last_error.find("127.0.0.1:1") != std::string::npos);
  CHECK(open_latest(posix_file_system(), root).name == "step-0000000003");  // the local checkpoint stands
}

TEST_CASE("a resume whose local root is gone rehydrates it from the object store, verified, and says so") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  auto store = test::rgw_store("resume");
  for (std::uint64_t s = 1; s <= 2; ++s) {
    save_step(root, s);
    commit_to_object_store(posix_file_system(), root, s, *store);
  }
  std::filesystem::remove_all(root);
  const TieredCheckpoint t = open_latest_tiered(posix_file_system(), root, *store, {.expected_world_size = 2, .verify = Verify::full});
  CHECK(t.tier == "durable");
  CHECK(t.opened.name == "step-0000000002");
  CHECK(!t.opened.fell_back);
  CHECK(t.opened.note.starts_with("restored step-0000000002 from s3://"));
  CHECK(!t.local_error.empty());
  t.opened.reader.verify(Verify::full);
  // The local root is a root again: the next resume is local.
  CHECK(open_latest_tiered(posix_file_system(), root, *store).tier == "local");
}

TEST_CASE("a resume whose local latest is corrupt replaces that step with the object store's copy") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  auto store = test::rgw_store("resume-corrupt");
  save_step(root, 5);
  commit_to_object_store(posix_file_system(), root, 5, *store);
  const OpenedCheckpoint before = open_latest(posix_file_system(), root);
  const std::string shard = before.reader.shard_path(1);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  const TieredCheckpoint t = open_latest_tiered(posix_file_system(), root, *store);
  CHECK(t.tier == "durable");
  CHECK(t.local_error.find("checksum mismatch") != std::string::npos);
  t.opened.reader.verify(Verify::full);
  CHECK(open_latest_tiered(posix_file_system(), root, *store).tier == "local");
}

TEST_CASE("a resume with neither tier usable is not_found naming both") {
  test::TempDir local;
  auto store = test::rgw_store("resume-none");
  const Error e = test::error_of([&] { open_latest_tiered(posix_file_system(), (local / "root").string(), *store); });
  CHECK(e.code() == Errc::not_found);
  CHECK(e.actual().find("durable: ") != std::string::npos);
  CHECK(e.actual().find("no committed checkpoint on the object store") != std::string::npos);
}

namespace {

// Lets the injected hangs go when a test ends, however it ends.
struct Unhang {
  testing::FaultInjectionObjectStore& faults;
  ~Unhang() { faults.release_hangs(); }
};

}  // namespace

TEST_CASE("a drain of a durable s3 tier whose store hangs gives up at its deadline: the copy is aborted, given up, nothing is committed") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  const S3Options o = test::rgw_options(test::unique_prefix("drain-deadline"));
  auto s3 = make_s3_object_store(o);
  testing::FaultInjectionObjectStore faults(*s3);
  const Unhang unhang{faults};
  std::vector<DurableDrainStatus> seen;
  DurableStats st;
  DurableDrain d;
  const auto t0 = std::chrono::steady_clock::now();
  {
    DurableReplicator rep(posix_file_system(), root, {.root = o.root, .object_store = &faults});
    rep.claim("run-a");
    faults.inject(Op::put, Fault::hang, 1000);  // from here on the store answers nothing
    save_step(root, 4);
    rep.submit(4);
    d = rep.drain({.deadline = std::chrono::milliseconds(1500),
                   .progress = [&](const DurableDrainStatus& s) { seen.push_back(s); },
                   .first_progress = std::chrono::milliseconds(500),
                   .progress_every = std::chrono::milliseconds(500)});
    st = rep.stats();
    rep.submit(5);  // after giving up: counted, never copied
    CHECK(rep.stats().given_up == st.given_up + 1);
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(!d.complete);
  CHECK(d.gave_up_on == "the deadline");
  CHECK(d.step == 4u);
  CHECK(d.waited >= std::chrono::milliseconds(1500));
  CHECK(took < std::chrono::milliseconds(4000));  // the deadline, the abort, the destructor: no 30 s stall
  CHECK(st.gave_up);
  CHECK(st.copies == 0);
  CHECK(st.given_up == 1);
  REQUIRE(seen.size() >= 2);
  CHECK(seen[0].running == 4u);
  CHECK(seen[0].attempt == 1);
  CHECK(seen[0].deadline == std::chrono::milliseconds(1500));
  CHECK(seen[0].waited >= std::chrono::milliseconds(500));
  const auto fresh = make_s3_object_store(o);  // the one the replicator used was given up on
  CHECK(list_object_checkpoints(*fresh).empty());
  CHECK(!read_object_latest(*fresh).has_value());
}

TEST_CASE("a drain gives up at once when its stop answers, naming that answer") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  const S3Options o = test::rgw_options(test::unique_prefix("drain-stop"));
  auto s3 = make_s3_object_store(o);
  testing::FaultInjectionObjectStore faults(*s3);
  const Unhang unhang{faults};
  DurableReplicator rep(posix_file_system(), root, {.root = o.root, .object_store = &faults});
  rep.claim("run-a");
  faults.inject(Op::put, Fault::hang, 1000);
  save_step(root, 4);
  rep.submit(4);
  const auto t0 = std::chrono::steady_clock::now();
  const DurableDrain d = rep.drain({.deadline = std::chrono::minutes(5), .stop = [&] {
                                      return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(300) ? "SIGTERM" : "";
                                    }});
  CHECK(!d.complete);
  CHECK(d.gave_up_on == "SIGTERM");
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(2500));
}

TEST_CASE("a durable s3 tier's destructor gives up at drain_deadline on a store that hangs") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  const S3Options o = test::rgw_options(test::unique_prefix("drain-destructor"));
  auto s3 = make_s3_object_store(o);
  testing::FaultInjectionObjectStore faults(*s3);
  const Unhang unhang{faults};
  std::chrono::steady_clock::time_point t0;
  {
    DurableReplicator rep(posix_file_system(), root,
                          {.root = o.root, .object_store = &faults, .drain_deadline = std::chrono::milliseconds(1000)});
    rep.claim("run-a");
    faults.inject(Op::put, Fault::hang, 1000);
    save_step(root, 4);
    rep.submit(4);
    t0 = std::chrono::steady_clock::now();
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(3500));
  CHECK(list_object_checkpoints(*make_s3_object_store(o)).empty());
}

TEST_CASE("a durable s3 tier refuses a prefix whose newest checkpoint is another run's, naming both, and leaves the lease free") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  const S3Options o = test::rgw_options(test::unique_prefix("claim-other-run"));
  auto store = make_s3_object_store(o);
  save_step(root, 3);
  commit_to_object_store(posix_file_system(), root, 3, *store, {.run = "run-a", .holder = "h"});
  DurableReplicator rep(posix_file_system(), root, {.root = o.root, .object_store = store.get()});
  const Error e = test::error_of([&] { rep.claim("run-b"); });
  CHECK(e.code() == Errc::conflict);
  CHECK(e.file() == store->name_of("step-0000000003/manifest.json"));
  CHECK(e.detail().find("was committed by run run-a, not by this run run-b") != std::string::npos);
  CHECK(e.expected() == "run run-b");
  CHECK(e.actual() == "run run-a");
  CHECK(read_object_lease(*store)->record.released);
  rep.claim("run-a");  // the run that owns it is welcome
  CHECK(read_object_lease(*store)->record.run == "run-a");
}

TEST_CASE("a durable s3 tier whose lease was taken over fails every later copy with busy and commits nothing more") {
  test::TempDir local;
  const std::string root = (local / "root").string();
  const S3Options o = test::rgw_options(test::unique_prefix("lease-lost"));
  auto store = make_s3_object_store(o);
  DurableReplicator rep(posix_file_system(), root,
                        {.root = o.root, .max_attempts = 1, .object_store = store.get(),
                         .lease = {.period = std::chrono::milliseconds(1000), .renew_every = std::chrono::milliseconds(100)}});
  rep.claim("run-a");
  save_step(root, 1);
  rep.submit(1);
  rep.wait_idle();
  REQUIRE(rep.stats().copies == 1);
  // Another writer takes the prefix over (as one does after the lease went unrenewed).
  const std::string now = utc_now_rfc3339(), expires = utc_rfc3339(std::chrono::system_clock::now() + std::chrono::minutes(1));
  store->put("lease", test::bytes_of("{\"schema_version\":1,\"run\":\"run-a\",\"holder\":\"successor\",\"host\":\"h\",\"pid\":1,\"program\":\"p\","
                                     "\"acquired_at\":\"" + now + "\",\"renewed_at\":\"" + now + "\",\"expires_at\":\"" + expires +
                                     "\",\"period_ms\":60000,\"released\":false}\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // a renewal meets it
  save_step(root, 2);
  rep.submit(2);
  rep.wait_idle();
  const DurableStats st = rep.stats();
  CHECK(st.lease_lost);
  CHECK(st.copies == 1);
  CHECK(st.last_failed_step == 2u);
  CHECK(st.last_error_code == Errc::busy);
  CHECK(st.last_error.find("the lease was taken over") != std::string::npos);
  CHECK(st.last_error.find("holder successor") != std::string::npos);
  CHECK(list_object_checkpoints(*store) == std::vector<std::uint64_t>{1});
  CHECK(read_object_latest(*store)->step == 1);
  CHECK(read_object_lease(*store)->record.holder == "successor");
}
