// SPDX-License-Identifier: Apache-2.0
// Saves a step and serves the metrics, as an installed ckpt::metrics is used; prints the URL
// and the committed count the endpoint's families give (the script fetches nothing: the
// endpoint's tests do).
//   metrics_consumer DIR
#include <ckpt/ckpt.hpp>
#include <ckpt/metrics/server.hpp>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  ckpt::Checkpointer checkpointer({.root = argv[1], .world_size = 1});
  ckpt::MetricsServer server(checkpointer);  // 127.0.0.1, a free port
  std::vector<float> w(100, 2.5f);
  ckpt::SaveInfo info;
  info.param_shard_numel = info.param_numel = w.size();
  const std::vector<ckpt::TensorView> state{{"w", ckpt::DType::F32, {w.size()}, std::as_bytes(std::span(w))}};
  checkpointer.save_sync(0, 1, state, info);
  const std::string text = ckpt::render_prometheus(checkpointer);
  const bool counted = text.find("\nckpt_checkpoints_committed_total 1\n") != std::string::npos;
  std::printf("metrics consumer: serving %s, committed counted: %s\n", server.url().c_str(), counted ? "yes" : "no");
  return counted && server.port() > 0 ? 0 : 1;
}
