// Mixture-of-experts experts on the GPU (spec §1.10, ops.h MoeExpertsArgs; the routing is in moe_route.cu).
// moe_experts, grouped by expert so each selected expert's weights stream from memory once per
// chunk of tokens, in four launches whose sizes depend only on n_tokens and k (no host round trip: capturable in a
// CUDA graph; a grid has one slot per possible distinct expert, min(n_tokens * k, n_experts), and slots past the
// actual number of distinct experts exit at once):
//  0. group: one block groups the chunk's (token, slot) pairs by expert (counts, a prefix sum over experts, pairs
//     listed in increasing order: deterministic) into tables in the scratch: the slot-th distinct expert, where
//     its pairs start, how many.
//  1. gate_up: block (rows, slot) takes the slot-th distinct expert e, streams R rows of G_e and the same R rows of
//     U_e once in 16-byte chunks with all the block's threads striding over d_model (192 for d_model = 2816: two
//     even passes), and writes
//     h = gelu_tanh(G_e x_t) * (U_e x_t) for every pair of e (x rows from L1/L2), gate, up and h rounded to the
//     activation dtype as HF's tensors are, and h stored in that dtype in the stream's workspace (nothing is lost;
//     the down kernel reads half the bytes for bf16, and the tensor-core path stores the same bf16 h).
//  2. down: y[pair] = D_e h[pair] in f32, each warp streaming R rows of D_e (rows of d_ff are short).
//  3. combine: out[t] = sum_j w_j y[(t, j)], the token's experts added in increasing index (as HF and the CPU), in
//     f32, rounded once.
// One token (decode) skips step 0: slot j is pair j, its expert read from idx by the gate_up and down kernels.
// Chunks of kTcMinTokens or more tokens (prefill) run steps 1-2 on the tensor cores instead (moe_tc.cu).
// Products accumulate in f32. f32 weights and unaligned or odd sizes take the same kernels with one-element loads.
// Tokens are chunked so the tables, h and y fit the workspace.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_common.h"
#include "backend/cuda/warp_mma.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

// ---- moe_experts ----

// The scratch moe_experts lays out (launch_moe_experts): the tables and alignment padding, and per token of a chunk
// its pairs' h (counted at 4 bytes) and y rows and index.
int64_t scratch_fixed_bytes(int64_t n_exp) { return 3 * n_exp * 4 + 3 * 256; }
int64_t scratch_bytes_per_token(int64_t k, int64_t d_ff, int64_t d_model) { return k * ((d_ff + d_model) * 4 + 4); }

constexpr int kThreads = 256;                // threads per expert block
constexpr int kWarps = kThreads / kWarp;
constexpr int kMaxChunkPairs = 8192;         // (token, slot) pairs per chunk (1024 tokens at k = 8): bounds the
                                             // grouping's shared memory (40 KB)
constexpr int64_t kBlocksPerSm = 4;          // rows per block shrink until the grid fills every SM this often
constexpr int64_t kTcMinTokens = 32;         // chunks of this many tokens take the tensor-core kernels (moe_tc.cu)

// 16-byte chunks: 8 bf16 weights (uint4) against 8 bf16 (uint4) or 8 f32 (F8) activations. With V = 1 (f32
// weights, or sizes / addresses that do not allow vector loads) a chunk is one element, already in f32.
struct F8 {
  float4 a, b;
};

template <int V, class T>
__device__ __forceinline__ auto load_weights(const T* row, int64_t c) {
  if constexpr (V == 8) {
    static_assert(sizeof(T) == 2, "8-wide weight chunks are bf16");
    return __ldcs(reinterpret_cast<const uint4*>(row) + c);  // streamed once: keep it out of L1
  } else {
    return to_f32(row[c]);
  }
}

template <int V, class T>
__device__ __forceinline__ auto load_act(const T* row, int64_t c) {
  if constexpr (V == 1) {
    return to_f32(row[c]);
  } else if constexpr (sizeof(T) == 2) {
    return __ldg(reinterpret_cast<const uint4*>(row) + c);
  } else {
    const float4* q = reinterpret_cast<const float4*>(row) + 2 * c;
    return F8{__ldg(q), __ldg(q + 1)};
  }
}

__device__ __forceinline__ float fma_chunk(float w, float x, float acc) { return fmaf(w, x, acc); }

__device__ __forceinline__ float fma_chunk(const uint4& w, const uint4& x, float acc) { return dot8_bf16(w, x, acc); }

__device__ __forceinline__ float fma_chunk(const uint4& w, const F8& x, float acc) {
  const __nv_bfloat162* pw = reinterpret_cast<const __nv_bfloat162*>(&w);
  const float xs[8] = {x.a.x, x.a.y, x.a.z, x.a.w, x.b.x, x.b.y, x.b.z, x.b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fw = __bfloat1622float2(pw[i]);
    acc = fmaf(fw.x, xs[2 * i], acc);
    acc = fmaf(fw.y, xs[2 * i + 1], acc);
  }
  return acc;
}

