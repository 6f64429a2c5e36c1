// The MoE expert products on the tensor cores for chunks of many tokens (prefill; moe_common.h). moe.cu's
// GEMV-style kernels take up to four (token, slot) pairs per pass over an expert's weights, so a prompt that sends
// dozens of tokens to each expert re-reads every expert many times and runs its products on the CUDA cores. Here
// block (row tile, expert slot) holds a tile of one expert's weight rows and streams the expert's pairs through it:
// tiles of rows x 32 k of the weights and of the pairs' activation rows go global -> shared through a cp.async
// pipeline, and each warp runs bf16 mma.sync (f32 accumulation) for its rows against its share of the pairs.
// Narrow tiles (64 rows x 64 pairs, 4 warps, 3 stages) suit a few dozen pairs per expert; wide ones (128 rows x 128
// pairs, 8 warps, 4 stages; set_moe_tc_wide) read each expert's weights once per pass for twice the pairs, and each
// activation row half as often. gate_up tiles hold BM / 2 gate rows and the same BM / 2 up rows, so the epilogue
// (through shared memory) forms h = gelu_tanh(gate) * up with gate, up and h rounded to bf16 as moe.cu rounds them;
// down tiles hold BM rows of D_e and write y in f32 for moe.cu's combine kernel.
#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe_common.h"
#include "backend/cuda/warp_mma.cuh"

namespace tandem::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kBK = 32;                 // k per pipeline stage
constexpr int kLd = kBK + 8;            // bf16 per shared row: 80 bytes, 16-byte aligned and conflict-free for ldmatrix
constexpr int kChunksPerRow = kBK / 8;  // 16-byte copies per tile row and stage

// A block's tile: BM weight rows (gate_up: BM / 2 gate + the same BM / 2 up rows) x BN pairs per pass, warps in a
// WARPS_M x WARPS_N grid, each warp WM rows x WN pairs, STAGES k-steps of kBK in the cp.async pipeline. The
// pipeline's buffers become the epilogue's f32 staging; the pass's pair list follows them.
template <int BM_, int BN_, int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_BLOCKS_>
struct Geo {
  static constexpr int BM = BM_, BN = BN_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_, STAGES = STAGES_;
  static constexpr int kMinBlocks = MIN_BLOCKS_;  // resident blocks per SM the registers must allow
  static constexpr int kWarps = WARPS_M * WARPS_N, kThreads = kWarps * kWarp;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MI = WM / 16, NJ = WN / 8;  // m16 A fragments and n8 accumulator tiles per warp
  static constexpr int kACopies = BM * kChunksPerRow / kThreads, kBCopies = BN * kChunksPerRow / kThreads;
  static constexpr int kCLd = BN + 4;  // f32 per row of the epilogue's staging
  static constexpr size_t kPipeBytes = size_t{STAGES} * (BM + BN) * kLd * sizeof(bf16);
  static constexpr size_t kEpiBytes = size_t{BM} * kCLd * sizeof(float);
  static constexpr size_t kPairOffset = kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes;
  static constexpr size_t kSmem = kPairOffset + BN * sizeof(int);
  static_assert(WM % 16 == 0 && WN % 16 == 0, "whole m16 fragments and pairs of n8 tiles per warp");
  static_assert(kACopies * kThreads == BM * kChunksPerRow && kBCopies * kThreads == BN * kChunksPerRow,
                "every thread copies the same number of chunks");
  static_assert(BN <= kThreads, "one thread per pair writes the pass's list");
};
using Narrow = Geo<64, 64, 4, 1, 3, 5>;  // 4 warps of 16 rows x 64 pairs; five blocks per SM (96 registers)
using Wide = Geo<128, 128, 4, 2, 4, 2>;  // 8 warps of 32 rows x 64 pairs; two blocks (164 KB) per SM

enum class Part { kGateUp, kDown };

// Weight row r (0..BM) of the block's tile, or null past the matrix.
template <Part P, int BM>
__device__ __forceinline__ const bf16* weight_row(const bf16* w, int e, int r, const MoeShape& s) {
  if constexpr (P == Part::kGateUp) {
    const int64_t f = static_cast<int64_t>(blockIdx.x) * (BM / 2) + r % (BM / 2);
    if (f >= s.d_ff) return nullptr;
    return w + (static_cast<int64_t>(e) * 2 * s.d_ff + (r < BM / 2 ? 0 : s.d_ff) + f) * s.d_model;
  } else {
    const int64_t o = static_cast<int64_t>(blockIdx.x) * BM + r;
    if (o >= s.d_model) return nullptr;
    return w + (static_cast<int64_t>(e) * s.d_model + o) * s.d_ff;
  }
}

