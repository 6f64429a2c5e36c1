// per_layer_input (ops.h PerLayerInputArgs) for 1..9 tokens as one launch: for each token (grid row y) a cluster of
// 16 blocks runs the E models' per-layer-input block, four dependent launches of the composite op (norm, gate GEMV +
// gelu_mul, projection GEMV, norm + next layer's input norm), with the cluster barrier between the steps instead of
// a kernel boundary.
//
// Every step computes as the composite's kernel does, so the results are bit-identical to it:
//  - a block has d / 8 threads, the norms' geometry (one thread per 8 elements in one pass); every block computes
//    x + norm(f) itself (a few KB from L2) with rms_norm's element math (norm_math.cuh);
//  - block b computes gate rows [16 b, 16 b + 16) as the GEMV does for rows of d / 8 chunks in one pass of d / 8
//    threads (gemv.cu: one chunk per thread, warp sums, the warps' partial sums in order, then gelu_mul's rounding);
//  - block b pushes its 16 gelu_mul outputs into every block's shared memory (distributed shared memory); after the
//    cluster barrier block b computes projection rows [b d / 16, (b + 1) d / 16), a warp per row with one 16-byte
//    chunk per lane, as the GEMV does for K = 256, and pushes them into block 0's shared memory;
//  - after a second barrier, block 0 runs the residual norm (with layer_scalar) and the next input norm.
// Pushing (remote stores) rather than pulling (remote loads) takes the remote round trips off the chain, and block 0
// needs no third barrier before it finishes alone.
// The GEMV's sums do not depend on its row count, so each token's bits are the composite's at any token count.
// Each block requests its weights (96 KB at E2B's width, 160 KB at E4B's) and the first norm's weight into
// registers, and block 0 the last two norms' weights into shared memory, before the wait for the kernel before, so
// their fetch overlaps that kernel; a verify pass's clusters read the same weights, from L2 after the first. As they
// leave, blocks 1..15 of the first cluster ask L2 for the next layer's gate and projection (the args' next_gate /
// next_proj hint), so that launch's 16 SMs, which start only as the kernel before them ends, read their 1.5-2.6 MB
// from L2 rather than from memory. Shapes it does not take (other widths, more than 9 tokens, GEMV geometries of
// another TANDEM_GEMV_FIT mode) run the composite.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <atomic>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm_math.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;

constexpr int kCluster = 16;                // blocks per cluster (a non-portable size: sm_90 allows 16)
constexpr int kPle = 256;                   // the per-layer-input width P this kernel takes (E2B, E4B)
constexpr int kGateRows = kPle / kCluster;  // gate rows per block
constexpr int kProjRows = 256 / kCluster;   // projection rows per warp: d / 16 rows over d / 256 warps
constexpr int kMaxThreads = 320;            // d <= 2560: the weights in registers leave room for no more
constexpr int kMaxTokens = 9;  // a verify pass of 8 drafts; the composite's GEMV takes up to 9 rows

struct PliParams {
  bf16* x;
  const bf16* f;
  const bf16* gate;
  const bf16* ple;  // token k's per-layer inputs at ple + k * ple_stride
  const bf16* proj;
  bf16* next_out;  // or null
  NormWeight w_ffn, w_post, w_next;
  float layer_scalar, eps;
  int64_t d, ple_stride;
  const bf16* pf_gate;  // the next layer's gate and projection, asked into L2 (or null)
  const bf16* pf_proj;
};

// Lanes [first, first + 8) of the warp hold one bf16 each (as the low bits of `bits`): all eight, packed in lane
// order, in every lane.
__device__ __forceinline__ uint4 pack_lanes8(uint32_t bits, int first) {
  uint4 packed;
  uint32_t* words = reinterpret_cast<uint32_t*>(&packed);
#pragma unroll
  for (int j = 0; j < 8; j += 2)
    words[j / 2] = __shfl_sync(0xffffffffu, bits, first + j) | (__shfl_sync(0xffffffffu, bits, first + j + 1) << 16);
  return packed;
}

