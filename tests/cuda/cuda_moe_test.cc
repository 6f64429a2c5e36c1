// CUDA mixture-of-experts parity against kernels/ref (spec §1.10, ops.h MoeRouteArgs / MoeExpertsArgs): routing
// (softmax over all experts, top-k with ties to the lower index, renormalise, per-expert scale) with exact expert
// indices, and the experts' GeGLU + down projection + weighted sum on odd and vector-friendly sizes, bf16 and f32:
// Gemma 4 26B-A4B's shapes, tokens sharing experts, duplicate / invalid indices, token chunks, and a CUDA graph
// replayed under new routing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
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

HostTensor reference_experts(const DeviceTensor& gate_up, const DeviceTensor& down, const DeviceTensor& x,
                             const DeviceTensor& idx, const DeviceTensor& w);

TEST_F(CudaOps, MoeRouteMatchesReferenceWithTies) {
  uint32_t seed = 1100;
  for (DType dt : {kBF16, kF32}) {
    for (int64_t n_exp : {5, 37, 128, 300}) {  // 300: more than four logits per lane
      for (int k : {1, 2, 8}) {
        if (k > n_exp) continue;
        for (int64_t n_tok : {1, 3, 17}) {
          SCOPED_TRACE(strfmt("%s experts %lld k %d tok %lld", dtype_name(dt), static_cast<long long>(n_exp), k,
                              static_cast<long long>(n_tok)));
          DeviceTensor logits(be(), dt, {n_tok, n_exp}), pes(be(), kBF16, {n_exp});
          DeviceTensor idx(be(), kI32, {n_tok, k}), w(be(), kF32, {n_tok, k});
          std::mt19937 rng(seed++);
          logits.host().fill_uniform(rng, -4.f, 4.f);
          pes.host().fill_uniform(rng, 0.5f, 1.5f);
          // Ties: token 0 holds its maximum three times and a runner-up twice; the lower index must come first.
          logits.host().set(n_exp - 1, 9.f);
          logits.host().set(n_exp / 2, 9.f);
          logits.host().set(0, 9.f);
          if (n_exp > 4) {
            logits.host().set(1, 6.f);
            logits.host().set(3, 6.f);
          }
          for (DeviceTensor* t : {&logits, &pes}) t->upload();
          idx.poison();
          w.poison();
          be().moe_route({.idx = idx, .weights = w, .logits = logits, .per_expert_scale = pes, .k = k});
          idx.download();
          w.download();
          HostTensor want_idx(kI32, {n_tok, k}), want_w(kF32, {n_tok, k});
          ref::moe_route({.idx = want_idx, .weights = want_w, .logits = logits.host(), .per_expert_scale = pes.host(),
                          .k = k});
          for (int64_t i = 0; i < n_tok * k; ++i) ASSERT_EQ(idx.host().geti(i), want_idx.geti(i)) << "slot " << i;
          // Weights are f32 in both: softmax / renormalisation in f32 vs double, a few f32 ulps apart.
          expect_close(w.host(), want_w, tolerance_for(kF32));
          EXPECT_EQ(idx.host().geti(0), 0);
          if (k >= 2) {
            EXPECT_EQ(idx.host().geti(1), n_exp / 2);
          }
        }
      }
    }
  }
}

struct ExpertCase {
  int64_t n_exp, d_model, d_ff;
  int k;
};

