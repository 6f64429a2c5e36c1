// attn_out_mlp (ops.h AttnOutMlpArgs) for one token as one persistent launch: one block per SM runs the four
// dependent steps of the composite op (o product, residual norm + input norm, GeGLU products, down product), with a
// grid-wide barrier between the steps instead of a kernel boundary. The o rows are requested into registers before
// the wait for the kernel before; the gate / up rows stream through a per-thread cp.async ring in shared memory;
// when a block has done its gate / up rows, the first passes of its down rows go into the ring across the barrier.
//
// Off by default (TANDEM_FUSED_MLP=1 turns it on): it is slower than the four launches it replaces (bench/RESULTS.md
// runs AJ-AL: E2B decode 2.71 vs 1.99 ms on an H200). In-kernel timestamps showed why: a thread that requests more
// than the SM keeps in flight stalls at the request, so weights requested early delay the step that follows instead
// of overlapping it; blocks with fixed rows finish the GeGLU products up to 7 us apart, and the barrier waits for the
// last. Handing the rows out from a counter (run AL) was slower still. Overlap needs producer warps that the
// consumers do not wait behind (bulk copies), which this kernel does not have.
//
// Every step computes as the composite's kernel does, so the results are bit-identical to it (products on the
// GEMV):
//  - o and down: block b owns rows [b d / G, (b + 1) d / G) of both; a row of K values is summed by the GEMV's
//    gemv_block_threads(K) threads, chunk c by thread c mod threads in ascending c, then warp sums and the warps'
//    partial sums in order (gemv.cu);
//  - the norms: every block computes x + norm(o) and its pre-FFN norm itself (3-5 KB from L2), thread t holding
//    elements [8 t, 8 t + 8) as rms_norm_then does with d / 8 threads (norm_math.cuh), so thread t already holds the
//    chunk of xn that it multiplies in the GeGLU products (d / 8 threads, one chunk each, as the GEMV);
//  - block 0 stores x after the second barrier, when every block has read the old x.
// The barrier needs every block resident at once: the grid is one block per SM (checked with the occupancy API),
// the kernel lets the next one launch only after its last barrier, and a barrier that waits longer than two
// seconds traps (a launch error, not a hang). One counter pair serves every launch, so launches must not run
// concurrently (dense layers run on one stream).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm_math.cuh"
#include "backend/cuda/warp_mma.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kMaxThreads = 320;  // d / 8 for d <= 2560; the GEMV's one-pass blocks take at most 320 threads
constexpr int kMaxWarps = kMaxThreads / kWarp;
constexpr int kMaxRows = 24;     // o and down rows per block
constexpr int kMaxFfRows = 128;  // gate / up rows per block
constexpr int kStages = 4;       // gate / up steps in the shared-memory ring (three in flight)
constexpr int kMaxRps = 8;       // gate / up rows per step
constexpr unsigned long long kBarrierTimeoutNs = 2'000'000'000ull;

// The grid barrier's arrival count and generation (zero when the module loads; the count returns to zero at every
// barrier).
__device__ unsigned g_barrier[2];

struct MlpParams {
  const bf16* attn;
  const bf16* o_proj;
  bf16* o;
  bf16* x;
  NormWeight w_post, w_pre;
  const bf16* gate;
  const bf16* up;
  bf16* g;
  const bf16* down;
  bf16* f;
  int d, k_o, ff;
  int thr_o, thr_down;  // the GEMV's threads for rows of k_o and ff values (d / 8 for the norms and gate / up)
  int pref;             // passes of the down rows held in shared memory
  int rows_alloc;       // down rows per block in the shared-memory layout
  int rps;              // gate / up rows per ring step
  float eps;
};

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every block of the grid arrives before any leaves; writes before it are visible after it (read them with ld.cg).
__device__ void grid_barrier() {
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* count = &g_barrier[0];
    unsigned* gen = &g_barrier[1];
    const unsigned g0 = ld_acquire(gen);
    __threadfence();
    if (atomicAdd(count, 1u) == gridDim.x - 1) {
      atomicExch(count, 0u);
      __threadfence();
      atomicAdd(gen, 1u);
    } else {
      const unsigned long long start = global_ns();
      while (ld_acquire(gen) == g0)
        if (global_ns() - start > kBarrierTimeoutNs) __trap();
    }
    __threadfence();
  }
  __syncthreads();
}

