// SPDX-License-Identifier: Apache-2.0
// ckpt._core: the C++ side of the Python package (lib/python/ckpt/ is the rest; docs/python.md
// the API). It sees tensors only as (name, dtype name, shape, address, byte count) tuples that
// ckpt/_tensors.py makes from torch tensors and numpy arrays, so it links no libtorch and no
// numpy C API beyond pybind11's array type. Every call that copies, waits, loads or verifies
// releases the GIL; ckpt::Error becomes the ckpt.Error subclass of its code (ckpt/errors.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <boost/json.hpp>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ckpt/store/recovery.hpp"
#include "ckpt/store/store.hpp"
#include "ckpt/core/dtype.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/format/boost_json.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/format/sharding.hpp"
#include "ckpt/fs/file_system.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/read/load_into.hpp"
#include "ckpt/read/mapped.hpp"
#include "ckpt/read/reader.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/runtime/coordinator.hpp"
#include "ckpt/version.hpp"
#include "ckpt/metrics/prometheus.hpp"
#ifdef CKPT_PYTHON_METRICS
#include <unistd.h>

#include "ckpt/metrics/server.hpp"
#endif

namespace py = pybind11;
namespace json = boost::json;

namespace {

// ---- errors -------------------------------------------------------------------------------

// Sets the Python error for `e`: an instance of ckpt.errors' class for its code.
void raise_ckpt_error(const ckpt::Error& e) {
  try {
    py::object make = py::module_::import("ckpt.errors").attr("_from_core");
    py::object exc = make(std::string(ckpt::errc_id(e.code())), e.what(), e.file(), e.detail(), e.expected(), e.actual(), e.sys_errno());
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (py::error_already_set& err) {
    err.restore();
  }
}

ckpt::DType dtype_of(const std::string& name) {
  auto d = ckpt::parse_dtype(name);
  if (!d) throw ckpt::Error(ckpt::Errc::invalid_argument, {}, "dtype", "F16, BF16, F32, F64, I8..I64, U8..U64 or BOOL", name);
  return *d;
}

ckpt::Verify verify_of(const std::string& name) {
  auto v = ckpt::parse_verify(name);
  if (!v) throw ckpt::Error(ckpt::Errc::invalid_argument, {}, "verify", "none, fast or full", name);
  return *v;
}

json::object object_of(const std::string& text, const char* what) {
  if (text.empty()) return {};
  json::value v;
  try {
    v = json::parse(text);
  } catch (const std::exception& e) {
    throw ckpt::Error(ckpt::Errc::invalid_argument, {}, std::string(what) + ": not JSON", "a JSON object", e.what());
  }
  if (!v.is_object()) throw ckpt::Error(ckpt::Errc::invalid_argument, {}, what, "a JSON object", json::serialize(v));
  return v.as_object();
}

// (name, dtype, shape, address, nbytes), as ckpt/_tensors.py describes a tensor.
using TensorTuple = std::tuple<std::string, std::string, std::vector<std::uint64_t>, std::uintptr_t, std::uint64_t>;

// `sharding`: "" or a JSON object name -> description, each as the manifest writes it
// ({"slice": {...}}, {"replicated": {"holders": [...]}} or {"rank_local": true}; ckpt/__init__.py's
// slice_of, row_slice, column_slice, replicated and rank_local make them).
std::vector<ckpt::TensorView> views_of(const std::vector<TensorTuple>& tensors, const std::string& sharding = {}) {
  std::vector<ckpt::TensorView> out;
  out.reserve(tensors.size());
  for (const auto& [name, dtype, shape, addr, nbytes] : tensors)
    out.push_back(ckpt::TensorView{.name = name,
                                   .dtype = dtype_of(dtype),
                                   .shape = shape,
                                   .data = {reinterpret_cast<const std::byte*>(addr), static_cast<std::size_t>(nbytes)},
                                   .sharding = std::nullopt});
  const json::object described = object_of(sharding, "sharding");
  for (const auto& kv : described) {
    const std::string name(kv.key());
    const auto it = std::find_if(out.begin(), out.end(), [&](const ckpt::TensorView& v) { return v.name == name; });
    if (it == out.end())
      throw ckpt::Error(ckpt::Errc::invalid_argument, {}, "sharding names a tensor that is not saved", "one of the saved tensors", "'" + name + "'");
    if (!kv.value().is_object())
      throw ckpt::Error(ckpt::Errc::invalid_argument, {}, "sharding of tensor '" + name + "'", "a description (ckpt.slice_of, ckpt.replicated, ...)",
                        json::serialize(kv.value()));
    try {
      it->sharding = ckpt::sharding_from_json(kv.value().as_object(), "sharding", "tensor '" + name + "'");
    } catch (const ckpt::Error& e) {  // a bad argument here, not a bad manifest
      throw ckpt::Error(ckpt::Errc::invalid_argument, {}, e.detail(), e.expected(), e.actual());
    }
  }
  return out;
}

// ---- the multi-process coordinator ---------------------------------------------------------

// The transport of a torch.distributed job (ckpt/distributed.py): the protocol is
// ckpt::ChannelCoordinator's; the Python object supplies gather(bytes) -> list of bytes (on
// rank 0) or None, and broadcast(bytes) -> bytes, over a gloo group of its own. They are
// called from the Python thread that runs serve() (GIL released there, taken back here).
class PyTransport final : public ckpt::CoordinationTransport {
 public:
  explicit PyTransport(py::object impl) : impl_(std::move(impl)) {}
  ~PyTransport() override {
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }
  std::vector<std::string> gather(const std::string& mine) override {
    py::gil_scoped_acquire gil;
    try {
      const py::object got = impl_.attr("gather")(py::bytes(mine));
      std::vector<std::string> out;
      if (!got.is_none())
        for (const auto& item : got) out.push_back(item.cast<std::string>());
      return out;
    } catch (py::error_already_set& e) {
      throw ckpt::Error(ckpt::Errc::comm_error, {}, e.what());
    } catch (const py::cast_error& e) {
      throw ckpt::Error(ckpt::Errc::comm_error, {}, std::string("the transport's gather returned what is not a list of bytes: ") + e.what());
    }
  }
  std::string broadcast(const std::string& text) override {
    py::gil_scoped_acquire gil;
    try {
      return impl_.attr("broadcast")(py::bytes(text)).cast<std::string>();
    } catch (py::error_already_set& e) {
      throw ckpt::Error(ckpt::Errc::comm_error, {}, e.what());
    } catch (const py::cast_error& e) {
      throw ckpt::Error(ckpt::Errc::comm_error, {}, std::string("the transport's broadcast returned what is not bytes: ") + e.what());
    }
  }

 private:
  py::object impl_;
};

// The coordinator of one process of a torch.distributed job: the protocol over its transport.
class ProcessCoordinator {
 public:
  ProcessCoordinator(int rank, int world, py::object transport)
      : transport_(std::make_unique<PyTransport>(std::move(transport))),
        protocol_(std::make_unique<ckpt::ChannelCoordinator>(world, rank, *transport_)) {}
  ~ProcessCoordinator() {
    py::gil_scoped_release nogil;  // the protocol's close may wake a serve() that takes the GIL
    protocol_.reset();
    transport_.reset();
  }
  ckpt::ChannelCoordinator& protocol() { return *protocol_; }
  int world_size() const { return protocol_->world_size(); }

 private:
  std::unique_ptr<PyTransport> transport_;
  std::unique_ptr<ckpt::ChannelCoordinator> protocol_;
};

// ---- saving -------------------------------------------------------------------------------

py::dict result_dict(const ckpt::SaveResult& r) {
  using secs = std::chrono::duration<double>;
  py::dict d;
  d["step"] = r.step;
  d["dir"] = r.dir;
  d["bytes"] = r.bytes;
  d["backend"] = r.backend;
  d["deferred"] = r.deferred;
  d["stall_s"] = secs(r.stall).count();
  d["stage_s"] = secs(r.stage).count();
  d["write_s"] = secs(r.write).count();
  d["hash_s"] = secs(r.hash).count();
  d["fsync_s"] = secs(r.fsync).count();
  d["commit_s"] = secs(r.commit).count();
  d["total_s"] = secs(r.total).count();
  return d;
}

// How long a wait releases the GIL before it looks for signals and its deadline again: a
// Ctrl-C interrupts a wait within this.
constexpr std::chrono::milliseconds kWaitSlice{50};

// Waits until `done_within(slice)` (one of the C++ timed waits: true once done) returns true,
// with the GIL released, in slices of kWaitSlice; between slices it runs Python's signal
// handlers (PyErr_CheckSignals: a KeyboardInterrupt, or what a handler raises, propagates
// from here) and checks the deadline. `timeout`: seconds (finite, >= 0; checked by the
// Python side), none for no deadline. Returns false once the deadline has passed.
bool wait_in_slices(const std::function<bool(std::chrono::nanoseconds)>& done_within, std::optional<double> timeout) {
  using clock = std::chrono::steady_clock;
  std::optional<clock::time_point> deadline;
  if (timeout) deadline = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(*timeout));
  for (;;) {
    std::chrono::nanoseconds slice = kWaitSlice;
    if (deadline) slice = std::clamp<std::chrono::nanoseconds>(*deadline - clock::now(), std::chrono::nanoseconds(0), slice);
    bool done;
    {
      py::gil_scoped_release nogil;
      done = done_within(slice);
    }
    if (done) return true;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (deadline && clock::now() >= *deadline) return false;
  }
}

// One save's handle. Holds the Python objects whose memory the save reads (`keep`) until the
// copy into staging is done; destroying the handle of a deferred save before then waits for
// the copy, so that memory can never be freed under it (in a forked child, where the copy
// never runs, the C++ handle refuses the wait and nothing is waited for).
class Handle {
 public:
  Handle(ckpt::SaveHandle h, py::object keep) : h_(std::move(h)), keep_(std::move(keep)) {}
  ~Handle() {
    if (keep_ && h_.valid() && !h_.staged()) {
      py::gil_scoped_release nogil;
      try {
        h_.wait_staged();
      } catch (...) {
      }
    }
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  bool done() {
    const bool r = h_.ready();
    release_if_staged();
    return r;
  }
  bool staged() {
    const bool s = h_.staged();
    release_if_staged();
    return s;
  }
  bool skipped() const { return h_.skipped(); }
  std::uint64_t step() const { return h_.step(); }

  // True once the save is done (committed or failed), false at the deadline.
  bool wait_for(std::optional<double> timeout) {
    return wait_in_slices([this](std::chrono::nanoseconds slice) { return h_.wait_for(slice); }, timeout);
  }
  // The result of a done save, or its error raised.
  py::dict result() {
    keep_ = py::object();  // done: staged or failed, the memory is no longer read
    return result_dict(h_.wait());
  }
  // True once the copy is done, false at the deadline.
  bool wait_staged_for(std::optional<double> timeout) {
    const bool staged = wait_in_slices([this](std::chrono::nanoseconds slice) { return h_.wait_staged_for(slice); }, timeout);
    release_if_staged();
    return staged;
  }
  // Raises the copy's error of a staged save.
  void staged_result() {
    h_.wait_staged();
    keep_ = py::object();
  }

 private:
  void release_if_staged() {
    if (keep_ && h_.staged()) keep_ = py::object();
  }
  ckpt::SaveHandle h_;
  py::object keep_;
};

ckpt::WriterBackend writer_of(const std::string& w) {
  if (w == "auto") return ckpt::WriterBackend::automatic;
  if (w == "io_uring") return ckpt::WriterBackend::io_uring;
  if (w == "posix") return ckpt::WriterBackend::posix;
  throw ckpt::Error(ckpt::Errc::invalid_argument, {}, "writer", "auto, io_uring or posix", w);
}

ckpt::BusyPolicy busy_of(const std::string& b) {
  if (b == "wait") return ckpt::BusyPolicy::wait;
  if (b == "skip") return ckpt::BusyPolicy::skip;
  throw ckpt::Error(ckpt::Errc::invalid_argument, {}, "when_busy", "wait or skip", b);
}

// The Python Checkpointer. The C++ object lives as long as this one (a call in flight holds
// `self`, so it cannot be destroyed under the call); close() is the C++ close(), which is
// safe against the calls other threads are making: those waiting at the barrier, and those
// made later, raise Aborted, and every save accepted before ends.
class PyCheckpointer {
 public:
  PyCheckpointer(const std::string& root, int world_size, int keep_last, const std::string& writer, const std::string& when_busy,
                 const std::optional<std::string>& durable_root, int durable_keep_last, bool allow_older_than_latest, bool allow_empty,
                 std::shared_ptr<ProcessCoordinator> coordinator, std::uint64_t staging_bytes_per_rank, std::uint64_t max_file_bytes)
      : coordinator_(std::move(coordinator)) {
    ckpt::CheckpointerOptions o{.root = root,
                                .world_size = world_size,
                                .keep_last = keep_last,
                                .backend = writer_of(writer),
                                .when_busy = busy_of(when_busy),
                                .coordinator = coordinator_ ? &coordinator_->protocol() : nullptr,
                                .allow_older_than_latest = allow_older_than_latest,
                                .allow_empty = allow_empty};
    o.staging_bytes_per_rank = staging_bytes_per_rank;
    o.max_file_bytes = max_file_bytes;
    if (durable_root) o.durable = ckpt::DurableTierOptions{.root = *durable_root, .keep_last = durable_keep_last};
    py::gil_scoped_release nogil;  // a multi-process start_run waits for the coordinator's Python thread
    cp_ = std::make_unique<ckpt::Checkpointer>(std::move(o));
  }
  ~PyCheckpointer() {
#ifdef CKPT_PYTHON_METRICS
    // A process forked from the one serving has none of the server's threads: stopping it
    // there would wait for them forever, so the child's copy is dropped without a stop.
    if (metrics_ && metrics_pid_ != ::getpid()) (void)metrics_.release();
#endif
    close();
  }

