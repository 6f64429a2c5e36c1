// linear() on the GPU (ops.h LinearArgs: out[T, N] = alpha * x[T, K] @ w[N, K]^T (+ out)). Decode and verify
// sizes (T <= 9, bf16) take tandem's GEMV kernel (gemv.cu) unless TANDEM_GEMV=0; other bf16 operands with
// 16-byte aligned rows go to cuBLASLt (fp32 compute, bf16 or f32 out, one cached plan per shape, a workspace per
// stream); anything else (odd K or N, f32 operands) to a plain warp-per-output kernel, so every shape works.
#pragma once

#include <cstdint>
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <memory>

#include "backend/ops.h"
#include "core/status.h"

namespace tandem::cuda {

enum class LinearPath : uint8_t { kGemv, kCublasLt, kSimple, kUnsupported };
const char* linear_path_name(LinearPath p);

class Gemm {
 public:
  // cuBLASLt workspace each stream owns (NVIDIA's recommendation for Hopper).
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  static Result<std::unique_ptr<Gemm>> create(int sm_count);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // The path linear(a) takes. Builds and caches the cuBLASLt plan (descriptors + heuristic algorithm) of this
  // shape on first use; a shape for which cuBLASLt offers no algorithm takes the plain kernel.
  Result<LinearPath> choose(const LinearArgs& a);
  // Enqueues the product on `stream`; `workspace` holds kWorkspaceBytes and is used by this stream only.
  Status run(const LinearArgs& a, cudaStream_t stream, void* workspace);
  [[nodiscard]] size_t plan_count() const { return plans_.size(); }
  // Whether decode/verify sizes take the GEMV kernel (default: on unless TANDEM_GEMV=0); tests and benches
  // compare both paths.
  void set_gemv(bool on) { gemv_ = on; }
  [[nodiscard]] bool gemv() const { return gemv_; }

 private:
  struct Key {
    int64_t n_tok, n_out, n_in;
    DType out_dtype;
    auto operator<=>(const Key&) const = default;
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t w = nullptr, x = nullptr, out = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;
  };

  Gemm(cublasLtHandle_t handle, int sm_count);
  Result<const Plan*> plan(const Key& key);
  static void destroy(Plan& p);

  cublasLtHandle_t handle_;
  int sm_count_;
  bool gemv_ = true;
  std::map<Key, Plan> plans_;
};

}  // namespace tandem::cuda
