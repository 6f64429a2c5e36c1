// OpProfiler: per-op GPU times for `tandem bench --profile`. While enabled, each op the CUDA backend enqueues
// outside a graph capture is bracketed by two CUDA events; report() waits for them and sums the elapsed times per
// label (op name, with the path and shape for products). The events are pooled; nothing is recorded when off.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

namespace tandem::cuda {

class OpProfiler {
 public:
  OpProfiler() = default;
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  void set_enabled(bool on);
  [[nodiscard]] bool enabled() const { return enabled_; }
  // While paused, begin() records nothing (the runs that time a path are not the model's ops); keeps the records.
  void set_paused(bool paused) { paused_ = paused; }
  // Records the start of an op on `stream`; -1 when disabled (end() then does nothing).
  int begin(cudaStream_t stream);
  void end(int token, cudaStream_t stream, std::string label);
  // A table of the ops recorded since enabling (per label: calls, total, mean; divided by `forwards` per forward),
  // sorted by total time; then forgets them.
  std::string report(int forwards);

 private:
  cudaEvent_t event();
  struct Rec {
    cudaEvent_t start, end;
    std::string label;
  };
  bool enabled_ = false;
  bool paused_ = false;
  std::vector<cudaEvent_t> pool_;  // all events created, reused from index used_
  size_t used_ = 0;
  std::vector<Rec> recs_;
};

}  // namespace tandem::cuda
