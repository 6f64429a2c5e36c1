// CUDA mixture-of-experts parity against kernels/ref (spec §1.10, ops.h MoeRouteArgs / MoeExpertsArgs): routing
// (softmax over all experts, top-k with ties to the lower index, renormalise, per-expert scale) with exact expert
// indices, and the experts' GeGLU + down projection + weighted sum on odd and vector-friendly sizes, bf16 and f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/strings.h"
#include "cuda/cuda_fixture.h"
#include "kernels/ref/ref.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

using CudaOps = CudaTest;

TEST_F(CudaOps, MoeRouteMatchesReferenceWithTies) {
  uint32_t seed = 1100;
  for (DType dt : {kBF16, kF32}) {
    for (int64_t n_exp : {5, 37, 128}) {
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
        HostTensor want(dt[1], {n_tok, s.d_model});
        ref::moe_experts({.out = want, .x = x.host(), .gate_up = gate_up.host(), .down = down.host(), .idx = idx.host(),
                          .weights = w.host()});
        // bf16 activations: gate, up and h are rounded to bf16 like HF's tensors (3 extra roundings, ~2^-9 each,
        // averaged over d_ff terms), well inside the bf16 bound. f32: two chained dot products, linear's bound.
        expect_close(out.host(), want, tolerance_for(dt[1], /*is_linear=*/true));
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
}

}  // namespace
}  // namespace tandem::testing