__global__ void __launch_bounds__(kMaxThreads, 1) per_layer_input_kernel(PliParams p) {
  cg::cluster_group cluster = cg::this_cluster();
  // No block may touch another's shared memory before that block has started: this arrival, and its wait before the
  // first push, make sure of it without a full barrier on the chain.
  auto started = cluster.barrier_arrive();
  const int rank = static_cast<int>(cluster.block_rank());
  const int t = static_cast<int>(threadIdx.x), lane = t % kWarp, warp = t / kWarp;
  const int n_warps = static_cast<int>(blockDim.x) / kWarp;
  const int64_t d = p.d, chunks = d / 8;  // chunks == blockDim.x
  const int64_t proj_row0 = static_cast<int64_t>(rank) * (d / kCluster) + static_cast<int64_t>(warp) * kProjRows;
  const int64_t tok = blockIdx.y, row = tok * d;  // this cluster's token and its row offset

  // This block's weights, requested before the wait: chunk t of its gate rows, chunk `lane` of its warp's
  // projection rows (rows of P = 256 values are 32 chunks). Streamed past the caches for one token; kept in L2
  // when the other tokens' clusters read them too.
  const bool one_token = gridDim.y == 1;
  auto load_w = [one_token](const uint4* ptr) { return one_token ? __ldcs(ptr) : __ldg(ptr); };
  uint4 wg[kGateRows], wp[kProjRows];
#pragma unroll
  for (int r = 0; r < kGateRows; ++r)
    wg[r] = load_w(reinterpret_cast<const uint4*>(p.gate) + (rank * kGateRows + r) * chunks + t);
#pragma unroll
  for (int r = 0; r < kProjRows; ++r)
    wp[r] = load_w(reinterpret_cast<const uint4*>(p.proj) + (proj_row0 + r) * (kPle / 8) + lane);
  // The norm weights too, so no step waits for a weight after its reduction: the first norm's into registers, block
  // 0's last two (registers are short) into shared memory.
  float w_ffn[8];
  load_weight<8>(p.w_ffn, 8 * t, w_ffn, true);
  __shared__ __align__(16) float w_tail[2][kMaxThreads * 8];
  if (rank == 0) {
    float w[8];
    load_weight<8>(p.w_post, 8 * t, w, true);
    store_vec<float, 8>(&w_tail[0][8 * t], w);
    if (p.next_out != nullptr) {
      load_weight<8>(p.w_next, 8 * t, w, true);
      store_vec<float, 8>(&w_tail[1][8 * t], w);
    }
  }
  pdl_enter();
  // This block's per-layer inputs (an earlier kernel's output), requested now rather than after the gate products.
  const float ple_in = t < kGateRows ? to_f32(p.ple[tok * p.ple_stride + rank * kGateRows + t]) : 0.f;

  // 1. x1 = x + norm(f) * w_ffn (rms_norm with a residual), this thread's 8 elements, rounded as stored.
  float x1[8];
  {
    float fv[8], rv[8];
    load_vec<bf16, 8>(p.f + row + 8 * t, fv);
    load_vec<bf16, 8>(p.x + row + 8 * t, rv);
    const float inv = inv_rms_of(block_sum(add_squares<8>(fv, 0.f)), d, p.eps);
    norm_out<bf16, 8>(fv, inv, w_ffn, rv, 1.f);
#pragma unroll
    for (int j = 0; j < 8; ++j) x1[j] = round_as<bf16>(fv[j]);
  }

  // 2. The gate rows of this block: gelu(round(x1 . g_r)) * ple_r, rounded as linear then gelu_mul round. Warp 0's
  //    lanes r < 16 hold row r's output; lane b packs all 16 and pushes them into block b's copy of the gate vector,
  //    so every block reads the whole vector from its own shared memory after the cluster barrier.
  __shared__ float partial[kMaxThreads / kWarp][kGateRows];
  __shared__ __align__(16) bf16 pg[kPle];
  {
    uint4 xc;
    bf16* xe = reinterpret_cast<bf16*>(&xc);
#pragma unroll
    for (int j = 0; j < 8; ++j) xe[j] = from_f32<bf16>(x1[j]);
#pragma unroll
    for (int r = 0; r < kGateRows; ++r) {
      const float v = warp_sum(dot8_bf16(wg[r], xc, 0.f));
      if (lane == 0) partial[warp][r] = v;
    }
  }
  __syncthreads();
  cluster.barrier_wait(std::move(started));
  if (warp == 0) {
    uint32_t mine = 0;
    if (t < kGateRows) {
      float s = 0.f;
      for (int j = 0; j < n_warps; ++j) s += partial[j][t];
      const float g = round_as<bf16>(s);
      mine = __bfloat16_as_ushort(from_f32<bf16>(round_as<bf16>(gelu_tanh(g)) * ple_in));
    }
    static_assert(kGateRows == 16, "two packs of 8 gate outputs per block");
    const uint4 lo = pack_lanes8(mine, 0), hi = pack_lanes8(mine, 8);
    if (lane < kCluster) {
      uint4* dst = reinterpret_cast<uint4*>(cluster.map_shared_rank(pg, lane) + rank * kGateRows);
      dst[0] = lo;
      dst[1] = hi;
    }
  }
  cluster.sync();

  // 3. The projection rows of this warp (lane l holds the gate outputs [8 l, 8 l + 8)), pushed into block 0's copy
  //    of the projection: lane c < 2 packs rows [8 c, 8 c + 8).
  __shared__ __align__(16) bf16 o[kMaxThreads * 8];
  {
    const uint4 pc = *reinterpret_cast<const uint4*>(pg + lane * 8);
    uint32_t mine = 0;  // lane r < 16: row r, as bf16 bits
#pragma unroll
    for (int r = 0; r < kProjRows; ++r) {
      const float v = warp_sum(dot8_bf16(wp[r], pc, 0.f));
      if (lane == r) mine = __bfloat16_as_ushort(from_f32<bf16>(0.f + v));
    }
    const int first = 8 * (lane & 1);
    const uint4 oc = pack_lanes8(mine, first);
    if (lane < kProjRows / 8) *reinterpret_cast<uint4*>(cluster.map_shared_rank(o, 0) + proj_row0 + first) = oc;
  }
  cluster.sync();  // block 0 has the whole projection; no block reads another's shared memory after this

  // 4. Block 0: x = (x1 + norm(proj) * w_post) * layer_scalar and the next layer's input norm of x. The other
  //    blocks of the first cluster ask L2 for the next layer's weights of this block before they leave, off the
  //    chain: that launch's 16 SMs then read them from L2 instead of memory.
  if (rank != 0) {
    if (p.pf_gate != nullptr && blockIdx.y == 0) {
      const int64_t lines = int64_t{kPle} * d * static_cast<int64_t>(sizeof(bf16)) / 128;  // per matrix
      const int64_t stride = int64_t{kCluster - 1} * blockDim.x;
      for (int64_t l = static_cast<int64_t>(rank - 1) * blockDim.x + t; l < 2 * lines; l += stride) {
        const char* base = reinterpret_cast<const char*>(l < lines ? p.pf_gate : p.pf_proj);
        prefetch_l2(base + (l < lines ? l : l - lines) * 128);
      }
    }
    return;
  }
  float ov[8];
  load_vec<bf16, 8>(o + 8 * t, ov);
  const float inv = inv_rms_of(block_sum(add_squares<8>(ov, 0.f)), d, p.eps);
  float wv[8];
  load_vec<float, 8>(&w_tail[0][8 * t], wv);
  norm_out<bf16, 8>(ov, inv, wv, x1, p.layer_scalar);
  store_vec<bf16, 8>(p.x + row + 8 * t, ov);
  if (p.next_out == nullptr) return;
  float xv[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) xv[j] = round_as<bf16>(ov[j]);
  const float inv_next = inv_rms_of(block_sum(add_squares<8>(xv, 0.f)), d, p.eps);
  load_vec<float, 8>(&w_tail[1][8 * t], wv);
  norm_out<bf16, 8>(xv, inv_next, wv, nullptr, 1.f);
  store_vec<bf16, 8>(p.next_out + row + 8 * t, xv);
}

