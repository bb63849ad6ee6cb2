// SPDX-License-Identifier: Apache-2.0
// render_prometheus (metrics/prometheus.hpp): every documented metric, metric by metric,
// against stats whose values are known, and against a Checkpointer after some saves.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "ckpt/metrics/prometheus.hpp"
#include "exposition.hpp"
#include "metrics_fixture.hpp"

namespace {

using ckpt::test::parse_exposition;

// Stats with a distinct value in every counter, so a metric reading the wrong field shows.
ckpt::CheckpointerStats known_stats() {
  ckpt::CheckpointerStats s;
  s.saves_started = 101, s.saves_skipped = 3, s.commits = 40, s.failures = 5, s.saves_refused = 2;
  s.rotated = 37, s.early_rotations = 4, s.early_rotated = 6, s.consecutive_failures = 1;
  s.staging_bytes = 1 << 20, s.staging_allocations = 7;
  s.total_stall = std::chrono::milliseconds(1500);
  s.bytes_committed = 123456789012ull;
  s.last_committed_step = 400;
  s.phases.write.observe(std::chrono::microseconds(300));  // <= 0.0005
  s.phases.write.observe(std::chrono::milliseconds(20));   // <= 0.025
  s.phases.write.observe(std::chrono::seconds(90));        // only +Inf
  s.phases.total.observe(std::chrono::milliseconds(2));
  s.durable = {.submitted = 40, .copies = 38, .failures = 3, .superseded = 1, .given_up = 1, .bytes = 999, .last_step = 390};
  s.durable.rotated = 28, s.durable.leftovers_collected = 2, s.durable.gave_up = true;
  s.local_tier.copies = 9;
  return s;
}

}  // namespace

TEST_CASE("render_prometheus gives every documented metric with its HELP, its TYPE and the value of its stats field") {
  const auto text = ckpt::render_prometheus(ckpt::checkpointer_metrics(known_stats(), {.durable = true, .local = true}));
  CAPTURE(text);
  const auto e = parse_exposition(text);
  ckpt::test::check_documented(e);
  CHECK(e.value("ckpt_saves_total") == 101);
  CHECK(e.value("ckpt_saves_skipped_total") == 3);
  CHECK(e.value("ckpt_checkpoints_committed_total") == 40);
  CHECK(e.value("ckpt_save_failures_total") == 5);
  CHECK(e.value("ckpt_saves_refused_total") == 2);
  CHECK(e.value("ckpt_consecutive_save_failures") == 1);
  CHECK(e.value("ckpt_last_committed_step") == 400);
  CHECK(e.value("ckpt_committed_bytes_total") == 123456789012.0);
  CHECK(e.value("ckpt_checkpoints_rotated_total") == 37);
  CHECK(e.value("ckpt_early_rotations_total") == 4);
  CHECK(e.value("ckpt_early_rotated_total") == 6);
  CHECK(e.value("ckpt_staging_bytes") == 1048576);
  CHECK(e.value("ckpt_staging_allocations_total") == 7);
  CHECK(e.value("ckpt_save_stall_seconds_total") == 1.5);
  CHECK(text.find("\nckpt_committed_bytes_total 123456789012\n") != std::string::npos);  // an integer, not 1.23e+11

  // The histogram: cumulative buckets, +Inf equal to _count, _sum in seconds.
  const std::map<std::string, std::string> write{{"phase", "write"}};
  auto bucket = [&](const char* phase, const char* le) { return e.value("ckpt_save_phase_seconds_bucket", {{"phase", phase}, {"le", le}}); };
  CHECK(bucket("write", "0.0005") == 1);
  CHECK(bucket("write", "0.01") == 1);
  CHECK(bucket("write", "0.025") == 2);
  CHECK(bucket("write", "60") == 2);
  CHECK(bucket("write", "+Inf") == 3);
  CHECK(e.value("ckpt_save_phase_seconds_count", write) == 3);
  CHECK(e.value("ckpt_save_phase_seconds_sum", write) == doctest::Approx(90.0203));
  CHECK(bucket("total", "0.0025") == 1);
  for (const char* phase : {"stall", "stage", "write", "hash", "fsync", "commit", "total"}) {
    CAPTURE(phase);
    CHECK(e.value("ckpt_save_phase_seconds_count", {{"phase", phase}}) >= 0);
  }
  CHECK(e.count("ckpt_save_phase_seconds_bucket") == 7 * (ckpt::DurationHistogram::kBounds.size() + 1));

  // One sample per tier.
  CHECK(e.value("ckpt_tier_submitted_total", {{"tier", "durable"}}) == 40);
  CHECK(e.value("ckpt_tier_copies_total", {{"tier", "durable"}}) == 38);
  CHECK(e.value("ckpt_tier_copies_total", {{"tier", "local"}}) == 9);
  CHECK(e.value("ckpt_tier_copy_failures_total", {{"tier", "durable"}}) == 3);
  CHECK(e.value("ckpt_tier_superseded_total", {{"tier", "durable"}}) == 1);
  CHECK(e.value("ckpt_tier_given_up_total", {{"tier", "durable"}}) == 1);
  CHECK(e.value("ckpt_tier_copied_bytes_total", {{"tier", "durable"}}) == 999);
  CHECK(e.value("ckpt_tier_rotated_total", {{"tier", "durable"}}) == 28);
  CHECK(e.value("ckpt_tier_leftovers_collected_total", {{"tier", "durable"}}) == 2);
  CHECK(e.value("ckpt_tier_gave_up", {{"tier", "durable"}}) == 1);
  CHECK(e.value("ckpt_tier_gave_up", {{"tier", "local"}}) == 0);
  CHECK(e.value("ckpt_tier_lease_lost", {{"tier", "durable"}}) == 0);
  CHECK(e.value("ckpt_tier_last_step", {{"tier", "durable"}}) == 390);
  CHECK(e.count("ckpt_tier_last_step") == 1);  // the local tier has committed nothing: no sample
}

