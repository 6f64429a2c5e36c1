// The reference kernels (kernels/ref) against expectations derived by hand or by independent double-precision
// formulas written here (spec §6 items 1, 3, 4, 8, 10; GQA mapping §1.6; GeGLU §1.9; RoPE §1.7).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "kernels/host_tensor.h"
#include "kernels/ref/ref.h"

namespace tandem {
namespace {

using testing::HostTensor;
constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(RefRmsNorm, ZeroWeightGivesZeros) {  // spec §6.1: the weight is used directly, not 1 + w
  HostTensor x(kF32, {2, 4}, {1, 2, 3, 4, -5, 6, 0.5f, 8});
  HostTensor w(kF32, {4}, {0, 0, 0, 0});
  HostTensor out(kF32, {2, 4});
  out.poison();
  ref::rms_norm({.out = out, .x = x, .weight = w});
  for (float v : out.values()) EXPECT_EQ(v, 0.f);
}

TEST(RefRmsNorm, MatchesDoubleFormula) {
  // Row [1, 2, 3, 4]: mean of squares = 30 / 4 = 7.5.
  HostTensor x(kF32, {1, 4}, {1, 2, 3, 4});
  HostTensor w(kF32, {4}, {1, 0.5f, 2, -1});
  HostTensor out(kF32, {1, 4});
  const double eps = 1e-6;
  ref::rms_norm({.out = out, .x = x, .weight = w, .eps = static_cast<float>(eps)});
  const double r = 1.0 / std::sqrt(7.5 + static_cast<double>(static_cast<float>(eps)));
  const double want[4] = {1 * r * 1, 2 * r * 0.5, 3 * r * 2, 4 * r * -1};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out.get(i), want[i], 1e-6 * std::fabs(want[i]));
  // Weightless (v_norm, router): weight empty means 1, and out may alias x.
  ref::rms_norm({.out = x, .x = x, .eps = static_cast<float>(eps)});
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(x.get(i), (i + 1) * r, 1e-6);
}

// Proportional RoPE inverse frequencies of a full layer (spec §1.7): 64 rotated pairs over the full head dim 512.
std::vector<float> proportional_inv_freq() {
  std::vector<float> f(256, 0.f);
  for (int j = 0; j < 64; ++j) f[j] = static_cast<float>(std::pow(1e6, -2.0 * j / 512.0));
  return f;
}

TEST(RefRope, ProportionalInvFreqMatchesSpecNumbers) {
  const auto f = proportional_inv_freq();
  EXPECT_NEAR(f[1], 0.94746, 1e-5);
  EXPECT_NEAR(f[63], 0.033376, 1e-6);
  EXPECT_EQ(f[64], 0.f);
}

TEST(RefRope, ProportionalLeavesUnrotatedDimsAndRotatesPairs) {  // spec §6.3
  const int n_heads = 2, d = 512, half = 256;
  const std::vector<int> positions = {0, 1, 7, 100, 4097, 123456};
  const int n_tok = static_cast<int>(positions.size());
  HostTensor x(kF32, {n_tok, n_heads, d});
  std::mt19937 rng(1);
  x.fill_uniform(rng, -2.f, 2.f);
  const std::vector<float> x0 = x.values();
  HostTensor pos(kI32, {n_tok});
  for (int t = 0; t < n_tok; ++t) pos.seti(t, positions[t]);
  const auto f = proportional_inv_freq();
  HostTensor inv(kF32, {half}, f);
  ref::rope({.x = x, .pos = pos, .inv_freq = inv});
  for (int t = 0; t < n_tok; ++t) {
    for (int h = 0; h < n_heads; ++h) {
      const int base = (t * n_heads + h) * d;
      for (int j = 64; j < half; ++j) {
        EXPECT_EQ(x.get(base + j), x0[base + j]);  // bit-for-bit unchanged
        EXPECT_EQ(x.get(base + j + half), x0[base + j + half]);
      }
      for (int j = 0; j < 64; ++j) {
        const double x1 = x0[base + j], x2 = x0[base + j + half];
        // fp32 reference (HF): the angle is the f32 product pos * f_j; cos/sin of it in double.
        const double a32 = static_cast<double>(static_cast<float>(positions[t]) * f[j]);
        EXPECT_NEAR(x.get(base + j), x1 * std::cos(a32) - x2 * std::sin(a32), 2e-6);
        EXPECT_NEAR(x.get(base + j + half), x2 * std::cos(a32) + x1 * std::sin(a32), 2e-6);
        if (positions[t] <= 100) {  // small positions: the exact double angle pos * 1e6^(-2j/512) agrees too
          const double a = positions[t] * std::pow(1e6, -2.0 * j / 512.0);
          EXPECT_NEAR(x.get(base + j), x1 * std::cos(a) - x2 * std::sin(a), 2e-5);
          EXPECT_NEAR(x.get(base + j + half), x2 * std::cos(a) + x1 * std::sin(a), 2e-5);
        }
      }
    }
  }
}

TEST(RefRope, HalfSplitNotInterleaved) {
  // d = 4, one pair rotated by pi/2 at pos 1 (f_0 = pi/2), pair 1 unrotated: y[0] = -x[2], y[2] = x[0].
  HostTensor x(kF32, {1, 1, 4}, {1, 2, 3, 4});
  HostTensor pos(kI32, {1}, {1});
  HostTensor inv(kF32, {2}, {static_cast<float>(std::numbers::pi / 2), 0});
  ref::rope({.x = x, .pos = pos, .inv_freq = inv});
  EXPECT_NEAR(x.get(0), -3, 1e-6);
  EXPECT_EQ(x.get(1), 2);
  EXPECT_NEAR(x.get(2), 1, 1e-6);
  EXPECT_EQ(x.get(3), 4);
}

// KV storage [n_kv, capacity, head_dim] plus helpers to fill position p.
struct Kv {
  HostTensor k, v;
  KvView view;
  Kv(int n_kv, int capacity, int head_dim, bool ring)
      : k(kF32, {n_kv, capacity, head_dim}), v(kF32, {n_kv, capacity, head_dim}) {
    view.k = k;
    view.v = v;
    view.ring = ring;
  }
  int64_t at(int h, int64_t pos, int d) const {
    return (h * view.capacity() + view.slot(pos)) * k.t().shape[2] + d;
  }
};

TEST(RefAttention, SlidingWindowBoundary) {  // spec §6.4: at q >= W, key q-W+1 is visible and q-W is not
  for (int W : {512, 1024}) {
    for (bool ring : {false, true}) {
      const int q = W + 37, hd = 4;
      const int capacity = ring ? W + 5 : q + 1;
      Kv kv(1, capacity, hd, ring);
      kv.view.end = q + 1;
      kv.view.begin = ring ? kv.view.end - capacity : 0;
      for (int64_t p = kv.view.begin; p < kv.view.end; ++p) {
        // Keys all zero (uniform softmax); values flag the two boundary keys.
        for (int d = 0; d < hd; ++d) kv.k.set(kv.at(0, p, d), 0.f);
        kv.v.set(kv.at(0, p, 0), p == q - W ? 1.f : 0.f);
        kv.v.set(kv.at(0, p, 1), p == q - W + 1 ? 1.f : 0.f);
        kv.v.set(kv.at(0, p, 2), 1.f);
        kv.v.set(kv.at(0, p, 3), static_cast<float>(p));
      }
      HostTensor qt(kF32, {1, 1, hd}, {0.3f, -1, 2, 0.5f});
      HostTensor qpos(kI32, {1}, {static_cast<float>(q)});
      HostTensor out(kF32, {1, 1, hd});
      ref::attention({.out = out, .q = qt, .kv = kv.view, .q_pos = qpos, .window = W});
      EXPECT_EQ(out.get(0), 0.f) << "key q-W must be masked, W=" << W;
      EXPECT_NEAR(out.get(1), 1.0 / W, 1e-9) << "key q-W+1 must be visible";
      EXPECT_NEAR(out.get(2), 1.0, 1e-6);
      EXPECT_NEAR(out.get(3), q - (W - 1) / 2.0, 1e-3);  // mean of positions q-W+1 .. q
    }
  }
}

TEST(RefAttention, GqaHeadMappingIsContiguous) {  // spec §1.6: query head j reads kv head j / (nq / nkv)
  const int n_heads = 8, n_kv = 2, hd = 3, len = 5;
  Kv kv(n_kv, len, hd, false);
  kv.view.end = len;
  std::mt19937 rng(2);
  kv.k.fill_uniform(rng, -1, 1);
  for (int g = 0; g < n_kv; ++g)
    for (int p = 0; p < len; ++p)
      for (int d = 0; d < hd; ++d) kv.v.set(kv.at(g, p, d), static_cast<float>(10 * (g + 1) + d));
  HostTensor q(kF32, {1, n_heads, hd});
  q.fill_uniform(rng, -1, 1);
  HostTensor qpos(kI32, {1}, {len - 1});
  HostTensor out(kF32, {1, n_heads, hd});
  ref::attention({.out = out, .q = q, .kv = kv.view, .q_pos = qpos});
  for (int h = 0; h < n_heads; ++h)
    for (int d = 0; d < hd; ++d) EXPECT_NEAR(out.get(h * hd + d), 10 * (h / 4 + 1) + d, 1e-5) << "head " << h;
}

TEST(RefAttention, MatchesNaiveDoubleSoftmax) {
  const int n_tok = 3, n_heads = 4, n_kv = 2, hd = 8, cap = 7;
  for (bool causal : {true, false}) {
    for (int window : {0, 3}) {
      Kv kv(n_kv, cap, hd, true);
      kv.view.begin = 4;
      kv.view.end = 11;  // positions 4..10 in a ring of 7 (wraps)
      std::mt19937 rng(3 + window + causal);
      kv.k.fill_uniform(rng, -1, 1);
      kv.v.fill_uniform(rng, -1, 1);
      HostTensor q(kF32, {n_tok, n_heads, hd});
      q.fill_uniform(rng, -1, 1);
      const int qp[n_tok] = {8, 9, 10};
      HostTensor qpos(kI32, {n_tok}, {8, 9, 10});
      HostTensor out(kF32, {n_tok, n_heads, hd});
      const float scale = 0.7f;
      ref::attention({.out = out, .q = q, .kv = kv.view, .q_pos = qpos, .window = window, .causal = causal,
                      .scale = scale});
      for (int t = 0; t < n_tok; ++t) {
        for (int h = 0; h < n_heads; ++h) {
          const int g = h / (n_heads / n_kv);
          std::vector<double> s, p;
          std::vector<int> keys;
          for (int k = 4; k < 11; ++k) {
            if (causal && k > qp[t]) continue;
            if (window && k <= qp[t] - window) continue;
            double dot = 0;
            for (int d = 0; d < hd; ++d) dot += q.get((t * n_heads + h) * hd + d) * kv.k.get(kv.at(g, k, d));
            s.push_back(dot * scale);
            keys.push_back(k);
          }
          double z = 0;
          for (double v : s) z += std::exp(v);
          for (int d = 0; d < hd; ++d) {
            double o = 0;
            for (size_t i = 0; i < s.size(); ++i) o += std::exp(s[i]) / z * kv.v.get(kv.at(g, keys[i], d));
            EXPECT_NEAR(out.get((t * n_heads + h) * hd + d), o, 1e-6);
          }
        }
      }
    }
  }
}

TEST(RefAttention, NoVisibleKeyGivesZeros) {
  Kv kv(1, 8, 4, false);
  kv.k.fill(1.f);
  kv.v.fill(1.f);
  kv.view.begin = 5;
  kv.view.end = 8;
  HostTensor q(kF32, {2, 1, 4}, {1, 1, 1, 1, 1, 1, 1, 1});
  HostTensor qpos(kI32, {2}, {3, 4});  // causal: both queries precede every stored key
  HostTensor out(kF32, {2, 1, 4});
  out.poison();
  ref::attention({.out = out, .q = q, .kv = kv.view, .q_pos = qpos});
  for (float v : out.values()) EXPECT_EQ(v, 0.f);
  // An empty range too.
  kv.view.begin = kv.view.end = 0;
  out.poison();
  ref::attention({.out = out, .q = q, .kv = kv.view, .q_pos = qpos});
  for (float v : out.values()) EXPECT_EQ(v, 0.f);
}

TEST(RefKvWrite, RingSlots) {
  Kv kv(2, 4, 2, true);
  kv.k.fill(-1.f);
  kv.v.fill(-1.f);
  HostTensor kn(kF32, {3, 2, 2}), vn(kF32, {3, 2, 2});
  for (int i = 0; i < 12; ++i) {
    kn.set(i, static_cast<float>(i));
    vn.set(i, static_cast<float>(100 + i));
  }
  HostTensor pos(kI32, {3}, {5, 6, 7});  // slots 1, 2, 3
  ref::kv_write({.kv = kv.view, .k_new = kn, .v_new = vn, .pos = pos});
  for (int t = 0; t < 3; ++t)
    for (int h = 0; h < 2; ++h)
      for (int d = 0; d < 2; ++d) {
        const int64_t dst = (h * 4 + (5 + t) % 4) * 2 + d;
        EXPECT_EQ(kv.k.get(dst), (t * 2 + h) * 2 + d);
        EXPECT_EQ(kv.v.get(dst), 100 + (t * 2 + h) * 2 + d);
      }
  for (int h = 0; h < 2; ++h) EXPECT_EQ(kv.k.get(h * 8), -1.f);  // slot 0 untouched
}

TEST(RefSoftcap, BoundedByCap) {  // spec §6.10
  HostTensor x(kF32, {7}, {0.01f, -0.01f, 29.f, 1e4f, -1e4f, kInf, -kInf});
  ref::softcap({.x = x, .cap = 30.f});
  for (float v : x.values()) EXPECT_LE(std::fabs(v), 30.f);
  EXPECT_NEAR(x.get(0), 0.01, 1e-8);  // ~identity near zero
  EXPECT_NEAR(x.get(2), 30 * std::tanh(29.0 / 30.0), 1e-5);
  EXPECT_EQ(x.get(5), 30.f);
  EXPECT_EQ(x.get(6), -30.f);
}

TEST(RefArgmax, TiesGoToLowestIndexAndNanWins) {
  HostTensor x(kF32, {4, 5}, {1, 3, 3, 2, 3,                  //
                              -kInf, -kInf, -kInf, -kInf, -kInf,  //
                              1, kNan, 5, kNan, 9,               //
                              0, 0, 0, 0, 0});
  HostTensor out(kI32, {4});
  out.poison();
  ref::argmax({.out = out, .x = x});
  EXPECT_EQ(out.geti(0), 1);
  EXPECT_EQ(out.geti(1), 0);
  EXPECT_EQ(out.geti(2), 1);
  EXPECT_EQ(out.geti(3), 0);
}

TEST(RefMoeRoute, WeightsSumToOneAndEqualSoftmaxOverSelected) {  // spec §6.8
  const int n_tok = 4, n_exp = 16, k = 8;
  HostTensor logits(kF32, {n_tok, n_exp});
  std::mt19937 rng(5);
  logits.fill_normal(rng, 2.f);
  logits.set(0, 1.5f);  // a tie in row 0 between experts 0 and 3 ...
  logits.set(3, 1.5f);
  logits.set(5, 9.f);  // ... ranked high enough to be picked
  HostTensor ones(kF32, {n_exp});
  ones.fill(1.f);
  HostTensor idx(kI32, {n_tok, k}), w(kF32, {n_tok, k});
  ref::moe_route({.idx = idx, .weights = w, .logits = logits, .per_expert_scale = ones, .k = k});
  for (int t = 0; t < n_tok; ++t) {
    double sum = 0, z = 0;
    for (int j = 0; j < k; ++j) z += std::exp(static_cast<double>(logits.get(t * n_exp + idx.geti(t * k + j))));
    for (int j = 0; j < k; ++j) {
      const int e = idx.geti(t * k + j);
      sum += w.get(t * k + j);
      EXPECT_NEAR(w.get(t * k + j), std::exp(static_cast<double>(logits.get(t * n_exp + e))) / z, 1e-6);
      // Selected experts are the k largest logits: every unselected logit is <= every selected one.
      for (int o = 0; o < n_exp; ++o) {
        bool chosen = false;
        for (int i = 0; i < k; ++i) chosen |= idx.geti(t * k + i) == o;
        if (!chosen) {
          EXPECT_LE(logits.get(t * n_exp + o), logits.get(t * n_exp + e));
        }
      }
      if (j > 0) {
        EXPECT_GE(w.get(t * k + j - 1), w.get(t * k + j));  // sorted descending
      }
    }
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
  // Tie between experts 0 and 3 (logit 1.5): if only one of them is selected, it is expert 0.
  bool has0 = false, has3 = false;
  for (int j = 0; j < k; ++j) {
    has0 |= idx.geti(j) == 0;
    has3 |= idx.geti(j) == 3;
  }
  EXPECT_TRUE(has0 || !has3);
  // per_expert_scale multiplies after the renormalisation.
  HostTensor pes(kF32, {n_exp});
  for (int e = 0; e < n_exp; ++e) pes.set(e, 0.5f + e);
  HostTensor idx2(kI32, {n_tok, k}), w2(kF32, {n_tok, k});
  ref::moe_route({.idx = idx2, .weights = w2, .logits = logits, .per_expert_scale = pes, .k = k});
  for (int i = 0; i < n_tok * k; ++i) {
    EXPECT_EQ(idx2.geti(i), idx.geti(i));
    EXPECT_NEAR(w2.get(i), w.get(i) * (0.5 + idx.geti(i)), 1e-5);
  }
}

TEST(RefMoeRoute, ExactTiesPickLowerExpert) {
  HostTensor logits(kF32, {1, 6}, {0, 2, 1, 2, 2, 1});
  HostTensor ones(kF32, {6}, {1, 1, 1, 1, 1, 1});
  HostTensor idx(kI32, {1, 2}), w(kF32, {1, 2});
  ref::moe_route({.idx = idx, .weights = w, .logits = logits, .per_expert_scale = ones, .k = 2});
  EXPECT_EQ(idx.geti(0), 1);
  EXPECT_EQ(idx.geti(1), 3);
  EXPECT_NEAR(w.get(0), 0.5, 1e-7);
  EXPECT_NEAR(w.get(1), 0.5, 1e-7);
}

TEST(RefGelu, TanhApproximationValues) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) evaluated by hand (exact erf-GELU(1) would be 0.841345).
  EXPECT_NEAR(ref::gelu_tanh(1.f), 0.8411919906, 1e-7);
  EXPECT_NEAR(ref::gelu_tanh(-2.f), -0.0454023059, 1e-8);
  EXPECT_NEAR(ref::gelu_tanh(3.f), 2.9963626079, 1e-6);
  EXPECT_EQ(ref::gelu_tanh(0.f), 0.f);
  HostTensor g(kF32, {1, 2}, {1, 3}), u(kF32, {1, 2}, {2, -1}), out(kF32, {1, 2});
  ref::gelu_mul({.out = out, .gate = g, .up = u});
  EXPECT_NEAR(out.get(0), 2 * 0.8411919906, 1e-6);
  EXPECT_NEAR(out.get(1), -2.9963626079, 1e-6);
}

