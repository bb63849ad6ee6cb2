// SPDX-License-Identifier: Apache-2.0
#include "ckpt/runtime/wire.hpp"

#include <algorithm>
#include <boost/json.hpp>
#include <charconv>

#include "ckpt/core/error.hpp"
#include "ckpt/format/boost_json.hpp"
#include "ckpt/hash/xxh3.hpp"

namespace ckpt::detail {

namespace json = boost::json;

namespace {

// A message as JSON. Strings are bytes as they are, UTF-8 or not: an error may name a path
// that is not UTF-8 (error_to_json), and must cross unchanged. (A report's manifest part is
// checked as a manifest is, UTF-8 included, by decode_manifest.)
json::value parse_message(std::string_view text) {
  json::parse_options opt;
  opt.allow_invalid_utf8 = true;
  return json::parse(text, {}, opt);
}

json::value error_value(const std::optional<Error>& e) { return e ? parse_message(error_to_json(*e)) : json::value(nullptr); }

std::optional<Error> error_of(const json::object& o) {
  const json::value& v = o.at("error");
  if (v.is_null()) return std::nullopt;
  return error_from_json(json::serialize(v));
}

[[noreturn]] void bad_message(std::string_view what, const std::exception& e) {
  throw Error(Errc::comm_error, {}, "undecodable checkpoint coordination message: " + std::string(what), "a valid message", e.what());
}

std::uint64_t hex64(const json::value& v) {
  std::uint64_t x = 0;
  if (!parse_xxh3_hex(v.as_string(), x)) throw std::invalid_argument("not a 16-digit XXH3: " + std::string(v.as_string()));
  return x;
}

// A redundancy block as the manifest writes it (block_to_json); the commit checks it against
// the layout's plan as the loader would, so this only reads the fields.
RedundancyBlock block_of(const json::object& o) {
  RedundancyBlock b;
  const std::string_view kind = o.at("kind").as_string();
  if (kind != "parity" && kind != "replica") throw std::invalid_argument("block kind '" + std::string(kind) + "'");
  b.kind = kind == "parity" ? RedundancyBlock::Kind::parity : RedundancyBlock::Kind::replica;
  b.node = static_cast<int>(o.at("node").to_number<std::int32_t>());
  if (b.kind == RedundancyBlock::Kind::parity) {
    b.stripe = static_cast<int>(o.at("stripe").to_number<std::int32_t>());
    b.index = static_cast<int>(o.at("index").to_number<std::int32_t>());
  } else {
    b.rank = static_cast<int>(o.at("rank").to_number<std::int32_t>());
  }
  b.path = std::string(o.at("path").as_string());
  b.size = o.at("size").to_number<std::uint64_t>();
  b.sha256 = std::string(o.at("sha256").as_string());
  b.xxh3 = hex64(o.at("xxh3"));
  for (const auto& c : o.at("chunk_xxh3").as_array()) b.chunk_xxh3.push_back(hex64(c));
  return b;
}

}  // namespace

std::string encode_rank_report(std::uint64_t step, const RankReport& r) {
  json::object o{{"rank", r.rank}, {"error", error_value(r.error)}};
  if (!r.error) {
    // The shard's part of the manifest, as a manifest of one shard (rank 0 of world size 1).
    Manifest part;
    part.world_size = 1;
    part.step = step;
    part.chunk_size = r.shard.chunk_size;
    // The manifest check wants the rank's flat range inside param_numel; only rank 0's
    // param_numel is recorded, so another rank's may be anything: it travels on its own.
    part.param_numel = std::max(r.shard.param_numel, r.shard.shard.param_shard_offset + r.shard.shard.param_shard_numel);
    o["param_numel"] = r.shard.param_numel;
    part.wall_clock_seconds = r.shard.wall_clock_seconds;
    part.training = r.shard.training;
    part.shards.push_back(r.shard.shard);
    part.shards.back().rank = 0;
    for (const ShardRecord& f : r.shard.more_files) {  // a shard of several files: schema 3
      part.shards.push_back(f);
      part.shards.back().rank = 0;
      part.schema_version = kFilesPerRankSchemaVersion;
    }
    // Sharding descriptions travel beside the part: they are checked across ranks (holders,
    // tiling), which a manifest of one shard cannot be.
    json::array sharding;
    for (auto t : r.shard.tensors) {
      if (t.sharding) {
        json::object d = sharding_to_json(*t.sharding);
        d["name"] = t.name;
        sharding.push_back(std::move(d));
      }
      t.rank = 0;
      t.sharding.reset();
      part.tensors.push_back(std::move(t));
    }
    o["part"] = encode_manifest(part);
    if (!sharding.empty()) o["sharding"] = std::move(sharding);
  }
  if (!r.blocks.empty()) {
    json::array blocks;
    for (const auto& b : r.blocks) blocks.push_back(block_to_json(b, nullptr));
    o["blocks"] = std::move(blocks);
  }
  return json::serialize(o);
}

RankReport decode_rank_report(std::string_view text) {
  try {
    const json::object o = parse_message(text).as_object();
    RankReport r;
    r.rank = o.at("rank").to_number<int>();
    r.error = error_of(o);
    if (const auto* bv = o.if_contains("blocks"))
      for (const auto& b : bv->as_array()) r.blocks.push_back(block_of(b.as_object()));
    if (r.error) return r;
    Manifest part = decode_manifest(o.at("part").as_string(), "coordination message of rank " + std::to_string(r.rank));
    r.shard.shard = std::move(part.shards.at(0));
    r.shard.shard.rank = r.rank;
    for (std::size_t k = 1; k < part.shards.size(); ++k) {
      r.shard.more_files.push_back(std::move(part.shards[k]));
      r.shard.more_files.back().rank = r.rank;
    }
    r.shard.tensors = std::move(part.tensors);
    for (auto& t : r.shard.tensors) t.rank = r.rank;
    if (const auto* sh = o.if_contains("sharding"))
      for (const auto& d : sh->as_array()) {
        const std::string_view name = d.as_object().at("name").as_string();
        const auto t = std::find_if(r.shard.tensors.begin(), r.shard.tensors.end(), [&](const TensorRecord& x) { return x.name == name; });
        if (t == r.shard.tensors.end()) throw Error(Errc::comm_error, {}, "sharding of an unknown tensor in the message of rank " + std::to_string(r.rank));
        t->sharding = sharding_from_json(d.as_object(), "coordination message of rank " + std::to_string(r.rank), "sharding");
      }
    r.shard.chunk_size = part.chunk_size;
    r.shard.param_numel = o.at("param_numel").to_number<std::uint64_t>();
    r.shard.wall_clock_seconds = part.wall_clock_seconds;
    r.shard.training = std::move(part.training);
    return r;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    bad_message("rank report", e);
  }
}

std::string encode_outcome(const CommitOutcome& c) {
  return json::serialize(json::object{{"error", error_value(c.error)}, {"dir", c.dir}, {"commit_ns", c.commit.count()}});
}

CommitOutcome decode_outcome(std::string_view text) {
  try {
    const json::object o = parse_message(text).as_object();
    CommitOutcome c;
    c.error = error_of(o);
    c.dir = std::string(o.at("dir").as_string());
    c.commit = std::chrono::nanoseconds(o.at("commit_ns").to_number<std::int64_t>());
    return c;
  } catch (const std::exception& e) {
    bad_message("commit outcome", e);
  }
}

std::string encode_vote(std::uint64_t step, std::span<const std::string> reports) {
  json::array a;
  for (const auto& r : reports) a.emplace_back(json::string(r));
  return json::serialize(json::object{{"step", step}, {"reports", std::move(a)}});
}

Vote decode_vote(std::string_view text) {
  try {
    const json::object o = parse_message(text).as_object();
    Vote v;
    v.step = o.at("step").to_number<std::uint64_t>();
    for (const auto& r : o.at("reports").as_array()) v.reports.emplace_back(r.as_string());
    return v;
  } catch (const std::exception& e) {
    bad_message("vote", e);
  }
}

std::string encode_run_start(const std::string& run_id) { return "+" + run_id; }
std::string encode_run_start_failure(const Error& error) { return "-" + error_to_json(error); }

std::string decode_run_start(std::string_view text) {
  if (text.starts_with('+')) return std::string(text.substr(1));
  if (text.starts_with('-')) throw error_from_json(text.substr(1));
  throw Error(Errc::comm_error, {}, "undecodable checkpoint coordination message: run start", "'+' and a run id, or '-' and an error",
              std::string(text.substr(0, 64)));
}

std::string encode_shard_sizes(std::span<const std::pair<int, std::uint64_t>> sizes) {
  std::string out;
  for (const auto& [rank, size] : sizes) {
    out += '+';
    out += std::to_string(rank);
    out += ':';
    out += std::to_string(size);
  }
  return out;
}

std::string encode_sizes_failure(std::string_view why) {
  std::string out(1, '-');
  out += why;
  return out;
}

ShardSizes decode_shard_sizes(std::span<const std::string> messages, int world_size, std::uint64_t step) {
  const std::string what = "shard sizes of step " + std::to_string(step);
  auto bad = [&](std::string_view expected, std::string_view actual) {
    throw Error(Errc::comm_error, {}, what, std::string(expected), std::string(actual.substr(0, 64)));
  };
  // The whole of `digits` as a decimal number (no sign, no space, nothing after it).
  auto number = [&]<class T>(std::string_view digits, T& out) {
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
    return !digits.empty() && digits[0] != '-' && ec == std::errc() && end == digits.data() + digits.size();
  };
  ShardSizes out;
  std::vector<std::optional<std::uint64_t>> got(static_cast<std::size_t>(std::max(world_size, 0)));
  for (const std::string& m : messages) {
    std::string_view text = m;
    if (text.starts_with('-')) {
      if (!out.failed) out.failed = std::string(text.substr(1));
      continue;
    }
    while (!text.empty()) {
      const auto next = text.find('+', 1);
      const std::string_view entry = text.substr(0, next);
      const auto colon = entry.find(':');
      int rank = -1;
      std::uint64_t size = 0;
      if (entry[0] != '+' || colon == std::string_view::npos || !number(entry.substr(1, colon - 1), rank) ||
          !number(entry.substr(colon + 1), size))
        bad("+rank:size ...", text);
      if (rank < 0 || rank >= world_size) bad("a rank 0.." + std::to_string(world_size - 1), entry);
      if (got[static_cast<std::size_t>(rank)]) bad("each rank once", "rank " + std::to_string(rank) + " again");
      got[static_cast<std::size_t>(rank)] = size;
      text = next == std::string_view::npos ? std::string_view() : text.substr(next);
    }
  }
  if (out.failed) return out;
  for (int r = 0; r < world_size; ++r) {
    if (!got[static_cast<std::size_t>(r)]) bad("every rank's", "none for rank " + std::to_string(r));
    out.sizes.push_back(*got[static_cast<std::size_t>(r)]);
  }
  return out;
}

}  // namespace ckpt::detail
