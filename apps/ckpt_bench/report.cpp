// SPDX-License-Identifier: Apache-2.0
// Statistics and JSON formatting.
#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "bench.hpp"

namespace bench {

namespace json = boost::json;

Summary summarize(std::vector<double> v) {
  Summary s;
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.max = v.back();
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  // Nearest-rank percentile: with fewer than 100 samples p99 is the maximum.
  const auto rank = static_cast<std::size_t>(std::ceil(0.99 * static_cast<double>(v.size())));
  s.p99 = v[std::max<std::size_t>(rank, 1) - 1];
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  return s;
}

json::object summary_json(const Summary& s) {
  return {{"n", s.n}, {"min", s.min}, {"median", s.median}, {"p99", s.p99}, {"max", s.max}, {"mean", s.mean}};
}

double json_at(const json::object& o, std::initializer_list<std::string_view> path) {
  const json::object* obj = &o;
  const json::value* cur = nullptr;
  for (auto key : path) {
    if (!obj) return std::numeric_limits<double>::quiet_NaN();
    cur = obj->if_contains(key);
    if (!cur) return std::numeric_limits<double>::quiet_NaN();
    obj = cur->is_object() ? &cur->get_object() : nullptr;
  }
  if (!cur || !cur->is_number()) return std::numeric_limits<double>::quiet_NaN();
  return cur->to_number<double>();
}

namespace {

void put_string(std::string& out, std::string_view s) { out += json::serialize(json::value(json::string(s))); }

void put_double(std::string& out, double d) {
  if (!std::isfinite(d)) {
    out += "null";
    return;
  }
  char buf[64];
  if (d == std::floor(d) && std::fabs(d) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", d);
  else std::snprintf(buf, sizeof buf, "%.6g", d);
  out += buf;
}

void put(std::string& out, const json::value& v, int indent) {
  const std::string pad(static_cast<std::size_t>(indent + 2), ' ');
  switch (v.kind()) {
    case json::kind::object: {
      const auto& o = v.get_object();
      if (o.empty()) {
        out += "{}";
        return;
      }
      out += "{\n";
      bool first = true;
      for (const auto& kv : o) {
        if (!first) out += ",\n";
        first = false;
        out += pad;
        put_string(out, kv.key());
        out += ": ";
        put(out, kv.value(), indent + 2);
      }
      out += '\n';
      out.append(static_cast<std::size_t>(indent), ' ');
      out += '}';
      return;
    }
    case json::kind::array: {
      const auto& a = v.get_array();
      // Arrays of numbers (series) stay on one line.
      const bool flat = std::all_of(a.begin(), a.end(), [](const json::value& e) { return e.is_number() || e.is_array(); });
      if (a.empty()) {
        out += "[]";
        return;
      }
      out += flat ? "[" : "[\n";
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (i) out += flat ? ", " : ",\n";
        if (!flat) out += pad;
        put(out, a[i], flat ? indent : indent + 2);
      }
      if (!flat) {
        out += '\n';
        out.append(static_cast<std::size_t>(indent), ' ');
      }
      out += "]";
      return;
    }
    case json::kind::string: put_string(out, v.get_string()); return;
    case json::kind::double_: put_double(out, v.get_double()); return;
    default: out += json::serialize(v); return;
  }
}

}  // namespace

std::string pretty_json(const json::value& v) {
  std::string out;
  put(out, v, 0);
  out += "\n";
  return out;
}

}  // namespace bench
