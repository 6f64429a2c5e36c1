// Attention of a prompt chunk (many bf16 query tokens, ops.h AttentionArgs, spec §1.6) on the tensor cores,
// flash-attention style: one block of four warps per (64 query rows, KV head), the rows being the query heads of the
// KV head's GQA group for consecutive tokens. Each warp owns 16 rows across the whole head dim (at head dim 512, a
// pair of warps shares them, one half of the dims each: Geo): S = Q K^T for a tile of 32 keys stays in its
// registers, the online softmax runs there (a row's four lanes reduce by shuffles), and the
// probabilities, rounded to bf16, are the A operand of O += P V without a trip through shared memory. Q is staged in
// shared memory once; K/V tiles stream through a double-buffered cp.async pipeline, every block reading the union of
// its tokens' key ranges. attention_decode.cu's kernel splits the head dim across warps and sums partial scores
// through shared memory, which suits a few rows over a long context; here the rows are many. Numerics as that
// kernel: f32 scores of exact bf16 products times `scale`, bf16 probabilities whose rounded values the running sum
// adds, f32 accumulation, bf16 out; a row that sees no key is zeros.
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/warp_mma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kAutoRows = 64;  // rows per block that the launch sizes below count in
constexpr int kBN = 32;        // keys per tile
constexpr int kMinTokens = 32;  // fewer tokens (decode, verify) stay on attention_decode.cu's kernel
// kAuto's fewest blocks: with fewer, the decode kernel, which also splits the keys, is faster (bench/RESULTS.md run
// BK, `cuda_bench --prefill-attention` on an H200: flash / decode kernel 2.2-2.4x at 8-16 blocks, 0.99-1.8x at 32,
// 0.86-1.01x at 64, 0.45-0.55x at 128; a long prompt's 1024-token chunks are 128-512 blocks). At head dim 512, whose
// blocks are twice the warps (one block per SM), 128 (run BL, an H100: 31B's full layers 1.46x at 64 blocks,
// 0.73-0.87x from 128).
constexpr int64_t kAutoMinBlocks = 64, kAutoMinBlocks512 = 128;
// The wgmma form's default warpgroups per block: two from this many 64-row blocks (run BL, an H100: two beat one by
// 4-7% from 256 blocks, one beat two by 4-15% below), else one.
constexpr int64_t kTwoGroupsMinBlocks = 256;
constexpr int kWgmmaAuto = -1;

// Geometry for head dim HD. Up to 256, one warp per 16 rows holds them across the whole head dim. At 512, whose
// accumulator would not fit a warp's registers, two warps share 16 rows, each holding O for one half of the dims:
// each computes its half's partial scores, the pair swaps them through shared memory and adds them (a + b is b + a
// bit for bit, so both warps hold the same scores and run the same softmax), then each multiplies P by its half of V.
// Shared memory: Q [kBM][HD] | stages x (K [kBN][HD] | V [kBN][HD]) | token ranges | (at 512) the warps' partial
// scores. Rows are 16-byte chunks XOR-swizzled by the row's low three bits, so ldmatrix's eight rows hit distinct
// banks. kWg > 0 (Hopper, head dims 64-256): each four warps are a warpgroup whose wgmma instructions read Q, K and V
// straight from shared memory (each K and V tile once for the group's 64 rows, where ldmatrix reads it once per
// warp); kWg warpgroups share a block's K/V tiles (two halve the tiles' copies per row; kWg 3: two, with four K/V
// stages instead of two, three tiles in flight). The tiles are then stored as 64-column blocks of 128-byte rows with
// the 128-byte swizzle (wgmma.cuh), from a 1024-byte aligned base.
template <int HD, int kWg = 0>
struct Geo {
  static constexpr int kRowWarps = kWg >= 2 ? 8 : 4;  // warps along the rows: 16 query rows each
  static constexpr int kStages = kWg == 3 ? 4 : 2;    // K/V tiles in flight + 1
  static constexpr int kBM = 16 * kRowWarps;          // query rows per block
  static constexpr int kHalves = HD > 256 ? 2 : 1;    // warps per 16 rows
  static constexpr int kDh = HD / kHalves;            // head dims per warp
  static constexpr int kThreads = kRowWarps * kHalves * kWarp;
  static constexpr int kChunks = HD / 8;
  static constexpr size_t kQElems = size_t{kBM} * HD;
  static constexpr size_t kTileElems = size_t{kBN} * HD;
  static constexpr size_t kKvOffset = kQElems;  // elements
  static constexpr size_t kRangeOffset = (kQElems + size_t{kStages} * 2 * kTileElems) * sizeof(bf16);
  static constexpr size_t kSwapOffset = kRangeOffset + 2 * kBM * sizeof(int);
  static constexpr size_t kSwapBytes = kHalves > 1 ? size_t{kThreads} / kWarp * 16 * kBN * sizeof(float) : 0;
  static constexpr size_t kSmem = kSwapOffset + kSwapBytes + (kWg ? 1024 : 0);  // wgmma: room to align to 1024
  static constexpr int kMinBlocks = kThreads > 128 ? 1 : 2;
  static_assert(kHalves == 1 || kDh % 64 == 0, "a warp's first chunk is a multiple of 8 (the swizzle's period)");
  static_assert(!kWg || (kHalves == 1 && HD % 64 == 0), "wgmma: one warpgroup, whole 64-column blocks");
  static_assert(kChunks >= 8, "the swizzle needs rows of at least 8 chunks");
  static_assert((kBM * kChunks) % kThreads == 0 && (2 * kBN * kChunks) % kThreads == 0, "whole copies per thread");
  static_assert(kSmem <= 227 * 1024, "fits in an SM's shared memory");
};

