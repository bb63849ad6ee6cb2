// SPDX-License-Identifier: Apache-2.0
#include "ckpt/train/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>

#include "ckpt/core/error.hpp"

#include "ckpt/core/random.hpp"

namespace ckpt::train {

namespace {

using std::size_t;

// ---------------------------------------------------------------------------------------------
// Parameter layout. One place computes the order and shapes; param_layout() names them and the
// hot path reads offsets from ParamOffsets, which allocates nothing.

struct BlockOffsets {
  size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
};

// Calls visit(name_suffix, block or -1, shape...) for every tensor in buffer order.
template <class Visit>
void for_each_tensor(const GptConfig& c, Visit&& visit) {
  const std::int64_t V = c.vocab, T = c.seq, C = c.dim;
  visit("wte", -1, std::vector<std::int64_t>{V, C});
  visit("wpe", -1, std::vector<std::int64_t>{T, C});
  for (int l = 0; l < c.layers; ++l) {
    visit("ln1.w", l, std::vector<std::int64_t>{C});
    visit("ln1.b", l, std::vector<std::int64_t>{C});
    visit("attn.qkv.w", l, std::vector<std::int64_t>{3 * C, C});
    visit("attn.qkv.b", l, std::vector<std::int64_t>{3 * C});
    visit("attn.proj.w", l, std::vector<std::int64_t>{C, C});
    visit("attn.proj.b", l, std::vector<std::int64_t>{C});
    visit("ln2.w", l, std::vector<std::int64_t>{C});
    visit("ln2.b", l, std::vector<std::int64_t>{C});
    visit("mlp.fc.w", l, std::vector<std::int64_t>{4 * C, C});
    visit("mlp.fc.b", l, std::vector<std::int64_t>{4 * C});
    visit("mlp.proj.w", l, std::vector<std::int64_t>{C, 4 * C});
    visit("mlp.proj.b", l, std::vector<std::int64_t>{C});
  }
  visit("lnf.w", -1, std::vector<std::int64_t>{C});
  visit("lnf.b", -1, std::vector<std::int64_t>{C});
  visit("lm_head.w", -1, std::vector<std::int64_t>{V, C});
}

// Offsets by arithmetic, in the same order as for_each_tensor (a test checks that every
// tensor of param_layout gets its own gradient, which would fail if the two disagreed).
struct ParamOffsets {
  size_t wte, wpe, blocks_begin, block_stride, lnfw, lnfb, lm_head, total;

  explicit ParamOffsets(const GptConfig& c) {
    const size_t V = static_cast<size_t>(c.vocab), T = static_cast<size_t>(c.seq),
                 C = static_cast<size_t>(c.dim), L = static_cast<size_t>(c.layers);
    wte = 0;
    wpe = wte + V * C;
    blocks_begin = wpe + T * C;
    block_stride = 12 * C * C + 13 * C;
    lnfw = blocks_begin + L * block_stride;
    lnfb = lnfw + C;
    lm_head = lnfb + C;
    total = lm_head + V * C;
  }

