// Attention of bf16 queries over bf16 K/V on the tensor cores (ops.h AttentionArgs, spec §1.6), flash-decoding
// style: decode, speculative verify and the drafter (a few query tokens over a long context) and prompt chunks (any
// number of tokens). One block per (KV head, split of the keys, chunk of at most 40 query rows), the rows being every
// query head of the KV head's GQA group for each of the chunk's tokens, so each K/V row is read from memory once per
// split and chunk; a block reads the union of its own tokens' key ranges (a causal chunk stops at its last token).
// K/V tiles stream through a cp.async pipeline into shared memory; S^T = K Q^T and O^T += V^T P^T run as bf16
// mma.sync with f32 accumulation, warp w owning head dims [64w, 64w + 64) of both (its partial scores are summed
// across warps), and the online softmax runs in f32 in between. Split-K partial states go to the stream's workspace
// and attention.cu's combine kernel merges them.
// Numerics: scores are f32 sums of exact bf16 products, times `scale` (as the reference); the probabilities are
// rounded to bf16 for the P V product (<= 2^-9 relative per weight, and the running sum adds the rounded values, so
// the weights stay normalised), well inside the bf16 output's own rounding.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/warp_mma.cuh"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kMaxChunkRows = 40;       // query rows per block (5 mma n-tiles): bounds the accumulator registers,
                                        // and the tokens a chunk touches (at least one row each)
constexpr int kMaxHeadDim = 512;        // Gemma 4's full-attention head dim
constexpr int kMinSplitKeys = 32;       // fewest keys worth a split of their own (TANDEM_ATTN_SPLIT_KEYS overrides)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Geometry of the kernel with NW warps and NT n-tiles (8 query rows each): the head dim padded to 64 NW, TK keys
// per pipeline stage, and the shared-memory layout: K/V stages | partial scores per warp | P | row stats | token
// ranges.
template <int NW, int NT>
struct Geo {
  static constexpr int kThreads = 32 * NW;
  static constexpr int kHd = 64 * NW;
  static constexpr int kTk = NW == 8 ? 16 : 32;  // 32 KB of K+V per stage at head_dim 512 and 256
  static constexpr int kStages = 4;               // three stages in flight while one is computed
  static constexpr int kRows = 8 * NT;
  static constexpr int kChunks = kHd / 8;        // 16-byte chunks of a K/V row
  static constexpr int kSxStride = kTk + 4;      // floats; = 4 mod 16: conflict-free fragment stores
  static constexpr int kPStride = kTk + 8;       // bf16; 16-byte aligned rows, conflict-free ldmatrix
  static constexpr int kOStride = kHd + 4;       // floats, the epilogue's staging of the output rows
  static constexpr int kTileElems = kTk * kHd;   // one K or V tile
  static constexpr size_t kKvBytes = size_t{kStages} * 2 * kTileElems * sizeof(bf16);
  static constexpr size_t kSxBytes = size_t{NW} * kRows * kSxStride * sizeof(float);
  static constexpr size_t kPBytes = size_t{kRows} * kPStride * sizeof(bf16);
  static constexpr size_t kStatBytes = 3 * kRows * sizeof(float) + 2 * kMaxChunkRows * sizeof(int);
  static constexpr size_t kSmem = kKvBytes + kSxBytes + kPBytes + kStatBytes;
  static constexpr int kCopiesPerThread = 2 * kTileElems / 8 / kThreads;  // 16-byte cp.async per stage
  static_assert(kCopiesPerThread * kThreads * 8 == 2 * kTileElems, "whole tiles per stage");
  static_assert(kSxBytes % 16 == 0 && kPBytes % 16 == 0 && kKvBytes % 16 == 0, "16-byte aligned regions");
  static_assert(size_t{kRows} * kOStride * sizeof(float) <= kKvBytes, "output staging fits in the K/V stages");
  static_assert(kSmem <= 227 * 1024, "fits in an SM's shared memory");
};

