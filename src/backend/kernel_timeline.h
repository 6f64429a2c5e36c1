// Kernel timelines of CUDA graph replays (`tandem bench --trace`): the device start and end of every kernel a graph
// replay ran, as a tracer recorded them (cuda/kernel_trace.h), summed up per replay and per kernel. A replay's wall
// time is its first kernel start to its last kernel end; busy time is the union of its kernels' intervals, so wall -
// busy is the time no kernel of the replay ran (launch and dependency latency between kernels), and the kernel sum
// minus busy is the time kernels overlapped (programmatic dependent launch, concurrent branches). Host code only,
// independent of CUDA, so the arithmetic is tested without a GPU.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem {

struct KernelSpan {
  uint64_t start_ns = 0, end_ns = 0;
  uint64_t node = 0;   // graph node id (the same node in every replay of a graph)
  uint32_t graph = 0;  // graph id; 0 for a kernel launched outside a graph
  std::string name;    // as the tracer gives it (mangled or not)
};

struct ReplayStats {
  double wall_us = 0, busy_us = 0, kernel_sum_us = 0;
  int kernels = 0;
};

// The replays of one graph's spans, each in start order: the k-th time a node appears (in start order) belongs to
// replay k. Replays that lack some node of the first replay (cut off by the end of tracing) are dropped.
std::vector<std::vector<KernelSpan>> split_replays(std::span<const KernelSpan> spans_of_one_graph);
ReplayStats replay_stats(std::span<const KernelSpan> replay);

// A readable kernel name: demangled, without namespaces, parameters or template arguments past `max_len` characters.
std::string short_kernel_name(const std::string& name, size_t max_len = 64);

// A report of every graph in `spans` with at least two replays: kernels per replay, median wall / busy / idle /
// kernel sum / overlap; then, for the graph of the most replays (ties: the shortest), per kernel name: launches per
// replay, median duration, median lead (its start minus the latest end of the replay's kernels that started before
// it: positive is idle time before it, negative is overlap), the time it adds to the replay (its end minus that
// latest end, where later: the critical-path share, which sums to the wall time over all kernels) and its total
// duration, by time added. Under programmatic dependent launch a kernel starts before the one it waits for ends, so
// its duration includes that wait and the time added is the better measure. The first replay of a graph with three
// or more is left out (it uploads the graph). `title` heads the report.
std::string timeline_report(std::span<const KernelSpan> spans, const std::string& title);

}  // namespace tandem
