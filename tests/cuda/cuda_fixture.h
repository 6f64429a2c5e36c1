// Shared pieces of the CUDA tests: one CudaBackend for the whole binary (every test skips when the machine has
// no GPU, and fails when it has one the backend cannot use), DeviceTensor (a kernels/host_tensor.h HostTensor
// mirrored in device memory), and the comparison against the reference kernels with per-dtype tolerances.
#pragma once

#include <cstdint>
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "kernels/host_tensor.h"

namespace tandem::testing {

// Fixture: be() is the shared backend on its default stream, with no error pending at the start; TearDown
// synchronises and expects no error left behind.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  cuda::CudaBackend& be() { return *be_; }

 private:
  cuda::CudaBackend* be_ = nullptr;
};

// A host tensor and its device copy (same dtype, shape and bytes). Copies run on the backend's current stream
// and wait for it, so tests read results in order with the ops.
class DeviceTensor {
 public:
  DeviceTensor(cuda::CudaBackend& be, DType dtype, std::initializer_list<int64_t> shape);

  [[nodiscard]] HostTensor& host() { return host_; }
  [[nodiscard]] const HostTensor& host() const { return host_; }
  [[nodiscard]] const Tensor& t() const { return dev_; }
  operator const Tensor&() const { return dev_; }  // NOLINT(implicit): pass as an op argument

  void upload();
  void download();
  // NaN (i32: INT32_MIN) on host and device, so elements an op does not write are detected.
  void poison();

 private:
  cuda::CudaBackend* be_;
  HostTensor host_;
  Buffer buf_;
  Tensor dev_;
};

// Tolerances of got (downloaded) vs want (reference), by output dtype:
//  - bf16 outputs: normwise ||got - want|| / ||want|| <= 1e-2. bf16 keeps 8 significant bits, so rounding the
//    output alone costs up to 2^-8 ~ 3.9e-3 per element (~2e-3 normwise), and the HF-style rounded
//    intermediates of rope, softcap and gelu_mul add one or two more such roundings. 1e-2 leaves headroom over
//    that while a wrong index, scale or missing term gives errors of order 1.
//  - f32 outputs: 1e-5 for elementwise ops, norms and rope (f32 vs double evaluation only); 1e-3 for linear,
//    whose products are exact but whose sums differ in order and, on tensor cores, are not rounded to nearest
//    (errors of ~K/16 f32 ulps of the partial sums are possible).
//  Each element must also satisfy |got - want| <= rtol |want| + atol rms(want) (bf16: 4 roundings 2^-6 and
//  2e-2, for cancellation in rope's sums; f32: 10x the normwise bound and 1e-5, linear 1e-3), so a single wrong
//  element cannot hide in a large norm, and no element may be NaN (outputs are poisoned before each op).
struct Tolerance {
  double rel_l2, rtol, atol_rms;
};
Tolerance tolerance_for(DType out, bool is_linear = false);
void expect_close(const HostTensor& got, const HostTensor& want, const Tolerance& tol);

// Fills a float tensor with uniform values in [-1, 1) (rounded to its dtype).
void fill_random(HostTensor& t, uint32_t seed);

// Whether two host tensors hold the same bytes (bit-identical results of a fused kernel and its composite).
bool same_bits(const HostTensor& a, const HostTensor& b);

// One linear() shape and the path it must take with the GEMV switched off.
struct LinearCase {
  int64_t n_in, n_out;
  DType x, w, out;
  cuda::LinearPath path;
};
// Runs one linear on random data from `seed` against ref::linear, with the GEMV on (kOn: it must take every bf16
// product of 1..9 rows with K % 8 == 0) or off (c.path); `accumulate` pre-fills out with random values and halves
// alpha.
void check_linear(cuda::CudaBackend& be, const LinearCase& c, int64_t n_tok, bool accumulate, uint32_t seed,
                  bool gemv = true);

// kAuto's per-shape timing (gemm.h) on a bf16 product [n_tok, n_in] x [n_out, n_in]^T of random data from `seed`:
// the first call times the paths and keeps one, whose output must match ref::linear; the path must be the GEMV or
// cuBLASLt (printed after `label`); three more calls must give the same bits. The mode is kAuto for the call and
// restored after.
void check_auto_linear(cuda::CudaBackend& be, int64_t n_tok, int64_t n_out, int64_t n_in, uint32_t seed,
                       const char* label);

// Sets the backend's GEMV mode (gemm.h) for its lifetime, then restores the mode it found.
struct GemvModeScope {
  GemvModeScope(cuda::CudaBackend& b, cuda::GemvMode m) : be(b), mode(b.gemv_mode()) { be.set_gemv_mode(m); }
  ~GemvModeScope() { be.set_gemv_mode(mode); }
  GemvModeScope(const GemvModeScope&) = delete;
  GemvModeScope& operator=(const GemvModeScope&) = delete;
  cuda::CudaBackend& be;
  cuda::GemvMode mode;
};

// Pins the backend's products to the GEMV for its lifetime (fused kernels reproduce the GEMV's arithmetic, so
// their tests compare against composites on it), then restores the mode.
struct GemvOn : GemvModeScope {
  explicit GemvOn(cuda::CudaBackend& b) : GemvModeScope(b, cuda::GemvMode::kOn) {}
};

}  // namespace tandem::testing
