// SPDX-License-Identifier: Apache-2.0
// One rank of a data-parallel (DDP + ZeRO-1) training run of the mini GPT, behind the narrow
// interface a training loop needs: step(), and the state to checkpoint and restore. The loop
// never sees a collective, a shard range or a file name.
#pragma once

#include <chrono>
#include <boost/json/object.hpp>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "ckpt/dist/communicator.hpp"
#include "ckpt/format/safetensors.hpp"
#include "ckpt/read/reader.hpp"
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
  /// Gradient accumulation: one step() trains on this many micro-batches of model.batch
  /// sequences per rank (k >= 1). A checkpoint without the key was written with k = 1.
  int accumulate = 1;
  /// T ranks share each batch and split the attention heads between them (gpt's
  /// TensorParallel): rank r is head group r % T of data-parallel replica r / T, and the world
  /// size must be a multiple of T, the heads too. 1: pure data parallelism. A checkpoint
  /// records it (training.parallel) and a resume with another T is refused.
  int tensor_parallel = 1;
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
  /// Of step_ms: the wait at the fence of a deferred save before the optimizer step (the
  /// part of that save's copy forward and backward did not hide; 0 without one).
  double fence_ms = 0;
};

/// Why SpikeGuard::check tripped.
enum class Trip {
  none,             ///< a good step
  non_finite_loss,  ///< the loss is NaN or infinite
  non_finite_grad,  ///< a non-finite gradient norm the loss scaler cannot absorb (see check())
  loss_spike,       ///< loss > factor x the mean of the recent good steps
};
/// "none", "non-finite loss", "non-finite gradient" or "loss spike".
const char* trip_name(Trip t) noexcept;

struct SpikeGuardConfig {
  double factor = 2.0;          ///< a loss above factor x the recent mean trips (> 1)
  std::size_t window = 5;       ///< the recent mean is over the last `window` good steps (>= 1)
  std::size_t min_history = 3;  ///< no spike verdict before this many good steps (1..window)
};

/// The NaN guard and loss-spike detector of the training loop. It decides from StepStats
/// alone, and every rank sees identical StepStats (the loss is all-reduced, the gradient norm
/// is computed from an all-reduce), so a guard on every rank reaches the same verdict at the
/// same step without a collective of its own.
class SpikeGuard {
 public:
  /// Errc::invalid_argument naming the field unless factor > 1, window >= 1 and
  /// 1 <= min_history <= window.
  explicit SpikeGuard(SpikeGuardConfig config = {});

  /// The verdict on a completed step; a good step joins the history. Trips, in this order:
  /// a non-finite loss; a non-finite gradient norm, unless the step was an fp16 overflow the
  /// loss scaler absorbs (skipped with a loss scale above 1: the update was not applied and
  /// the scale halves, the scaler's ordinary business); a loss above factor x the mean of the
  /// last `window` good losses, once min_history good steps are recorded.
  Trip check(const StepStats& stats);
  /// Forgets the good steps after `step` (after a rollback to `step`, so the replayed steps
  /// are judged against the history they had the first time).
  void rewind_to(std::uint64_t step);
  /// Mean loss of the last `window` good steps (NaN with none).
  double recent_mean() const noexcept;
  std::size_t history_size() const noexcept { return history_.size(); }
  const SpikeGuardConfig& config() const noexcept { return cfg_; }

 private:
  SpikeGuardConfig cfg_;
  // (step, loss) of the good steps, oldest first; window + kRewindSlack are kept so that a
  // rewind by up to kRewindSlack steps still leaves a full window.
  static constexpr std::size_t kRewindSlack = 256;
  std::deque<std::pair<std::uint64_t, float>> history_;
};

/// Where Trainer::rollback may restore from.
enum class RollbackFrom {
  memory_or_disk,  ///< the checkpointer's staged snapshot when every rank still holds it, else disk
  disk,            ///< always the checkpoint ROOT/latest names
};