__device__ __forceinline__ int swz(int row, int chunk) { return (chunk ^ (row & 7)) * 8; }
// The same for an even chunk c2 known at compile time plus a lane's x = (its odd bit) ^ (row & 7): c2's high bits
// become an immediate, and four registers serve every c2.
__device__ __forceinline__ int swz_even(int c2, int x) { return ((c2 & ~7) + ((c2 & 7) ^ x)) * 8; }
// Element offset of chunk c of row r in a tile of `rows` rows, in either kernel's layout.
template <int HD, int kWg>
__device__ __forceinline__ int tile_offset(int r, int c, int rows) {
  if constexpr (kWg) return static_cast<int>(sw128_offset(r, c, rows) / sizeof(bf16));
  return r * HD + swz(r, c);
}

using PrefillParams = TcAttnInputs;

// Grid (row chunk, KV head). mma fragments: gq = lane / 4, tq = lane % 4; in S and O a thread holds rows gq and
// gq + 8 of its warp's 16, columns 2 tq and 2 tq + 1 of each 8-wide n-tile.
template <int HD, int kWg>
__global__ void __launch_bounds__(Geo<HD, kWg>::kThreads, Geo<HD, kWg>::kMinBlocks)
    attention_prefill_kernel(PrefillParams p) {
  pdl_enter();
  using G = Geo<HD, kWg>;
  constexpr int kThreads = G::kThreads, kBM = G::kBM, kRowWarps = G::kRowWarps;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + (kWg ? (1024u - (smem_u32(smem_raw) & 1023u)) & 1023u : 0u);
  bf16* s_q = reinterpret_cast<bf16*>(smem);
  bf16* s_kv = s_q + G::kKvOffset;
  int* s_lo = reinterpret_cast<int*>(smem + G::kRangeOffset);  // visible keys of token t0 + i: [lo, hi)
  int* s_hi = s_lo + kBM;

  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  // This warp's 16 rows, and its half of the dims (compile-time 0 with one warp per row group, so that every
  // swizzled offset below stays an immediate).
  const int rw = G::kHalves > 1 ? warp % kRowWarps : warp, dh = G::kHalves > 1 ? warp / kRowWarps : 0;
  const int c0 = dh * (G::kDh / 8);  // its first 16-byte chunk of a row
  const int gq = lane / 4, tq = lane % 4;
  const int kvh = blockIdx.y;
  const int row0 = blockIdx.x * kBM;
  const int n_rows = min(kBM, p.n_tok * p.group - row0);
  if (n_rows <= 0) return;
  const int t0 = row0 / p.group, n_ct = (row0 + n_rows - 1) / p.group - t0 + 1;

  // Query row r of the block (r < n_rows): element offset of its head_dim values in q and out.
  auto row_offset = [&](int r) {
    const int gr = row0 + r;
    return (static_cast<int64_t>(gr / p.group) * p.n_heads + kvh * p.group + gr % p.group) * HD;
  };

  // Q -> shared (zero rows past n_rows), in the first cp.async group with the first K/V tile.
  constexpr int kQCopies = kBM * G::kChunks / kThreads;
#pragma unroll
  for (int i = 0; i < kQCopies; ++i) {
    const int idx = tid + i * kThreads, r = idx / G::kChunks, c = idx % G::kChunks;
    const bool valid = r < n_rows;
    cp_async16(s_q + tile_offset<HD, kWg>(r, c, kBM), valid ? p.q + row_offset(r) + c * 8 : p.q, valid);
  }

  token_ranges(p, t0, n_ct, s_lo, s_hi);
  __syncthreads();
  const KvRange all = ranges_union(s_lo, s_hi, n_ct);  // the keys the block reads
  const int64_t kb = all.begin, ke = all.end;
  const int n_tiles = static_cast<int>((ke - kb + kBN - 1) / kBN);

  // This thread's two rows: their visible ranges (empty past n_rows).
  const int ra = rw * 16 + gq, rb = ra + 8;
  const int ta = (row0 + ra) / p.group - t0, tb = (row0 + rb) / p.group - t0;
  const int lo_a = ra < n_rows ? s_lo[ta] : 0, hi_a = ra < n_rows ? s_hi[ta] : 0;
  const int lo_b = rb < n_rows ? s_lo[tb] : 0, hi_b = rb < n_rows ? s_hi[tb] : 0;

  // K/V tile `tile` (keys kb + 32 tile ..) -> stage; keys past ke zero-filled (never read from memory).
  const bf16* kbase = p.k + kvh * p.k_stride_head;
  const bf16* vbase = p.v + kvh * p.v_stride_head;
  auto load_tile = [&](int tile, int stage) {
    const int64_t key0 = kb + static_cast<int64_t>(tile) * kBN;
    const int64_t slot0 = p.ring ? key0 % p.capacity : key0;
    bf16* dst0 = s_kv + stage * 2 * G::kTileElems;
    constexpr int kCopies = 2 * kBN * G::kChunks / kThreads;
#pragma unroll 1
    for (int i = 0; i < kCopies; ++i) {
      const int idx = tid + i * kThreads;
      const int which = idx / (kBN * G::kChunks);  // 0: K, 1: V
      const int kk = idx / G::kChunks % kBN, c = idx % G::kChunks;
      const bool valid = key0 + kk < ke;
      int64_t slot = slot0 + kk;  // a tile spans at most kBN <= capacity positions: one wrap at most
      if (p.ring && slot >= p.capacity) slot -= p.capacity;
      const bf16* base = which ? vbase : kbase;
      const int64_t stride = which ? p.v_stride_slot : p.k_stride_slot;
      cp_async16(dst0 + which * G::kTileElems + tile_offset<HD, kWg>(kk, c, kBN),
                 valid ? base + slot * stride + c * 8 : base, valid);
    }
  };

  constexpr int kDn = G::kDh / 8;  // n-tiles of this warp's O
  float o[kDn][4];
#pragma unroll
  for (int d = 0; d < kDn; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;
  // ldmatrix rows and swizzle keys of this lane: Q row qr; K rows kr, kr + 16 of a tile; V rows vr, vr + 16.
  const int qr = rw * 16 + lane % 16, xq = (lane / 16) ^ (qr & 7);
  const int kr = (lane / 16) * 8 + lane % 8, xk = ((lane / 8) % 2) ^ (lane % 8);
  const int vr = ((lane / 8) % 2) * 8 + lane % 8, xv = (lane / 16) ^ (lane % 8);

  // The first kStages - 1 tiles (Q rides in the first group), then one more per tile, kStages - 1 ahead; the stage
  // a load overwrites was last read in the iteration before, which ended with a barrier.
  constexpr int kStages = G::kStages;
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < n_tiles) load_tile(t, t);
    cp_async_commit();
  }
  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + kStages - 1 < n_tiles) load_tile(tile + kStages - 1, (tile + kStages - 1) % kStages);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    if constexpr (kWg) fence_proxy_async_smem();  // the copies, before the wgmma reads of them
    __syncthreads();  // this tile (and Q) are in shared memory for every thread
    const bf16* sk = s_kv + (tile % kStages) * 2 * G::kTileElems;
    const bf16* sv = sk + G::kTileElems;

    // S = Q K^T: 16 rows x 32 keys (four n-tiles), over this warp's dims.
    float s[4][4] = {};
    if constexpr (kWg) {
      // The warpgroup's 64 rows at once (they start 64 rows, 8 KB, into each of Q's column blocks per warpgroup
      // before them): k-step kk is 32 bytes into 64-column block kk / 4 of Q and of K.
      const uint32_t q_addr = smem_u32(s_q) + (warp / 4) * 64 * 128, k_addr = smem_u32(sk);
      wgmma_pin(s);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        const uint32_t off = (kk % 4) * 32;
        wgmma_m64n32k16_ss(s, wgmma_desc(q_addr + (kk / 4) * kBM * 128 + off, 1024, 1024),
                           wgmma_desc(k_addr + (kk / 4) * kBN * 128 + off, 1024, 1024), kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_pin(s);
    } else {
#pragma unroll
      for (int kk = 0; kk < G::kDh / 16; ++kk) {
        uint32_t a[4];
        ldmatrix_x4(a, s_q + qr * HD + swz_even(c0 + 2 * kk, xq));
#pragma unroll
        for (int pj = 0; pj < 2; ++pj) {
          uint32_t b[4];
          ldmatrix_x4(b, sk + (kr + 16 * pj) * HD + swz_even(c0 + 2 * kk, xk));
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
          mma_bf16(s[2 * pj], a, b0);
          mma_bf16(s[2 * pj + 1], a, b1);
        }
      }
    }
    if constexpr (G::kHalves > 1) {
      // The pair's partial scores: write this warp's, wait for the pair (named barrier 1 + rw, its 64 threads),
      // add the other's. The slots are rewritten only after the tile's closing __syncthreads.
      float* swap = reinterpret_cast<float*>(smem + G::kSwapOffset);
      float* mine = swap + warp * (16 * kBN);
      const float* other = swap + (warp ^ kRowWarps) * (16 * kBN);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(4 * j + e) * kWarp + lane] = s[j][e];
      asm volatile("bar.sync %0, %1;" ::"r"(1 + rw), "r"(2 * kWarp) : "memory");
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] += other[(4 * j + e) * kWarp + lane];
    }

    // Mask, online softmax in base 2, P rounded to bf16 (packed as the A fragments of P V). A tile whose keys every
    // row of the warp sees (rows past n_rows count as seeing them: their scores are finite and never written) skips
    // the per-key test, and then every score is finite, which the exponentials' -inf tests need not check: the same
    // values either way.
    const int64_t key0 = kb + static_cast<int64_t>(tile) * kBN;
    const bool sees_all = (ra >= n_rows || (key0 >= lo_a && key0 + kBN <= hi_a)) &&
                          (rb >= n_rows || (key0 >= lo_b && key0 + kBN <= hi_b));
    const bool whole = __all_sync(0xffffffffu, sees_all);
    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = key0 + 8 * j + 2 * tq + (e & 1);
        const bool row_b = e >= 2;
        const bool vis = whole || (row_b ? key >= lo_b && key < hi_b : key >= lo_a && key < hi_a);
        s[j][e] = vis ? s[j][e] * p.scale_log2 : -INFINITY;
        if (row_b) {
          mx_b = fmaxf(mx_b, s[j][e]);
        } else {
          mx_a = fmaxf(mx_a, s[j][e]);
        }
      }
