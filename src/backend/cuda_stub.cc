// make_cuda_backend for builds without CUDA (TANDEM_HAVE_CUDA off): always an unsupported Status, so a user who
// asks for a GPU gets a clear error. Builds with CUDA link src/backend/cuda's real implementation instead.
#include "backend/backend.h"
#include "core/strings.h"

namespace tandem {

Result<std::unique_ptr<Backend>> make_cuda_backend(int index) {
  return unsupported(strfmt("cuda:%d requested, but this tandem was built without CUDA (rebuild with nvcc "
                            "available and -DTANDEM_CUDA=ON)",
                            index));
}

}  // namespace tandem
