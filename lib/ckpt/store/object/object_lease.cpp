// SPDX-License-Identifier: Apache-2.0
// The writer lease of an object-store root; the protocol and its guarantees are in
// object_lease.hpp.
#include "ckpt/store/object/object_lease.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <thread>

#include <boost/json.hpp>

#include "ckpt/core/log.hpp"
#include "ckpt/format/json_util.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/store/run_identity.hpp"

namespace ckpt {

namespace {

namespace json = boost::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::uint64_t kMaxLeaseBytes = 16u << 10;
constexpr milliseconds kMinPeriod{100}, kMaxPeriod{3600 * 1000};
// Rounds of take() that find the lease changed under them before it gives up.
constexpr int kTakeRounds = 8;

std::string seconds_text(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

std::string encode(const LeaseRecord& r) {
  return json::serialize(json::object{{"schema_version", 1},
                                      {"run", r.run},
                                      {"holder", r.holder},
                                      {"host", r.host},
                                      {"pid", r.pid},
                                      {"program", r.program},
                                      {"acquired_at", r.acquired_at},
                                      {"renewed_at", r.renewed_at},
                                      {"expires_at", r.expires_at},
                                      {"period_ms", r.period.count()},
                                      {"released", r.released}}) +
         "\n";
}

LeaseRecord decode(std::string_view text, const std::string& name) {
  const detail::JsonContext c{Errc::malformed_manifest, name};
  boost::system::error_code ec;
  const json::value v = json::parse(text, ec);
  if (ec) c.fail("lease", "a JSON object", "not JSON: " + ec.message());
  const json::object& o = detail::json_obj(c, v, "lease");
  auto str = [&](const char* k) { return std::string(detail::json_str(c, detail::json_field(c, o, k, ""), k)); };
  if (detail::json_u64(c, detail::json_field(c, o, "schema_version", ""), "schema_version") != 1)
    c.fail("schema_version", "1", detail::json_kind(o.at("schema_version")));
  LeaseRecord r;
  r.run = str("run");
  r.holder = str("holder");
  r.host = str("host");
  r.pid = static_cast<long>(detail::json_u64(c, detail::json_field(c, o, "pid", ""), "pid", 1u << 30));
  r.program = str("program");
  r.acquired_at = str("acquired_at");
  r.renewed_at = str("renewed_at");
  r.expires_at = str("expires_at");
  r.period = milliseconds(detail::json_u64(c, detail::json_field(c, o, "period_ms", ""), "period_ms", kMaxPeriod.count()));
  const json::value& released = detail::json_field(c, o, "released", "");
  if (!released.is_bool()) c.fail("released", "boolean", detail::json_kind(released));
  r.released = released.get_bool();
  if (!is_valid_id(r.run)) c.fail("run", "1..64 of [A-Za-z0-9_-]", r.run.substr(0, 80));
  if (!is_valid_id(r.holder)) c.fail("holder", "1..64 of [A-Za-z0-9_-]", r.holder.substr(0, 80));
  if (!r.released && !parse_rfc3339(r.expires_at)) c.fail("expires_at", "RFC 3339 UTC", r.expires_at.substr(0, 80));
  return r;
}

}  // namespace

std::string LeaseRecord::describe() const {
  std::string out = "run " + run + " (holder " + holder + ", pid " + std::to_string(pid);
  if (!program.empty()) out += " (" + program + ")";
  out += " on host " + host + ")";
  out += released ? ", released at " + renewed_at : ", expires " + expires_at;
  return out;
}

std::optional<ObjectLeaseState> read_object_lease(ObjectStore& store) {
  const std::string name = store.name_of(kLeaseName);
  ObjectInfo info;
  try {
    info = store.head(kLeaseName);
  } catch (const Error& e) {
    if (e.code() == Errc::not_found) return std::nullopt;
    throw;
  }
  if (info.size > kMaxLeaseBytes)
    throw Error(Errc::malformed_manifest, name, "lease too large", "at most " + std::to_string(kMaxLeaseBytes) + " bytes",
                std::to_string(info.size) + " bytes");
  std::string text(info.size, '\0');
  if (!text.empty()) store.get_range(kLeaseName, 0, std::as_writable_bytes(std::span(text)));
  return ObjectLeaseState{decode(text, name), info.etag};
}

struct ObjectLease::State {
  ObjectStore& store;
  const ObjectLeaseOptions opt;
  const std::string name;  // the lease object, as errors name it
  const std::string run, holder;

  mutable std::mutex mu;
  std::condition_variable cv;
  LeaseRecord mine;               // what this holder last wrote
  std::string etag;               // its ETag
  Clock::time_point valid_from;   // when the last successful take or renewal was sent
  std::optional<Error> lost;      // set once a renewal found the lease taken over
  bool stopping = false, released = false, failing = false;
  std::thread renewer;

