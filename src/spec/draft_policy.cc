// Draft-length policies (see draft_policy.h).
#include "spec/draft_policy.h"

#include <algorithm>

#include "core/strings.h"

namespace tandem {
namespace {

class FixedPolicy final : public DraftPolicy {
 public:
  explicit FixedPolicy(int k) : k_(k) {}
  int next_k() override { return k_; }
  void observe(const RoundObservation&) override {}
  std::string name() const override { return strfmt("fixed K=%d", k_); }

 private:
  int k_;
};

class HeuristicPolicy final : public DraftPolicy {
 public:
  HeuristicPolicy(int k, int max_k) : k_(std::clamp(k, 1, max_k)), max_k_(max_k) {}
  int next_k() override { return k_; }
  void observe(const RoundObservation& o) override {
    if (o.k <= 0) return;
    k_ = o.accepted == o.k ? std::min(max_k_, k_ + 2) : std::max(1, k_ - 1);
  }
  std::string name() const override { return "heuristic (+2 / -1)"; }

 private:
  int k_, max_k_;
};

// Exponential moving average with a count, so early estimates are plain means.
struct Ema {
  double value = 0;
  int n = 0;
  void add(double x) {
    ++n;
    value += (x - value) / std::min(n, 16);
  }
};

class CostModelPolicy final : public DraftPolicy {
 public:
  explicit CostModelPolicy(int max_k)
      : max_k_(max_k), attempts_(static_cast<size_t>(max_k), 0.0), accepts_(static_cast<size_t>(max_k), 0.0),
        verify_(static_cast<size_t>(max_k) + 1) {}

  int next_k() override {
    ++round_;
    // Warm-up: measure a mid-size block first, then an occasional neighbour to keep the estimates honest.
    if (draft_.n == 0 || round_ <= 2) return std::min(3, max_k_);
    if (round_ % 16 == 0) return std::clamp(best_ + (round_ / 16 % 2 ? 1 : -1), 0, max_k_);
    return best_;
  }

  void observe(const RoundObservation& o) override {
    if (o.k > 0) draft_.add(o.draft_seconds / o.k);
    verify_[static_cast<size_t>(o.k)].add(o.verify_seconds);
    for (int j = 0; j < o.k; ++j) {
      attempts_[static_cast<size_t>(j)] += 1;
      if (j < o.accepted) accepts_[static_cast<size_t>(j)] += 1;
      else break;  // conditional acceptance: positions past the first rejection were not reached
    }
    choose();
  }

  std::string name() const override { return "auto (cost model)"; }

 private:
  void choose() {
    // Conditional acceptance with a Beta(1, 1) prior; verify time per size from measurements, filling gaps with
    // a linear fit (the pass is weight-bound, so its time grows slowly with the number of tokens).
    std::vector<double> alpha(static_cast<size_t>(max_k_));
    for (size_t j = 0; j < alpha.size(); ++j) alpha[j] = (accepts_[j] + 1.0) / (attempts_[j] + 2.0);
    std::vector<double> verify(static_cast<size_t>(max_k_) + 1);
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    int m = 0;
    for (size_t n = 0; n < verify_.size(); ++n) {
      if (verify_[n].n == 0) continue;
      double x = static_cast<double>(n + 1), y = verify_[n].value;
      sx += x, sy += y, sxx += x * x, sxy += x * y, ++m;
    }
    if (m == 0) return;
    double slope = m >= 2 && sxx * m - sx * sx > 0 ? (sxy * m - sx * sy) / (sxx * m - sx * sx) : 0.02 * sy / m;
    slope = std::max(slope, 0.0);
    double icpt = (sy - slope * sx) / m;
    for (size_t n = 0; n < verify.size(); ++n)
      verify[n] = verify_[n].n ? verify_[n].value : std::max(1e-9, icpt + slope * static_cast<double>(n + 1));
    double best_rate = -1;
    for (int k = 0; k <= max_k_; ++k) {
      double r = expected_tokens_per_second(k, alpha, draft_.value, verify);
      if (r > best_rate) best_rate = r, best_ = k;
    }
  }

  int max_k_;
  long round_ = 0;
  int best_ = 3;
  Ema draft_;
  std::vector<double> attempts_, accepts_;
  std::vector<Ema> verify_;
};

}  // namespace

double expected_tokens_per_second(int k, const std::vector<double>& alpha, double draft_step_seconds,
                                  const std::vector<double>& verify_seconds) {
  double tokens = 1.0, run = 1.0;
  for (int j = 0; j < k && j < static_cast<int>(alpha.size()); ++j) {
    run *= alpha[static_cast<size_t>(j)];
    tokens += run;
  }
  double t = k * draft_step_seconds + verify_seconds.at(static_cast<size_t>(k));
  return t > 0 ? tokens / t : 0.0;
}

std::unique_ptr<DraftPolicy> make_fixed_policy(int k) { return std::make_unique<FixedPolicy>(k); }
std::unique_ptr<DraftPolicy> make_heuristic_policy(int initial_k, int max_k) {
  return std::make_unique<HeuristicPolicy>(initial_k, max_k);
}
std::unique_ptr<DraftPolicy> make_cost_model_policy(int max_k) { return std::make_unique<CostModelPolicy>(max_k); }

}  // namespace tandem