struct DecodeParams : TcAttnInputs {
  int chunk_rows;               // query rows per block (the last chunk may have fewer)
  int n_splits;                 // splits launched (>= those the range needs: the trailing ones may be empty)
  int split_target;             // the range is cut into this many splits of at least min_split_keys keys
  int min_split_keys;
  float* partial;               // split-K partial states (attention_common.cuh layout) when n_splits > 1
};

// Grid (row chunk, split, KV head). mma fragment coordinates: gq = lane / 4, tq = lane % 4. In S^T (keys x rows) and
// O^T (head dims x rows) a thread holds rows 8j + 2tq, 8j + 2tq + 1 of n-tile j.
template <int NW, int NT>
__global__ void __launch_bounds__(32 * NW, 1) attention_decode_kernel(DecodeParams p) {
  pdl_enter();
  using G = Geo<NW, NT>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* s_kv = reinterpret_cast<bf16*>(smem);                        // [stage][K|V][key][16-byte chunk, swizzled]
  float* s_x = reinterpret_cast<float*>(smem + G::kKvBytes);         // [warp][row][key] partial scores
  bf16* s_p = reinterpret_cast<bf16*>(smem + G::kKvBytes + G::kSxBytes);  // [row][key] probabilities
  float* s_m = reinterpret_cast<float*>(smem + G::kKvBytes + G::kSxBytes + G::kPBytes);  // running max (base 2)
  float* s_l = s_m + G::kRows;                                       // running sum
  float* s_corr = s_l + G::kRows;                                    // this tile's rescale of the accumulator
  int* s_lo = reinterpret_cast<int*>(s_corr + G::kRows);             // visible keys of token t0 + i: [lo, hi)
  int* s_hi = s_lo + kMaxChunkRows;

  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int gq = lane / 4, tq = lane % 4;
  const int split = blockIdx.y, kvh = blockIdx.z;
  const int row0 = blockIdx.x * p.chunk_rows;
  const int n_rows = min(p.chunk_rows, p.n_tok * p.group - row0);
  const int hd = p.head_dim;
  if (n_rows <= 0) return;  // the whole block: no chunk is empty for the shapes the host makes
  // The chunk's tokens: t0 .. t0 + n_ct - 1 (n_ct <= n_rows <= kMaxChunkRows).
  const int t0 = row0 / p.group, n_ct = (row0 + n_rows - 1) / p.group - t0 + 1;

  token_ranges(p, t0, n_ct, s_lo, s_hi);
  for (int r = tid; r < G::kRows; r += G::kThreads) {
    s_m[r] = -INFINITY;
    s_l[r] = 0.f;
  }

  // This warp's head dims of the block's query rows as B fragments of S^T = K Q^T (zero past the rows and the head
  // dim), read before any output is written (out may alias q; other blocks write other rows, or the combine does).
  uint32_t qf[NT][4][2];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int r = 8 * j + gq;
    const bf16* qrow = p.q;
    if (r < n_rows) {
      const int gr = row0 + r;
      qrow = p.q + (static_cast<int64_t>(gr / p.group) * p.n_heads + kvh * p.group + gr % p.group) * hd;
    }
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const int d = warp * 64 + kk * 16 + 2 * tq;  // hd % 8 == 0: an 8-dim group is all in or all out
      qf[j][kk][0] = r < n_rows && d < hd ? *reinterpret_cast<const uint32_t*>(qrow + d) : 0u;
      qf[j][kk][1] = r < n_rows && d + 8 < hd ? *reinterpret_cast<const uint32_t*>(qrow + d + 8) : 0u;
    }
  }
  __syncthreads();

  // The union of the chunk's tokens' ranges, and this split's share of it: split_target splits of at least
  // min_split_keys keys in whole tiles. The cut depends only on the range, not on how many splits were launched, so a
  // launch sized for a long context (a graph) leaves the trailing splits empty at a short one and gives the eager
  // launch's bits.
  const KvRange all = ranges_union(s_lo, s_hi, n_ct);
  const int64_t lo_all = all.begin, hi_all = all.end;
  // The third term only acts when the range outgrew the launch's sizing (queries far apart under a window, or a
  // device end past the host's): the launched splits then still cover every key.
  const int64_t span = hi_all - lo_all;
  int64_t per = max(max((span + p.split_target - 1) / p.split_target, static_cast<int64_t>(p.min_split_keys)),
                    (span + p.n_splits - 1) / p.n_splits);
  per = (per + G::kTk - 1) / G::kTk * G::kTk;
  const int64_t kb = min(hi_all, lo_all + per * split), ke = min(hi_all, kb + per);
  const int n_tiles = static_cast<int>((ke - kb + G::kTk - 1) / G::kTk);

  // Stage `stage` <- keys [kb + tile TK, +TK) of K and V; keys past ke and head dims past hd are zero-filled, so
  // nothing outside the stored range is read and padded dims add nothing.
  const bf16* kbase = p.k + kvh * p.k_stride_head;
  const bf16* vbase = p.v + kvh * p.v_stride_head;
  auto load_tile = [&](int tile, int stage) {
    const int64_t key0 = kb + static_cast<int64_t>(tile) * G::kTk;
    const int64_t slot0 = p.ring ? key0 % p.capacity : key0;
    bf16* dst0 = s_kv + stage * 2 * G::kTileElems;
#pragma unroll
    for (int it = 0; it < G::kCopiesPerThread; ++it) {
      const int idx = tid + it * G::kThreads;
      const int which = idx / (G::kTk * G::kChunks);  // 0: K, 1: V
      const int kk = idx / G::kChunks % G::kTk, ch = idx % G::kChunks;
      const bool valid = key0 + kk < ke && ch * 8 < hd;
      // Keys of [kb, ke) span at most `capacity` positions, so a ring slot wraps at most once within a tile.
      int64_t slot = slot0 + kk;
      if (p.ring && slot >= p.capacity) slot -= p.capacity;
      const bf16* base = which ? vbase : kbase;
      const int64_t stride = which ? p.v_stride_slot : p.k_stride_slot;
      bf16* dst = dst0 + which * G::kTileElems + kk * G::kHd + ((ch ^ (kk & 7)) * 8);
      cp_async16(dst, valid ? base + slot * stride + ch * 8 : base, valid);
    }
  };

  float acc[4][NT][4] = {};  // O^T: this warp's 64 head dims (4 m-tiles) x the block's rows
