// SPDX-License-Identifier: Apache-2.0
#include "ckpt/train/zero.hpp"

#include <cmath>
#include <numbers>

#include "ckpt/core/error.hpp"

namespace ckpt::train {

float LrSchedule::at(std::uint64_t t) const noexcept {
  if (warmup_steps > 0 && t <= warmup_steps) return base_lr * static_cast<float>(t) / static_cast<float>(warmup_steps);
  if (t >= total_steps || total_steps <= warmup_steps) return base_lr * min_ratio;
  const double progress = static_cast<double>(t - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return static_cast<float>(base_lr * (min_ratio + (1.0 - min_ratio) * cosine));
}

void LossScaler::update(bool overflow) noexcept {
  if (overflow) {
    scale = std::max(1.0f, scale * 0.5f);
    good_steps = 0;
    return;
  }
  if (++good_steps >= growth_interval) {
    good_steps = 0;
    if (scale < 16777216.0f) scale *= 2.0f;
  }
}

Zero1Optimizer::Zero1Optimizer(std::size_t num_params, dist::Communicator& comm, Precision precision, AdamConfig adam,
                               LrSchedule schedule)
    : comm_(comm), num_params_(num_params), precision_(precision), adam_(adam), schedule_(schedule) {
  if (num_params == 0) throw_invalid("Zero1Optimizer: no parameters");
  const auto n = static_cast<std::uint64_t>(comm.size());
  padded_ = (num_params + n - 1) / n * n;
  shard_ = dist::shard_range(padded_, comm.size(), comm.rank());
  params16_.assign(padded_, 0);
  grads16_.assign(padded_, 0);
  master_.assign(shard_.numel, 0.0f);
  m_.assign(shard_.numel, 0.0f);
  v_.assign(shard_.numel, 0.0f);
  // bf16 has fp32's range: no loss scaling needed.
  if (precision_ == Precision::bf16) scaler_.scale = 1.0f, scaler_.growth_interval = UINT32_MAX;
}

std::uint16_t Zero1Optimizer::to16(float f) const noexcept { return precision_ == Precision::f16 ? f32_to_f16(f) : f32_to_bf16(f); }
float Zero1Optimizer::from16(std::uint16_t h) const noexcept { return precision_ == Precision::f16 ? f16_to_f32(h) : bf16_to_f32(h); }

void Zero1Optimizer::params_to_f32(std::span<float> out) const {
  if (out.size() != num_params_) throw_invalid("params_to_f32: wrong output size");
  for (std::size_t i = 0; i < num_params_; ++i) out[i] = from16(params16_[i]);
}

void Zero1Optimizer::gather_params() {
  for (std::uint64_t i = 0; i < shard_.numel; ++i) params16_[shard_.offset + i] = to16(master_[i]);
  std::span<std::uint16_t> all(params16_);
  comm_.all_gather(std::as_bytes(all.subspan(shard_.offset, shard_.numel)), std::as_writable_bytes(all), dtype16());
}

void Zero1Optimizer::init_from(std::span<const float> initial) {
  if (initial.size() != num_params_) throw_invalid("init_from: expected num_params values");
  std::vector<float> full(padded_, 0.0f);
  if (comm_.rank() == 0) std::copy(initial.begin(), initial.end(), full.begin());
  comm_.broadcast(std::span<float>(full), 0);
  for (std::uint64_t i = 0; i < shard_.numel; ++i) master_[i] = full[shard_.offset + i];
  for (std::uint64_t i = 0; i < padded_; ++i) params16_[i] = to16(full[i]);
}

StepReport Zero1Optimizer::step(std::span<const float> grads, float lr_multiplier) {
  if (grads.size() != num_params_) throw_invalid("Zero1Optimizer::step: expected num_params gradients");
  StepReport rep;
  rep.loss_scale = scaler_.scale;
  for (std::size_t i = 0; i < num_params_; ++i) grads16_[i] = to16(grads[i]);
  std::span<std::uint16_t> g16(grads16_);
  // In place: this rank's block of grads16_ receives the sum of every rank's block.
  comm_.reduce_scatter(std::as_bytes(std::span<const std::uint16_t>(g16)), std::as_writable_bytes(g16.subspan(shard_.offset, shard_.numel)),
                       dtype16(), dist::ReduceOp::sum);
  const float unscale = 1.0f / (scaler_.scale * static_cast<float>(comm_.size()));
  double local[2] = {0.0, 0.0};  // {non-finite seen, sum of squares}
  for (std::uint64_t i = 0; i < shard_.numel; ++i) {
    const float g = from16(grads16_[shard_.offset + i]) * unscale;
    if (!std::isfinite(g)) local[0] = 1.0;
    else local[1] += static_cast<double>(g) * g;
  }
  comm_.all_reduce(std::span<double>(local, 2), dist::ReduceOp::sum);
  if (local[0] != 0.0) {
    rep.skipped = true;
    rep.grad_norm = std::numeric_limits<double>::infinity();
    scaler_.update(true);
    return rep;
  }
  rep.grad_norm = std::sqrt(local[1]);
  const float clip = adam_.grad_clip > 0 && rep.grad_norm > adam_.grad_clip
                         ? static_cast<float>(adam_.grad_clip / (rep.grad_norm + 1e-6))
                         : 1.0f;
  const std::uint64_t t = ++adam_step_;
  const float lr = schedule_.at(t) * lr_multiplier;  // x 1.0f is exact: the default changes nothing
  rep.lr = lr;
  const float bc1 = 1.0f - std::pow(adam_.beta1, static_cast<float>(t));
  const float bc2 = 1.0f - std::pow(adam_.beta2, static_cast<float>(t));
  for (std::uint64_t i = 0; i < shard_.numel; ++i) {
    // Unscaled again from the reduced 16-bit block, as above (the same float operations, so
    // the same value): no fp32 gradient shard is kept, the optimizer holds only its 12P/N.
    const float g = from16(grads16_[shard_.offset + i]) * unscale * clip;
    m_[i] = adam_.beta1 * m_[i] + (1.0f - adam_.beta1) * g;
    v_[i] = adam_.beta2 * v_[i] + (1.0f - adam_.beta2) * g * g;
    const float mhat = m_[i] / bc1, vhat = v_[i] / bc2;
    master_[i] -= lr * (mhat / (std::sqrt(vhat) + adam_.eps) + adam_.weight_decay * master_[i]);
  }
  // The padding is never a parameter: keep it exactly zero.
  for (std::uint64_t i = 0; i < shard_.numel; ++i)
    if (shard_.offset + i >= num_params_) master_[i] = 0.0f, m_[i] = 0.0f, v_[i] = 0.0f;
  gather_params();
  scaler_.update(false);
  return rep;
}

std::uint64_t Zero1Optimizer::optimizer_bytes() const noexcept {
  return (master_.capacity() + m_.capacity() + v_.capacity()) * sizeof(float) + extra_.capacity();
}

void Zero1Optimizer::hold_extra_for_testing(std::size_t bytes) { extra_.assign(bytes, std::byte{0}); }

void Zero1Optimizer::restore(std::span<const float> master, std::span<const float> m, std::span<const float> v,
                             std::uint64_t adam_step, LossScaler scaler) {
  for (auto* s : {&master, &m, &v})
    if (s->size() != shard_.numel)
      throw Error(Errc::invalid_argument, {}, "optimizer shard size on rank " + std::to_string(comm_.rank()),
                  std::to_string(shard_.numel), std::to_string(s->size()));
  // The state may already be in place (loaded straight into master(), adam_m(), adam_v()).
  if (master.data() != master_.data()) std::copy(master.begin(), master.end(), master_.begin());
  if (m.data() != m_.data()) std::copy(m.begin(), m.end(), m_.begin());
  if (v.data() != v_.data()) std::copy(v.begin(), v.end(), v_.begin());
  adam_step_ = adam_step;
  scaler_ = scaler;
  gather_params();
}

}  // namespace ckpt::train
