// SPDX-License-Identifier: Apache-2.0
#include "record.hpp"

#include <boost/json.hpp>
#include <cstring>
#include <type_traits>

#include "ckpt/core/error.hpp"

namespace ckpt::demo {
namespace {

class Writer {
 public:
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void pod(const T& v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    out_.insert(out_.end(), p, p + sizeof v);
  }
  void bytes(std::span<const std::byte> b) {
    pod<std::uint64_t>(b.size());
    out_.insert(out_.end(), b.begin(), b.end());
  }
  void str(const std::string& s) { bytes(std::as_bytes(std::span(s.data(), s.size()))); }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <class T>
    requires std::is_trivially_copyable_v<T>
  T pod() {
    T v;
    std::memcpy(&v, need(sizeof v).data(), sizeof v);
    return v;
  }
  std::vector<std::byte> bytes() {
    const auto n = pod<std::uint64_t>();
    const auto b = need(n);
    return {b.begin(), b.end()};
  }
  std::string str() {
    const auto b = bytes();
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  /// A vector written with Writer::bytes(as_bytes(span(v))).
  template <class T>
    requires std::is_trivially_copyable_v<T>
  std::vector<T> vec() {
    const auto b = bytes();
    if (b.size() % sizeof(T) != 0)
      throw Error(Errc::comm_error, {}, "demo rank record array bytes", "a multiple of " + std::to_string(sizeof(T)), std::to_string(b.size()));
    std::vector<T> v(b.size() / sizeof(T));
    if (!b.empty()) std::memcpy(v.data(), b.data(), b.size());
    return v;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  std::span<const std::byte> need(std::uint64_t n) {
    if (n > in_.size() - pos_)
      throw Error(Errc::comm_error, {}, "demo rank record truncated", std::to_string(n) + " more bytes",
                  std::to_string(in_.size() - pos_));
    const auto s = in_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

}  // namespace

std::vector<std::byte> encode(const RankRecord& r) {
  Writer w;
  w.pod(r.rank);
  w.pod<std::uint64_t>(r.rows.size());
  for (const auto& row : r.rows) {
    w.pod(row.stats);  // StepStats is plain numbers: bit-exact
    w.pod(row.stall_ms);
    w.pod(row.memory);
    w.str(row.event);
    w.pod(row.consecutive_save_failures);
  }
  w.bytes(std::as_bytes(std::span(r.final_params)));
  w.pod(r.memory);
  w.pod<bool>(r.snapshot_step.has_value());
  w.pod<std::uint64_t>(r.snapshot_step.value_or(0));
  w.pod<std::uint64_t>(r.snapshot.size());
  for (const auto& [name, b] : r.snapshot) {
    w.str(name);
    w.bytes(b);
  }
  w.str(boost::json::serialize(r.snapshot_meta));
  w.pod<std::uint64_t>(r.save_errors.size());
  for (const auto& e : r.save_errors) {
    w.pod(e.step);
    w.str(e.code);
    w.str(e.message);
  }
  w.pod<std::uint64_t>(r.restored.size());
  for (const auto& [name, b] : r.restored) {
    w.str(name);
    w.bytes(b);
  }
  w.pod(r.resumed_from);
  w.pod(r.last_step);
  w.pod<std::uint64_t>(r.num_params);
  w.bytes(std::as_bytes(std::span(r.skipped_batches)));
  w.str(r.resume_tier);
  w.pod(r.resume_verify_s);
  w.pod(r.resume_load_s);
  return w.take();
}

RankRecord decode(std::span<const std::byte> blob) {
  Reader rd(blob);
  // A count can never exceed the bytes left (every element takes at least one byte).
  auto count = [&] {
    const auto n = rd.pod<std::uint64_t>();
    if (n > blob.size()) throw Error(Errc::comm_error, {}, "demo rank record count", "<= " + std::to_string(blob.size()), std::to_string(n));
    return static_cast<std::size_t>(n);
  };
  RankRecord r;
  r.rank = rd.pod<int>();
  r.rows.resize(count());
  for (auto& row : r.rows) {
    row.stats = rd.pod<train::StepStats>();
    row.stall_ms = rd.pod<double>();
    row.memory = rd.pod<train::MemoryProfile>();
    row.event = rd.str();
    row.consecutive_save_failures = rd.pod<std::uint64_t>();
  }
  r.final_params = rd.vec<std::uint16_t>();
  r.memory = rd.pod<train::MemoryProfile>();
  const bool has_snapshot = rd.pod<bool>();
  const auto snapshot_step = rd.pod<std::uint64_t>();
  if (has_snapshot) r.snapshot_step = snapshot_step;
  r.snapshot.resize(count());
  for (auto& [name, b] : r.snapshot) {
    name = rd.str();
    b = rd.bytes();
  }
  r.snapshot_meta = boost::json::parse(rd.str()).as_object();
  r.save_errors.resize(count());
  for (auto& e : r.save_errors) {
    e.step = rd.pod<std::uint64_t>();
    e.code = rd.str();
    e.message = rd.str();
  }
  for (std::size_t i = 0, n = count(); i < n; ++i) {
    auto name = rd.str();
    r.restored[name] = rd.bytes();
  }
  r.resumed_from = rd.pod<std::uint64_t>();
  r.last_step = rd.pod<std::uint64_t>();
  r.num_params = static_cast<std::size_t>(rd.pod<std::uint64_t>());
  r.skipped_batches = rd.vec<std::uint64_t>();
  r.resume_tier = rd.str();
  r.resume_verify_s = rd.pod<double>();
  r.resume_load_s = rd.pod<double>();
  if (!rd.done()) throw Error(Errc::comm_error, {}, "demo rank record has trailing bytes");
  return r;
}

}  // namespace ckpt::demo
