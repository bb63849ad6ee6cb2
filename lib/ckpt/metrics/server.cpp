// SPDX-License-Identifier: Apache-2.0
#include "ckpt/metrics/server.hpp"

#include <prometheus/exposer.h>

#include <algorithm>
#include <exception>
#include <limits>
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

MetricsServer::~MetricsServer() = default;

int MetricsServer::port() const noexcept { return impl_->port; }

std::string MetricsServer::url() const {
  const std::string& a = impl_->opt.bind_address;
  return "http://" + (a.find(':') != std::string::npos ? "[" + a + "]" : a) + ":" + std::to_string(impl_->port) + "/metrics";
}

}  // namespace ckpt
