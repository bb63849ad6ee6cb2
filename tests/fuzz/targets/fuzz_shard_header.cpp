// SPDX-License-Identifier: Apache-2.0
// The safetensors shard header parser on arbitrary bytes, two ways: the input as a whole shard
// file (parse_shard_prefix, then parse_shard_header on the N bytes it announces), and the
// input as header JSON for a file with a data section of 0..255 bytes (the last input byte).
// A refusal must be malformed_shard naming the file. An accepted header must tile its data
// section exactly, and re-encoding it must parse back to the same tensors.
#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>

#include "ckpt/format/safetensors.hpp"
#include "fuzz_common.hpp"

using namespace ckpt;
using fuzz::require;

namespace {
constexpr const char* kFile = "fuzz/rank-00000-of-00001.safetensors";

std::span<const std::byte> bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

void check_accepted(const ShardHeader& h, std::uint64_t file_size) {
  require(h.file_size() == file_size, "data_start + data_size == file size");
  std::uint64_t expect = 0;
  for (const auto& t : h.tensors) {
    require(t.begin == expect && t.begin <= t.end, "tensors tile the data section in order");
    std::uint64_t numel = 1, n;
    for (auto d : t.shape) require(!__builtin_mul_overflow(numel, d, &numel), "numel overflow");
    require(!__builtin_mul_overflow(numel, dtype_size(t.dtype), &n) && n == t.end - t.begin, "tensor byte count");
    require(!t.name.empty() && t.name != "__metadata__", "tensor name");
    expect = t.end;
  }
  require(expect == h.data_size, "nothing after the last tensor");
  // Re-encode (when the canonical JSON fits the header's length) and parse back.
  std::string enc;
  try {
    enc = encode_shard_header(h);
  } catch (const Error& e) {
    require(e.code() == Errc::invalid_argument, std::string("encode_shard_header: ") + e.what());
    return;
  }
  require(enc.size() == h.data_start, "encoded header length");
  try {
    const auto start = parse_shard_prefix(bytes(enc).first(8), file_size, kFile);
    const ShardHeader back = parse_shard_header(std::string_view(enc).substr(8, start - 8), file_size, kFile);
    require(back.tensors.size() == h.tensors.size() && back.metadata == h.metadata, "round trip: tensor count, metadata");
    // Zero-sized tensors share offsets, so their relative order is not part of the format.
    auto ordered = [](std::vector<ShardTensor> v) {
      std::sort(v.begin(), v.end(), [](const ShardTensor& x, const ShardTensor& y) {
        return std::tie(x.begin, x.end, x.name) < std::tie(y.begin, y.end, y.name);
      });
      return v;
    };
    const auto before = ordered(h.tensors), after = ordered(back.tensors);
    for (std::size_t i = 0; i < before.size(); ++i) {
      const auto &a = before[i], &b = after[i];
      require(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin && a.end == b.end,
              "round trip: tensor " + a.name);
    }
  } catch (const Error& e) {
    fuzz::finding(std::string("an accepted header does not survive re-encoding: ") + e.what());
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  // 1. The input is a shard file.
  try {
    const std::uint64_t start = parse_shard_prefix(bytes(in).first(std::min<std::size_t>(8, in.size())), in.size(), kFile);
    require(start >= 8 && start <= in.size(), "prefix within the file");
    check_accepted(parse_shard_header(in.substr(8, start - 8), in.size(), kFile), in.size());
  } catch (const Error& e) {
    fuzz::check_refusal(e, {Errc::malformed_shard}, kFile);
  }
  // 2. The input is the header JSON; its last byte says how long the data section is.
  if (!in.empty()) {
    const std::string_view json = in.substr(0, in.size() - 1);
    const std::uint64_t file_size = 8 + json.size() + static_cast<unsigned char>(in.back());
    try {
      check_accepted(parse_shard_header(json, file_size, kFile), file_size);
    } catch (const Error& e) {
      fuzz::check_refusal(e, {Errc::malformed_shard}, kFile);
    }
  }
  return 0;
}