#pragma unroll
  for (int s = 0; s < G::kStages - 1; ++s) {
    if (s < n_tiles) load_tile(s, s);
    cp_async_commit();
  }

  for (int tile = 0; tile < n_tiles; ++tile) {
    cp_async_wait<G::kStages - 2>();
    __syncthreads();  // the tile is in shared memory for every thread; the previous tile's readers are done
    {
      const int next = tile + G::kStages - 1;
      if (next < n_tiles) load_tile(next, next % G::kStages);
      cp_async_commit();
    }
    const bf16* sk = s_kv + (tile % G::kStages) * 2 * G::kTileElems;
    const bf16* sv = sk + G::kTileElems;

    // 1. Partial scores over this warp's dims: S^T[key][row] = K[key, dims] . Q[row, dims].
    float* sx = s_x + warp * G::kRows * G::kSxStride;
#pragma unroll
    for (int mt = 0; mt < G::kTk / 16; ++mt) {
      float c[NT][4] = {};
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const int key = mt * 16 + lane % 8 + (lane / 8 % 2) * 8;
        const int ch = warp * 8 + kk * 2 + lane / 16;
        uint32_t a[4];
        ldmatrix_x4(a, sk + key * G::kHd + ((ch ^ (key & 7)) * 8));
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_bf16(c[j], a, qf[j][kk]);
      }
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int r = 8 * j + 2 * tq, key = mt * 16 + gq;
        sx[r * G::kSxStride + key] = c[j][0];
        sx[(r + 1) * G::kSxStride + key] = c[j][1];
        sx[r * G::kSxStride + key + 8] = c[j][2];
        sx[(r + 1) * G::kSxStride + key + 8] = c[j][3];
      }
    }
    __syncthreads();

    // 2. Online softmax, kLpr lanes per row with 4 keys each: sum the warps' partials, mask, new running max,
    // P = exp2(s - max) rounded to bf16 for the tensor cores (the sum adds the rounded values, so the weights the
    // output divides by are the ones it used).
    constexpr int kLpr = G::kTk / 4, kRowsPerPass = G::kThreads / kLpr;
    const int64_t key0 = kb + static_cast<int64_t>(tile) * G::kTk;
    for (int r = tid / kLpr; r < G::kRows; r += kRowsPerPass) {  // whole warps iterate together (kRows % 8 == 0)
      const int k4 = tid % kLpr * 4;
      float4 s4 = *reinterpret_cast<const float4*>(s_x + r * G::kSxStride + k4);
#pragma unroll
      for (int w = 1; w < NW; ++w) {
        const float4 o = *reinterpret_cast<const float4*>(s_x + (w * G::kRows + r) * G::kSxStride + k4);
        s4.x += o.x;
        s4.y += o.y;
        s4.z += o.z;
        s4.w += o.w;
      }
      float s[4] = {s4.x, s4.y, s4.z, s4.w};
      int64_t lo = 0, hi = 0;  // padding rows see nothing
      if (r < n_rows) {
        const int t = (row0 + r) / p.group - t0;
        lo = s_lo[t];
        hi = s_hi[t];
      }
      float tmax = -INFINITY;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = key0 + k4 + e;
        s[e] = key < ke && key >= lo && key < hi ? s[e] * p.scale_log2 : -INFINITY;
        tmax = fmaxf(tmax, s[e]);
      }
