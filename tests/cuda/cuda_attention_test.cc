// CUDA attention parity against ref::attention (spec §1.6, ops.h AttentionArgs): GQA, full storage with begin > 0,
// wrapped rings with stale slots, sliding and drafter windows, non-causal, queries with no visible key, head dims
// 20..512, strided storage, out aliasing q, and long contexts that take the split-K paths of both kernels (the
// general one and the bf16 tensor-core kernel: decode and verify, GQA groups up to 8, several row chunks), prompt chunks
// of up to 200 tokens on the tensor-core kernel (row chunks starting mid-token, rings, windows). The range end read
// on the device (kv_end), also from a CUDA graph captured at one length and replayed at others. Outputs are
// poisoned (NaN) and so are the storage slots outside [begin, end): a kernel reading them fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/strings.h"
#include "cuda/cuda_fixture.h"
#include "kernels/ref/ref.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

using CudaOps = CudaTest;

// f32 outputs: the scores are f32 dot products (relative error ~ sqrt(head_dim) f32 ulps of |q||k|), exponentiated
// with expf and merged across warps/splits in another order than the double reference: ~1e-6..1e-5 normwise.
// 1e-4 keeps 10x headroom while a wrong key, slot, head or mask gives errors of order 1.
constexpr Tolerance kAttnF32{1e-4, 1e-3, 1e-4};

struct AttnCase {
  const char* name;
  int64_t n_tok, n_heads, n_kv, head_dim, capacity;
  int64_t begin, end;
  bool ring;
  int64_t window = 0;
  bool causal = true;
  float scale = 1.f;
  std::vector<int32_t> q_pos = {};  // empty: the last n_tok positions, end - n_tok .. end - 1
  bool strided = false;             // storage rows padded: stride[0] > capacity * head_dim
  bool alias = false;               // out is q
  bool device_end = false;          // end passed as kv_end (a device i32; a ring's begin must be max(0, end - cap))
  int64_t host_end = -1;            // kv.end with device_end (-1: end); another value only sizes the launch
};

std::string describe(const AttnCase& c, DType act, DType kv_dt) {
  return strfmt("%s: q %s kv %s, %lld tok, %lld/%lld heads, head_dim %lld, [%lld, %lld) cap %lld%s, window %lld%s",
                c.name, dtype_name(act), dtype_name(kv_dt), static_cast<long long>(c.n_tok),
                static_cast<long long>(c.n_heads), static_cast<long long>(c.n_kv),
                static_cast<long long>(c.head_dim), static_cast<long long>(c.begin), static_cast<long long>(c.end),
                static_cast<long long>(c.capacity), c.ring ? " ring" : "", static_cast<long long>(c.window),
                c.device_end ? ", device kv_end" : "");
}

// Random K/V in the slots of [begin, end); NaN in every other slot and in the padding rows.
void fill_kv(const AttnCase& c, HostTensor& k, HostTensor& v, uint32_t seed) {
  const int64_t rows = c.capacity + (c.strided ? 3 : 0), hd = c.head_dim;
  fill_random(k, seed);
  fill_random(v, seed + 1);
  std::vector<bool> valid(static_cast<size_t>(rows), false);
  for (int64_t pos = c.begin; pos < c.end; ++pos) valid[static_cast<size_t>(c.ring ? pos % c.capacity : pos)] = true;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t h = 0; h < c.n_kv; ++h)
    for (int64_t s = 0; s < rows; ++s)
      if (!valid[static_cast<size_t>(s)])
        for (int64_t d = 0; d < hd; ++d) {
          k.set((h * rows + s) * hd + d, nan);
          v.set((h * rows + s) * hd + d, nan);
        }
}

void fill_positions(const AttnCase& c, HostTensor& pos) {
  for (int64_t t = 0; t < c.n_tok; ++t)
    pos.seti(t, c.q_pos.empty() ? static_cast<int32_t>(c.end - c.n_tok + t) : c.q_pos[static_cast<size_t>(t)]);
}

// A view of `capacity` slots over the (possibly padded) storage.
Tensor slots_view(const AttnCase& c, const Tensor& storage) {
  Tensor t = storage;
  t.shape[1] = c.capacity;
  return t;
}

HostTensor reference(const AttnCase& c, DType act, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                     const HostTensor& pos) {
  HostTensor want(act, {c.n_tok, c.n_heads, c.head_dim});
  ref::attention({.out = want, .q = q, .kv = {.k = slots_view(c, k.t()), .v = slots_view(c, v.t()), .begin = c.begin,
                                              .end = c.end, .ring = c.ring},
                  .q_pos = pos, .window = c.window, .causal = c.causal, .scale = c.scale});
  return want;
}