using PartialSums = float[kMaxWarps][2 * kMaxFfRows];  // per-warp partial sums of one step's rows

// The GEMV's epilogue for this block's rows (gemv.cu): each warp's sum of acc[r], then row r's sum over the warps of
// `threads` in order, rounded into out[r]. Threads past `threads` hold no products but must call (block barrier).
__device__ __forceinline__ void store_row_sums(const float (&acc)[kMaxRows], int n_rows, int threads, PartialSums& part,
                                               bf16* out) {
  const int t = static_cast<int>(threadIdx.x), lane = t % kWarp, warp = t / kWarp;
  if (t < threads) {
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      if (r < n_rows) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) part[warp][r] = v;
      }
    }
  }
  __syncthreads();
  if (t < n_rows) {
    float s = 0.f;
    for (int j = 0; j < threads / kWarp; ++j) s += part[j][t];
    out[t] = from_f32<bf16>(s);
  }
}

__global__ void __launch_bounds__(kMaxThreads, 1) attn_out_mlp_kernel(MlpParams p) {
  // Shared memory: first a ring of kStages steps of gate / up chunks, [stage][row][matrix][thr_n]; after the GeGLU
  // products, the first `pref` passes of the down rows, [pass][rows_alloc][thr_down]. Thread t copies the chunks it
  // will multiply itself, so it reads them after its own cp.async.wait_group, with no barrier.
  extern __shared__ uint4 smem[];
  __shared__ PartialSums part;
  const int t = static_cast<int>(threadIdx.x), lane = t % kWarp, warp = t / kWarp;
  const int nb = static_cast<int>(gridDim.x), b = static_cast<int>(blockIdx.x);
  const int d = p.d, thr_n = d / 8, rps = p.rps;
  const int64_t chunks_o = p.k_o / 8, chunks_d = d / 8, chunks_f = p.ff / 8;
  const int r0 = b * d / nb, n_rows = (b + 1) * d / nb - r0;  // this block's o and down rows
  const int f0 = static_cast<int>(static_cast<int64_t>(b) * p.ff / nb);
  const int n_ff = static_cast<int>(static_cast<int64_t>(b + 1) * p.ff / nb) - f0;  // its gate / up rows
  const int n_steps = (n_ff + rps - 1) / rps;
  const uint4* w_o = reinterpret_cast<const uint4*>(p.o_proj);
  const uint4* w_g = reinterpret_cast<const uint4*>(p.gate) + t;
  const uint4* w_u = reinterpret_cast<const uint4*>(p.up) + t;
  const uint4* w_dn = reinterpret_cast<const uint4*>(p.down);
  auto ring = [&](int step, int i, int m) -> uint4* {
    return &smem[(((step % kStages) * rps + i) * 2 + m) * thr_n + t];
  };
  // Step k's gate / up chunks into the ring (a commit in every thread and call keeps the group counts uniform).
  auto issue = [&](int k) {
    if (k < n_steps && t < thr_n) {
      for (int i = 0; i < rps; ++i) {
        const int row = k * rps + i;
        if (row < n_ff) {
          cp_async16(ring(k, i, 0), w_g + (f0 + row) * chunks_d, true);
          cp_async16(ring(k, i, 1), w_u + (f0 + row) * chunks_d, true);
        }
      }
    }
    cp_async_commit();
  };

  // 1. Before the wait: chunk t of this block's o rows into registers and the first kStages - 1 steps of its gate /
  //    up rows into the ring.
  uint4 wo[kMaxRows];
#pragma unroll
  for (int r = 0; r < kMaxRows; ++r)
    wo[r] = t < p.thr_o && r < n_rows ? __ldcs(w_o + (r0 + r) * chunks_o + t) : make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int k = 0; k < kStages - 1; ++k) issue(k);
  pdl_wait();

  // 2. o rows: one chunk of attn per thread (rows of k_o values in one GEMV pass).
  {
    float acc[kMaxRows] = {};
    if (t < p.thr_o) {
      const uint4 xa = __ldg(reinterpret_cast<const uint4*>(p.attn) + t);
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r) acc[r] = dot8_bf16(wo[r], xa, 0.f);
    }
    store_row_sums(acc, n_rows, p.thr_o, part, p.o + r0);
  }
  grid_barrier();

  // 3. Every block: x1 = x + norm(o) * w_post and xn = norm(x1) * w_pre, thread t < d / 8 holding elements
  //    [8 t, 8 t + 8) (threads past d / 8 add to no sum: block_sum reads d / 32 warps).
  float x1[8] = {}, xn[8] = {};
  {
    float ov[8] = {}, wv[8] = {}, rv[8] = {};
    if (t < thr_n) {
      const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(p.o) + t);  // written by other blocks: from L2
      load_vec<bf16, 8>(reinterpret_cast<const bf16*>(&raw), ov);
    }
    const float inv = inv_rms_of(block_sum(add_squares<8>(ov, 0.f), thr_n / kWarp), d, p.eps);
    if (t < thr_n) {
      load_weight<8>(p.w_post, 8 * t, wv, true);
      load_vec<bf16, 8>(p.x + 8 * t, rv);
    }
    norm_out<bf16, 8>(ov, inv, wv, rv, 1.f);