std::atomic<bool>& fused_flag() {
  static std::atomic<bool> on{true};
  return on;
}

std::atomic<bool>& prefetch_flag() {
  static std::atomic<bool> on{true};
  return on;
}

// How many 16-block clusters of the kernel with `threads` threads per block this GPU runs at once (0: none; asked
// once per block size and process, which serves one GPU model; sets the kernel's attribute). A launch takes one
// cluster per token; it fuses a verify pass only while its clusters need at most two thirds of that, because each
// cluster needs 16 free SMs of one GPC and would otherwise wait for the kernel before it to drain (bench/RESULTS.md
// runs AH, AI on an H100: E2B, 14 clusters at once, gained up to 9 tokens; E4B, 7, lost at 7 and 9 tokens).
int max_clusters(int threads) {
  static std::atomic<int> known[kMaxThreads / kWarp + 1] = {};  // by whole warps; 0: not asked yet, else n + 1
  const int slot = threads / kWarp;
  if (const int v = known[slot].load(std::memory_order_relaxed); v > 0) return v - 1;
  int n = 0;
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg =
      launch_config(kCluster, static_cast<unsigned>(threads), 0, nullptr, attr, cluster_attrs(attr, kCluster, false));
  if (cudaFuncSetAttribute(per_layer_input_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&n, per_layer_input_kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();  // this query's error, not a launch's
    n = 0;
  }
  known[slot].store(n + 1, std::memory_order_relaxed);
  return n;
}

}  // namespace

