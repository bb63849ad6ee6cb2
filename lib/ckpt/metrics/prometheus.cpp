// SPDX-License-Identifier: Apache-2.0
#include "ckpt/metrics/prometheus.hpp"

#include <charconv>
#include <cmath>
#include <utility>

namespace ckpt {

namespace {

double as_double(std::uint64_t v) { return static_cast<double>(v); }

MetricFamily family(std::string name, std::string help, MetricType type) {
  return MetricFamily{std::move(name), std::move(help), type, {}};
}

MetricFamily single(std::string name, std::string help, MetricType type, double value) {
  MetricFamily f = family(std::move(name), std::move(help), type);
  f.samples.push_back(MetricSample{{}, value, {}});
  return f;
}

HistogramValue histogram_of(const DurationHistogram& h) {
  HistogramValue v;
  for (std::size_t i = 0; i < DurationHistogram::kBounds.size(); ++i)
    v.buckets.push_back({DurationHistogram::kBounds[i], h.at_most[i]});
  v.count = h.count;
  v.sum = h.sum_seconds;
  return v;
}

// The tier families: one sample per configured tier, labelled tier="durable" or "local".
void add_tier_families(std::vector<MetricFamily>& out, const CheckpointerStats& s, MetricTiers tiers) {
  std::vector<std::pair<std::string, const DurableStats*>> present;
  if (tiers.durable) present.emplace_back("durable", &s.durable);
  if (tiers.local) present.emplace_back("local", &s.local_tier);
  struct Def {
    const char* name;
    const char* help;
    MetricType type;
    double (*value)(const DurableStats&);
  };
  static constexpr Def defs[] = {
      {"ckpt_tier_submitted_total", "Committed steps handed to the tier for copying.", MetricType::counter,
       [](const DurableStats& d) { return as_double(d.submitted); }},
      {"ckpt_tier_copies_total", "Checkpoints committed in the tier.", MetricType::counter,
       [](const DurableStats& d) { return as_double(d.copies); }},
      {"ckpt_tier_copy_failures_total", "Failed copy attempts to the tier.", MetricType::counter,
       [](const DurableStats& d) { return as_double(d.failures); }},
      {"ckpt_tier_superseded_total", "Steps replaced by a newer one before they were copied.", MetricType::counter,
       [](const DurableStats& d) { return as_double(d.superseded); }},
      {"ckpt_tier_given_up_total", "Steps dropped after the last allowed attempt.", MetricType::counter,
       [](const DurableStats& d) { return as_double(d.given_up); }},
      {"ckpt_tier_copied_bytes_total", "Shard bytes copied to the tier.", MetricType::counter,
       [](const DurableStats& d) { return as_double(d.bytes); }},
      {"ckpt_tier_rotated_total", "Checkpoints removed from the tier by its rotation.", MetricType::counter,
       [](const DurableStats& d) { return as_double(d.rotated); }},
      {"ckpt_tier_leftovers_collected_total", "Object-store tier: leftover objects removed plus multipart uploads aborted.",
       MetricType::counter, [](const DurableStats& d) { return as_double(d.leftovers_collected); }},
      {"ckpt_tier_gave_up", "1 once a drain of the tier gave up (nothing more is copied), else 0.", MetricType::gauge,
       [](const DurableStats& d) { return d.gave_up ? 1.0 : 0.0; }},
      {"ckpt_tier_lease_lost", "Object-store tier: 1 once its writer lease was taken over (nothing more is committed), else 0.",
       MetricType::gauge, [](const DurableStats& d) { return d.lease_lost ? 1.0 : 0.0; }},
  };
  for (const Def& def : defs) {
    MetricFamily f = family(def.name, def.help, def.type);
    for (const auto& [tier, d] : present) f.samples.push_back(MetricSample{{{"tier", tier}}, def.value(*d), {}});
    out.push_back(std::move(f));
  }
  MetricFamily last = family("ckpt_tier_last_step", "The newest step committed in the tier (no sample until one is).", MetricType::gauge);
  for (const auto& [tier, d] : present)
    if (d->last_step) last.samples.push_back(MetricSample{{{"tier", tier}}, as_double(*d->last_step), {}});
  out.push_back(std::move(last));
}

// A sample value as the exposition format writes it: an integer in full (a byte counter stays
// 123456789012, never 1.23457e+11), else the shortest text that reads back as the same double,
// as %g would write it (0.0005, not 5e-04: the `le` labels clients conventionally write);
// NaN, +Inf, -Inf.
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::trunc(v) && std::fabs(v) < 9.0e15) return std::to_string(static_cast<std::int64_t>(v));
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);
  return std::string(buf, r.ptr);
}

// # HELP text: backslash and newline escaped.
std::string help_text(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// {name="value",...}: backslash, double quote and newline escaped in the values.
std::string label_set(const std::vector<MetricLabel>& labels, const MetricLabel* extra = nullptr) {
  if (labels.empty() && !extra) return {};
  std::string out = "{";
  auto add = [&](const MetricLabel& l) {
    if (out.size() > 1) out += ',';
    out += l.name + "=\"";
    for (const char c : l.value) {
      if (c == '\\') out += "\\\\";
      else if (c == '"') out += "\\\"";
      else if (c == '\n') out += "\\n";
      else out += c;
    }
    out += '"';
  };
  for (const auto& l : labels) add(l);
  if (extra) add(*extra);
  return out + "}";
}

std::string_view type_name(MetricType t) {
  switch (t) {
    case MetricType::counter: return "counter";
    case MetricType::gauge: return "gauge";
    case MetricType::histogram: return "histogram";
  }
  return "untyped";
}

}  // namespace

