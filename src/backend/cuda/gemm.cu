// linear() on the GPU: the cuBLASLt path (bf16 x bf16 -> bf16/f32, fp32 accumulation, TN layout) with a plan
// cache, and the plain fallback kernel for every other shape and dtype (see gemm.h). Numerics: products of bf16
// are exact in f32 and accumulate in f32 on both paths; the output is rounded once (ops.h, spec §1.13).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "core/log.h"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kWarpsPerBlock = 8;

// One warp per output column o; blockIdx.y strides over tokens. Reads w's row once per token (L2 keeps it).
template <class TW, class TX, class TO>
__global__ void linear_simple_kernel(TO* out, const TX* x, const TW* w, int64_t n_tok, int64_t n_out, int64_t n_in,
                                     float alpha, bool accumulate) {
  pdl_enter();
  const int lane = threadIdx.x % kWarp;
  const int64_t o = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (o >= n_out) return;  // the whole warp leaves together
  const TW* wr = w + o * n_in;
  for (int64_t t = blockIdx.y; t < n_tok; t += gridDim.y) {
    const TX* xr = x + t * n_in;
    float acc = 0.f;
    for (int64_t k = lane; k < n_in; k += kWarp) acc += to_f32(wr[k]) * to_f32(xr[k]);
    acc = warp_sum(acc);
    if (lane == 0) {
      float y = alpha * acc;
      if (accumulate) y += to_f32(out[t * n_out + o]);
      out[t * n_out + o] = from_f32<TO>(y);
    }
  }
}

template <class TW, class TX, class TO>
Status simple_typed(const LinearArgs& a, cudaStream_t stream) {
  const int64_t n_tok = a.x.rows(), n_out = a.w.dim(0), n_in = a.w.dim(1);
  const dim3 grid(static_cast<unsigned>((n_out + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(std::min<int64_t>(n_tok, 65535)));
  launch_kernel(linear_simple_kernel<TW, TX, TO>, grid, kWarpsPerBlock * kWarp, 0, stream, static_cast<TO*>(a.out.data),
                static_cast<const TX*>(a.x.data), static_cast<const TW*>(a.w.data), n_tok, n_out, n_in, a.alpha,
                a.accumulate);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

template <class TW, class TX>
Status simple_out(const LinearArgs& a, cudaStream_t stream) {
  return a.out.dtype == DType::kBF16 ? simple_typed<TW, TX, bf16>(a, stream) : simple_typed<TW, TX, float>(a, stream);
}

template <class TW>
Status simple_x(const LinearArgs& a, cudaStream_t stream) {
  return a.x.dtype == DType::kBF16 ? simple_out<TW, bf16>(a, stream) : simple_out<TW, float>(a, stream);
}

bool f32_or_bf16(DType t) { return t == DType::kF32 || t == DType::kBF16; }

// cuBLASLt takes bf16 operands whose rows (and pointers) are 16-byte aligned: TMA and the tensor-core kernels
// need it, and heuristics are asked for exactly that alignment.
bool cublaslt_eligible(const LinearArgs& a) {
  const int64_t n_out = a.w.dim(0), n_in = a.w.dim(1);
  if (a.w.dtype != DType::kBF16 || a.x.dtype != DType::kBF16 || !f32_or_bf16(a.out.dtype)) return false;
  if (a.x.rows() == 0 || n_out == 0 || n_in == 0) return false;
  const int64_t out_row_bytes = n_out * static_cast<int64_t>(dtype_size(a.out.dtype));
  return n_in % 8 == 0 && out_row_bytes % 16 == 0 && aligned16(a.w.data) && aligned16(a.x.data) &&
         aligned16(a.out.data);
}

}  // namespace

Status launch_linear_simple(const LinearArgs& a, cudaStream_t stream) {
  if (!f32_or_bf16(a.w.dtype) || !f32_or_bf16(a.x.dtype) || !f32_or_bf16(a.out.dtype))
    return unsupported(strfmt("cuda linear: w %s, x %s, out %s (f32/bf16 only)", dtype_name(a.w.dtype),
                              dtype_name(a.x.dtype), dtype_name(a.out.dtype)));
  if (a.x.rows() == 0 || a.w.dim(0) == 0) return ok_status();
  return a.w.dtype == DType::kBF16 ? simple_x<bf16>(a, stream) : simple_x<float>(a, stream);
}

const char* linear_path_name(LinearPath p) {
  switch (p) {
    case LinearPath::kGemv: return "gemv";
    case LinearPath::kCublasLt: return "cublaslt";
    case LinearPath::kSimple: return "simple";
    case LinearPath::kUnsupported: return "unsupported";
  }
  return "?";
}

Result<std::unique_ptr<Gemm>> Gemm::create(int sm_count) {
  cublasLtHandle_t handle = nullptr;
  TANDEM_CUBLAS_TRY(cublasLtCreate(&handle));
  return std::unique_ptr<Gemm>(new Gemm(handle, sm_count));
}

Gemm::Gemm(cublasLtHandle_t handle, int sm_count) : handle_(handle), sm_count_(sm_count) {
  const char* env = std::getenv("TANDEM_GEMV");
  if (env && std::string_view(env) == "0") gemv_mode_ = GemvMode::kOff;
  if (env && std::string_view(env) == "1") gemv_mode_ = GemvMode::kOn;
}

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) destroy(p);
  if (handle_) (void)cublasLtDestroy(handle_);
}

