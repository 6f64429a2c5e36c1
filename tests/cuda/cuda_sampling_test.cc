// CUDA sampling ops against the sample/ reference: the processed distribution (temperature, top-k, top-p, min-p,
// ties at every cut) and the draw of `sample`, and the rejection rule of `reject_drafts`, with the same counter-based
// uniforms (sample/counter_rng.h) on the host and the device. The GPU sums weights in 44-bit fixed point and the
// reference in double, so probabilities are compared to rounding, and a draw is checked to fall in the bin of the
// reference CDF that holds its uniform (to rounding of the bin's edges).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/strings.h"
#include "cuda/cuda_fixture.h"
#include "sample/counter_rng.h"
#include "sample/rejection.h"
#include "sample/sampling.h"

namespace tandem::testing {
namespace {

using CudaSampling = CudaTest;

// Whether token t is the inverse-CDF draw of u from probs (id order), to within `slack` of a bin edge.
::testing::AssertionResult draw_fits(const std::vector<double>& probs, int32_t t, double u, double slack = 1e-5) {
  if (t < 0 || t >= static_cast<int32_t>(probs.size()))
    return ::testing::AssertionFailure() << "token " << t << " out of range";
  if (probs[static_cast<size_t>(t)] <= 0) return ::testing::AssertionFailure() << "token " << t << " has no mass";
  double total = 0, before = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (static_cast<int32_t>(i) == t) before = total;
    total += probs[i];
  }
  const double r = u * total, after = before + probs[static_cast<size_t>(t)];
  if (r < before - slack || r >= after + slack)
    return ::testing::AssertionFailure() << "u " << u << " (x total " << r << ") is outside token " << t << "'s bin ["
                                         << before << ", " << after << ")";
  return ::testing::AssertionSuccess();
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Logits rows that exercise the cuts: 0 smooth, 1 peaked, 2 a few distinct values (many ties at every cut).
void fill_logits(HostTensor& x, int64_t rows, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::uniform_int_distribution<int> level(0, 5);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      float v = normal(rng);
      if (r % 3 == 1) v = 0.5f * v + (i % 97 == 3 ? 6.f : 0.f) + (i == n / 2 ? 12.f : 0.f);
      if (r % 3 == 2) v = 0.5f * static_cast<float>(level(rng));
      x.set(r * n + i, v);
    }
  }
}

TEST_F(CudaSampling, ProcessedDistributionAndDrawsMatchTheReference) {
  const SamplingParams cases[] = {
      {.temperature = 1.f},
      {.temperature = 0.6f, .top_k = 40},
      {.temperature = 1.f, .top_p = 0.9f},
      {.temperature = 1.3f, .top_k = 200, .top_p = 0.83f, .min_p = 0.02f},
      {.temperature = 0.8f, .min_p = 0.1f},
      {.temperature = 1.f, .top_k = 1},
      {.temperature = 2.f, .top_k = 3, .top_p = 0.5f},
      {.temperature = 0.5f, .top_p = 0.999f},
  };
  const int64_t rows = 6;
  uint32_t seed = 11;
  for (int64_t n : {97, 5003, 262144}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      DeviceTensor x(be(), dt, {rows, n}), out(be(), DType::kI32, {rows}), probs(be(), DType::kF32, {rows, n});
      fill_logits(x.host(), rows, n, seed++);
      x.upload();
      for (size_t c = 0; c < std::size(cases); ++c) {
        const SamplingParams& sp = cases[c];
        SCOPED_TRACE(strfmt("n %lld, %s logits, case %zu (T %g, top_k %d, top_p %g, min_p %g)",
                            static_cast<long long>(n), dtype_name(dt), c, static_cast<double>(sp.temperature), sp.top_k,
                            static_cast<double>(sp.top_p), static_cast<double>(sp.min_p)));
        const uint64_t rng_seed = 1234 + c, counter = 100 * c;
        out.poison();
        probs.poison();
        be().sample({.out = out,
                     .x = x,
                     .probs = probs,
                     .temperature = sp.temperature,
                     .top_k = sp.top_k,
                     .top_p = sp.top_p,
                     .min_p = sp.min_p,
                     .seed = rng_seed,
                     .counter = counter});
        out.download();
        probs.download();
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<float> logits(static_cast<size_t>(n)), want;
          for (int64_t i = 0; i < n; ++i) logits[static_cast<size_t>(i)] = x.host().get(r * n + i);
          processed_probs(logits, sp, &want);
          double sum = 0, worst = 0;
          int64_t support_mismatch = 0;
          for (int64_t i = 0; i < n; ++i) {
            const double got = probs.host().get(r * n + i), ref = want[static_cast<size_t>(i)];
            sum += got;
            worst = std::max(worst, std::abs(got - ref) / (ref + 1e-9));
            // Weights below 2^-45 of the maximum are zero on the GPU: only such tokens may differ in support.
            if ((got > 0) != (ref > 0) && ref > 1e-12) ++support_mismatch;
          }
          EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << r;
          EXPECT_LT(worst, 1e-4) << "row " << r << ": largest relative error of a probability";
          EXPECT_EQ(support_mismatch, 0) << "row " << r << ": tokens kept by one side only";
          const double u = uniform_at(rng_seed, counter + static_cast<uint64_t>(r));
          EXPECT_TRUE(draw_fits(to_double(want), out.host().geti(r), u)) << "row " << r;
        }
      }
    }
  }
}