#pragma unroll
      for (int off = kLpr / 2; off > 0; off /= 2) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
      const float m_old = s_m[r], m_new = fmaxf(m_old, tmax);
      const float corr = m_new == -INFINITY ? 1.f : exp2f(m_old - m_new);  // m_old = -inf: acc and l are 0
      uint32_t pbits[2];
      float psum = 0.f;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float p0 = s[2 * e] == -INFINITY ? 0.f : exp2f(s[2 * e] - m_new);
        const float p1 = s[2 * e + 1] == -INFINITY ? 0.f : exp2f(s[2 * e + 1] - m_new);
        const __nv_bfloat162 pb = __floats2bfloat162_rn(p0, p1);
        psum += __low2float(pb) + __high2float(pb);
        pbits[e] = bf162_bits(pb);
      }
      *reinterpret_cast<uint2*>(s_p + r * G::kPStride + k4) = make_uint2(pbits[0], pbits[1]);
#pragma unroll
      for (int off = kLpr / 2; off > 0; off /= 2) psum += __shfl_xor_sync(0xffffffffu, psum, off);
      if (tid % kLpr == 0) {  // after the shuffles: every lane of the row has read s_m[r]
        s_m[r] = m_new;
        s_l[r] = s_l[r] * corr + psum;
        s_corr[r] = corr;
      }
    }
    __syncthreads();

    // 3. O^T = O^T * corr + V^T P^T over this warp's dims.
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const float c0 = s_corr[8 * j + 2 * tq], c1 = s_corr[8 * j + 2 * tq + 1];
#pragma unroll
      for (int dm = 0; dm < 4; ++dm) {
        acc[dm][j][0] *= c0;
        acc[dm][j][1] *= c1;
        acc[dm][j][2] *= c0;
        acc[dm][j][3] *= c1;
      }
    }
