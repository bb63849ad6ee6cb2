// SPDX-License-Identifier: Apache-2.0
// The limits of format/manifest_limits.hpp, on manifest text: what is refused (with which
// error) before the memory is spent, what legitimate manifests cost, measured through the
// budgeted memory resource the parse draws from.
#include <doctest/doctest.h>

#include <boost/json.hpp>
#include <limits>
#include <string>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/core/error.hpp"
#include "ckpt/format/detail/manifest_parse.hpp"
#include "ckpt/format/manifest.hpp"
#include "ckpt/format/manifest_limits.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "support/test_support.hpp"

using namespace ckpt;
namespace json = boost::json;

namespace {
constexpr const char* kFile = "/c/step-0000000001/manifest.json";

// A manifest of `tensors` tensors on one rank (names as long as a Hugging Face model's),
// each 2 x F32, with the chunk checksums of its shard.
Manifest many_tensors(std::size_t tensors, std::uint64_t chunk = 4096) {
  Manifest m;
  m.world_size = 1;
  m.step = 1;
  m.created_at = "2026-11-29T10:00:00.000Z";
  m.chunk_size = chunk;
  m.param_numel = 2 * tensors;
  ShardRecord s;
  s.path = "rank-00000-of-00001.safetensors";
  s.size = 8 * tensors;
  s.sha256 = std::string(64, 'a');
  s.chunk_xxh3.assign(static_cast<std::size_t>(chunk_count(s.size, chunk)), 0x0123456789abcdefull);
  s.param_shard_numel = 2 * tensors;
  json_of(s.metadata)["data_position"] = 7;
  m.shards.push_back(s);
  for (std::size_t i = 0; i < tensors; ++i)
    m.tensors.push_back({"model.layers." + std::to_string(i / 16) + ".mlp.w" + std::to_string(i), 0, DType::F32, {2}, 8 * i, 8 * i + 8});
  json_of(m.training)["lr"] = 0.01;
  return m;
}

Error refusal(const std::string& text) {
  return test::expect_error([&] { (void)decode_manifest(text, kFile); });
}

// `text` with `extra` inserted before its final '}' (a new last member of the top level).
std::string with_member(std::string text, const std::string& member) {
  text.insert(text.rfind('}'), "," + member);
  return text;
}

std::string repeated(const std::string& first, const std::string& each, std::size_t n, const std::string& last) {
  std::string out = first;
  out.reserve(first.size() + each.size() * n + last.size() + 16 * n);
  for (std::size_t i = 0; i < n; ++i) out += (i ? "," : "") + each + std::to_string(i) + (each.back() == '"' ? "\":0" : "");
  return out + last;
}
}  // namespace

TEST_CASE("a manifest of 100k tensors decodes within its allowance and its memory budget") {
  const std::string text = encode_manifest(many_tensors(100000));
  const Manifest d = decode_manifest(text, kFile);
  CHECK(d.tensors.size() == 100000);
  const auto st = detail::last_manifest_parse();
  CHECK(st.counts.tensors == 100000);
  CHECK(st.counts.shards == 1);
  CHECK(st.counts.chunks == d.shards[0].chunk_xxh3.size());
  CHECK(st.counts.dims == 100000);
  MESSAGE("text " << st.size << " bytes, allowance " << st.allowance << ", budget " << st.budget << ", peak " << st.peak);
  // encode_manifest's output needs well under half its allowance, and its peak under the budget.
  CHECK(st.size * 2 < st.allowance);
  CHECK(st.peak < st.budget);
}

