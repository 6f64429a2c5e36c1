// The CPU backend: host memory, inline "streams", and every op of ops.h with f32 activations, weights in
// bf16/f16/f32 converted on the fly, OpenMP threads and run-time-selected SIMD kernels (simd.h).
// Op semantics are those of ops.h and the spec sections cited there; kernels/ref is the oracle in the tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/simd.h"

namespace tandem {

struct CpuBackendOptions {
  int threads = 0;       // <= 0: OpenMP's default
  std::string isa = "";  // "avx512", "avx2", "scalar", or "" for the best this CPU supports
};

// Unsupported when options.isa names an instruction set this build or CPU lacks.
Result<std::unique_ptr<Backend>> make_cpu_backend_with(const CpuBackendOptions& options);

namespace cpu {

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, const SimdOps& simd);

  [[nodiscard]] const char* name() const override { return "cpu"; }
  [[nodiscard]] Device device() const override { return Device{}; }
  [[nodiscard]] DType activation_dtype() const override { return DType::kF32; }
  [[nodiscard]] bool supports(Op op, DType weight_dtype) const override;

  void* allocate(size_t bytes, MemKind kind) override;
  void deallocate(void* ptr, size_t bytes, MemKind kind) override;
  Status copy(void* dst, const void* src, size_t bytes, CopyKind kind, StreamId stream) override;
  Status memset_zero(void* dst, size_t bytes, StreamId stream) override;

  Result<StreamId> create_stream() override { return next_stream_++; }
  void set_stream(StreamId stream) override { stream_ = stream; }
  Status synchronize(StreamId) override { return ok_status(); }
  [[nodiscard]] StreamId current_stream() const override { return stream_; }
  Status last_error() override { return ok_status(); }

  void embedding(const EmbeddingArgs& a) override;
  void linear(const LinearArgs& a) override;
  void rms_norm(const RmsNormArgs& a) override;
  void rope(const RopeArgs& a) override;
  void kv_write(const KvWriteArgs& a) override;
  void attention(const AttentionArgs& a) override;
  void gelu_mul(const GeluMulArgs& a) override;
  void add(const AddArgs& a) override;
  void scale(const ScaleArgs& a) override;
  void softcap(const SoftcapArgs& a) override;
  void argmax(const ArgmaxArgs& a) override;
  void moe_route(const MoeRouteArgs& a) override;
  void moe_experts(const MoeExpertsArgs& a) override;

  // "cpu (avx512, 2 threads)": the kernels and thread count in use, for logs and benchmarks.
  [[nodiscard]] const std::string& summary() const { return summary_; }
  [[nodiscard]] int threads() const { return threads_; }
  [[nodiscard]] const SimdOps& simd() const { return simd_; }

 private:
  // out [n_tok, n_out] (row stride out_stride) = alpha * x @ w^T over raw pointers; threads over output rows.
  void run_linear(const LinearJob& job, int64_t n_out);

  int threads_;
  const SimdOps& simd_;
  std::string summary_;
  StreamId next_stream_ = 1;
  StreamId stream_ = kDefaultStream;
  // moe_experts working memory, grown on demand and reused across calls.
  std::vector<float> moe_x_, moe_h_, moe_y_;
  std::vector<float> pair_x_;  // x re-laid out for the paired-bf16 kernels (simd.h)
  std::vector<int32_t> moe_tok_;
  std::vector<float> moe_w_;
};

// SimdType of a float dtype (TANDEM_CHECKed).
int simd_type(DType t);

}  // namespace cpu
}  // namespace tandem
