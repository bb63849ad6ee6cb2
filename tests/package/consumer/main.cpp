// SPDX-License-Identifier: Apache-2.0
// Saves through the asynchronous Checkpointer (whose writer runs on Asio and io_uring inside
// the library, compiled without either here), loads the checkpoint back verified, and checks
// the version and a typed error, all through the umbrella header. With a second argument it
// also opens an s3:// root: "no-s3" (linked with ckpt::ckpt alone) expects the typed error
// saying the program has no S3 client; "s3" (linked with ckpt::s3) expects the client itself
// to answer (with no credentials in the environment: its own error, before any request).
// The free-form metadata goes in and comes back through ckpt::JsonObject, with no JSON
// library of the consumer's own.
//   consumer DIR [no-s3|s3]
#include <ckpt/ckpt.hpp>

#include <cstdio>
#include <cstring>
#include <future>
#include <span>
#include <string_view>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) return 2;
  if (argc == 3) {
    const std::string_view mode = argv[2];
    try {
      (void)ckpt::open_store("s3://ckpt-consumer/run")->latest();
      std::printf("consumer: an s3:// root opened with no credentials\n");
      return 1;
    } catch (const ckpt::Error& e) {
      const bool no_client = std::string_view(e.what()).find("this program has no S3 client") != std::string_view::npos;
      std::printf("consumer: s3:// root: %s\n", e.what());
      if (mode == "no-s3" && !(no_client && e.code() == ckpt::Errc::invalid_argument)) return 1;
      if (mode == "s3" && no_client) return 1;
    }
  }
  if (ckpt::version() != CKPT_VERSION_STRING) return 1;
  std::vector<float> w(100, 1.5f);
  std::promise<std::uint64_t> committed;
  {
    ckpt::Checkpointer checkpointer({.root = argv[1], .world_size = 1});
    ckpt::SaveInfo info;
    info.param_shard_numel = w.size();
    info.param_numel = w.size();
    info.metadata.set("data_position", 42).set("note", "consumer");
    info.training.set_json("schedule", R"({"kind": "cosine", "base_lr": 0.0003})");
    std::vector<ckpt::TensorView> state{ckpt::tensor("w", w)};
    ckpt::SaveHandle h = checkpointer.save(0, 1, state, info);
    h.on_ready([&](std::exception_ptr e, ckpt::SaveResult r) { committed.set_value(e ? 0 : r.step); });
    h.wait();
  }
  if (committed.get_future().get() != 1) return 1;
  auto opened = ckpt::open_latest(ckpt::posix_file_system(), argv[1], {.expected_world_size = 1});
  const auto shard = opened.reader.load_shard(0, ckpt::Verify::full);
  const auto data = shard.tensor("w").data;
  if (data.size() != w.size() * sizeof(float) || std::memcmp(data.data(), w.data(), data.size()) != 0) return 1;
  const ckpt::Manifest& m = opened.reader.manifest();
  if (m.shard(0).metadata.get_int("data_position") != 42 || m.shard(0).metadata.get_string("note") != "consumer") return 1;
  const auto schedule = m.training.get_object("schedule");
  if (!schedule || schedule->get_double("base_lr") != 0.0003) return 1;
  try {
    (void)opened.reader.manifest().shard(99);
    return 1;
  } catch (const ckpt::Error& e) {
    if (e.code() != ckpt::Errc::invalid_argument) return 1;
  }
  std::printf("consumer %s loaded %zu bytes from %s\n", CKPT_VERSION_STRING, data.size(), opened.name.c_str());
  return 0;
}