  BlockOffsets block(const GptConfig& c, int l) const {
    const size_t C = static_cast<size_t>(c.dim);
    BlockOffsets b{};
    b.ln1w = blocks_begin + static_cast<size_t>(l) * block_stride;
    b.ln1b = b.ln1w + C;
    b.qkvw = b.ln1b + C;
    b.qkvb = b.qkvw + 3 * C * C;
    b.projw = b.qkvb + 3 * C;
    b.projb = b.projw + C * C;
    b.ln2w = b.projb + C;
    b.ln2b = b.ln2w + C;
    b.fcw = b.ln2b + C;
    b.fcb = b.fcw + 4 * C * C;
    b.fcprojw = b.fcb + 4 * C;
    b.fcprojb = b.fcprojw + 4 * C * C;
    return b;
  }
};

// ---------------------------------------------------------------------------------------------
// Activations: one flat buffer carved into slices in a fixed order, for acts_ and dacts_ alike
// (llm.c's ActivationTensors). The "L x" slices hold one copy per block.

struct Acts {
  float* encoded;    // [B,T,C]
  float* ln1;        // L x [B,T,C]
  float* ln1_mean;   // L x [B,T]
  float* ln1_rstd;   // L x [B,T]
  // Attention slices hold this rank's heads only: with tensor parallelism T, Cl = C/T
  // channels and NHl = NH/T heads (Cl = C, NHl = NH without it).
  float* qkv;        // L x [B,T,3Cl]: this rank's q | k | v
  float* atty;       // L x [B,T,Cl]
  float* preatt;     // L x [B,NHl,T,T]
  float* att;        // L x [B,NHl,T,T]
  float* attproj;    // L x [B,T,C]
  float* residual2;  // L x [B,T,C]
  float* ln2;        // L x [B,T,C]
  float* ln2_mean;   // L x [B,T]
  float* ln2_rstd;   // L x [B,T]
  float* fch;        // L x [B,T,4C]
  float* fch_gelu;   // L x [B,T,4C]
  float* fcproj;     // L x [B,T,C]
  float* residual3;  // L x [B,T,C]
  float* lnf;        // [B,T,C]
  float* lnf_mean;   // [B,T]
  float* lnf_rstd;   // [B,T]
  float* logits;     // [B,T,V]
  float* probs;      // [B,T,V]
  float* losses;     // [B,T]
};

// Carves base (may be null to only count) for a rank of a tensor-parallel group of tp ranks
// and returns the number of floats used.
size_t carve(const GptConfig& c, int tp, float* base, Acts* a) {
  const size_t B = static_cast<size_t>(c.batch), T = static_cast<size_t>(c.seq),
               C = static_cast<size_t>(c.dim), L = static_cast<size_t>(c.layers),
               NH = static_cast<size_t>(c.heads), V = static_cast<size_t>(c.vocab);
  const size_t Cl = C / static_cast<size_t>(tp), NHl = NH / static_cast<size_t>(tp);
  const size_t BT = B * T;
  size_t used = 0;
  auto take = [&](float*& slot, size_t n) {
    slot = base ? base + used : nullptr;
    used += n;
  };
  Acts tmp{};
  Acts& s = a ? *a : tmp;
  take(s.encoded, BT * C);
  take(s.ln1, L * BT * C);
  take(s.ln1_mean, L * BT);
  take(s.ln1_rstd, L * BT);
  take(s.qkv, L * BT * 3 * Cl);
  take(s.atty, L * BT * Cl);
  take(s.preatt, L * B * NHl * T * T);
  take(s.att, L * B * NHl * T * T);
  take(s.attproj, L * BT * C);
  take(s.residual2, L * BT * C);
  take(s.ln2, L * BT * C);
  take(s.ln2_mean, L * BT);
  take(s.ln2_rstd, L * BT);
  take(s.fch, L * BT * 4 * C);
  take(s.fch_gelu, L * BT * 4 * C);
  take(s.fcproj, L * BT * C);
  take(s.residual3, L * BT * C);
  take(s.lnf, BT * C);
  take(s.lnf_mean, BT);
  take(s.lnf_rstd, BT);
  take(s.logits, BT * V);
  take(s.probs, BT * V);
  take(s.losses, BT);
  return used;
}

// ---------------------------------------------------------------------------------------------
// Layers: forward/backward pairs. Every backward ADDS into its gradient outputs (llm.c's
// convention), which is what lets a residual branch and the skip path both feed one gradient.

void encoder_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                     size_t B, size_t T, size_t C) {
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      float* o = out + (b * T + t) * C;
      const float* we = wte + static_cast<size_t>(tokens[b * T + t]) * C;
      const float* pe = wpe + t * C;
      for (size_t i = 0; i < C; ++i) o[i] = we[i] + pe[i];
    }
  }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                      size_t B, size_t T, size_t C) {
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      const float* d = dout + (b * T + t) * C;
      float* dwe = dwte + static_cast<size_t>(tokens[b * T + t]) * C;
      float* dpe = dwpe + t * C;
      for (size_t i = 0; i < C; ++i) {
        dwe[i] += d[i];
        dpe[i] += d[i];
      }
    }
  }
}

