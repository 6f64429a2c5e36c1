// Scalar reference kernels: one plain, obviously-correct loop nest per op of backend/ops.h, on host tensors.
// They are the oracle of the tests (CPU and CUDA backends are compared against them) and are never optimised.
// Inputs of any float dtype (f32/bf16/f16) are read as f32 and accumulated in double where it is cheap.
#pragma once

#include "backend/ops.h"

namespace tandem::ref {

void embedding(const EmbeddingArgs& a);
void linear(const LinearArgs& a);
void rms_norm(const RmsNormArgs& a);
void rope(const RopeArgs& a);
void kv_write(const KvWriteArgs& a);
void attention(const AttentionArgs& a);
void gelu_mul(const GeluMulArgs& a);
void add(const AddArgs& a);
void scale(const ScaleArgs& a);
void softcap(const SoftcapArgs& a);
void argmax(const ArgmaxArgs& a);
void moe_route(const MoeRouteArgs& a);
void moe_experts(const MoeExpertsArgs& a);

// gelu with the tanh approximation (hidden_activation = gelu_pytorch_tanh).
float gelu_tanh(float x);

}  // namespace tandem::ref
