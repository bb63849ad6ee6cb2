// SPDX-License-Identifier: Apache-2.0
// A mini GPT in the shape of llm.c's train_gpt2.c: every layer is a forward/backward pair of
// free functions over ONE contiguous fp32 parameter buffer, and the backward pass accumulates
// (+=) into ONE contiguous fp32 gradient buffer with the same layout. A flat buffer is what the
// rest of ckpt wants: ZeRO-1 shards it by offset range, the all-reduce/reduce-scatter run on it
// directly, and the checkpoint writes it (or a shard of it) with the tensor table below as index.
//
// Pure compute: no I/O, no threads, no heap allocation per step (activations live in a
// GptWorkspace allocated once per config). Results are bitwise deterministic for the same
// inputs on the same build and machine (plain sequential loops, fixed summation order; only
// <cmath> exp/tanh/log/sqrt may differ between C libraries).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace ckpt::train {

/// Shape of the model and of one rank's batch (batch is sequences per forward call).
struct GptConfig {
  int vocab = 64;
  int seq = 16;
  int dim = 32;
  int heads = 4;
  int layers = 2;
  int batch = 4;

  /// Throws Errc::invalid_argument unless every field is > 0, dim % heads == 0 and each field
  /// is within a bound (vocab <= 2^20, seq <= 2^12, dim <= 2^14, layers <= 2^8,
  /// batch <= 2^12) small enough that no buffer size computed from them overflows size_t.
  void validate() const;

  friend bool operator==(const GptConfig&, const GptConfig&) = default;
};

/// One named tensor inside the flat parameter buffer: elements [offset, offset + numel).
/// Weights of linear layers are [out, in] (row-major, PyTorch nn.Linear convention).
struct ParamTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset = 0;
  std::size_t numel = 0;
};

/// The tensors in buffer order: "wte" [vocab, dim], "wpe" [seq, dim], then per block l
/// "h<l>.ln1.w", "h<l>.ln1.b", "h<l>.attn.qkv.w" [3dim, dim] (q, k, v row blocks; head h owns
/// rows h*dim/heads.. of each), "h<l>.attn.qkv.b", "h<l>.attn.proj.w" [dim, dim],
/// "h<l>.attn.proj.b", "h<l>.ln2.w", "h<l>.ln2.b", "h<l>.mlp.fc.w" [4dim, dim],
/// "h<l>.mlp.fc.b", "h<l>.mlp.proj.w" [dim, 4dim], "h<l>.mlp.proj.b", and last "lnf.w",
/// "lnf.b", "lm_head.w" [vocab, dim] (untied from wte, no bias). Tensors are contiguous and
/// in this order, so they tile [0, num_params(cfg)). Validates cfg.
std::vector<ParamTensor> param_layout(const GptConfig& cfg);

/// Total number of fp32 parameters (== the end of the last tensor of param_layout). Validates cfg.
std::size_t num_params(const GptConfig& cfg);

/// Fills params (exactly num_params(cfg) elements) the GPT-2 way: linear weights and
/// embeddings N(0, 0.02), the two residual projections (attn.proj.w, mlp.proj.w) scaled by
/// 1/sqrt(2*layers) so the residual stream's variance does not grow with depth, LayerNorm
/// weights 1, all biases 0. The normals come from our own splitmix64 + Box-Muller stream (not
/// std::normal_distribution, whose output is implementation-defined), drawn in buffer order,
/// so a seed gives the same parameters with every standard library.
void init_params(const GptConfig& cfg, std::uint64_t seed, std::span<float> params);

/// Megatron-style tensor parallelism of the attention heads, as a hook so gpt stays pure
/// compute. With size T > 1, rank r of a tensor-parallel group of T ranks (all running the same
/// batch on the same replicated parameters) computes only heads [r*heads/T, (r+1)*heads/T):
/// their q/k/v, attention and their part of the output projection; all_reduce_sum then adds
/// the T partial outputs (the projection bias is added by rank 0 only). In the backward pass
/// the gradient w.r.t. the attention input (ln1's output) is all-reduced the same way, and
/// finally the gradients of the head-split tensors (qkv.w, qkv.b, proj.w), which each rank has
/// only for its own heads and zero elsewhere, are all-reduced too, so every rank of the group
/// ends with the whole gradient, the same bits on every rank. The result equals the T = 1
/// computation up to float rounding (partial sums are added in another order), not bitwise.
struct TensorParallel {
  int rank = 0;  ///< this rank's place in the tensor-parallel group, [0, size)
  int size = 1;  ///< heads per rank = heads / size; 1: no tensor parallelism
  /// Replaces the span by its element-wise sum over the group, the same bits on every rank
  /// (e.g. Communicator::all_reduce with ReduceOp::sum). Needed when size > 1. Called the same
  /// number of times with the same sizes on every rank of the group.
  std::function<void(std::span<float>)> all_reduce_sum;
};

