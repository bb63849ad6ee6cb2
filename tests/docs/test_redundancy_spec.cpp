// SPDX-License-Identifier: Apache-2.0
// docs/format.md "Nodes and redundancy" is enough for an independent decoder: the decoder in
// tests/tools/rebuild_shard.py, written from that section alone (its own GF(2^8), code
// matrix, stripe geometry and matrix inversion, no code of ckpt), rebuilds a lost node's
// shards byte for byte from what ckpt wrote.
#include <doctest/doctest.h>

#include <filesystem>

#include "ckpt/format/sharding.hpp"
#include "support/node_checkpoint.hpp"

using namespace ckpt;
namespace fs = std::filesystem;

namespace {
const std::string kDecoder = std::string(CKPT_SOURCE_DIR) + "/tests/tools/rebuild_shard.py";

// A checkpoint whose shards all differ in size (one rank-local tensor each, odd lengths), so
// that the nodes' data and the pieces of a stripe are unequal and padding matters.
struct Unequal {
  std::vector<std::vector<std::uint8_t>> blobs;
  SaveRequest request{.step = 7, .chunk_size = 4096};
  explicit Unequal(int world) {
    for (int r = 0; r < world; ++r) {
      blobs.push_back(test::random_bytes(1000 + 3001 * static_cast<std::size_t>(r * r % 7), 40 + static_cast<std::uint64_t>(r)));
      RankState rs;
      rs.tensors.push_back({"blob", DType::U8, {blobs.back().size()}, std::as_bytes(std::span(blobs.back())), rank_local()});
      request.ranks.push_back(std::move(rs));
    }
  }
};

// Runs the decoder for `rank` with node roots `lost` deleted; its output must equal the shard.
void check_decoded(const std::string& what, int world, int nodes, const RedundancyScheme& scheme, const std::vector<int>& lost) {
  CAPTURE(what);
  const Unequal u(world);
  test::TempDir dir;
  std::vector<std::vector<std::uint8_t>> images;
  const Manifest m = test::save_node_checkpoint(dir.path().string(), nodes, scheme, u.request, &images);
  for (int n : lost) fs::remove_all(dir / ("node-" + std::to_string(n)));
  for (int r = 0; r < world; ++r) {
    if (std::find(lost.begin(), lost.end(), m.nodes->node_of(r)) == lost.end()) continue;
    CAPTURE(r);
    const std::string out = (dir / ("rank-" + std::to_string(r) + ".bin")).string();
    int status = 0;
    const std::string log = test::run_command("python3 " + kDecoder + " " + dir.path().string() + " " + checkpoint_dir_name(m.step) + " " +
                                                  std::to_string(r) + " " + out + " 2>&1",
                                              &status);
    INFO(log);
    CHECK(status == 0);
    CHECK(test::read_all(out) == images[static_cast<std::size_t>(r)]);
  }
}
}  // namespace

TEST_CASE("an independent decoder written from docs/format.md rebuilds lost shards byte for byte") {
  if (std::system("python3 -c 'import hashlib, json' >/dev/null 2>&1") != 0) {
    MESSAGE("python3 not found; skipped");
    return;
  }
  check_decoded("rs:3+1, one node lost", 4, 4, {.kind = RedundancyScheme::Kind::reed_solomon, .k = 3, .m = 1}, {2});
  check_decoded("rs:2+2 over 5 nodes of 2 ranks, two nodes lost", 10, 5, {.kind = RedundancyScheme::Kind::reed_solomon, .k = 2, .m = 2}, {0, 3});
  check_decoded("rs:3+2 over 6 nodes, two nodes lost", 6, 6, {.kind = RedundancyScheme::Kind::reed_solomon, .k = 3, .m = 2}, {1, 2});
  check_decoded("replicate:3/2 over 5 nodes, two nodes lost", 5, 5, {.kind = RedundancyScheme::Kind::replicate, .copies = 3, .jump = 2}, {1, 3});
}