constexpr float kLayerNormEps = 1e-5f;

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, size_t BT, size_t C) {
  for (size_t p = 0; p < BT; ++p) {
    const float* x = inp + p * C;
    float m = 0.0f;
    for (size_t i = 0; i < C; ++i) m += x[i];
    m /= static_cast<float>(C);
    float v = 0.0f;
    for (size_t i = 0; i < C; ++i) {
      const float xm = x[i] - m;
      v += xm * xm;
    }
    v /= static_cast<float>(C);
    const float s = 1.0f / std::sqrt(v + kLayerNormEps);
    float* o = out + p * C;
    for (size_t i = 0; i < C; ++i) o[i] = (s * (x[i] - m)) * weight[i] + bias[i];
    mean[p] = m;
    rstd[p] = s;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, size_t BT, size_t C) {
  for (size_t p = 0; p < BT; ++p) {
    const float* d = dout + p * C;
    const float* x = inp + p * C;
    float* dx = dinp + p * C;
    const float m = mean[p], s = rstd[p];
    // The two reductions of the LayerNorm Jacobian (mean of dnorm, mean of dnorm * norm).
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (size_t i = 0; i < C; ++i) {
      const float norm = (x[i] - m) * s;
      const float dnorm = weight[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= static_cast<float>(C);
    dnorm_norm_mean /= static_cast<float>(C);
    for (size_t i = 0; i < C; ++i) {
      const float norm = (x[i] - m) * s;
      const float dnorm = weight[i] * d[i];
      dbias[i] += d[i];
      dweight[i] += norm * d[i];
      dx[i] += s * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
    }
  }
}

// out[p, o] = bias[o] + sum_i inp[p, i] * weight[o, i]; weight is [OC, C], bias may be null.
// Rows of out are ldo apart and rows of weight ldw apart (0: OC and C), so a block of columns
// of a wider output, or a block of columns of a wider weight, can be used in place (the
// tensor-parallel slices of qkv and proj).
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                    size_t BT, size_t C, size_t OC, size_t ldo = 0, size_t ldw = 0) {
  if (ldo == 0) ldo = OC;
  if (ldw == 0) ldw = C;
  for (size_t p = 0; p < BT; ++p) {
    const float* x = inp + p * C;
    float* o = out + p * ldo;
    for (size_t oc = 0; oc < OC; ++oc) {
      const float* w = weight + oc * ldw;
      float acc = bias ? bias[oc] : 0.0f;
      for (size_t i = 0; i < C; ++i) acc += x[i] * w[i];
      o[oc] = acc;
    }
  }
}

// The strides as in matmul_forward: rows of dout ldo apart, of weight and dweight ldw apart.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, size_t BT, size_t C, size_t OC,
                     size_t ldo = 0, size_t ldw = 0) {
  if (ldo == 0) ldo = OC;
  if (ldw == 0) ldw = C;
  // Loop orders keep the innermost loop a contiguous axpy, which the compiler vectorizes
  // without reassociating any sum (so the result stays independent of the vector width).
  for (size_t p = 0; p < BT; ++p) {
    const float* d = dout + p * ldo;
    float* dx = dinp + p * C;
    for (size_t oc = 0; oc < OC; ++oc) {
      const float g = d[oc];
      const float* w = weight + oc * ldw;
      for (size_t i = 0; i < C; ++i) dx[i] += g * w[i];
    }
  }
  for (size_t oc = 0; oc < OC; ++oc) {
    float* dw = dweight + oc * ldw;
    float db = 0.0f;
    for (size_t p = 0; p < BT; ++p) {
      const float g = dout[p * ldo + oc];
      const float* x = inp + p * C;
      db += g;
      for (size_t i = 0; i < C; ++i) dw[i] += g * x[i];
    }
    if (dbias) dbias[oc] += db;
  }
}

// Causal multi-head self-attention. inp is qkv [B,T,3C] (q | k | v, head h at h*hs within
// each); preatt/att are [B,NH,T,T] with only t2 <= t used; out is [B,T,C].
void attention_forward(float* out, float* preatt, float* att, const float* inp, size_t B,
                       size_t T, size_t C, size_t NH) {
  const size_t C3 = 3 * C, hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      for (size_t h = 0; h < NH; ++h) {
        const float* q = inp + (b * T + t) * C3 + h * hs;
        float* pre = preatt + ((b * NH + h) * T + t) * T;
        float* a = att + ((b * NH + h) * T + t) * T;

        float maxval = -INFINITY;
        for (size_t t2 = 0; t2 <= t; ++t2) {
          const float* k = inp + (b * T + t2) * C3 + C + h * hs;
          float dot = 0.0f;
          for (size_t i = 0; i < hs; ++i) dot += q[i] * k[i];
          dot *= scale;
          pre[t2] = dot;
          maxval = std::max(maxval, dot);
        }
        float sum = 0.0f;
        for (size_t t2 = 0; t2 <= t; ++t2) {
          const float e = std::exp(pre[t2] - maxval);
          a[t2] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        for (size_t t2 = 0; t2 < T; ++t2) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;

        float* o = out + (b * T + t) * C + h * hs;
        for (size_t i = 0; i < hs; ++i) o[i] = 0.0f;
        for (size_t t2 = 0; t2 <= t; ++t2) {
          const float* v = inp + (b * T + t2) * C3 + 2 * C + h * hs;
          const float w = a[t2];
          for (size_t i = 0; i < hs; ++i) o[i] += w * v[i];
        }
      }
    }
  }
}

