// The timeline arithmetic of `tandem bench --trace` (backend/kernel_timeline.h) on hand-made kernel spans.
#include "backend/kernel_timeline.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

constexpr uint64_t kUs = 1000;  // spans are in nanoseconds

KernelSpan span(uint64_t start_us, uint64_t end_us, uint64_t node, uint32_t graph, std::string name = "k") {
  return {.start_ns = start_us * kUs, .end_ns = end_us * kUs, .node = node, .graph = graph, .name = std::move(name)};
}

TEST(KernelTimeline, ReplayStatsSeparateIdleBusyAndOverlap) {
  // [0, 10] and [5, 20] overlap by 5 us; [30, 40] follows after 10 us of nothing running.
  const std::vector<KernelSpan> r = {span(30, 40, 3, 1), span(0, 10, 1, 1), span(5, 20, 2, 1)};
  const ReplayStats s = replay_stats(r);
  EXPECT_DOUBLE_EQ(s.wall_us, 40);
  EXPECT_DOUBLE_EQ(s.busy_us, 30);
  EXPECT_DOUBLE_EQ(s.kernel_sum_us, 35);
  EXPECT_EQ(s.kernels, 3);
  // A kernel inside another one adds to the sum, not to the busy time.
  const std::vector<KernelSpan> nested = {span(0, 100, 1, 1), span(10, 20, 2, 1)};
  EXPECT_DOUBLE_EQ(replay_stats(nested).busy_us, 100);
  EXPECT_DOUBLE_EQ(replay_stats(nested).kernel_sum_us, 110);
}

TEST(KernelTimeline, SplitReplaysByNodeOccurrenceAndDropsACutOffReplay) {
  std::vector<KernelSpan> spans;
  for (uint64_t r = 0; r < 3; ++r) {
    // Nodes 7 and 9 run concurrently, each replay in a different order.
    spans.push_back(span(100 * r + (r % 2 ? 5 : 0), 100 * r + 30, 7, 4));
    spans.push_back(span(100 * r + (r % 2 ? 0 : 5), 100 * r + 30, 9, 4));
    spans.push_back(span(100 * r + 40, 100 * r + 50, 11, 4));
  }
  spans.push_back(span(300, 330, 7, 4));  // tracing ended inside a fourth replay
  const auto reps = split_replays(spans);
  ASSERT_EQ(reps.size(), 3u);
  for (size_t r = 0; r < reps.size(); ++r) {
    ASSERT_EQ(reps[r].size(), 3u);
    EXPECT_EQ(reps[r].back().node, 11u);
    EXPECT_EQ(reps[r].back().start_ns, (100 * r + 40) * kUs);
  }
}

TEST(KernelTimeline, ShortNamesDropNamespacesAndParameters) {
  EXPECT_EQ(short_kernel_name("_ZN6tandem4cuda12_GLOBAL__N_111gemv_kernelILi1ELNS0_12PrefetchKindE2EEEvPKfi"),
            "gemv_kernel<1, (PrefetchKind)2>");
  EXPECT_EQ(short_kernel_name("plain_kernel"), "plain_kernel");
  EXPECT_EQ(short_kernel_name("_ZN6tandem4cuda12_GLOBAL__N_111gemv_kernelILi1ELNS0_12PrefetchKindE2EEEvPKfi", 12),
            "gemv_kern...");
}

TEST(KernelTimeline, ReportSumsTheMostReplayedGraph) {
  std::vector<KernelSpan> spans = {span(0, 5, 0, 0, "eager")};
  // Graph 2: four replays 100 us apart; each: a 10 us kernel, 4 us idle, then two 20 us kernels overlapping by 6 us.
  for (uint64_t r = 0; r < 4; ++r) {
    const uint64_t t = 1000 + 100 * r;
    spans.push_back(span(t, t + 10, 1, 2, "norm"));
    spans.push_back(span(t + 14, t + 34, 2, 2, "gemv"));
    spans.push_back(span(t + 28, t + 48, 3, 2, "gemv"));
  }
  // Graph 5: replayed once, so it is listed nowhere.
  spans.push_back(span(2000, 2010, 1, 5, "other"));
  const std::string r = timeline_report(spans, "decode");
  EXPECT_NE(r.find("decode: 14 kernels traced, 1 outside graphs"), std::string::npos) << r;
  // wall 48, busy 10 + 34 = 44, idle 4, kernel sum 50, overlap 6.
  EXPECT_NE(r.find("2               4        3       48.0       44.0        4.0       50.0        6.0"),
            std::string::npos)
      << r;
  EXPECT_EQ(r.find("other"), std::string::npos) << r;
  // gemv: 2 per replay, 20 us each, leads 4 (after the norm) and -6 (overlapping the first gemv): median -1; adds
  // 24 (4 idle + 20) and 14 to the wall time. The norm adds its 10 us: 48 in all. gemv comes first (adds most).
  auto row = [&](const std::string& name) {
    const size_t at = r.find("  " + name + " ");
    return at == std::string::npos ? std::string() : r.substr(at, r.find('\n', at) - at);
  };
  EXPECT_NE(row("gemv").find("    2.0      20.00      -1.00       38.0       40.0"), std::string::npos) << r;
  EXPECT_NE(row("norm").find("    1.0      10.00       0.00       10.0       10.0"), std::string::npos) << r;
  EXPECT_LT(r.find("  gemv "), r.find("  norm ")) << r;
}

}  // namespace
}  // namespace tandem
