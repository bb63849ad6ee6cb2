// SPDX-License-Identifier: Apache-2.0
// The ckpt tool's text tables: every column as wide as its widest cell, so a long name
// (model.layers.23.self_attn.q_proj.weight, a shard file name) never shifts the columns after it.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace ckpt::tool {

class Table {
 public:
  struct Column {
    std::string title;
    bool right = false;  // right-aligned (numbers)
  };
  explicit Table(std::vector<Column> columns, std::string indent = "") : columns_(std::move(columns)), indent_(std::move(indent)) {}

  /// One row: a cell per column (missing cells are empty).
  void row(std::vector<std::string> cells) { rows_.push_back({std::move(cells), {}}); }
  /// A line of its own under the last row (an error message), outside the columns.
  void note(std::string line) { rows_.push_back({{}, std::move(line)}); }

  /// Prints the header and the rows on stdout; the last column is not padded.
  void print() const {
    std::vector<std::size_t> width(columns_.size());
    for (std::size_t c = 0; c < columns_.size(); ++c) width[c] = columns_[c].title.size();
    for (const auto& r : rows_)
      for (std::size_t c = 0; c < r.cells.size() && c < width.size(); ++c) width[c] = std::max(width[c], r.cells[c].size());
    auto line = [&](auto cell) {
      std::string out = indent_;
      for (std::size_t c = 0; c < columns_.size(); ++c) {
        const std::string& s = cell(c);
        const std::string pad(width[c] - s.size(), ' ');
        if (c) out += "  ";
        if (columns_[c].right) out += pad + s;
        else out += c + 1 < columns_.size() ? s + pad : s;
      }
      out.erase(out.find_last_not_of(' ') + 1);  // an empty last cell leaves no trailing blanks
      std::printf("%s\n", out.c_str());
    };
    line([&](std::size_t c) -> const std::string& { return columns_[c].title; });
    static const std::string kEmpty;
    for (const auto& r : rows_) {
      if (!r.note.empty()) {
        std::printf("%s    %s\n", indent_.c_str(), r.note.c_str());
        continue;
      }
      line([&](std::size_t c) -> const std::string& { return c < r.cells.size() ? r.cells[c] : kEmpty; });
    }
  }

 private:
  struct Row {
    std::vector<std::string> cells;
    std::string note;
  };
  std::vector<Column> columns_;
  std::string indent_;
  std::vector<Row> rows_;
};

}  // namespace ckpt::tool