void attention_backward(float* dinp, float* dpreatt, float* datt, const float* dout,
                        const float* inp, const float* att, size_t B, size_t T, size_t C,
                        size_t NH) {
  const size_t C3 = 3 * C, hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (size_t b = 0; b < B; ++b) {
    for (size_t t = 0; t < T; ++t) {
      for (size_t h = 0; h < NH; ++h) {
        const float* a = att + ((b * NH + h) * T + t) * T;
        float* da = datt + ((b * NH + h) * T + t) * T;
        float* dpre = dpreatt + ((b * NH + h) * T + t) * T;
        const float* q = inp + (b * T + t) * C3 + h * hs;
        float* dq = dinp + (b * T + t) * C3 + h * hs;
        const float* d = dout + (b * T + t) * C + h * hs;

        // out = sum_t2 att[t2] * v[t2]
        for (size_t t2 = 0; t2 <= t; ++t2) {
          const float* v = inp + (b * T + t2) * C3 + 2 * C + h * hs;
          float* dv = dinp + (b * T + t2) * C3 + 2 * C + h * hs;
          float g = 0.0f;
          for (size_t i = 0; i < hs; ++i) {
            g += v[i] * d[i];
            dv[i] += a[t2] * d[i];
          }
          da[t2] += g;
        }
        // Softmax: dpre[j] = att[j] * (datt[j] - sum_i att[i] * datt[i]), the O(T) form of
        // llm.c's O(T^2) Jacobian loop.
        float weighted = 0.0f;
        for (size_t t2 = 0; t2 <= t; ++t2) weighted += a[t2] * da[t2];
        for (size_t t2 = 0; t2 <= t; ++t2) dpre[t2] += a[t2] * (da[t2] - weighted);
        // pre[t2] = scale * q . k[t2]
        for (size_t t2 = 0; t2 <= t; ++t2) {
          const float* k = inp + (b * T + t2) * C3 + C + h * hs;
          float* dk = dinp + (b * T + t2) * C3 + C + h * hs;
          const float g = dpre[t2] * scale;
          for (size_t i = 0; i < hs; ++i) {
            dq[i] += k[i] * g;
            dk[i] += q[i] * g;
          }
        }
      }
    }
  }
}

// GELU, tanh approximation (GPT-2's).
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

void gelu_forward(float* out, const float* inp, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + std::tanh(u));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = std::tanh(u);
    // sech^2 as 1 - tanh^2 rather than 1/cosh^2: cosh overflows for large |u|.
    const float sech2 = 1.0f - th * th;
    const float local =
        0.5f * (1.0f + th) + 0.5f * x * sech2 * kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] += local * dout[i];
  }
}

