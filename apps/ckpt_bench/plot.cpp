// SPDX-License-Identifier: Apache-2.0
// The SVG: one timeline panel per save mode (sync above async, same time scale), each with a
// lane of training steps per rank (red where the rank's thread is inside save()) and one lane
// per save phase, then one bar per target: the measured ratio against its threshold.
#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstdio>
#include <string>

#include "bench.hpp"

namespace bench {

namespace json = boost::json;

namespace {

constexpr double kWidth = 1200, kLeft = 150, kRight = 30;
constexpr double kPlotW = kWidth - kLeft - kRight;

std::string esc(std::string_view s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string rect(double x, double y, double w, double h, const std::string& fill, const std::string& extra = "") {
  return "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(w, 0.6)) + "\" height=\"" + num(h) + "\" fill=\"" + fill + "\"" +
         extra + "/>\n";
}

std::string text(double x, double y, std::string_view s, const std::string& attrs = "") {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"" + attrs + ">" + esc(s) + "</text>\n";
}

double nice_step(double span) {
  const double raw = span / 10;
  const double p = std::pow(10, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}

struct Phase {
  const char* key;
  const char* label;
  const char* color;
};
constexpr Phase kPhases[] = {{"wait", "wait (barrier)", "#9e9e9e"}, {"stage", "stage (copy)", "#e6550d"},
                             {"write", "write", "#3182bd"},         {"hash", "hash (XXH3+SHA)", "#31a354"},
                             {"fsync", "fsync + close", "#756bb1"}, {"commit", "commit", "#636363"}};

// One timeline panel; returns its height.
double panel(std::string& out, double y0, const json::object& tl, const std::string& title, double span_ms, int ranks) {
  const double row = 5, lane = ranks * row + 6;
  const auto x_of = [&](double t) { return kLeft + t / span_ms * kPlotW; };
  out += text(10, y0 + 14, title, " font-weight=\"bold\" font-size=\"14\"");
  double y = y0 + 24;
  // Training steps, one row per rank; blocked intervals in red.
  out += text(10, y + lane / 2 + 4, "training steps");
  const auto& steps = tl.at("steps").as_array();
  for (int r = 0; r < ranks; ++r)
    for (std::size_t k = 0; k < steps.size(); ++k) {
      const auto& s = steps[k].as_array();
      const double a = s[0].to_number<double>(), b = s[1].to_number<double>();
      out += rect(x_of(a), y + r * row, x_of(b) - x_of(a) - 0.5, row - 1, k % 2 ? "#cfd8dc" : "#b0bec5");
    }
  for (const auto& sv : tl.at("saves").as_array()) {
    const auto& s = sv.as_object();
    const int r = static_cast<int>(s.at("rank").to_number<double>());
    const auto& b = s.at("blocked").as_array();
    const double a = b[0].to_number<double>(), e = b[1].to_number<double>();
    out += rect(x_of(a), y + r * row, x_of(e) - x_of(a), row - 1, "#d62728");
  }
  y += lane;
  for (const Phase& p : kPhases) {
    out += text(10, y + lane / 2 + 4, p.label);
    out += rect(kLeft, y, kPlotW, lane - 2, "#f7f7f7");
    for (const auto& sv : tl.at("saves").as_array()) {
      const auto& s = sv.as_object();
      const int r = static_cast<int>(s.at("rank").to_number<double>());
      const auto& iv = s.at(p.key).as_array();
      const double a = iv[0].to_number<double>(), e = iv[1].to_number<double>();
      if (e > a) out += rect(x_of(a), y + 2 + r * row, x_of(e) - x_of(a), row - 1, p.color);
    }
    y += lane;
  }
  // Time axis.
  const double step = nice_step(span_ms);
  for (double t = 0; t <= span_ms + 1e-9; t += step) {
    out += "<line x1=\"" + num(x_of(t)) + "\" y1=\"" + num(y0 + 24) + "\" x2=\"" + num(x_of(t)) + "\" y2=\"" + num(y + 2) +
           "\" stroke=\"#000\" stroke-opacity=\"0.12\"/>\n";
    out += text(x_of(t), y + 14, step >= 1000 ? num(t / 1000) + " s" : num(t) + " ms", " text-anchor=\"middle\" font-size=\"10\"");
  }
  return y + 22 - y0;
}

}  // namespace

std::string render_svg(const json::object& r) {
  std::string body;
  const int ranks = static_cast<int>(json_at(r, {"config", "ranks"}));
  const json::object* tl = r.if_contains("timeline") ? &r.at("timeline").as_object() : nullptr;
  double span = 1;
  std::vector<std::pair<std::string, const json::object*>> panels;
  if (tl)
    for (const char* m : {"sync", "async_io_uring", "async_posix"})
      if (const auto* p = tl->if_contains(m)) {
        panels.push_back({m, &p->as_object()});
        span = std::max(span, p->as_object().at("duration_ms").to_number<double>());
        // The last save may persist past the last step: the axis covers its commit too.
        for (const auto& sv : p->as_object().at("saves").as_array())
          for (const auto& kv : sv.as_object())
            if (kv.value().is_array() && kv.value().as_array().size() == 2)
              span = std::max(span, kv.value().as_array()[1].to_number<double>());
      }
  double y = 40;
  char title[256];
  std::snprintf(title, sizeof title, "ckpt-bench: %d ranks, %.2f GiB state, save every %d steps; last round", ranks,
                json_at(r, {"config", "state_bytes"}) / (1 << 30), static_cast<int>(json_at(r, {"config", "every_steps"})));
  body += text(10, 24, title, " font-weight=\"bold\" font-size=\"16\"");
  for (const auto& [m, p] : panels) {
    const std::string t = (m == "sync" ? "synchronous save (save_sync)" : "asynchronous save (" + m.substr(6) + " writer)") +
                          std::string(": red = rank thread blocked in save()");
    y += panel(body, y, *p, t, span, ranks) + 10;
  }
  body += text(kLeft, y + 4, "write starts and fsync windows are timestamped by the file system; a hash's start is inferred from its "
                            "duration (it ends before its shard's fsync)", " font-size=\"10\" fill=\"#555\"");
  y += 16;
  // Legend.
  double lx = kLeft;
  for (const Phase& p : kPhases) {
    body += rect(lx, y, 12, 10, p.color);
    body += text(lx + 16, y + 9, p.label, " font-size=\"11\"");
    lx += 150;
  }
  body += rect(lx, y, 12, 10, "#d62728");
  body += text(lx + 16, y + 9, "blocked in save()", " font-size=\"11\"");
  y += 34;

  // Target bars: the threshold sits at the middle of each bar's track; green passes, red fails.
  body += text(10, y, "targets: measured ratio against its threshold (tick = threshold; bar capped at 2x)",
               " font-weight=\"bold\" font-size=\"14\"");
  y += 12;
  const double track_x = 470, track_w = 400;
  for (const auto& tv : r.at("targets").as_array()) {
    const auto& t = tv.as_object();
    const double v = json_at(t, {"value"}), th = json_at(t, {"threshold"});
    const bool pass = t.at("pass").as_bool();
    body += text(10, y + 13, std::string(t.at("text").as_string()), " font-size=\"11\"");
    body += rect(track_x, y + 3, track_w, 12, "#eeeeee");
    if (std::isfinite(v) && th > 0) {
      const double frac = std::clamp(v / th / 2, 0.0, 1.0);
      body += rect(track_x, y + 3, frac * track_w, 12, pass ? "#2ca02c" : "#d62728");
    }
    body += "<line x1=\"" + num(track_x + track_w / 2) + "\" y1=\"" + num(y) + "\" x2=\"" + num(track_x + track_w / 2) + "\" y2=\"" +
            num(y + 18) + "\" stroke=\"#000\" stroke-width=\"2\"/>\n";
    char lbl[96];
    std::snprintf(lbl, sizeof lbl, "%s  %.3f (%s %.2f)", pass ? "PASS" : "FAIL", v, std::string(t.at("op").as_string()).c_str(), th);
    body += text(track_x + track_w + 10, y + 13, lbl, " font-size=\"11\"");
    y += 20;
  }
  y += 10;
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kWidth) + "\" height=\"" + num(y) + "\" viewBox=\"0 0 " + num(kWidth) +
                    " " + num(y) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out += rect(0, 0, kWidth, y, "#ffffff");
  out += body;
  out += "</svg>\n";
  return out;
}

}  // namespace bench