TEST_F(CudaOps, MoeExpertsMatchReference) {
  // 26b-tiny's shapes (56 / 20, odd for vector loads), odd sizes, and sizes that take the 8-wide weight loads.
  const ExpertCase shapes[] = {{5, 56, 20, 2}, {7, 67, 37, 3}, {16, 256, 128, 8}, {4, 64, 8, 4}};
  const DType combos[][2] = {{kBF16, kBF16}, {kBF16, kF32}, {kF32, kF32}};  // {weights, activations}
  uint32_t seed = 1300;
  for (const ExpertCase& s : shapes) {
    for (const auto& dt : combos) {
      for (int64_t n_tok : {1, 3, 17}) {
        SCOPED_TRACE(strfmt("experts %lld d_model %lld d_ff %lld k %d, weights %s act %s, tok %lld",
                            static_cast<long long>(s.n_exp), static_cast<long long>(s.d_model),
                            static_cast<long long>(s.d_ff), s.k, dtype_name(dt[0]), dtype_name(dt[1]),
                            static_cast<long long>(n_tok)));
        DeviceTensor gate_up(be(), dt[0], {s.n_exp, 2 * s.d_ff, s.d_model}), down(be(), dt[0], {s.n_exp, s.d_model, s.d_ff});
        DeviceTensor x(be(), dt[1], {n_tok, s.d_model}), out(be(), dt[1], {n_tok, s.d_model});
        DeviceTensor idx(be(), kI32, {n_tok, s.k}), w(be(), kF32, {n_tok, s.k});
        std::mt19937 rng(seed++);
        // Weights ~ N(0, 1/fan_in) as in the fixtures, so activations keep unit scale through both projections.
        gate_up.host().fill_normal(rng, static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d_model))));
        down.host().fill_normal(rng, static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d_ff))));
        x.host().fill_normal(rng, 1.f);
        // Routing as the model does it: distinct experts by decreasing logit, weights summing to ~1.
        HostTensor logits(kF32, {n_tok, s.n_exp}), pes(kF32, {s.n_exp});
        logits.fill_uniform(rng, -3.f, 3.f);
        pes.fill_uniform(rng, 0.5f, 1.5f);
        ref::moe_route({.idx = idx.host(), .weights = w.host(), .logits = logits, .per_expert_scale = pes, .k = s.k});
        for (DeviceTensor* t : {&gate_up, &down, &x, &idx, &w}) t->upload();
        out.poison();
        be().moe_experts({.out = out, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w});
        out.download();
        // bf16 activations: against a reference that rounds gate, up and h to bf16 at the kernel's (HF's) points.
        // f32: two chained dot products, linear's bound.
        expect_close(out.host(), reference_experts(gate_up, down, x, idx, w), tolerance_for(dt[1], /*is_linear=*/true));
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(CudaOps, MoeExpertsOneExpertEqualsTheDenseMlp) {
  // k = 1 with weight 1: the output is exactly down(gelu(gate x) * up x) of that expert, for every token on a
  // different expert, which checks the gate/up halves are not swapped and each token reads its own expert.
  const int64_t n_exp = 3, d_model = 64, d_ff = 16, n_tok = 3;
  DeviceTensor gate_up(be(), kF32, {n_exp, 2 * d_ff, d_model}), down(be(), kF32, {n_exp, d_model, d_ff});
  DeviceTensor x(be(), kF32, {n_tok, d_model}), out(be(), kF32, {n_tok, d_model});
  DeviceTensor idx(be(), kI32, {n_tok, 1}), w(be(), kF32, {n_tok, 1});
  fill_random(gate_up.host(), 1);
  fill_random(down.host(), 2);
  fill_random(x.host(), 3);
  for (int64_t t = 0; t < n_tok; ++t) {
    idx.host().seti(t, static_cast<int32_t>(n_tok - 1 - t));
    w.host().set(t, 1.f);
  }
  for (DeviceTensor* t : {&gate_up, &down, &x, &idx, &w}) t->upload();
  out.poison();
  be().moe_experts({.out = out, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w});
  out.download();
  for (int64_t t = 0; t < n_tok; ++t) {
    const int64_t e = n_tok - 1 - t;
    std::vector<double> h(d_ff);
    for (int64_t f = 0; f < d_ff; ++f) {
      double g = 0, u = 0;
      for (int64_t i = 0; i < d_model; ++i) {
        g += x.host().get(t * d_model + i) * gate_up.host().get((e * 2 * d_ff + f) * d_model + i);
        u += x.host().get(t * d_model + i) * gate_up.host().get((e * 2 * d_ff + d_ff + f) * d_model + i);
      }
      h[f] = ref::gelu_tanh(static_cast<float>(g)) * u;
    }
    for (int64_t o = 0; o < d_model; ++o) {
      double y = 0;
      for (int64_t f = 0; f < d_ff; ++f) y += down.host().get((e * d_model + o) * d_ff + f) * h[f];
      EXPECT_NEAR(out.host().get(t * d_model + o), y, 1e-4 * (1 + std::fabs(y))) << "token " << t << " out " << o;
    }
  }
}

// Uniform values with standard deviation `stddev` from a fast LCG (the 26B-sized expert tensors hold 760M elements,
// too many for std::normal_distribution in a unit test). Weights ~ 1/sqrt(fan_in) keep activations at unit scale.
void fill_fast(HostTensor& t, uint32_t seed, double stddev) {
  const auto a = static_cast<float>(stddev * std::sqrt(3.0));
  uint32_t s = seed * 2654435761u + 12345u;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s = s * 1664525u + 1013904223u;
    t.set(i, a * (static_cast<float>(s >> 8) * (2.f / 16777216.f) - 1.f));
  }
}

// idx / weights as the model routes them (ref::moe_route over uniform logits), uploaded. With period > 0, token t
// takes token t % period's logits, so those tokens pick exactly the same experts.
void route_random(DeviceTensor& idx, DeviceTensor& w, int64_t n_exp, uint32_t seed, int64_t period = 0) {
  const int64_t n_tok = idx.t().shape[0];
  const int k = static_cast<int>(idx.t().shape[1]);
  HostTensor logits(kF32, {n_tok, n_exp}), pes(kF32, {n_exp});
  std::mt19937 rng(seed);
  logits.fill_uniform(rng, -3.f, 3.f);
  pes.fill_uniform(rng, 0.5f, 1.5f);
  if (period > 0) {
    for (int64_t t = period; t < n_tok; ++t)
      for (int64_t e = 0; e < n_exp; ++e) logits.set(t * n_exp + e, logits.get((t % period) * n_exp + e));
  }
  ref::moe_route({.idx = idx.host(), .weights = w.host(), .logits = logits, .per_expert_scale = pes, .k = k});
  idx.upload();
  w.upload();
}