/// Where a rollback went.
struct RollbackResult {
  std::uint64_t step = 0;    ///< the step restored (the last committed checkpoint)
  bool from_memory = false;  ///< restored from the staged snapshot (else read back from disk)
  std::uint64_t skipped_step = 0;  ///< the step whose batch will be skipped (the tripped step)
};

/// One rank's memory by category, in bytes, measured from the buffers that hold it (capacity x
/// element size), not from formulas.
struct MemoryProfile {
  std::uint64_t params = 0, grads = 0;        ///< the 16-bit parameters and gradients (ZeRO-1: 2P each)
  std::uint64_t params32 = 0, grads32 = 0;    ///< fp32 working copies forward and backward use (4P each)
  std::uint64_t optimizer = 0;                ///< Zero1Optimizer::optimizer_bytes() (12P/N when lean)
  std::uint64_t activations = 0;              ///< the model workspace (activations, their gradients)
  std::uint64_t expected_optimizer = 0;       ///< 12 * padded P / N: what check (c) compares with
  std::uint64_t total() const noexcept { return params + grads + params32 + grads32 + optimizer + activations; }
};

class Trainer {
 public:
  /// Builds this rank's model, data and optimizer, and broadcasts rank 0's initial
  /// parameters (collective: every rank constructs its Trainer at the same time). With
  /// config.tensor_parallel = T > 1 it also splits comm into the tensor-parallel groups (the T
  /// consecutive ranks of one data-parallel replica); a T that does not divide the world size
  /// and the heads is Errc::invalid_argument (on every rank, before communicating).
  /// The data loader and the token-noise RNG run per replica (r / T): the ranks of a
  /// tensor-parallel group train on the same batch. ZeRO-1 still shards over all ranks.
  Trainer(const TrainConfig& config, dist::Communicator& comm);
  /// Waits for a deferred copy of this trainer's state still reading it (the fence of the
  /// save start_save registered), so the memory outlives it.
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// One training step: forward/backward on config().accumulate micro-batches of this rank,
  /// their gradients summed and averaged, then one ZeRO-1 step. Collective. The loss is the
  /// mean over micro-batches and ranks. Before training, a step marked by
  /// skip_batch_of_step() first consumes its batch without training (see there). The
  /// optimizer step, the only place the saved state changes, first waits for the fence of a
  /// deferred save (stage_fence): the copy overlaps forward and backward. Rethrows that
  /// fence's error (CheckpointerOptions::check_deferred_staging).
  StepStats step();

  /// Registers the fence of a save of this trainer's state: every later change of that state
  /// (the next optimizer step, a restore, a rollback, a resume, the destructor) first calls
  /// `save.wait_staged()`. start_save registers its handle; a loop that saves through
  /// Checkpointer::save with Staging::deferred itself registers its handle here. Replaces an
  /// earlier fence (waiting for it first).
  void stage_fence(SaveHandle save);

