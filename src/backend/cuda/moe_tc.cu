// The MoE expert products on the tensor cores for chunks of many tokens (prefill; moe_common.h). moe.cu's
// GEMV-style kernels take up to four (token, slot) pairs per pass over an expert's weights, so a prompt that sends
// dozens of tokens to each expert re-reads every expert many times and runs its products on the CUDA cores. Here
// block (row tile, expert slot) holds 64 weight rows of one expert and streams the expert's pairs through them 64
// at a time: tiles of 64 rows x 32 k of the weights and of the pairs' activation rows go global -> shared through a
// three-stage cp.async pipeline, and each of the four warps runs bf16 mma.sync (f32 accumulation) for its 16 rows
// against all 64 pairs. gate_up tiles hold 32 gate rows and the same 32 up rows, so the epilogue (through shared
// memory) forms h = gelu_tanh(gate) * up with gate, up and h rounded to bf16 as moe.cu rounds them; down tiles hold
// 64 rows of D_e and write y in f32 for moe.cu's combine kernel.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_common.h"
#include "backend/cuda/warp_mma.cuh"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr int kBM = 64;  // weight rows per tile (gate_up: 32 gate + 32 up)
constexpr int kBN = 64;  // pairs per pass
constexpr int kBK = 32;  // k per pipeline stage
constexpr int kStages = 3;
constexpr int kLd = kBK + 8;   // bf16 per shared row: 80 bytes, 16-byte aligned and conflict-free for ldmatrix
constexpr int kCLd = kBN + 4;  // f32 per row of the epilogue's staging
constexpr int kTileElems = kBM * kLd;
static_assert(kBM == kBN, "A and B tiles share the loader's geometry");
static_assert(size_t{kBM} * kCLd * sizeof(float) <= size_t{2} * kStages * kTileElems * sizeof(bf16),
              "the epilogue's staging fits in the pipeline buffers");

enum class Part { kGateUp, kDown };

// Weight row r (0..kBM) of the block's tile, or null past the matrix.
template <Part P>
__device__ __forceinline__ const bf16* weight_row(const bf16* w, int e, int r, const MoeShape& s) {
  if constexpr (P == Part::kGateUp) {
    const int64_t f = static_cast<int64_t>(blockIdx.x) * (kBM / 2) + r % (kBM / 2);
    if (f >= s.d_ff) return nullptr;
    return w + (static_cast<int64_t>(e) * 2 * s.d_ff + (r < kBM / 2 ? 0 : s.d_ff) + f) * s.d_model;
  } else {
    const int64_t o = static_cast<int64_t>(blockIdx.x) * kBM + r;
    if (o >= s.d_model) return nullptr;
    return w + (static_cast<int64_t>(e) * s.d_model + o) * s.d_ff;
  }
}