TEST(RefLinear, SmallHandComputed) {
  HostTensor x(kF32, {2, 2}, {1, 2, 3, 4});
  HostTensor w(DType::kBF16, {3, 2}, {1, 0, 0, 1, 1, -1});
  HostTensor out(kF32, {2, 3});
  ref::linear({.out = out, .x = x, .w = w});
  EXPECT_EQ(out.values(), (std::vector<float>{1, 2, -1, 3, 4, -1}));
  ref::linear({.out = out, .x = x, .w = w, .alpha = 2.f, .accumulate = true});
  EXPECT_EQ(out.values(), (std::vector<float>{3, 6, -3, 9, 12, -3}));
}

TEST(RefEmbedding, GathersAndScales) {
  HostTensor table(DType::kBF16, {3, 2}, {1, 2, 3, 4, 5, 6});
  HostTensor ids(kI32, {2}, {2, 0});
  HostTensor out(kF32, {2, 2});
  ref::embedding({.out = out, .table = table, .ids = ids, .scale = 39.25f});
  EXPECT_EQ(out.values(), (std::vector<float>{5 * 39.25f, 6 * 39.25f, 39.25f, 2 * 39.25f}));
}

TEST(RefElementwise, AddAndScale) {
  HostTensor a(kF32, {3}, {1, 2, 3}), b(kF32, {3}, {10, 20, 30});
  ref::add({.out = a, .a = a, .b = b, .b_scale = 0.5f});
  EXPECT_EQ(a.values(), (std::vector<float>{6, 12, 18}));
  ref::scale({.x = a, .s = -2.f});
  EXPECT_EQ(a.values(), (std::vector<float>{-12, -24, -36}));
}

