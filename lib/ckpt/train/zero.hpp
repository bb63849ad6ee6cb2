// SPDX-License-Identifier: Apache-2.0
// ZeRO stage 1 with mixed precision, as in DeepSpeed: every rank holds the parameters and the
// gradients in 16 bits (fp16 or bf16); the optimizer state (fp32 master weights, Adam m and v)
// is split across ranks, each rank owning 1/N of the flat parameter space, padded to a
// multiple of N: 12 bytes per parameter in all, 12P/N per rank.
//
// One step: the 16-bit gradients are reduce-scattered (summed in fp32 in rank order, rounded
// once), unscaled, checked for overflow and clipped by the global norm; Adam updates the
// rank's master shard; the shard is rounded to 16 bits and all-gathered into every rank's
// parameters. With fp16 a dynamic loss scale keeps small gradients representable: an overflow
// skips the update and halves the scale, `growth_interval` good steps double it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ckpt/core/dtype.hpp"
#include "ckpt/dist/communicator.hpp"

namespace ckpt::train {

enum class Precision { f16, bf16 };

struct AdamConfig {
  float lr = 1e-2f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_clip = 1.0f;  ///< clip the global gradient norm to this (0: no clipping)
};

/// Linear warmup to base_lr over warmup_steps, then cosine decay to min_ratio * base_lr at
/// total_steps (and flat after).
struct LrSchedule {
  float base_lr = 1e-2f;
  std::uint64_t warmup_steps = 2;
  std::uint64_t total_steps = 20;
  float min_ratio = 0.1f;
  /// Learning rate of optimizer step t (1-based).
  float at(std::uint64_t t) const noexcept;
};

/// Dynamic loss scaling state (saved with a checkpoint).
struct LossScaler {
  float scale = 1024.0f;  // small model, small gradients: 2^10 keeps them in fp16 range without early overflows
  std::uint32_t good_steps = 0;
  std::uint32_t growth_interval = 100;
  /// Records a step's outcome and adjusts the scale.
  void update(bool overflow) noexcept;
};

/// What one step did.
struct StepReport {
  bool skipped = false;   ///< overflow: no update, scale halved
  double grad_norm = 0;   ///< global L2 norm of the unscaled mean gradient (before clipping)
  float lr = 0;
  float loss_scale = 0;   ///< the scale the gradients of this step carried
};

class Zero1Optimizer {
 public:
  /// `num_params` real parameters; the flat space is padded to a multiple of comm.size().
  /// Every rank constructs one with the same arguments. Does not communicate.
  Zero1Optimizer(std::size_t num_params, dist::Communicator& comm, Precision precision, AdamConfig adam,
                 LrSchedule schedule);

  /// DDP start: rank 0's `initial` (num_params fp32 values) is broadcast once; every rank then
  /// holds the same 16-bit parameters and its master shard. Collective.
  void init_from(std::span<const float> initial);

  /// One optimizer step from this rank's gradients (fp32, num_params values, multiplied by
  /// loss_scale()). `lr_multiplier` scales this step's learning rate only (the schedule is
  /// untouched; the same on every rank). Collective. Returns what happened.
  StepReport step(std::span<const float> local_grads_scaled, float lr_multiplier = 1.0f);

  /// The replicated 16-bit parameters (padded_numel() values; the padding stays 0).
  std::span<const std::uint16_t> params16() const noexcept { return params16_; }
  /// Upcasts the parameters into `out` (num_params() floats) for the model's fp32 compute.
  void params_to_f32(std::span<float> out) const;

  std::size_t num_params() const noexcept { return num_params_; }
  std::uint64_t padded_numel() const noexcept { return padded_; }
  /// This rank's shard of the flat space: [offset, offset + numel).
  dist::ShardRange shard() const noexcept { return shard_; }
  std::span<float> master() noexcept { return master_; }
  std::span<float> adam_m() noexcept { return m_; }
  std::span<float> adam_v() noexcept { return v_; }
  std::span<const float> master() const noexcept { return master_; }
  std::span<const float> adam_m() const noexcept { return m_; }
  std::span<const float> adam_v() const noexcept { return v_; }
  /// Bytes the optimizer's own buffers hold on this rank, measured (capacity x element size of
  /// each): the fp32 master shard, Adam m and v (12 * shard().numel when nothing else is
  /// held) and any other buffer it keeps. Not computed from a formula, so a check against
  /// 12 P / N can fail.
  std::uint64_t optimizer_bytes() const noexcept;
  /// Bytes the 16-bit parameter and gradient buffers hold on this rank (measured).
  std::uint64_t param_bytes() const noexcept { return params16_.capacity() * sizeof(std::uint16_t); }
  std::uint64_t grad_bytes() const noexcept { return grads16_.capacity() * sizeof(std::uint16_t); }
  /// For tests of memory checks: makes the optimizer keep `bytes` more (a buffer it holds
  /// besides its state, as a leaky or wasteful optimizer would). Not thread-safe with step().
  void hold_extra_for_testing(std::size_t bytes);

  Precision precision() const noexcept { return precision_; }
  DType dtype16() const noexcept { return precision_ == Precision::f16 ? DType::F16 : DType::BF16; }
  float loss_scale() const noexcept { return scaler_.scale; }
  LossScaler& scaler() noexcept { return scaler_; }
  const LossScaler& scaler() const noexcept { return scaler_; }
  std::uint64_t adam_step() const noexcept { return adam_step_; }
  const LrSchedule& schedule() const noexcept { return schedule_; }

  /// Restores a saved state (same world size): master/m/v shard, Adam step count, loss scaler.
  /// Rebuilds the 16-bit parameters from the master shards (all-gather). master, m and v may
  /// be master(), adam_m() and adam_v() themselves (a state loaded in place). Collective.
  void restore(std::span<const float> master, std::span<const float> m, std::span<const float> v,
               std::uint64_t adam_step, LossScaler scaler);

 private:
  std::uint16_t to16(float f) const noexcept;
  float from16(std::uint16_t h) const noexcept;
  void gather_params();

  dist::Communicator& comm_;
  std::size_t num_params_;
  std::uint64_t padded_;
  dist::ShardRange shard_;
  Precision precision_;
  AdamConfig adam_;
  LrSchedule schedule_;
  LossScaler scaler_;
  std::uint64_t adam_step_ = 0;
  std::vector<std::uint16_t> params16_, grads16_;
  std::vector<float> master_, m_, v_;
  std::vector<std::byte> extra_;  // hold_extra_for_testing
};

}  // namespace ckpt::train