// got (downloaded) against the reference, and a query that sees no key has an exact zero row (ops.h), not NaN and
// not an average.
void check_output(const AttnCase& c, DType act, const HostTensor& got, const HostTensor& want, const HostTensor& pos) {
  expect_close(got, want, act == kF32 ? kAttnF32 : tolerance_for(act));
  for (int64_t t = 0; t < c.n_tok; ++t) {
    const int64_t qp = pos.geti(t);
    int64_t lo = c.begin, hi = c.end;
    if (c.causal) hi = std::min(hi, qp + 1);
    if (c.window > 0) lo = std::max(lo, qp - c.window + 1);
    if (lo < hi) continue;
    for (int64_t i = 0; i < c.n_heads * c.head_dim; ++i) ASSERT_EQ(got.get(t * c.n_heads * c.head_dim + i), 0.f) << t;
  }
}

void run_case(cuda::CudaBackend& be, const AttnCase& c, DType act, DType kv_dt, uint32_t seed) {
  SCOPED_TRACE(describe(c, act, kv_dt));
  const int64_t pad = c.strided ? 3 : 0, hd = c.head_dim;
  DeviceTensor k(be, kv_dt, {c.n_kv, c.capacity + pad, hd}), v(be, kv_dt, {c.n_kv, c.capacity + pad, hd});
  DeviceTensor q(be, act, {c.n_tok, c.n_heads, hd}), out(be, act, {c.n_tok, c.n_heads, hd});
  DeviceTensor pos(be, kI32, {c.n_tok}), end(be, kI32, {1});
  fill_kv(c, k.host(), v.host(), seed);
  fill_random(q.host(), seed + 2);
  fill_positions(c, pos.host());
  end.host().seti(0, static_cast<int32_t>(c.end));
  for (DeviceTensor* t : {&k, &v, &q, &pos, &end}) t->upload();
  out.poison();

  const HostTensor want = reference(c, act, q.host(), k.host(), v.host(), pos.host());
  const Tensor& dst = c.alias ? q.t() : out.t();
  be.attention({.out = dst, .q = q, .kv = {.k = slots_view(c, k.t()), .v = slots_view(c, v.t()), .begin = c.begin,
                                           .end = c.device_end && c.host_end >= 0 ? c.host_end : c.end,
                                           .ring = c.ring},
                .q_pos = pos, .kv_end = c.device_end ? end.t() : Tensor{}, .window = c.window, .causal = c.causal,
                .scale = c.scale});
  DeviceTensor& got = c.alias ? q : out;
  got.download();
  check_output(c, act, got.host(), want, pos.host());
}