int64_t distinct_experts(const HostTensor& idx) {
  std::vector<int32_t> v(static_cast<size_t>(idx.numel()));
  for (int64_t i = 0; i < idx.numel(); ++i) v[static_cast<size_t>(i)] = idx.geti(i);
  std::sort(v.begin(), v.end());
  return std::unique(v.begin(), v.end()) - v.begin();
}

// The most (token, slot) pairs any one expert serves.
int64_t max_pairs_per_expert(const HostTensor& idx, int64_t n_exp) {
  std::vector<int64_t> count(static_cast<size_t>(n_exp));
  for (int64_t i = 0; i < idx.numel(); ++i) ++count[static_cast<size_t>(idx.geti(i))];
  return *std::max_element(count.begin(), count.end());
}

// The reference output for the current host copies. With bf16 activations the kernel rounds gate, up, gelu(gate)
// and h to bf16 as HF's bf16 tensors are (moe.cu); the reference does the same, in double between the roundings,
// because those roundings alone move an output element by up to ~2% of the output's RMS (600 tokens x top-8 of 32
// experts at d_ff 32 showed it), more than the elementwise bound allows against the unrounded reference.
HostTensor reference_experts(const DeviceTensor& gate_up, const DeviceTensor& down, const DeviceTensor& x,
                             const DeviceTensor& idx, const DeviceTensor& w) {
  HostTensor want(x.t().dtype, {x.t().shape[0], x.t().shape[1]});
  if (x.t().dtype != kBF16) {
    ref::moe_experts({.out = want,
                      .x = x.host(),
                      .gate_up = gate_up.host(),
                      .down = down.host(),
                      .idx = idx.host(),
                      .weights = w.host()});
    return want;
  }
  const int64_t d_ff = gate_up.t().shape[1] / 2, d_model = gate_up.t().shape[2];
  const int64_t n_tok = x.t().shape[0], k = idx.t().shape[1];
  const auto bf = [](double v) { return static_cast<double>(round_bf16(static_cast<float>(v))); };
  std::vector<double> h(static_cast<size_t>(d_ff)), acc(static_cast<size_t>(d_model));
  for (int64_t t = 0; t < n_tok; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = idx.host().geti(t * k + j);
      for (int64_t f = 0; f < d_ff; ++f) {
        double g = 0, u = 0;
        for (int64_t i = 0; i < d_model; ++i) {
          const double xi = x.host().get(t * d_model + i);
          g += xi * gate_up.host().get((e * 2 * d_ff + f) * d_model + i);
          u += xi * gate_up.host().get((e * 2 * d_ff + d_ff + f) * d_model + i);
        }
        h[f] = bf(bf(ref::gelu_tanh(static_cast<float>(bf(g)))) * bf(u));
      }
      for (int64_t o = 0; o < d_model; ++o) {
        double y = 0;
        for (int64_t f = 0; f < d_ff; ++f) y += down.host().get((e * d_model + o) * d_ff + f) * h[f];
        acc[o] += w.host().get(t * k + j) * y;
      }
    }
    for (int64_t o = 0; o < d_model; ++o) want.set(t * d_model + o, static_cast<float>(acc[o]));
  }
  return want;
}

// Runs moe_experts on a poisoned output and compares with the reference (the tolerances of MoeExpertsMatchReference).
void expect_experts_match(cuda::CudaBackend& be, const DeviceTensor& gate_up, const DeviceTensor& down,
                          const DeviceTensor& x, const DeviceTensor& idx, const DeviceTensor& w) {
  DeviceTensor out(be, x.t().dtype, {x.t().shape[0], x.t().shape[1]});
  out.poison();
  be.moe_experts({.out = out, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w});
  out.download();
  expect_close(out.host(), reference_experts(gate_up, down, x, idx, w), tolerance_for(x.t().dtype, /*is_linear=*/true));
}

// A moe_experts problem on the device: bf16 expert weights (fill_fast, ~1/sqrt(fan_in)), unit normal activations
// of dtype act, and route_random's routing (period as there); seed advances past the seeds used.
struct ExpertInputs {
  DeviceTensor gate_up, down, x, idx, w;
  ExpertInputs(cuda::CudaBackend& be, int64_t n_exp, int64_t d_model, int64_t d_ff, int64_t n_tok, int k,
               int64_t period, DType act, uint32_t& seed)
      : gate_up(be, kBF16, {n_exp, 2 * d_ff, d_model}),
        down(be, kBF16, {n_exp, d_model, d_ff}),
        x(be, act, {n_tok, d_model}),
        idx(be, kI32, {n_tok, k}),
        w(be, kF32, {n_tok, k}) {
    fill_fast(gate_up.host(), seed++, 1.0 / std::sqrt(static_cast<double>(d_model)));
    fill_fast(down.host(), seed++, 1.0 / std::sqrt(static_cast<double>(d_ff)));
    std::mt19937 rng(seed++);
    x.host().fill_normal(rng, 1.f);
    for (DeviceTensor* t : {&gate_up, &down, &x}) t->upload();
    route_random(idx, w, n_exp, seed++, period);
  }
};