void Gemm::destroy(Plan& p) {
  if (p.w) (void)cublasLtMatrixLayoutDestroy(p.w);
  if (p.x) (void)cublasLtMatrixLayoutDestroy(p.x);
  if (p.out) (void)cublasLtMatrixLayoutDestroy(p.out);
  if (p.desc) (void)cublasLtMatmulDescDestroy(p.desc);
  p = Plan{};
}

Result<Gemm::Plan*> Gemm::plan(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
  Plan p;
  // Row-major out[T, N] = x[T, K] w[N, K]^T is column-major out^T[N, T] = op(W)[N, K] X[K, T] with W stored as a
  // K x N column-major matrix and transposed: the "TN" layout that cuBLASLt's tensor-core kernels prefer.
  auto build = [&]() -> Status {
    TANDEM_CUBLAS_TRY(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    TANDEM_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
    TANDEM_CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)));
    const auto n_tok = static_cast<uint64_t>(key.n_tok), n_out = static_cast<uint64_t>(key.n_out),
               n_in = static_cast<uint64_t>(key.n_in);
    const cudaDataType_t out_type = key.out_dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
    TANDEM_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.w, CUDA_R_16BF, n_in, n_out, key.n_in));
    TANDEM_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.x, CUDA_R_16BF, n_in, n_tok, key.n_in));
    TANDEM_CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p.out, out_type, n_out, n_tok, key.n_out));

    cublasLtMatmulPreference_t raw_pref = nullptr;
    TANDEM_CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&raw_pref));
    const std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, decltype(&cublasLtMatmulPreferenceDestroy)> pref(
        raw_pref, &cublasLtMatmulPreferenceDestroy);
    const uint64_t ws = kWorkspaceBytes;
    TANDEM_CUBLAS_TRY(
        cublasLtMatmulPreferenceSetAttribute(raw_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    const uint32_t align = 16;
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      TANDEM_CUBLAS_TRY(cublasLtMatmulPreferenceSetAttribute(raw_pref, attr, &align, sizeof(align)));
    }
    cublasLtMatmulHeuristicResult_t result{};
    int n_results = 0;
    const cublasStatus_t hs =
        cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.w, p.x, p.out, p.out, raw_pref, 1, &result, &n_results);
    // "Not supported" means no algorithm for this shape: the plan keeps has_algo = false and the plain kernel
    // runs instead. Anything else is a real failure.
    if (hs != CUBLAS_STATUS_NOT_SUPPORTED) TANDEM_CUBLAS_TRY(hs);
    p.has_algo = n_results > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (p.has_algo) p.algo = result.algo;
    return ok_status();
  };
  Status st = build();
  if (!st.ok()) {
    destroy(p);
    return std::move(st).with_context(strfmt("cuda linear plan T=%lld N=%lld K=%lld",
                                             static_cast<long long>(key.n_tok), static_cast<long long>(key.n_out),
                                             static_cast<long long>(key.n_in)));
  }
  return &plans_.emplace(key, p).first->second;
}

namespace {
// Every row count the GEMV kernel takes. Its instruction throughput falls behind cuBLASLt's tensor cores as rows grow
// on wide shapes, but cuBLASLt's small-T kernels are slow on narrow ones (E2B's 5-row [256 x 1536] product: 35 us),
// so the timing per shape decides.
constexpr int64_t kAutoGemvRows = 9;
// Products of fewer rows (decode) take the GEMV untimed. In a graph it requests its weights before the kernel ahead
// of it ends, which a timing in isolation cannot see: timed, E2B's one-row 12288 -> 1536 product went to cuBLASLt in
// some processes, and decode took 5% longer (bench/RESULTS.md runs BH-BI); with every one-row product on the GEMV,
// E4B, 26B-A4B and 31B decode as fast as timed (run BD).
constexpr int64_t kMinTimedRows = 2;
}  // namespace

Gemm::Key Gemm::key_of(const LinearArgs& a) { return Key{a.x.rows(), a.w.dim(0), a.w.dim(1), a.out.dtype}; }

Result<Gemm::Plan*> Gemm::plan_if_eligible(const LinearArgs& a) {
  if (!cublaslt_eligible(a)) return static_cast<Plan*>(nullptr);
  return plan(key_of(a));
}

