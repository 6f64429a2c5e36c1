// FusedChoice: for verify sizes, whether CudaBackend runs geglu, linear_gelu_mul and linear_group as one fused GEMV
// launch or as their composite ops (each product then takes gemm.cu's timed path, cuBLASLt among them). Up to
// fused_gemv_rows() rows the fused launch always runs; above that (up to 9 rows) each shape is timed once both ways,
// outside any graph capture, and the faster is kept, since which wins depends on the shape and the GPU
// (bench/RESULTS.md run AZ: on the tensor cores the one-launch GeGLU won at 3-9 rows on E2B and lost on 26B-A4B).
#pragma once

#include <cuda_runtime_api.h>

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>

#include "backend/cuda/launch_timer.h"
#include "core/log.h"
#include "core/status.h"
#include "tensor/dtype.h"

namespace tandem::cuda {

class FusedChoice {
 public:
  enum class Op : uint8_t { kGeglu, kLinearGeluMul, kLinearGroup };
  struct Key {
    Op op;
    int64_t rows, n_in, n_out;  // n_out: all outputs of the launch (both matrices of a geglu, every group member)
    DType out;                  // the outputs' dtype (bf16 or f32), part of the shape as in gemm.h's plan key
    auto operator<=>(const Key&) const = default;
  };

  // Whether `key` was timed, and if so whether the fused launch won.
  [[nodiscard]] std::optional<bool> find(const Key& key) const {
    const auto it = picks_.find(key);
    return it == picks_.end() ? std::nullopt : std::optional<bool>(it->second);
  }
  // Times `fused` and `composite` on `stream` (each run writes the op's outputs; neither may read them), records
  // and returns whether the fused launch was faster.
  Result<bool> time(const Key& key, cudaStream_t stream, const std::function<Status()>& fused,
                    const std::function<Status()>& composite) {
    TANDEM_ASSIGN_OR_RETURN(const float fused_ms, timer_.best_ms(stream, fused));
    TANDEM_ASSIGN_OR_RETURN(const float composite_ms, timer_.best_ms(stream, composite));
    const bool win = fused_ms < composite_ms;
    picks_[key] = win;
    static constexpr const char* kOpNames[] = {"geglu", "linear_gelu_mul", "linear_group"};
    TANDEM_LOG_DEBUG("%s %lld x %lld -> %lld: one launch %.1f us, composite %.1f us -> %s",
                     kOpNames[static_cast<int>(key.op)], static_cast<long long>(key.rows),
                     static_cast<long long>(key.n_in), static_cast<long long>(key.n_out), 1e3f * fused_ms,
                     1e3f * composite_ms, win ? "one launch" : "composite");
    return win;
  }
  [[nodiscard]] size_t size() const { return picks_.size(); }

 private:
  LaunchTimer timer_;
  std::map<Key, bool> picks_;
};

}  // namespace tandem::cuda