// moe_experts into a poisoned output, downloaded as floats; with check_reference, also compared with the reference.
std::vector<float> run_experts(cuda::CudaBackend& be, ExpertInputs& in, bool check_reference = false) {
  const int64_t n_tok = in.x.t().shape[0], d_model = in.x.t().shape[1];
  DeviceTensor out(be, in.x.t().dtype, {n_tok, d_model});
  out.poison();
  be.moe_experts({.out = out, .x = in.x, .gate_up = in.gate_up, .down = in.down, .idx = in.idx, .weights = in.w});
  out.download();
  if (check_reference) {
    expect_close(out.host(), reference_experts(in.gate_up, in.down, in.x, in.idx, in.w),
                 tolerance_for(in.x.t().dtype, /*is_linear=*/true));
  }
  std::vector<float> v(static_cast<size_t>(n_tok * d_model));
  for (int64_t i = 0; i < n_tok * d_model; ++i) v[static_cast<size_t>(i)] = out.host().get(i);
  return v;
}

// Bit-for-bit equality of two runs' outputs.
void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0) << "out " << i << ": " << a[i] << " vs " << b[i];
}

TEST_F(CudaOps, MoeExpertsGemma26BShapes) {
  // Gemma 4 26B-A4B: top-8 of 128 experts, d_model 2816, expert d_ff 704, bf16 weights; decode (1 token, 8
  // distinct experts, one pair each) and verify sizes (4 and 9 tokens, some experts shared), bf16 and f32
  // activations (16-byte loads of both).
  const int64_t n_exp = 128, d_model = 2816, d_ff = 704;
  const int k = 8;
  DeviceTensor gate_up(be(), kBF16, {n_exp, 2 * d_ff, d_model}), down(be(), kBF16, {n_exp, d_model, d_ff});
  fill_fast(gate_up.host(), 1, 1.0 / std::sqrt(static_cast<double>(d_model)));
  fill_fast(down.host(), 2, 1.0 / std::sqrt(static_cast<double>(d_ff)));
  gate_up.upload();
  down.upload();
  struct Run {
    int64_t n_tok;
    DType act;
  };
  uint32_t seed = 1500;
  for (const Run& r : {Run{1, kBF16}, Run{1, kF32}, Run{4, kBF16}, Run{9, kBF16}}) {
    SCOPED_TRACE(strfmt("26B experts, %lld tokens, act %s", static_cast<long long>(r.n_tok), dtype_name(r.act)));
    DeviceTensor x(be(), r.act, {r.n_tok, d_model}), idx(be(), kI32, {r.n_tok, k}), w(be(), kF32, {r.n_tok, k});
    std::mt19937 rng(seed++);
    x.host().fill_normal(rng, 1.f);
    x.upload();
    route_random(idx, w, n_exp, seed++);
    expect_experts_match(be(), gate_up, down, x, idx, w);
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaOps, MoeExpertsStagedEqualsRegisterPathBitwise) {
  // The expert kernels with their weight rows staged in shared memory (moe.cu stage_rows, TANDEM_MOE_STAGED=1) read the
  // same chunks in the same order as with the rows in registers: the outputs must agree bit for bit. Gemma 4
  // 26B-A4B's shapes at verify sizes (2, 4, 9 tokens; one token always takes the register path), bf16 and f32
  // activations, and a small shape on 256 threads with experts shared by many tokens (several passes over the
  // staged rows).
  struct Case {
    int64_t n_exp, d_model, d_ff;
    int k;
    int64_t n_tok, period;
    DType act;
  };
  const Case cases[] = {{128, 2816, 704, 8, 2, 0, kBF16}, {128, 2816, 704, 8, 4, 0, kBF16},
                        {128, 2816, 704, 8, 9, 0, kBF16}, {128, 2816, 704, 8, 2, 0, kF32},
                        {128, 2816, 704, 8, 9, 0, kF32},  {16, 1024, 256, 8, 9, 3, kBF16}};
  uint32_t seed = 1550;
  const bool staged_before = cuda::moe_staged();
  for (const Case& c : cases) {
    SCOPED_TRACE(strfmt("d_model %lld d_ff %lld, %lld tokens (period %lld), act %s", static_cast<long long>(c.d_model),
                        static_cast<long long>(c.d_ff), static_cast<long long>(c.n_tok),
                        static_cast<long long>(c.period), dtype_name(c.act)));
    ExpertInputs in(be(), c.n_exp, c.d_model, c.d_ff, c.n_tok, c.k, c.period, c.act, seed);
    std::vector<float> outs[2];
    for (int staged : {0, 1}) {
      cuda::set_moe_staged(staged == 1);
      outs[staged] = run_experts(be(), in, /*check_reference=*/staged == 1 && c.n_tok == 9 && c.act == kBF16);
    }
    cuda::set_moe_staged(staged_before);
    ASSERT_TRUE(be().last_error().ok()) << be().last_error().to_string();
    expect_same_bits(outs[0], outs[1]);
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaOps, MoeExpertsTokensShareExperts) {
  // 9 tokens picking 8 of 16 experts: every expert serves 4.5 pairs on average, so some serve more than the 4 pairs
  // a pass takes (several passes over the same rows); with period 3, tokens t, t + 3, t + 6 pick the same experts.
  const int64_t n_exp = 16, d_model = 1024, d_ff = 256, n_tok = 9;
  const int k = 8;
  const DType combos[][2] = {{kBF16, kBF16}, {kBF16, kF32}, {kF32, kF32}};  // {weights, activations}
  uint32_t seed = 1600;
  for (const auto& dt : combos) {
    for (int64_t period : {0, 3}) {
      SCOPED_TRACE(strfmt("weights %s act %s, period %lld", dtype_name(dt[0]), dtype_name(dt[1]),
                          static_cast<long long>(period)));
      DeviceTensor gate_up(be(), dt[0], {n_exp, 2 * d_ff, d_model}), down(be(), dt[0], {n_exp, d_model, d_ff});
      DeviceTensor x(be(), dt[1], {n_tok, d_model}), idx(be(), kI32, {n_tok, k}), w(be(), kF32, {n_tok, k});
      std::mt19937 rng(seed++);
      gate_up.host().fill_normal(rng, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_model))));
      down.host().fill_normal(rng, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_ff))));
      x.host().fill_normal(rng, 1.f);
      for (DeviceTensor* t : {&gate_up, &down, &x}) t->upload();
      route_random(idx, w, n_exp, seed++, period);
      EXPECT_GT(max_pairs_per_expert(idx.host(), n_exp), 4);  // 72 pairs on at most 16 experts
      expect_experts_match(be(), gate_up, down, x, idx, w);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaOps, MoeExpertsDuplicateAndInvalidIndices) {
  // Not what a router writes, but the op's contract: an expert listed twice by one token counts twice (added in
  // slot order), and a token with an index outside [0, n_experts) gets NaN without disturbing the other tokens.
  const int64_t n_exp = 4, d_model = 64, d_ff = 16;
  const int k = 3;
  DeviceTensor gate_up(be(), kF32, {n_exp, 2 * d_ff, d_model}), down(be(), kF32, {n_exp, d_model, d_ff});
  DeviceTensor x(be(), kF32, {3, d_model}), out(be(), kF32, {3, d_model});
  DeviceTensor idx(be(), kI32, {3, k}), w(be(), kF32, {3, k});
  fill_random(gate_up.host(), 11);
  fill_random(down.host(), 12);
  fill_random(x.host(), 13);
  const int32_t ids[3][3] = {{2, 2, 0}, {1, 3, 2}, {0, static_cast<int32_t>(n_exp), 1}};
  for (int t = 0; t < 3; ++t)
    for (int j = 0; j < k; ++j) {
      idx.host().seti(t * k + j, ids[t][j]);
      w.host().set(t * k + j, 0.25f + 0.125f * static_cast<float>(t * k + j));
    }
  for (DeviceTensor* t : {&gate_up, &down, &x, &idx, &w}) t->upload();
  out.poison();
  be().moe_experts({.out = out, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w});
  out.download();
  // The reference on the first two tokens (it rejects the invalid index).
  HostTensor x2(kF32, {2, d_model}), idx2(kI32, {2, k}), w2(kF32, {2, k}), want(kF32, {2, d_model}),
      got(kF32, {2, d_model});
  for (int64_t i = 0; i < 2 * d_model; ++i) {
    x2.set(i, x.host().get(i));
    got.set(i, out.host().get(i));
  }
  for (int64_t i = 0; i < 2 * k; ++i) {
    idx2.seti(i, idx.host().geti(i));
    w2.set(i, w.host().get(i));
  }
  ref::moe_experts({.out = want, .x = x2, .gate_up = gate_up.host(), .down = down.host(), .idx = idx2, .weights = w2});
  expect_close(got, want, tolerance_for(kF32, /*is_linear=*/true));
  for (int64_t o = 0; o < d_model; ++o) EXPECT_TRUE(std::isnan(out.host().get(2 * d_model + o))) << "out " << o;
}

