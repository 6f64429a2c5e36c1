// Pieces shared by the MoE files (moe_route.cu: the routing; moe.cu: the grouping, the CUDA-core GEMV-style expert
// kernels and the combine; moe_tc.cu: tensor-core tiles for many tokens): limits, the chunk's shape and the grouping
// tables.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/status.h"
#include "tensor/dtype.h"

namespace tandem::cuda {

inline constexpr int kMaxTopK = 32;  // largest k the kernels take (Gemma 4 26B-A4B uses 8)
// Largest n_experts moe_route (its logits in registers, 32 per lane) and the in-block grouping take (Gemma 4 has 128).
inline constexpr int kMaxExperts = 1024;

inline bool bf16_or_f32(DType t) { return t == DType::kBF16 || t == DType::kF32; }

struct MoeShape {
  int64_t n_exp, d_model, d_ff;
  int k;
  int n_pairs;  // (token, slot) pairs in this chunk, n_tokens * k; pair p = t * k + j, chunk-relative
  DType act;    // the activation dtype: gate, up and h are rounded to it as HF's bf16 tensors are
};

// The grouping moe_group_kernel writes for each chunk (in the scratch), read by the expert kernels.
struct MoeTables {
  int* expert;  // [slots] the slot-th distinct expert (increasing index); -1 for slots past the last
  int* offset;  // [slots] where its pairs start in `pairs`
  int* count;   // [slots] how many pairs chose it
  int* pairs;   // [n_pairs] pair indices grouped by expert, increasing within an expert
};

// moe_tc.cu: the expert products on the tensor cores, for chunks of many tokens (prefill): bf16 weights and
// activations, d_model and d_ff multiples of 32, 16-byte aligned weights and x. gate_up writes h as bf16
// [n_pairs, d_ff] (gate, up and h rounded to bf16 as in moe.cu, so bf16 storage loses nothing); down reads it and
// writes y f32 [n_pairs, d_model] for moe.cu's combine kernel. One block per (row tile, expert slot), looping
// over the slot's pairs 64 or 128 at a time (kernels.h set_moe_tc_wide).
bool moe_tc_applies(const MoeShape& s, DType weights, DType act, const void* gate_up, const void* down, const void* x);
Status launch_moe_tc_gate_up(__nv_bfloat16* h, const MoeTables& tab, const __nv_bfloat16* x,
                             const __nv_bfloat16* gate_up, const MoeShape& s, int64_t slots, cudaStream_t stream);
Status launch_moe_tc_down(float* y, const MoeTables& tab, const __nv_bfloat16* h, const __nv_bfloat16* down,
                          const MoeShape& s, int64_t slots, cudaStream_t stream);

}  // namespace tandem::cuda
