// RMSNorm (spec §1.2) and half-split RoPE (spec §1.7) on the GPU. RMSNorm: one block per row (a single warp for
// head-sized rows), f32 math, 16-byte vector loads when the rows are 16-byte aligned, and the fused epilogues of
// ops.h (residual add, out_scale, RoPE: one head per block) rounding each stage as the separate ops do, so fused and
// unfused results are bit-identical. RoPE: one thread per rotated pair; for bf16 activations it follows HF's bf16
// arithmetic (cos/sin rounded to bf16, each product and the sum rounded: spec §1.13 item 4), for f32 it rounds
// each product and the sum in f32 (no FMA contraction), as HF's separate tensor ops do.
#include <cuda_bf16.h>

#include <algorithm>
#include <span>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm_math.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

// (mean(x^2) + eps)^-0.5 of row xr, reduced over the block. Threads [0, n_active) read the row with stride
// n_active * V; the others (RoPE variant) add zeros, which changes no bit of the sum. So the result depends only on
// (x, dim, V, n_active), and rms_norm and its RoPE variant agree when launched with the same V and n_active.
template <class TX, int V>
__device__ __forceinline__ float row_inv_rms(const TX* xr, int64_t dim, int n_active, float eps) {
  float ss = 0.f;
  if (static_cast<int>(threadIdx.x) < n_active) {
    for (int64_t i = threadIdx.x * V; i < dim; i += static_cast<int64_t>(n_active) * V) {
      float v[V];
      load_vec<TX, V>(xr + i, v);
      ss = add_squares<V>(v, ss);
    }
  }
  return inv_rms_of(block_sum(ss), dim, eps);
}

// Row `row`: y = x * rsqrt(mean(x^2) + eps) * w, then the epilogue. Pass 2 re-reads x (from L1/L2) so any dim
// works; each element of x and residual is read before it is written by the same thread, so out may alias either.
template <class TX, class TO, int V>
__device__ __forceinline__ void rms_norm_row(TO* out, const TX* x, const NormWeight& w, const NormEpilogue& e,
                                             int64_t dim, float eps, int64_t row) {
  const TX* xr = x + row * dim;
  TO* outr = out + row * dim;
  const TO* resr = e.residual ? static_cast<const TO*>(e.residual) + row * dim : nullptr;
  const float inv = row_inv_rms<TX, V>(xr, dim, static_cast<int>(blockDim.x), eps);
  const int64_t step = static_cast<int64_t>(blockDim.x) * V;
  float ss_next = 0.f;
  for (int64_t i = threadIdx.x * V; i < dim; i += step) {
    float v[V], wv[V], rv[V];
    load_vec<TX, V>(xr + i, v);
    load_weight<V>(w, i, wv, e.vec_io);
    if (resr) load_any<TO, V>(resr + i, rv, e.vec_io);
    norm_out<TO, V>(v, inv, wv, resr ? rv : nullptr, e.out_scale);
    store_any<TO, V>(outr + i, v, e.vec_io);
    if (e.next_out) {  // the next norm's sum of squares, over the values as stored, in row_inv_rms's order
      float r[V];
#pragma unroll
      for (int j = 0; j < V; ++j) r[j] = round_as<TO>(v[j]);
      ss_next = add_squares<V>(r, ss_next);
    }
  }
  if (e.next_out == nullptr) return;
  // The next norm (no epilogue): re-read the stored row (this thread's own elements) and scale it.
  const float inv_next = inv_rms_of(block_sum(ss_next), dim, e.next_eps);
  TO* nextr = static_cast<TO*>(e.next_out) + row * dim;
  for (int64_t i = threadIdx.x * V; i < dim; i += step) {
    float v[V], wv[V];
    load_vec<TO, V>(outr + i, v);
    load_weight<V>(e.next_w, i, wv, e.vec_io);
    norm_out<TO, V>(v, inv_next, wv, nullptr, 1.f);
    store_any<TO, V>(nextr + i, v, e.vec_io);
  }
}

// One block per row (blockIdx.x).
template <class TX, class TO, int V>
__global__ void rms_norm_kernel(TO* out, const TX* x, NormWeight w, NormEpilogue e, int64_t dim, float eps) {
  pdl_enter();
  rms_norm_row<TX, TO, V>(out, x, w, e, dim, eps, blockIdx.x);
}

// rms_norm_seq: the stages one after the other, block blockIdx.x taking row blockIdx.x of every stage. Every stage
// has the same geometry, so each thread reads and writes the same elements of a row in each one (row_inv_rms and
// both passes of rms_norm_row), and a stage reading an earlier one's out sees this thread's own stores: no barrier
// between stages beyond those inside the reductions.
template <class TX, class TO, int V>
__global__ void rms_norm_seq_kernel(NormJobs jobs, int n, int64_t dim) {
  pdl_enter();
  for (int s = 0; s < n; ++s) {
    const NormJob& j = jobs.j[s];
    rms_norm_row<TX, TO, V>(static_cast<TO*>(j.out), static_cast<const TX*>(j.x), j.w, j.e, dim, j.eps, blockIdx.x);
  }
}