#pragma unroll
    for (int ks = 0; ks < G::kTk / 16; ++ks) {
      uint32_t b[NT][2];
      const int pcol = ks * 16 + (lane / 8 % 2) * 8;
#pragma unroll
      for (int j = 0; j + 1 < NT; j += 2) {
        uint32_t t4[4];
        ldmatrix_x4(t4, s_p + (8 * j + lane % 8 + (lane / 16) * 8) * G::kPStride + pcol);
        b[j][0] = t4[0];
        b[j][1] = t4[1];
        b[j + 1][0] = t4[2];
        b[j + 1][1] = t4[3];
      }
      if constexpr (NT % 2 == 1) ldmatrix_x2(b[NT - 1], s_p + (8 * (NT - 1) + lane % 8) * G::kPStride + pcol);
#pragma unroll
      for (int dm = 0; dm < 4; ++dm) {
        const int key = ks * 16 + lane % 8 + (lane / 16) * 8;
        const int ch = warp * 8 + dm * 2 + lane / 8 % 2;
        uint32_t a[4];
        ldmatrix_x4_trans(a, sv + key * G::kHd + ((ch ^ (key & 7)) * 8));
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_bf16(acc[dm][j], a, b[j]);
      }
    }
  }

  // Epilogue: stage O (f32) in the drained K/V buffers, then write whole rows: the normalised output, or the
  // partial state (max back in natural-log units) for the combine.
  cp_async_wait<0>();
  __syncthreads();
  float* so = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int dm = 0; dm < 4; ++dm)
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const int r = 8 * j + 2 * tq, d = warp * 64 + dm * 16 + gq;
      so[r * G::kOStride + d] = acc[dm][j][0];
      so[(r + 1) * G::kOStride + d] = acc[dm][j][1];
      so[r * G::kOStride + d + 8] = acc[dm][j][2];
      so[(r + 1) * G::kOStride + d + 8] = acc[dm][j][3];
    }
  __syncthreads();
  const int half = hd / 2;
  for (int idx = tid; idx < n_rows * half; idx += G::kThreads) {
    const int r = idx / half, d = 2 * (idx % half), gr = row0 + r;
    const int64_t orow = static_cast<int64_t>(gr / p.group) * p.n_heads + kvh * p.group + gr % p.group;
    const float2 o = *reinterpret_cast<const float2*>(so + r * G::kOStride + d);
    if (p.n_splits == 1) {
      const float l = s_l[r];  // 0: no visible key, a zero row (never 0/0)
      *reinterpret_cast<__nv_bfloat162*>(p.out + orow * hd + d) =
          l > 0.f ? __floats2bfloat162_rn(o.x / l, o.y / l) : __floats2bfloat162_rn(0.f, 0.f);
    } else {
      *reinterpret_cast<float2*>(p.partial + (orow * p.n_splits + split) * (hd + 2) + d) = o;
    }
  }
  if (p.n_splits > 1) {
    for (int r = tid; r < n_rows; r += G::kThreads) {
      const int gr = row0 + r;
      const int64_t orow = static_cast<int64_t>(gr / p.group) * p.n_heads + kvh * p.group + gr % p.group;
      float* part = p.partial + (orow * p.n_splits + split) * (hd + 2);
      part[hd] = s_m[r] * kLn2;  // -inf stays -inf
      part[hd + 1] = s_l[r];
    }
  }
}

struct DecodeShape {
  int64_t rows_out;   // n_tok * n_heads: the combine's rows
  int64_t n_kv, n_chunks, max_keys;
};

// Opts the kernel in to its shared memory (over the 48 KB default; once per device), and returns how many of its
// blocks an SM holds (for the split count; a heuristic, so the first device's value serves every device).
template <int NW, int NT>
Result<int> prepare_kernel() {
  using G = Geo<NW, NT>;
  TANDEM_CUDA_TRY((allow_dynamic_smem<attention_decode_kernel<NW, NT>>(G::kSmem)));
  static std::atomic<int> blocks_per_sm{0};  // 0: not asked yet
  if (const int known = blocks_per_sm.load(std::memory_order_relaxed); known > 0) return known;
  int n = 0;
  TANDEM_CUDA_TRY(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_decode_kernel<NW, NT>, G::kThreads, G::kSmem));
  n = std::max(n, 1);
  blocks_per_sm.store(n, std::memory_order_relaxed);
  return n;
}

// kMinSplitKeys, or TANDEM_ATTN_SPLIT_KEYS (a tuning knob, rounded down to a multiple of 32), read once.
int min_split_keys() {
  static const int keys = [] {
    const char* e = std::getenv("TANDEM_ATTN_SPLIT_KEYS");
    const int v = e != nullptr ? std::atoi(e) : 0;
    return v >= 32 && v <= (1 << 20) ? v / 32 * 32 : kMinSplitKeys;
  }();
  return keys;
}