#pragma unroll
    for (int off = 1; off <= 2; off *= 2) {
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, off));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, off));
    }
    const float mn_a = fmaxf(m_a, mx_a), mn_b = fmaxf(m_b, mx_b);
    const float c_a = mn_a == -INFINITY ? 1.f : exp2f(m_a - mn_a);  // m = -inf: o and l are still 0
    const float c_b = mn_b == -INFINITY ? 1.f : exp2f(m_b - mn_b);
    m_a = mn_a;
    m_b = mn_b;
    uint32_t pa[4][2];  // n-tile j: [0] row gq, [1] row gq + 8
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float p0 = !whole && s[j][0] == -INFINITY ? 0.f : exp2f(s[j][0] - mn_a);
      const float p1 = !whole && s[j][1] == -INFINITY ? 0.f : exp2f(s[j][1] - mn_a);
      const float p2 = !whole && s[j][2] == -INFINITY ? 0.f : exp2f(s[j][2] - mn_b);
      const float p3 = !whole && s[j][3] == -INFINITY ? 0.f : exp2f(s[j][3] - mn_b);
      const __nv_bfloat162 h01 = __floats2bfloat162_rn(p0, p1), h23 = __floats2bfloat162_rn(p2, p3);
      sum_a += __low2float(h01) + __high2float(h01);
      sum_b += __low2float(h23) + __high2float(h23);
      pa[j][0] = bf162_bits(h01);
      pa[j][1] = bf162_bits(h23);
    }
