// SPDX-License-Identifier: Apache-2.0
// The writer lease of an object-store root (`s3://bucket/prefix`): one writer of a prefix at a
// time, enforced, the counterpart of store/root_lock.hpp for a store that has no locks and whose
// writers may run on different hosts. What the store offers is a create that fails if the key
// exists (If-None-Match: *) and a replace that fails unless the object is still the one read
// before (If-Match); from those (docs/object-store.md, "The writer lease"):
//
//   ROOT/lease   {"schema_version": 1, "run": "3f9c...", "holder": "a81e...", "host": "node7",
//                 "pid": 4242, "program": "ckpt-demo", "acquired_at": ..., "renewed_at": ...,
//                 "expires_at": ..., "period_ms": 60000, "released": false}
//
//   take     no lease object: create it (If-None-Match). A released one: replace it (If-Match
//            on the ETag read). One whose expires_at is later than this host's clock: refused,
//            Errc::busy naming its holder and this writer. One that has expired by this
//            host's clock: watched for one period (its own period_ms) on this host's monotonic
//            clock; if its ETag stayed the same all that time (its holder renewed nothing), it
//            is replaced (If-Match): a takeover, logged. If it changed, its holder lives (or
//            another writer took it): look again.
//   renew    every renew_every, by a thread of the lease: a replace (If-Match on the last
//            ETag) with expires_at moved to now + period. A 412 means another writer took it
//            over (every renewal of this holder had failed for a whole period): the lease is
//            lost for good.
//   check    before each write that commits (a tier manifest, `latest`, a rotation), the
//            holder checks that it was not lost and that its last successful renewal (or the
//            take) was sent less than 3/4 of a period ago by its own monotonic clock; else
//            Errc::busy, and it commits nothing.
//   release  the holder replaces it (If-Match) with its record marked released, so that the
//            next writer takes it at once.
//
// Why a takeover is safe without synchronised clocks: the holder counts its validity from the
// instant it sent its last successful renewal, a contender counts one whole period from the
// instant it first read that renewal's ETag, which is later; both on monotonic clocks. So the
// holder stops committing (at 3/4 of the period) before any contender may take over, and the
// last quarter is left for a commit write already in flight to land. The wall-clock
// expires_at only decides how soon a contender is refused (a skewed clock refuses a little
// longer, or watches a live lease change and then refuses); it never makes two writers.
//
// What it cannot do: a holder stopped (SIGSTOP, a VM paused) between its check and its write
// for longer than a quarter period can land that one write after a takeover (S3 has no
// fencing tokens). What it lands is whole (a tier manifest names complete data), and `latest`
// records its holder, so the stopped writer's next `latest` swap that meets a newer holder's
// fails (store/object/object_commit.hpp) and its next renewal fails: it stops there. The lease is
// advisory like ROOT/.lock: a program that does not take it (an older ckpt, `aws s3 rm`) is
// not stopped.
#pragma once

#include "ckpt/core/export.hpp"

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/objstore/object_store.hpp"

CKPT_API_BEGIN
namespace ckpt {

inline constexpr std::string_view kLeaseName = "lease";

struct ObjectLeaseOptions {
  /// How long a lease lasts without a renewal: a successor of a writer that died takes over
  /// between one and two periods after its last renewal. At least 100 ms, at most 1 hour.
  std::chrono::milliseconds period{60000};
  /// How often the holder renews it: more than 0, at most half the period.
  std::chrono::milliseconds renew_every{15000};
};

/// A lease object's record, as the holder wrote it.
struct LeaseRecord {
  std::string run;          ///< the holder's run identity (store/run_identity.hpp)
  std::string holder;       ///< the holder's own id, drawn when it took the lease
  std::string host;         ///< gethostname() of the holder
  long pid = 0;
  std::string program;
  std::string acquired_at;  ///< UTC, RFC 3339
  std::string renewed_at;
  std::string expires_at;   ///< renewed_at + period, by the holder's clock
  std::chrono::milliseconds period{0};
  bool released = false;
  /// "run R (holder H, pid P (ckpt-demo) on host node7), expires 2026-...Z".
  std::string describe() const;
};

/// The lease under `store`'s root and its ETag, or nullopt if there is none. Errc::malformed_manifest
/// naming it if it is not a lease record; the store's errors.
struct ObjectLeaseState {
  LeaseRecord record;
  std::string etag;
};
std::optional<ObjectLeaseState> read_object_lease(ObjectStore& store);

/// A held writer lease (the file comment says how it is taken, renewed and released).
class ObjectLease {
 public:
  /// Takes the lease of `store`'s root for run `run` (1..64 of [A-Za-z0-9_-]), then renews it
  /// on a thread of its own until destruction. Blocks for the requests and, when the lease it
  /// finds has expired, for one of that lease's periods (watching it; logged). Throws
  /// Errc::busy if another writer holds it ("... held by run R (holder H, pid P (program) on
  /// host X), expires T: this writer (run R2, pid P2 on host Y) is refused"), Errc::invalid_argument
  /// for bad options or run, and the store's errors. `store` must outlive this object.
  ObjectLease(ObjectStore& store, std::string run, ObjectLeaseOptions options = {});
  /// Stops renewing and releases the lease (if still held; a failure is logged).
  ~ObjectLease();
  ObjectLease(const ObjectLease&) = delete;
  ObjectLease& operator=(const ObjectLease&) = delete;

  const std::string& run() const noexcept;
  /// This holder's id (recorded in the lease and in the `latest` it moves).
  const std::string& holder() const noexcept;
  /// Throws Errc::busy unless the lease is held: lost (taken over: the error names the new
  /// holder and this one) or lapsed (no renewal succeeded for 3/4 of a period, by this
  /// process's monotonic clock: the error says since when). A lapsed lease is held again
  /// once a renewal succeeds; a lost one never. Thread-safe; never blocks.
  void check() const;
  /// True once a renewal found the lease taken over. Thread-safe.
  bool lost() const noexcept;
  /// Stops renewing and, if held, marks the lease released in the store so the next writer
  /// takes it at once. Idempotent; never throws (a failure is logged).
  void release() noexcept;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace ckpt
CKPT_API_END