  // The metrics in the Prometheus text format (docs/metrics.md).
  std::string metrics_text() const { return ckpt::render_prometheus(*cp_); }

  // Serves them at http://ADDRESS:PORT/metrics until this object goes (a second call
  // replaces the first server); returns the URL. Errors as MetricsServer's.
  std::string serve_metrics(int port, const std::string& bind_address) {
#ifdef CKPT_PYTHON_METRICS
    py::gil_scoped_release nogil;
    metrics_.reset();
    metrics_ = std::make_unique<ckpt::MetricsServer>(*cp_, ckpt::MetricsServerOptions{.port = port, .bind_address = bind_address});
    metrics_pid_ = ::getpid();
    return metrics_->url();
#else
    (void)port, (void)bind_address;
    throw ckpt::Error(ckpt::Errc::invalid_argument, {}, "this ckpt was built without the metrics endpoint (install prometheus-cpp-dev and rebuild)");
#endif
  }

  // Refuses new saves, drains the started ones and releases the root's lock.
  void close() {
    py::gil_scoped_release nogil;
    cp_->close();
  }

  std::unique_ptr<Handle> save(int rank, std::uint64_t step, const std::vector<TensorTuple>& tensors, py::object keep,
                               const std::string& metadata, const std::string& training, const std::string& staging,
                               double wall_clock_seconds, const std::string& sharding) {
    const ckpt::Staging mode = staging == "deferred"     ? ckpt::Staging::deferred
                               : staging == "overlapped" ? ckpt::Staging::overlapped
                               : staging == "copy"       ? ckpt::Staging::copy
                                                         : throw ckpt::Error(ckpt::Errc::invalid_argument, {}, "staging", "copy, deferred or overlapped", staging);
    const bool deferred = mode == ckpt::Staging::deferred;
    const std::vector<ckpt::TensorView> views = views_of(tensors, sharding);
    ckpt::SaveInfo info;
    info.metadata = ckpt::to_json_object(object_of(metadata, "metadata"));
    info.training = ckpt::to_json_object(object_of(training, "training"));
    info.wall_clock_seconds = wall_clock_seconds;
    // The barrier (a step of another step in flight) is waited for in slices, so that a save
    // stuck behind a checkpoint that never completes stays interruptible.
    wait_in_slices([&](std::chrono::nanoseconds slice) { return cp_->wait_turn_for(step, slice); }, std::nullopt);
    ckpt::SaveHandle h;
    {
      py::gil_scoped_release nogil;
      h = cp_->save(rank, step, views, info, mode);
    }
    return std::make_unique<Handle>(std::move(h), deferred ? std::move(keep) : py::object());
  }