void residual_forward(float* out, const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

// Softmax over the vocabulary and cross-entropy against targets. The loss is computed as
// logsumexp - logit[target] rather than -log(prob), so it stays finite when the target's
// probability underflows to 0 in fp32.
void softmax_crossentropy_forward(float* probs, float* losses, const float* logits,
                                  const std::int32_t* targets, size_t BT, size_t V) {
  for (size_t p = 0; p < BT; ++p) {
    const float* z = logits + p * V;
    float* pr = probs + p * V;
    float maxval = -INFINITY;
    for (size_t i = 0; i < V; ++i) maxval = std::max(maxval, z[i]);
    float sum = 0.0f;
    for (size_t i = 0; i < V; ++i) {
      pr[i] = std::exp(z[i] - maxval);
      sum += pr[i];
    }
    const float inv = 1.0f / sum;
    for (size_t i = 0; i < V; ++i) pr[i] *= inv;
    losses[p] = (maxval + std::log(sum)) - z[static_cast<size_t>(targets[p])];
  }
}

// dlogits += (probs - onehot(target)) * dloss, with dloss the same for every position.
void softmax_crossentropy_backward(float* dlogits, const float* probs,
                                   const std::int32_t* targets, float dloss, size_t BT,
                                   size_t V) {
  for (size_t p = 0; p < BT; ++p) {
    const float* pr = probs + p * V;
    float* dz = dlogits + p * V;
    const size_t target = static_cast<size_t>(targets[p]);
    for (size_t i = 0; i < V; ++i) {
      const float indicator = i == target ? 1.0f : 0.0f;
      dz[i] += (pr[i] - indicator) * dloss;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Argument checks shared by forward and backward.

void check_tokens(std::span<const std::int32_t> ids, int vocab, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw_invalid(std::string("gpt: ") + what + "[" + std::to_string(i) +
                    "] = " + std::to_string(ids[i]) + " is outside [0, " +
                    std::to_string(vocab) + ")");
    }
  }
}

void check_size(size_t actual, size_t expected, const char* what) {
  if (actual != expected) {
    throw_invalid(std::string("gpt: ") + what + " has " + std::to_string(actual) +
                  " elements, expected " + std::to_string(expected));
  }
}

void check_workspace(const GptConfig& cfg, const GptConfig& ws_cfg) {
  if (!(cfg == ws_cfg)) throw_invalid("gpt: workspace was built for another GptConfig");
}

void check_tensor_parallel(const TensorParallel& tp, int ws_size, const char* where) {
  if (tp.size != ws_size)
    throw Error(Errc::invalid_argument, {},
                std::string(where) + ": tensor-parallel size differs from the workspace's",
                std::to_string(ws_size), std::to_string(tp.size));
  check_rank(tp.rank, tp.size, "tensor-parallel rank", where);  // no allocation on this hot path
  if (tp.size > 1 && !tp.all_reduce_sum)
    throw_invalid(std::string(where) + ": tensor parallelism needs all_reduce_sum");
}

// This rank's heads: channels [r*Cl, (r+1)*Cl) of each of q, k, v and of the attention
// output (Cl = C/T, NHl = NH/T heads of C/NH channels each).
struct HeadSlice {
  size_t r, Cl, NHl;
  HeadSlice(const GptConfig& c, const TensorParallel& tp)
      : r(static_cast<size_t>(tp.rank)), Cl(static_cast<size_t>(c.dim / tp.size)),
        NHl(static_cast<size_t>(c.heads / tp.size)) {}
};

// qkv [BT, 3Cl] = this rank's rows of the q, k and v blocks of the [3C, C] weight. With one
// rank the three calls compute exactly what one [3C, C] matmul does, in the same order.
void qkv_forward(float* qkv, const float* inp, const float* w, const float* b, size_t BT,
                 size_t C, const HeadSlice& hs) {
  for (size_t j = 0; j < 3; ++j) {
    const size_t row = j * C + hs.r * hs.Cl;
    matmul_forward(qkv + j * hs.Cl, inp, w + row * C, b + row, BT, C, hs.Cl, 3 * hs.Cl, C);
  }
}

void qkv_backward(float* dinp, float* dw, float* db, const float* dqkv, const float* inp,
                  const float* w, size_t BT, size_t C, const HeadSlice& hs) {
  for (size_t j = 0; j < 3; ++j) {
    const size_t row = j * C + hs.r * hs.Cl;
    matmul_backward(dinp, dw + row * C, db + row, dqkv + j * hs.Cl, inp, w + row * C, BT, C,
                    hs.Cl, 3 * hs.Cl, C);
  }
}


// Uniform in (0, 1]: 53 random bits, never 0, so log() below is finite.
double uniform_open0(std::uint64_t& state) {
  return static_cast<double>((splitmix64(state) >> 11) + 1) * 0x1.0p-53;
}

}  // namespace

// -----------------------------------------------------------------------------------------------

void GptConfig::validate() const {
  auto field = [](const char* name, int value, int max) {
    if (value <= 0 || value > max) {
      throw_invalid(std::string("GptConfig.") + name + " = " + std::to_string(value) +
                    " is outside [1, " + std::to_string(max) + "]");
    }
  };
  field("vocab", vocab, 1 << 20);
  field("seq", seq, 1 << 12);
  field("dim", dim, 1 << 14);
  field("heads", heads, 1 << 14);
  field("layers", layers, 1 << 8);
  field("batch", batch, 1 << 12);
  if (dim % heads != 0) {
    throw_invalid("GptConfig.dim = " + std::to_string(dim) + " is not divisible by heads = " +
                  std::to_string(heads));
  }
}

std::vector<ParamTensor> param_layout(const GptConfig& cfg) {
  cfg.validate();
  std::vector<ParamTensor> out;
  size_t offset = 0;
  for_each_tensor(cfg, [&](const char* name, int block, std::vector<std::int64_t> shape) {
    size_t numel = 1;
    for (std::int64_t d : shape) numel *= static_cast<size_t>(d);
    std::string full;
    if (block >= 0) {
      full = 'h';
      full += std::to_string(block);
      full += '.';
    }
    full += name;
    out.push_back(ParamTensor{std::move(full), std::move(shape), offset, numel});
    offset += numel;
  });
  return out;
}

std::size_t num_params(const GptConfig& cfg) {
  cfg.validate();
  return ParamOffsets(cfg).total;
}

void init_params(const GptConfig& cfg, std::uint64_t seed, std::span<float> params) {
  const size_t n = num_params(cfg);
  check_size(params.size(), n, "init_params: params");
  std::uint64_t state = seed;
  // Box-Muller yields normals in pairs; keep the spare so every draw uses the stream in order.
  bool have_spare = false;
  double spare = 0.0;
  auto normal = [&]() -> double {
    if (have_spare) {
      have_spare = false;
      return spare;
    }
    const double r = std::sqrt(-2.0 * std::log(uniform_open0(state)));
    const double theta = 2.0 * std::numbers::pi * uniform_open0(state);
    spare = r * std::sin(theta);
    have_spare = true;
    return r * std::cos(theta);
  };
  const double residual_std = 0.02 / std::sqrt(2.0 * cfg.layers);
  for (const ParamTensor& t : param_layout(cfg)) {
    const std::string_view name = t.name;
    float* p = params.data() + t.offset;
    if (name.ends_with(".b")) {
      std::fill(p, p + t.numel, 0.0f);
    } else if (name.ends_with("ln1.w") || name.ends_with("ln2.w") || name == "lnf.w") {
      std::fill(p, p + t.numel, 1.0f);
    } else {
      const bool residual = name.ends_with("attn.proj.w") || name.ends_with("mlp.proj.w");
      const double std_dev = residual ? residual_std : 0.02;
      for (size_t i = 0; i < t.numel; ++i) p[i] = static_cast<float>(std_dev * normal());
    }
  }
}

GptWorkspace::GptWorkspace(const GptConfig& cfg, int tensor_parallel)
    : cfg_(cfg), tp_size_(tensor_parallel) {
  cfg.validate();
  if (tensor_parallel < 1 || cfg.heads % tensor_parallel != 0)
    throw Error(Errc::invalid_argument, {},
                "GptWorkspace: tensor_parallel must divide heads = " + std::to_string(cfg.heads),
                "a divisor of " + std::to_string(cfg.heads), std::to_string(tensor_parallel));
  const size_t n_acts = carve(cfg, tp_size_, nullptr, nullptr);
  acts_.assign(n_acts, 0.0f);
  dacts_.assign(n_acts, 0.0f);
  dparams_.assign(num_params(cfg), 0.0f);
  const size_t bt = static_cast<size_t>(cfg.batch) * static_cast<size_t>(cfg.seq);
  tokens_.assign(bt, 0);
  targets_.assign(bt, 0);
}

std::size_t GptWorkspace::bytes() const noexcept {
  return (acts_.capacity() + dacts_.capacity() + dparams_.capacity()) * sizeof(float) +
         (tokens_.capacity() + targets_.capacity()) * sizeof(std::int32_t);
}

float gpt_forward(const GptConfig& cfg, std::span<const float> params,
                  std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                  GptWorkspace& ws, const TensorParallel& tp) {
  check_workspace(cfg, ws.cfg_);
  check_tensor_parallel(tp, ws.tp_size_, "gpt_forward");
  const ParamOffsets po(cfg);
  const size_t B = static_cast<size_t>(cfg.batch), T = static_cast<size_t>(cfg.seq),
               C = static_cast<size_t>(cfg.dim), L = static_cast<size_t>(cfg.layers),
               V = static_cast<size_t>(cfg.vocab);
  const size_t BT = B * T;
  check_size(params.size(), po.total, "gpt_forward: params");
  check_size(tokens.size(), BT, "gpt_forward: tokens");
  check_size(targets.size(), BT, "gpt_forward: targets");
  check_tokens(tokens, cfg.vocab, "tokens");
  check_tokens(targets, cfg.vocab, "targets");

  ws.has_forward_ = false;  // until the activations below belong to this batch
  ws.tp_rank_ = tp.rank;
  std::copy(tokens.begin(), tokens.end(), ws.tokens_.begin());
  std::copy(targets.begin(), targets.end(), ws.targets_.begin());

  Acts a{};
  carve(cfg, ws.tp_size_, ws.acts_.data(), &a);
  const HeadSlice hs(cfg, tp);
  const float* P = params.data();

  encoder_forward(a.encoded, tokens.data(), P + po.wte, P + po.wpe, B, T, C);
  for (size_t l = 0; l < L; ++l) {
    const BlockOffsets bo = po.block(cfg, static_cast<int>(l));
    const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
    float* ln1 = a.ln1 + l * BT * C;
    float* ln1_mean = a.ln1_mean + l * BT;
    float* ln1_rstd = a.ln1_rstd + l * BT;
    float* qkv = a.qkv + l * BT * 3 * hs.Cl;
    float* atty = a.atty + l * BT * hs.Cl;
    float* preatt = a.preatt + l * B * hs.NHl * T * T;
    float* att = a.att + l * B * hs.NHl * T * T;
    float* attproj = a.attproj + l * BT * C;
    float* residual2 = a.residual2 + l * BT * C;
    float* ln2 = a.ln2 + l * BT * C;
    float* ln2_mean = a.ln2_mean + l * BT;
    float* ln2_rstd = a.ln2_rstd + l * BT;
    float* fch = a.fch + l * BT * 4 * C;
    float* fch_gelu = a.fch_gelu + l * BT * 4 * C;
    float* fcproj = a.fcproj + l * BT * C;
    float* residual3 = a.residual3 + l * BT * C;

    layernorm_forward(ln1, ln1_mean, ln1_rstd, residual, P + bo.ln1w, P + bo.ln1b, BT, C);
    qkv_forward(qkv, ln1, P + bo.qkvw, P + bo.qkvb, BT, C, hs);
    attention_forward(atty, preatt, att, qkv, B, T, hs.Cl, hs.NHl);
    // This rank's columns of proj.w; the bias once, on rank 0, before the partial sums meet.
    matmul_forward(attproj, atty, P + bo.projw + hs.r * hs.Cl, hs.r == 0 ? P + bo.projb : nullptr,
                   BT, hs.Cl, C, C, C);
    if (tp.size > 1) tp.all_reduce_sum(std::span(attproj, BT * C));
    residual_forward(residual2, residual, attproj, BT * C);
    layernorm_forward(ln2, ln2_mean, ln2_rstd, residual2, P + bo.ln2w, P + bo.ln2b, BT, C);
    matmul_forward(fch, ln2, P + bo.fcw, P + bo.fcb, BT, C, 4 * C);
    gelu_forward(fch_gelu, fch, BT * 4 * C);
    matmul_forward(fcproj, fch_gelu, P + bo.fcprojw, P + bo.fcprojb, BT, 4 * C, C);
    residual_forward(residual3, residual2, fcproj, BT * C);
  }
  const float* last = a.residual3 + (L - 1) * BT * C;
  layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, P + po.lnfw, P + po.lnfb, BT, C);
  matmul_forward(a.logits, a.lnf, P + po.lm_head, nullptr, BT, C, V);
  softmax_crossentropy_forward(a.probs, a.losses, a.logits, targets.data(), BT, V);

  // Summed in double so the mean does not depend on fp32 rounding of a long running sum.
  double total = 0.0;
  for (size_t p = 0; p < BT; ++p) total += a.losses[p];
  ws.has_forward_ = true;
  return static_cast<float>(total / static_cast<double>(BT));
}

