// linear() for decode and verify on the GPU: out[T, N] = alpha * x[T, K] @ w[N, K]^T (+ out) for T = 1..9 bf16
// rows against bf16 weights, where reading w once at full memory bandwidth is all that matters (gemm.h picks it).
// Each block owns R consecutive output rows; its threads stride together over K in 16-byte chunks, so every
// weight row streams through as coalesced reads with R independent loads in flight per thread; x (a few KB) comes
// from L1/L2. Short rows take blocks of fewer threads (K = 1536: 192; block_threads). Products accumulate in f32
// per thread, then a warp and a block reduction; the output is rounded once (ops.h, spec §1.13). The GeGLU variant
// (geglu op) streams R rows of w_gate and the same R rows of w_up together and writes gelu(round(g)) * round(u),
// rounded as linear, linear, gelu_mul would round; the linear_gelu_mul variant writes gelu(round(g)) * up with up
// read from memory, as linear then gelu_mul round.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kMaxThreads = 512;
constexpr int kMaxWarps = kMaxThreads / kWarp;
constexpr int kMaxTokens = 9;

// M = 1 weight matrix per segment (linear, linear_group), or 2 (geglu, one segment: rows of w_gate in acc[0], of
// w_up = w2 in acc[1]). up (M = 1, one segment, or null): the linear_gelu_mul epilogue, row t of up at
// up + t * up_stride.
template <int T, int R, class TO, int M, bool kEarlyW>
__global__ void __launch_bounds__(kMaxThreads)
    gemv_kernel(GemvSegs segs, const bf16* __restrict__ x, const bf16* __restrict__ w2, int64_t n_in, float alpha,
                bool accumulate, const TO* __restrict__ up, int64_t up_stride) {
  if constexpr (!kEarlyW) pdl_enter();
  __shared__ float partial[kMaxWarps][M * R * T];
  const int threads = static_cast<int>(blockDim.x), warps = threads / kWarp;
  const int si = gemv_segment(segs, blockIdx.x);
  const bf16* __restrict__ w = seg_at(segs.w, si);
  TO* __restrict__ out = static_cast<TO*>(seg_at(segs.out, si));
  const int64_t n_out = seg_at(segs.n_out, si);
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) - seg_at(segs.first_block, si)) * R;
  const int64_t chunks = n_in / 8;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  // Rows past n_out (the last block) re-read the last row instead of branching inside the loop.
  const uint4* wr[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r)
      wr[m][r] = reinterpret_cast<const uint4*>(m == 0 ? w : w2) + min(row0 + r, n_out - 1) * chunks;

  float acc[M][R][T];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) acc[m][r][t] = 0.f;

  auto accumulate_chunk = [&](const uint4(&wc)[M][R], int64_t c) {
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const uint4 xc = __ldg(xv + t * chunks + c);
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r][t] = dot8_bf16(wc[m][r], xc, acc[m][r][t]);
    }
  };
  auto load_w = [&](uint4(&wc)[M][R], int64_t c) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) wc[m][r] = __ldcs(wr[m][r] + c);  // streamed once: keep it out of L1
  };
  int64_t c = threadIdx.x;
  if constexpr (kEarlyW) {
    // The weights do not depend on the kernel just before this one, so the first chunk of every row is requested
    // before waiting for that kernel to end: the fetch overlaps its tail instead of following it (for the short
    // rows this variant serves, most of the block's weights). x and up are read only after the wait.
    uint4 wc[M][R];
    if (c < chunks) load_w(wc, c);
    pdl_enter();
    if (c < chunks) accumulate_chunk(wc, c);
    c += threads;
  }
#pragma unroll 2
  for (; c < chunks; c += threads) {
    uint4 wc[M][R];
    load_w(wc, c);
    accumulate_chunk(wc, c);
  }

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float v = warp_sum(acc[m][r][t]);
        if (lane == 0) partial[warp][(m * R + r) * T + t] = v;
      }
  __syncthreads();
  for (int i = threadIdx.x; i < R * T; i += threads) {
    const int r = i / T, t = i % T;
    const int64_t o = row0 + r;
    if (o >= n_out) continue;
    float s = 0.f, u = 0.f;
#pragma unroll
    for (int j = 0; j < warps; ++j) s += partial[j][i];
    if constexpr (M == 2) {
#pragma unroll
      for (int j = 0; j < warps; ++j) u += partial[j][R * T + i];
    }
    gemv_store<TO, M>(out + static_cast<int64_t>(t) * n_out + o, s, u, alpha, accumulate,
                      up != nullptr ? up + static_cast<int64_t>(t) * up_stride + o : nullptr);
  }
}

