// LaunchTimer: times work enqueued on one stream with a pair of CUDA events, for the choices made by timing the
// first use of a shape (gemm.cu: GEMV, tensor cores or cuBLASLt; fused_choice.h: one fused launch or the composite
// ops). Each call runs the work five times: two warm-ups, then the best of three. Never inside a graph capture.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "core/status.h"

namespace tandem::cuda {

class LaunchTimer {
 public:
  LaunchTimer() = default;
  ~LaunchTimer() {
    for (cudaEvent_t e : ev_)
      if (e) (void)cudaEventDestroy(e);
  }
  LaunchTimer(const LaunchTimer&) = delete;
  LaunchTimer& operator=(const LaunchTimer&) = delete;

  // The fastest of three timed runs of `launch` (a callable returning Status) on `stream`, in ms.
  template <class F>
  Result<float> best_ms(cudaStream_t stream, F&& launch) {
    for (cudaEvent_t& e : ev_)
      if (!e) TANDEM_CUDA_TRY(cudaEventCreate(&e));
    float best = 1e30f;
    for (int i = 0; i < 5; ++i) {
      TANDEM_CUDA_TRY(cudaEventRecord(ev_[0], stream));
      TANDEM_TRY(launch());
      TANDEM_CUDA_TRY(cudaEventRecord(ev_[1], stream));
      TANDEM_CUDA_TRY(cudaEventSynchronize(ev_[1]));
      float ms = 0;
      TANDEM_CUDA_TRY(cudaEventElapsedTime(&ms, ev_[0], ev_[1]));
      if (i >= 2) best = std::min(best, ms);
    }
    return best;
  }

 private:
  cudaEvent_t ev_[2] = {nullptr, nullptr};
};

}  // namespace tandem::cuda
