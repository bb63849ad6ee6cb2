// SPDX-License-Identifier: Apache-2.0
// decode_manifest on arbitrary text. A refusal must be malformed_manifest, unsupported_schema
// or unsafe_path naming the file. An accepted manifest must satisfy what docs/format.md
// promises, and encode_manifest must write it back as text that decodes to the same manifest,
// up to a few units in the last place of each floating-point number: Boost.JSON 1.81 does
// not parse decimal numbers correctly rounded (about 8% of doubles in [1e-6, 10) come back
// one ulp off through serialize and parse, a few two ulps;
// corpus/manifest/finding_double_roundtrip_ulp), so a double in a manifest is not bit-exact
// across a save and a load.
#include <boost/json.hpp>
#include <cstdint>
#include <string>

#include "ckpt/format/manifest.hpp"
#include "ckpt/hash/file_digest.hpp"
#include "fuzz_common.hpp"

using namespace ckpt;
using fuzz::require;

namespace {
constexpr const char* kFile = "fuzz/step-0000000001/manifest.json";

void check_invariants(const Manifest& m) {
  require(m.schema_version >= kOldestSchemaVersion && m.schema_version <= kSchemaVersion, "schema_version");
  require(m.world_size >= 1 && m.world_size <= (1 << 20), "world_size range");
  require(m.shards.size() == static_cast<std::size_t>(m.world_size), "shard count");
  require(m.chunk_size >= 4096 && m.chunk_size <= (1ull << 30) && (m.chunk_size & (m.chunk_size - 1)) == 0, "chunk_size");
  for (std::size_t i = 0; i < m.shards.size(); ++i) {
    const ShardRecord& s = m.shards[i];
    require(s.rank == static_cast<int>(i), "shards sorted by rank");
    require(is_plain_file_name(s.path), "plain shard path");
    require(s.size <= (1ull << 50), "shard size bound");
    require(s.chunk_xxh3.size() == chunk_count(s.size, m.chunk_size), "chunk digest count");
    require(s.sha256.size() == 64, "sha256 length");
    std::uint64_t end;
    require(!__builtin_add_overflow(s.param_shard_offset, s.param_shard_numel, &end) && end <= m.param_numel, "param range");
    for (std::size_t j = 0; j < i; ++j) require(m.shards[j].path != s.path, "paths unique");
  }
  for (const auto& t : m.tensors) {
    require(t.rank >= 0 && t.rank < m.world_size, "tensor rank");
    require(t.begin <= t.end && t.end <= m.shard(t.rank).size, "tensor range inside its shard");
    std::uint64_t numel = 1, bytes;
    for (auto d : t.shape) require(!__builtin_mul_overflow(numel, d, &numel), "tensor numel overflow");
    require(!__builtin_mul_overflow(numel, dtype_size(t.dtype), &bytes) && bytes == t.end - t.begin, "tensor byte count");
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Manifest m;
  try {
    m = decode_manifest(text, kFile);
  } catch (const Error& e) {
    fuzz::check_refusal(e, {Errc::malformed_manifest, Errc::unsupported_schema, Errc::unsafe_path}, kFile);
    return 0;
  }
  check_invariants(m);
  const std::string again = encode_manifest(m);
  Manifest back;
  try {
    back = decode_manifest(again, kFile);
  } catch (const Error& e) {
    fuzz::finding(std::string("an accepted manifest does not survive encode/decode: ") + e.what());
  }
  const std::string twice = encode_manifest(back);
  require(twice == again || fuzz::same_json(boost::json::parse(twice), boost::json::parse(again)),
          "encode(decode(encode(m))) differs from encode(m) beyond one ulp");
  return 0;
}
