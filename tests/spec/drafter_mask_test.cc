// The drafter's masks (spec §4.6, clean mode): a query at Pq = P over target K/V [0, P) sees all keys on the full
// layer and exactly the newest W+1 on a sliding layer. Checked through the reference attention kernel with keys
// that make every visible key equally likely and values that encode their position.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/ref/ref.h"
#include "model/assistant.h"

namespace tandem {
namespace {

// Mean of the positions the query at q_pos sees, and how many it sees (values = position, q·k = 0).
std::pair<double, int64_t> visible(int64_t P, int64_t window, int64_t capacity, bool ring) {
  const int64_t d = 2;
  std::vector<float> k(static_cast<size_t>(capacity * d), 0.f), v(static_cast<size_t>(capacity * d), 0.f);
  KvView kv;
  kv.k = Tensor::make(k.data(), DType::kF32, {1, capacity, d});
  kv.v = Tensor::make(v.data(), DType::kF32, {1, capacity, d});
  kv.ring = ring;
  kv.end = P;
  kv.begin = ring ? std::max<int64_t>(0, P - capacity) : 0;
  for (int64_t p = kv.begin; p < P; ++p) {
    v[static_cast<size_t>(kv.slot(p) * d)] = static_cast<float>(p);
    v[static_cast<size_t>(kv.slot(p) * d + 1)] = 1.f;
  }
  std::vector<float> q(static_cast<size_t>(d), 0.f), out(static_cast<size_t>(d), -1.f);
  int32_t qpos = static_cast<int32_t>(P);
  ref::attention({.out = Tensor::make(out.data(), DType::kF32, {1, 1, d}),
                  .q = Tensor::make(q.data(), DType::kF32, {1, 1, d}), .kv = kv,
                  .q_pos = Tensor::make(&qpos, DType::kI32, {1}), .window = window, .causal = true, .scale = 1.f});
  // Uniform weights over n visible keys: out[0] = mean position, and the count follows from the arithmetic mean
  // of a contiguous run ending at P-1: mean = P - 1 - (n - 1) / 2.
  const double mean = out[0];
  return {mean, static_cast<int64_t>(std::llround(2 * (static_cast<double>(P) - 1 - mean) + 1))};
}

TEST(DrafterMask, SlidingLayerSeesTheNewestWPlus1Keys) {
  for (int64_t W : {16, 512}) {
    for (int64_t P : {W - 3, W + 1, W + 2, W + 3, 3 * W + 5}) {
      if (P <= 0) continue;
      auto [mean, n] = visible(P, drafter_sliding_window(W), /*capacity=*/W + 1 + 64, /*ring=*/true);
      EXPECT_EQ(n, std::min(P, W + 1)) << "W " << W << " P " << P;
      EXPECT_DOUBLE_EQ(mean, (P - 1) - (std::min(P, W + 1) - 1) / 2.0);
    }
  }
}

TEST(DrafterMask, FullLayerSeesEveryKey) {
  for (int64_t P : {1, 7, 700}) {
    auto [mean, n] = visible(P, /*window=*/0, /*capacity=*/1024, /*ring=*/false);
    EXPECT_EQ(n, P);
  }
}

}  // namespace
}  // namespace tandem
