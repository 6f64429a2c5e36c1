// Host-side launchers of the CUDA kernels, one section per op-family file (design.md §1: gemm, attention,
// norm_rope, elementwise, moe, sampling, kv). Each enqueues its work on `stream` and returns at once; the Status
// reports a dtype the kernel does not handle (kUnsupported) or a launch failure. Shapes were checked by the
// caller (cuda_backend.cc). Ops not listed here are not implemented on CUDA yet.
#pragma once

#include <cuda_runtime_api.h>

#include "backend/ops.h"
#include "core/status.h"

namespace tandem::cuda {

// norm_rope.cu
Status launch_rms_norm(const RmsNormArgs& a, cudaStream_t stream);
Status launch_rope(const RopeArgs& a, cudaStream_t stream);

// elementwise.cu
// Whether this build holds kernel code the current device can run (a clear error instead of failing launches
// when tandem was built for another architecture than the GPU's).
Status check_kernel_image();
Status launch_embedding(const EmbeddingArgs& a, cudaStream_t stream);
Status launch_add(const AddArgs& a, cudaStream_t stream);
Status launch_scale(const ScaleArgs& a, cudaStream_t stream);
Status launch_softcap(const SoftcapArgs& a, cudaStream_t stream);
Status launch_gelu_mul(const GeluMulArgs& a, cudaStream_t stream);

// sampling.cu
Status launch_argmax(const ArgmaxArgs& a, cudaStream_t stream);

// kv.cu
Status launch_kv_write(const KvWriteArgs& a, cudaStream_t stream);

// gemm.cu: the plain kernel behind linear() for what cuBLASLt cannot take (odd sizes, f32 operands);
// the cuBLASLt path lives in class Gemm (gemm.h).
Status launch_linear_simple(const LinearArgs& a, cudaStream_t stream);

}  // namespace tandem::cuda
