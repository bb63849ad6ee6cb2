// SPDX-License-Identifier: Apache-2.0
// Reading the Prometheus text format back, and the metrics docs/metrics.md documents: what
// the render and the endpoint tests check against.
#pragma once

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace ckpt::test {

struct Sample {
  std::string name;                           // with a histogram's _bucket, _sum or _count
  std::map<std::string, std::string> labels;  // unescaped
  double value = 0;
};

struct Exposition {
  std::map<std::string, std::string> help, type;  // by family name
  std::vector<Sample> samples;
  std::vector<std::string> bad_lines;  // lines that are none of the above

  /// The value of the one sample `name` with `labels` (a test failure if there is not exactly one).
  double value(const std::string& name, const std::map<std::string, std::string>& labels = {}) const {
    const Sample* found = nullptr;
    int n = 0;
    for (const auto& s : samples)
      if (s.name == name && s.labels == labels) found = &s, ++n;
    CAPTURE(name);
    REQUIRE(n == 1);
    return found->value;
  }
  std::size_t count(const std::string& name) const {
    std::size_t n = 0;
    for (const auto& s : samples) n += s.name == name;
    return n;
  }
};

inline double parse_value(const std::string& v) {
  if (v == "+Inf") return HUGE_VAL;
  if (v == "-Inf") return -HUGE_VAL;
  if (v == "NaN") return NAN;
  std::size_t used = 0;
  const double d = std::stod(v, &used);
  if (used != v.size()) throw std::invalid_argument(v);
  return d;
}

/// Parses the text format 0.0.4 strictly enough to catch a malformed line.
inline Exposition parse_exposition(const std::string& text) {
  static const std::regex meta(R"(^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$)");
  static const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)( -?\d+)?$)");
  static const std::regex label(R"re(([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?)re");
  Exposition out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (line.empty()) continue;
    if (std::regex_match(line, m, meta)) {
      (m[1] == "HELP" ? out.help : out.type)[m[2]] = m[3];
      continue;
    }
    if (line[0] == '#') continue;  // a comment
    if (!std::regex_match(line, m, sample)) {
      out.bad_lines.push_back(line);
      continue;
    }
    Sample s;
    s.name = m[1];
    std::string labels = m[3];
    for (std::sregex_iterator it(labels.begin(), labels.end(), label), end; it != end; ++it) {
      std::string v, raw = (*it)[2];
      for (std::size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '\\' && i + 1 < raw.size()) {
          ++i;
          v += raw[i] == 'n' ? '\n' : raw[i];
        } else {
          v += raw[i];
        }
      }
      s.labels[(*it)[1]] = v;
    }
    try {
      s.value = parse_value(m[4]);
    } catch (const std::exception&) {
      out.bad_lines.push_back(line);
      continue;
    }
    out.samples.push_back(std::move(s));
  }
  return out;
}

struct DocumentedMetric {
  std::string name, type, labels;
};

/// The rows of docs/metrics.md's table "Every metric": | `name` | type | labels | meaning |.
inline std::vector<DocumentedMetric> documented_metrics() {
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/docs/metrics.md");
  REQUIRE(in);
  static const std::regex row(R"(^\| `(ckpt_[a-z_]+)` \| (counter|gauge|histogram|summary) \| ([^|]*)\|)");
  std::vector<DocumentedMetric> out;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) out.push_back({m[1], m[2], m[3]});
  }
  REQUIRE(out.size() >= 20);
  return out;
}

/// Every documented metric has its # HELP and the documented # TYPE in `e`, every line parsed,
/// no ckpt_ family is undocumented, and a counter's name ends in _total. (The endpoint also
/// serves prometheus-cpp's own exposer_* families.)
inline void check_documented(const Exposition& e) {
  CHECK(e.bad_lines.empty());
  for (const auto& l : e.bad_lines) CAPTURE(l);
  const auto docs = documented_metrics();
  for (const auto& d : docs) {
    CAPTURE(d.name);
    CHECK(e.help.count(d.name) == 1);
    REQUIRE(e.type.count(d.name) == 1);
    CHECK(e.type.at(d.name) == d.type);
    if (d.type == "counter") CHECK(d.name.ends_with("_total"));
  }
  for (const auto& [name, type] : e.type) {
    if (!name.starts_with("ckpt_")) continue;
    CAPTURE(name);
    bool documented = false;
    for (const auto& d : docs) documented |= d.name == name;
    CHECK(documented);
  }
}

/// A TCP port free on 127.0.0.1 now (the system's pick), for a program that must be told one.
inline int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace ckpt::test
