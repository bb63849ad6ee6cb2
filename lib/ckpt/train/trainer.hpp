// One rank of a data-parallel (DDP + ZeRO-1) training run of the mini GPT, behind the narrow
// interface a training loop needs: step(), and the state to checkpoint and restore. The loop
// never sees a collective, a shard range or a file name.
#pragma once

#include <boost/json/object.hpp>
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/dist/communicator.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/io/reader.hpp"
#include "ckpt/runtime/checkpointer.hpp"
#include "ckpt/train/data.hpp"
#include "ckpt/train/gpt.hpp"
#include "ckpt/train/zero.hpp"

namespace ckpt::train {

struct TrainConfig {
  GptConfig model;
  std::uint64_t seed = 1234;             ///< parameters, corpus and per-rank RNG derive from it
  std::size_t corpus_tokens = 1 << 16;
  Precision precision = Precision::f16;
  AdamConfig adam;
  std::uint64_t warmup_steps = 2;
  std::uint64_t total_steps = 20;        ///< of the LR schedule
  float token_noise = 0.02f;             ///< probability an input token is replaced (per-rank RNG)
  float lr_multiplier = 1.0f;            ///< scales the schedule (exposed for experiments)
  /// The configuration as JSON (recorded in the checkpoint; a resume must match it).
  boost::json::object to_json() const;
};

/// xoshiro256**: small, fast, and its whole state is four words a checkpoint can carry.
class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) noexcept;
  std::uint64_t next() noexcept;
  /// Uniform in [0, 1).
  double uniform() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  std::array<std::uint64_t, 4> state() const noexcept { return s_; }
  void set_state(const std::array<std::uint64_t, 4>& s) noexcept { s_ = s; }

 private:
  std::array<std::uint64_t, 4> s_{};
};

/// Whether a resume may change the world size (see docs/resharding.md).
enum class Reshard {
  no,     ///< a checkpoint written at another world size is Errc::world_size_mismatch
  allow,  ///< re-slice the flat optimizer state for this world size while loading
};

struct StepStats {
  std::uint64_t step = 0;   ///< the step just completed (1-based)
  float loss = 0;           ///< mean over ranks (identical on every rank)
  double grad_norm = 0;     ///< global norm of the mean gradient
  double param_norm = 0;    ///< L2 norm of this rank's 16-bit parameters (equal on all ranks)
  float lr = 0;
  float loss_scale = 0;
  bool skipped = false;     ///< overflow: the update was skipped
  double step_ms = 0;       ///< forward, backward and optimizer step on this rank
};

struct MemoryProfile {
  std::uint64_t params = 0, grads = 0, optimizer = 0, activations = 0;
  std::uint64_t expected_optimizer = 0;  ///< 12 * padded P / N
};

class Trainer {
 public:
  /// Builds this rank's model, data and optimizer, and broadcasts rank 0's initial
  /// parameters (collective: every rank constructs its Trainer at the same time).
  Trainer(const TrainConfig& config, dist::Communicator& comm);

  /// One training step: forward/backward on this rank's batch, then the ZeRO-1 step.
  /// Collective.
  StepStats step();

  std::uint64_t step_count() const noexcept { return step_; }
  const TrainConfig& config() const noexcept { return cfg_; }
  int rank() const noexcept { return comm_.rank(); }
  int world_size() const noexcept { return comm_.size(); }
  std::size_t num_params() const noexcept { return opt_.num_params(); }
  const Zero1Optimizer& optimizer() const noexcept { return opt_; }
  MemoryProfile memory() const noexcept;
  /// Upcast copy of the current parameters (num_params floats).
  std::vector<float> parameters() const;