std::atomic<int>& fit_mode() {
  static std::atomic<int> m{1};
  return m;
}

// Threads per block for rows of `chunks` 16-byte chunks (set_gemv_fit): the whole warps that cover the row in one
// pass, for rows of at most kFitDefault chunks (mode 1, the default: K = 1536 takes 192 threads, K = 256 one warp
// instead of seven idle ones, K = 2560 320 threads instead of two passes of 256) or of at most kMaxThreads (mode
// 2). Longer rows take 256 threads in mode 0 and 2; in mode 1 their passes of at most 256 threads are shared out
// evenly (block_threads below). Measured on the H200 (bench/RESULTS.md runs R-T, W): one-pass blocks of 352 and
// 512 threads (26B-A4B's K = 2816 and 4096) and two passes of 352 (31B's K = 5376) ran slower than 256 threads;
// K = 2816 in two passes of 192 took 26B-A4B's decode from 3.25 to 3.13-3.17 ms.
// The reduction order depends on this count only, never on the rows T, so a verify pass still adds like a decode
// step.
constexpr int64_t kFitDefault = 320;
constexpr int kPassThreads = 256;  // the widest pass over rows longer than a fitted block
std::atomic<bool>& balance_flag() {
  static std::atomic<bool> on{true};
  return on;
}
int block_threads(int64_t chunks) {
  const int mode = fit_mode().load(std::memory_order_relaxed);
  const int64_t most = mode == 1 ? kFitDefault : (mode == 2 ? kMaxThreads : 0);
  auto whole_warps = [](int64_t n) {
    return static_cast<int>(std::max<int64_t>((n + kWarp - 1) / kWarp * kWarp, kWarp));
  };
  if (chunks <= most) return whole_warps(chunks);
  if (mode != 1 || !balance_flag().load(std::memory_order_relaxed)) return kPassThreads;
  // Longer rows in the default mode: the passes of at most 256 threads that they need, shared out evenly (K = 2816:
  // two passes of 192 threads instead of 256 + 96; K = 5376: three of 224 instead of 256 + 256 + 160).
  const int64_t passes = (chunks + kPassThreads - 1) / kPassThreads;
  return whole_warps((chunks + passes - 1) / passes);
}

// w2 = nullptr: linear or linear_group; else geglu with segs.w[0] = w_gate, w2 = w_up. up: the linear_gelu_mul
// epilogue (or null). allow_tc: hand the product to the tensor cores where gemv_tc_takes. Fills first_block.
template <int T, class TO, int M = 1>
Status launch_rows(GemvSegs segs, const LinearArgs& a, const void* w2, int sm_count, cudaStream_t stream,
                   const void* up = nullptr, int64_t up_stride = 0, bool allow_tc = true) {
  const int64_t n_in = a.w.dim(1);
  int64_t n_out = 0;
  for (int i = 0; i < segs.n; ++i) n_out += segs.n_out[i];
  // Most rows per block (fewest re-reads of x) that still gives every SM a few blocks; fewer when T is large,
  // to bound the M x R x T accumulators.
  constexpr int kMaxR = (T <= 2 ? 8 : (T <= 4 ? 4 : 2)) / M;
  if (T >= 2 && allow_tc && gemv_tc_takes(T, n_in, n_out)) {
    return launch_gemv_tc(segs, T, n_in, std::is_same_v<TO, bf16>, a.x.data, w2, a.alpha, a.accumulate, up, up_stride,
                          weight_prefetch() && !a.w_fresh, sm_count, stream);
  }
  auto go = [&](auto r_tag) -> Status {
    constexpr int R = decltype(r_tag)::value;
    int64_t blocks = 0;
    for (int i = 0; i < segs.n; ++i) {
      segs.first_block[i] = blocks;
      blocks += (segs.n_out[i] + R - 1) / R;
    }
    // Products over rows of at most 2048 chunks (K <= 16384) request their first pass of weights before the PDL wait
    // (kEarlyW), for up to gemv_early_rows() rows. Rows of up to 2048 chunks gained over the earlier limit of 512
    // (bench/RESULTS.md run AR: the E models' down products, K = 10240 and 12288); 31B's down product (K = 21504)
    // does not take it.
    const int threads = block_threads(n_in / 8);
    const bool early = T <= gemv_early_rows() && weight_prefetch() && !a.w_fresh && n_in / 8 <= 2048;
    auto* kernel = early ? gemv_kernel<T, R, TO, M, true> : gemv_kernel<T, R, TO, M, false>;
    launch_kernel(kernel, static_cast<unsigned>(blocks), threads, 0, stream, segs, static_cast<const bf16*>(a.x.data),
                  static_cast<const bf16*>(w2), n_in, a.alpha, a.accumulate, static_cast<const TO*>(up), up_stride);
    TANDEM_CUDA_TRY_LAUNCH();
    return ok_status();
  };
  const int64_t want_blocks = 4 * static_cast<int64_t>(sm_count > 0 ? sm_count : 132);
  if (kMaxR >= 8 && n_out / 8 >= want_blocks) return go(std::integral_constant<int, kMaxR>{});
  if (kMaxR >= 4 && n_out / 4 >= want_blocks) return go(std::integral_constant<int, (kMaxR >= 4 ? 4 : kMaxR)>{});
  if (kMaxR >= 2 && n_out / 2 >= want_blocks) return go(std::integral_constant<int, 2>{});
  return go(std::integral_constant<int, 1>{});
}

