// Kernel tracing through CUPTI's activity API (`tandem bench --trace`): between begin and end, the device start and
// end of every kernel the process runs, with its graph and graph node ids (kernels replayed from a CUDA graph are
// recorded one by one). Available where the build found CUPTI (TANDEM_HAVE_CUPTI), else kUnsupported. CUPTI's
// activity buffers are process-wide: one trace at a time. Each record costs the device a little time; on an H100 a
// traced E2B decode replay was no slower than the untraced bench (bench/RESULTS.md run AP).
#pragma once

#include <vector>

#include "backend/kernel_timeline.h"
#include "core/status.h"

namespace tandem::cuda {

Status kernel_trace_begin();
// Stops tracing and returns the kernels recorded since kernel_trace_begin(), in no particular order.
Result<std::vector<KernelSpan>> kernel_trace_end();

}  // namespace tandem::cuda
