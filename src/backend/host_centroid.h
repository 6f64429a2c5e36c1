// The masked embedder's cluster choice on the host (ops.h CentroidCandidatesArgs): the reference of the
// centroid_candidates op and its default implementation (host_centroid.cc).
#pragma once

#include <span>
#include <vector>

namespace tandem {

// The k clusters of the highest logits in decreasing order: ties to the lower cluster, NaN above every number
// (the lower cluster first among NaNs). k <= logits.size().
std::vector<int> top_clusters(std::span<const float> logits, int k);

}  // namespace tandem