TEST_F(CudaOps, MoeExpertsOneTokenDuplicateAndInvalidIndices) {
  // The one-token path (bf16 weights, d_ff % 8 == 0: no grouping tables, the down product and the combine in one
  // launch) under the same contract: a repeated expert counts once per slot, an index outside [0, n_experts) NaNs.
  const int64_t n_exp = 4, d_model = 64, d_ff = 16;
  const int k = 3;
  DeviceTensor gate_up(be(), kBF16, {n_exp, 2 * d_ff, d_model}), down(be(), kBF16, {n_exp, d_model, d_ff});
  fill_random(gate_up.host(), 21);
  fill_random(down.host(), 22);
  gate_up.upload();
  down.upload();
  const int32_t ids[2][3] = {{2, 2, 0}, {0, static_cast<int32_t>(n_exp), 1}};
  for (int t = 0; t < 2; ++t) {
    SCOPED_TRACE(strfmt("token %d", t));
    DeviceTensor x(be(), kBF16, {1, d_model}), out(be(), kBF16, {1, d_model});
    DeviceTensor idx(be(), kI32, {1, k}), w(be(), kF32, {1, k});
    fill_random(x.host(), 23 + static_cast<uint32_t>(t));
    for (int j = 0; j < k; ++j) {
      idx.host().seti(j, ids[t][j]);
      w.host().set(j, 0.25f + 0.125f * static_cast<float>(j));
    }
    for (DeviceTensor* d : {&x, &idx, &w}) d->upload();
    out.poison();
    be().moe_experts({.out = out, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w});
    out.download();
    if (t == 0) {
      expect_close(out.host(), reference_experts(gate_up, down, x, idx, w), tolerance_for(kBF16, /*is_linear=*/true));
    } else {
      for (int64_t o = 0; o < d_model; ++o) EXPECT_TRUE(std::isnan(out.host().get(o))) << "out " << o;
    }
  }
}