LinearPath Gemm::path_for(const LinearArgs& a, const Plan* p) const {
  const bool gemv_ok = gemv_eligible(a);
  if (gemv_mode_ == GemvMode::kOn && gemv_ok) return LinearPath::kGemv;
  const bool auto_gemv = gemv_mode_ == GemvMode::kAuto && gemv_ok && a.x.rows() <= kAutoGemvRows;
  if (auto_gemv && a.x.rows() < kMinTimedRows) return LinearPath::kGemv;
  if (p != nullptr && p->has_algo)
    return auto_gemv && p->pick > kPickCublasLt ? LinearPath::kGemv : LinearPath::kCublasLt;
  if (auto_gemv) return LinearPath::kGemv;  // cuBLASLt cannot take it
  if (f32_or_bf16(a.w.dtype) && f32_or_bf16(a.x.dtype) && f32_or_bf16(a.out.dtype)) return LinearPath::kSimple;
  return LinearPath::kUnsupported;
}

Result<LinearPath> Gemm::choose(const LinearArgs& a) {
  TANDEM_ASSIGN_OR_RETURN(const Plan* p, plan_if_eligible(a));
  return path_for(a, p);
}

Status Gemm::run_cublaslt(const LinearArgs& a, const Plan& p, cudaStream_t stream, void* workspace) {
  const float alpha = a.alpha, beta = a.accumulate ? 1.f : 0.f;  // beta = 0: cuBLASLt never reads out
  TANDEM_CUBLAS_TRY(cublasLtMatmul(handle_, p.desc, &alpha, a.w.data, p.w, a.x.data, p.x, &beta, a.out.data,
                                   p.out, a.out.data, p.out, &p.algo, workspace, kWorkspaceBytes, stream));
  return ok_status();
}

Status Gemm::tune(const LinearArgs& a, Plan* p, cudaStream_t stream, void* workspace) {
  auto time_best = [&](auto&& launch) { return timer_.best_ms(stream, launch); };
  TANDEM_ASSIGN_OR_RETURN(const float gemv_ms, time_best([&] { return launch_gemv(a, sm_count_, stream); }));
  TANDEM_ASSIGN_OR_RETURN(const float lt_ms, time_best([&] { return run_cublaslt(a, *p, stream, workspace); }));
  p->pick = gemv_ms < lt_ms ? kPickGemv : kPickCublasLt;
  const bool tc = gemv_tc_takes(a.x.rows(), a.w.dim(1), a.w.dim(0));
  float cores_ms = -1.f;
  if (tc) {
    // The GEMV above ran on the tensor cores: the CUDA-core kernel is a third candidate (bench/RESULTS.md run AZ).
    TANDEM_ASSIGN_OR_RETURN(cores_ms, time_best([&] { return launch_gemv(a, sm_count_, stream, false); }));
    if (cores_ms < std::min(gemv_ms, lt_ms)) p->pick = kPickCudaCores;
  }
  // `tandem -v`: every timed shape and its times, to see which picks differ between processes (runs BB-BE).
  TANDEM_LOG_DEBUG("linear %lld x %lld -> %lld (%s out): %s %.1f us, cuBLASLt %.1f us%s -> %s",
                   static_cast<long long>(a.x.rows()), static_cast<long long>(a.w.dim(1)),
                   static_cast<long long>(a.w.dim(0)), dtype_name(a.out.dtype), tc ? "GEMV tensor cores" : "GEMV",
                   1e3f * gemv_ms, 1e3f * lt_ms, tc ? strfmt(", CUDA cores %.1f us", 1e3f * cores_ms).c_str() : "",
                   p->pick == kPickCublasLt ? "cuBLASLt" : (p->pick == kPickCudaCores ? "CUDA cores" : "GEMV"));
  return ok_status();
}

Status Gemm::run(const LinearArgs& a, cudaStream_t stream, void* workspace) {
  // One plan lookup per call: the timing, the path and cuBLASLt all use it.
  TANDEM_ASSIGN_OR_RETURN(Plan* const p, plan_if_eligible(a));
  // A decode shape that kAuto times, and whose pick it then follows.
  const bool timed = p != nullptr && gemv_mode_ == GemvMode::kAuto && a.x.rows() >= kMinTimedRows &&
                     a.x.rows() <= kAutoGemvRows && gemv_eligible(a);
  if (timed && !a.accumulate && p->has_algo && p->pick < 0) {
    // First use of a decode shape outside a graph capture: time the paths (the output is written either way).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TANDEM_CUDA_TRY(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusNone) TANDEM_TRY(tune(a, p, stream, workspace));
  }
  const LinearPath path = path_for(a, p);
  // A shape timed fastest on the CUDA cores stays there.
  if (path == LinearPath::kGemv) return launch_gemv(a, sm_count_, stream, !(timed && p->pick == kPickCudaCores));
  if (path != LinearPath::kCublasLt) return launch_linear_simple(a, stream);
  return run_cublaslt(a, *p, stream, workspace);
}

}  // namespace tandem::cuda