#pragma unroll
    for (int j = 0; j < 8; ++j) x1[j] = xn[j] = round_as<bf16>(ov[j]);
    const float inv2 = inv_rms_of(block_sum(add_squares<8>(x1, 0.f), thr_n / kWarp), d, p.eps);
    if (t < thr_n) load_weight<8>(p.w_pre, 8 * t, wv, true);
    norm_out<bf16, 8>(xn, inv2, wv, nullptr, 1.f);
  }

  // 4. Gate and up rows [f0, f0 + n_ff), rps per step: thread t multiplies chunk t of each (rows of d values in one
  //    GEMV pass), kStages - 1 steps in flight.
  uint4 xc;
  {
    bf16* xe = reinterpret_cast<bf16*>(&xc);
#pragma unroll
    for (int j = 0; j < 8; ++j) xe[j] = from_f32<bf16>(xn[j]);
  }
  for (int k = 0; k < n_steps; ++k) {
    issue(k + kStages - 1);
    cp_async_wait<kStages - 1>();
    if (t < thr_n) {
      for (int i = 0; i < rps; ++i) {
        const int row = k * rps + i;
        if (row < n_ff) {
          const float vg = warp_sum(dot8_bf16(*ring(k, i, 0), xc, 0.f));
          const float vu = warp_sum(dot8_bf16(*ring(k, i, 1), xc, 0.f));
          if (lane == 0) {
            part[warp][2 * row] = vg;
            part[warp][2 * row + 1] = vu;
          }
        }
      }
    }
  }
  __syncthreads();  // the ring is free: the down rows' first passes go there, in flight across the barrier
  if (t < p.thr_down) {
    for (int pass = 0; pass < p.pref; ++pass) {
      const int64_t c = static_cast<int64_t>(pass) * p.thr_down + t;
      for (int r = 0; r < n_rows; ++r)
        cp_async16(&smem[(pass * p.rows_alloc + r) * p.thr_down + t], w_dn + (r0 + r) * chunks_f + min(c, chunks_f - 1),
                   c < chunks_f);
    }
  }
  cp_async_commit();
  if (t < n_ff) {
    float sg = 0.f, su = 0.f;
    for (int j = 0; j < thr_n / kWarp; ++j) {
      sg += part[j][2 * t];
      su += part[j][2 * t + 1];
    }
    const float gv = round_as<bf16>(sg), uv = round_as<bf16>(su);  // the two products, rounded
    p.g[f0 + t] = from_f32<bf16>(round_as<bf16>(gelu_tanh(gv)) * uv);
  }
  grid_barrier();
  pdl_trigger();  // no barrier follows: the next kernel may start launching
  if (b == 0 && t < thr_n) store_vec<bf16, 8>(p.x + 8 * t, x1);

  // 5. Down rows (the o rows' split): chunks t, t + thr_down, ... of g in ascending order, the first `pref` passes
  //    from shared memory.
  cp_async_wait<0>();
  float acc[kMaxRows] = {};
  if (t < p.thr_down) {
    const uint4* gv = reinterpret_cast<const uint4*>(p.g);
    const int passes = static_cast<int>((chunks_f + p.thr_down - 1) / p.thr_down);
    for (int pass = 0; pass < passes; ++pass) {
      const int64_t c = static_cast<int64_t>(pass) * p.thr_down + t;
      if (c >= chunks_f) break;
      const uint4 gc = __ldcg(gv + c);
      if (pass < p.pref) {
        const uint4* sw = smem + static_cast<int64_t>(pass) * p.rows_alloc * p.thr_down + t;
#pragma unroll
        for (int r = 0; r < kMaxRows; ++r)
          if (r < n_rows) acc[r] = dot8_bf16(sw[r * p.thr_down], gc, acc[r]);
      } else {
#pragma unroll
        for (int r = 0; r < kMaxRows; ++r)
          if (r < n_rows) acc[r] = dot8_bf16(__ldcs(w_dn + (r0 + r) * chunks_f + c), gc, acc[r]);
      }
    }
  }
  store_row_sums(acc, n_rows, p.thr_down, part, p.f + r0);
}