  // ---- checkpointing: what to save, and how to come back ----
  /// Views of the live state to stage (valid until the next step()): the rank's optimizer
  /// shard (optim.master, optim.m, optim.v, fp32) and, on rank 0, the 16-bit parameters by
  /// name (model.<name>), so the checkpoint is readable tensor by tensor.
  std::vector<TensorView> checkpoint_tensors() const;
  /// Offsets of the shard, per-rank state (data position, RNG) and the global training state
  /// (step, Adam step, loss scaler, LR schedule, configuration), plus what makes the
  /// checkpoint reshardable and exportable: flat_tensors (optim.master, optim.m, optim.v),
  /// num_params, param_layout ([{name, shape, offset, numel}] in the flat space) and
  /// rank_local_metadata (["rng"]).
  SaveInfo checkpoint_info() const;
  /// Restores from this rank's loaded shard of a checkpoint written at the same world size
  /// and configuration (Errc::invalid_argument naming the difference otherwise). Collective.
  void restore(const LoadedShard& shard, const Manifest& manifest);
  /// Restores from the checkpoint ROOT/latest names (verified): every rank loads its part,
  /// and all ranks agree they loaded the same checkpoint before restoring (a rank that
  /// failed throws its error, the others Errc::aborted naming it). With Reshard::no a
  /// checkpoint of another world size is Errc::world_size_mismatch naming both sizes; with
  /// Reshard::allow each rank reads its slice of the flat optimizer state from the byte
  /// ranges of the source shards that overlap it (each chunk XXH3-checked; Verify::full
  /// also checks every source file's SHA-256, the ranks sharing the files), and per-rank
  /// state is remapped as docs/resharding.md says: the data position is global, rank r
  /// continues source rank r's RNG stream if there was one, else starts the stream
  /// rank_rng_seed(seed, r, step) names. Returns the step resumed from. Collective.
  std::uint64_t resume_latest(const std::string& root, Verify verify = Verify::fast, Reshard reshard = Reshard::no);

  // ---- two tiers (runtime/tiering.hpp) ----
  /// What resume_latest_tiered used.
  struct TieredResume {
    std::uint64_t step = 0;   ///< the step resumed from
    std::string tier;         ///< "local" or "durable"
    std::string local_error;  ///< why the local tier was passed over (tier "durable")
  };
  /// resume_latest over two tiers: the checkpoint the local root's `latest` names if it opens
  /// and verifies (`verify`, every shard, on every rank), else the durable root's
  /// (open_latest_tiered, io/tiers.hpp). Every rank must pick the same one (else
  /// Errc::aborted naming the rank that differs). Collective.
  TieredResume resume_latest_tiered(const std::string& local_root, const std::string& durable_root, Verify verify = Verify::fast,
                                    Reshard reshard = Reshard::no);

 private:
  TrainConfig cfg_;
  dist::Communicator& comm_;
  std::vector<std::int32_t> corpus_;
  DataLoader loader_;
  Zero1Optimizer opt_;
  GptWorkspace ws_;
  Rng rng_;
  std::vector<float> params32_, grads32_;
  std::vector<std::int32_t> tokens_, targets_;
  std::vector<ParamTensor> layout_;
  std::uint64_t step_ = 0;
  double wall_seconds_ = 0;

  struct LoadedState;
  std::uint64_t resume_from(const std::function<OpenedCheckpoint(std::optional<int>)>& open, const std::string& where, Verify verify,
                            Reshard reshard);  // collective
  void check_config(const Manifest& manifest) const;
  LoadedState load_state(const LoadedShard& shard, const Manifest& manifest) const;
  LoadedState load_state_resharded(const CheckpointReader& checkpoint, Verify verify) const;
  void apply_state(const LoadedState& state);  // collective
};

/// The seed of the RNG stream of a rank that a resharded checkpoint has no stream for (rank r
/// >= the source world size): splitmix64 folded over (seed, rank, step), so it is the same
/// in every run and for every way of resharding (load time or `ckpt reshard`).
std::uint64_t rank_rng_seed(std::uint64_t seed, int rank, std::uint64_t step) noexcept;

/// Saves the trainer's state through the checkpointer (returns once staged). The loop's only
/// checkpoint call.
SaveHandle save_checkpoint(Checkpointer& checkpointer, const Trainer& trainer);

}  // namespace ckpt::train