  // True once nothing is in flight, false at the deadline.
  bool wait_all_for(std::optional<double> timeout) {
    return wait_in_slices([this](std::chrono::nanoseconds slice) { return cp_->wait_all_for(slice); }, timeout);
  }
  // True once nothing is in flight and the durable tier has caught up, false at the deadline.
  bool wait_durable_for(std::optional<double> timeout) {
    return wait_in_slices([this](std::chrono::nanoseconds slice) { return cp_->wait_all_for(slice) && cp_->wait_durable_for(slice); },
                          timeout);
  }
  std::string backend() { return std::string(cp_->backend_name()); }
  py::dict stats() {
    const ckpt::CheckpointerStats s = cp_->stats();
    py::dict d;
    d["saves_started"] = s.saves_started;
    d["saves_skipped"] = s.saves_skipped;
    d["saves_refused"] = s.saves_refused;
    d["commits"] = s.commits;
    d["failures"] = s.failures;
    d["rotated"] = s.rotated;
    d["consecutive_failures"] = s.consecutive_failures;
    d["last_failure"] = s.last_failure;
    d["staging_bytes"] = s.staging_bytes;
    d["staging_allocations"] = s.staging_allocations;
    d["total_stall_s"] = std::chrono::duration<double>(s.total_stall).count();
    d["durable_copies"] = s.durable.copies;
    return d;
  }