// gate_up: act = x [tokens, d_model], out = h (bf16 [pairs, d_ff]); down: act = h, out = y (f32 [pairs, d_model]).
// Every output is the same sum in the same order whatever the geometry (k16 steps from 0 up, one mma each), so
// the geometries give the same bits.
template <Part P, class G>
__global__ void __launch_bounds__(G::kThreads, G::kMinBlocks)
    moe_tc_kernel(void* __restrict__ out, MoeTables tab, const bf16* __restrict__ act, const bf16* __restrict__ w,
                  MoeShape s) {
  constexpr int BM = G::BM, BN = G::BN, MI = G::MI, NJ = G::NJ, kStages = G::STAGES;
  constexpr int kAStage = BM * kLd, kBStage = BN * kLd;
  pdl_enter();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* s_a = reinterpret_cast<bf16*>(smem_raw);    // [stage][row][k]
  bf16* s_b = s_a + kStages * kAStage;              // [stage][pair][k]
  float* s_c = reinterpret_cast<float*>(smem_raw);  // epilogue: [row][pair]
  int* s_pair = reinterpret_cast<int*>(smem_raw + G::kPairOffset);

  const int slot = blockIdx.y;
  const int e = tab.expert[slot];
  if (e < 0) return;  // fewer distinct experts than slots: the whole block leaves together
  const int count = tab.count[slot];
  const int* __restrict__ list = tab.pairs + tab.offset[slot];
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int gq = lane / 4, tq = lane % 4;
  const int wr0 = (warp % G::WARPS_M) * G::WM, wn0 = (warp / G::WARPS_M) * G::WN;  // the warp's rows and pairs
  const int64_t k_dim = P == Part::kGateUp ? s.d_model : s.d_ff;  // also the length of an activation row
  const int nk = static_cast<int>(k_dim / kBK);

  // The tile rows this thread copies: chunks tid + i * kThreads of kChunksPerRow x 16 bytes per row.
  const bf16* wrow[G::kACopies];
#pragma unroll
  for (int i = 0; i < G::kACopies; ++i) wrow[i] = weight_row<P, BM>(w, e, (tid + i * G::kThreads) / kChunksPerRow, s);

  for (int p0 = 0; p0 < count; p0 += BN) {
    const int np = min(BN, count - p0);
    if (tid < BN) s_pair[tid] = tid < np ? list[p0 + tid] : -1;
    __syncthreads();
    const bf16* arow[G::kBCopies];
#pragma unroll
    for (int i = 0; i < G::kBCopies; ++i) {
      const int pr = s_pair[(tid + i * G::kThreads) / kChunksPerRow];
      const int64_t row = P == Part::kGateUp ? pr / s.k : pr;  // gate_up: the pair's token; down: the pair's h row
      arow[i] = pr < 0 ? nullptr : act + row * k_dim;
    }
    auto load_stage = [&](int kt) {
      const int buf = kt % kStages;
#pragma unroll
      for (int i = 0; i < G::kACopies; ++i) {
        const int c = tid + i * G::kThreads, r = c / kChunksPerRow, kc = (c % kChunksPerRow) * 8;
        const int64_t k0 = static_cast<int64_t>(kt) * kBK + kc;
        cp_async16(s_a + buf * kAStage + r * kLd + kc, wrow[i] != nullptr ? wrow[i] + k0 : w, wrow[i] != nullptr);
      }
#pragma unroll
      for (int i = 0; i < G::kBCopies; ++i) {
        const int c = tid + i * G::kThreads, r = c / kChunksPerRow, kc = (c % kChunksPerRow) * 8;
        const int64_t k0 = static_cast<int64_t>(kt) * kBK + kc;
        cp_async16(s_b + buf * kBStage + r * kLd + kc, arow[i] != nullptr ? arow[i] + k0 : act, arow[i] != nullptr);
      }
    };
    float acc[MI][NJ][4];
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mi][j][q] = 0.f;
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
      const bf16* a_tile = s_a + (kt % kStages) * kAStage;
      const bf16* b_tile = s_b + (kt % kStages) * kBStage;
      // Warp-uniform: all of this warp's pairs are past the pass's last (their columns are never written).
      if (G::WARPS_N > 1 && wn0 >= np) continue;
#pragma unroll
      for (int ks = 0; ks < kBK; ks += 16) {
        uint32_t a[MI][4];
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
          ldmatrix_x4(a[mi], a_tile + (wr0 + 16 * mi + lane % 16) * kLd + ks + (lane / 16) * 8);
#pragma unroll
        for (int j = 0; j < NJ; j += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, b_tile + (wn0 + 8 * j + lane % 8 + (lane / 16) * 8) * kLd + ks + ((lane / 8) % 2) * 8);
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
          for (int mi = 0; mi < MI; ++mi) {
            mma_bf16(acc[mi][j], a[mi], b0);
            mma_bf16(acc[mi][j + 1], a[mi], b1);
          }
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the pipeline buffers become the epilogue's staging
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
      for (int j = 0; j < NJ; ++j) {
        const int r = wr0 + 16 * mi + gq, n = wn0 + 8 * j + 2 * tq;
        s_c[r * G::kCLd + n] = acc[mi][j][0];
        s_c[r * G::kCLd + n + 1] = acc[mi][j][1];
        s_c[(r + 8) * G::kCLd + n] = acc[mi][j][2];
        s_c[(r + 8) * G::kCLd + n + 1] = acc[mi][j][3];
      }
    __syncthreads();
    if constexpr (P == Part::kGateUp) {
      constexpr int kF = BM / 2;
      const int64_t f0 = static_cast<int64_t>(blockIdx.x) * kF;
      for (int i = tid; i < kF * BN; i += G::kThreads) {
        const int f = i % kF, n = i / kF;
        if (n >= np || f0 + f >= s.d_ff) continue;
        const float g = to_f32(from_f32<bf16>(s_c[f * G::kCLd + n]));
        const float u = to_f32(from_f32<bf16>(s_c[(kF + f) * G::kCLd + n]));
        const float hv = to_f32(from_f32<bf16>(gelu_tanh(g))) * u;
        static_cast<bf16*>(out)[static_cast<int64_t>(s_pair[n]) * s.d_ff + f0 + f] = from_f32<bf16>(hv);
      }
    } else {
      const int64_t o0 = static_cast<int64_t>(blockIdx.x) * BM;
      for (int i = tid; i < BM * BN; i += G::kThreads) {
        const int r = i % BM, n = i / BM;
        if (n >= np || o0 + r >= s.d_model) continue;
        static_cast<float*>(out)[static_cast<int64_t>(s_pair[n]) * s.d_model + o0 + r] = s_c[r * G::kCLd + n];
      }
    }
    __syncthreads();  // s_c and s_pair are rewritten by the next pass
  }
}