/// Activations of one forward pass and the scratch of one backward pass, sized once for a
/// config and reused across steps so the training loop does no heap allocation per step.
/// One workspace serves one forward/backward at a time (not thread-safe); give each rank its own.
class GptWorkspace {
 public:
  /// Validates cfg and allocates every buffer. With tensor_parallel = T > 1 (a divisor of
  /// cfg.heads, else Errc::invalid_argument) the attention activations (qkv, attention output,
  /// pre-softmax and softmax scores) are sized for heads / T heads: the workspace of a rank
  /// of a tensor-parallel group, for calls whose TensorParallel has size T.
  explicit GptWorkspace(const GptConfig& cfg, int tensor_parallel = 1);

  const GptConfig& config() const noexcept { return cfg_; }
  int tensor_parallel() const noexcept { return tp_size_; }
  /// Bytes held (activations, their gradients, gradient scratch): for memory profiles.
  std::size_t bytes() const noexcept;

 private:
  friend float gpt_forward(const GptConfig&, std::span<const float>, std::span<const std::int32_t>,
                           std::span<const std::int32_t>, GptWorkspace&, const TensorParallel&);
  friend void gpt_backward(const GptConfig&, std::span<const float>, std::span<const std::int32_t>,
                           std::span<const std::int32_t>, GptWorkspace&, std::span<float>, float,
                           const TensorParallel&);

  GptConfig cfg_;
  int tp_size_ = 1;
  int tp_rank_ = 0;  // of the last forward
  std::vector<float> acts_;     // forward activations, carved into named slices in gpt.cpp
  std::vector<float> dacts_;    // gradients w.r.t. acts_, same carving; zeroed per backward
  std::vector<float> dparams_;  // one backward's parameter gradient before it is added to grads
  std::vector<std::int32_t> tokens_, targets_;  // the batch of the last forward
  bool has_forward_ = false;
};

/// Runs the model on one batch and returns the mean softmax cross-entropy over the
/// batch*seq positions. tokens and targets are [batch, seq] row-major, values in [0, vocab);
/// params holds num_params(cfg) floats. Keeps the activations in ws for gpt_backward. Throws
/// Errc::invalid_argument for a wrong span size, an out-of-range token or target, or a ws built
/// for another config; arguments are checked before ws is touched, so a rejected call leaves
/// ws as it was. A non-finite loss is returned, not thrown: the NaN guard is the loop's.
/// With tp.size > 1 (see TensorParallel) the call is collective over the tensor-parallel
/// group, every rank returns the same loss, and ws must have been built for tp.size; a tp
/// whose size differs from ws's, whose rank is outside [0, size) or that lacks
/// all_reduce_sum is Errc::invalid_argument.
float gpt_forward(const GptConfig& cfg, std::span<const float> params,
                  std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                  GptWorkspace& ws, const TensorParallel& tp = {});

/// ACCUMULATES d(loss * loss_scale)/d(params) into grads (grads += ...), using the activations
/// of the preceding gpt_forward on ws, which must have seen the same params, tokens and targets
/// (tokens and targets are checked; params are not). Calling it k times, or once per
/// micro-batch, sums the gradients, as gradient accumulation wants; zero grads yourself
/// between optimizer steps. The whole gradient of one call is computed in ws first and then
/// added to grads in one pass, so each call's contribution reaches grads with one rounding per
/// element and does not depend on what grads held: from zeroed grads, two calls on the same
/// batch give exactly twice one call.
/// Throws Errc::invalid_argument for wrong sizes, a ws built for another config, no preceding
/// forward, or tokens/targets other than the forward's, or a tp other than the forward's
/// (size or rank). With tp.size > 1 it is collective over the group and every rank adds the
/// whole gradient (see TensorParallel).
void gpt_backward(const GptConfig& cfg, std::span<const float> params,
                  std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                  GptWorkspace& ws, std::span<float> grads, float loss_scale = 1.0f,
                  const TensorParallel& tp = {});

}  // namespace ckpt::train
