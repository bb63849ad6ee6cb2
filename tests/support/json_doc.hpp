// SPDX-License-Identifier: Apache-2.0
// docs/json-output.md read as data, so that a test holds each program's --json output to it:
// the section of an output is the one with the line "Schema: `NAME/VERSION`", and its first
// table lists the top-level fields, one row each: | `field` | type | when | meaning |, where
// "when" is `always` or the conditions (comma-separated) under which the field is printed.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <boost/json.hpp>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace ckpt::test {

/// A field of a documented output and when it is printed (every condition holds; none: always).
struct DocField {
  std::string name;
  std::set<std::string> conditions;
};

/// An output's section of docs/json-output.md.
struct DocOutput {
  std::string schema;                         ///< "ckpt.ls/1"
  std::vector<std::vector<DocField>> tables;  ///< the section's tables in order; [0]: the top-level fields
};

inline std::string json_output_doc_text() {
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/docs/json-output.md");
  REQUIRE_MESSAGE(in, "cannot read docs/json-output.md");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace detail {
inline std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}
inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string l; std::getline(ss, l);) out.push_back(l);
  return out;
}
// The sections ("## ..." to the next "## "), each as its lines.
inline std::vector<std::vector<std::string>> sections_of(const std::string& text) {
  std::vector<std::vector<std::string>> out;
  for (const auto& l : lines_of(text)) {
    if (l.starts_with("## ")) out.emplace_back();
    if (!out.empty()) out.back().push_back(l);
  }
  return out;
}
// The schema a section names ("Schema: `NAME/V`", possibly across a line break), or "".
inline std::string schema_of(const std::vector<std::string>& section) {
  std::string joined;
  for (const auto& l : section) joined += l + " ";
  const std::string key = "Schema: `";
  auto at = joined.find(key);
  if (at == std::string::npos) return {};
  at += key.size();
  return joined.substr(at, joined.find('`', at) - at);
}
}  // namespace detail

/// Every schema the doc names ("ckpt.ls/1", ...), in its order.
inline std::vector<std::string> documented_schemas() {
  std::vector<std::string> out;
  for (const auto& s : detail::sections_of(json_output_doc_text()))
    if (const auto id = detail::schema_of(s); !id.empty()) out.push_back(id);
  return out;
}

/// The section of output NAME ("ckpt.ls"): its schema and tables. Fails the test if none.
inline DocOutput doc_output(const std::string& name) {
  for (const auto& section : detail::sections_of(json_output_doc_text())) {
    const std::string id = detail::schema_of(section);
    if (!id.starts_with(name + "/")) continue;
    DocOutput out{id, {}};
    bool in_table = false;
    for (const auto& l : section) {
      if (!l.starts_with("|")) {
        in_table = false;
        continue;
      }
      if (!in_table) {  // the header row; the separator row follows
        out.tables.emplace_back();
        in_table = true;
        continue;
      }
      if (l.starts_with("|---")) continue;
      std::vector<std::string> cells;
      std::stringstream ss(l.substr(1));
      for (std::string c; std::getline(ss, c, '|');) cells.push_back(detail::trim(c));
      REQUIRE_MESSAGE(cells.size() >= 4, "docs/json-output.md, " << id << ": a row without 4 cells: " << l);
      DocField f;
      f.name = cells[0];
      REQUIRE_MESSAGE((f.name.size() > 2 && f.name.front() == '`' && f.name.back() == '`'), "a field not in backticks: " << l);
      f.name = f.name.substr(1, f.name.size() - 2);
      if (cells[2] != "always") {
        std::stringstream cs(cells[2]);
        for (std::string c; std::getline(cs, c, ',');) f.conditions.insert(detail::trim(c));
      }
      out.tables.back().push_back(f);
    }
    REQUIRE_MESSAGE(!out.tables.empty(), "docs/json-output.md, " << id << ": no table of fields");
    return out;
  }
  FAIL("docs/json-output.md has no section with the line Schema: `" << name << "/N`");
  return {};
}

/// Checks that `out` holds exactly the fields of `fields` whose conditions all hold in
/// `holds` (what is true of the run that printed it), and none that the table lacks.
inline void check_documented_fields(const boost::json::object& out, const std::vector<DocField>& fields, const std::set<std::string>& holds,
                                    const std::string& what) {
  CAPTURE(what);
  for (const auto& [key, value] : out) {
    const std::string k(key);
    CHECK_MESSAGE(std::any_of(fields.begin(), fields.end(), [&](const DocField& f) { return f.name == k; }),
                  "printed but not in docs/json-output.md: " << k);
  }
  for (const auto& f : fields) {
    const bool expected = std::all_of(f.conditions.begin(), f.conditions.end(), [&](const std::string& c) { return holds.count(c) > 0; });
    if (expected) CHECK_MESSAGE(out.contains(f.name), "in docs/json-output.md but not printed: " << f.name);
    else CHECK_MESSAGE(!out.contains(f.name), "printed, but docs/json-output.md says only when they hold: " << f.name);
  }
}

/// Checks a program's top-level output against its section: the schema the doc names first,
/// then the fields (check_documented_fields).
inline void check_documented_output(const boost::json::object& out, const std::string& name, const std::set<std::string>& holds = {}) {
  const DocOutput doc = doc_output(name);
  CAPTURE(name);
  REQUIRE_MESSAGE(out.contains("schema"), "no schema field: " << boost::json::serialize(out));
  CHECK(out.begin()->key() == "schema");  // the first field
  CHECK(out.at("schema") == boost::json::value(doc.schema));
  check_documented_fields(out, doc.tables.front(), holds, doc.schema);
}

}  // namespace ckpt::test