// Segments for n products (first_block is filled at launch).
GemvSegs make_segs(const Tensor* out, const Tensor* w, int n) {
  GemvSegs segs{};
  for (int i = 0; i < n; ++i) {
    segs.w[i] = static_cast<const bf16*>(w[i].data);
    segs.out[i] = out[i].data;
    segs.n_out[i] = w[i].dim(0);
  }
  segs.n = n;
  return segs;
}

GemvSegs one_segment(const LinearArgs& a) { return make_segs(&a.out, &a.w, 1); }

// f(integral_constant<int, T>) for T = rows (1..kMaxTokens).
template <class F>
Status with_rows(int64_t rows, F&& f) {
  switch (rows) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 9:
      return f(std::integral_constant<int, 9>{});
    default: break;
  }
  return internal_error(strfmt("cuda gemv: %lld rows", static_cast<long long>(rows)));
}

template <class TO>
Status launch_tokens(const GemvSegs& segs, const LinearArgs& a, int sm_count, cudaStream_t stream,
                     bool allow_tc = true) {
  return with_rows(a.x.rows(), [&](auto t) {
    return launch_rows<decltype(t)::value, TO>(segs, a, nullptr, sm_count, stream, nullptr, 0, allow_tc);
  });
}

std::atomic<bool>& weight_prefetch_flag() {
  static std::atomic<bool> on{true};
  return on;
}

std::atomic<int>& early_rows() {
  static std::atomic<int> rows{kMaxTokens};
  return rows;
}

}  // namespace

void set_weight_prefetch(bool on) { weight_prefetch_flag().store(on, std::memory_order_relaxed); }
void set_gemv_fit(int mode) { fit_mode().store(mode, std::memory_order_relaxed); }
void set_gemv_balance(bool on) { balance_flag().store(on, std::memory_order_relaxed); }
bool gemv_balance() { return balance_flag().load(std::memory_order_relaxed); }
bool weight_prefetch() { return weight_prefetch_flag().load(std::memory_order_relaxed); }
void set_gemv_early_rows(int rows) { early_rows().store(std::clamp(rows, 1, kMaxTokens), std::memory_order_relaxed); }
int gemv_early_rows() { return early_rows().load(std::memory_order_relaxed); }
int gemv_block_threads(int64_t n_in) { return block_threads(n_in / 8); }

bool gemv_eligible(const LinearArgs& a) {
  const int64_t rows = a.x.rows();
  return a.w.dtype == DType::kBF16 && a.x.dtype == DType::kBF16 &&
         (a.out.dtype == DType::kBF16 || a.out.dtype == DType::kF32) && rows >= 1 && rows <= kMaxTokens &&
         a.w.dim(0) > 0 && a.w.dim(1) >= 8 && a.w.dim(1) % 8 == 0 && aligned16(a.w.data) && aligned16(a.x.data);
}

