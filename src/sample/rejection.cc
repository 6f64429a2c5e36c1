// Speculative acceptance (see rejection.h).
#include "sample/rejection.h"

#include <algorithm>
#include <vector>

namespace tandem {

Verdict verify_draft(std::span<const float> p, std::span<const float> q, int32_t draft, Rng& rng) {
  const double u = rng.uniform();
  return verify_draft_at(p, q, draft, u, rng.uniform());
}

Verdict verify_draft_at(std::span<const float> p, std::span<const float> q, int32_t draft, double u_accept,
                        double u_resample) {
  const size_t d = static_cast<size_t>(draft);
  const double pd = d < p.size() ? p[d] : 0.0;
  const double qd = q.empty() ? 1.0 : (d < q.size() ? q[d] : 0.0);
  const double accept_prob = qd > 0.0 ? std::min(1.0, pd / qd) : 0.0;
  if (u_accept < accept_prob) return {.accepted = true, .token = draft};
  // Residual max(0, p - q); with a point mass it is p without the draft.
  std::vector<float> residual(p.begin(), p.end());
  double mass = 0.0;
  for (size_t i = 0; i < residual.size(); ++i) {
    double r = q.empty() ? (i == d ? 0.0 : residual[i]) : std::max(0.0, static_cast<double>(p[i]) - q[i]);
    residual[i] = static_cast<float>(r);
    mass += r;
  }
  // mass == 0 only when p == q (then rejection had probability 0) or p is all on the draft: fall back to p.
  if (mass <= 0.0) return {.accepted = false, .token = sample_at(p, u_resample)};
  return {.accepted = false, .token = sample_at(residual, u_resample)};
}

}  // namespace tandem
