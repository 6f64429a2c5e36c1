// Error plumbing of the CUDA backend: every CUDA runtime and cuBLASLt call goes through a checking macro that
// turns a failure into a Status naming the call, file and line (design.md §2, "every CUDA call through a
// checking macro"). Device errors never abort: ops record them for Backend::last_error() instead.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "core/status.h"

namespace tandem::cuda {

// Ok for cudaSuccess; otherwise "cuda: <expr> at <file>:<line>: <error name>: <description>" with a code that
// says what kind of failure it is (out of memory -> kResourceExhausted, no device/driver/image -> kUnsupported).
Status cuda_status(cudaError_t err, const char* expr, const char* file, int line);
Status cublas_status(cublasStatus_t st, const char* expr, const char* file, int line);

}  // namespace tandem::cuda

// The Status of a CUDA runtime / cuBLASLt call (ok on success), for code that records rather than returns.
#define TANDEM_CUDA_STATUS(expr) ::tandem::cuda::cuda_status((expr), #expr, __FILE__, __LINE__)
#define TANDEM_CUBLAS_STATUS(expr) ::tandem::cuda::cublas_status((expr), #expr, __FILE__, __LINE__)

// Returns the failing Status from the enclosing function.
#define TANDEM_CUDA_TRY(expr)                                        \
  do {                                                               \
    ::tandem::Status tandem_cuda_status_ = TANDEM_CUDA_STATUS(expr); \
    if (!tandem_cuda_status_.ok()) return tandem_cuda_status_;       \
  } while (0)
#define TANDEM_CUBLAS_TRY(expr)                                        \
  do {                                                                 \
    ::tandem::Status tandem_cublas_status_ = TANDEM_CUBLAS_STATUS(expr); \
    if (!tandem_cublas_status_.ok()) return tandem_cublas_status_;     \
  } while (0)

// After a kernel launch: reports launch-configuration errors (bad grid, missing kernel image) at once; faults
// inside the kernel surface later, at the next synchronize().
#define TANDEM_CUDA_TRY_LAUNCH() TANDEM_CUDA_TRY(cudaGetLastError())