TEST_CASE("the memory a decode holds grows per tensor within 1 KiB, and not at all with padding") {
  std::uint64_t per_tensor_10k = 0;
  for (std::size_t n : {1000, 10000, 100000}) {
    const std::string text = encode_manifest(many_tensors(n));
    (void)decode_manifest(text, kFile);
    const auto st = detail::last_manifest_parse();
    const double per = static_cast<double>(st.peak) / static_cast<double>(n);
    MESSAGE(n << " tensors: " << st.size << " bytes of text, peak " << st.peak << " bytes held (" << per << " per tensor), budget "
              << st.budget);
    CHECK(st.peak <= 1024 * n + (64u << 10));
    if (n == 10000) per_tensor_10k = st.peak / n;
    if (n == 100000) CHECK(st.peak / n <= per_tensor_10k + 64);  // linear: no super-linear growth
    // Padded with whitespace up to its allowance: the same document, the same peak.
    std::string padded = text;
    padded.insert(padded.size() - 2, static_cast<std::size_t>(st.allowance - text.size()), ' ');
    REQUIRE(padded.size() == st.allowance);
    (void)decode_manifest(padded, kFile);
    CHECK(detail::last_manifest_parse().peak == st.peak);
  }
}

TEST_CASE("a manifest one byte over the allowance of its counts is refused, naming the file, the allowance and the size") {
  const std::string text = encode_manifest(many_tensors(1000));
  (void)decode_manifest(text, kFile);
  const std::uint64_t allowance = detail::last_manifest_parse().allowance;
  CHECK(allowance == manifest_allowance(detail::last_manifest_parse().counts));
  std::string padded = text;
  padded.insert(padded.size() - 2, static_cast<std::size_t>(allowance - text.size() + 1), '\n');
  const Error e = refusal(padded);
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == kFile);
  CHECK(e.detail().find("1 shards, 2 chunk checksums, 1000 tensors") != std::string::npos);
  CHECK(e.expected() == "at most " + std::to_string(allowance) + " bytes");
  CHECK(e.actual() == std::to_string(allowance + 1) + " bytes");
}

TEST_CASE("a string longer than 1 MiB is refused while it is read, naming where it is") {
  const std::string text = encode_manifest(many_tensors(2));
  const Error e = refusal(with_member(text.substr(0, text.rfind("\"training\"")) + "\"training\":{\"note\":\"" +
                                          std::string(kMaxManifestStringBytes + 1, 'x') + "\"}}",
                                      "\"x\":0"));
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == kFile);
  CHECK(e.detail() == "length of the string at training");
  CHECK(e.expected() == "at most 1048576 bytes");
  CHECK(e.actual() == "more than 1048576 bytes");
  // A tensor name too.
  Manifest m = many_tensors(2);
  m.tensors[1].name = std::string(kMaxManifestStringBytes + 1, 'n');
  CHECK(refusal(encode_manifest(m)).detail() == "length of the string at tensors[1].name");
  // A key.
  const Error k = refusal(with_member(text, "\"" + std::string(kMaxManifestKeyBytes + 1, 'k') + "\":0"));
  CHECK(k.detail() == "length of a key in the top level");
  CHECK(k.expected() == "at most 4096 bytes");
}

TEST_CASE("too many values in training or in a shard's metadata are refused at the first one past the budget") {
  const std::string text = encode_manifest(many_tensors(2));
  const std::size_t n = kFreeFormValues + kFreeFormValuesPerShard;
  // Keys of a few bytes each: the values budget is crossed long before the bytes budget.
  std::string training = repeated("{", "\"", n, "}");
  std::string t = text;
  const auto p = t.find("\"training\": ");
  t = t.substr(0, p) + "\"training\": " + training + "\n}\n";
  const Error e = refusal(t);
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == kFile);
  CHECK(e.detail() == "values in the free-form parts (training and the shards' metadata), at training");
  CHECK(e.expected() == "at most " + std::to_string(kFreeFormValues + kFreeFormValuesPerShard) + " values");

  std::string md = text;
  md.insert(md.find("\"metadata\":{") + 12, repeated("", "\"", n, ","));
  const Error m = refusal(md);
  CHECK(m.detail() == "values in the free-form parts (training and the shards' metadata), at shards[0].metadata");
}