TEST_F(CudaSampling, DrawsFollowTheDistribution) {
  // 4000 rows of the same logits, one uniform each: the counts must follow the processed distribution.
  const int64_t rows = 4000, n = 50;
  DeviceTensor x(be(), DType::kF32, {rows, n}), out(be(), DType::kI32, {rows});
  std::vector<float> logits(static_cast<size_t>(n));
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& v : logits) v = normal(rng);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) x.host().set(r * n + i, logits[static_cast<size_t>(i)]);
  x.upload();
  const SamplingParams sp{.temperature = 1.f, .top_k = 10};
  be().sample({.out = out, .x = x, .temperature = sp.temperature, .top_k = sp.top_k, .seed = 99, .counter = 7});
  out.download();
  std::vector<float> p;
  processed_probs(logits, sp, &p);
  std::vector<int> counts(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = out.host().geti(r);
    ASSERT_TRUE(t >= 0 && t < n);
    ASSERT_GT(p[static_cast<size_t>(t)], 0.f) << "drew a token outside the top-k";
    ++counts[static_cast<size_t>(t)];
  }
  double chi2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = p[static_cast<size_t>(i)] * rows;
    if (e > 0) chi2 += (counts[static_cast<size_t>(i)] - e) * (counts[static_cast<size_t>(i)] - e) / e;
  }
  EXPECT_LT(chi2, 40.0) << "9 degrees of freedom: 40 is beyond the 99.999% quantile";
}

TEST_F(CudaSampling, RejectDraftsMatchesTheReference) {
  const int64_t rows = 48, n = 3001;
  DeviceTensor p(be(), DType::kF32, {rows, n}), q(be(), DType::kF32, {rows, n});
  DeviceTensor draft(be(), DType::kI32, {rows}), accepted(be(), DType::kI32, {rows}), token(be(), DType::kI32, {rows});
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 1.5f);
  std::vector<std::vector<float>> ps(static_cast<size_t>(rows)), qs(ps.size());
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> lp(static_cast<size_t>(n)), lq(lp.size());
    for (size_t i = 0; i < lp.size(); ++i) {
      lp[i] = normal(rng);
      lq[i] = 0.7f * lp[i] + 0.5f * normal(rng);  // a drafter roughly like the target
    }
    auto& pr = ps[static_cast<size_t>(r)];
    auto& qr = qs[static_cast<size_t>(r)];
    processed_probs(lp, {.temperature = 0.7f, .top_k = r % 2 ? 0 : 300}, &pr);
    processed_probs(lq, {.temperature = 0.7f, .top_p = 0.95f}, &qr);
    if (r == 0) qr = pr;  // p == q: nothing is ever rejected
    int32_t d = sample_at(qr, uniform_at(77, static_cast<uint64_t>(r)));
    if (r == 1) d = static_cast<int32_t>(std::max_element(pr.begin(), pr.end()) - pr.begin());  // likely accepted
    if (r == 2) {  // a draft the target never keeps (rejected whatever the uniform)
      d = 0;
      while (pr[static_cast<size_t>(d)] > 0) ++d;
    }
    draft.host().seti(r, d);
    for (int64_t i = 0; i < n; ++i) {
      p.host().set(r * n + i, pr[static_cast<size_t>(i)]);
      q.host().set(r * n + i, qr[static_cast<size_t>(i)]);
    }
  }
  p.upload();
  q.upload();
  draft.upload();
  accepted.poison();
  token.poison();
  const uint64_t seed = 2024, counter = 31;
  be().reject_drafts(
      {.accepted = accepted, .token = token, .p = p, .q = q, .draft = draft, .seed = seed, .counter = counter});
  accepted.download();
  token.download();
  int n_accepted = 0;
  for (int64_t r = 0; r < rows; ++r) {
    SCOPED_TRACE(strfmt("row %lld", static_cast<long long>(r)));
    const auto& pr = ps[static_cast<size_t>(r)];
    const auto& qr = qs[static_cast<size_t>(r)];
    const int32_t d = draft.host().geti(r);
    const double u1 = uniform_at(seed, counter + 2 * static_cast<uint64_t>(r));
    const double u2 = uniform_at(seed, counter + 2 * static_cast<uint64_t>(r) + 1);
    const Verdict want = verify_draft_at(pr, qr, d, u1, u2);
    const double ratio = std::min(1.0, static_cast<double>(pr[static_cast<size_t>(d)]) / qr[static_cast<size_t>(d)]);
    if (std::abs(u1 - ratio) > 1e-6) {
      ASSERT_EQ(accepted.host().geti(r), want.accepted ? 1 : 0);
    }
    if (r == 0 || r == 2) {
      EXPECT_EQ(accepted.host().geti(r), r == 0 ? 1 : 0);
    }
    if (accepted.host().geti(r) == 1) {
      ++n_accepted;
      EXPECT_EQ(token.host().geti(r), d);
      continue;
    }
    std::vector<double> residual(pr.size());
    double mass = 0;
    for (size_t i = 0; i < pr.size(); ++i) mass += residual[i] = std::max(0.0, static_cast<double>(pr[i]) - qr[i]);
    if (mass <= 0) residual = to_double(pr);
    EXPECT_TRUE(draw_fits(residual, token.host().geti(r), u2));
  }
  EXPECT_GT(n_accepted, 2);
  EXPECT_LT(n_accepted, rows - 2);
}

TEST_F(CudaSampling, OversizedVocabularyIsAnError) {
  const int64_t n = 8 * 40960 + 1;
  DeviceTensor x(be(), DType::kF32, {1, n}), out(be(), DType::kI32, {1});
  x.host().fill(0.f);
  x.upload();
  be().sample({.out = out, .x = x, .temperature = 1.f});
  const Status st = be().last_error();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.to_string().find("vocabulary"), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace tandem::testing
