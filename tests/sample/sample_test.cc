// Sampling and acceptance math: processed distributions (temperature, top-k, top-p, min-p), seeded draws, the
// rejection rule (point-mass and general proposals), and the draft-length policies.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "sample/counter_rng.h"
#include "sample/rejection.h"
#include "spec/draft_policy.h"

namespace tandem {
namespace {

TEST(Sampling, GreedyIsArgmaxWithLowestIdOnTies) {
  std::vector<float> l = {0.f, 3.f, 1.f, 3.f};
  EXPECT_EQ(argmax(l), 1);
  std::vector<float> p;
  processed_probs(l, {}, &p);
  EXPECT_EQ(p, (std::vector<float>{0.f, 1.f, 0.f, 0.f}));
}

TEST(Sampling, ProcessedProbsMatchAnIndependentComputation) {
  std::vector<float> l = {1.0f, 2.0f, 0.5f, -1.f, 2.0f, 0.1f};
  SamplingParams sp{.temperature = 0.7f};
  std::vector<float> p;
  processed_probs(l, sp, &p);
  double z = 0;
  for (float v : l) z += std::exp(v / 0.7);
  for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(p[i], std::exp(l[i] / 0.7) / z, 1e-6);
  // top-k 3: ids 1, 4 (tied 2.0) and 0 (1.0).
  sp.top_k = 3;
  processed_probs(l, sp, &p);
  const double z3 = 2 * std::exp(2.0 / 0.7) + std::exp(1.0 / 0.7);
  EXPECT_NEAR(p[1], std::exp(2.0 / 0.7) / z3, 1e-6);
  EXPECT_NEAR(p[0], std::exp(1.0 / 0.7) / z3, 1e-6);
  EXPECT_EQ(p[2], 0.f);
  // top-p keeps the smallest prefix with mass >= p: here the two 2.0 tokens.
  sp = {.temperature = 1.f, .top_p = 0.6f};
  processed_probs(l, sp, &p);
  EXPECT_NEAR(p[1] + p[4], 1.0, 1e-6);
  EXPECT_NEAR(p[1], 0.5, 1e-6);
  // min-p drops tokens below min_p * max.
  sp = {.temperature = 1.f, .min_p = 0.3f};
  processed_probs(l, sp, &p);
  EXPECT_GT(p[0], 0.f);  // e^-1 = 0.37 of the max
  EXPECT_EQ(p[2], 0.f);  // e^-1.5 = 0.22 of the max
}

// The processed distribution by the definition, step by step over a fully sorted list (what processed_probs computed
// before it learnt to sort only the prefix top-p needs).
std::vector<double> processed_by_definition(const std::vector<float>& l, const SamplingParams& sp) {
  std::vector<int32_t> idx(l.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  size_t keep = idx.size();
  if (sp.top_k > 0 && static_cast<size_t>(sp.top_k) < keep) {
    keep = static_cast<size_t>(sp.top_k);
    while (keep < idx.size() && l[idx[keep]] == l[idx[keep - 1]]) ++keep;
  }
  std::vector<double> p(keep);
  double sum = 0;
  for (size_t i = 0; i < keep; ++i)
    sum += p[i] = std::exp((l[idx[i]] - l[idx[0]]) / static_cast<double>(sp.temperature));
  size_t cut = keep;
  double cum = 0;
  for (size_t i = 0; i < keep && sp.top_p < 1.f; ++i) {
    cum += p[i] / sum;
    if (cum >= sp.top_p) {
      cut = i + 1;
      while (cut < keep && l[idx[cut]] == l[idx[cut - 1]]) ++cut;
      break;
    }
  }
  size_t m = 0;
  while (m < cut && p[m] >= sp.min_p * p[0]) ++m;
  double kept = 0;
  for (size_t i = 0; i < m; ++i) kept += p[i];
  std::vector<double> out(l.size());
  for (size_t i = 0; i < m; ++i) out[static_cast<size_t>(idx[i])] = p[i] / kept;
  return out;
}

TEST(Sampling, ProcessedProbsFollowTheDefinitionOnALargeVocabulary) {
  // 60,000 logits on a coarse grid (many ties at every cut), flat enough that top-p needs more than the first
  // prefix processed_probs sorts.
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.f, 1.5f);
  std::vector<float> l(60000);
  for (float& v : l) v = std::round(normal(rng) * 16.f) / 16.f;
  const SamplingParams cases[] = {{.temperature = 1.f},
                                  {.temperature = 0.7f, .top_k = 50},
                                  {.temperature = 1.f, .top_p = 0.9f},
                                  {.temperature = 3.f, .top_p = 0.5f},
                                  {.temperature = 1.2f, .top_k = 5000, .top_p = 0.8f, .min_p = 0.01f},
                                  {.temperature = 0.8f, .min_p = 0.2f},
                                  {.temperature = 1.f, .top_k = 1}};
  for (const SamplingParams& sp : cases) {
    SCOPED_TRACE(testing::Message() << "T " << sp.temperature << " top_k " << sp.top_k << " top_p " << sp.top_p
                                    << " min_p " << sp.min_p);
    std::vector<float> got;
    processed_probs(l, sp, &got);
    const std::vector<double> want = processed_by_definition(l, sp);
    size_t kept = 0;
    for (size_t i = 0; i < l.size(); ++i) {
      ASSERT_EQ(got[i] > 0, want[i] > 0) << "token " << i;
      ASSERT_NEAR(got[i], want[i], 1e-6 * want[i] + 1e-12) << "token " << i;
      kept += want[i] > 0;
    }
    if (sp.top_p < 1.f) EXPECT_GT(kept, 1024u) << "the case does not reach past the first sorted prefix";
  }
}

TEST(Sampling, InvalidParamsAreRejected) {
  EXPECT_FALSE((SamplingParams{.temperature = -1.f}).validate().ok());
  EXPECT_FALSE((SamplingParams{.temperature = NAN}).validate().ok());
  EXPECT_FALSE((SamplingParams{.top_p = 0.f}).validate().ok());
  EXPECT_FALSE((SamplingParams{.min_p = 2.f}).validate().ok());
  EXPECT_FALSE((SamplingParams{.top_k = -3}).validate().ok());
  EXPECT_TRUE((SamplingParams{.temperature = 0.8f, .top_k = 40, .top_p = 0.9f}).validate().ok());
}

TEST(Sampling, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  std::vector<float> p = {0.1f, 0.0f, 0.6f, 0.3f};
  Rng a(42), b(42);
  std::vector<int> counts(4);
  for (int i = 0; i < 40000; ++i) {
    int32_t x = sample(p, a);
    EXPECT_EQ(x, sample(p, b));
    ++counts[static_cast<size_t>(x)];
  }
  EXPECT_EQ(counts[1], 0);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(counts[i] / 40000.0, p[i], 0.01);
}

TEST(Sampling, TopPKeepsTokensTiedWithTheLastOneKept) {
  // Sorted: 2.0 (p 0.447), then three tokens tied at 1.0 (0.164 each): top-p 0.5 is reached by the first tie, and
  // the other two stay with it; the 0.0 token goes.
  std::vector<float> l = {1.f, 2.f, 1.f, 0.f, 1.f};
  std::vector<float> p;
  processed_probs(l, {.temperature = 1.f, .top_p = 0.5f}, &p);
  EXPECT_GT(p[0], 0.f);
  EXPECT_GT(p[2], 0.f);
  EXPECT_GT(p[4], 0.f);
  EXPECT_EQ(p[3], 0.f);
  EXPECT_NEAR(p[0] + p[1] + p[2] + p[4], 1.0, 1e-6);
}

TEST(Sampling, CounterUniformsAreReproducibleUniformAndUnrelatedAcrossSeeds) {
  const int n = 100000;
  std::vector<int> bins(20);
  double mean = 0;
  int same_as_next_seed = 0;
  for (int i = 0; i < n; ++i) {
    const double u = uniform_at(7, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    EXPECT_EQ(u, uniform_at(7, static_cast<uint64_t>(i)));
    ++bins[static_cast<size_t>(u * 20)];
    mean += u / n;
    if (static_cast<int>(u * 20) == static_cast<int>(uniform_at(8, static_cast<uint64_t>(i)) * 20)) ++same_as_next_seed;
  }
  double chi2 = 0;
  for (int c : bins) chi2 += (c - n / 20.0) * (c - n / 20.0) / (n / 20.0);
  EXPECT_LT(chi2, 50.0) << "19 degrees of freedom";
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_NEAR(same_as_next_seed / static_cast<double>(n), 0.05, 0.005) << "seeds 7 and 8 give correlated streams";
  // sample_at is the inverse CDF in id order.
  const std::vector<float> probs = {0.25f, 0.f, 0.5f, 0.25f};
  EXPECT_EQ(sample_at(probs, 0.0), 0);
  EXPECT_EQ(sample_at(probs, 0.2499), 0);
  EXPECT_EQ(sample_at(probs, 0.25), 2);
  EXPECT_EQ(sample_at(probs, 0.7499), 2);
  EXPECT_EQ(sample_at(probs, 0.75), 3);
  EXPECT_EQ(sample_at(probs, 0.9999), 3);
}

TEST(Rejection, PointMassAcceptsWithProbabilityPAndResamplesWithoutTheDraft) {
  // Accepting d with probability p(d) and otherwise drawing from p without d reproduces p exactly.
  std::vector<float> p = {0.5f, 0.2f, 0.3f};
  Rng rng(7);
  const int n = 60000;
  std::vector<int> out(3);
  int accepted = 0;
  for (int i = 0; i < n; ++i) {
    Verdict v = verify_draft(p, {}, 2, rng);
    accepted += v.accepted;
    if (!v.accepted) {
      EXPECT_NE(v.token, 2);
    }
    ++out[static_cast<size_t>(v.token)];
  }
  EXPECT_NEAR(accepted / static_cast<double>(n), 0.3, 0.01);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(out[i] / static_cast<double>(n), p[i], 0.01);
}

TEST(Rejection, GeneralProposalIsLossless) {
  // Drafts drawn from q, accepted with min(1, p/q), residual max(0, p - q): the output follows p.
  std::vector<float> p = {0.1f, 0.5f, 0.15f, 0.25f}, q = {0.4f, 0.1f, 0.4f, 0.1f};
  Rng rng(3), draw(4);
  const int n = 80000;
  std::vector<int> out(4);
  for (int i = 0; i < n; ++i) ++out[static_cast<size_t>(verify_draft(p, q, sample(q, draw), rng).token)];
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(out[i] / static_cast<double>(n), p[i], 0.01);
}

TEST(DraftPolicy, HeuristicFollowsTransformers) {
  auto h = make_heuristic_policy(3, 8);
  EXPECT_EQ(h->next_k(), 3);
  h->observe({.k = 3, .accepted = 3});
  EXPECT_EQ(h->next_k(), 5);
  h->observe({.k = 5, .accepted = 2});
  EXPECT_EQ(h->next_k(), 4);
  for (int i = 0; i < 10; ++i) h->observe({.k = 1, .accepted = 0});
  EXPECT_EQ(h->next_k(), 1);
}

TEST(DraftPolicy, ExpectedRateAndCostModelChoice) {
  // 2 drafts at alpha 0.5: 1 + 0.5 + 0.25 tokens in 2 * 1 ms + 10 ms.
  EXPECT_NEAR(expected_tokens_per_second(2, {0.5, 0.5}, 1e-3, {10e-3, 10e-3, 10e-3}), 1.75 / 12e-3, 1e-9);
  // A drafter that is always right and cheap: the cost model climbs to the largest K.
  auto good = make_cost_model_policy(6);
  for (int i = 0; i < 60; ++i) {
    int k = good->next_k();
    good->observe({.k = k, .accepted = k, .draft_seconds = k * 0.1e-3, .verify_seconds = 10e-3 + k * 0.2e-3});
  }
  EXPECT_EQ(good->next_k(), 6);
  // A drafter that is never right: speculation switches off (K = 0, plain decoding).
  auto bad = make_cost_model_policy(6);
  int zeros = 0;
  for (int i = 0; i < 60; ++i) {
    int k = bad->next_k();
    zeros += k == 0;
    bad->observe({.k = k, .accepted = 0, .draft_seconds = k * 1e-3, .verify_seconds = 10e-3 + k * 0.5e-3});
  }
  EXPECT_GT(zeros, 40);
}

}  // namespace
}  // namespace tandem