TEST_CASE("a value not known yet has its HELP and TYPE lines and no sample, and tiers not configured have no samples") {
  const auto e = parse_exposition(ckpt::render_prometheus(ckpt::checkpointer_metrics(ckpt::CheckpointerStats{})));
  ckpt::test::check_documented(e);
  CHECK(e.count("ckpt_last_committed_step") == 0);
  CHECK(e.count("ckpt_tier_copies_total") == 0);
  CHECK(e.value("ckpt_saves_total") == 0);
  CHECK(e.value("ckpt_save_phase_seconds_bucket", {{"phase", "total"}, {"le", "+Inf"}}) == 0);
}

TEST_CASE("label values and help text are escaped as the text format requires") {
  ckpt::MetricFamily f{"ckpt_test", "a \\ backslash and a\nnewline", ckpt::MetricType::gauge, {}};
  f.samples.push_back({{{"path", "a\"b\\c\nd"}}, 2.5, {}});
  f.samples.push_back({{{"path", "inf"}}, HUGE_VAL, {}});
  const std::vector<ckpt::MetricFamily> families{f};
  const auto text = ckpt::render_prometheus(families);
  CHECK(text ==
        "# HELP ckpt_test a \\\\ backslash and a\\nnewline\n"
        "# TYPE ckpt_test gauge\n"
        "ckpt_test{path=\"a\\\"b\\\\c\\nd\"} 2.5\n"
        "ckpt_test{path=\"inf\"} +Inf\n");
  const auto e = parse_exposition(text);
  CHECK(e.value("ckpt_test", {{"path", "a\"b\\c\nd"}}) == 2.5);
}

TEST_CASE("a Checkpointer's metrics after three saves of two ranks count them and time every phase") {
  ckpt::test::TempDir dir("ckpt-metrics");
  const auto root = (dir.path() / "root").string();
  ckpt::Checkpointer ckpt({.root = root, .world_size = 2, .keep_last = 2, .backend = ckpt::WriterBackend::posix});
  const std::size_t n = 4096;
  ckpt::test::save_steps(ckpt, 2, 3, n);
  const auto stats = ckpt.stats();
  const auto e = parse_exposition(ckpt::render_prometheus(ckpt));
  ckpt::test::check_documented(e);
  CHECK(e.value("ckpt_saves_total") == 6);
  CHECK(e.value("ckpt_checkpoints_committed_total") == 3);
  CHECK(e.value("ckpt_save_failures_total") == 0);
  CHECK(e.value("ckpt_consecutive_save_failures") == 0);
  CHECK(e.value("ckpt_last_committed_step") == 3);
  CHECK(e.value("ckpt_checkpoints_rotated_total") == 1);  // keep_last 2
  CHECK(e.value("ckpt_committed_bytes_total") == static_cast<double>(stats.bytes_committed));
  CHECK(e.value("ckpt_committed_bytes_total") > 3 * 2 * n * sizeof(float));
  CHECK(e.value("ckpt_staging_bytes") >= 2 * n * sizeof(float));
  CHECK(e.count("ckpt_tier_copies_total") == 0);  // no tier configured
  for (const char* phase : {"stall", "stage", "write", "hash", "fsync", "commit", "total"}) {
    CAPTURE(phase);
    CHECK(e.value("ckpt_save_phase_seconds_count", {{"phase", phase}}) == 6);  // 3 steps x 2 ranks
    CHECK(e.value("ckpt_save_phase_seconds_bucket", {{"phase", phase}, {"le", "+Inf"}}) == 6);
    const double sum = e.value("ckpt_save_phase_seconds_sum", {{"phase", phase}});
    CHECK(sum >= 0);
    CHECK(sum < 60);
    double previous = 0;  // cumulative: never decreasing
    for (const double le : ckpt::DurationHistogram::kBounds) {
      char text[32];
      std::snprintf(text, sizeof text, "%g", le);
      const double b = e.value("ckpt_save_phase_seconds_bucket", {{"phase", phase}, {"le", text}});
      CHECK(b >= previous);
      previous = b;
    }
  }
  // The whole save takes at least its write and its commit.
  CHECK(e.value("ckpt_save_phase_seconds_sum", {{"phase", "total"}}) >= e.value("ckpt_save_phase_seconds_sum", {{"phase", "commit"}}));
}