std::vector<MetricFamily> checkpointer_metrics(const CheckpointerStats& s, MetricTiers tiers) {
  std::vector<MetricFamily> out;
  using T = MetricType;
  out.push_back(single("ckpt_saves_total", "save() calls accepted, one per rank and step.", T::counter, as_double(s.saves_started)));
  out.push_back(single("ckpt_saves_skipped_total", "save() calls skipped because a checkpoint was in flight (BusyPolicy::skip).",
                       T::counter, as_double(s.saves_skipped)));
  out.push_back(single("ckpt_checkpoints_committed_total", "Checkpoints committed (one per step, all ranks).", T::counter,
                       as_double(s.commits)));
  out.push_back(single("ckpt_save_failures_total", "Checkpoints that failed (one per step, all ranks).", T::counter,
                       as_double(s.failures)));
  out.push_back(single("ckpt_saves_refused_total", "Checkpoints refused as the caller's mistake (not failures).", T::counter,
                       as_double(s.saves_refused)));
  out.push_back(single("ckpt_consecutive_save_failures", "Checkpoints failed since the last commit (0 after a commit).", T::gauge,
                       as_double(s.consecutive_failures)));
  MetricFamily last = family("ckpt_last_committed_step", "The newest step committed by this process (no sample until one is).", T::gauge);
  if (s.last_committed_step) last.samples.push_back(MetricSample{{}, as_double(*s.last_committed_step), {}});
  out.push_back(std::move(last));
  out.push_back(single("ckpt_committed_bytes_total", "Shard bytes of this process's ranks in committed checkpoints.", T::counter,
                       as_double(s.bytes_committed)));
  out.push_back(single("ckpt_checkpoints_rotated_total", "Checkpoints removed by rotation (keep_last).", T::counter,
                       as_double(s.rotated)));
  out.push_back(single("ckpt_early_rotations_total", "Saves before which a nearly full disk made room.", T::counter,
                       as_double(s.early_rotations)));
  out.push_back(single("ckpt_early_rotated_total", "Checkpoints removed to make room on a nearly full disk.", T::counter,
                       as_double(s.early_rotated)));
  out.push_back(single("ckpt_staging_bytes", "Staging memory held now, all ranks of this process.", T::gauge, as_double(s.staging_bytes)));
  out.push_back(single("ckpt_staging_allocations_total", "Times a staging buffer was allocated or grown.", T::counter,
                       as_double(s.staging_allocations)));
  out.push_back(single("ckpt_save_stall_seconds_total", "Time save() waited for the previous checkpoint (back-pressure), every save.",
                       T::counter, std::chrono::duration<double>(s.total_stall).count()));
  MetricFamily phases = family("ckpt_save_phase_seconds",
                               "Duration of each phase of a rank's save, over the saves of committed checkpoints.", T::histogram);
  const std::pair<const char*, const DurationHistogram*> by_phase[] = {
      {"stall", &s.phases.stall}, {"stage", &s.phases.stage},   {"write", &s.phases.write}, {"hash", &s.phases.hash},
      {"fsync", &s.phases.fsync}, {"commit", &s.phases.commit}, {"total", &s.phases.total}};
  for (const auto& [phase, h] : by_phase) phases.samples.push_back(MetricSample{{{"phase", phase}}, 0, histogram_of(*h)});
  out.push_back(std::move(phases));
  add_tier_families(out, s, tiers);
  return out;
}

std::vector<MetricFamily> checkpointer_metrics(const Checkpointer& checkpointer) {
  const auto& opt = checkpointer.options();
  return checkpointer_metrics(checkpointer.stats(), MetricTiers{opt.durable.has_value(), opt.local_tier.has_value()});
}

std::string render_prometheus(std::span<const MetricFamily> families) {
  std::string out;
  for (const auto& f : families) {
    out += "# HELP " + f.name + ' ' + help_text(f.help) + '\n';
    out += "# TYPE " + f.name + ' ' + std::string(type_name(f.type)) + '\n';
    for (const auto& s : f.samples) {
      if (f.type != MetricType::histogram) {
        out += f.name + label_set(s.labels) + ' ' + number(s.value) + '\n';
        continue;
      }
      for (const auto& b : s.histogram.buckets) {
        const MetricLabel le{"le", number(b.upper_bound)};
        out += f.name + "_bucket" + label_set(s.labels, &le) + ' ' + number(as_double(b.cumulative_count)) + '\n';
      }
      const MetricLabel inf{"le", "+Inf"};
      out += f.name + "_bucket" + label_set(s.labels, &inf) + ' ' + number(as_double(s.histogram.count)) + '\n';
      out += f.name + "_sum" + label_set(s.labels) + ' ' + number(s.histogram.sum) + '\n';
      out += f.name + "_count" + label_set(s.labels) + ' ' + number(as_double(s.histogram.count)) + '\n';
    }
  }
  return out;
}

std::string render_prometheus(const Checkpointer& checkpointer) { return render_prometheus(checkpointer_metrics(checkpointer)); }

}  // namespace ckpt