TEST_CASE("free-form parts past 64 MiB are refused") {
  const std::string text = encode_manifest(many_tensors(2));
  // 65 strings of 1 MiB - 1: few values, many bytes.
  std::string big = "[";
  for (int i = 0; i < 65; ++i) big += (i ? ",\"" : "\"") + std::string(kMaxManifestStringBytes - 1, 'x') + "\"";
  big += "]";
  const auto p = text.find("\"training\": ");
  const Error e = refusal(text.substr(0, p) + "\"training\": {\"blob\":" + big + "}\n}\n");
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.detail() == "size of the free-form parts (training and the shards' metadata), at training");
  CHECK(e.expected() == "at most " + std::to_string(kFreeFormBytes + kFreeFormBytesPerShard) + " bytes");
}

TEST_CASE("content outside the schema beyond 64 KiB is refused, naming the first unknown field") {
  const std::string text = encode_manifest(many_tensors(2));
  std::string zeros = "[0";
  for (int i = 1; i < 40000; ++i) zeros += ",0";
  const Error e = refusal(with_member(text, "\"bulk\":" + zeros + "]"));
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == kFile);
  CHECK(e.detail().find("outside the manifest schema") != std::string::npos);
  CHECK(e.detail().find("the first at \"bulk\"") != std::string::npos);
  CHECK(e.expected() == "at most 65536 bytes");
  // Unknown fields in a tensor entry, and a known one repeated, count the same.
  json::value v = json::parse(text);
  json::object& t0 = v.as_object()["tensors"].as_array()[0].as_object();
  t0["padding"] = std::string(70000, ' ');
  CHECK(refusal(json::serialize(v)).detail().find("the first at tensors[0].\"padding\"") != std::string::npos);
  std::string rank_again = text;
  std::string reps;
  for (int i = 0; i < 9000; ++i) reps += "\"rank\":0,";
  rank_again.insert(rank_again.find("{", rank_again.find("\"tensors\"")) + 1, reps);
  const Error r = refusal(rank_again);
  CHECK(r.detail().find("outside the manifest schema") != std::string::npos);
  CHECK(r.detail().find("the first at tensors[0].\"rank\"") != std::string::npos);
}

TEST_CASE("a small unknown field is left to the field checks, which report it precisely") {
  const std::string text = encode_manifest(many_tensors(2));
  CHECK_NOTHROW((void)decode_manifest(with_member(text, "\"comment\":\"written by hand\""), kFile));
  json::value v = json::parse(text);
  v.as_object()["shards"].as_array()[0].as_object()["size"] = json::array{1, 2, 3};
  const Error e = refusal(json::serialize(v));
  CHECK(e.detail() == "shards[0].size");
  CHECK(e.expected() == "unsigned integer");
}

TEST_CASE("nesting deeper than 32 is refused, naming the limit") {
  const std::string text = encode_manifest(many_tensors(2));
  const auto p = text.find("\"training\": ");
  const Error e = refusal(text.substr(0, p) + "\"training\": " + std::string(40, '[') + std::string(40, ']') + "\n}\n");
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.file() == kFile);
  CHECK(e.detail() == "nesting of objects and arrays");
  CHECK(e.expected() == "at most 32 levels");
  CHECK(e.actual() == "more");
}

namespace {
// `levels` arrays, one in the other, around a 0.
json::value nested_arrays(int levels) {
  json::value v = 0;
  for (int i = 0; i < levels; ++i) v = json::array{v};
  return v;
}
}  // namespace