const std::vector<AttnCase>& cases() {
  static const std::vector<AttnCase> all = {
      // Prefill of a full layer from position 0 (e2b-tiny's sliding head dim, 4 query heads on 1 KV head).
      {.name = "prefill", .n_tok = 7, .n_heads = 4, .n_kv = 1, .head_dim = 20, .capacity = 64, .begin = 0,
       .end = 7, .ring = false},
      // begin > 0 (older positions dropped), GQA 6/3, and one query (position 4) before begin: a zero row.
      {.name = "begin>0", .n_tok = 3, .n_heads = 6, .n_kv = 3, .head_dim = 40, .capacity = 50, .begin = 5,
       .end = 30, .ring = false, .q_pos = {4, 28, 29}},
      {.name = "begin>0 strided", .n_tok = 3, .n_heads = 6, .n_kv = 3, .head_dim = 40, .capacity = 50, .begin = 5,
       .end = 30, .ring = false, .scale = 0.125f, .q_pos = {17, 28, 29}, .strided = true},
      // A wrapped sliding ring (W = 16, W + 1 + 4 slots) with two stale slots, a verify block of 5 queries.
      {.name = "ring window", .n_tok = 5, .n_heads = 4, .n_kv = 2, .head_dim = 256, .capacity = 21, .begin = 41,
       .end = 60, .ring = true, .window = 16},
      {.name = "ring window, out = q", .n_tok = 5, .n_heads = 4, .n_kv = 2, .head_dim = 256, .capacity = 21,
       .begin = 41, .end = 60, .ring = true, .window = 16, .alias = true},
      // The drafter's query: position P = end (past every key), window W + 1 over the ring.
      {.name = "drafter", .n_tok = 1, .n_heads = 4, .n_kv = 1, .head_dim = 256, .capacity = 25, .begin = 35,
       .end = 60, .ring = true, .window = 17, .q_pos = {60}},
      // Full-attention head dim 512 (31B), GQA 8/2.
      {.name = "head_dim 512", .n_tok = 4, .n_heads = 8, .n_kv = 2, .head_dim = 512, .capacity = 300, .begin = 0,
       .end = 300, .ring = false, .scale = 0.0625f},
      // Non-causal with a window, and an even head dim that is not a multiple of 4.
      {.name = "non-causal", .n_tok = 3, .n_heads = 2, .n_kv = 2, .head_dim = 34, .capacity = 40, .begin = 2,
       .end = 33, .ring = false, .window = 8, .causal = false, .q_pos = {10, 20, 0}},
      // Long single-token contexts: few rows, many keys -> split-K (full storage, then a windowed ring).
      {.name = "decode split-K full", .n_tok = 1, .n_heads = 8, .n_kv = 2, .head_dim = 512, .capacity = 4096,
       .begin = 0, .end = 3001, .ring = false, .scale = 0.05f},
      {.name = "decode split-K ring", .n_tok = 2, .n_heads = 4, .n_kv = 1, .head_dim = 256, .capacity = 1100,
       .begin = 3901, .end = 5000, .ring = true, .window = 1024, .scale = 0.1f},
      // Split-K where some queries see no key and others only a few: q before begin, and a tiny window.
      {.name = "split-K with empty rows", .n_tok = 3, .n_heads = 2, .n_kv = 1, .head_dim = 40, .capacity = 2048,
       .begin = 100, .end = 2000, .ring = false, .window = 0, .q_pos = {50, 1999, 150}},
      {.name = "split-K small window", .n_tok = 1, .n_heads = 2, .n_kv = 2, .head_dim = 20, .capacity = 2048,
       .begin = 0, .end = 2000, .ring = false, .window = 3},
      // The decode kernel's shapes (bf16): 31B full layers (GQA 8, head_dim 512) for decode and a 9-token verify
      // (72 rows: two row chunks), 16 tokens (four chunks), a verify over a wrapped sliding ring, queries before
      // begin / with short ranges, and queries far apart (gaps in the union of their ranges).
      {.name = "gqa8 hd512 decode split-K", .n_tok = 1, .n_heads = 16, .n_kv = 2, .head_dim = 512,
       .capacity = 4096, .begin = 0, .end = 3001, .ring = false, .scale = 0.05f},
      {.name = "gqa8 hd512 verify 9", .n_tok = 9, .n_heads = 16, .n_kv = 2, .head_dim = 512, .capacity = 2600,
       .begin = 0, .end = 2500, .ring = false, .scale = 0.05f},
      {.name = "gqa8 16 tokens", .n_tok = 16, .n_heads = 8, .n_kv = 1, .head_dim = 256, .capacity = 1200,
       .begin = 0, .end = 1100, .ring = false, .scale = 0.1f},
      {.name = "ring verify split-K", .n_tok = 9, .n_heads = 4, .n_kv = 2, .head_dim = 256, .capacity = 1033,
       .begin = 3967, .end = 5000, .ring = true, .window = 1024, .scale = 0.1f},
      {.name = "verify rows before begin", .n_tok = 4, .n_heads = 8, .n_kv = 1, .head_dim = 128, .capacity = 2048,
       .begin = 600, .end = 2000, .ring = false, .scale = 0.1f, .q_pos = {500, 700, 1998, 1999}},
      {.name = "queries far apart", .n_tok = 3, .n_heads = 8, .n_kv = 2, .head_dim = 64, .capacity = 4096,
       .begin = 0, .end = 4000, .ring = false, .window = 100, .scale = 0.2f, .q_pos = {150, 2000, 3999}},
      {.name = "hd512 strided", .n_tok = 2, .n_heads = 8, .n_kv = 1, .head_dim = 512, .capacity = 700, .begin = 0,
       .end = 650, .ring = false, .scale = 0.05f, .strided = true},
      // The end read on the device (kv_end); kv.end is then a stale value that only sizes the launch. A ring's
      // begin follows the device end (end - capacity).
      {.name = "kv_end full split-K", .n_tok = 1, .n_heads = 16, .n_kv = 2, .head_dim = 512, .capacity = 4096,
       .begin = 0, .end = 3001, .ring = false, .scale = 0.05f, .device_end = true, .host_end = 4096},
      {.name = "kv_end full begin>0", .n_tok = 3, .n_heads = 4, .n_kv = 1, .head_dim = 20, .capacity = 2048,
       .begin = 100, .end = 1500, .ring = false, .q_pos = {50, 1000, 1499}, .device_end = true, .host_end = 200},
      {.name = "kv_end ring window", .n_tok = 5, .n_heads = 4, .n_kv = 2, .head_dim = 256, .capacity = 21,
       .begin = 39, .end = 60, .ring = true, .window = 16, .device_end = true},
      {.name = "kv_end ring split-K", .n_tok = 2, .n_heads = 4, .n_kv = 1, .head_dim = 256, .capacity = 1100,
       .begin = 3900, .end = 5000, .ring = true, .window = 1024, .scale = 0.1f, .device_end = true, .host_end = 4000},
  };
  return all;
}

