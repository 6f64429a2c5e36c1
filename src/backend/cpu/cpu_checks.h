// Argument checks shared by the CPU backend's op files: the invariants every op relies on (host memory,
// contiguity, dtypes). A violation is a bug in the calling code, so these abort with the tensor described.
#pragma once

#include "tensor/tensor.h"

namespace tandem::cpu {

// f32 (the CPU activation dtype), contiguous, host, non-empty.
void check_act(const Tensor& t, const char* what);
// An act tensor whose rows may be strided (2-D, last dim contiguous, stride[0] >= shape[1]).
void check_act_rows(const Tensor& t, const char* what);
// f32/bf16/f16, contiguous, host, non-empty (weights, norm weights, tables).
void check_float(const Tensor& t, const char* what);
// i32, contiguous, host, non-empty.
void check_i32(const Tensor& t, const char* what);

}  // namespace tandem::cpu