  State(ObjectStore& s, std::string run_identity, ObjectLeaseOptions o)
      : store(s), opt(o), name(s.name_of(kLeaseName)), run(std::move(run_identity)), holder(random_id()) {
    if (opt.period < kMinPeriod || opt.period > kMaxPeriod)
      throw Error(Errc::invalid_argument, name, "ObjectLeaseOptions::period", "100 ms .. 1 hour", seconds_text(opt.period));
    if (opt.renew_every.count() <= 0 || opt.renew_every * 2 > opt.period)
      throw Error(Errc::invalid_argument, name, "ObjectLeaseOptions::renew_every", "more than 0, at most half the period",
                  seconds_text(opt.renew_every));
    if (!is_valid_id(run)) throw Error(Errc::invalid_argument, name, "run identity", "1..64 of [A-Za-z0-9_-]", run);
    mine.run = run;
    mine.holder = holder;
    mine.host = host_name();
    mine.pid = static_cast<long>(::getpid());
    mine.program = program_invocation_short_name;
    mine.period = opt.period;
  }

  std::string me() const {
    return "run " + mine.run + " (holder " + mine.holder + ", pid " + std::to_string(mine.pid) + " on host " + mine.host + ")";
  }

  // `mine` stamped as written now.
  LeaseRecord stamped(bool release = false) const {
    LeaseRecord r = mine;
    const auto now = std::chrono::system_clock::now();
    r.renewed_at = utc_rfc3339(now);
    r.expires_at = utc_rfc3339(release ? now : now + opt.period);
    r.released = release;
    return r;
  }

  // Writes `r` under `when`; on success it is this holder's lease from `sent` on.
  void write(LeaseRecord r, const WriteCondition& when) {
    const std::string text = encode(r);
    const auto sent = Clock::now();
    std::string new_etag = store.put(kLeaseName, std::as_bytes(std::span(text)), when);
    std::lock_guard lk(mu);
    mine = std::move(r);
    etag = std::move(new_etag);
    valid_from = sent;
  }

  [[noreturn]] void refuse(const LeaseRecord& holder, const std::string& why) const {
    throw Error(Errc::busy, name, "another writer holds the lease of " + store.name_of("") + why + ": this writer, " + me() + ", is refused",
                "no other live writer (a lease released, or expired and left unrenewed for one period)", holder.describe());
  }

  void take() {
    for (int round = 1;; ++round) {
      std::optional<ObjectLeaseState> current;
      std::string unreadable;  // a lease object that is not a lease record
      std::string seen_etag;
      try {
        current = read_object_lease(store);
        if (current) seen_etag = current->etag;
      } catch (const Error& e) {
        if (e.code() != Errc::malformed_manifest) throw;
        unreadable = e.what();
        seen_etag = store.head(kLeaseName).etag;
      }
      LeaseRecord first = stamped();
      first.acquired_at = first.renewed_at;
      try {
        if (!current && unreadable.empty()) return write(std::move(first), WriteCondition::if_absent());
        if (current && current->record.released) return write(std::move(first), WriteCondition::if_matches(seen_etag));
      } catch (const Error& e) {
        if (e.code() != Errc::conflict && e.code() != Errc::not_found) throw;
        continue;  // another writer got in between: look again
      }
      milliseconds watch = opt.period;
      if (current) {
        const auto expires = parse_rfc3339(current->record.expires_at);
        if (expires && *expires > std::chrono::system_clock::now()) refuse(current->record, "");
        if (round >= kTakeRounds) refuse(current->record, " (it was renewed each time this writer watched it expire: its clock is behind this host's)");
        watch = std::clamp(current->record.period, kMinPeriod, kMaxPeriod);
        log_event(LogLevel::warn, "lease_expired", name + ": the lease of " + current->record.describe() + " has expired by this host's clock; " + me() +
                 " takes it over unless it is renewed within " + seconds_text(watch));
      } else {
        if (round >= kTakeRounds) throw Error(Errc::busy, name, "the lease object kept changing while this writer watched it", "a lease to take", unreadable);
        log_event(LogLevel::warn, "lease_unreadable", name + ": not a lease record (" + unreadable + "); " + me() + " replaces it unless it changes within " + seconds_text(watch));
      }
      std::this_thread::sleep_for(watch);
      try {
        if (store.head(kLeaseName).etag != seen_etag) continue;  // renewed, or taken: look again
        write(std::move(first), WriteCondition::if_matches(seen_etag));
      } catch (const Error& e) {
        if (e.code() != Errc::conflict && e.code() != Errc::not_found) throw;
        continue;
      }
      log_event(LogLevel::warn, "lease_taken_over", name + ": " + me() + " took the lease over, unrenewed for " + seconds_text(watch) +
               (current ? " since " + current->record.renewed_at + " (" + current->record.describe() + ")" : std::string()));
      return;
    }
  }