// Per-thread partial dots of NR weight rows with the first np of P activation rows (np >= 1, the same in the whole
// block): G threads stride together over the rows' n_chunks chunks, so each row streams through as G x 16-byte
// coalesced reads. Each step first issues the loads of U chunks per row (U * NR loads in flight per thread, before
// any branch on np), then accumulates. The caller reduces acc over the G threads.
template <int G, int U, int V, int NR, int P, class TW, class TX>
__device__ __forceinline__ void dot_rows(float (&acc)[NR][P], const TW* (&w)[NR], const TX* (&x)[P], int np,
                                         int64_t n_chunks, int g_lane) {
  using WChunk = decltype(load_weights<V>(w[0], 0));
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int p = 0; p < P; ++p) acc[r][p] = 0.f;
#pragma unroll 1
  for (int64_t c0 = g_lane; c0 < n_chunks; c0 += U * G) {
    WChunk wc[U][NR];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u == 0 || c0 + u * G < n_chunks) {
#pragma unroll
        for (int r = 0; r < NR; ++r) wc[u][r] = load_weights<V>(w[r], c0 + u * G);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * G;
      if (u == 0 || c < n_chunks) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
          if (p == 0 || p < np) {
            const auto xc = load_act<V>(x[p], c);
#pragma unroll
            for (int r = 0; r < NR; ++r) acc[r][p] = fma_chunk(wc[u][r], xc, acc[r][p]);
          }
        }
      }
    }
  }
}

// Staged weights (bf16 rows, 16-byte chunks; set_moe_staged): before any product, each thread copies every chunk
// it will read of its NR rows global -> shared with cp.async, so all of a block's weight bytes are in flight at once
// and none of them sits in registers (dot_rows holds U * NR chunks per thread, which at P = 4 pairs means one chunk
// per row in flight and 128 registers). Thread g's chunk i (c = g + i G) of row r goes to
// s[(r * n_iter + i) * G + g]: consecutive threads, consecutive 16 bytes. Each thread reads back only its own chunks
// (after cp.async.wait_group, no barrier), in dot_rows' order, so the sums are bit for bit those of dot_rows.
template <int G, int NR, class TW>
__device__ __forceinline__ void stage_rows(uint4* s, const TW* (&w)[NR], int64_t n_chunks, int n_iter, int g_lane) {
  static_assert(sizeof(TW) == 2, "staged rows are bf16");
#pragma unroll
  for (int r = 0; r < NR; ++r) {
    const uint4* row = reinterpret_cast<const uint4*>(w[r]);
    for (int i = 0; i < n_iter; ++i) {
      const int64_t c = g_lane + static_cast<int64_t>(i) * G;
      if (c < n_chunks) cp_async16(s + (r * n_iter + i) * G + g_lane, row + c, true);
    }
  }
  cp_async_commit();
  cp_async_wait<0>();
}

// dot_rows over staged rows (stage_rows' layout): acc[r][p] = the first np of P activation rows against the NR rows.
template <int G, int NR, int P, class TX>
__device__ __forceinline__ void dot_staged(float (&acc)[NR][P], const uint4* s, const TX* (&x)[P], int np,
                                           int64_t n_chunks, int n_iter, int g_lane) {
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int p = 0; p < P; ++p) acc[r][p] = 0.f;
#pragma unroll 1
  for (int i = 0; i < n_iter; ++i) {
    const int64_t c = g_lane + static_cast<int64_t>(i) * G;
    if (c >= n_chunks) break;
    decltype(load_act<8>(x[0], 0)) xc[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (p == 0 || p < np) xc[p] = load_act<8>(x[p], c);
    }
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const uint4 wc = s[(r * n_iter + i) * G + g_lane];  // one shared-memory read per chunk for all pairs
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (p == 0 || p < np) acc[r][p] = fma_chunk(wc, xc[p], acc[r][p]);
      }
    }
  }
}

// Bytes of shared memory a staged block needs: NR rows per group of G threads, n_iter chunks each, `groups` groups.
__host__ __device__ constexpr int64_t staged_bytes(int64_t groups, int nr, int64_t n_iter, int g) {
  return groups * nr * n_iter * g * static_cast<int64_t>(sizeof(uint4));
}
constexpr int64_t kMaxStagedBytes = 64 * 1024;  // three blocks per SM at least

// Exclusive prefix sum of v over the block's kThreads threads in thread order; *total gets the block's sum (in
// every thread). s_warp holds kWarps ints; the caller must pass a barrier before it writes s_warp again.
__device__ __forceinline__ int block_exclusive_scan(int v, int* s_warp, int* total) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int incl = warp_inclusive_scan(v);
  if (lane == kWarp - 1) s_warp[warp] = incl;
  __syncthreads();
  int before = 0, sum = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int c = s_warp[w];
    before += w < warp ? c : 0;
    sum += c;
  }
  *total = sum;
  return before + incl - v;
}