#pragma unroll
    for (int off = 1; off <= 2; off *= 2) {
      sum_a += __shfl_xor_sync(0xffffffffu, sum_a, off);
      sum_b += __shfl_xor_sync(0xffffffffu, sum_b, off);
    }
    l_a = l_a * c_a + sum_a;
    l_b = l_b * c_b + sum_b;
    // Once the rows' maxima settle, the factors are 1 and O stays as it is (x * 1 is x): the warp skips the scaling.
    if (__any_sync(0xffffffffu, c_a != 1.f || c_b != 1.f)) {
#pragma unroll
      for (int d = 0; d < kDn; ++d) {
        o[d][0] *= c_a;
        o[d][1] *= c_a;
        o[d][2] *= c_b;
        o[d][3] *= c_b;
      }
    }

    // O += P V: two k-steps of 16 keys; V^T fragments by transposed ldmatrix, two dim n-tiles per load (kWg: V as
    // wgmma's MN-major B, 64 dims per instruction; a k-step is 16 rows of 128 bytes, two swizzle atoms).
    if constexpr (kWg) {
      const uint32_t v_addr = smem_u32(sv);
      wgmma_pin(o);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const uint32_t a[4] = {pa[2 * ks][0], pa[2 * ks][1], pa[2 * ks + 1][0], pa[2 * ks + 1][1]};
#pragma unroll
        for (int nb = 0; nb < HD / 64; ++nb)
          wgmma_m64n64k16_rs_tb(*reinterpret_cast<float(*)[8][4]>(&o[8 * nb]), a,
                                wgmma_desc(v_addr + nb * kBN * 128 + ks * 16 * 128, 1024, 1024));
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_pin(o);
    } else {
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const uint32_t a[4] = {pa[2 * ks][0], pa[2 * ks][1], pa[2 * ks + 1][0], pa[2 * ks + 1][1]};
#pragma unroll
        for (int dq = 0; dq < kDn / 2; ++dq) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, sv + (vr + 16 * ks) * HD + swz_even(c0 + 2 * dq, xv));
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
          mma_bf16(o[2 * dq], a, b0);
          mma_bf16(o[2 * dq + 1], a, b1);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration's load overwrites it
  }
  cp_async_wait<0>();  // Q's copies when there was no tile (the block then writes zeros)

  // O / l as bf16 (a row that saw no key: zeros, never 0/0); out may alias q, whose rows this block alone read.
  const float inv_a = l_a > 0.f ? 1.f / l_a : 0.f, inv_b = l_b > 0.f ? 1.f / l_b : 0.f;
  bf16* out_a = ra < n_rows ? p.out + row_offset(ra) : nullptr;
  bf16* out_b = rb < n_rows ? p.out + row_offset(rb) : nullptr;
