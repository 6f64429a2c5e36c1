// A host Backend whose activations and KV cache are bf16, running the kernels/ref ops (f32/double math, each op's
// output rounded once to bf16). It is a "bf16 engine" with no GPU: cuda_model_test runs the same model-level checks
// on it and on the CUDA backend, so the tolerances are calibrated on a second bf16 implementation and the test
// logic itself is exercised on machines without a GPU. Slow (scalar double loops): tiny fixtures only.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace tandem::testing {

std::unique_ptr<Backend> make_bf16_host_backend();

}  // namespace tandem::testing