// One block groups the chunk's (token, slot) pairs by expert for the expert kernels, the same way every time:
// counts per expert, an exclusive prefix sum over experts (increasing index), the slot-th distinct valid expert in
// tab.expert[slot] (-1 for the slots past the last of the `slots` the launches have), and each expert's pairs in
// increasing order in tab.pairs (a pair's place: its expert's offset + the earlier pairs of the same expert).
// Indices outside [0, n_exp) belong to no expert (the combine kernel turns their tokens into NaN).
__global__ void __launch_bounds__(kThreads)
    moe_group_kernel(MoeTables tab, const int32_t* __restrict__ idx, int n_pairs, int n_exp, int slots) {
  pdl_enter();
  __shared__ int s_idx[kMaxChunkPairs];
  __shared__ int s_count[kMaxExperts];
  __shared__ int s_offset[kMaxExperts];
  __shared__ int s_warp[kWarps];
  const int tid = threadIdx.x;
  for (int e = tid; e < n_exp; e += kThreads) s_count[e] = 0;
  for (int i = tid; i < n_pairs; i += kThreads) s_idx[i] = idx[i];
  __syncthreads();
  for (int i = tid; i < n_pairs; i += kThreads) {
    const int e = s_idx[i];
    if (e >= 0 && e < n_exp) atomicAdd(&s_count[e], 1);  // integer counts: the order does not matter
  }
  __syncthreads();
  // Thread tid owns experts [e0, e1), consecutive, so thread order is expert order. One scan of both counts,
  // packed as present << 16 | pairs: neither field can carry into the other.
  static_assert(kMaxChunkPairs < (1 << 16) && kMaxExperts < (1 << 15), "packed scan fields");
  const int per = (n_exp + kThreads - 1) / kThreads;
  const int e0 = min(n_exp, tid * per), e1 = min(n_exp, e0 + per);
  int present = 0, pairs = 0;
  for (int e = e0; e < e1; ++e) {
    const int c = s_count[e];
    present += c > 0 ? 1 : 0;
    pairs += c;
  }
  int total = 0;
  const int packed = block_exclusive_scan((present << 16) | pairs, s_warp, &total);
  int rank = packed >> 16, offset = packed & 0xffff;
  for (int e = e0; e < e1; ++e) {
    const int c = s_count[e];
    s_offset[e] = offset;
    if (c > 0) {
      if (rank < slots) {
        tab.expert[rank] = e;
        tab.offset[rank] = offset;
        tab.count[rank] = c;
      }
      ++rank;
    }
    offset += c;
  }
  for (int r = (total >> 16) + tid; r < slots; r += kThreads) tab.expert[r] = -1;
  __syncthreads();
  // Each expert's pairs in increasing order: one warp walks the pairs 32 at a time; lanes holding the same expert
  // rank among themselves (match_any), and s_offset[e] serves as the expert's cursor, advanced by each group's
  // size. O(pairs) where counting the earlier pairs of the same expert for every pair was O(pairs^2).
  if (tid < kWarp) {
    const int lane = tid;
    for (int base = 0; base < n_pairs; base += kWarp) {
      const int i = base + lane;
      const int e = i < n_pairs ? s_idx[i] : -1;
      const bool valid = e >= 0 && e < n_exp;
      const unsigned same = __match_any_sync(0xffffffffu, valid ? e : n_exp + lane);  // invalid: a group of one
      if (valid) tab.pairs[s_offset[e] + __popc(same & ((1u << lane) - 1u))] = i;
      __syncwarp();
      if (valid && lane == 31 - __clz(same)) s_offset[e] += __popc(same);  // the group's last lane
      __syncwarp();
    }
  }
}