// Launch geometry of the norm's reduction, from x alone (so the fused variants reduce in the same order as the
// plain op on the same x): V = 8 when every row of x is 16-byte aligned, and one thread per V elements (whole warps,
// at most 1024).
struct NormGeometry {
  int v = 1;
  int threads = kWarp;
};

NormGeometry norm_geometry(const Tensor& x) {
  const int64_t dim = x.dim(-1);
  NormGeometry g;
  g.v = dim % 8 == 0 && aligned16(x.data) ? 8 : 1;
  g.threads = static_cast<int>(std::min<int64_t>(1024, (dim / g.v + kWarp - 1) / kWarp * kWarp));
  if (g.threads < kWarp) g.threads = kWarp;
  return g;
}

// One norm's kernel arguments (the epilogue's vector I/O needs every pointer it touches 16-byte aligned).
NormJob norm_job(const RmsNormArgs& a, const NormGeometry& g, const RmsNormArgs* next) {
  NormJob j;
  j.out = a.out.data;
  j.x = a.x.data;
  j.eps = a.eps;
  j.w = norm_weight(a.weight);
  NormEpilogue& e = j.e;
  e.residual = a.residual.empty() ? nullptr : a.residual.data;
  e.out_scale = a.out_scale;
  e.vec_io =
      g.v == 8 && aligned16(a.out.data) && (!j.w.data || aligned16(j.w.data)) && (!e.residual || aligned16(e.residual));
  if (next != nullptr) {
    e.next_out = next->out.data;
    e.next_w = norm_weight(next->weight);
    e.next_eps = next->eps;
    e.vec_io = e.vec_io && aligned16(e.next_out) && (!e.next_w.data || aligned16(e.next_w.data));
  }
  return j;
}

// Each stage's x_src / res_src: the latest earlier stage whose out it is (the launchers admit no other overlap).
void set_sources(NormJobs& k, int n) {
  for (int s = 0; s < n; ++s) {
    NormJob& j = k.j[s];
    j.x_src = j.res_src = -1;
    for (int p = 0; p < s; ++p) {
      if (k.j[p].out == j.x) j.x_src = p;
      if (j.e.residual != nullptr && k.j[p].out == j.e.residual) j.res_src = p;
    }
  }
}

// Whether stages [0, n) with geometry g run on the register path (norm_regs.cu): bf16 in and out, 8-element
// vectors everywhere, one pass of a block it takes.
template <class TX, class TO>
bool regs_path(const NormJobs& k, int n, const NormGeometry& g) {
  if constexpr (!std::is_same_v<TX, bf16> || !std::is_same_v<TO, bf16>) {
    return false;
  } else {
    if (!norm_regs_enabled() || g.v != 8 || g.threads > kNormRegThreads) return false;
    for (int s = 0; s < n; ++s)
      if (!k.j[s].e.vec_io || k.j[s].e.next_out != nullptr) return false;
    return true;
  }
}

