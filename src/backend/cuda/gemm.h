// linear() on the GPU (ops.h LinearArgs: out[T, N] = alpha * x[T, K] @ w[N, K]^T (+ out)). bf16 operands with
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

enum class LinearPath : uint8_t { kCublasLt, kSimple, kUnsupported };
const char* linear_path_name(LinearPath p);

class Gemm {
 public:
  // cuBLASLt workspace each stream owns (NVIDIA's recommendation for Hopper).
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  static Result<std::unique_ptr<Gemm>> create();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // The path linear(a) takes. Builds and caches the cuBLASLt plan (descriptors + heuristic algorithm) of this
  // shape on first use; a shape for which cuBLASLt offers no algorithm takes the plain kernel.
  Result<LinearPath> choose(const LinearArgs& a);
  // Enqueues the product on `stream`; `workspace` holds kWorkspaceBytes and is used by this stream only.
  Status run(const LinearArgs& a, cudaStream_t stream, void* workspace);
  [[nodiscard]] size_t plan_count() const { return plans_.size(); }

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

  explicit Gemm(cublasLtHandle_t handle) : handle_(handle) {}
  Result<const Plan*> plan(const Key& key);
  static void destroy(Plan& p);

  cublasLtHandle_t handle_;
  std::map<Key, Plan> plans_;
};

}  // namespace tandem::cuda