TEST_F(CudaOps, MoeExpertsChunkedTokens) {
  // More pairs than one chunk takes (8192): 2100 tokens x top-8 run in chunks of 1024, 1024 and 52 tokens; top-5 on
  // odd sizes (one-element loads) in chunks of 1638 and 462. A prompt chunk of 1100 tokens whose intermediates
  // (34.6 MB per 1024 tokens) outgrow the stream's 32 MiB workspace: the backend's MoE scratch, 1024 + 76 tokens.
  struct Case {
    ExpertCase shape;
    DType weights, act;
    int64_t n_tok;
  };
  const Case cases[] = {{{32, 64, 32, 8}, kBF16, kBF16, 2100},
                        {{32, 64, 32, 8}, kF32, kF32, 2100},
                        {{9, 67, 37, 5}, kBF16, kF32, 2100},
                        {{16, 1024, 32, 8}, kBF16, kBF16, 1100}};
  uint32_t seed = 1700;
  for (const Case& c : cases) {
    const ExpertCase& s = c.shape;
    const int64_t n_tok = c.n_tok;
    SCOPED_TRACE(strfmt("experts %lld d_model %lld d_ff %lld k %d, weights %s act %s, %lld tokens",
                        static_cast<long long>(s.n_exp), static_cast<long long>(s.d_model),
                        static_cast<long long>(s.d_ff), s.k, dtype_name(c.weights), dtype_name(c.act),
                        static_cast<long long>(n_tok)));
    DeviceTensor gate_up(be(), c.weights, {s.n_exp, 2 * s.d_ff, s.d_model}),
        down(be(), c.weights, {s.n_exp, s.d_model, s.d_ff});
    DeviceTensor x(be(), c.act, {n_tok, s.d_model}), idx(be(), kI32, {n_tok, s.k}), w(be(), kF32, {n_tok, s.k});
    std::mt19937 rng(seed++);
    gate_up.host().fill_normal(rng, static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d_model))));
    down.host().fill_normal(rng, static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.d_ff))));
    x.host().fill_normal(rng, 1.f);
    for (DeviceTensor* t : {&gate_up, &down, &x}) t->upload();
    route_random(idx, w, s.n_exp, seed++);
    expect_experts_match(be(), gate_up, down, x, idx, w);
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaOps, MoeExpertsTensorCoreTiles) {
  // Chunks of 32 or more tokens (bf16 weights and activations, d_model and d_ff multiples of 32) take the
  // tensor-core kernels (moe_tc.cu). The 64 x 64 tiles against the reference; the 128 x 128 tiles (kernels.h
  // set_moe_tc_wide) add every output's products in the same order, so they must agree with them bit for bit.
  // Gemma 4 26B-A4B's expert shapes for 32 tokens (top-2, to keep the host reference short) and on 32 experts at 64
  // pairs each on average (no reference: too long on the host); 150 tokens on 16 experts (more than the 64 pairs of
  // one narrow pass), 300 (more than 128: two wide passes, the second with a warp column of no pairs); tokens
  // repeating their routing (period 5); d_ff 32 (a tile of gate and up rows partly past the matrix) with d_model 96
  // (a wide down tile past it).
  struct Case {
    int64_t n_exp, d_model, d_ff, n_tok, period;
    int k;
    bool reference;
  };
  const Case cases[] = {{128, 2816, 704, 32, 0, 2, true}, {32, 2816, 704, 256, 0, 8, false},
                        {16, 256, 128, 150, 0, 8, true},  {16, 256, 128, 300, 0, 8, true},
                        {16, 256, 128, 64, 5, 8, true},   {16, 256, 128, 200, 5, 8, false},
                        {8, 96, 32, 33, 0, 2, true},      {8, 96, 32, 40, 0, 2, false}};
  const cuda::MoeTcWide mode_before = cuda::moe_tc_wide();
  uint32_t seed = 2100;
  for (const Case& c : cases) {
    SCOPED_TRACE(strfmt("experts %lld d_model %lld d_ff %lld k %d, %lld tokens, period %lld",
                        static_cast<long long>(c.n_exp), static_cast<long long>(c.d_model),
                        static_cast<long long>(c.d_ff), c.k, static_cast<long long>(c.n_tok),
                        static_cast<long long>(c.period)));
    ExpertInputs in(be(), c.n_exp, c.d_model, c.d_ff, c.n_tok, c.k, c.period, kBF16, seed);
    const int64_t most = max_pairs_per_expert(in.idx.host(), c.n_exp);
    if (c.n_tok == 150) {
      EXPECT_GT(most, 64);
    }
    if (c.n_tok == 300) {
      EXPECT_GT(most, 128);
    }
    std::vector<float> outs[2];
    for (int wide : {0, 1}) {
      cuda::set_moe_tc_wide(wide == 1 ? cuda::MoeTcWide::kAlways : cuda::MoeTcWide::kOff);
      outs[wide] = run_experts(be(), in, /*check_reference=*/wide == 0 && c.reference);
    }
    cuda::set_moe_tc_wide(mode_before);
    ASSERT_TRUE(be().last_error().ok()) << be().last_error().to_string();
    expect_same_bits(outs[0], outs[1]);
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaOps, MoeExpertsGraphReplay) {
  // Captured once, replayed after new routing, weights and inputs are written to the device: the launch sizes
  // depend on n_tokens and k only, and the grouping by expert happens on the device at every replay. The routings
  // range from all-distinct experts to every token on the same experts (most expert slots empty).
  const int64_t n_exp = 32, d_model = 256, d_ff = 128, n_tok = 3;
  const int k = 4;
  DeviceTensor gate_up(be(), kBF16, {n_exp, 2 * d_ff, d_model}), down(be(), kBF16, {n_exp, d_model, d_ff});
  DeviceTensor x(be(), kBF16, {n_tok, d_model}), out(be(), kBF16, {n_tok, d_model});
  DeviceTensor idx(be(), kI32, {n_tok, k}), w(be(), kF32, {n_tok, k});
  auto fill_inputs = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    gate_up.host().fill_normal(rng, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_model))));
    down.host().fill_normal(rng, static_cast<float>(1.0 / std::sqrt(static_cast<double>(d_ff))));
    x.host().fill_normal(rng, 1.f);
    for (DeviceTensor* t : {&gate_up, &down, &x}) t->upload();
  };
  const MoeExpertsArgs args{.out = out, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w};
  // One eager call first, as the engine warms up before capturing.
  fill_inputs(1800);
  route_random(idx, w, n_exp, 1801);
  out.poison();
  be().moe_experts(args);
  out.download();
  expect_close(out.host(), reference_experts(gate_up, down, x, idx, w), tolerance_for(kBF16, true));
  Result<Backend::GraphId> graph = be().capture([&] {
    be().moe_experts(args);
    return ok_status();
  });
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  struct Replay {
    uint32_t seed;
    int64_t period;  // 0: independent tokens; 1: every token on token 0's experts
    bool new_weights;
  };
  const Replay replays[] = {{1810, 0, false}, {1820, 1, false}, {1830, 0, true}, {1840, 1, true}};
  for (const Replay& r : replays) {
    SCOPED_TRACE(strfmt("replay seed %u period %lld%s", r.seed, static_cast<long long>(r.period),
                        r.new_weights ? ", new weights" : ""));
    if (r.new_weights) fill_inputs(r.seed + 1);
    route_random(idx, w, n_exp, r.seed, r.period);
    if (r.period == 1) {
      EXPECT_EQ(distinct_experts(idx.host()), k);
    }
    out.poison();
    const Status replayed = be().replay(*graph);
    ASSERT_TRUE(replayed.ok()) << replayed.to_string();
    out.download();
    expect_close(out.host(), reference_experts(gate_up, down, x, idx, w), tolerance_for(kBF16, true));
    if (HasFatalFailure()) break;
  }
  be().release_graph(*graph);
}