template <class TX, class TO>
Status rms_norm_typed(const RmsNormArgs& a, cudaStream_t stream, const RmsNormArgs* next = nullptr) {
  const int64_t dim = a.x.dim(-1), rows = a.x.rows();
  if (rows == 0 || dim == 0) return ok_status();
  const NormGeometry g = norm_geometry(a.x);
  // The register path runs rms_norm_then as two stages, the second reading the first's out.
  NormJobs regs;
  regs.j[0] = norm_job(a, g, nullptr);
  if (next != nullptr) regs.j[1] = norm_job(*next, g, nullptr);
  const int n_regs = next != nullptr ? 2 : 1;
  set_sources(regs, n_regs);
  if (regs_path<TX, TO>(regs, n_regs, g)) return launch_norm_regs(regs, n_regs, rows, g.threads, dim, stream);
  const NormJob j = norm_job(a, g, next);
  auto* out = static_cast<TO*>(j.out);
  const auto* x = static_cast<const TX*>(j.x);
  const auto grid = static_cast<unsigned>(rows);
  if (g.v == 8) {
    launch_kernel(rms_norm_kernel<TX, TO, 8>, grid, g.threads, 0, stream, out, x, j.w, j.e, dim, a.eps);
  } else {
    launch_kernel(rms_norm_kernel<TX, TO, 1>, grid, g.threads, 0, stream, out, x, j.w, j.e, dim, a.eps);
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

// rms_norm_seq's launch: one block per row, the stages in order.
template <class TX, class TO>
Status rms_norm_seq_typed(std::span<const RmsNormArgs> stages, cudaStream_t stream) {
  const int64_t dim = stages[0].x.dim(-1), rows = stages[0].x.rows();
  if (rows == 0 || dim == 0) return ok_status();
  const NormGeometry g = norm_geometry(stages[0].x);
  NormJobs k;
  for (size_t i = 0; i < stages.size(); ++i) k.j[i] = norm_job(stages[i], g, nullptr);
  const int n = static_cast<int>(stages.size());
  set_sources(k, n);
  if (regs_path<TX, TO>(k, n, g)) return launch_norm_regs(k, n, rows, g.threads, dim, stream);
  const auto grid = static_cast<unsigned>(rows);
  if (g.v == 8) {
    launch_kernel(rms_norm_seq_kernel<TX, TO, 8>, grid, g.threads, 0, stream, k, n, dim);
  } else {
    launch_kernel(rms_norm_seq_kernel<TX, TO, 1>, grid, g.threads, 0, stream, k, n, dim);
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

// One rotated pair (x1, x2) = (x[j], x[j + half]) -> x * cos + rotate_half(x) * sin, in place. Shared by rope and
// the RoPE epilogue of rms_norm so both give the same bits. T is the activation type (bf16 or f32).
template <class T>
__device__ __forceinline__ void rope_pair(float& x1, float& x2, float c, float s) {
  if constexpr (sizeof(T) == 2) {
    // bf16: q * cos + rotate_half(q) * sin with every tensor op rounded to bf16 (spec §1.13 item 4).
    c = round_as<T>(c);
    s = round_as<T>(s);
    const float y1 = round_as<T>(x1 * c) - round_as<T>(x2 * s);
    x2 = round_as<T>(x2 * c) + round_as<T>(x1 * s);
    x1 = y1;
  } else {
    const float y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    x2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
    x1 = y1;
  }
}

// x [n_tok, n_heads, head_dim] in place; one thread per (token, head, pair j < head_dim / 2).
template <class T>
__global__ void rope_kernel(T* x, const int32_t* pos, const float* inv_freq, int64_t n_heads, int64_t head_dim,
                            int64_t n_pairs) {
  pdl_enter();
  const int64_t half = head_dim / 2;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n_pairs;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = idx % half, th = idx / half, t = th / n_heads;
    const float f = inv_freq[j];
    if (f == 0.f) continue;  // proportional RoPE: the pair stays bit-for-bit unchanged
    float s, c;
    sincosf(static_cast<float>(pos[t]) * f, &s, &c);  // the angle is an f32 product, as in HF
    T* p = x + th * head_dim + j;
    float x1 = to_f32(p[0]), x2 = to_f32(p[half]);
    rope_pair<T>(x1, x2, c, s);
    p[0] = from_f32<T>(x1);
    p[half] = from_f32<T>(x2);
  }
}

__device__ __forceinline__ float weight_at(const NormWeight& w, int64_t i) {
  if (w.data == nullptr) return 1.f;
  if (w.keep) {
    const uint64_t policy = l2_keep_policy();
    return w.dtype == DType::kBF16 ? ld_keep(static_cast<const bf16*>(w.data) + i, policy)
                                   : ld_keep(static_cast<const float*>(w.data) + i, policy);
  }
  if (w.dtype == DType::kBF16) return to_f32(static_cast<const bf16*>(w.data)[i]);
  return static_cast<const float*>(w.data)[i];
}

// Pair j = threadIdx.x of a norm + RoPE row: its two elements, their weights and the inverse frequency. The
// constants are requested before the kernel's PDL wait (no kernel writes them) and the elements right after it, so
// no load waits behind the row's reduction. The launchers give a block at least half a head of threads, so this is
// every pair; norm_rope_row reads any others in place.
struct RopePair {
  float x1 = 0.f, x2 = 0.f, w1 = 1.f, w2 = 1.f, f = 0.f;
};

__device__ __forceinline__ RopePair rope_pair_consts(const NormWeight& w, const float* inv_freq, int64_t half) {
  RopePair p;
  const int64_t j = threadIdx.x;
  if (j < half) {
    p.w1 = weight_at(w, j);
    p.w2 = weight_at(w, j + half);
    p.f = w.keep ? ld_keep(inv_freq + j, l2_keep_policy()) : inv_freq[j];
  }
  return p;
}

template <class T>
__device__ __forceinline__ void rope_pair_elems(RopePair& p, const T* xr, int64_t half) {
  const int64_t j = threadIdx.x;
  if (j < half) {
    p.x1 = to_f32(xr[j]);
    p.x2 = to_f32(xr[j + half]);
  }
}

// One head row after its reduction: x * inv * w rounded to T, then rope_kernel's rotation of each pair (j, j + half),
// one pair per thread (this thread's own pair from `mine`), into dst (which may be xr: a thread writes only the pair
// it read).
template <class T>
__device__ __forceinline__ void norm_rope_row(T* dst, const T* xr, float inv, const NormWeight& w, float pos,
                                              const float* inv_freq, int64_t half, const RopePair& mine) {
  for (int64_t j = threadIdx.x; j < half; j += blockDim.x) {
    const bool own = j == threadIdx.x;
    float x1 = round_as<T>((own ? mine.x1 : to_f32(xr[j])) * inv * (own ? mine.w1 : weight_at(w, j)));
    float x2 = round_as<T>((own ? mine.x2 : to_f32(xr[j + half])) * inv * (own ? mine.w2 : weight_at(w, j + half)));
    const float f = own ? mine.f : inv_freq[j];
    if (f != 0.f) {  // a zero frequency (proportional RoPE) keeps the normed pair as it is
      float s, c;
      sincosf(pos * f, &s, &c);
      rope_pair<T>(x1, x2, c, s);
    }
    dst[j] = from_f32<T>(x1);
    dst[j + half] = from_f32<T>(x2);
  }
}

// rms_norm + RoPE, one head per block: row `blockIdx.x` of x/out [n_tok * n_heads, head_dim]. Pass 1 is
// rms_norm_kernel's reduction (same V, n_active threads); pass 2 gives one thread to each pair (j, j + half): the
// norm output rounded to T, then rope_kernel's rotation. A thread writes only the pair it read, after the block-wide
// reduction, so out may alias x.
template <class T, int V>
__global__ void rms_norm_rope_kernel(T* out, const T* x, NormWeight w, const int32_t* pos, const float* inv_freq,
                                     int64_t n_heads, int64_t head_dim, int n_active, float eps) {
  const int64_t row = blockIdx.x, half = head_dim / 2;
  RopePair mine = rope_pair_consts(w, inv_freq, half);
  pdl_enter();
  const T* xr = x + row * head_dim;
  rope_pair_elems<T>(mine, xr, half);
  const float p = static_cast<float>(pos[row / n_heads]);
  const float inv = row_inv_rms<T, V>(xr, head_dim, n_active, eps);
  norm_rope_row<T>(out + row * head_dim, xr, inv, w, p, inv_freq, half, mine);
}

// kv_norm_write in one launch: blocks [0, rows) take key rows (rms_norm_rope_kernel's arithmetic: its reduction
// with n_k threads, one pair per thread), blocks [rows, 2 rows) value rows (rms_norm_kernel's weightless norm,
// reduced with n_v threads: the extra threads of the block add zeros, which changes no bit), and every row goes
// to its cache slot instead of back in place, as kv_write stores it (same dtype). Row r is token r / n_kv, head
// r % n_kv; positions the view cannot hold are skipped as kv_write skips them.
struct KvDest {
  void* k;
  void* v;
  int64_t k_stride_head, k_stride_slot, v_stride_head, v_stride_slot, capacity;
  bool ring;
};

// Query rows (optional) come first: blocks [0, q_rows) norm + rotate q in place exactly as rms_norm_rope_kernel
// (n_q reducing threads; the launcher requires q's geometry to equal the keys').
struct QRows {
  void* q = nullptr;
  NormWeight w;
  int64_t rows = 0, n_heads = 1;
};

template <class T, int V>
__global__ void kv_norm_rope_write_kernel(KvDest d, QRows qr, const T* k_new, const T* v_new, NormWeight kw,
                                          const int32_t* pos, const float* inv_freq, int64_t rows, int64_t n_kv,
                                          int64_t head_dim, int n_k, int n_v, float eps) {
  const int64_t half = head_dim / 2;
  const bool q_row = blockIdx.x < qr.rows;
  RopePair mine = rope_pair_consts(q_row ? qr.w : kw, inv_freq, half);
  pdl_enter();
  if (q_row) {
    T* xq = static_cast<T*>(qr.q) + static_cast<int64_t>(blockIdx.x) * head_dim;
    rope_pair_elems<T>(mine, xq, half);
    const float pq = static_cast<float>(pos[blockIdx.x / qr.n_heads]);
    const float inv = row_inv_rms<T, V>(xq, head_dim, n_k, eps);
    norm_rope_row<T>(xq, xq, inv, qr.w, pq, inv_freq, half, mine);
    return;
  }
  const int64_t b = blockIdx.x - qr.rows;
  const bool is_v = b >= rows;
  const int64_t row = is_v ? b - rows : b;
  const int64_t t = row / n_kv, h = row % n_kv;
  const T* xr = (is_v ? v_new : k_new) + row * head_dim;
  if (!is_v) rope_pair_elems<T>(mine, xr, half);
  const int64_t p = pos[t];
  const float inv = row_inv_rms<T, V>(xr, head_dim, is_v ? n_v : n_k, eps);
  if (p < 0 || (!d.ring && p >= d.capacity)) return;  // after the block-wide reduction: no barrier follows
  const int64_t slot = d.ring ? p % d.capacity : p;
  if (is_v) {
    T* dst = static_cast<T*>(d.v) + h * d.v_stride_head + slot * d.v_stride_slot;
    for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) dst[i] = from_f32<T>(to_f32(xr[i]) * inv * 1.f);
    return;
  }
  T* dst = static_cast<T*>(d.k) + h * d.k_stride_head + slot * d.k_stride_slot;
  norm_rope_row<T>(dst, xr, inv, kw, static_cast<float>(p), inv_freq, half, mine);
}

// Prompt chunks (kRowsMinTokens tokens or more): the rows of rms_norm_rope_kernel and kv_norm_rope_write_kernel,
// query rows first, then key rows, then value rows, one warp each and kWarpRows per block instead of a block each
// (a chunk has tens of thousands of head rows, each a few hundred bytes). Head dims of at most 512 in 16-byte chunks
// (V = 8) only, where the block kernels' n_active threads hold one chunk each: lane l sums the squares of chunks l and
// l + 32 as threads l and l + 32 do, the second warp's sum added last as block_sum's second level adds it (the other
// warps there add zeros), so every row's inverse RMS has the block kernels' bits; then each lane takes the pairs
// j = l, l + 32, ... with norm_rope_row's arithmetic (the same bits again), with no block barrier anywhere.
constexpr int kWarpRows = 8;
constexpr int64_t kRowsMinTokens = 16;

template <class T>
__device__ __forceinline__ float warp_inv_rms(const T* xr, int64_t dim, float eps) {
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  float sq[2] = {0.f, 0.f};
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int64_t i = static_cast<int64_t>(lane + c * kWarp) * 8;
    if (i < dim) {
      float v[8];
      load_vec<T, 8>(xr + i, v);
      sq[c] = add_squares<8>(v, 0.f);
    }
  }
  float ss = warp_sum(sq[0]);
  if (dim > 8 * kWarp) ss += warp_sum(sq[1]);
  return inv_rms_of(ss, dim, eps);
}

template <class T>
__device__ __forceinline__ void warp_norm_rope_row(T* dst, const T* xr, float inv, const NormWeight& w, float pos,
                                                   const float* inv_freq, int64_t half) {
  for (int64_t j = threadIdx.x % kWarp; j < half; j += kWarp) {
    float x1 = round_as<T>(to_f32(xr[j]) * inv * weight_at(w, j));
    float x2 = round_as<T>(to_f32(xr[j + half]) * inv * weight_at(w, j + half));
    const float f = inv_freq[j];
    if (f != 0.f) {
      float s, c;
      sincosf(pos * f, &s, &c);
      rope_pair<T>(x1, x2, c, s);
    }
    dst[j] = from_f32<T>(x1);
    dst[j + half] = from_f32<T>(x2);
  }
}

// Row b = blockIdx.x * kWarpRows + warp: query rows [0, qr.rows) normed and rotated from qr.q into q_out (which
// may be qr.q), then `rows` key rows and `rows` value rows into their cache slots (kv_norm_rope_write_kernel's
// rules; rows = 0 for rms_norm_rope).
template <class T>
__global__ void __launch_bounds__(kWarpRows* kWarp)
    norm_rope_rows_kernel(KvDest d, QRows qr, T* q_out, const T* k_new, const T* v_new, NormWeight kw,
                          const int32_t* pos, const float* inv_freq, int64_t rows, int64_t n_kv, int64_t head_dim,
                          float eps) {
  pdl_enter();
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarpRows + threadIdx.x / kWarp, half = head_dim / 2;
  if (b < qr.rows) {
    const T* xq = static_cast<const T*>(qr.q) + b * head_dim;
    const float inv = warp_inv_rms<T>(xq, head_dim, eps);
    warp_norm_rope_row<T>(q_out + b * head_dim, xq, inv, qr.w, static_cast<float>(pos[b / qr.n_heads]), inv_freq,
                          half);
    return;
  }
  const int64_t r = b - qr.rows;
  if (r >= 2 * rows) return;
  const bool is_v = r >= rows;
  const int64_t row = is_v ? r - rows : r;
  const int64_t t = row / n_kv, h = row % n_kv;
  const T* xr = (is_v ? v_new : k_new) + row * head_dim;
  const float inv = warp_inv_rms<T>(xr, head_dim, eps);
  const int64_t p = pos[t];
  if (p < 0 || (!d.ring && p >= d.capacity)) return;
  const int64_t slot = d.ring ? p % d.capacity : p;
  if (is_v) {
    T* dst = static_cast<T*>(d.v) + h * d.v_stride_head + slot * d.v_stride_slot;
    for (int64_t i = threadIdx.x % kWarp; i < head_dim; i += kWarp) dst[i] = from_f32<T>(to_f32(xr[i]) * inv * 1.f);
    return;
  }
  T* dst = static_cast<T*>(d.k) + h * d.k_stride_head + slot * d.k_stride_slot;
  warp_norm_rope_row<T>(dst, xr, inv, kw, static_cast<float>(p), inv_freq, half);
}

// Whether a launch of n_tok tokens over rows of `head_dim` in geometry g (and every other row geometry equal to it)
// takes norm_rope_rows_kernel: V = 8 and at most 64 chunks a row, so norm_geometry's n_active (one thread per
// chunk, whole warps) is at most two warps.
bool rows_kernel_takes(int64_t n_tok, int64_t head_dim, const NormGeometry& g) {
  return n_tok >= kRowsMinTokens && g.v == 8 && head_dim <= 2 * 8 * kWarp;
}

template <class T>
Status rms_norm_rope_typed(const RmsNormArgs& a, cudaStream_t stream) {
  const int64_t head_dim = a.x.dim(-1), rows = a.x.rows(), n_tok = a.rope_pos.numel();
  if (rows == 0 || head_dim == 0) return ok_status();
  const NormWeight w = norm_weight(a.weight);
  const NormGeometry g = norm_geometry(a.x);
  // Enough threads for one pair each (256 for head_dim 512), and never fewer than the reduction uses.
  const int threads = static_cast<int>(
      std::min<int64_t>(1024, std::max<int64_t>(g.threads, (head_dim / 2 + kWarp - 1) / kWarp * kWarp)));
  auto* out = static_cast<T*>(a.out.data);
  const auto* x = static_cast<const T*>(a.x.data);
  const auto* pos = static_cast<const int32_t*>(a.rope_pos.data);
  const auto* inv_freq = static_cast<const float*>(a.rope_inv_freq.data);
  const auto grid = static_cast<unsigned>(rows);
  const int64_t n_heads = rows / n_tok;
  if (rows_kernel_takes(n_tok, head_dim, g)) {
    QRows qr;
    qr.q = const_cast<T*>(x);  // read only
    qr.w = w;
    qr.rows = rows;
    qr.n_heads = n_heads;
    launch_kernel(norm_rope_rows_kernel<T>, static_cast<unsigned>((rows + kWarpRows - 1) / kWarpRows),
                  kWarpRows * kWarp, 0, stream, KvDest{}, qr, out, static_cast<const T*>(nullptr),
                  static_cast<const T*>(nullptr), NormWeight{}, pos, inv_freq, int64_t{0}, int64_t{1}, head_dim, a.eps);
    TANDEM_CUDA_TRY_LAUNCH();
    return ok_status();
  }
  if (g.v == 8) {
    launch_kernel(rms_norm_rope_kernel<T, 8>, grid, threads, 0, stream, out, x, w, pos, inv_freq, n_heads, head_dim,
                  g.threads, a.eps);
  } else {
    launch_kernel(rms_norm_rope_kernel<T, 1>, grid, threads, 0, stream, out, x, w, pos, inv_freq, n_heads, head_dim,
                  g.threads, a.eps);
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

template <class T>
Status kv_norm_write_typed(const KvNormWriteArgs& a, cudaStream_t stream) {
  const KvWriteArgs& w = a.write;
  const int64_t n_tok = w.k_new.shape[0], n_kv = w.k_new.shape[1], head_dim = w.k_new.shape[2];
  const int64_t rows = n_tok * n_kv;
  if (rows == 0 || head_dim == 0) return ok_status();
  const Tensor k2 = w.k_new.reshape({rows, head_dim}), v2 = w.v_new.reshape({rows, head_dim});
  const NormGeometry gk = norm_geometry(k2), gv = norm_geometry(v2);
  // The key rows' block size as rms_norm_rope_typed picks it (the value rows reduce with their own n_v <= it).
  const int threads = static_cast<int>(
      std::min<int64_t>(1024, std::max<int64_t>(gk.threads, (head_dim / 2 + kWarp - 1) / kWarp * kWarp)));
  const KvDest d{w.kv.k.data,      w.kv.v.data,      w.kv.k.stride[0], w.kv.k.stride[1],
                 w.kv.v.stride[0], w.kv.v.stride[1], w.kv.capacity(),  w.kv.ring};
  const NormWeight kw = norm_weight(a.k_norm);
  const auto* pos = static_cast<const int32_t*>(w.pos.data);
  const auto* inv_freq = static_cast<const float*>(a.rope_inv_freq.data);
  QRows qr;
  if (!a.q.empty()) {
    qr.q = a.q.data;
    qr.w = norm_weight(a.q_norm);
    qr.n_heads = a.q.shape[1];
    qr.rows = a.q.shape[0] * qr.n_heads;
  }
  if (rows_kernel_takes(n_tok, head_dim, gk) && gv.v == 8) {  // v has k's shape: the same geometry
    const int64_t all = qr.rows + 2 * rows;
    launch_kernel(norm_rope_rows_kernel<T>, static_cast<unsigned>((all + kWarpRows - 1) / kWarpRows), kWarpRows * kWarp,
                  0, stream, d, qr, static_cast<T*>(qr.q), static_cast<const T*>(w.k_new.data),
                  static_cast<const T*>(w.v_new.data), kw, pos, inv_freq, rows, n_kv, head_dim, a.eps);
    TANDEM_CUDA_TRY_LAUNCH();
    return ok_status();
  }
  const auto grid = static_cast<unsigned>(qr.rows + 2 * rows);
  if (gk.v == 8) {
    launch_kernel(kv_norm_rope_write_kernel<T, 8>, grid, threads, 0, stream, d, qr, static_cast<const T*>(w.k_new.data),
                  static_cast<const T*>(w.v_new.data), kw, pos, inv_freq, rows, n_kv, head_dim, gk.threads, gv.threads,
                  a.eps);
  } else {
    launch_kernel(kv_norm_rope_write_kernel<T, 1>, grid, threads, 0, stream, d, qr, static_cast<const T*>(w.k_new.data),
                  static_cast<const T*>(w.v_new.data), kw, pos, inv_freq, rows, n_kv, head_dim, gk.threads, gv.threads,
                  a.eps);
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

// Activation dtypes the norm kernels take, and a weight they read (none, bf16 or f32).
bool is_act(DType t) { return t == DType::kBF16 || t == DType::kF32; }

// Whether two contiguous tensors share a byte (an empty one shares none).
bool bytes_overlap(const Tensor& a, const Tensor& b) {
  if (a.empty() || b.empty()) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.data), b0 = reinterpret_cast<uintptr_t>(b.data);
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

bool kv_norm_write_fusable(const KvNormWriteArgs& a) {
  const KvWriteArgs& w = a.write;
  const DType t = w.k_new.dtype;
  if ((t != DType::kBF16 && t != DType::kF32) || w.v_new.dtype != t || w.kv.k.dtype != t || w.kv.v.dtype != t)
    return false;
  if (w.k_new.ndim != 3 || !w.k_new.same_shape(w.v_new) || !w.k_new.is_contiguous() || !w.v_new.is_contiguous())
    return false;
  if (!a.k_norm.empty() && a.k_norm.dtype != DType::kBF16 && a.k_norm.dtype != DType::kF32) return false;
  const int64_t head_dim = w.k_new.shape[2];
  const Tensor k2 = w.k_new.reshape({w.k_new.shape[0] * w.k_new.shape[1], head_dim});
  const Tensor v2 = w.v_new.reshape({w.k_new.shape[0] * w.k_new.shape[1], head_dim});
  if (!a.q.empty()) {  // query rows: the keys' dtype, head dim, token count and norm geometry
    if (a.q.dtype != t || a.q.ndim != 3 || a.q.shape[0] != w.k_new.shape[0] || a.q.shape[2] != head_dim ||
        !a.q.is_contiguous() || (!a.q_norm.empty() && a.q_norm.dtype != DType::kBF16 && a.q_norm.dtype != DType::kF32))
      return false;
    const NormGeometry gq = norm_geometry(a.q.reshape({a.q.shape[0] * a.q.shape[1], head_dim}));
    const NormGeometry gk = norm_geometry(k2);
    if (gq.v != gk.v || gq.threads != gk.threads) return false;
  }
  // Both row kinds read with the same vector width (one kernel instantiation).
  return head_dim % 2 == 0 && a.rope_inv_freq.dtype == DType::kF32 && a.rope_inv_freq.numel() == head_dim / 2 &&
         norm_geometry(k2).v == norm_geometry(v2).v;
}

Status launch_kv_norm_write(const KvNormWriteArgs& a, cudaStream_t stream) {
  if (!kv_norm_write_fusable(a)) return internal_error("cuda kv_norm_write: arguments it does not fuse");
  return a.write.k_new.dtype == DType::kBF16 ? kv_norm_write_typed<bf16>(a, stream)
                                             : kv_norm_write_typed<float>(a, stream);
}

Status launch_rms_norm(const RmsNormArgs& a, cudaStream_t stream) {
  if (!a.weight.empty() && a.weight.dtype != DType::kBF16 && a.weight.dtype != DType::kF32)
    return unsupported(strfmt("cuda rms_norm: weight dtype %s (bf16 or f32 only)", dtype_name(a.weight.dtype)));
  const DType xt = a.x.dtype, ot = a.out.dtype;
  if (!a.rope_pos.empty()) {
    if (xt == DType::kBF16 && ot == DType::kBF16) return rms_norm_rope_typed<bf16>(a, stream);
    if (xt == DType::kF32 && ot == DType::kF32) return rms_norm_rope_typed<float>(a, stream);
    return unsupported(strfmt("cuda rms_norm with rope: x %s -> out %s (one of f32/bf16)", dtype_name(xt),
                              dtype_name(ot)));
  }
  if (!a.residual.empty() && a.residual.dtype != ot)
    return unsupported(strfmt("cuda rms_norm: residual %s for out %s (must match)", dtype_name(a.residual.dtype),
                              dtype_name(ot)));
  if (xt == DType::kBF16 && ot == DType::kBF16) return rms_norm_typed<bf16, bf16>(a, stream);
  if (xt == DType::kF32 && ot == DType::kF32) return rms_norm_typed<float, float>(a, stream);
  if (xt == DType::kF32 && ot == DType::kBF16) return rms_norm_typed<float, bf16>(a, stream);
  if (xt == DType::kBF16 && ot == DType::kF32) return rms_norm_typed<bf16, float>(a, stream);
  return unsupported(strfmt("cuda rms_norm: x %s -> out %s (f32/bf16 only)", dtype_name(xt), dtype_name(ot)));
}

bool rms_norm_then_fusable(const RmsNormArgs& a, const RmsNormArgs& next) {
  if (!a.rope_pos.empty() || !next.rope_pos.empty() || !next.residual.empty() || next.out_scale != 1.f) return false;
  if (next.x.data != a.out.data || next.x.dtype != a.out.dtype || next.out.dtype != a.out.dtype ||
      next.x.numel() != a.out.numel() || next.out.numel() != a.out.numel() || next.x.dim(-1) != a.x.dim(-1))
    return false;
  if (next.out.data == a.out.data || next.out.data == a.x.data ||
      (!a.residual.empty() && next.out.data == a.residual.data))
    return false;
  if (!is_act(a.x.dtype) || !is_act(a.out.dtype) || !plain_weight(a.weight) || !plain_weight(next.weight) ||
      (!a.residual.empty() && a.residual.dtype != a.out.dtype))
    return false;
  // The second reduction must run in the order a separate launch on out would: the same geometry as x's.
  const NormGeometry gx = norm_geometry(a.x), go = norm_geometry(a.out);
  return gx.v == go.v && gx.threads == go.threads;
}

Status launch_rms_norm_then(const RmsNormArgs& a, const RmsNormArgs& next, cudaStream_t stream) {
  if (!rms_norm_then_fusable(a, next)) return internal_error("cuda rms_norm_then: arguments it does not fuse");
  const DType xt = a.x.dtype, ot = a.out.dtype;
  if (xt == DType::kBF16 && ot == DType::kBF16) return rms_norm_typed<bf16, bf16>(a, stream, &next);
  if (xt == DType::kF32 && ot == DType::kF32) return rms_norm_typed<float, float>(a, stream, &next);
  if (xt == DType::kF32 && ot == DType::kBF16) return rms_norm_typed<float, bf16>(a, stream, &next);
  return rms_norm_typed<bf16, float>(a, stream, &next);
}

bool rms_norm_seq_fusable(std::span<const RmsNormArgs> stages) {
  if (stages.empty() || stages.size() > static_cast<size_t>(kMaxNormJobs)) return false;
  const RmsNormArgs& a0 = stages[0];
  if (a0.x.ndim < 1 || !is_act(a0.x.dtype) || !is_act(a0.out.dtype)) return false;
  const NormGeometry g0 = norm_geometry(a0.x);
  for (const RmsNormArgs& a : stages) {
    if (!a.rope_pos.empty() || a.x.dtype != a0.x.dtype || a.out.dtype != a0.out.dtype || a.x.ndim < 1 ||
        a.x.dim(-1) != a0.x.dim(-1) || a.x.rows() != a0.x.rows() || a.out.numel() != a.x.numel() ||
        !a.x.is_contiguous() || !a.out.is_contiguous())
      return false;
    if (!plain_weight(a.weight) ||
        (!a.residual.empty() && (a.residual.dtype != a.out.dtype || !a.residual.is_contiguous())))
      return false;
    const NormGeometry g = norm_geometry(a.x);
    if (g.v != g0.v || g.threads != g0.threads) return false;
  }
  // Rows are shared out by block and elements by thread alike in every stage, so a stage may read or overwrite
  // what another stage touches only as the very same tensor (same data and dtype). The weights are read by every
  // block: no stage may write them.
  auto same = [](const Tensor& a, const Tensor& b) { return a.data == b.data && a.dtype == b.dtype; };
  for (size_t i = 0; i < stages.size(); ++i) {
    const Tensor& out = stages[i].out;
    for (size_t j = 0; j < stages.size(); ++j) {
      if (bytes_overlap(out, stages[j].weight)) return false;
      if (i == j) continue;
      for (const Tensor* t : {&stages[j].x, &stages[j].out, &stages[j].residual})
        if (bytes_overlap(out, *t) && !same(out, *t)) return false;
    }
  }
  return true;
}

Status launch_rms_norm_seq(std::span<const RmsNormArgs> stages, cudaStream_t stream) {
  if (!rms_norm_seq_fusable(stages)) return internal_error("cuda rms_norm_seq: arguments it does not fuse");
  const DType xt = stages[0].x.dtype, ot = stages[0].out.dtype;
  if (xt == DType::kBF16 && ot == DType::kBF16) return rms_norm_seq_typed<bf16, bf16>(stages, stream);
  if (xt == DType::kF32 && ot == DType::kF32) return rms_norm_seq_typed<float, float>(stages, stream);
  if (xt == DType::kF32 && ot == DType::kBF16) return rms_norm_seq_typed<float, bf16>(stages, stream);
  return rms_norm_seq_typed<bf16, float>(stages, stream);
}

Status launch_rope(const RopeArgs& a, cudaStream_t stream) {
  const int64_t n_tok = a.x.shape[0], n_heads = a.x.shape[1], head_dim = a.x.shape[2];
  const int64_t n_pairs = n_tok * n_heads * (head_dim / 2);
  if (n_pairs == 0) return ok_status();
  constexpr int kThreads = 256;
  const auto* pos = static_cast<const int32_t*>(a.pos.data);
  const auto* inv_freq = static_cast<const float*>(a.inv_freq.data);
  if (a.x.dtype == DType::kBF16) {
    launch_kernel(rope_kernel<bf16>, grid_for(n_pairs, kThreads), kThreads, 0, stream, static_cast<bf16*>(a.x.data),
                  pos, inv_freq, n_heads, head_dim, n_pairs);
  } else if (a.x.dtype == DType::kF32) {
    launch_kernel(rope_kernel<float>, grid_for(n_pairs, kThreads), kThreads, 0, stream, static_cast<float*>(a.x.data),
                  pos, inv_freq, n_heads, head_dim, n_pairs);
  } else {
    return unsupported(strfmt("cuda rope: x dtype %s (f32/bf16 only)", dtype_name(a.x.dtype)));
  }
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