 private:
  std::shared_ptr<ProcessCoordinator> coordinator_;  // outlives cp_ (declared first)
  std::unique_ptr<ckpt::Checkpointer> cp_;
#ifdef CKPT_PYTHON_METRICS
  std::unique_ptr<ckpt::MetricsServer> metrics_;  // reads cp_: destroyed before it (declared after)
  pid_t metrics_pid_ = 0;
#endif
};

// ---- reading ------------------------------------------------------------------------------

py::dtype numpy_dtype(ckpt::DType d) {
  using ckpt::DType;
  switch (d) {
    case DType::F16: return py::dtype("float16");
    case DType::BF16: return py::dtype("uint16");  // numpy has no bfloat16: the raw bits
    case DType::F32: return py::dtype("float32");
    case DType::F64: return py::dtype("float64");
    case DType::I8: return py::dtype("int8");
    case DType::I16: return py::dtype("int16");
    case DType::I32: return py::dtype("int32");
    case DType::I64: return py::dtype("int64");
    case DType::U8: return py::dtype("uint8");
    case DType::U16: return py::dtype("uint16");
    case DType::U32: return py::dtype("uint32");
    case DType::U64: return py::dtype("uint64");
    case DType::BOOL: return py::dtype("bool");
  }
  return py::dtype("uint8");
}

class PyReader {
 public:
  PyReader(const std::string& root, std::optional<int> world_size, const std::string& verify, bool fallback,
           std::optional<std::uint64_t> step)
      : verify_(verify_of(verify)) {
    py::gil_scoped_release nogil;
    if (step) {
      opened_ = std::make_unique<ckpt::OpenedCheckpoint>(ckpt::OpenedCheckpoint{
          .reader = ckpt::open_store(root)->open(*step, world_size), .name = {}});  // any kind of root
    } else {
      opened_ = std::make_unique<ckpt::OpenedCheckpoint>(ckpt::open_latest(
          ckpt::posix_file_system(), root,
          ckpt::OpenLatestOptions{.expected_world_size = world_size, .fallback = fallback, .verify = verify_}));
    }
  }