// gate_up: act = x [tokens, d_model], out = h (bf16 [pairs, d_ff]); down: act = h, out = y (f32 [pairs, d_model]).
template <Part P>
__global__ void __launch_bounds__(kThreads)
    moe_tc_kernel(void* __restrict__ out, MoeTables tab, const bf16* __restrict__ act, const bf16* __restrict__ w,
                  MoeShape s) {
  pdl_enter();
  __shared__ __align__(16) bf16 smem[2 * kStages * kTileElems];
  __shared__ int s_pair[kBN];
  bf16* s_a = smem;                             // [stage][row][k]
  bf16* s_b = smem + kStages * kTileElems;      // [stage][pair][k]
  float* s_c = reinterpret_cast<float*>(smem);  // epilogue: [row][pair]

  const int slot = blockIdx.y;
  const int e = tab.expert[slot];
  if (e < 0) return;  // fewer distinct experts than slots: the whole block leaves together
  const int count = tab.count[slot];
  const int* __restrict__ list = tab.pairs + tab.offset[slot];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int gq = lane / 4, tq = lane % 4;
  const int64_t k_dim = P == Part::kGateUp ? s.d_model : s.d_ff;  // also the length of an activation row
  const int nk = static_cast<int>(k_dim / kBK);

  // The tile rows this thread copies: chunks tid and tid + kThreads of 4 x 16 bytes per row.
  constexpr int kChunksPerRow = kBK / 8;
  constexpr int kCopies = kBM * kChunksPerRow / kThreads;
  const bf16* wrow[kCopies];
#pragma unroll
  for (int i = 0; i < kCopies; ++i) wrow[i] = weight_row<P>(w, e, (tid + i * kThreads) / kChunksPerRow, s);

  for (int p0 = 0; p0 < count; p0 += kBN) {
    const int np = min(kBN, count - p0);
    if (tid < kBN) s_pair[tid] = tid < np ? list[p0 + tid] : -1;
    __syncthreads();
    const bf16* arow[kCopies];
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int pr = s_pair[(tid + i * kThreads) / kChunksPerRow];
      const int64_t row = P == Part::kGateUp ? pr / s.k : pr;  // gate_up: the pair's token; down: the pair's h row
      arow[i] = pr < 0 ? nullptr : act + row * k_dim;
    }
    auto load_stage = [&](int kt) {
      const int buf = kt % kStages;
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const int c = tid + i * kThreads, r = c / kChunksPerRow, kc = (c % kChunksPerRow) * 8;
        const int64_t k0 = static_cast<int64_t>(kt) * kBK + kc;
        cp_async16(s_a + buf * kTileElems + r * kLd + kc, wrow[i] != nullptr ? wrow[i] + k0 : w, wrow[i] != nullptr);
        cp_async16(s_b + buf * kTileElems + r * kLd + kc, arow[i] != nullptr ? arow[i] + k0 : act, arow[i] != nullptr);
      }
    };
    float acc[kBN / 8][4];
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[j][q] = 0.f;
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < nk) load_stage(st);
      cp_async_commit();
    }
    for (int kt = 0; kt < nk; ++kt) {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // stage kt is in; every warp is done with the buffer the next load overwrites
      if (kt + kStages - 1 < nk) load_stage(kt + kStages - 1);
      cp_async_commit();
      const bf16* a_tile = s_a + (kt % kStages) * kTileElems;
      const bf16* b_tile = s_b + (kt % kStages) * kTileElems;
#pragma unroll
      for (int ks = 0; ks < kBK; ks += 16) {
        uint32_t a[4];
        ldmatrix_x4(a, a_tile + (16 * warp + lane % 16) * kLd + ks + (lane / 16) * 8);
#pragma unroll
        for (int j = 0; j < kBN / 8; j += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, b_tile + (8 * j + lane % 8 + (lane / 16) * 8) * kLd + ks + ((lane / 8) % 2) * 8);
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
          mma_bf16(acc[j], a, b0);
          mma_bf16(acc[j + 1], a, b1);
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the pipeline buffers become the epilogue's staging
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      const int r = 16 * warp + gq, n = 8 * j + 2 * tq;
      s_c[r * kCLd + n] = acc[j][0];
      s_c[r * kCLd + n + 1] = acc[j][1];
      s_c[(r + 8) * kCLd + n] = acc[j][2];
      s_c[(r + 8) * kCLd + n + 1] = acc[j][3];
    }
    __syncthreads();
    if constexpr (P == Part::kGateUp) {
      constexpr int kF = kBM / 2;
      const int64_t f0 = static_cast<int64_t>(blockIdx.x) * kF;
      for (int i = tid; i < kF * kBN; i += kThreads) {
        const int f = i % kF, n = i / kF;
        if (n >= np || f0 + f >= s.d_ff) continue;
        const float g = to_f32(from_f32<bf16>(s_c[f * kCLd + n])), u = to_f32(from_f32<bf16>(s_c[(kF + f) * kCLd + n]));
        const float hv = to_f32(from_f32<bf16>(gelu_tanh(g))) * u;
        static_cast<bf16*>(out)[static_cast<int64_t>(s_pair[n]) * s.d_ff + f0 + f] = from_f32<bf16>(hv);
      }
    } else {
      const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kBM;
      for (int i = tid; i < kBM * kBN; i += kThreads) {
        const int r = i % kBM, n = i / kBM;
        if (n >= np || o0 + r >= s.d_model) continue;
        static_cast<float*>(out)[static_cast<int64_t>(s_pair[n]) * s.d_model + o0 + r] = s_c[r * kCLd + n];
      }
    }
    __syncthreads();  // s_c and s_pair are rewritten by the next pass
  }
}

}  // namespace

bool moe_tc_applies(const MoeShape& s, DType weights, DType act, const void* gate_up, const void* down, const void* x) {
  return weights == DType::kBF16 && act == DType::kBF16 && s.d_model % kBK == 0 && s.d_ff % kBK == 0 && s.d_model > 0 &&
         s.d_ff > 0 && aligned16(gate_up) && aligned16(down) && aligned16(x);
}

Status launch_moe_tc_gate_up(bf16* h, const MoeTables& tab, const bf16* x, const bf16* gate_up, const MoeShape& s,
                             int64_t slots, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((s.d_ff + kBM / 2 - 1) / (kBM / 2)), static_cast<unsigned>(slots));
  launch_kernel(moe_tc_kernel<Part::kGateUp>, grid, kThreads, 0, stream, static_cast<void*>(h), tab, x, gate_up, s);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_moe_tc_down(float* y, const MoeTables& tab, const bf16* h, const bf16* down, const MoeShape& s,
                          int64_t slots, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((s.d_model + kBM - 1) / kBM), static_cast<unsigned>(slots));
  launch_kernel(moe_tc_kernel<Part::kDown>, grid, kThreads, 0, stream, static_cast<void*>(y), tab, h, down, s);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