  // ---- the loop's tools for a guarded run (docs/training.md, "Rollback") ----
  /// Multiplies the learning rate of step `step` (1-based, as StepStats::step) by `x`, once:
  /// the multiplier is consumed when that step runs and is not re-applied when a rollback
  /// replays the step. It is not part of a checkpoint. Used to force a loss spike. Every rank
  /// must set the same.
  void set_lr_multiplier_once(std::uint64_t step, float x);
  /// Marks the batch of step `step` as skipped: when step() runs step `step`, it first
  /// consumes that step's input (data position and noise RNG advance as if it had trained)
  /// without training or counting a step, then trains step `step` on the batch that follows.
  /// Step numbers, the LR schedule and save steps are unchanged. The marks are recorded in
  /// checkpoints (training.skip_batches), so a resume skips the same batches. Every rank
  /// must mark the same steps.
  void skip_batch_of_step(std::uint64_t step);
  /// Steps whose batch is (or was) skipped.
  const std::set<std::uint64_t>& skipped_batches() const noexcept { return skip_steps_; }
  /// Rolls every rank back to the last committed checkpoint of `checkpointer` after the guard
  /// tripped at step `tripped_step`, and marks that step's batch skipped (the rule: replay
  /// steps s+1 .. t-1 on their own batches, skip the batch of t). First waits for the save in
  /// flight, so a checkpoint that commits counts as the last one. From memory when every rank's
  /// Checkpointer::staged() holds the same committed step (and `from` allows it), else
  /// resume_latest(checkpointer.options().root, verify). Skip marks made earlier are kept.
  /// Throws what resume_latest throws (e.g. no checkpoint yet). Collective.
  RollbackResult rollback(Checkpointer& checkpointer, std::uint64_t tripped_step, Verify verify = Verify::fast,
                          RollbackFrom from = RollbackFrom::memory_or_disk);
  /// This rank's gradient as handed to the optimizer by the last step(): the sum over the
  /// micro-batches of d(loss x loss_scale / accumulate)/d(params), num_params floats, before
  /// the reduction across ranks. For tests and diagnostics.
  std::span<const float> local_gradient() const noexcept { return grads32_; }

  std::uint64_t step_count() const noexcept { return step_; }
  const TrainConfig& config() const noexcept { return cfg_; }
  int rank() const noexcept { return comm_.rank(); }
  int world_size() const noexcept { return comm_.size(); }
  std::size_t num_params() const noexcept { return opt_.num_params(); }
  const Zero1Optimizer& optimizer() const noexcept { return opt_; }
  /// The optimizer itself, for tests and diagnostics (e.g. hold_extra_for_testing).
  Zero1Optimizer& optimizer() noexcept { return opt_; }
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
  /// and configuration (otherwise Errc::world_size_mismatch or Errc::invalid_argument naming
  /// the difference and the manifest file beside the shard). Collective.
  void restore(const LoadedShard& shard, const Manifest& manifest);
  /// Restores from a snapshot still staged in the checkpointer (Checkpointer::staged), with
  /// the checks restore() makes. Collective.
  void restore(const StagedSnapshot& snapshot);
  /// Restores from the checkpoint ROOT/latest names (verified): every rank loads its part,
  /// and all ranks agree they loaded the same checkpoint before restoring (a rank that
  /// failed throws its error, the others Errc::aborted naming it). With Reshard::no a
  /// checkpoint of another world size is Errc::world_size_mismatch naming both sizes; with
  /// Reshard::allow each rank reads its slice of the flat optimizer state from the byte
  /// ranges of the source shards that overlap it (each chunk XXH3-checked; Verify::full
  /// also checks every source file's SHA-256, the ranks sharing the files), and per-rank
  /// state is remapped as docs/resharding.md says: the data position is global, rank r
  /// continues source rank r's RNG stream if there was one, else starts the stream
  /// rank_rng_seed(seed, r / T, step) names (T: tensor_parallel, so the ranks of a
  /// tensor-parallel group keep drawing the same noise). A checkpoint whose training.parallel
  /// records another tensor-parallel size (none recorded: 1) is Errc::invalid_argument naming
  /// both layouts, with or without resharding. Every refusal of the checkpoint (world size,
  /// layout, configuration, shard range, training state) names its manifest file
  /// (CheckpointReader::manifest_path), so that of several roots or tiers the user can tell
  /// which was refused. Returns the step resumed from. Collective.
  /// The optimizer shard (master, m, v) is read straight into the optimizer's own buffers
  /// (load_into, read/load_into.hpp), after every check that needs no shard bytes (world size,
  /// layout, configuration, manifest state). So a throw after those checks may leave this
  /// rank's optimizer buffers holding part of the checkpoint (verified bytes, zeros where a
  /// chunk failed, as load_into documents) under the old step and scaler: resume again (or
  /// start afresh) before training on. A throw before them leaves the trainer as it was.
  std::uint64_t resume_latest(const std::string& root, Verify verify = Verify::fast, Reshard reshard = Reshard::no);
  /// resume_latest from what `checkpointer` saves: its root, through its file system (with
  /// node roots under MPI, the other nodes' roots are reached through the coordinator). With
  /// node roots and ranks in several processes, the checkpoint is opened without the check
  /// and rebuild a node set otherwise gets (open_latest's repair): the Checkpointer's
  /// construction did it once for every process; each rank's loads verify what they read.
  /// Collective.
  std::uint64_t resume_latest(const Checkpointer& checkpointer, Verify verify = Verify::fast, Reshard reshard = Reshard::no);
  /// The restart loop's resume: resume_latest(root, ...) if ROOT may hold a committed
  /// checkpoint (store/tiers.hpp's find_committed_checkpoint: a `latest`; for a node set any
  /// node's `latest`, or a step renamed into place on every node root), else nothing (the
  /// trainer stays at step 0: start fresh) and nullopt. A missing root is an empty one; so is
  /// a root holding only step directories that `latest` never named (a crash in the first
  /// save: the Checkpointer's prepare_root removes them). A `latest` naming a checkpoint that
  /// fails to load throws its error, as resume_latest does: a committed checkpoint is never
  /// silently passed over. A node set whose newest step no `latest` names yet is resumed
  /// once the Checkpointer's construction moved every `latest` to it (construct it first, as
  /// the restart loop does); before that the resume throws not_found, never starts fresh. Every rank must see the
  /// same root (else Errc::aborted naming the rank that differs). Returns the step resumed
  /// from. Collective.
  std::optional<std::uint64_t> resume_or_start(const std::string& root, Verify verify = Verify::fast, Reshard reshard = Reshard::no);