  const ckpt::Manifest& manifest() const { return opened_->reader.manifest(); }
  std::uint64_t step() const { return manifest().step; }
  int world_size() const { return manifest().world_size; }
  std::string dir() const { return opened_->reader.dir(); }
  bool fell_back() const { return opened_->fell_back; }
  std::string verify_name() const { return verify_ == ckpt::Verify::none ? "none" : verify_ == ckpt::Verify::fast ? "fast" : "full"; }
  // As JSON text, NaN and infinities tagged (JsonObject::dump).
  std::string metadata(int rank) const { return manifest().rank_record(rank).metadata.dump(); }
  std::string training() const { return manifest().training.dump(); }

  // (name, dtype name, shape) of the tensors rank holds (replicated ones it does not store
  // included), in the manifest's order.
  std::vector<std::tuple<std::string, std::string, std::vector<std::uint64_t>>> tensors(int rank) const {
    ckpt::check_rank(rank, world_size(), "rank", dir());
    std::vector<std::tuple<std::string, std::string, std::vector<std::uint64_t>>> out;
    for (const ckpt::TensorRecord* t : manifest().held_tensors(rank))
      out.emplace_back(t->name, std::string(ckpt::dtype_name(t->dtype)), t->shape);
    return out;
  }

  // A read-only numpy array over the mapped shard (zero copy); its chunks are verified per
  // `verify` the first time a view covers them. The array keeps the mapping alive.
  py::array read(int rank, const std::string& name, const std::optional<std::string>& verify) {
    const ckpt::Verify mode = verify ? verify_of(*verify) : verify_;
    std::shared_ptr<ckpt::MappedShard> shard;
    ckpt::TensorView v;
    {
      py::gil_scoped_release nogil;
      ckpt::check_rank(rank, world_size(), "rank", dir());
      // A replicated tensor is stored in its lowest holder's shard only; of a shard of several
      // files, in the one its entry names (unknown: the rank's first, whose error lists it).
      const ckpt::TensorRecord* held = manifest().find_held_tensor(name, rank);
      shard = mapped(held ? manifest().file_of(*held) : manifest().rank_record(rank), mode);
      v = shard->tensor(name);
    }
    std::vector<py::ssize_t> shape(v.shape.begin(), v.shape.end());
    auto* keep = new std::shared_ptr<ckpt::MappedShard>(shard);
    py::capsule base(keep, [](void* p) { delete static_cast<std::shared_ptr<ckpt::MappedShard>*>(p); });
    py::array a(numpy_dtype(v.dtype), shape, v.data.empty() ? nullptr : v.data.data(), base);
    a.attr("setflags")(py::arg("write") = false);
    return a;
  }