std::atomic<bool>& fused_flag() {
  static std::atomic<bool> on{false};
  return on;
}

// The device facts the launch depends on, asked once per process (one GPU model): SMs, blocks of the kernel per SM
// with the largest shared-memory request, and the dynamic shared memory a block may take (0: the kernel cannot run).
struct DeviceFit {
  int sms = 0;
  int dyn_smem = 0;
};
const DeviceFit& device_fit() {
  static const DeviceFit fit = [] {
    DeviceFit f;
    int dev = 0, optin = 0;
    cudaFuncAttributes attr{};
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaFuncGetAttributes(&attr, attn_out_mlp_kernel) != cudaSuccess) {
      (void)cudaGetLastError();
      return DeviceFit{};
    }
    const int dyn = optin - static_cast<int>(attr.sharedSizeBytes) - 1024;  // 1 KB for the runtime's own use
    int blocks = 0;
    if (dyn <= 0 ||
        cudaFuncSetAttribute(attn_out_mlp_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dyn) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, attn_out_mlp_kernel, kMaxThreads, dyn) != cudaSuccess ||
        blocks < 1) {
      (void)cudaGetLastError();
      return DeviceFit{};
    }
    f.dyn_smem = dyn;
    return f;
  }();
  return fit;
}

bool plain_bf16(const Tensor& t) { return t.dtype == DType::kBF16 && t.is_contiguous() && aligned16(t.data); }

struct Geometry {
  int thr_o = 0, thr_down = 0, threads = 0, rows_alloc = 0, pref = 0, rps = 0;
  size_t smem = 0;
};

Geometry geometry(int64_t d, int64_t k_o, int64_t ff, const DeviceFit& fit) {
  Geometry g;
  g.thr_o = gemv_block_threads(k_o);
  g.thr_down = gemv_block_threads(ff);
  g.threads = std::max({g.thr_o, g.thr_down, static_cast<int>(d / 8)});
  g.rows_alloc = static_cast<int>((d + fit.sms - 1) / fit.sms);
  const int64_t pass_bytes = static_cast<int64_t>(g.rows_alloc) * g.thr_down * 16;
  const int64_t passes = (ff / 8 + g.thr_down - 1) / g.thr_down;
  g.pref = static_cast<int>(std::min<int64_t>(passes, fit.dyn_smem / pass_bytes));
  const int64_t step_row_bytes = int64_t{kStages} * 2 * (d / 8) * 16;
  g.rps = static_cast<int>(std::min<int64_t>(kMaxRps, fit.dyn_smem / step_row_bytes));
  g.smem = static_cast<size_t>(std::max(g.pref * pass_bytes, g.rps * step_row_bytes));
  return g;
}

}  // namespace

void set_fused_attn_out_mlp(bool on) { fused_flag().store(on, std::memory_order_relaxed); }
bool fused_attn_out_mlp() { return fused_flag().load(std::memory_order_relaxed); }

