// Verify-pass products on the tensor cores: out[T, N] = alpha * x[T, K] @ w[N, K]^T for T = 2..9 bf16 rows. The
// CUDA-core GEMV (gemv.cu) loses to cuBLASLt past two rows (bench/RESULTS.md run I), and cuBLASLt's kernels cannot
// fuse the GeGLU and do not start before the kernel ahead of them ends (run AY). Here a warp owns 16 weight rows and
// a share of K: per step each lane loads one 16-byte chunk of rows g and g + 8 (g = lane / 4) at chunk lane % 4 and
// the same chunk of x for token g, and two mma.sync m16n8k16 take them as they are. The k order inside a step is a
// permutation of the weights' (the A and B fragments use the same one), so no shuffle or shared memory is needed,
// and every load is a coalesced 16-byte read. Tokens 8..15 (T = 9) take a second n tile. The warps' f32 sums meet in
// shared memory and are added in warp order, then stored with gemv.cu's epilogues (gemv_common.cuh). Off by default
// (kernels.h set_gemv_tc; run AZ).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/warp_mma.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;
constexpr int kRows = 16;     // weight rows per block (the mma's M)
constexpr int kStep = 32;     // K values per warp step: 4 lanes x 8 values
constexpr int kMaxWarps = 8;  // K shares per block
constexpr int kMaxThreads = kMaxWarps * kWarp;
constexpr int kUnroll = 4;     // steps whose loads are in flight together
constexpr int kMinTcRows = 2;  // the fewest rows it can take (one token keeps the CUDA-core early-weight GEMV)
constexpr int kMaxTcRows = 9;
// The fewest rows it takes by default: at two rows the CUDA cores were faster on every architecture (bench/RESULTS.md
// runs AZ and BA).
constexpr int kDefaultMinRows = 3;
constexpr int64_t kMinElems = int64_t{1} << 21;  // fewer weights keep the CUDA cores (kernels.h gemv_tc_takes)

constexpr int kMaxCluster = 8;  // blocks that share a strip's K (portable cluster size)

// Warps per block for a share of `steps` steps: each takes at least two rounds of kUnroll steps, at most kMaxWarps.
int tc_warps(int64_t steps) { return static_cast<int>(std::clamp<int64_t>(steps / (2 * kUnroll), 1, kMaxWarps)); }

// Blocks per 16-row strip: one while the strips give every SM two blocks; fewer strips (E2B's o and down products:
// 1536 rows, 96 strips) split K over a cluster of blocks, so that all SMs stream, each block keeping at least two
// rounds of steps.
int tc_cluster(int64_t strips, int64_t steps, int sm_count) {
  const int64_t want = 2 * static_cast<int64_t>(sm_count > 0 ? sm_count : 132);
  const int64_t cs = std::min<int64_t>({(want + strips - 1) / strips, steps / (2 * kUnroll), kMaxCluster});
  return static_cast<int>(std::max<int64_t>(cs, 1));
}