TEST_CASE("check_free_form refuses what the commit's decode would, naming the argument and the limit") {
  JsonObject metadata_object, training_object;
  json::object& md = json_of(metadata_object);
  json::object& training = json_of(training_object);
  // Nesting: 32 levels in all, the metadata dict at level 4 (the top, shards, the shard
  // entry above it), the training dict at level 2.
  md["deep"] = nested_arrays(28);  // levels 5 to 32
  training["deep"] = nested_arrays(30);  // levels 3 to 32
  CHECK_NOTHROW(check_free_form(metadata_object, training_object, "metadata and training of rank 0"));
  md["deep"] = nested_arrays(29);
  Error e = test::expect_error([&] { check_free_form(metadata_object, training_object, "metadata and training of rank 0"); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.file().empty());
  CHECK(e.detail() == "metadata and training of rank 0 cannot be held by a manifest: nesting of objects and arrays");
  CHECK(e.expected() == "at most 32 levels");
  md["deep"] = 1;
  training["deep"] = nested_arrays(31);
  CHECK(test::expect_error([&] { check_free_form(metadata_object, training_object, "t"); }).detail() == "t cannot be held by a manifest: nesting of objects and arrays");
  training.clear();
  // A string over 1 MiB, in the metadata or the training, and a key over 4 KiB.
  md["note"] = std::string(kMaxManifestStringBytes, 'x');
  CHECK_NOTHROW(check_free_form(metadata_object, training_object, "m"));
  md["note"] = std::string(kMaxManifestStringBytes + 1, 'x');
  e = test::expect_error([&] { check_free_form(metadata_object, training_object, "m"); });
  CHECK(e.code() == Errc::invalid_argument);
  CHECK(e.detail() == "m cannot be held by a manifest: length of the string at shards[0].metadata");
  CHECK(e.expected() == "at most 1048576 bytes");
  CHECK(e.actual() == "more than 1048576 bytes");
  md.clear();
  training["note"] = std::string(kMaxManifestStringBytes + 1, 'x');
  CHECK(test::expect_error([&] { check_free_form(metadata_object, training_object, "m"); }).detail() == "m cannot be held by a manifest: length of the string at training");
  training.clear();
  md[std::string(kMaxManifestKeyBytes + 1, 'k')] = 0;
  CHECK(test::expect_error([&] { check_free_form(metadata_object, training_object, "m"); }).expected() == "at most 4096 bytes");
  // Metadata and training share the free-form budget of a one-shard manifest: 600k values
  // each fit alone, not together.
  md.clear();
  json::array many(600000, json::value(0));
  md["many"] = many;
  CHECK_NOTHROW(check_free_form(metadata_object, training_object, "m"));
  training["many"] = many;
  e = test::expect_error([&] { check_free_form(metadata_object, training_object, "m"); });
  CHECK(e.detail() == "m cannot be held by a manifest: values in the free-form parts (training and the shards' metadata), at training");
  CHECK(e.expected() == "at most " + std::to_string(kFreeFormValues + kFreeFormValuesPerShard) + " values");
  // NaN and infinities are tagged first, and pass.
  md.clear();
  training.clear();
  md["loss"] = std::numeric_limits<double>::quiet_NaN();
  CHECK_NOTHROW(check_free_form(metadata_object, training_object, "m"));
}

TEST_CASE("a document cut short or followed by more text is refused as invalid JSON") {
  const std::string text = encode_manifest(many_tensors(2));
  CHECK(refusal(text.substr(0, text.size() / 2)).expected() == "valid JSON");
  CHECK(refusal(text + "{}").expected() == "valid JSON");
  CHECK(refusal("").expected() == "valid JSON");
  CHECK_NOTHROW((void)decode_manifest(text + " \n\t\r", kFile));
}

TEST_CASE("text fed in pieces of any size decodes to the same manifest") {
  const std::string text = encode_manifest(many_tensors(300));
  for (std::size_t piece : {std::size_t{1}, std::size_t{7}, std::size_t{4096}, std::size_t{1} << 20}) {
    INFO(piece);
    const Manifest d = decode_manifest(text.size(), [&](std::uint64_t off) { return std::string_view(text).substr(off, piece); }, kFile);
    CHECK(encode_manifest(d) == text);
  }
}

TEST_CASE("a manifest larger than the absolute cap is refused before its text is read") {
  bool read = false;
  const Error e = test::expect_error([&] {
    (void)decode_manifest(kMaxManifestBytes + 1, [&](std::uint64_t) -> std::string_view {
      read = true;
      return " ";
    }, kFile);
  });
  CHECK_FALSE(read);
  CHECK(e.code() == Errc::malformed_manifest);
  CHECK(e.detail() == "file size");
  CHECK(e.expected() == "at most 268435456 bytes");
}