  // ---- two tiers (runtime/tiering.hpp) ----
  /// What resume_latest_tiered used.
  struct TieredResume {
    std::uint64_t step = 0;   ///< the step resumed from
    std::string tier;         ///< "local" or "durable"
    std::string local_error;  ///< why the local tier was passed over (tier "durable")
    std::string adopted_run;  ///< the object store's run this resume adopted (adopt_run), if any
  };
  /// resume_latest over two tiers: the checkpoint the local root's `latest` names if it opens
  /// and verifies (`verify`, every shard, on every rank), else the durable root's
  /// (open_latest_tiered, store/tiers.hpp). Every rank must pick the same one (else
  /// Errc::aborted naming the rank that differs). The durable tier's newest may be older
  /// than what the local `latest` names (that one was corrupt): a run that saves after such
  /// a resume builds its Checkpointer with CheckpointerOptions::allow_older_than_latest, or
  /// its saves up to that step are refused. An s3:// durable root's checkpoint of another
  /// run than the local root's is refused (Errc::conflict naming both runs) unless
  /// `adopt_run` (open_latest_tiered). Collective.
  TieredResume resume_latest_tiered(const std::string& local_root, const std::string& durable_root, Verify verify = Verify::fast,
                                    Reshard reshard = Reshard::no, bool adopt_run = false);

  // ---- levels (store/recovery.hpp) ----
  /// What resume_planned did.
  struct PlannedResume {
    std::uint64_t step = 0;    ///< the step resumed from
    std::string root;          ///< the level it came from
    std::string plan;          ///< the plan's one line (RecoveryPlan::summary)
    std::chrono::nanoseconds discover{}, fetch{}, rebuild{};  ///< rank 0's, the same on every rank
  };
  /// Resumes from the newest checkpoint over `levels` (cheapest first: mem://NAME, a disk
  /// root or node set, a durable directory or s3:// prefix), as the recovery planner picks it
  /// (plan_recovery, expecting this world size unless `reshard`): rank 0 surveys, carries out
  /// the plan (a rebuild from the level's redundancy, or a restore into `restore_into`, a
  /// directory root, for an object store; recover_planned) and tells the other ranks which
  /// checkpoint to read; every rank then loads it as resume_latest does. Returns nullopt, on
  /// every rank, when no level holds a committed checkpoint (store::committed_evidence): the
  /// trainer stays at step 0. A level that holds one but nothing usable is the planner's
  /// Errc::not_found, naming why each candidate was passed over (never a fresh start); on the
  /// other ranks Errc::aborted carrying rank 0's message. last_resume_timing() has the
  /// verify and load. Collective.
  std::optional<PlannedResume> resume_planned(const std::vector<std::string>& levels, Verify verify = Verify::fast, Reshard reshard = Reshard::no,
                                              const std::string& restore_into = {});

