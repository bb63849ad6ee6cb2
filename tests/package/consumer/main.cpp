#include <cstdio>
#include <vector>

#include "ckpt/io/commit.hpp"
#include "ckpt/io/save.hpp"
#include "ckpt/io/reader.hpp"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::vector<float> w(100, 1.5f);
  ckpt::SaveRequest req;
  req.step = 1;
  req.param_numel = w.size();
  ckpt::RankState rs;
  rs.tensors = {{"w", ckpt::DType::F32, {w.size()}, std::as_bytes(std::span(w))}};
  rs.param_shard_numel = w.size();
  req.ranks.push_back(rs);
  ckpt::save_checkpoint_sync(ckpt::posix_file_system(), argv[1], req);
  auto opened = ckpt::open_latest(ckpt::posix_file_system(), argv[1], {.expected_world_size = 1});
  const auto shard = opened.reader.load_shard(0, ckpt::Verify::full);
  std::printf("consumer loaded %zu bytes from %s\n", shard.tensor("w").data.size(), opened.name.c_str());
  return shard.tensor("w").data.size() == 400 ? 0 : 1;
}
