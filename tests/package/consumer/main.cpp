// SPDX-License-Identifier: Apache-2.0
// Saves through the asynchronous Checkpointer (whose writer runs on Asio and io_uring inside
// the library, compiled without either here), loads the checkpoint back verified, and checks
// the version and a typed error, all through the umbrella header.
//   consumer DIR
#include <ckpt/ckpt.hpp>

#include <cstdio>
#include <cstring>
#include <future>
#include <span>
#include <string_view>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  if (ckpt::version() != CKPT_VERSION_STRING) return 1;
  std::vector<float> w(100, 1.5f);
  std::promise<std::uint64_t> committed;
  {
    ckpt::Checkpointer checkpointer({.root = argv[1], .world_size = 1});
    ckpt::SaveInfo info;
    info.param_shard_numel = w.size();
    info.param_numel = w.size();
    std::vector<ckpt::TensorView> state{{"w", ckpt::DType::F32, {w.size()}, std::as_bytes(std::span(w))}};
    ckpt::SaveHandle h = checkpointer.save(0, 1, state, info);
    h.on_ready([&](std::exception_ptr e, ckpt::SaveResult r) { committed.set_value(e ? 0 : r.step); });
    h.wait();
  }
  if (committed.get_future().get() != 1) return 1;
  auto opened = ckpt::open_latest(ckpt::posix_file_system(), argv[1], {.expected_world_size = 1});
  const auto shard = opened.reader.load_shard(0, ckpt::Verify::full);
  const auto data = shard.tensor("w").data;
  if (data.size() != w.size() * sizeof(float) || std::memcmp(data.data(), w.data(), data.size()) != 0) return 1;
  try {
    (void)opened.reader.manifest().shard(99);
    return 1;
  } catch (const ckpt::Error& e) {
    if (e.code() != ckpt::Errc::invalid_argument) return 1;
  }
  std::printf("consumer %s loaded %zu bytes from %s\n", CKPT_VERSION_STRING, data.size(), opened.name.c_str());
  return 0;
}