// Sets set_moe_down_early for a scope and restores it after.
struct DownEarlyScope {
  bool before = cuda::moe_down_early();
  explicit DownEarlyScope(bool on) { cuda::set_moe_down_early(on); }
  ~DownEarlyScope() { cuda::set_moe_down_early(before); }
};

TEST_F(CudaOps, MoeExpertsOneTokenEarlyDownEqualsBitwise) {
  // A decode step's down kernel with its expert's weights requested before the wait for gate/up (kernels.h
  // set_moe_down_early) computes dot_rows' products in the same order: the same bits as without. Gemma 4 26B-A4B's
  // shapes with bf16 and f32 activations, and the shortest and longest rows it takes (32 and 96 chunks).
  struct Case {
    int64_t n_exp, d_model, d_ff;
    int k;
    DType act;
  };
  const Case cases[] = {{128, 2816, 704, 8, kBF16}, {128, 2816, 704, 8, kF32}, {16, 512, 256, 4, kBF16},
                        {16, 512, 768, 4, kBF16}};
  uint32_t seed = 2400;
  for (const Case& c : cases) {
    SCOPED_TRACE(strfmt("experts %lld d_model %lld d_ff %lld k %d, act %s", static_cast<long long>(c.n_exp),
                        static_cast<long long>(c.d_model), static_cast<long long>(c.d_ff), c.k, dtype_name(c.act)));
    ExpertInputs in(be(), c.n_exp, c.d_model, c.d_ff, /*n_tok=*/1, c.k, /*period=*/0, c.act, seed);
    std::vector<float> outs[2];
    for (int early : {0, 1}) {
      const DownEarlyScope scope(early == 1);
      outs[early] = run_experts(be(), in, /*check_reference=*/early == 1);
    }
    ASSERT_TRUE(be().last_error().ok()) << be().last_error().to_string();
    expect_same_bits(outs[0], outs[1]);
    if (HasFatalFailure()) return;
  }
}