#pragma unroll
  for (int d = 0; d < kDn; ++d) {
    const int col = dh * G::kDh + 8 * d + 2 * tq;
    if (out_a != nullptr)
      *reinterpret_cast<__nv_bfloat162*>(out_a + col) = __floats2bfloat162_rn(o[d][0] * inv_a, o[d][1] * inv_a);
    if (out_b != nullptr)
      *reinterpret_cast<__nv_bfloat162*>(out_b + col) = __floats2bfloat162_rn(o[d][2] * inv_b, o[d][3] * inv_b);
  }
}

template <int HD, int kWg = 0>
Status launch_hd(const PrefillParams& p, int64_t n_kv, cudaStream_t stream) {
  using G = Geo<HD, kWg>;
  constexpr auto kernel = attention_prefill_kernel<HD, kWg>;
  TANDEM_CUDA_TRY(allow_dynamic_smem<kernel>(G::kSmem));  // over the 48 KB default
  const int64_t rows = static_cast<int64_t>(p.n_tok) * p.group;
  const dim3 grid(static_cast<unsigned>((rows + G::kBM - 1) / G::kBM), static_cast<unsigned>(n_kv));
  launch_kernel(kernel, grid, G::kThreads, G::kSmem, stream, p);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

// The launch of head dim HD's form: mma.sync (wg 0) or wgmma with wg warpgroups per block.
template <int HD>
Status launch_form(const PrefillParams& p, int64_t n_kv, int wg, cudaStream_t stream) {
  if (wg == 1) return launch_hd<HD, 1>(p, n_kv, stream);
  if (wg == 2) return launch_hd<HD, 2>(p, n_kv, stream);
  if (wg == 3) return launch_hd<HD, 3>(p, n_kv, stream);
  return launch_hd<HD>(p, n_kv, stream);
}

std::atomic<int>& mode_flag() {
  static std::atomic<int> mode{[] {
    const char* e = std::getenv("TANDEM_ATTN_PREFILL");
    if (e != nullptr && (std::strcmp(e, "0") == 0 || std::strcmp(e, "off") == 0))
      return static_cast<int>(PrefillAttention::kOff);
    if (e != nullptr && std::strcmp(e, "always") == 0) return static_cast<int>(PrefillAttention::kAlways);
    return static_cast<int>(PrefillAttention::kAuto);
  }()};
  return mode;
}

std::atomic<bool>& wide_flag() {  // head dim 512
  static std::atomic<bool> on{[] {
    const char* e = std::getenv("TANDEM_ATTN_PREFILL_512");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }()};
  return on;
}

std::atomic<int>& wgmma_flag() {
  static std::atomic<int> groups{[] {
    const char* e = std::getenv("TANDEM_ATTN_PREFILL_WGMMA");
    if (e != nullptr && e[0] >= '0' && e[0] <= '3' && e[1] == '\0') return e[0] - '0';
    return kWgmmaAuto;
  }()};
  return groups;
}

// Whether the current device runs the kernel's sm_90a code: the build has it (TANDEM_CUDA_ARCHS lists 90a) and the
// device is compute capability 9.0 (attribute queries: no synchronisation, cheap beside a prompt chunk's launch).
bool wgmma_runs_here() {
  static const bool built = std::strstr(TANDEM_CUDA_ARCHS, "90a") != nullptr;
  int dev = 0, major = 0, minor = 0;
  return built && cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
         minor == 0;
}

// A launch's size in blocks of kAutoRows query rows, the unit of the thresholds above.
int64_t auto_blocks(int64_t n_tok, int64_t group, int64_t n_kv) {
  return (n_tok * group + kAutoRows - 1) / kAutoRows * n_kv;
}

}  // namespace