void gpt_backward(const GptConfig& cfg, std::span<const float> params,
                  std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                  GptWorkspace& ws, std::span<float> grads, float loss_scale,
                  const TensorParallel& tp) {
  check_workspace(cfg, ws.cfg_);
  check_tensor_parallel(tp, ws.tp_size_, "gpt_backward");
  const ParamOffsets po(cfg);
  const size_t B = static_cast<size_t>(cfg.batch), T = static_cast<size_t>(cfg.seq),
               C = static_cast<size_t>(cfg.dim), L = static_cast<size_t>(cfg.layers),
               V = static_cast<size_t>(cfg.vocab);
  const size_t BT = B * T;
  check_size(params.size(), po.total, "gpt_backward: params");
  check_size(grads.size(), po.total, "gpt_backward: grads");
  check_size(tokens.size(), BT, "gpt_backward: tokens");
  check_size(targets.size(), BT, "gpt_backward: targets");
  if (!ws.has_forward_) throw_invalid("gpt_backward: no preceding gpt_forward on this workspace");
  if (!std::equal(tokens.begin(), tokens.end(), ws.tokens_.begin()) ||
      !std::equal(targets.begin(), targets.end(), ws.targets_.begin())) {
    throw_invalid("gpt_backward: tokens/targets differ from those of the preceding gpt_forward");
  }
  if (tp.rank != ws.tp_rank_)
    throw Error(Errc::invalid_argument, {},
                "gpt_backward: tensor-parallel rank differs from the preceding gpt_forward's",
                std::to_string(ws.tp_rank_), std::to_string(tp.rank));

  Acts a{}, d{};
  carve(cfg, ws.tp_size_, ws.acts_.data(), &a);
  carve(cfg, ws.tp_size_, ws.dacts_.data(), &d);
  const HeadSlice hs(cfg, tp);
  std::fill(ws.dacts_.begin(), ws.dacts_.end(), 0.0f);
  std::fill(ws.dparams_.begin(), ws.dparams_.end(), 0.0f);
  const float* P = params.data();
  float* G = ws.dparams_.data();

  // d(mean loss * loss_scale)/d(loss at one position).
  const float dloss = loss_scale / static_cast<float>(BT);
  softmax_crossentropy_backward(d.logits, a.probs, targets.data(), dloss, BT, V);
  matmul_backward(d.lnf, G + po.lm_head, nullptr, d.logits, a.lnf, P + po.lm_head, BT, C, V);
  {
    const float* last = a.residual3 + (L - 1) * BT * C;
    float* dlast = d.residual3 + (L - 1) * BT * C;
    layernorm_backward(dlast, G + po.lnfw, G + po.lnfb, d.lnf, last, P + po.lnfw, a.lnf_mean,
                       a.lnf_rstd, BT, C);
  }
  for (size_t l = L; l-- > 0;) {
    const BlockOffsets bo = po.block(cfg, static_cast<int>(l));
    const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BT * C;
    float* dresidual = l == 0 ? d.encoded : d.residual3 + (l - 1) * BT * C;
    const size_t o1 = l * BT, oC = l * BT * C, o4C = l * BT * 4 * C;
    const size_t oCl = l * BT * hs.Cl, o3Cl = l * BT * 3 * hs.Cl, oAtt = l * B * hs.NHl * T * T;

    residual_backward(d.residual2 + oC, d.fcproj + oC, d.residual3 + oC, BT * C);
    matmul_backward(d.fch_gelu + o4C, G + bo.fcprojw, G + bo.fcprojb, d.fcproj + oC,
                    a.fch_gelu + o4C, P + bo.fcprojw, BT, 4 * C, C);
    gelu_backward(d.fch + o4C, a.fch + o4C, d.fch_gelu + o4C, BT * 4 * C);
    matmul_backward(d.ln2 + oC, G + bo.fcw, G + bo.fcb, d.fch + o4C, a.ln2 + oC, P + bo.fcw, BT,
                    C, 4 * C);
    layernorm_backward(d.residual2 + oC, G + bo.ln2w, G + bo.ln2b, d.ln2 + oC, a.residual2 + oC,
                       P + bo.ln2w, a.ln2_mean + o1, a.ln2_rstd + o1, BT, C);
    residual_backward(dresidual, d.attproj + oC, d.residual2 + oC, BT * C);
    // proj.b's gradient is whole on every rank: d.attproj is the same on all of them.
    const size_t col = hs.r * hs.Cl;
    matmul_backward(d.atty + oCl, G + bo.projw + col, G + bo.projb, d.attproj + oC,
                    a.atty + oCl, P + bo.projw + col, BT, hs.Cl, C, C, C);
    attention_backward(d.qkv + o3Cl, d.preatt + oAtt, d.att + oAtt, d.atty + oCl, a.qkv + o3Cl,
                       a.att + oAtt, B, T, hs.Cl, hs.NHl);
    qkv_backward(d.ln1 + oC, G + bo.qkvw, G + bo.qkvb, d.qkv + o3Cl, a.ln1 + oC, P + bo.qkvw, BT,
                 C, hs);
    // Each rank has its heads' share of d(ln1 output); the sum is the whole of it.
    if (tp.size > 1) tp.all_reduce_sum(std::span(d.ln1 + oC, BT * C));
    layernorm_backward(dresidual, G + bo.ln1w, G + bo.ln1b, d.ln1 + oC, residual, P + bo.ln1w,
                       a.ln1_mean + o1, a.ln1_rstd + o1, BT, C);
  }
  encoder_backward(G + po.wte, G + po.wpe, d.encoded, tokens.data(), B, T, C);
  if (tp.size > 1) {
    // qkv.w, qkv.b and proj.w are contiguous; each rank holds its heads' rows/columns and
    // zeros elsewhere, so the sum is exact and gives every rank the whole gradient.
    for (size_t l = 0; l < L; ++l) {
      const BlockOffsets bo = po.block(cfg, static_cast<int>(l));
      tp.all_reduce_sum(std::span(G + bo.qkvw, bo.projb - bo.qkvw));
    }
  }

  for (size_t i = 0; i < po.total; ++i) grads[i] += G[i];
}

}  // namespace ckpt::train