  /// Where the last resume of this rank spent its time (wall clock), the parts of time to
  /// recover a resume itself measures (store/recovery.hpp names the others).
  struct ResumeTiming {
    /// Finding and opening the checkpoint: its manifest decoded and checked, every shard's
    /// size checked against it (and, for a tiered resume, the tier chosen).
    std::chrono::nanoseconds verify{};
    /// Reading every tensor into the model's and optimizer's memory, each checksum chunk
    /// verified as it lands, and the collective restore.
    std::chrono::nanoseconds load{};
  };
  const ResumeTiming& last_resume_timing() const noexcept { return resume_timing_; }

 private:
  ResumeTiming resume_timing_;
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
  std::optional<std::pair<std::uint64_t, float>> lr_once_;  // (step, multiplier)
  std::set<std::uint64_t> skip_steps_;
  SaveHandle fence_;  // a deferred save still copying the state (stage_fence)
  void wait_for_staging();

  // Tensor parallelism (TrainConfig::tensor_parallel); tp_comm_ only when it is > 1.
  int tp_size_ = 1;
  std::unique_ptr<dist::Communicator> tp_comm_;
  TensorParallel tp_;

  struct LoadedState;
  void next_input();  // one micro-batch of this rank, with token noise
  int data_parallel_rank() const noexcept { return comm_.rank() / tp_size_; }
  // `where`: the manifest file refused (or the staged snapshot), named by every refusal.
  void check_parallel(const boost::json::object& training, const std::string& where, int world_size) const;
  void check_config(const boost::json::object& training, const std::string& where) const;
  void check_shard_range(const std::string& where, std::uint64_t offset, std::uint64_t numel) const;
  std::uint64_t resume_from(const std::function<OpenedCheckpoint(std::optional<int>)>& open, const std::string& where, Verify verify,
                            Reshard reshard);  // collective
  void check_restorable(const Manifest& manifest, const std::string& where) const;  // same world size, layout and configuration
  LoadedState load_state(const LoadedShard& shard, const Manifest& manifest) const;
  LoadedState load_state(const StagedSnapshot& snapshot) const;
  // Load straight into the optimizer's buffers (load_into.hpp): the state is in_place.
  LoadedState load_state_into(const CheckpointReader& checkpoint, Verify verify);
  LoadedState load_state_resharded(const CheckpointReader& checkpoint, Verify verify);
  void apply_state(const LoadedState& state);  // collective
};

/// The seed of the RNG stream of a rank that a resharded checkpoint has no stream for (rank r
/// >= the source world size): splitmix64 folded over (seed, rank, step), so it is the same
/// in every run and for every way of resharding (load time or `ckpt reshard`).
std::uint64_t rank_rng_seed(std::uint64_t seed, int rank, std::uint64_t step) noexcept;

/// Starts saving the trainer's state through the checkpointer (the loop's only checkpoint
/// call): the save goes on in the background; the handle reports it. With `staging` (default:
/// the checkpointer's CheckpointerOptions::staging) Staging::copy it returns once the state is
/// staged; with Staging::deferred at once, the copy running while the loop goes on with
/// forward and backward: the handle is registered as the trainer's fence (stage_fence), so
/// its next optimizer step waits for the copy.
SaveHandle start_save(Checkpointer& checkpointer, Trainer& trainer, std::optional<Staging> staging = std::nullopt);

}  // namespace ckpt::train
