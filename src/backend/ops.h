// The op vocabulary of tandem's backends: one argument struct per op. The model's forward pass is straight-line
// code calling these through Backend (backend.h); kernels/ref holds a scalar reference of each for the tests.
// Conventions: tensors are contiguous unless noted; "act" = the backend's activation dtype (f32 on the CPU);
// weights keep their checkpoint dtype (bf16, f16 or f32) and every op accumulates in f32. Shapes, dtypes and
// index ranges (token ids, positions, expert ids) are invariants of the calling code: backends TANDEM_CHECK them.
// Outputs never alias inputs unless the op says so. Every element of an output is written.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "tensor/tensor.h"

namespace tandem {

enum class Op : uint8_t {
  kEmbedding, kLinear, kRmsNorm, kRope, kKvWrite, kAttention, kGeluMul, kAdd, kScale, kSoftcap, kArgmax,
  kMoeRoute, kMoeExperts, kSample, kRejectDrafts, kCount
};
const char* op_name(Op op);

// out[t, :] = table[ids[t], :] * scale.          out [n_tokens, dim] act; table [n_vocab, dim]; ids i32 [n_tokens]
// Every id must lie in [0, n_vocab) (the caller validates request token ids). The product is one f32 multiply.
// The table's rows may be strided (stride[0] >= dim): a column block of a packed table, e.g. one layer's slice of
// the per-layer-embedding table [n_vocab, n_layers * ple_dim] (spec §1.4).
struct EmbeddingArgs {
  Tensor out, table, ids;
  float scale = 1.f;
};

// out = alpha * x @ w^T (+ out if accumulate).    out [n_tokens, n_out] act; x [n_tokens, n_in] act; w [n_out, n_in]
// The activations stay f32 on the CPU (never rounded to the weight dtype); out must not alias x.
struct LinearArgs {
  Tensor out, x, w;
  float alpha = 1.f;
  bool accumulate = false;
  // w was written by an op on the same stream (the centroid head's gathered rows) rather than loaded with the
  // model: a backend that starts streaming weights before the ops ahead of it end (the CUDA GEMV) waits for them.
  bool w_fresh = false;
};

// Row-wise RMSNorm over the last dim, computed in f32: y = x * (mean(x^2) + eps)^-0.5 * w (no "1 + w", spec §1.2).
// Evaluated as HF does: (x * pow(ms + eps, -0.5)) * w, the weight read as f32.
// weight empty = weightless norm (v_norm, router). out may alias x.  x/out [..., dim] act; weight [dim]
// Fused epilogues (one op instead of two or three small ones per layer). Each stage rounds to out's dtype exactly as
// the separate ops would, so the result is bit-identical to the unfused sequence on the same backend:
//  - residual (optional; out's dtype and size; out may alias it): out = residual + y, as add(out, residual, y)
//    after rms_norm(y) (the sandwich-norm residual "h = r + norm(a)", spec §1.5);
//  - out_scale: then out *= out_scale, as scale() would (layer_scalar, which multiplies the whole output, residual
//    included, spec §1.5); with no residual it scales the norm output. Skipped when 1 (an exact identity anyway).
//  - rope_pos / rope_inv_freq (optional, both or neither; the meaning of RopeArgs' pos / inv_freq): x/out are
//    [n_tokens, n_heads, head_dim] (any shape with that many rows of head_dim), n_tokens = rope_pos.numel(), and
//    out = rope(y): the norm output rounded to out's dtype, then RoPE as rope() computes it (q_norm / k_norm then
//    RoPE, spec §1.6). Needs x and out of one dtype; cannot be combined with residual or out_scale != 1.
struct RmsNormArgs {
  Tensor out, x, weight;
  float eps = 1e-6f;
  Tensor residual;
  float out_scale = 1.f;
  Tensor rope_pos, rope_inv_freq;
};

// In-place half-split ("rotate_half") RoPE on x [n_tokens, n_heads, head_dim] at positions pos (i32 [n_tokens]).
// inv_freq f32 [head_dim / 2]; a zero frequency leaves its pair (j, j + head_dim/2) unchanged (proportional RoPE).
// As HF: angle = float(pos) * inv_freq[j] (an f32 product), cos/sin of it in f32 (rounded to the activation dtype
// when that is not f32), y[j] = x[j] c - x[j+half] s, y[j+half] = x[j+half] c + x[j] s (spec §1.7).
struct RopeArgs {
  Tensor x, pos, inv_freq;
};

// K/V storage of one attention layer: k, v [n_kv_heads, capacity, head_dim]. Positions [begin, end) are valid.
// A full layer stores position p at slot p (ring = false); a sliding layer at slot p % capacity (ring = true).
struct KvView {
  Tensor k, v;
  int64_t begin = 0, end = 0;
  bool ring = false;
  [[nodiscard]] int64_t capacity() const { return k.ndim == 3 ? k.shape[1] : 0; }
  [[nodiscard]] int64_t slot(int64_t pos) const { return ring ? pos % capacity() : pos; }
};

// Writes new keys/values (k_new, v_new [n_tokens, n_kv_heads, head_dim] act) at positions pos (i32 [n_tokens]).
// Positions must be >= 0, and < capacity unless ring. The KV storage may be strided in its first two dims (last dim
// contiguous); its dtype is the backend's activation dtype (the CPU backend also accepts bf16 storage).
struct KvWriteArgs {
  KvView kv;
  Tensor k_new, v_new, pos;
};

// The attention block's new keys and values into the cache in one op: k_new = RoPE(rms_norm(k_new) * k_norm) at
// write.pos (rope_inv_freq as RmsNormArgs), v_new = rms_norm(v_new) (weightless), then kv_write(write); k_new and
// v_new may be left holding the normed values or not (only the cache is defined afterwards).
// Optionally (q non-empty) also q = RoPE(rms_norm(q) * q_norm) in place first, as rms_norm with rope would.
struct KvNormWriteArgs {
  KvWriteArgs write;
  Tensor k_norm, rope_inv_freq;
  float eps = 1e-6f;
  Tensor q, q_norm;  // [n_tokens, n_heads, head_dim] act, or empty
};

// out[t, h] = softmax_k(q[t, h] . K[k] * scale + mask) V[k] over keys k in [kv.begin, kv.end) that are visible:
// causal: k <= q_pos[t]; window > 0: k > q_pos[t] - window. Query head h reads KV head h / (n_heads / n_kv_heads).
// Softmax in f32 with the row maximum subtracted. A query with no visible key (e.g. begin > q_pos) gets a zero
// output row, never NaN. Requires end - begin <= capacity for a ring (every key in the range is still stored) and
// end <= capacity otherwise. out may alias q. scale multiplies q.k (Gemma 4 uses 1.0, spec §1.6).
// q/out [n_tokens, n_heads, head_dim] act; q_pos i32 [n_tokens].
// kv_end (optional, i32 [1] on the op's device): the range end read at run time in place of kv.end (a ring's begin
// is then max(0, end - capacity), a full store's stays kv.begin). A captured CUDA graph replays at any cache length
// this way; kv.end must still be given (it sizes the launch outside a capture; inside one, the capacity does).
struct AttentionArgs {
  Tensor out, q;
  KvView kv;
  Tensor q_pos;
  Tensor kv_end;
  int64_t window = 0;
  bool causal = true;
  float scale = 1.f;
};

// The KV range an attention op sees: a.kv, with kv_end (when set) read from host-readable memory and a ring's begin
// derived from it. For host backends and the reference kernels.
inline KvView host_attention_range(const AttentionArgs& a) {
  KvView kv = a.kv;
  if (a.kv_end.empty()) return kv;
  TANDEM_CHECK_MSG(a.kv_end.dtype == DType::kI32 && a.kv_end.numel() == 1 && a.kv_end.device.is_cpu(),
                   "attention kv_end must be one host-readable i32, got %s", a.kv_end.describe().c_str());
  kv.end = *a.kv_end.ptr<int32_t>();
  if (kv.ring) kv.begin = std::max<int64_t>(0, kv.end - kv.capacity());
  return kv;
}

// out = gelu_tanh(gate) * up (GeGLU, spec §1.9). All [n_tokens, d_ff] act. out may alias gate. up's rows may be
// strided (2-D, stride[0] >= d_ff): one layer's block of the per-layer inputs [n_tokens, n_layers * ple_dim].
struct GeluMulArgs {
  Tensor out, gate, up;
};

// out = a + b * b_scale (elementwise, same shapes). out may alias a or b.
struct AddArgs {
  Tensor out, a, b;
  float b_scale = 1.f;
};

// out = gelu_tanh(x @ w_gate^T) * (x @ w_up^T): the first half of the dense GeGLU MLP (spec §1.9), each product
// rounded to the act dtype before the GeGLU exactly as linear, linear, gelu_mul would round. `up` is a scratch
// [n_tokens, d_ff] act buffer the backend may use for the up product. out/up [n_tokens, d_ff] act;
// x [n_tokens, d_model] act; w_gate / w_up [d_ff, d_model].
struct GegluArgs {
  Tensor out, x, w_gate, w_up, up;
};

// out = gelu_tanh(x @ w^T) * up: a product then gelu_mul, rounded as linear then gelu_mul round (the per-layer-input
// gate, spec §1.4). out [n_tokens, n] act; x [n_tokens, k] act; w [n, k]; up [n_tokens, n] act, rows may be strided
// as in gelu_mul.
struct LinearGeluMulArgs {
  Tensor out, x, w, up;
};

// The per-layer-input block of the E models after a layer's feed-forward output f (spec §1.4), as these ops
// compute and round it:
//   rms_norm({.out = x, .x = f, .weight = post_ffn_norm, .eps = eps, .residual = x})
//   linear_gelu_mul({.out = gate_out, .x = x, .w = gate, .up = ple})
//   linear({.out = proj_out, .x = gate_out, .w = proj})
//   rms_norm({.out = x, .x = proj_out, .weight = post_norm, .eps = eps, .residual = x, .out_scale = layer_scalar})
//   rms_norm({.out = next_out, .x = x, .weight = next_norm, .eps = eps})   (only when next_out is not empty)
// x, f, proj_out, next_out [n_tokens, d] act; gate [P, d], proj [d, P]; ple, gate_out [n_tokens, P] act (ple's rows
// may be strided). gate_out and proj_out are scratch: a backend that fuses the block may leave them unwritten.
// next_gate / next_proj (optional, shaped as gate / proj): the next layer's weights of this block, a hint that a
// backend may start fetching them; they change nothing that is computed.
struct PerLayerInputArgs {
  Tensor x, f, post_ffn_norm;
  Tensor gate, ple, proj, post_norm;
  float layer_scalar = 1.f;
  float eps = 1e-6f;
  Tensor gate_out, proj_out;
  Tensor next_out, next_norm;
  Tensor next_gate, next_proj;
};

// The middle of a dense layer (spec §1.5, §1.9): the attention output product, the post-attention residual norm with
// the feed-forward input norm, and the GeGLU MLP, as these ops compute and round it:
//   linear({.out = o, .x = attn, .w = o_proj})
//   rms_norm_then({.out = x, .x = o, .weight = post_attn_norm, .eps = eps, .residual = x},
//                 {.out = xn, .x = x, .weight = pre_ffn_norm, .eps = eps})
//   geglu({.out = g, .x = xn, .w_gate = gate, .w_up = up, .up = u})
//   linear({.out = f, .x = g, .w = down})
// attn [n_tokens, n_heads * head_dim]; o, x, xn, f [n_tokens, d]; g, u [n_tokens, d_ff] (all act); o_proj [d, n_heads
// * head_dim], gate / up [d_ff, d], down [d, d_ff]. o, xn, g and u are scratch: a backend that fuses the block may
// leave them unwritten.
struct AttnOutMlpArgs {
  Tensor attn, o_proj, o;
  Tensor x, post_attn_norm, xn, pre_ffn_norm;
  float eps = 1e-6f;
  Tensor gate, up, g, u, down, f;
};

// Up to kMaxLinearGroup products of one x: out[i] = x @ w[i]^T for i < n (an attention layer's q, k and v
// projections), each exactly as linear({.out = out[i], .x = x, .w = w[i]}) computes it.
inline constexpr int kMaxLinearGroup = 3;
struct LinearGroupArgs {
  Tensor x;
  Tensor out[kMaxLinearGroup], w[kMaxLinearGroup];
  int n = 0;
};

// x *= s (in place).
struct ScaleArgs {
  Tensor x;
  float s = 1.f;
};

// x = cap * tanh(x / cap) (in place, final logit soft-cap, spec §1.11).
struct SoftcapArgs {
  Tensor x;
  float cap = 30.f;
};

// out[r] = argmax over the last dim of x[r, :]; ties go to the lowest index (HF/torch argmax). out i32 [rows].
// NaN counts as larger than every number (torch semantics): a row containing NaN gives the index of its first NaN.
// ids (optional, i32 [n], one row): element i stands for token ids[i]; out gets the winner's id and ties (NaNs
// included) go to the lowest id, as torch.argmax over the scattered vocabulary would pick (the masked embedder).
struct ArgmaxArgs {
  Tensor out, x;
  Tensor ids;
};

// The masked embedder's candidates (spec §4.7): the k clusters c_0..c_{k-1} of the highest logits, in decreasing
// order (ties to the lower cluster; NaN above every number), and their tokens ids[j * m + i] = ordering[c_j * m +
// i], m = ordering.numel() / logits.numel().   logits [1, C] act or f32; ordering i32 [C * m]; ids i32 [k * m].
struct CentroidCandidatesArgs {
  Tensor ids, logits, ordering;
  int k = 0;
};

// Draws one token per row of logits x [rows, n_vocab] (act or f32) from the processed distribution of sampling.h
// (softmax of x / temperature restricted by top-k, then top-p, then min-p; temperature > 0), by the inverse CDF in
// id order with the uniform uniform_at(seed, counter + r) for row r (sample/counter_rng.h). out i32 [rows];
// probs (optional, f32 [rows, n_vocab]) receives the processed distribution. Backends may compute the weights in
// f32 (the CPU reference works in double): probabilities agree to rounding, and a draw differs only when the
// uniform lies within rounding of a boundary of the cumulative distribution.
struct SampleArgs {
  Tensor out, x, probs;
  float temperature = 1.f;
  int top_k = 0;      // 0 = off
  float top_p = 1.f;  // 1 = off
  float min_p = 0.f;  // 0 = off
  uint64_t seed = 0, counter = 0;
};

// The speculative acceptance rule for drafts drawn from a proposal (rejection.h verify_draft_at), one draft per
// row: accept draft[r] iff uniform_at(seed, counter + 2r) < min(1, p[r, d] / q[r, d]); otherwise draw the
// recovered token from normalize(max(0, p[r] - q[r])) (from p[r] when that is all zero) with uniform_at(seed,
// counter + 2r + 1). p, q f32 [rows, n_vocab] (as SampleArgs' probs); draft, accepted (0/1) and token i32 [rows];
// token[r] = draft[r] when accepted.
struct RejectDraftsArgs {
  Tensor accepted, token, p, q, draft;
  uint64_t seed = 0, counter = 0;
};

// MoE routing (spec §1.10) from router logits [n_tokens, n_experts] (f32): softmax over all experts, top-k,
// renormalise the k weights to sum 1, multiply by per_expert_scale[idx]. idx i32 / weights f32 [n_tokens, k].
// The k experts are listed by decreasing logit (= decreasing probability); equal logits go to the lower expert index.
// per_expert_scale [n_experts] is any float dtype; 1 <= k <= n_experts.
struct MoeRouteArgs {
  Tensor idx, weights, logits, per_expert_scale;
  int k = 0;
};

// out[t] = sum_j weights[t, j] * down_e (gelu_tanh(G_e x_t) * (U_e x_t)), e = idx[t, j], where
// gate_up [n_experts, 2 * d_ff, d_model] holds G_e in rows [0, d_ff) and U_e in rows [d_ff, 2 d_ff),
// down [n_experts, d_model, d_ff]. Each selected expert's weights are read once for all tokens that chose it.
// x/out [n_tokens, d_model] act, idx i32 / weights f32 [n_tokens, k] (as moe_route writes them). Summation order
// is backend-defined (HF and the CPU backend add experts in increasing index). out must not alias x.
struct MoeExpertsArgs {
  Tensor out, x, gate_up, down, idx, weights;
};

}  // namespace tandem
