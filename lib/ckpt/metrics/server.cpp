// SPDX-License-Identifier: Apache-2.0
#include "ckpt/metrics/server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/exposer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <limits>
#include <system_error>
#include <thread>
#include <utility>

#include "ckpt/core/error.hpp"

namespace ckpt {

namespace {

prometheus::MetricType prometheus_type(MetricType t) {
  switch (t) {
    case MetricType::counter: return prometheus::MetricType::Counter;
    case MetricType::gauge: return prometheus::MetricType::Gauge;
    case MetricType::histogram: return prometheus::MetricType::Histogram;
  }
  return prometheus::MetricType::Untyped;
}

// Opens and closes a connection to the IPv4 `address` (0.0.0.0: loopback) and `port`; false if
// the address is not IPv4 or nothing answered.
bool poke(const std::string& address, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, address == "0.0.0.0" ? "127.0.0.1" : address.c_str(), &a.sin_addr) != 1) return false;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

std::vector<prometheus::MetricFamily> to_prometheus_families(std::span<const MetricFamily> families) {
  std::vector<prometheus::MetricFamily> out;
  out.reserve(families.size());
  for (const auto& f : families) {
    prometheus::MetricFamily pf{f.name, f.help, prometheus_type(f.type), {}};
    for (const auto& s : f.samples) {
      prometheus::ClientMetric m;
      for (const auto& l : s.labels) m.label.push_back({l.name, l.value});
      switch (f.type) {
        case MetricType::counter: m.counter.value = s.value; break;
        case MetricType::gauge: m.gauge.value = s.value; break;
        case MetricType::histogram:
          m.histogram.sample_count = s.histogram.count;
          m.histogram.sample_sum = s.histogram.sum;
          for (const auto& b : s.histogram.buckets) m.histogram.bucket.push_back({b.cumulative_count, b.upper_bound});
          // prometheus-cpp writes the +Inf bucket from the last bucket it is given.
          m.histogram.bucket.push_back({s.histogram.count, std::numeric_limits<double>::infinity()});
          break;
      }
      pf.metric.push_back(std::move(m));
    }
    out.push_back(std::move(pf));
  }
  return out;
}

MetricsCollectable::MetricsCollectable(std::function<std::vector<MetricFamily>()> collect) : collect_(std::move(collect)) {
  if (!collect_) throw Error(Errc::invalid_argument, {}, "MetricsCollectable: an empty collect function");
}

std::vector<prometheus::MetricFamily> MetricsCollectable::Collect() const { return to_prometheus_families(collect_()); }

struct MetricsServer::Impl {
  MetricsServerOptions opt;
  std::shared_ptr<MetricsCollectable> collectable;
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;
};

MetricsServer::MetricsServer(const Checkpointer& checkpointer, MetricsServerOptions options)
    : MetricsServer([&checkpointer] { return checkpointer_metrics(checkpointer); }, std::move(options)) {}

MetricsServer::MetricsServer(std::function<std::vector<MetricFamily>()> collect, MetricsServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  const std::string where = options.bind_address + ":" + std::to_string(options.port);
  if (options.port < 0 || options.port > 65535)
    throw Error(Errc::invalid_argument, where, "metrics port out of range", "0..65535", std::to_string(options.port));
  impl_->opt = std::move(options);
  impl_->collectable = std::make_shared<MetricsCollectable>(std::move(collect));
  try {
    impl_->exposer = std::make_unique<prometheus::Exposer>(where, static_cast<std::size_t>(std::max(1, impl_->opt.threads)));
  } catch (const std::exception& e) {
    // civetweb says only "null context when constructing CivetServer": a bind that failed.
    throw Error(Errc::io_error, where, std::string("cannot serve metrics (the address is in use or not local?): ") + e.what());
  }
  impl_->exposer->RegisterCollectable(impl_->collectable);
  const auto ports = impl_->exposer->GetListeningPorts();
  impl_->port = ports.empty() ? impl_->opt.port : ports.front();
}

MetricsServer::~MetricsServer() {
  // civetweb's listening thread polls in quanta of 2 s and notices the stop only when its poll
  // returns, so a stop after a scrape took 2 s: a connection made while the stop waits for that
  // thread ends the wait at once (measured: 2.0 s down to a few ms).
  std::atomic<bool> stopped{false};
  std::thread waker;
  try {
    waker = std::thread([&] {
      while (!stopped.load() && poke(impl_->opt.bind_address, impl_->port)) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    });
  } catch (const std::system_error&) {
    // No thread to spare: the stop takes its 2 s.
  }
  impl_->exposer.reset();
  stopped = true;
  if (waker.joinable()) waker.join();
}

int MetricsServer::port() const noexcept { return impl_->port; }

std::string MetricsServer::url() const {
  const std::string& a = impl_->opt.bind_address;
  return "http://" + (a.find(':') != std::string::npos ? "[" + a + "]" : a) + ":" + std::to_string(impl_->port) + "/metrics";
}

}  // namespace ckpt
