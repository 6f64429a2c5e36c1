// Backend's default centroid_candidates (backend.h): the cluster logits come back to the host, top_clusters picks
// the clusters, and the candidates' token ids are gathered from the ordering table (k reads of m ids) and written
// back. Exact for the CPU backend, whose "device" memory is host memory; the CUDA backend runs it on the device.
#include "backend/host_centroid.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "backend/backend.h"
#include "core/check.h"

namespace tandem {

std::vector<int> top_clusters(std::span<const float> logits, int k) {
  TANDEM_CHECK(k >= 0 && static_cast<size_t>(k) <= logits.size());
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int x, int y) {
    const float vx = logits[static_cast<size_t>(x)], vy = logits[static_cast<size_t>(y)];
    const bool nx = std::isnan(vx), ny = std::isnan(vy);
    if (nx || ny) return nx && (!ny || x < y);
    return vx > vy || (vx == vy && x < y);
  });
  order.resize(static_cast<size_t>(k));
  return order;
}

void Backend::centroid_candidates(const CentroidCandidatesArgs& a) {
  const int64_t C = a.logits.numel();
  TANDEM_CHECK_MSG(C > 0 && a.k >= 1 && a.k <= C && a.ordering.dtype == DType::kI32 && a.ordering.numel() % C == 0 &&
                       a.ids.dtype == DType::kI32 && a.ids.numel() == a.k * (a.ordering.numel() / C) &&
                       a.ids.is_contiguous() && a.ordering.is_contiguous() && a.logits.is_contiguous(),
                   "centroid_candidates: ids %s, logits %s, ordering %s, k %d", a.ids.describe().c_str(),
                   a.logits.describe().c_str(), a.ordering.describe().c_str(), a.k);
  const int64_t m = a.ordering.numel() / C;
  std::vector<uint8_t> raw(static_cast<size_t>(C) * dtype_size(a.logits.dtype));
  TANDEM_CHECK_MSG(copy(raw.data(), a.logits.data, raw.size(), CopyKind::kDeviceToHost).ok() && synchronize().ok(),
                   "%s: reading the cluster logits back failed", name());
  std::vector<float> logits(static_cast<size_t>(C));
  for (int64_t i = 0; i < C; ++i) logits[static_cast<size_t>(i)] = load_as_f32(raw.data(), a.logits.dtype, i);
  const std::vector<int> clusters = top_clusters(logits, a.k);
  std::vector<int32_t> ids(static_cast<size_t>(a.k * m));
  const auto* ordering = static_cast<const int32_t*>(a.ordering.data);
  for (int j = 0; j < a.k; ++j) {
    TANDEM_CHECK_MSG(copy(ids.data() + static_cast<size_t>(j) * m, ordering + clusters[static_cast<size_t>(j)] * m,
                          static_cast<size_t>(m) * sizeof(int32_t), CopyKind::kDeviceToHost)
                         .ok(),
                     "%s: reading the token ordering failed", name());
  }
  TANDEM_CHECK_MSG(synchronize().ok() &&
                       copy(a.ids.data, ids.data(), ids.size() * sizeof(int32_t), CopyKind::kHostToDevice).ok() &&
                       synchronize().ok(),
                   "%s: writing the candidate ids failed", name());
}

}  // namespace tandem