  py::dict load_into(int rank, const std::vector<TensorTuple>& targets, const std::optional<std::string>& verify) {
    const ckpt::Verify mode = verify ? verify_of(*verify) : verify_;
    std::vector<ckpt::LoadTarget> ts;
    ts.reserve(targets.size());
    for (const auto& [name, dtype, shape, addr, nbytes] : targets)
      ts.push_back(ckpt::LoadTarget{.name = name,
                                    .out = {reinterpret_cast<std::byte*>(addr), static_cast<std::size_t>(nbytes)},
                                    .dtype = dtype_of(dtype),
                                    .shape = shape});
    ckpt::LoadReport rep;
    {
      py::gil_scoped_release nogil;
      rep = ckpt::load_into(opened_->reader, rank, ts, mode);
    }
    py::dict d;
    d["engine"] = rep.engine;
    d["direct"] = rep.direct;
    d["fallback"] = rep.fallback;
    d["bytes_read"] = rep.bytes_read;
    d["chunks_read"] = rep.chunks_read;
    d["reads_direct"] = rep.reads_direct;
    d["parts"] = rep.parts;
    return d;
  }

  void verify(const std::optional<std::string>& verify) {
    const ckpt::Verify mode = verify ? verify_of(*verify) : ckpt::Verify::full;
    py::gil_scoped_release nogil;
    opened_->reader.verify(mode);
  }

 private:
  // One mapping per (shard file, mode), made on first use. Called without the GIL.
  std::shared_ptr<ckpt::MappedShard> mapped(const ckpt::ShardRecord& file, ckpt::Verify mode) {
    std::lock_guard lk(mu_);
    auto key = std::make_pair(static_cast<int>(manifest().file_index(file.rank, file.part)), static_cast<int>(mode));
    auto it = shards_.find(key);
    if (it != shards_.end()) return it->second;
    auto s = std::make_shared<ckpt::MappedShard>(opened_->reader, file, mode);
    shards_.emplace(key, s);
    return s;
  }

