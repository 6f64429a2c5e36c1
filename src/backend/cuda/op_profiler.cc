// OpProfiler (op_profiler.h).
#include "backend/cuda/op_profiler.h"

#include <algorithm>
#include <map>
#include <utility>

#include "core/strings.h"

namespace tandem::cuda {

OpProfiler::~OpProfiler() {
  for (cudaEvent_t e : pool_) (void)cudaEventDestroy(e);
}

void OpProfiler::set_enabled(bool on) {
  enabled_ = on;
  if (on) {
    recs_.clear();
    used_ = 0;
  }
}

cudaEvent_t OpProfiler::event() {
  if (used_ == pool_.size()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    pool_.push_back(e);
  }
  return pool_[used_++];
}

int OpProfiler::begin(cudaStream_t stream) {
  if (!enabled_ || paused_) return -1;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) return -1;
  cudaEvent_t s = event(), e = event();
  if (!s || !e || cudaEventRecord(s, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  recs_.push_back({s, e, {}});
  return static_cast<int>(recs_.size() - 1);
}

void OpProfiler::end(int token, cudaStream_t stream, std::string label) {
  if (token < 0 || static_cast<size_t>(token) >= recs_.size()) return;
  Rec& r = recs_[static_cast<size_t>(token)];
  r.label = std::move(label);
  if (cudaEventRecord(r.end, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    r.label.clear();
  }
}

std::string OpProfiler::report(int forwards) {
  struct Sum {
    int calls = 0;
    double ms = 0;
  };
  std::map<std::string, Sum> by_label;
  double total = 0;
  for (const Rec& r : recs_) {
    if (r.label.empty() || cudaEventSynchronize(r.end) != cudaSuccess) continue;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, r.start, r.end) != cudaSuccess) continue;
    Sum& s = by_label[r.label];
    ++s.calls;
    s.ms += ms;
    total += ms;
  }
  (void)cudaGetLastError();
  std::vector<std::pair<std::string, Sum>> rows(by_label.begin(), by_label.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  const double f = forwards > 0 ? forwards : 1;
  std::string out = strfmt("%-58s %8s %10s %9s %6s\n", "op (per forward)", "calls", "total us", "mean us", "share");
  for (const auto& [label, s] : rows)
    out += strfmt("%-58s %8.1f %10.1f %9.2f %5.1f%%\n", label.c_str(), s.calls / f, 1e3 * s.ms / f,
                  1e3 * s.ms / s.calls, total > 0 ? 100 * s.ms / total : 0.0);
  out += strfmt("%-58s %8.1f %10.1f\n", "sum of op times", static_cast<double>(recs_.size()) / f, 1e3 * total / f);
  recs_.clear();
  used_ = 0;
  return out;
}

}  // namespace tandem::cuda
