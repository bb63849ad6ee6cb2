// SPDX-License-Identifier: Apache-2.0
// The Checkpointer's counters and phase timings as Prometheus metrics (docs/metrics.md lists
// every one: name, type, labels, meaning).
//
// checkpointer_metrics() turns a stats() snapshot into metric families, the one place the
// metrics are defined; render_prometheus() writes them in the text exposition format 0.0.4
// (what a Prometheus server scrapes, or node_exporter's textfile collector reads), and the
// optional ckpt::metrics component (metrics/server.hpp) serves the same families over HTTP.
//
//   ckpt::Checkpointer ckpt(...);
//   std::string text = ckpt::render_prometheus(ckpt);   // "# HELP ckpt_saves_total ..."
//
// Pure functions of their arguments: no I/O, no lock but stats()'s; thread-safe.
#pragma once

#include "ckpt/core/export.hpp"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/runtime/checkpointer.hpp"

CKPT_API_BEGIN
namespace ckpt {

enum class MetricType { counter, gauge, histogram };

struct MetricLabel {
  std::string name, value;
};

/// A histogram's value: cumulative bucket counts by upper bound, ascending, without +Inf
/// (whose count is `count`).
struct HistogramValue {
  struct Bucket {
    double upper_bound = 0;
    std::uint64_t cumulative_count = 0;
  };
  std::vector<Bucket> buckets;
  std::uint64_t count = 0;
  double sum = 0;
};

/// One labelled value of a family: `value` for a counter or gauge, `histogram` for a histogram.
struct MetricSample {
  std::vector<MetricLabel> labels;
  double value = 0;
  HistogramValue histogram;
};

struct MetricFamily {
  std::string name;  ///< ckpt_..., base units (seconds, bytes), counters ending in _total
  std::string help;
  MetricType type = MetricType::gauge;
  std::vector<MetricSample> samples;  ///< may be empty (a value not known yet)
};

/// Which tiers' families carry a sample (label tier="durable" / tier="local").
struct MetricTiers {
  bool durable = false;
  bool local = false;
};

/// The metric families of a stats() snapshot, in a fixed order (docs/metrics.md).
std::vector<MetricFamily> checkpointer_metrics(const CheckpointerStats& stats, MetricTiers tiers = {});
/// The same for `checkpointer`'s stats(), with the tiers its options configure.
std::vector<MetricFamily> checkpointer_metrics(const Checkpointer& checkpointer);

/// The text exposition format 0.0.4: for each family "# HELP", "# TYPE", then its samples
/// (a histogram's _bucket{le=...}, _sum and _count), each line ending in '\n'.
std::string render_prometheus(std::span<const MetricFamily> families);
std::string render_prometheus(const Checkpointer& checkpointer);

/// The Content-Type of render_prometheus()'s text.
inline constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace ckpt
CKPT_API_END