  ckpt::Verify verify_;
  std::unique_ptr<ckpt::OpenedCheckpoint> opened_;
  std::mutex mu_;
  std::map<std::pair<int, int>, std::shared_ptr<ckpt::MappedShard>> shards_;  // by (file index, mode)
};

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "ckpt's C++ core (see the ckpt package for the API)";
  m.attr("__version__") = std::string(ckpt::version());
#ifdef CKPT_PYTHON_METRICS
  m.attr("HAVE_METRICS_SERVER") = true;
#else
  m.attr("HAVE_METRICS_SERVER") = false;
#endif
  m.attr("MAX_STEP") = ckpt::kMaxStep;  // the largest step a checkpoint directory name holds

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ckpt::Error& e) {
      raise_ckpt_error(e);
    }
  });

  m.def(
      "_error_codes",
      [] {
        std::vector<std::pair<std::string, std::string>> out;
        for (int c = 0; c <= static_cast<int>(ckpt::kLastErrc); ++c)
          out.emplace_back(ckpt::errc_id(static_cast<ckpt::Errc>(c)), ckpt::errc_name(static_cast<ckpt::Errc>(c)));
        return out;
      },
      "Every ckpt::Errc as (identifier, name in messages), from the C++ library's one table: the identifier is "
      "the `code` of the ckpt.errors class raised for it");

  // The recovery planner (store/recovery.hpp): the plan as a dict, and the plan carried out.
  const auto candidate_dict = [](const ckpt::RecoveryCandidate& c) {
    py::dict d;
    d["level"] = c.level;
    d["root"] = c.root;
    d["kind"] = std::string(ckpt::recovery_level_name(c.kind));
    d["step"] = c.step;
    d["fetch"] = std::string(ckpt::recovery_fetch_name(c.fetch));
    d["bytes"] = c.bytes;
    d["passed_over"] = c.passed_over.empty() ? py::object(py::none()) : py::object(py::str(c.passed_over));
    return d;
  };
  const auto plan_dict = [candidate_dict](const ckpt::RecoveryPlan& plan) {
    py::dict d;
    d["chosen"] = plan.chosen ? py::object(candidate_dict(*plan.chosen)) : py::object(py::none());
    py::list candidates, errors;
    for (const auto& c : plan.candidates) candidates.append(candidate_dict(c));
    for (const auto& e : plan.level_errors) {
      py::dict x;
      x["level"] = e.level;
      x["root"] = e.root;
      x["code"] = std::string(ckpt::errc_id(e.code));
      x["error"] = e.error;
      errors.append(x);
    }
    d["candidates"] = candidates;
    d["level_errors"] = errors;
    d["discover_seconds"] = std::chrono::duration<double>(plan.discover).count();
    d["summary"] = plan.summary();
    return d;
  };
  m.def(
      "staging_bytes_for",
      [](const std::vector<std::tuple<std::string, std::string, std::vector<std::uint64_t>>>& tensors, int world_size) {
        std::vector<ckpt::TensorSpec> specs;
        specs.reserve(tensors.size());
        for (const auto& [name, dtype, shape] : tensors) specs.push_back({name, dtype_of(dtype), shape});
        return ckpt::staging_bytes_for(specs, world_size);
      },
      py::arg("tensors"), py::arg("world_size"), "ckpt::staging_bytes_for: (name, dtype, shape) tuples");
  m.def(
      "plan_recovery",
      [plan_dict](const std::vector<std::string>& roots, std::optional<int> world_size, const std::string& verify) {
        ckpt::RecoveryPlan plan;
        {
          py::gil_scoped_release release;
          plan = ckpt::plan_recovery(roots, {.expected_world_size = world_size, .verify = verify_of(verify)});
        }
        return plan_dict(plan);
      },
      py::arg("roots"), py::arg("world_size"), py::arg("verify"), "ckpt::plan_recovery: the plan as a dict");
  m.def(
      "recover",
      [plan_dict](const std::vector<std::string>& roots, std::optional<int> world_size, const std::string& restore_into) {
        ckpt::RecoveryPlan plan;
        std::string root;
        std::uint64_t step = 0;
        double fetch = 0, rebuild = 0;
        {
          py::gil_scoped_release release;
          const ckpt::RecoveryOptions options{.expected_world_size = world_size};
          plan = ckpt::plan_recovery(roots, options);
          const ckpt::Recovered got = ckpt::recover_planned(plan, options, restore_into);
          root = got.from.kind == ckpt::StoreKind::object_store ? restore_into : got.from.root;
          step = got.from.step;
          fetch = std::chrono::duration<double>(got.fetch).count();
          rebuild = std::chrono::duration<double>(got.rebuild).count();
        }
        py::dict d = plan_dict(plan);
        d["root"] = root;
        d["step"] = step;
        d["fetch_seconds"] = fetch;
        d["rebuild_seconds"] = rebuild;
        return d;
      },
      py::arg("roots"), py::arg("world_size"), py::arg("restore_into"),
      "ckpt::plan_recovery then ckpt::recover_planned: the plan, and the root and step to open");

  m.def(
      "split_range",
      [](std::uint64_t n, int part, int parts) {
        const ckpt::SplitRange r = ckpt::split_range(n, part, parts);
        return std::make_pair(r.first, r.count);
      },
      py::arg("n"), py::arg("part"), py::arg("parts"), "numpy.array_split's rule: part `part` of n items over `parts` parts, (first, count)");

  py::class_<Handle>(m, "Handle")
      .def("done", &Handle::done)
      .def("staged", &Handle::staged)
      .def("skipped", &Handle::skipped)
      .def_property_readonly("step", &Handle::step)
      .def("wait_for", &Handle::wait_for, py::arg("timeout"))
      .def("result", &Handle::result)
      .def("wait_staged_for", &Handle::wait_staged_for, py::arg("timeout"))
      .def("staged_result", &Handle::staged_result);

  py::class_<ProcessCoordinator, std::shared_ptr<ProcessCoordinator>>(m, "ProcessCoordinator")
      .def(py::init<int, int, py::object>(), py::arg("rank"), py::arg("world_size"), py::arg("transport"))
      .def("serve", [](ProcessCoordinator& c) { c.protocol().serve(); }, py::call_guard<py::gil_scoped_release>())
      .def("close", [](ProcessCoordinator& c) { c.protocol().close(); }, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("world_size", &ProcessCoordinator::world_size);

  py::class_<PyCheckpointer>(m, "Checkpointer")
      .def(py::init<const std::string&, int, int, const std::string&, const std::string&, const std::optional<std::string>&, int,
                    bool, bool, std::shared_ptr<ProcessCoordinator>, std::uint64_t, std::uint64_t>(),
           py::arg("root"), py::arg("world_size"), py::arg("keep_last"), py::arg("writer"), py::arg("when_busy"),
           py::arg("durable_root"), py::arg("durable_keep_last"), py::arg("allow_older_than_latest"), py::arg("allow_empty"),
           py::arg("coordinator"), py::arg("staging_bytes_per_rank") = 0, py::arg("max_file_bytes") = 0)
      .def("save", &PyCheckpointer::save, py::arg("rank"), py::arg("step"), py::arg("tensors"), py::arg("keep"),
           py::arg("metadata"), py::arg("training"), py::arg("staging"), py::arg("wall_clock_seconds"), py::arg("sharding") = "")
      .def("wait_all_for", &PyCheckpointer::wait_all_for, py::arg("timeout"))
      .def("wait_durable_for", &PyCheckpointer::wait_durable_for, py::arg("timeout"))
      .def("close", &PyCheckpointer::close)
      .def_property_readonly("backend", &PyCheckpointer::backend)
      .def("stats", &PyCheckpointer::stats)
      .def("metrics_text", &PyCheckpointer::metrics_text)
      .def("serve_metrics", &PyCheckpointer::serve_metrics, py::arg("port"), py::arg("bind_address"));

  py::class_<PyReader>(m, "Reader")
      .def(py::init<const std::string&, std::optional<int>, const std::string&, bool, std::optional<std::uint64_t>>(),
           py::arg("root"), py::arg("world_size"), py::arg("verify"), py::arg("fallback"), py::arg("step"))
      .def_property_readonly("step", &PyReader::step)
      .def_property_readonly("world_size", &PyReader::world_size)
      .def_property_readonly("dir", &PyReader::dir)
      .def_property_readonly("fell_back", &PyReader::fell_back)
      .def_property_readonly("verify_mode", &PyReader::verify_name)
      .def("metadata_json", &PyReader::metadata)
      .def("training_json", &PyReader::training)
      .def("tensors", &PyReader::tensors)
      .def("read", &PyReader::read, py::arg("rank"), py::arg("name"), py::arg("verify") = py::none())
      .def("load_into", &PyReader::load_into, py::arg("rank"), py::arg("targets"), py::arg("verify") = py::none())
      .def("verify", &PyReader::verify, py::arg("verify") = py::none());
}
