// SPDX-License-Identifier: Apache-2.0
// The optional HTTP endpoint of the Checkpointer's metrics: the ckpt::metrics component (CMake
// option CKPT_METRICS, built when prometheus-cpp is found; ckpt::ckpt never links it).
//
// GET /metrics answers render_prometheus()'s families in the text format 0.0.4, served by
// prometheus-cpp's Exposer (civetweb): concurrent scrapes, keep-alive and gzip are its job.
// A program that already runs an Exposer adds ckpt's metrics to it instead of opening a
// second port:
//
//   auto metrics = std::make_shared<ckpt::MetricsCollectable>([&] { return ckpt::checkpointer_metrics(ckpt); });
//   exposer.RegisterCollectable(metrics);
//
// or serves them on a port of their own:
//
//   ckpt::MetricsServer server(ckpt, {.port = 9464});   // http://127.0.0.1:9464/metrics
#pragma once

#include "ckpt/core/export.hpp"

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "ckpt/metrics/prometheus.hpp"

CKPT_API_BEGIN
namespace ckpt {

/// ckpt's families as prometheus-cpp's (same names, help, types, labels and values).
std::vector<prometheus::MetricFamily> to_prometheus_families(std::span<const MetricFamily> families);

/// A prometheus-cpp Collectable that calls `collect` at every scrape (on the Exposer's
/// threads: `collect` must be thread-safe; checkpointer_metrics(const Checkpointer&) is).
class MetricsCollectable : public prometheus::Collectable {
 public:
  explicit MetricsCollectable(std::function<std::vector<MetricFamily>()> collect);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::function<std::vector<MetricFamily>()> collect_;
};

struct MetricsServerOptions {
  int port = 0;                            ///< 0: a free port the system picks (port() says which)
  std::string bind_address = "127.0.0.1";  ///< loopback by default: say "0.0.0.0" to be scraped from elsewhere
  int threads = 2;                         ///< the Exposer's request threads
};

/// Serves GET /metrics until destroyed. Construction binds the port; the destructor stops
/// the server (waiting for a scrape in progress). Not copyable.
class MetricsServer {
 public:
  /// Serves checkpointer_metrics(checkpointer), which must outlive this object. Throws
  /// Errc::io_error naming address and port when it cannot bind (a port in use),
  /// Errc::invalid_argument for a port outside 0..65535.
  MetricsServer(const Checkpointer& checkpointer, MetricsServerOptions options = {});
  /// Serves what `collect` returns at each scrape (thread-safe, see MetricsCollectable).
  MetricsServer(std::function<std::vector<MetricFamily>()> collect, MetricsServerOptions options = {});
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const noexcept;  ///< the port bound
  std::string url() const;    ///< http://ADDRESS:PORT/metrics

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
CKPT_API_END