// NT n tiles of 8 tokens; M = 2: geglu (w_gate = segment 0's w, w_up = w2). early: the first round of weights is
// requested before the PDL wait (they do not depend on the kernel before). cs: blocks per strip, launched as a
// cluster of cs blocks (1: a plain launch); block rank r sums share r of K, and rank 0 adds the blocks' sums in rank
// order through distributed shared memory.
template <int NT, class TO, int M>
__global__ void __launch_bounds__(kMaxThreads)
    gemv_tc_kernel(GemvSegs segs, const bf16* __restrict__ x, const bf16* __restrict__ w2, int n_tok, int64_t n_in,
                   float alpha, bool accumulate, const TO* __restrict__ up, int64_t up_stride, bool early, int cs) {
  __shared__ float partial[kMaxWarps][M][NT][4][kWarp];
  __shared__ float block_sums[M][kRows * kMaxTcRows];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int g = lane / 4, q = lane % 4;
  const int64_t strip = blockIdx.x / cs;
  const int rank = static_cast<int>(blockIdx.x % cs);
  const int si = gemv_segment(segs, strip);
  const bf16* __restrict__ w = seg_at(segs.w, si);
  TO* __restrict__ out = static_cast<TO*>(seg_at(segs.out, si));
  const int64_t n_out = seg_at(segs.n_out, si);
  const int64_t row0 = (strip - seg_at(segs.first_block, si)) * kRows;
  const int64_t chunks = n_in / 8, steps = n_in / kStep;
  // Rows past n_out (the last block) re-read the last row; their sums are never stored.
  const uint4* wr[M][2];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      wr[m][h] = reinterpret_cast<const uint4*>(m == 0 ? w : w2) + min(row0 + g + 8 * h, n_out - 1) * chunks + q;
  const uint4* xr[NT];
  bool x_ok[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int t = nt * 8 + g;
    x_ok[nt] = t < n_tok;
    xr[nt] = reinterpret_cast<const uint4*>(x) + (x_ok[nt] ? t : 0) * chunks + q;
  }
  const int64_t b_begin = steps * rank / cs, b_steps = steps * (rank + 1) / cs - b_begin;
  const int64_t s_begin = b_begin + b_steps * warp / warps, s_end = b_begin + b_steps * (warp + 1) / warps;

  float acc[M][NT][4];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[m][nt][r] = 0.f;

  uint4 wc[kUnroll][M][2];
  auto load_w = [&](int64_t s) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          wc[u][m][h] = s + u < s_end ? __ldcs(wr[m][h] + (s + u) * 4) : make_uint4(0, 0, 0, 0);  // streamed once
  };
  if (early) {
    load_w(s_begin);
    pdl_enter();
  } else {
    pdl_enter();
    load_w(s_begin);
  }
  for (int64_t s = s_begin; s < s_end; s += kUnroll) {
    if (s != s_begin) load_w(s);
    uint4 xc[kUnroll][NT];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        xc[u][nt] = x_ok[nt] && s + u < s_end ? __ldg(xr[nt] + (s + u) * 4) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          // Step values 0-3 of each lane's chunk, then 4-7: A rows g (h = 0) and g + 8 (h = 1), B column g.
          const uint32_t a0[4] = {wc[u][m][0].x, wc[u][m][1].x, wc[u][m][0].y, wc[u][m][1].y};
          const uint32_t b0[2] = {xc[u][nt].x, xc[u][nt].y};
          mma_bf16(acc[m][nt], a0, b0);
          const uint32_t a1[4] = {wc[u][m][0].z, wc[u][m][1].z, wc[u][m][0].w, wc[u][m][1].w};
          const uint32_t b1[2] = {xc[u][nt].z, xc[u][nt].w};
          mma_bf16(acc[m][nt], a1, b1);
        }
  }

#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) partial[warp][m][nt][r][lane] = acc[m][nt][r];
  __syncthreads();
  // Element i = (row i / n_tok, token i % n_tok): C fragment register (row >= 8) * 2 + token % 2 of lane
  // (row % 8) * 4 + (token % 8) / 2 in each warp.
  auto store = [&](int i, float s, float u) {
    const int row = i / n_tok, t = i % n_tok;
    const int64_t o = row0 + row;
    if (o >= n_out) return;
    gemv_store<TO, M>(out + static_cast<int64_t>(t) * n_out + o, s, u, alpha, accumulate,
                      up != nullptr ? up + static_cast<int64_t>(t) * up_stride + o : nullptr);
  };
  for (int i = threadIdx.x; i < kRows * n_tok; i += blockDim.x) {
    const int row = i / n_tok, t = i % n_tok;
    const int nt = t / 8, tt = t % 8;
    const int r = (row / 8) * 2 + tt % 2, l = (row % 8) * 4 + tt / 2;
    float s = 0.f, u = 0.f;
    for (int j = 0; j < warps; ++j) {
      // nt and r are run-time here: read through a flat index of the shared array.
      s += (&partial[j][0][0][0][0])[(nt * 4 + r) * kWarp + l];
      if constexpr (M == 2) u += (&partial[j][1][0][0][0])[(nt * 4 + r) * kWarp + l];
    }
    if (cs == 1) {
      store(i, s, u);
    } else {
      block_sums[0][i] = s;
      if constexpr (M == 2) block_sums[M - 1][i] = u;
    }
  }
  if (cs == 1) return;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's sums are in its shared memory
  if (rank == 0) {
    for (int i = threadIdx.x; i < kRows * n_tok; i += blockDim.x) {
      float s = 0.f, u = 0.f;
      for (int b = 0; b < cs; ++b) {
        s += cluster.map_shared_rank(&block_sums[0][0], b)[i];
        if constexpr (M == 2) u += cluster.map_shared_rank(&block_sums[M - 1][0], b)[i];
      }
      store(i, s, u);
    }
  }
  cluster.sync();  // no block leaves while rank 0 reads its shared memory
}

std::atomic<bool>& tc_flag() {
  static std::atomic<bool> on{true};
  return on;
}