// Splits per (KV head, row chunk). The target: as many blocks as the SMs hold at once (rounded down: one block
// over that would run as a second wave of its own), within the workspace and the combine's limit. Launched: the
// target, or fewer when max_keys needs fewer splits of min_split_keys.
struct Splits {
  int target, launched;
};
Splits choose_splits(const DecodeShape& s, int64_t head_dim, int blocks_per_sm, int min_split_keys,
                     const Scratch& scratch) {
  if (scratch.data == nullptr) return {1, 1};
  const int64_t want = static_cast<int64_t>(std::max(scratch.sm_count, 1)) * blocks_per_sm;
  const int64_t split_bytes = s.rows_out * (head_dim + 2) * static_cast<int64_t>(sizeof(float));
  int64_t target = std::min(want / (s.n_kv * s.n_chunks), static_cast<int64_t>(scratch.bytes) / split_bytes);
  target = std::clamp<int64_t>(target, 1, kMaxAttnSplits);
  const int64_t needed = (s.max_keys + min_split_keys - 1) / min_split_keys;
  return {static_cast<int>(target), static_cast<int>(std::clamp<int64_t>(needed, 1, target))};
}

template <int NW, int NT>
Status launch_geo(DecodeParams p, const DecodeShape& s, const Scratch& scratch, cudaStream_t stream) {
  using G = Geo<NW, NT>;
  TANDEM_ASSIGN_OR_RETURN(const int blocks_per_sm, (prepare_kernel<NW, NT>()));
  p.min_split_keys = min_split_keys();
  const Splits sp = choose_splits(s, p.head_dim, blocks_per_sm, p.min_split_keys, scratch);
  p.split_target = sp.target;
  p.n_splits = sp.launched;
  const dim3 grid(static_cast<unsigned>(s.n_chunks), static_cast<unsigned>(p.n_splits),
                  static_cast<unsigned>(s.n_kv));
  launch_kernel(attention_decode_kernel<NW, NT>, grid, G::kThreads, G::kSmem, stream, p);
  TANDEM_CUDA_TRY_LAUNCH();
  if (p.n_splits == 1) return ok_status();
  return launch_attention_combine(p.out, DType::kBF16, p.partial, p.n_splits, s.rows_out, p.head_dim, stream);
}

template <int NW>
Status launch_nw(const DecodeParams& p, int nt, const DecodeShape& s, const Scratch& scratch, cudaStream_t stream) {
  switch (nt) {
    case 1: return launch_geo<NW, 1>(p, s, scratch, stream);
    case 2: return launch_geo<NW, 2>(p, s, scratch, stream);
    case 3: return launch_geo<NW, 3>(p, s, scratch, stream);
    case 4: return launch_geo<NW, 4>(p, s, scratch, stream);
    default: return launch_geo<NW, 5>(p, s, scratch, stream);
  }
}

// Most query tokens this kernel takes: all, or TANDEM_ATTN_TC_MAX_TOKENS (an A/B switch: 16 sends prompt chunks to
// the general kernel, as before prompt chunks ran here), read once.
int64_t max_tc_tokens() {
  static const int64_t tokens = [] {
    const char* e = std::getenv("TANDEM_ATTN_TC_MAX_TOKENS");
    const long long v = e != nullptr ? std::atoll(e) : 0;
    return v >= 1 ? static_cast<int64_t>(v) : int64_t{INT_MAX};
  }();
  return tokens;
}

}  // namespace

