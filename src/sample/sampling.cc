// Sampling implementation (see sampling.h).
#include "sample/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/strings.h"

namespace tandem {

Status SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.f)
    return invalid_argument(strfmt("temperature must be a finite number >= 0 (got %g)", temperature));
  if (top_k < 0) return invalid_argument(strfmt("top_k must be >= 0 (got %d)", top_k));
  if (!(top_p > 0.f && top_p <= 1.f)) return invalid_argument(strfmt("top_p must be in (0, 1] (got %g)", top_p));
  if (!(min_p >= 0.f && min_p <= 1.f)) return invalid_argument(strfmt("min_p must be in [0, 1] (got %g)", min_p));
  return ok_status();
}

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& s : s_) s = splitmix64(x);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }

int32_t argmax(std::span<const float> logits) {
  int32_t best = -1;
  float bv = 0.f;
  for (size_t i = 0; i < logits.size(); ++i) {
    float v = logits[i];
    if (std::isnan(v)) continue;
    if (best < 0 || v > bv) {
      best = static_cast<int32_t>(i);
      bv = v;
    }
  }
  return best < 0 ? 0 : best;
}

void processed_probs(std::span<const float> logits, const SamplingParams& params, std::vector<float>* probs) {
  const size_t n = logits.size();
  probs->assign(n, 0.f);
  if (n == 0) return;
  if (params.greedy()) {
    (*probs)[static_cast<size_t>(argmax(logits))] = 1.f;
    return;
  }
  // Candidates: every id, or the top-k (with ties at the k-th value). Order by logit (descending, lower id first on
  // ties) is needed only for top-p, and only as far as the cut: a partial sort of a prefix when the cut lies in it,
  // instead of sorting the whole vocabulary per token.
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto logit = [&](int32_t i) { return logits[static_cast<size_t>(i)]; };
  auto by_logit = [&](int32_t a, int32_t b) { return logit(a) > logit(b) || (logit(a) == logit(b) && a < b); };
  if (params.top_k > 0 && static_cast<size_t>(params.top_k) < n) {
    // Ties at the k-th value stay in, as transformers' TopK warper keeps every logit >= the k-th largest.
    const size_t k = static_cast<size_t>(params.top_k);
    std::nth_element(idx.begin(), idx.begin() + static_cast<long>(k - 1), idx.end(), by_logit);
    const float kth = logit(idx[k - 1]);
    size_t keep = 0;
    for (size_t i = 0; i < n; ++i)
      if (logits[i] >= kth) idx[keep++] = static_cast<int32_t>(i);
    idx.resize(keep);
  }
  // Softmax of logits / T over the candidates, in double.
  const double inv_t = 1.0 / params.temperature;
  float max_logit = logit(idx[0]);
  for (int32_t i : idx) max_logit = std::max(max_logit, logit(i));
  const double mx = static_cast<double>(max_logit) * inv_t;
  std::vector<double> weight(n);  // by id, for the candidates (each exp once: the loops below read it 2-3 times)
  double sum = 0.0;
  for (int32_t i : idx) sum += weight[static_cast<size_t>(i)] = std::exp(static_cast<double>(logit(i)) * inv_t - mx);
  auto prob = [&](int32_t i) { return weight[static_cast<size_t>(i)] / sum; };
  size_t cut = idx.size();
  if (params.top_p < 1.f) {
    // The smallest prefix (by logit) with mass >= top_p, plus the tokens tied with its last one (as in top-k).
    // The first 1,024 hold the cut of a trained model's rows; otherwise one full sort (cheaper than growing prefixes).
    for (size_t m = std::min<size_t>(idx.size(), 1024);; m = idx.size()) {
      if (m == idx.size()) {
        std::sort(idx.begin(), idx.end(), by_logit);
      } else {
        std::partial_sort(idx.begin(), idx.begin() + static_cast<long>(m), idx.end(), by_logit);
      }
      double cum = 0.0;
      size_t c = 0;
      while (c < m && cum < static_cast<double>(params.top_p)) cum += prob(idx[c++]);
      if (cum < static_cast<double>(params.top_p) && m < idx.size()) continue;  // the cut lies beyond the prefix
      while (c < m && logit(idx[c]) == logit(idx[c - 1])) ++c;
      if (c == m && m < idx.size()) continue;  // ties may run on past the prefix
      cut = c;
      break;
    }
  }
  // min-p: drop tokens below min_p x the largest probability (the maximum always stays).
  const double floor = static_cast<double>(params.min_p) / sum;  // the largest probability is exp(0) / sum
  double kept = 0.0;
  size_t n_kept = 0;
  for (size_t j = 0; j < cut; ++j) {
    const double pj = prob(idx[j]);
    if (pj >= floor) {
      idx[n_kept++] = idx[j];
      kept += pj;
    }
  }
  for (size_t j = 0; j < n_kept; ++j) {
    const int32_t i = idx[j];
    (*probs)[static_cast<size_t>(i)] = static_cast<float>(prob(i) / kept);
  }
}

int32_t sample(std::span<const float> probs, Rng& rng) { return sample_at(probs, rng.uniform()); }

int32_t sample_at(std::span<const float> probs, double u) {
  double total = 0.0;
  for (float v : probs) total += v;
  double r = u * total;
  int32_t last = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.f) continue;
    last = static_cast<int32_t>(i);
    r -= probs[i];
    if (r < 0.0) return last;
  }
  return last;  // rounding: the last token with mass
}

}  // namespace tandem
