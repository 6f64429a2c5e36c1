// Conversion of CUDA runtime and cuBLASLt error codes into tandem Status values (see cuda_check.h).
#include "backend/cuda/cuda_check.h"

#include <cstring>

#include "core/strings.h"

namespace tandem::cuda {
namespace {

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

StatusCode code_of(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation: return StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorNotSupported: return StatusCode::kUnsupported;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidConfiguration: return StatusCode::kInvalidArgument;
    default: return StatusCode::kInternal;
  }
}

StatusCode code_of(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_ALLOC_FAILED: return StatusCode::kResourceExhausted;
    case CUBLAS_STATUS_NOT_SUPPORTED:
    case CUBLAS_STATUS_ARCH_MISMATCH: return StatusCode::kUnsupported;
    case CUBLAS_STATUS_INVALID_VALUE: return StatusCode::kInvalidArgument;
    default: return StatusCode::kInternal;
  }
}

}  // namespace

Status cuda_status(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return ok_status();
  return {code_of(err), strfmt("cuda: %s at %s:%d: %s: %s", expr, base_name(file), line, cudaGetErrorName(err),
                               cudaGetErrorString(err))};
}

Status cublas_status(cublasStatus_t st, const char* expr, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return ok_status();
  return {code_of(st), strfmt("cublasLt: %s at %s:%d: %s: %s", expr, base_name(file), line,
                              cublasLtGetStatusName(st), cublasLtGetStatusString(st))};
}

}  // namespace tandem::cuda