void set_fused_per_layer_input(bool on) { fused_flag().store(on, std::memory_order_relaxed); }
void set_per_layer_input_prefetch(bool on) { prefetch_flag().store(on, std::memory_order_relaxed); }

int per_layer_input_max_clusters(int64_t d) {
  return d % 256 == 0 && d / 8 <= kMaxThreads ? max_clusters(static_cast<int>(d / 8)) : 0;
}

bool per_layer_input_fusable(const PerLayerInputArgs& a) {
  if (!fused_flag().load(std::memory_order_relaxed)) return false;
  constexpr DType kB = DType::kBF16;
  if (a.x.ndim != 2 || a.x.rows() < 1 || a.x.rows() > kMaxTokens) return false;
  const int64_t rows = a.x.rows(), d = a.x.dim(-1);
  if (d % 256 != 0 || d / 8 > kMaxThreads) return false;
  for (const Tensor* t : {&a.x, &a.f, &a.gate, &a.proj, &a.ple})
    if (t->dtype != kB || !aligned16(t->data)) return false;
  if (!a.x.is_contiguous() || !a.f.is_contiguous() || !a.f.same_shape(a.x) || a.f.data == a.x.data) return false;
  if (a.gate.ndim != 2 || a.gate.shape[0] != kPle || a.gate.shape[1] != d || !a.gate.is_contiguous()) return false;
  if (a.proj.ndim != 2 || a.proj.shape[0] != d || a.proj.shape[1] != kPle || !a.proj.is_contiguous()) return false;
  if (a.ple.ndim != 2 || a.ple.shape[0] != rows || a.ple.shape[1] != kPle || a.ple.stride[1] != 1) return false;
  if (!plain_norm_weight(a.post_ffn_norm, d) || !plain_norm_weight(a.post_norm, d)) return false;
  if (!a.next_out.empty() &&
      (a.next_out.dtype != kB || !a.next_out.same_shape(a.x) || !a.next_out.is_contiguous() ||
       !aligned16(a.next_out.data) || a.next_out.data == a.x.data || !plain_norm_weight(a.next_norm, d)))
    return false;
  // The two products must be what linear_gelu_mul / linear compute on the GEMV: one pass of one thread per chunk.
  if (gemv_block_threads(d) != d / 8 || gemv_block_threads(kPle) != kPle / 8) return false;
  const int clusters = max_clusters(static_cast<int>(d / 8));
  return clusters > 0 && (rows == 1 || 3 * rows <= 2 * clusters);
}

Status launch_per_layer_input(const PerLayerInputArgs& a, cudaStream_t stream) {
  if (!per_layer_input_fusable(a)) return internal_error("cuda per_layer_input: arguments it does not fuse");
  PliParams p{.x = static_cast<bf16*>(a.x.data),
              .f = static_cast<const bf16*>(a.f.data),
              .gate = static_cast<const bf16*>(a.gate.data),
              .ple = static_cast<const bf16*>(a.ple.data),
              .proj = static_cast<const bf16*>(a.proj.data),
              .next_out = a.next_out.empty() ? nullptr : static_cast<bf16*>(a.next_out.data),
              .w_ffn = norm_weight(a.post_ffn_norm),
              .w_post = norm_weight(a.post_norm),
              .w_next = norm_weight(a.next_norm),
              .layer_scalar = a.layer_scalar,
              .eps = a.eps,
              .d = a.x.dim(-1),
              .ple_stride = a.ple.stride[0],
              .pf_gate = nullptr,
              .pf_proj = nullptr};
  // The next layer's weights, when given in this layer's shapes (a hint: anything else is ignored).
  if (prefetch_flag().load(std::memory_order_relaxed) && a.next_gate.same_shape(a.gate) &&
      a.next_proj.same_shape(a.proj) && a.next_gate.dtype == DType::kBF16 && a.next_proj.dtype == DType::kBF16 &&
      a.next_gate.is_contiguous() && a.next_proj.is_contiguous() && aligned16(a.next_gate.data) &&
      aligned16(a.next_proj.data)) {
    p.pf_gate = static_cast<const bf16*>(a.next_gate.data);
    p.pf_proj = static_cast<const bf16*>(a.next_proj.data);
  }
  const dim3 grid(kCluster, static_cast<unsigned>(a.x.rows()));
  TANDEM_CUDA_TRY(
      launch_clusters_pdl(per_layer_input_kernel, grid, static_cast<unsigned>(p.d / 8), 0, stream, kCluster, p));
  return ok_status();
}

}  // namespace tandem::cuda