void set_prefill_attention(PrefillAttention m) { mode_flag().store(static_cast<int>(m), std::memory_order_relaxed); }
PrefillAttention prefill_attention() {
  return static_cast<PrefillAttention>(mode_flag().load(std::memory_order_relaxed));
}
void set_prefill_attention_512(bool on) { wide_flag().store(on, std::memory_order_relaxed); }
bool prefill_attention_512() { return wide_flag().load(std::memory_order_relaxed); }
void set_prefill_attention_wgmma(int warpgroups) {
  wgmma_flag().store(warpgroups >= kWgmmaAuto && warpgroups <= 3 ? warpgroups : 0, std::memory_order_relaxed);
}
int prefill_attention_wgmma() { return wgmma_flag().load(std::memory_order_relaxed); }

bool attention_prefill_applies(const AttentionArgs& a) {
  const PrefillAttention mode = prefill_attention();
  if (mode == PrefillAttention::kOff || !tc_attention_operands_ok(a)) return false;
  const int64_t n_tok = a.q.shape[0], n_heads = a.q.shape[1], head_dim = a.q.shape[2], n_kv = a.kv.k.shape[0];
  const bool dims_ok =
      head_dim == 64 || head_dim == 128 || head_dim == 256 || (head_dim == 512 && prefill_attention_512());
  if (!dims_ok || n_tok < kMinTokens) return false;
  const int64_t blocks = auto_blocks(n_tok, n_heads / n_kv, n_kv);
  return mode == PrefillAttention::kAlways || blocks >= (head_dim == 512 ? kAutoMinBlocks512 : kAutoMinBlocks);
}

Status launch_attention_prefill(const AttentionArgs& a, cudaStream_t stream) {
  const PrefillParams p = tc_attention_inputs(a);
  const int64_t n_kv = a.kv.k.shape[0];
  int wg = p.head_dim <= 256 && wgmma_runs_here() ? prefill_attention_wgmma() : 0;
  if (wg == kWgmmaAuto) wg = auto_blocks(p.n_tok, p.group, n_kv) >= kTwoGroupsMinBlocks ? 2 : 1;
  switch (p.head_dim) {
    case 64:
      return launch_form<64>(p, n_kv, wg, stream);
    case 128:
      return launch_form<128>(p, n_kv, wg, stream);
    case 256:
      return launch_form<256>(p, n_kv, wg, stream);
    default:
      return launch_hd<512>(p, n_kv, stream);
  }
}

}  // namespace tandem::cuda
