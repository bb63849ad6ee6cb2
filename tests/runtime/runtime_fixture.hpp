// SPDX-License-Identifier: Apache-2.0
// Shared by the runtime tests: rank threads with a small state, and the backends to run
// every conformance test against.
#pragma once

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/format/boost_json.hpp"
#include "ckpt/fs/layout.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/runtime/write_backend.hpp"
#include "support/test_support.hpp"

namespace ckpt::test {

/// The backends available here (io_uring is skipped, with a message, where the kernel
/// refuses it).
inline std::vector<WriterBackend> backends() {
  std::vector<WriterBackend> out{WriterBackend::posix};
  if (detail::io_uring_available(nullptr)) out.push_back(WriterBackend::io_uring);
  return out;
}
inline const char* backend_label(WriterBackend b) { return b == WriterBackend::posix ? "posix" : "io_uring"; }

/// One rank's training state: fp32 "master" (values depend on rank and a version number),
/// an int64 step and an empty tensor.
struct RankState {
  std::vector<float> master;
  std::vector<std::int64_t> counter{0};
  std::vector<float> empty;
  RankState(int rank, std::size_t n) : master(n) { set(rank, 0); }
  void set(int rank, std::uint64_t version) {
    for (std::size_t i = 0; i < master.size(); ++i) master[i] = static_cast<float>(rank * 1000003 + i) + static_cast<float>(version) * 0.5f;
    counter[0] = static_cast<std::int64_t>(version);
  }
  std::vector<TensorView> views() const {
    return {{"master", DType::F32, {master.size()}, std::as_bytes(std::span(master))},
            {"counter", DType::I64, {1}, std::as_bytes(std::span(counter))},
            {"empty", DType::F32, {0}, {}}};
  }
};

inline SaveInfo info_for(int rank, int world, std::size_t n, std::uint64_t step) {
  SaveInfo info;
  info.param_shard_offset = static_cast<std::uint64_t>(rank) * n;
  info.param_shard_numel = n;
  info.param_numel = static_cast<std::uint64_t>(world) * n;
  info.wall_clock_seconds = static_cast<double>(step);
  json_of(info.metadata)["data_position"] = static_cast<std::int64_t>(step * 10 + static_cast<std::uint64_t>(rank));
  json_of(info.training)["lr"] = 0.001;
  return info;
}

/// The checkpoint directories (step-N) under `root`, sorted.
inline std::vector<std::string> step_dirs(const std::filesystem::path& root) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(root))
    if (parse_checkpoint_dir_name(e.path().filename().string())) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// The temporaries (".tmp-*", ".latest.tmp-*") under `root`.
inline std::vector<std::string> temporaries(const std::filesystem::path& root) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(root))
    if (is_temporary_name(e.path().filename().string())) out.push_back(e.path().filename().string());
  return out;
}

/// Runs fn(rank) on `world` threads and joins them; rethrows the first exception.
inline void run_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace ckpt::test