TEST_F(CudaOps, AttentionMatchesReference) {
  uint32_t seed = 700;
  const DType combos[][2] = {{kBF16, kBF16}, {kF32, kF32}, {kF32, kBF16}};
  for (const AttnCase& c : cases()) {
    for (const auto& dt : combos) {
      run_case(be(), c, dt[0], dt[1], seed);
      seed += 3;
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaOps, AttentionHeadDimsOfTheReleasedModels) {
  // Gemma 4's sliding (256) and full (512) head dims and the tiny fixtures' (16, 20, 24, 32, 40), one decode
  // query over a short context and a prefill block, bf16 as the model runs them.
  uint32_t seed = 900;
  for (int64_t hd : {16, 20, 24, 32, 40, 256, 512}) {
    for (int64_t n_tok : {1, 9}) {
      const AttnCase c{.name = "head dims", .n_tok = n_tok, .n_heads = 4, .n_kv = 2, .head_dim = hd,
                       .capacity = 48, .begin = 0, .end = 41, .ring = false};
      run_case(be(), c, kBF16, kBF16, seed++);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaOps, AttentionDecodeTokenCounts) {
  // Every verify size up to 9 tokens (and 12, 16) on a 31B full layer's group (8 query heads per KV head, head_dim
  // 512) over a split-K context: 8 to 128 query rows, one to four row chunks.
  uint32_t seed = 1100;
  for (int64_t n_tok : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16}) {
    const AttnCase c{.name = "decode tokens", .n_tok = n_tok, .n_heads = 8, .n_kv = 1, .head_dim = 512,
                     .capacity = 1600, .begin = 0, .end = 1500, .ring = false, .scale = 0.05f};
    run_case(be(), c, kBF16, kBF16, seed++);
    if (HasFatalFailure()) return;
  }
}

// Sets the prompt-chunk attention mode (whether it takes head dim 512, and its wgmma form) for one test and restores
// them.
struct PrefillModeScope {
  cuda::PrefillAttention before = cuda::prefill_attention();
  bool wide_before = cuda::prefill_attention_512();
  int wg_before = cuda::prefill_attention_wgmma();
  explicit PrefillModeScope(cuda::PrefillAttention m, bool wide = cuda::prefill_attention_512(),
                            int wg = cuda::prefill_attention_wgmma()) {
    cuda::set_prefill_attention(m);
    cuda::set_prefill_attention_512(wide);
    cuda::set_prefill_attention_wgmma(wg);
  }
  ~PrefillModeScope() {
    cuda::set_prefill_attention(before);
    cuda::set_prefill_attention_512(wide_before);
    cuda::set_prefill_attention_wgmma(wg_before);
  }
  PrefillModeScope(const PrefillModeScope&) = delete;
  PrefillModeScope& operator=(const PrefillModeScope&) = delete;
};

// Runs bf16 cases in order with seeds seed, seed + 3, ...; stops at the first fatal failure.
void run_bf16_cases(cuda::CudaBackend& be, std::span<const AttnCase> cases, uint32_t seed) {
  for (const AttnCase& c : cases) {
    run_case(be, c, kBF16, kBF16, seed);
    seed += 3;
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST_F(CudaOps, AttentionPrefillChunksOnTheTensorCores) {
  // bf16 prompt chunks on the decode kernel's tensor-core path (the flash kernel off): each 40-row block reads the
  // union of its own tokens' ranges (a causal block stops at its last token) and masks per token. Shapes of the
  // released models' layers and odd ones: 40 tokens per block (group 1), row chunks that start inside a token's
  // group (group 3), a wrapped sliding ring with stale slots, full head_dim 512, few blocks that split the keys,
  // and a non-causal window.
  const PrefillModeScope scope(cuda::PrefillAttention::kOff);
  const AttnCase prompt_cases[] = {
      {.name = "prompt from 0", .n_tok = 200, .n_heads = 8, .n_kv = 1, .head_dim = 256, .capacity = 256,
       .begin = 0, .end = 200, .ring = false, .scale = 0.1f},
      {.name = "prompt chunk on a sliding ring", .n_tok = 96, .n_heads = 4, .n_kv = 2, .head_dim = 256,
       .capacity = 161, .begin = 341, .end = 500, .ring = true, .window = 64, .scale = 0.1f},
      {.name = "prompt chunk hd512 gqa8", .n_tok = 64, .n_heads = 16, .n_kv = 2, .head_dim = 512, .capacity = 400,
       .begin = 0, .end = 300, .ring = false, .scale = 0.05f},
      {.name = "gqa3, chunks start mid-token", .n_tok = 50, .n_heads = 6, .n_kv = 2, .head_dim = 128,
       .capacity = 200, .begin = 10, .end = 180, .ring = false, .scale = 0.1f},
      {.name = "group 1, 40 tokens per block", .n_tok = 45, .n_heads = 2, .n_kv = 2, .head_dim = 256,
       .capacity = 64, .begin = 0, .end = 60, .ring = false, .scale = 0.1f},
      {.name = "prompt chunk split-K", .n_tok = 48, .n_heads = 8, .n_kv = 1, .head_dim = 512, .capacity = 3000,
       .begin = 0, .end = 2900, .ring = false, .scale = 0.05f},
      {.name = "non-causal window", .n_tok = 33, .n_heads = 4, .n_kv = 1, .head_dim = 64, .capacity = 100,
       .begin = 0, .end = 90, .ring = false, .window = 20, .causal = false, .scale = 0.2f},
  };
  run_bf16_cases(be(), prompt_cases, 1200);
}

// The flash-attention prompt-chunk kernel (attention_prefill.cu), forced on for every chunk it takes (by default
// only launches of 64 blocks or more): head dims 64, 128 and 256; GQA groups 1, 2, 3 and 8 with 64-row blocks that
// start inside a token's group and a last block of a few rows; a wrapped ring smaller than one 32-key tile, with stale
// slots; begin > 0 with queries before it (zero rows); a non-causal window; out = q; the end read on the device.
// Each form: mma.sync, and wgmma with one or two warpgroups per block, two with four K/V stages (Hopper; elsewhere
// the switch falls back to mma.sync).
void run_prefill_kernel_cases(cuda::CudaBackend& be, int wgmma) {
  const PrefillModeScope scope(cuda::PrefillAttention::kAlways, cuda::prefill_attention_512(), wgmma);
  std::vector<int32_t> before_begin(40);
  for (int32_t t = 0; t < 40; ++t) before_begin[static_cast<size_t>(t)] = 90 + 3 * t;  // 90..207, begin 100
  const AttnCase prompt_cases[] = {
      {.name = "hd256 gqa2 from 0", .n_tok = 150, .n_heads = 4, .n_kv = 2, .head_dim = 256, .capacity = 160,
       .begin = 0, .end = 150, .ring = false, .scale = 0.1f},
      {.name = "hd256 gqa8 sliding ring", .n_tok = 96, .n_heads = 8, .n_kv = 1, .head_dim = 256, .capacity = 161,
       .begin = 341, .end = 500, .ring = true, .window = 64, .scale = 0.1f},
      {.name = "hd128 gqa3, blocks start mid-token", .n_tok = 70, .n_heads = 6, .n_kv = 2, .head_dim = 128,
       .capacity = 300, .begin = 10, .end = 280, .ring = false, .scale = 0.1f},
      {.name = "hd64 group 1", .n_tok = 45, .n_heads = 2, .n_kv = 2, .head_dim = 64, .capacity = 64, .begin = 0,
       .end = 60, .ring = false, .scale = 0.2f},
      {.name = "ring smaller than a tile", .n_tok = 40, .n_heads = 4, .n_kv = 2, .head_dim = 256, .capacity = 21,
       .begin = 39, .end = 60, .ring = true, .window = 16, .scale = 0.1f},
      {.name = "queries before begin", .n_tok = 40, .n_heads = 4, .n_kv = 1, .head_dim = 128, .capacity = 256,
       .begin = 100, .end = 210, .ring = false, .scale = 0.1f, .q_pos = before_begin},
      {.name = "non-causal window", .n_tok = 33, .n_heads = 4, .n_kv = 1, .head_dim = 64, .capacity = 100,
       .begin = 0, .end = 90, .ring = false, .window = 20, .causal = false, .scale = 0.2f},
      {.name = "out = q", .n_tok = 64, .n_heads = 4, .n_kv = 2, .head_dim = 256, .capacity = 128, .begin = 0,
       .end = 100, .ring = false, .scale = 0.1f, .alias = true},
      {.name = "device end", .n_tok = 48, .n_heads = 8, .n_kv = 2, .head_dim = 128, .capacity = 512, .begin = 0,
       .end = 400, .ring = false, .scale = 0.1f, .device_end = true, .host_end = 512},
  };
  run_bf16_cases(be, prompt_cases, 1250);
}
TEST_F(CudaOps, AttentionPrefillKernelMatchesReference) { run_prefill_kernel_cases(be(), /*wgmma=*/0); }
TEST_F(CudaOps, AttentionPrefillKernelWgmmaMatchesReference) {
  for (int wgmma = 1; wgmma <= 3 && !HasFatalFailure(); ++wgmma) run_prefill_kernel_cases(be(), wgmma);
}

// The flash kernel at head dim 512 (the full layers; set_prefill_attention_512), where two warps
// share 16 rows and swap their partial scores: GQA 8 with a last block of a few rows, a ring with a window, queries
// before begin, out = q and the end read on the device.
TEST_F(CudaOps, AttentionPrefillKernelHeadDim512MatchesReference) {
  const PrefillModeScope scope(cuda::PrefillAttention::kAlways, /*wide=*/true);
  std::vector<int32_t> before_begin(36);
  for (int32_t t = 0; t < 36; ++t) before_begin[static_cast<size_t>(t)] = 80 + 4 * t;  // 80..220, begin 100
  const AttnCase prompt_cases[] = {
      {.name = "hd512 gqa8 from 0", .n_tok = 70, .n_heads = 16, .n_kv = 2, .head_dim = 512, .capacity = 128,
       .begin = 0, .end = 70, .ring = false, .scale = 0.05f},
      {.name = "hd512 gqa4 sliding ring", .n_tok = 48, .n_heads = 4, .n_kv = 1, .head_dim = 512, .capacity = 100,
       .begin = 402, .end = 500, .ring = true, .window = 40, .scale = 0.05f},
      {.name = "hd512 queries before begin", .n_tok = 36, .n_heads = 8, .n_kv = 1, .head_dim = 512,
       .capacity = 256, .begin = 100, .end = 230, .ring = false, .scale = 0.05f, .q_pos = before_begin},
      {.name = "hd512 out = q", .n_tok = 40, .n_heads = 8, .n_kv = 2, .head_dim = 512, .capacity = 200, .begin = 0,
       .end = 150, .ring = false, .scale = 0.05f, .alias = true},
      {.name = "hd512 device end", .n_tok = 33, .n_heads = 4, .n_kv = 2, .head_dim = 512, .capacity = 400,
       .begin = 0, .end = 300, .ring = false, .scale = 0.05f, .device_end = true, .host_end = 400},
  };
  run_bf16_cases(be(), prompt_cases, 1290);
}

// Captures attention with a device kv_end into a CUDA graph at ends[0] (launch sized for the capacity), then
// replays it at each end after writing that end and its query positions to the device: every replay must match
// the reference at its own length. For a ring, begin = max(0, end - capacity); for a full store it stays c.begin.
void run_graph_case(cuda::CudaBackend& be, const AttnCase& base, DType act, DType kv_dt,
                    const std::vector<int64_t>& ends, uint32_t seed) {
  auto at = [&](int64_t end) {
    AttnCase c = base;
    c.end = end;
    if (c.ring) c.begin = std::max<int64_t>(0, end - c.capacity);
    return c;
  };
  const AttnCase c0 = at(ends[0]);
  const int64_t hd = base.head_dim;
  DeviceTensor k(be, kv_dt, {base.n_kv, base.capacity, hd}), v(be, kv_dt, {base.n_kv, base.capacity, hd});
  DeviceTensor q(be, act, {base.n_tok, base.n_heads, hd}), out(be, act, {base.n_tok, base.n_heads, hd});
  DeviceTensor pos(be, kI32, {base.n_tok}), end(be, kI32, {1});
  fill_random(q.host(), seed);
  q.upload();
  const AttentionArgs args{.out = out, .q = q,
                           .kv = {.k = k, .v = v, .begin = c0.begin, .end = c0.end, .ring = base.ring},
                           .q_pos = pos, .kv_end = end, .window = base.window, .causal = base.causal,
                           .scale = base.scale};
  // One eager call first, as the engine warms up before capturing (the decode kernel's first launch per device
  // sets its shared-memory attribute).
  fill_kv(c0, k.host(), v.host(), seed + 1);
  fill_positions(c0, pos.host());
  end.host().seti(0, static_cast<int32_t>(c0.end));
  for (DeviceTensor* t : {&k, &v, &pos, &end}) t->upload();
  be.attention(args);
  const Status eager = be.synchronize();
  ASSERT_TRUE(eager.ok()) << eager.to_string();
  // The engine's capture (Backend::capture: the current stream, thread-local capture mode).
  Result<Backend::GraphId> graph = be.capture([&] {
    be.attention(args);
    return ok_status();
  });
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  for (int64_t e : ends) {
    const AttnCase c = at(e);
    SCOPED_TRACE(describe(c, act, kv_dt) + " (graph replay)");
    fill_kv(c, k.host(), v.host(), seed + 1 + static_cast<uint32_t>(e));
    fill_positions(c, pos.host());
    end.host().seti(0, static_cast<int32_t>(e));
    for (DeviceTensor* t : {&k, &v, &pos, &end}) t->upload();
    out.poison();
    const Status replayed = be.replay(*graph);
    ASSERT_TRUE(replayed.ok()) << replayed.to_string();
    out.download();
    check_output(c, act, out.host(), reference(c, act, q.host(), k.host(), v.host(), pos.host()), pos.host());
    if (::testing::Test::HasFatalFailure()) break;
  }
  be.release_graph(*graph);
}

TEST_F(CudaOps, AttentionKvEndGraphReplay) {
  // Decode kernel: 31B full decode (split-K sized for 4096 keys, replayed from 5 to 4096 keys) and a sliding verify
  // over a ring before and after it wraps; general kernel: the same ring in f32 and a bf16 head dim it does not take.
  const AttnCase full{.name = "graph full decode", .n_tok = 1, .n_heads = 16, .n_kv = 2, .head_dim = 512,
                      .capacity = 4096, .begin = 0, .end = 0, .ring = false, .scale = 0.05f};
  const AttnCase ring{.name = "graph ring verify", .n_tok = 4, .n_heads = 4, .n_kv = 2, .head_dim = 256,
                      .capacity = 1033, .begin = 0, .end = 0, .ring = true, .window = 1024, .scale = 0.1f};
  const AttnCase odd{.name = "graph general kernel", .n_tok = 2, .n_heads = 4, .n_kv = 1, .head_dim = 20,
                     .capacity = 2048, .begin = 0, .end = 0, .ring = false};
  run_graph_case(be(), full, kBF16, kBF16, {64, 5, 3001, 4096}, 1300);
  if (HasFatalFailure()) return;
  run_graph_case(be(), ring, kBF16, kBF16, {10, 700, 1033, 5000}, 1400);
  if (HasFatalFailure()) return;
  run_graph_case(be(), ring, kF32, kBF16, {10, 5000}, 1500);
  if (HasFatalFailure()) return;
  run_graph_case(be(), odd, kBF16, kBF16, {30, 2048}, 1600);
}

// The decode kernel cuts the keys by the range alone, so a graph launch sized for the capacity (its trailing
// splits empty) gives the eager launch's bits at every length: one split or several, window or full, and row
// chunkings of 9 and 64 tokens. Eager: kv.end = end, no kv_end (launch sized by the range).
TEST_F(CudaOps, AttentionDecodeGraphEqualsEagerBitwise) {
  struct Shape {
    int64_t n_tok, n_heads, n_kv, head_dim, capacity, window;
    std::vector<int64_t> ends;
  };
  const Shape shapes[] = {{1, 8, 1, 512, 4096, 0, {5, 33, 300, 1500, 4096}},
                          {1, 8, 1, 256, 4096, 512, {20, 300, 2000}},
                          {9, 16, 2, 256, 2048, 1024, {40, 700, 2048}},
                          {64, 8, 1, 256, 2048, 0, {100, 700, 2048}}};
  uint32_t seed = 1700;
  for (const Shape& sh : shapes) {
    const int64_t hd = sh.head_dim;
    DeviceTensor k(be(), kBF16, {sh.n_kv, sh.capacity, hd}), v(be(), kBF16, {sh.n_kv, sh.capacity, hd});
    DeviceTensor q(be(), kBF16, {sh.n_tok, sh.n_heads, hd}), out(be(), kBF16, {sh.n_tok, sh.n_heads, hd});
    DeviceTensor pos(be(), kI32, {sh.n_tok}), end(be(), kI32, {1});
    fill_random(q.host(), seed);
    fill_random(k.host(), seed + 1);
    fill_random(v.host(), seed + 2);
    seed += 3;
    for (DeviceTensor* t : {&q, &k, &v}) t->upload();
    const KvView kv{.k = k, .v = v, .begin = 0, .end = sh.ends[0], .ring = false};
    const AttentionArgs graph_args{.out = out, .q = q, .kv = kv, .q_pos = pos, .kv_end = end, .window = sh.window};
    auto set_end = [&](int64_t e) {
      for (int64_t t = 0; t < sh.n_tok; ++t) pos.host().seti(t, static_cast<int32_t>(e - sh.n_tok + t));
      end.host().seti(0, static_cast<int32_t>(e));
      pos.upload();
      end.upload();
    };
    set_end(sh.ends[0]);
    be().attention(graph_args);  // warm-up (the kernel's shared-memory attribute), as the engine does
    ASSERT_TRUE(be().synchronize().ok());
    Result<Backend::GraphId> graph = be().capture([&] {
      be().attention(graph_args);
      return ok_status();
    });
    ASSERT_TRUE(graph.ok()) << graph.status().to_string();
    for (int64_t e : sh.ends) {
      SCOPED_TRACE(strfmt("%lld tok, %lld/%lld heads, head_dim %lld, window %lld, end %lld",
                          static_cast<long long>(sh.n_tok), static_cast<long long>(sh.n_heads),
                          static_cast<long long>(sh.n_kv), static_cast<long long>(hd),
                          static_cast<long long>(sh.window), static_cast<long long>(e)));
      set_end(e);
      out.poison();
      ASSERT_TRUE(be().replay(*graph).ok());
      out.download();
      std::vector<unsigned char> replayed(out.host().t().nbytes());
      std::memcpy(replayed.data(), out.host().t().data, replayed.size());
      out.poison();
      KvView eager_kv = kv;
      eager_kv.end = e;
      be().attention({.out = out, .q = q, .kv = eager_kv, .q_pos = pos, .window = sh.window});
      ASSERT_TRUE(be().synchronize().ok());
      out.download();
      ASSERT_EQ(std::memcmp(replayed.data(), out.host().t().data, replayed.size()), 0);
    }
    be().release_graph(*graph);
  }
}

TEST_F(CudaOps, AttentionUnsupportedIsRecordedNotFatal) {
  // f16 activations and a head dim over 512 are not handled: a recorded kUnsupported, the output left alone.
  DeviceTensor kv(be(), kBF16, {1, 8, 16}), pos(be(), kI32, {1});
  DeviceTensor q16(be(), DType::kF16, {1, 2, 16}), out16(be(), DType::kF16, {1, 2, 16});
  pos.host().seti(0, 3);
  pos.upload();
  be().attention({.out = out16, .q = q16, .kv = {.k = kv, .v = kv, .begin = 0, .end = 4}, .q_pos = pos});
  Status st = be().last_error();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  DeviceTensor big_kv(be(), kBF16, {1, 8, 520}), q(be(), kBF16, {1, 1, 520}), out(be(), kBF16, {1, 1, 520});
  out.poison();
  be().attention({.out = out, .q = q, .kv = {.k = big_kv, .v = big_kv, .begin = 0, .end = 4}, .q_pos = pos});
  st = be().synchronize();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  out.download();
  EXPECT_FALSE(has_no_nan(out.host()));
  EXPECT_TRUE(be().supports(Op::kAttention, kBF16));
  EXPECT_TRUE(be().supports(Op::kMoeRoute, kBF16));
  EXPECT_TRUE(be().supports(Op::kMoeExperts, kF32));
  EXPECT_FALSE(be().supports(Op::kMoeExperts, DType::kF16));
}

}  // namespace
}  // namespace tandem::testing