TEST_F(CudaOps, MoeEarlyDownReadsTheNewRoutingInAGraph) {
  // The early down kernel reads the expert indices before its wait: moe_route writes them two kernels earlier
  // (route, gate/up, down), so every replay of a captured route + experts must use that replay's routing. New
  // router logits before each replay route the token to other experts; the output must match the reference for
  // the routing the replay wrote.
  const int64_t n_exp = 64, d_model = 512, d_ff = 704;
  const int k = 8;
  uint32_t seed = 2500;
  ExpertInputs in(be(), n_exp, d_model, d_ff, /*n_tok=*/1, k, /*period=*/0, kBF16, seed);
  DeviceTensor logits(be(), kBF16, {1, n_exp}), pes(be(), kBF16, {n_exp}), out(be(), kBF16, {1, d_model});
  std::mt19937 rng(seed++);
  pes.host().fill_uniform(rng, 0.5f, 1.5f);
  pes.upload();
  const DownEarlyScope scope(true);
  auto step = [&] {
    be().moe_route({.idx = in.idx, .weights = in.w, .logits = logits, .per_expert_scale = pes, .k = k});
    be().moe_experts({.out = out, .x = in.x, .gate_up = in.gate_up, .down = in.down, .idx = in.idx, .weights = in.w});
    return ok_status();
  };
  logits.host().fill_uniform(rng, -3.f, 3.f);
  logits.upload();
  ASSERT_TRUE(step().ok());  // eager first, as the engine runs a shape once before capturing it
  Result<Backend::GraphId> graph = be().capture(step);
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  std::vector<int32_t> last;
  for (int replay = 0; replay < 4; ++replay) {
    SCOPED_TRACE(strfmt("replay %d", replay));
    logits.host().fill_uniform(rng, -3.f, 3.f);
    logits.upload();
    out.poison();
    const Status replayed = be().replay(*graph);
    ASSERT_TRUE(replayed.ok()) << replayed.to_string();
    for (DeviceTensor* t : {&out, &in.idx, &in.w}) t->download();
    std::vector<int32_t> now(static_cast<size_t>(k));
    for (int j = 0; j < k; ++j) now[static_cast<size_t>(j)] = in.idx.host().geti(j);
    EXPECT_NE(now, last);  // the routing moved
    last = now;
    expect_close(out.host(), reference_experts(in.gate_up, in.down, in.x, in.idx, in.w),
                 tolerance_for(kBF16, /*is_linear=*/true));
    if (HasFatalFailure()) break;
  }
  be().release_graph(*graph);
}

TEST_F(CudaOps, MoeUnsupportedDtypesAreRecordedNotFatal) {
  DeviceTensor logits(be(), DType::kF16, {2, 4}), pes(be(), kBF16, {4}), idx(be(), kI32, {2, 2}), w(be(), kF32, {2, 2});
  be().moe_route({.idx = idx, .weights = w, .logits = logits, .per_expert_scale = pes, .k = 2});
  Status st = be().last_error();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  DeviceTensor gate_up(be(), DType::kF16, {4, 8, 16}), down(be(), DType::kF16, {4, 16, 4});
  DeviceTensor x(be(), kBF16, {2, 16}), out(be(), kBF16, {2, 16});
  out.poison();
  be().moe_experts({.out = out, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w});
  st = be().synchronize();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  out.download();
  EXPECT_FALSE(has_no_nan(out.host()));
  // More experts than the on-device grouping takes (1024).
  DeviceTensor many_gu(be(), kBF16, {1025, 8, 16}), many_dn(be(), kBF16, {1025, 16, 4});
  be().moe_experts({.out = out, .x = x, .gate_up = many_gu, .down = many_dn, .idx = idx, .weights = w});
  st = be().synchronize();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
}

}  // namespace
}  // namespace tandem::testing