TEST(RefMoeExperts, OneTokenTwoExpertsByHand) {
  // d_model 2, d_ff 1, 3 experts. Expert e: gate row g_e, up row u_e, down column d_e.
  HostTensor gate_up(kF32, {3, 2, 2}, {1, 0, 0, 1,     // e0: g = x0, u = x1
                                       0, 1, 1, 1,     // e1: g = x1, u = x0 + x1
                                       9, 9, 9, 9});   // e2: unused
  HostTensor down(kF32, {3, 2, 1}, {1, 2, -1, 3, 7, 7});
  HostTensor x(kF32, {1, 2}, {1, 2});
  HostTensor idx(kI32, {1, 2}, {1, 0});
  HostTensor w(kF32, {1, 2}, {0.25f, 0.75f});
  HostTensor out(kF32, {1, 2});
  ref::moe_experts({.out = out, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w});
  const double h0 = 0.8411919906 * 2;  // e0: gelu(1) * 2
  const double h1 = 1.9545976940 * 3;  // e1: gelu(2) * 3 (gelu_tanh(2) = 2 + gelu_tanh(-2))
  EXPECT_NEAR(out.get(0), 0.75 * h0 * 1 + 0.25 * h1 * -1, 1e-5);
  EXPECT_NEAR(out.get(1), 0.75 * h0 * 2 + 0.25 * h1 * 3, 1e-5);
}

}  // namespace
}  // namespace tandem