std::atomic<int>& min_rows() {
  static std::atomic<int> rows{kDefaultMinRows};
  return rows;
}

std::atomic<bool>& split_flag() {
  static std::atomic<bool> on{true};
  return on;
}

// One launch's arguments.
struct TcLaunch {
  GemvSegs segs;
  int64_t blocks;
  int warps, cs, n_tok;
  int64_t n_in;
  const void* x;
  const void* w2;
  float alpha;
  bool accumulate;
  const void* up;
  int64_t up_stride;
  bool early;
  cudaStream_t stream;
};

template <int NT, class TO, int M>
cudaError_t launch_tc(const TcLaunch& l) {
  auto* kernel = gemv_tc_kernel<NT, TO, M>;
  const auto* x = static_cast<const bf16*>(l.x);
  const auto* w2 = static_cast<const bf16*>(l.w2);
  const auto* up = static_cast<const TO*>(l.up);
  const auto blocks = static_cast<unsigned>(l.blocks), threads = static_cast<unsigned>(l.warps * kWarp);
  if (l.cs > 1) {
    return launch_clusters_pdl(kernel, blocks, threads, 0, l.stream, static_cast<unsigned>(l.cs), l.segs, x, w2,
                               l.n_tok, l.n_in, l.alpha, l.accumulate, up, l.up_stride, l.early, l.cs);
  }
  launch_kernel(kernel, blocks, threads, 0, l.stream, l.segs, x, w2, l.n_tok, l.n_in, l.alpha, l.accumulate, up,
                l.up_stride, l.early, l.cs);
  return cudaSuccess;
}

template <class TO, int M>
cudaError_t launch_typed(const TcLaunch& l) {
  return l.n_tok <= 8 ? launch_tc<1, TO, M>(l) : launch_tc<2, TO, M>(l);
}

}  // namespace

void set_gemv_tc(bool on) { tc_flag().store(on, std::memory_order_relaxed); }
bool gemv_tc() { return tc_flag().load(std::memory_order_relaxed); }
void set_gemv_tc_split(bool on) { split_flag().store(on, std::memory_order_relaxed); }
bool gemv_tc_split() { return split_flag().load(std::memory_order_relaxed); }
void set_gemv_tc_min_rows(int rows) {
  min_rows().store(std::clamp(rows, kMinTcRows, kMaxTcRows + 1), std::memory_order_relaxed);
}
int gemv_tc_min_rows() { return min_rows().load(std::memory_order_relaxed); }

bool gemv_tc_takes(int64_t rows, int64_t n_in, int64_t n_out_total) {
  return gemv_tc() && rows >= gemv_tc_min_rows() && rows <= kMaxTcRows && n_in % kStep == 0 &&
         n_in * n_out_total >= kMinElems;
}

Status launch_gemv_tc(GemvSegs segs, int64_t rows, int64_t n_in, bool out_bf16, const void* x, const void* w2,
                      float alpha, bool accumulate, const void* up, int64_t up_stride, bool early, int sm_count,
                      cudaStream_t stream) {
  int64_t strips = 0;
  for (int i = 0; i < segs.n; ++i) {
    segs.first_block[i] = strips;  // in strips: the kernel divides its block index by cs first
    strips += (segs.n_out[i] + kRows - 1) / kRows;
  }
  if (rows < kMinTcRows || rows > kMaxTcRows || n_in % kStep != 0 || strips < 1 || (w2 != nullptr && !out_bf16))
    return internal_error(strfmt("cuda gemv_tc: %lld rows, K %lld, %lld strips", static_cast<long long>(rows),
                                 static_cast<long long>(n_in), static_cast<long long>(strips)));
  const int64_t steps = n_in / kStep;
  const int cs = gemv_tc_split() ? tc_cluster(strips, steps, sm_count) : 1;
  const TcLaunch l{.segs = segs,
                   .blocks = strips * cs,
                   .warps = tc_warps(steps / cs),
                   .cs = cs,
                   .n_tok = static_cast<int>(rows),
                   .n_in = n_in,
                   .x = x,
                   .w2 = w2,
                   .alpha = alpha,
                   .accumulate = accumulate,
                   .up = up,
                   .up_stride = up_stride,
                   .early = early,
                   .stream = stream};
  const cudaError_t err =
      w2 != nullptr ? launch_typed<bf16, 2>(l) : (out_bf16 ? launch_typed<bf16, 1>(l) : launch_typed<float, 1>(l));
  TANDEM_CUDA_TRY(err);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