bool tc_attention_operands_ok(const AttentionArgs& a) {
  const KvView& kv = a.kv;
  if (a.q.dtype != DType::kBF16 || a.out.dtype != DType::kBF16 || kv.k.dtype != DType::kBF16 ||
      kv.v.dtype != DType::kBF16 || a.q.ndim != 3 || kv.k.ndim != 3 || kv.v.ndim != 3)
    return false;
  const int64_t n_tok = a.q.shape[0], n_heads = a.q.shape[1], n_kv = kv.k.shape[0];
  if (n_kv < 1 || n_heads % n_kv != 0 || n_tok * n_heads > INT_MAX || kv.capacity() > INT_MAX || kv.end > INT_MAX ||
      a.window > INT_MAX)
    return false;
  return aligned16(a.q.data) && aligned16(a.out.data) && aligned16(kv.k.data) && aligned16(kv.v.data) &&
         kv.k.stride[0] % 8 == 0 && kv.k.stride[1] % 8 == 0 && kv.v.stride[0] % 8 == 0 && kv.v.stride[1] % 8 == 0;
}

TcAttnInputs tc_attention_inputs(const AttentionArgs& a) {
  TcAttnInputs p{};
  p.out = static_cast<bf16*>(a.out.data);
  p.q = static_cast<const bf16*>(a.q.data);
  p.k = static_cast<const bf16*>(a.kv.k.data);
  p.v = static_cast<const bf16*>(a.kv.v.data);
  p.k_stride_head = a.kv.k.stride[0];
  p.k_stride_slot = a.kv.k.stride[1];
  p.v_stride_head = a.kv.v.stride[0];
  p.v_stride_slot = a.kv.v.stride[1];
  p.q_pos = static_cast<const int32_t*>(a.q_pos.data);
  p.kv_end = a.kv_end.empty() ? nullptr : static_cast<const int32_t*>(a.kv_end.data);
  p.begin = a.kv.begin;
  p.end = a.kv.end;
  p.capacity = a.kv.capacity();
  p.window = a.window;
  p.n_tok = static_cast<int>(a.q.shape[0]);
  p.n_heads = static_cast<int>(a.q.shape[1]);
  p.group = static_cast<int>(a.q.shape[1] / a.kv.k.shape[0]);
  p.head_dim = static_cast<int>(a.q.shape[2]);
  p.ring = a.kv.ring;
  p.causal = a.causal;
  p.scale_log2 = a.scale * kLog2e;
  return p;
}

bool attention_decode_applies(const AttentionArgs& a) {
  if (!tc_attention_operands_ok(a)) return false;
  const int64_t n_tok = a.q.shape[0], head_dim = a.q.shape[2];
  return n_tok >= 1 && n_tok <= max_tc_tokens() && head_dim >= 8 && head_dim <= kMaxHeadDim && head_dim % 8 == 0;
}

Status launch_attention_decode(const AttentionArgs& a, int64_t max_keys, const Scratch& scratch,
                               cudaStream_t stream) {
  const int64_t n_tok = a.q.shape[0], n_heads = a.q.shape[1], head_dim = a.q.shape[2];
  const int64_t n_kv = a.kv.k.shape[0], group = n_heads / n_kv;
  DecodeParams p{};
  static_cast<TcAttnInputs&>(p) = tc_attention_inputs(a);
  p.partial = static_cast<float*>(scratch.data);

  // Query rows (n_tok x group) in chunks of at most kMaxChunkRows, as even as possible.
  const int64_t rows = n_tok * group;
  DecodeShape s{};
  s.rows_out = n_tok * n_heads;
  s.n_kv = n_kv;
  s.n_chunks = (rows + kMaxChunkRows - 1) / kMaxChunkRows;
  p.chunk_rows = static_cast<int>((rows + s.n_chunks - 1) / s.n_chunks);
  // A window bounds the keys the queries see together (consecutive query positions: window + n_tok - 1).
  s.max_keys = a.window > 0 ? std::min(max_keys, a.window + n_tok - 1) : max_keys;
  const int nt = (p.chunk_rows + 7) / 8;
  if (head_dim <= 64) return launch_nw<1>(p, nt, s, scratch, stream);
  if (head_dim <= 128) return launch_nw<2>(p, nt, s, scratch, stream);
  if (head_dim <= 256) return launch_nw<4>(p, nt, s, scratch, stream);
  return launch_nw<8>(p, nt, s, scratch, stream);
}

}  // namespace tandem::cuda