// Block (row block blockIdx.x, expert slot blockIdx.y): h[pair, f] = gelu_tanh(G_e[f] . x_t) * (U_e[f] . x_t) for
// the R rows f of the block and every pair (t, j) that chose the block's expert e, P pairs per pass over the rows.
// STAGED: the weight rows go through shared memory (stage_rows; dynamic shared memory of staged_bytes).
template <class TW, class TX, int V, int R, int P, int THREADS = kThreads, bool STAGED = false>
__global__ void __launch_bounds__(THREADS, 2)
    moe_gate_up_kernel(TX* __restrict__ h, MoeTables tab, const TX* __restrict__ x, const TW* __restrict__ gate_up,
                       MoeShape s, const int32_t* __restrict__ one_token_idx) {
  static_assert(!STAGED || V == 8, "staged rows are 16-byte chunks");
  pdl_enter();
  extern __shared__ __align__(16) uint4 s_stage[];
  constexpr int kBlockWarps = THREADS / kWarp;
  __shared__ float part[kBlockWarps][2 * R * P];
  const int slot = blockIdx.y;
  // One token (one_token_idx, no tables): slot j is pair j, whose expert is idx[j].
  const int e = one_token_idx != nullptr ? one_token_idx[slot] : tab.expert[slot];
  if (e < 0 || e >= s.n_exp || s.d_ff == 0) return;  // an empty slot: the whole block leaves together
  const int count = one_token_idx != nullptr ? 1 : tab.count[slot];
  const int* __restrict__ list = one_token_idx != nullptr ? nullptr : tab.pairs + tab.offset[slot];
  auto pair_at = [&](int i) { return list != nullptr ? list[i] : slot; };

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t f0 = static_cast<int64_t>(blockIdx.x) * R;
  const TW* gate = gate_up + static_cast<int64_t>(e) * 2 * s.d_ff * s.d_model;
  // Rows 0..R-1: G_e[f0 + r]; rows R..2R-1: U_e[f0 + r]. Rows past d_ff (the last block) re-read the last row.
  const TW* w[2 * R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t f = min(f0 + r, s.d_ff - 1);
    w[r] = gate + f * s.d_model;
    w[R + r] = gate + (s.d_ff + f) * s.d_model;
  }
  const int64_t n_chunks = s.d_model / V;
  const int n_iter = static_cast<int>((n_chunks + THREADS - 1) / THREADS);
  if constexpr (STAGED) stage_rows<THREADS>(s_stage, w, n_chunks, n_iter, threadIdx.x);
  for (int p0 = 0; p0 < count; p0 += P) {
    const int np = min(P, count - p0);
    const TX* xr[P];
#pragma unroll
    for (int p = 0; p < P; ++p) xr[p] = x + static_cast<int64_t>(pair_at(p0 + min(p, np - 1)) / s.k) * s.d_model;
    float acc[2 * R][P];
    if constexpr (STAGED) {
      dot_staged<THREADS>(acc, s_stage, xr, np, n_chunks, n_iter, threadIdx.x);
    } else {
      dot_rows<THREADS, (P == 1 ? 2 : 1), V>(acc, w, xr, np, n_chunks, threadIdx.x);  // 2R or 4R loads in flight
    }
#pragma unroll
    for (int r = 0; r < 2 * R; ++r)
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (p < np) {
          const float v = warp_sum(acc[r][p]);
          if (lane == 0) part[warp][r * P + p] = v;
        }
      }
    __syncthreads();
    if (threadIdx.x < R * P) {
      const int r = threadIdx.x / P, p = threadIdx.x % P;
      const int64_t f = f0 + r;
      if (p < np && f < s.d_ff) {
        float gs = 0.f, us = 0.f;
#pragma unroll
        for (int i = 0; i < kBlockWarps; ++i) {
          gs += part[i][r * P + p];
          us += part[i][(R + r) * P + p];
        }
        const float gv = round_to(s.act, gs), uv = round_to(s.act, us);
        h[static_cast<int64_t>(pair_at(p0 + p)) * s.d_ff + f] = from_f32<TX>(round_to(s.act, gelu_tanh(gv)) * uv);
      }
    }
    __syncthreads();  // part[] is rewritten by the next pass
  }
}

// Block (row block blockIdx.x, expert slot blockIdx.y): y[pair, o] = D_e[o] . h[pair] for every pair of the slot's
// expert (the grouping of moe_group_kernel). d_ff rows are short (704 values for 26B-A4B), so each warp streams its
// own R rows of D_e; the block's kWarps * R rows are consecutive.
// EARLY (one token, bf16 rows of kWarp..kEarlyChunks * kWarp chunks, set_moe_down_early): the expert index and
// every weight chunk of the warp's rows are requested before the wait for the kernel before (gate_up, which writes
// h). The index is moe_route's output, two kernels back: that kernel completed before gate_up got past its own
// wait, and gate_up lets this kernel launch only after that wait, so the index is final; it is read from L2 (ld.cg),
// never from a line an earlier layer's launch left in L1. The products are dot_rows' for P = 1, in its order. (An L2
// prefetch hint for these rows gave nothing, bench/RESULTS.md run V; here the chunks land in registers, as the GEMV's
// early weights do.)
constexpr int kEarlyChunks = 3;  // 16-byte chunks per lane and row, all in flight at once