  void renew_loop() {
    std::unique_lock lk(mu);
    while (!stopping) {
      cv.wait_for(lk, opt.renew_every, [&] { return stopping; });
      if (stopping) return;
      const std::string expected = etag;
      lk.unlock();
      std::optional<Error> failure;
      try {
        write(stamped(), WriteCondition::if_matches(expected));
      } catch (const Error& e) {
        failure = e;
      }
      if (!failure) {
        lk.lock();
        failing = false;
        continue;
      }
      if (failure->code() == Errc::aborted) {  // the caller gave up on the store
        lk.lock();
        return;
      }
      if (failure->code() == Errc::conflict || failure->code() == Errc::not_found) {
        // Another writer replaced it: it watched this lease go unrenewed for a whole period.
        // Who holds it now, for the error: read again a few times when the store answers
        // with an error (a store may fail a read racing the write it just took), since the
        // loss itself is already certain and only its description is at stake.
        std::string who = "nobody (the lease object is gone)";
        for (int attempt = 1;; ++attempt) {
          try {
            if (const auto now = read_object_lease(store)) who = now->record.describe();
            break;
          } catch (const Error& e) {
            if (e.code() == Errc::io_error && attempt < 3) {
              std::this_thread::sleep_for(std::chrono::milliseconds(100 * attempt));
              continue;
            }
            who = std::string("a lease this writer cannot read: ") + e.what();
            break;
          }
        }
        Error error(Errc::busy, name,
                    "the lease was taken over: this writer, " + me() + ", commits nothing more to " + store.name_of(""),
                    "this writer's lease", who);
        log_event(LogLevel::error, "lease_lost", error.what());
        lk.lock();
        lost = std::move(error);
        return;
      }
      lk.lock();
      if (!failing)
        log_event(LogLevel::warn, "lease_renewal_failed", name + ": renewing the lease failed (tried again every " + seconds_text(opt.renew_every) +
                 "; nothing is committed if none succeeds for 3/4 of " + seconds_text(opt.period) + "): " + failure->what());
      failing = true;
    }
  }

  void check() const {
    std::lock_guard lk(mu);
    if (lost) throw *lost;
    if (released) throw Error(Errc::busy, name, "the lease was released: this writer commits nothing more", "a held lease", "released");
    const auto since = Clock::now() - valid_from;
    if (since >= opt.period * 3 / 4)
      throw Error(Errc::busy, name,
                  "the lease lapsed: no renewal succeeded for 3/4 of its " + seconds_text(opt.period) + " period, so " + me() +
                      " commits nothing until one does",
                  "a renewal sent less than " + seconds_text(opt.period * 3 / 4) + " ago",
                  "the last one sent " + seconds_text(std::chrono::duration_cast<milliseconds>(since)) + " ago");
  }

  void release() noexcept {
    {
      std::lock_guard lk(mu);
      if (released) return;
      released = stopping = true;
    }
    cv.notify_all();
    if (renewer.joinable()) renewer.join();
    std::string expected;
    {
      std::lock_guard lk(mu);
      if (lost) return;
      expected = etag;
    }
    try {
      const std::string text = encode(stamped(true));
      store.put(kLeaseName, std::as_bytes(std::span(text)), WriteCondition::if_matches(expected));
    } catch (const Error& e) {
      if (e.code() != Errc::aborted) log_event(LogLevel::warn, "lease_release_failed", name + ": releasing the lease failed (it expires by itself): " + e.what());
    } catch (...) {
      log_event(LogLevel::warn, "lease_release_failed", name + ": releasing the lease failed (it expires by itself)");
    }
  }
};

ObjectLease::ObjectLease(ObjectStore& store, std::string run, ObjectLeaseOptions options)
    : state_(std::make_shared<State>(store, std::move(run), options)) {
  state_->take();
  state_->renewer = std::thread([s = state_.get()] { s->renew_loop(); });
}

ObjectLease::~ObjectLease() { release(); }

const std::string& ObjectLease::run() const noexcept { return state_->run; }
const std::string& ObjectLease::holder() const noexcept { return state_->holder; }
void ObjectLease::check() const { state_->check(); }
bool ObjectLease::lost() const noexcept {
  std::lock_guard lk(state_->mu);
  return state_->lost.has_value();
}
void ObjectLease::release() noexcept { state_->release(); }

}  // namespace ckpt