Status launch_gemv(const LinearArgs& a, int sm_count, cudaStream_t stream, bool allow_tc) {
  if (!gemv_eligible(a)) return internal_error("cuda gemv: arguments it does not take");
  return a.out.dtype == DType::kBF16 ? launch_tokens<bf16>(one_segment(a), a, sm_count, stream, allow_tc)
                                     : launch_tokens<float>(one_segment(a), a, sm_count, stream, allow_tc);
}

bool gemv_group_eligible(const LinearGroupArgs& a, int max_rows) {
  if (a.n < 1 || a.n > kMaxLinearGroup || a.x.rows() > max_rows || !a.x.is_contiguous()) return false;
  for (int i = 0; i < a.n; ++i) {
    const LinearArgs li{.out = a.out[i], .x = a.x, .w = a.w[i]};
    if (!gemv_eligible(li) || a.out[i].dtype != a.out[0].dtype || a.w[i].dim(1) != a.w[0].dim(1)) return false;
  }
  return true;
}

Status launch_gemv_group(const LinearGroupArgs& a, int sm_count, cudaStream_t stream) {
  if (!gemv_group_eligible(a, kMaxTokens)) return internal_error("cuda gemv group: arguments it does not take");
  const GemvSegs segs = make_segs(a.out, a.w, a.n);
  const LinearArgs first{.out = a.out[0], .x = a.x, .w = a.w[0]};
  return a.out[0].dtype == DType::kBF16 ? launch_tokens<bf16>(segs, first, sm_count, stream)
                                        : launch_tokens<float>(segs, first, sm_count, stream);
}

bool geglu_gemv_eligible(const GegluArgs& a, int max_rows) {
  const LinearArgs g{.out = a.out, .x = a.x, .w = a.w_gate};
  return a.x.rows() <= max_rows && a.out.dtype == a.x.dtype && gemv_eligible(g) && a.w_up.dtype == DType::kBF16 &&
         a.w_up.ndim == 2 && a.w_up.shape[0] == a.w_gate.shape[0] && a.w_up.shape[1] == a.w_gate.shape[1] &&
         aligned16(a.w_up.data);
}

Status launch_geglu_gemv(const GegluArgs& a, int sm_count, cudaStream_t stream) {
  if (!geglu_gemv_eligible(a, kMaxTokens)) return internal_error("cuda geglu gemv: arguments it does not take");
  const LinearArgs g{.out = a.out, .x = a.x, .w = a.w_gate};
  return with_rows(a.x.rows(), [&](auto t) {
    return launch_rows<decltype(t)::value, bf16, 2>(one_segment(g), g, a.w_up.data, sm_count, stream);
  });
}

bool linear_gelu_mul_gemv_eligible(const LinearGeluMulArgs& a, int max_rows) {
  const LinearArgs g{.out = a.out, .x = a.x, .w = a.w};
  return a.x.rows() <= max_rows && gemv_eligible(g) && a.out.dtype == a.up.dtype && a.out.is_contiguous() &&
         a.up.ndim == 2 && a.up.shape[0] == a.x.rows() && a.up.shape[1] == a.w.dim(0) && a.up.stride[1] == 1 &&
         a.up.stride[0] >= a.up.shape[1] && a.up.data != a.out.data;
}

Status launch_linear_gelu_mul_gemv(const LinearGeluMulArgs& a, int sm_count, cudaStream_t stream) {
  if (!linear_gelu_mul_gemv_eligible(a, kMaxTokens))
    return internal_error("cuda linear_gelu_mul gemv: arguments it does not take");
  const LinearArgs g{.out = a.out, .x = a.x, .w = a.w};
  const int64_t stride = a.up.stride[0];
  return with_rows(a.x.rows(), [&](auto t) {
    constexpr int T = decltype(t)::value;
    return a.out.dtype == DType::kBF16
               ? launch_rows<T, bf16>(one_segment(g), g, nullptr, sm_count, stream, a.up.data, stride)
               : launch_rows<T, float>(one_segment(g), g, nullptr, sm_count, stream, a.up.data, stride);
  });
}

}  // namespace tandem::cuda