template <class TW, class TX, int V, int R, int P, bool STAGED = false, bool EARLY = false>
__global__ void __launch_bounds__(kThreads, 2)
    moe_down_kernel(float* __restrict__ y, MoeTables tab, const TX* __restrict__ h, const TW* __restrict__ down,
                    MoeShape s, const int32_t* __restrict__ one_token_idx) {
  static_assert(!STAGED || V == 8, "staged rows are 16-byte chunks");
  static_assert(!EARLY || (V == 8 && P == 1 && !STAGED), "the early path is the one-token bf16 register path");
  if constexpr (!EARLY) pdl_enter();
  extern __shared__ __align__(16) uint4 s_stage[];
  const int slot = blockIdx.y;
  const bool one = one_token_idx != nullptr;  // as in moe_gate_up_kernel: slot j is pair j, expert idx[j]
  const int e = EARLY ? __ldcg(one_token_idx + slot) : one ? one_token_idx[slot] : tab.expert[slot];
  if (e < 0 || e >= s.n_exp) return;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * R;
  if (o0 >= s.d_model) return;  // no block-wide barriers here: a warp may leave alone
  const TW* w[R];
#pragma unroll
  for (int r = 0; r < R; ++r) w[r] = down + (static_cast<int64_t>(e) * s.d_model + min(o0 + r, s.d_model - 1)) * s.d_ff;
  const int64_t n_chunks = s.d_ff / V;
  if constexpr (EARLY) {
    uint4 wc[kEarlyChunks][R];
#pragma unroll
    for (int u = 0; u < kEarlyChunks; ++u) {
      if (u == 0 || lane + u * kWarp < n_chunks) {
#pragma unroll
        for (int r = 0; r < R; ++r) wc[u][r] = load_weights<8>(w[r], lane + u * kWarp);
      }
    }
    pdl_enter();
    const TX* hr = h + static_cast<int64_t>(slot) * s.d_ff;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.f;
#pragma unroll
    for (int u = 0; u < kEarlyChunks; ++u) {
      const int64_t c = lane + u * kWarp;
      if (u == 0 || c < n_chunks) {
        const auto xc = load_act<8>(hr, c);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = fma_chunk(wc[u][r], xc, acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[r]);
      if (lane == 0 && o0 + r < s.d_model) y[static_cast<int64_t>(slot) * s.d_model + o0 + r] = v;
    }
    return;
  }
  const int offset = one ? 0 : tab.offset[slot], count = one ? 1 : tab.count[slot];
  const int n_iter = static_cast<int>((n_chunks + kWarp - 1) / kWarp);
  uint4* s_warp_rows = s_stage + staged_bytes(warp, R, n_iter, kWarp) / sizeof(uint4);  // this warp's rows
  if constexpr (STAGED) stage_rows<kWarp>(s_warp_rows, w, n_chunks, n_iter, lane);
  for (int p0 = 0; p0 < count; p0 += P) {
    const int np = min(P, count - p0);
    int pair[P];
    const TX* hr[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      pair[p] = one ? slot : tab.pairs[offset + p0 + min(p, np - 1)];
      hr[p] = h + static_cast<int64_t>(pair[p]) * s.d_ff;
    }
    float acc[R][P];
    if constexpr (STAGED) {
      dot_staged<kWarp>(acc, s_warp_rows, hr, np, n_chunks, n_iter, lane);
    } else {
      dot_rows<kWarp, 3, V>(acc, w, hr, np, n_chunks, lane);
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (p < np) {
          const float v = warp_sum(acc[r][p]);
          if (lane == 0 && o0 + r < s.d_model) y[static_cast<int64_t>(pair[p]) * s.d_model + o0 + r] = v;
        }
      }
  }
}

// Block (output block blockIdx.x, token blockIdx.y of the chunk): out[t, o] = sum_j w_j y[t k + j, o], the token's
// experts taken in increasing index (ties, which a router never produces, by slot) as HF and the CPU add them,
// in f32, rounded once. A token with an index outside [0, n_experts) gets NaN (a bug upstream, made visible).
template <class TO>
__global__ void __launch_bounds__(kThreads)
    moe_combine_kernel(TO* __restrict__ out, const float* __restrict__ y, const int32_t* __restrict__ idx,
                       const float* __restrict__ weights, MoeShape s) {
  pdl_enter();
  __shared__ int order[kMaxTopK];
  const int64_t t = blockIdx.y;
  const int k = s.k;
  const int32_t* it = idx + t * k;
  int invalid = 0;
  if (threadIdx.x < k) {  // slot j goes to its rank by (expert, slot)
    const int j = threadIdx.x, e = it[j];
    int rank = 0;
    for (int i = 0; i < k; ++i) {
      const int ei = it[i];
      rank += (ei < e || (ei == e && i < j)) ? 1 : 0;
    }
    order[rank] = j;
    invalid = (e < 0 || e >= s.n_exp) ? 1 : 0;
  }
  const bool bad = __syncthreads_or(invalid) != 0;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (o >= s.d_model) return;
  float acc = 0.f;
  if (bad) {
    acc = __int_as_float(0x7fc00000);
  } else {
#pragma unroll 4
    for (int r = 0; r < k; ++r) {
      const int64_t p = t * k + order[r];
      acc += weights[p] * y[p * s.d_model + o];
    }
  }
  out[t * s.d_model + o] = from_f32<TO>(acc);
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

std::atomic<bool>& staged_flag() {
  static std::atomic<bool> on{true};
  return on;
}
std::atomic<bool>& down_early_flag() {
  static std::atomic<bool> on{true};
  return on;
}

// A staged kernel's launch: its dynamic shared memory allowed past the 48 KB default first (kMaxStagedBytes, once
// per kernel and device; a failure surfaces as the launch's error).
template <auto Kernel, class... Args>
void launch_staged(dim3 grid, int threads, int64_t smem, cudaStream_t stream, Args&&... args) {
  (void)allow_dynamic_smem<Kernel>(static_cast<size_t>(kMaxStagedBytes));
  launch_kernel(Kernel, grid, threads, static_cast<size_t>(smem), stream, std::forward<Args>(args)...);
}

// Rows per block (4, 2 or 1; each block covers rows_per_r * R rows): the most that still gives every SM
// kBlocksPerSm blocks when all `slots` experts are distinct.
int pick_rows(int64_t rows, int64_t rows_per_r, int64_t slots, int sm_count) {
  const int64_t want = kBlocksPerSm * (sm_count > 0 ? sm_count : 132);
  for (int r : {4, 2}) {
    const int64_t unit = rows_per_r * r;
    if ((rows + unit - 1) / unit * slots >= want) return r;
  }
  return 1;
}

// TANDEM_MOE_ROWS="gu,dn" (a tuning knob, each 1, 2 or 4; 0 or absent: pick_rows) pins the rows per block of the
// gate_up and down kernels (GEMV-style path). Read once.
struct ForcedRows {
  int gate_up = 0, down = 0;
};
ForcedRows forced_rows() {
  static const ForcedRows f = [] {
    ForcedRows r;
    const char* e = std::getenv("TANDEM_MOE_ROWS");
    int gu = 0, dn = 0;
    auto ok = [](int v) { return v == 0 || v == 1 || v == 2 || v == 4; };
    if (e != nullptr && std::sscanf(e, "%d,%d", &gu, &dn) == 2 && ok(gu) && ok(dn)) {
      r.gate_up = gu;
      r.down = dn;
    }
    return r;
  }();
  return f;
}

// TANDEM_MOE_PAIRS=P (a tuning knob: 1, 2 or 4) caps the pairs per pass of the register-path expert kernels. Read once.
int forced_pairs() {
  static const int p = [] {
    const char* e = std::getenv("TANDEM_MOE_PAIRS");
    const int v = e != nullptr ? std::atoi(e) : 0;
    return v == 1 || v == 2 || v == 4 ? v : 4;
  }();
  return p;
}

// Calls f(integral_constant R, integral_constant P) for R in {1, 2, 4}, P in {1, 2, 4}.
template <class F>
void with_rows_pairs(int r, int p, F&& f) {
  auto with_p = [&](auto rt) {
    if (p == 1) {
      f(rt, std::integral_constant<int, 1>{});
    } else if (p == 2) {
      f(rt, std::integral_constant<int, 2>{});
    } else {
      f(rt, std::integral_constant<int, 4>{});
    }
  };
  if (r == 4) {
    with_p(std::integral_constant<int, 4>{});
  } else if (r == 2) {
    with_p(std::integral_constant<int, 2>{});
  } else {
    with_p(std::integral_constant<int, 1>{});
  }
}

template <class TW, class TX>
Status experts_typed(const MoeExpertsArgs& a, const Scratch& scratch, cudaStream_t stream) {
  MoeShape s{};
  s.n_exp = a.gate_up.shape[0];
  s.d_ff = a.gate_up.shape[1] / 2;
  s.d_model = a.gate_up.shape[2];
  s.k = static_cast<int>(a.idx.dim(-1));
  s.act = a.out.dtype;
  const int64_t n_tok = a.x.rows();
  if (n_tok == 0 || s.d_model == 0) return ok_status();
  if (s.n_exp > kMaxExperts)
    return unsupported(strfmt("cuda moe_experts: %lld experts (at most %d)", static_cast<long long>(s.n_exp),
                              kMaxExperts));
  // 16-byte loads of bf16 weights (and of x, whose rows are then 16-byte aligned too); else one element at a time.
  const bool vec_gu = sizeof(TW) == 2 && s.d_model % 8 == 0 && aligned16(a.gate_up.data) && aligned16(a.x.data);
  const bool vec_down = sizeof(TW) == 2 && s.d_ff % 8 == 0 && aligned16(a.down.data);
  const bool tc = moe_tc_applies(s, a.gate_up.dtype, a.x.dtype, a.gate_up.data, a.down.data, a.x.data);

  // Scratch: the tables (3 n_exp + pairs ints), h [pairs, d_ff] (TX; bf16 on the tensor-core path) and
  // y [pairs, d_model] f32, each 256-byte aligned (h rows are then 16-byte aligned for the down kernel's vector
  // loads). The per-token bound counts h at 4 bytes. Tokens per chunk: as many as fit, and at
  // most kMaxChunkPairs pairs.
  const int64_t fixed = scratch_fixed_bytes(s.n_exp), per_token = scratch_bytes_per_token(s.k, s.d_ff, s.d_model);
  const auto bytes = static_cast<int64_t>(scratch.bytes);
  const int64_t fit = bytes > fixed ? (bytes - fixed) / per_token : 0;
  const int64_t chunk = std::min<int64_t>({n_tok, kMaxChunkPairs / s.k, fit});
  if (chunk < 1 || scratch.data == nullptr)
    return unsupported(strfmt("cuda moe_experts: k %d x (d_ff %lld + d_model %lld) needs more than the %zu-byte "
                              "workspace", s.k, static_cast<long long>(s.d_ff), static_cast<long long>(s.d_model),
                              scratch.bytes));
  auto* base = static_cast<char*>(scratch.data);
  MoeTables tab{};
  tab.expert = reinterpret_cast<int*>(base);
  tab.offset = tab.expert + s.n_exp;
  tab.count = tab.offset + s.n_exp;
  tab.pairs = tab.count + s.n_exp;
  size_t off = align256(static_cast<size_t>(3 * s.n_exp + chunk * s.k) * 4);
  auto* h = reinterpret_cast<TX*>(base + off);
  off = align256(off + static_cast<size_t>(chunk * s.k * s.d_ff) * sizeof(TX));
  auto* y = reinterpret_cast<float*>(base + off);
  off += static_cast<size_t>(chunk * s.k * s.d_model) * 4;
  if (off > scratch.bytes) return internal_error("cuda moe_experts: scratch layout overflows the workspace");

  const auto* x = static_cast<const TX*>(a.x.data);
  const auto* gate_up = static_cast<const TW*>(a.gate_up.data);
  const auto* down = static_cast<const TW*>(a.down.data);
  const auto* idx = static_cast<const int32_t*>(a.idx.data);
  const auto* w = static_cast<const float*>(a.weights.data);
  auto* out = static_cast<TX*>(a.out.data);
  for (int64_t t0 = 0; t0 < n_tok; t0 += chunk) {
    const int64_t nt = std::min(chunk, n_tok - t0);
    s.n_pairs = static_cast<int>(nt * s.k);
    // Launch sizes depend on the token count only (graph capture): one slot per possible distinct expert.
    const int64_t slots = std::min<int64_t>(nt * s.k, s.n_exp);
    // A token picks an expert once (router), so an expert has at most nt pairs. TANDEM_MOE_PAIRS pins the most.
    const TX* xc = x + t0 * s.d_model;
    const int32_t* ic = idx + t0 * s.k;
    // Staged weight rows (TANDEM_MOE_STAGED=1) for launches of 2 or more tokens: all of a block's row bytes in flight
    // at once, then read back from shared memory once per pair, one pair per pass (bench/RESULTS.md run AE: 2 % faster
    // at verify sizes; at 2 or 4 pairs per pass the extra registers cost resident blocks and it was slower). For one
    // token the register path, which overlaps its products with the loads still in flight, is faster.
    const bool staged = moe_staged() && nt > 1;
    const int pairs_per_pass = staged ? 1 : std::min(nt == 1 ? 1 : (nt == 2 ? 2 : 4), forced_pairs());

    // One token: slot j is pair j (its expert idx[j]; a repeated expert is computed once per slot), no tables.
    const bool one = nt == 1;
    const int32_t* one_idx = one ? ic : nullptr;
    if (!one) {
      launch_kernel(moe_group_kernel, 1, kThreads, 0, stream, tab, ic, s.n_pairs, static_cast<int>(s.n_exp),
                    static_cast<int>(slots));
      TANDEM_CUDA_TRY_LAUNCH();
    }

    if (nt >= kTcMinTokens && tc) {  // many tokens: the expert products on the tensor cores (moe_tc.cu)
      if constexpr (sizeof(TW) == 2 && sizeof(TX) == 2) {
        TANDEM_TRY(launch_moe_tc_gate_up(h, tab, xc, gate_up, s, slots, stream));
        TANDEM_TRY(launch_moe_tc_down(y, tab, h, down, s, slots, stream));
      }
    } else {
      const ForcedRows forced = forced_rows();
      const int r_gu =
          !vec_gu ? 1 : (forced.gate_up > 0 ? forced.gate_up : pick_rows(s.d_ff, 1, slots, scratch.sm_count));
      const dim3 gu_grid(static_cast<unsigned>(std::max<int64_t>(1, (s.d_ff + r_gu - 1) / r_gu)),
                         static_cast<unsigned>(slots));
      // Rows of 257..384 chunks (26B-A4B's d_model = 2816: 352) take two passes of 192 threads instead of 256 + 96,
      // as the GEMV's balanced passes (gemv.cu block_threads; TANDEM_GEMV_BALANCE=0: 256).
      const int64_t gu_chunks = s.d_model / 8;
      const bool gu_192 = gemv_balance() && gu_chunks > 256 && gu_chunks <= 384;
      const int gu_threads = gu_192 ? 192 : kThreads;
      const int64_t gu_stage = staged_bytes(1, 2 * r_gu, (gu_chunks + gu_threads - 1) / gu_threads, gu_threads);
      const bool gu_staged = staged && vec_gu && gu_stage <= kMaxStagedBytes;
      with_rows_pairs(r_gu, pairs_per_pass, [&](auto rt, auto pt) {
        constexpr int R = decltype(rt)::value, P = decltype(pt)::value;
        if (vec_gu) {
          if constexpr (sizeof(TW) == 2) {
            if (gu_staged && gu_192) {
              launch_staged<moe_gate_up_kernel<TW, TX, 8, R, P, 192, true>>(gu_grid, 192, gu_stage, stream, h, tab, xc,
                                                                            gate_up, s, one_idx);
            } else if (gu_staged) {
              launch_staged<moe_gate_up_kernel<TW, TX, 8, R, P, kThreads, true>>(gu_grid, kThreads, gu_stage, stream, h,
                                                                                 tab, xc, gate_up, s, one_idx);
            } else if (gu_192) {
              launch_kernel(moe_gate_up_kernel<TW, TX, 8, R, P, 192>, gu_grid, 192, 0, stream, h, tab, xc, gate_up, s,
                            one_idx);
            } else {
              launch_kernel(moe_gate_up_kernel<TW, TX, 8, R, P>, gu_grid, kThreads, 0, stream, h, tab, xc, gate_up, s,
                            one_idx);
            }
          }
        } else if constexpr (R == 1) {
          launch_kernel(moe_gate_up_kernel<TW, TX, 1, 1, P>, gu_grid, kThreads, 0, stream, h, tab, xc, gate_up, s,
                        one_idx);
        }
      });
      TANDEM_CUDA_TRY_LAUNCH();

      const int r_dn =
          !vec_down ? 1 : (forced.down > 0 ? forced.down : pick_rows(s.d_model, kWarps, slots, scratch.sm_count));
      const dim3 dn_grid(static_cast<unsigned>((s.d_model + kWarps * r_dn - 1) / (kWarps * r_dn)),
                         static_cast<unsigned>(slots));
      const int64_t dn_stage = staged_bytes(kWarps, r_dn, (s.d_ff / 8 + kWarp - 1) / kWarp, kWarp);
      const bool dn_staged = staged && vec_down && dn_stage <= kMaxStagedBytes;
      const int64_t dn_chunks = s.d_ff / 8;
      const bool dn_early = one && moe_down_early() && dn_chunks >= kWarp && dn_chunks <= kEarlyChunks * kWarp;
      with_rows_pairs(r_dn, pairs_per_pass, [&](auto rt, auto pt) {
        constexpr int R = decltype(rt)::value, P = decltype(pt)::value;
        if (vec_down) {
          if constexpr (sizeof(TW) == 2) {
            if (dn_staged) {
              launch_staged<moe_down_kernel<TW, TX, 8, R, P, true>>(dn_grid, kThreads, dn_stage, stream, y, tab,
                                                                    static_cast<const TX*>(h), down, s, one_idx);
            } else if (P == 1 && dn_early) {
              launch_kernel(moe_down_kernel<TW, TX, 8, R, 1, false, true>, dn_grid, kThreads, 0, stream, y, tab,
                            static_cast<const TX*>(h), down, s, one_idx);
            } else {
              launch_kernel(moe_down_kernel<TW, TX, 8, R, P>, dn_grid, kThreads, 0, stream, y, tab,
                            static_cast<const TX*>(h), down, s, one_idx);
            }
          }
        } else if constexpr (R == 1) {
          launch_kernel(moe_down_kernel<TW, TX, 1, 1, P>, dn_grid, kThreads, 0, stream, y, tab,
                        static_cast<const TX*>(h), down, s, one_idx);
        }
      });
      TANDEM_CUDA_TRY_LAUNCH();
    }

    const dim3 cb_grid(static_cast<unsigned>((s.d_model + kThreads - 1) / kThreads), static_cast<unsigned>(nt));
    launch_kernel(moe_combine_kernel<TX>, cb_grid, kThreads, 0, stream, out + t0 * s.d_model, y, ic, w + t0 * s.k, s);
    TANDEM_CUDA_TRY_LAUNCH();
  }
  return ok_status();
}

}  // namespace

void set_moe_staged(bool on) { staged_flag().store(on, std::memory_order_relaxed); }
bool moe_staged() { return staged_flag().load(std::memory_order_relaxed); }
void set_moe_down_early(bool on) { down_early_flag().store(on, std::memory_order_relaxed); }
bool moe_down_early() { return down_early_flag().load(std::memory_order_relaxed); }

size_t moe_experts_scratch_bytes(const MoeExpertsArgs& a) {
  if (a.gate_up.ndim != 3 || a.idx.ndim < 1) return 0;
  const int64_t k = a.idx.dim(-1);
  if (k < 1) return 0;
  const int64_t tokens = std::min<int64_t>(a.x.rows(), kMaxChunkPairs / k);
  return static_cast<size_t>(scratch_fixed_bytes(a.gate_up.shape[0]) +
                             tokens * scratch_bytes_per_token(k, a.gate_up.shape[1] / 2, a.gate_up.shape[2]));
}

Status launch_moe_experts(const MoeExpertsArgs& a, const Scratch& scratch, cudaStream_t stream) {
  const DType wt = a.gate_up.dtype, xt = a.x.dtype;
  if (!bf16_or_f32(wt) || a.down.dtype != wt)
    return unsupported(strfmt("cuda moe_experts: gate_up %s, down %s (both bf16 or both f32)", dtype_name(wt),
                              dtype_name(a.down.dtype)));
  if (!bf16_or_f32(xt) || a.out.dtype != xt)
    return unsupported(strfmt("cuda moe_experts: x %s, out %s (both bf16 or both f32)", dtype_name(xt),
                              dtype_name(a.out.dtype)));
  if (a.weights.dtype != DType::kF32)
    return unsupported(strfmt("cuda moe_experts: weights dtype %s (f32 only)", dtype_name(a.weights.dtype)));
  if (a.idx.dim(-1) > kMaxTopK)
    return unsupported(strfmt("cuda moe_experts: top-k %lld (at most %d)", static_cast<long long>(a.idx.dim(-1)),
                              kMaxTopK));
  if (wt == DType::kBF16)
    return xt == DType::kBF16 ? experts_typed<bf16, bf16>(a, scratch, stream) : experts_typed<bf16, float>(a, scratch, stream);
  return xt == DType::kBF16 ? experts_typed<float, bf16>(a, scratch, stream) : experts_typed<float, float>(a, scratch, stream);
}

}  // namespace tandem::cuda