std::atomic<int>& wide_mode() {
  static std::atomic<int> mode{[] {
    const char* e = std::getenv("TANDEM_MOE_TC_WIDE");
    if (e != nullptr && std::strcmp(e, "0") == 0) return static_cast<int>(MoeTcWide::kOff);
    if (e != nullptr && std::strcmp(e, "always") == 0) return static_cast<int>(MoeTcWide::kAlways);
    return static_cast<int>(MoeTcWide::kAuto);
  }()};
  return mode;
}

// Whether a launch takes the wide tiles: kAuto when the slots average kWideMinPairs pairs or more.
constexpr int64_t kWideMinPairs = 48;
bool wide_for(const MoeShape& s, int64_t slots) {
  const MoeTcWide m = moe_tc_wide();
  return m == MoeTcWide::kAlways || (m == MoeTcWide::kAuto && s.n_pairs >= kWideMinPairs * slots);
}

template <Part P, class G>
Status launch_part(void* out, const MoeTables& tab, const bf16* act, const bf16* w, const MoeShape& s, int64_t slots,
                   cudaStream_t stream) {
  TANDEM_CUDA_TRY((allow_dynamic_smem<moe_tc_kernel<P, G>>(G::kSmem)));  // the wide tiles pass 48 KB
  const int64_t rows = P == Part::kGateUp ? (s.d_ff + G::BM / 2 - 1) / (G::BM / 2) : (s.d_model + G::BM - 1) / G::BM;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(slots));
  launch_kernel(moe_tc_kernel<P, G>, grid, G::kThreads, G::kSmem, stream, out, tab, act, w, s);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

template <Part P>
Status launch_any(void* out, const MoeTables& tab, const bf16* act, const bf16* w, const MoeShape& s, int64_t slots,
                  cudaStream_t stream) {
  return wide_for(s, slots) ? launch_part<P, Wide>(out, tab, act, w, s, slots, stream)
                            : launch_part<P, Narrow>(out, tab, act, w, s, slots, stream);
}

}  // namespace

void set_moe_tc_wide(MoeTcWide m) { wide_mode().store(static_cast<int>(m), std::memory_order_relaxed); }
MoeTcWide moe_tc_wide() { return static_cast<MoeTcWide>(wide_mode().load(std::memory_order_relaxed)); }

bool moe_tc_applies(const MoeShape& s, DType weights, DType act, const void* gate_up, const void* down, const void* x) {
  return weights == DType::kBF16 && act == DType::kBF16 && s.d_model % kBK == 0 && s.d_ff % kBK == 0 && s.d_model > 0 &&
         s.d_ff > 0 && aligned16(gate_up) && aligned16(down) && aligned16(x);
}

Status launch_moe_tc_gate_up(bf16* h, const MoeTables& tab, const bf16* x, const bf16* gate_up, const MoeShape& s,
                             int64_t slots, cudaStream_t stream) {
  return launch_any<Part::kGateUp>(h, tab, x, gate_up, s, slots, stream);
}

Status launch_moe_tc_down(float* y, const MoeTables& tab, const bf16* h, const bf16* down, const MoeShape& s,
                          int64_t slots, cudaStream_t stream) {
  return launch_any<Part::kDown>(y, tab, h, down, s, slots, stream);
}

}  // namespace tandem::cuda