bool attn_out_mlp_fusable(const AttnOutMlpArgs& a) {
  if (!fused_attn_out_mlp()) return false;
  if (a.x.ndim != 2 || a.x.rows() != 1) return false;
  const int64_t d = a.x.dim(-1), k_o = a.o_proj.ndim == 2 ? a.o_proj.dim(1) : 0,
                ff = a.gate.ndim == 2 ? a.gate.dim(0) : 0;
  if (d % 256 != 0 || d / 8 > kMaxThreads || k_o % 8 != 0 || k_o <= 0 || ff % 8 != 0 || ff <= 0) return false;
  for (const Tensor* t : {&a.attn, &a.o_proj, &a.o, &a.x, &a.gate, &a.up, &a.g, &a.down, &a.f})
    if (!plain_bf16(*t)) return false;
  if (a.attn.numel() != k_o || a.o_proj.dim(0) != d || a.o.numel() != d || a.f.numel() != d || a.g.numel() != ff ||
      a.up.ndim != 2 || a.up.dim(0) != ff || a.up.dim(1) != d || a.gate.dim(1) != d || a.down.ndim != 2 ||
      a.down.dim(0) != d || a.down.dim(1) != ff)
    return false;
  // Scratch and outputs apart from each other and from the inputs.
  const void* distinct[] = {a.attn.data, a.o.data, a.x.data, a.g.data, a.f.data};
  for (size_t i = 0; i < 5; ++i)
    for (size_t j = i + 1; j < 5; ++j)
      if (distinct[i] == distinct[j]) return false;
  if (!plain_norm_weight(a.post_attn_norm, d) || !plain_norm_weight(a.pre_ffn_norm, d)) return false;
  // The GEMV geometries the kernel reproduces: rows of d and k_o values in one pass of one thread per chunk.
  if (gemv_block_threads(d) != d / 8 || gemv_block_threads(k_o) != k_o / 8 || k_o / 8 > kMaxThreads) return false;
  const DeviceFit& fit = device_fit();
  if (fit.sms <= 0 || fit.dyn_smem <= 0) return false;
  if ((d + fit.sms - 1) / fit.sms > kMaxRows || (ff + fit.sms - 1) / fit.sms > kMaxFfRows) return false;
  const Geometry g = geometry(d, k_o, ff, fit);
  return g.thr_down <= kMaxThreads && g.threads <= kMaxThreads && g.rps >= 1;
}

Status launch_attn_out_mlp(const AttnOutMlpArgs& a, cudaStream_t stream) {
  if (!attn_out_mlp_fusable(a)) return internal_error("cuda attn_out_mlp: arguments it does not fuse");
  const DeviceFit& fit = device_fit();
  const int64_t d = a.x.dim(-1), k_o = a.o_proj.dim(1), ff = a.gate.dim(0);
  const Geometry g = geometry(d, k_o, ff, fit);
  const MlpParams p{.attn = static_cast<const bf16*>(a.attn.data),
                    .o_proj = static_cast<const bf16*>(a.o_proj.data),
                    .o = static_cast<bf16*>(a.o.data),
                    .x = static_cast<bf16*>(a.x.data),
                    .w_post = norm_weight(a.post_attn_norm),
                    .w_pre = norm_weight(a.pre_ffn_norm),
                    .gate = static_cast<const bf16*>(a.gate.data),
                    .up = static_cast<const bf16*>(a.up.data),
                    .g = static_cast<bf16*>(a.g.data),
                    .down = static_cast<const bf16*>(a.down.data),
                    .f = static_cast<bf16*>(a.f.data),
                    .d = static_cast<int>(d),
                    .k_o = static_cast<int>(k_o),
                    .ff = static_cast<int>(ff),
                    .thr_o = g.thr_o,
                    .thr_down = g.thr_down,
                    .pref = g.pref,
                    .rows_alloc = g.rows_alloc,
                    .rps = g.rps,
                    .eps = a.eps};
  launch_kernel(attn_out_mlp_kernel, dim3(static_cast<unsigned>(fit.sms)), dim3(static_cast<unsigned>(g.threads)),
                g.smem, stream, p);
  TANDEM_CUDA_TRY(cudaGetLastError());
  return ok_status();
}

}  // namespace tandem::cuda
