// Kernel tracing through CUPTI (kernel_trace.h).
#include "backend/cuda/kernel_trace.h"

#if TANDEM_HAVE_CUPTI
#include <cupti.h>

#include <cstdlib>
#include <mutex>
#include <utility>
#endif

#include "core/strings.h"

namespace tandem::cuda {

#if TANDEM_HAVE_CUPTI
namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;

struct TraceState {
  std::mutex mu;
  std::vector<KernelSpan> spans;
  bool registered = false;
  bool on = false;
};
TraceState& state() {
  static TraceState s;
  return s;
}

Status cupti_status(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return ok_status();
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  return internal_error(strfmt("CUPTI %s: %s", what, msg ? msg : "unknown error"));
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  TraceState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    CUpti_Activity* rec = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
      if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      s.spans.push_back({.start_ns = k->start,
                         .end_ns = k->end,
                         .node = k->graphNodeId,
                         .graph = k->graphId,
                         .name = k->name ? k->name : "?"});
    }
  }
  std::free(buffer);
}

}  // namespace

Status kernel_trace_begin() {
  TraceState& s = state();
  if (s.on) return invalid_argument("a kernel trace is already running");
  if (!s.registered) {
    TANDEM_TRY(cupti_status(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register"));
    s.registered = true;
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.spans.clear();
  }
  TANDEM_TRY(cupti_status(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel activity"));
  s.on = true;
  return ok_status();
}

Result<std::vector<KernelSpan>> kernel_trace_end() {
  TraceState& s = state();
  if (!s.on) return invalid_argument("no kernel trace is running");
  s.on = false;
  TANDEM_TRY(cupti_status(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "disable kernel activity"));
  TANDEM_TRY(cupti_status(cuptiActivityFlushAll(1), "flush"));
  std::lock_guard<std::mutex> lock(s.mu);
  return std::exchange(s.spans, {});
}

#else

Status kernel_trace_begin() { return unsupported("kernel tracing needs CUPTI, which this build did not find"); }
Result<std::vector<KernelSpan>> kernel_trace_end() { return unsupported("kernel tracing needs CUPTI"); }

#endif

}  // namespace tandem::cuda
