// linear() on the GPU (ops.h LinearArgs: out[T, N] = alpha * x[T, K] @ w[N, K]^T (+ out)). One bf16 row (decode)
// takes tandem's GEMV kernel (gemv.cu); for 2-9 rows (verify) each shape is timed once on the GEMV (where its
// tensor-core kernel takes the shape, on the CUDA cores too) and on cuBLASLt, outside any graph capture, and the
// fastest is kept (TANDEM_GEMV=1 forces the GEMV, =0 turns it off); other bf16 operands with 16-byte aligned rows go
// to cuBLASLt (fp32 compute, bf16 or f32 out, one cached plan per shape, a workspace per stream); anything else (odd
// K or N, f32 operands) to a plain warp-per-output kernel, so every shape works.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "backend/cuda/launch_timer.h"
#include "backend/ops.h"
#include "core/status.h"

namespace tandem::cuda {

enum class LinearPath : uint8_t { kGemv, kCublasLt, kSimple, kUnsupported };
enum class GemvMode : uint8_t { kAuto, kOn, kOff };
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
  // Whether decode/verify sizes take the GEMV kernel: timed per shape (kAuto, the default), always where it
  // applies (kOn) or never (kOff). Tests and benches pin the path.
  void set_gemv_mode(GemvMode m) { gemv_mode_ = m; }
  [[nodiscard]] GemvMode gemv_mode() const { return gemv_mode_; }

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
    // kAuto: -1 not timed yet, else the fastest here: kPickCublasLt, kPickGemv (on the tensor cores where
    // gemv_tc_takes) or kPickCudaCores (the GEMV on the CUDA cores, which beat the tensor cores that would take it).
    int8_t pick = -1;
  };

  static constexpr int8_t kPickCublasLt = 0, kPickGemv = 1, kPickCudaCores = 2;

  Gemm(cublasLtHandle_t handle, int sm_count);
  static Key key_of(const LinearArgs& a);
  Result<Plan*> plan(const Key& key);
  // The plan of a's shape (built on first use), or nullptr where cuBLASLt cannot take a.
  Result<Plan*> plan_if_eligible(const LinearArgs& a);
  // The path for `a` given plan_if_eligible's result.
  LinearPath path_for(const LinearArgs& a, const Plan* p) const;
  // Times the paths on `a` (which must not accumulate): cuBLASLt and the GEMV, and where the tensor cores take the
  // GEMV, also the GEMV on the CUDA cores; records the fastest in `p`.
  Status tune(const LinearArgs& a, Plan* p, cudaStream_t stream, void* workspace);
  Status run_cublaslt(const LinearArgs& a, const Plan& p, cudaStream_t stream, void* workspace);
  static void destroy(Plan& p);

  cublasLtHandle_t handle_;
  int sm_count_;
  GemvMode gemv_mode_ = GemvMode::kAuto;
  LaunchTimer timer_;
  std::map<Key, Plan> plans_;
};

}  // namespace tandem::cuda
