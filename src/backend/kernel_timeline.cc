// Kernel timelines of CUDA graph replays (kernel_timeline.h).
#include "backend/kernel_timeline.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <unordered_map>

#include "core/strings.h"

namespace tandem {
namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<KernelSpan> by_start(std::span<const KernelSpan> spans) {
  std::vector<KernelSpan> v(spans.begin(), spans.end());
  std::stable_sort(v.begin(), v.end(),
                   [](const KernelSpan& a, const KernelSpan& b) { return a.start_ns < b.start_ns; });
  return v;
}

// The replays a report uses: all but the first when there are three or more.
std::span<const std::vector<KernelSpan>> steady(const std::vector<std::vector<KernelSpan>>& reps) {
  std::span<const std::vector<KernelSpan>> s(reps);
  return s.size() >= 3 ? s.subspan(1) : s;
}

}  // namespace

std::vector<std::vector<KernelSpan>> split_replays(std::span<const KernelSpan> spans_of_one_graph) {
  std::vector<std::vector<KernelSpan>> reps;
  std::unordered_map<uint64_t, size_t> seen;
  for (const KernelSpan& k : by_start(spans_of_one_graph)) {
    const size_t r = seen[k.node]++;
    if (r >= reps.size()) reps.resize(r + 1);
    reps[r].push_back(k);
  }
  while (!reps.empty() && reps.back().size() < reps.front().size()) reps.pop_back();
  return reps;
}

ReplayStats replay_stats(std::span<const KernelSpan> replay) {
  ReplayStats s;
  if (replay.empty()) return s;
  const std::vector<KernelSpan> v = by_start(replay);
  uint64_t end = 0, busy = 0, sum = 0, cur_start = v[0].start_ns, cur_end = v[0].start_ns;
  for (const KernelSpan& k : v) {
    sum += k.end_ns - k.start_ns;
    end = std::max(end, k.end_ns);
    if (k.start_ns > cur_end) {
      busy += cur_end - cur_start;
      cur_start = k.start_ns;
    }
    cur_end = std::max(cur_end, k.end_ns);
  }
  busy += cur_end - cur_start;
  s.wall_us = static_cast<double>(end - v[0].start_ns) / 1e3;
  s.busy_us = static_cast<double>(busy) / 1e3;
  s.kernel_sum_us = static_cast<double>(sum) / 1e3;
  s.kernels = static_cast<int>(v.size());
  return s;
}

std::string short_kernel_name(const std::string& name, size_t max_len) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> dem(abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && dem ? std::string(dem.get()) : name;
  if (starts_with(s, "void ")) s = s.substr(5);
  // Drop the parameter list (the first parenthesis outside <...>) and every namespace qualifier.
  int depth = 0;
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (s.compare(i, 23, "(anonymous namespace)::") == 0) {
      i += 22;
      continue;
    }
    if (c == '(' && depth == 0) break;
    out += c;
    if (c == ':' && out.size() >= 2 && out[out.size() - 2] == ':') {
      const size_t cut = out.find_last_of(" <,(", out.size() - 3);
      out.erase(cut == std::string::npos ? 0 : cut + 1);
    }
  }
  if (out.size() > max_len) out = out.substr(0, max_len - 3) + "...";
  return out;
}

std::string timeline_report(std::span<const KernelSpan> spans, const std::string& title) {
  std::map<uint32_t, std::vector<KernelSpan>> graphs;
  size_t outside = 0;
  for (const KernelSpan& k : spans) {
    if (k.graph == 0) {
      ++outside;
    } else {
      graphs[k.graph].push_back(k);
    }
  }
  std::string r = strfmt("%s: %zu kernels traced, %zu outside graphs\n", title.c_str(), spans.size(), outside);
  r += strfmt("  %-8s %8s %8s %10s %10s %10s %10s %10s\n", "graph", "replays", "kernels", "wall us", "busy us",
              "idle us", "sum us", "overlap us");
  struct Pick {
    size_t replays = 0;
    double wall = 0;
    std::vector<std::vector<KernelSpan>> reps;
  } best;
  for (const auto& [id, ks] : graphs) {
    std::vector<std::vector<KernelSpan>> reps = split_replays(ks);
    if (reps.size() < 2) continue;
    std::vector<double> wall, busy, sum;
    for (const auto& rp : steady(reps)) {
      const ReplayStats st = replay_stats(rp);
      wall.push_back(st.wall_us);
      busy.push_back(st.busy_us);
      sum.push_back(st.kernel_sum_us);
    }
    const double w = median_of(wall), b = median_of(busy), s = median_of(sum);
    r += strfmt("  %-8u %8zu %8zu %10.1f %10.1f %10.1f %10.1f %10.1f\n", id, reps.size(), reps[0].size(), w, b, w - b,
                s, s - b);
    if (reps.size() > best.replays || (reps.size() == best.replays && w < best.wall)) best = {reps.size(), w, reps};
  }
  if (best.replays == 0) return r + "  (no graph replayed twice)\n";

  struct PerName {
    std::vector<double> dur, lead;
    double total = 0, adds = 0;
  };
  std::map<std::string, PerName> names;
  const auto use = steady(best.reps);
  for (const auto& rp : use) {  // each in start order (split_replays)
    uint64_t latest_end = rp.front().start_ns;
    for (const KernelSpan& k : rp) {
      PerName& p = names[short_kernel_name(k.name)];
      p.dur.push_back(static_cast<double>(k.end_ns - k.start_ns) / 1e3);
      p.lead.push_back((static_cast<double>(k.start_ns) - static_cast<double>(latest_end)) / 1e3);
      p.total += static_cast<double>(k.end_ns - k.start_ns) / 1e3;
      if (k.end_ns > latest_end) p.adds += static_cast<double>(k.end_ns - latest_end) / 1e3;
      latest_end = std::max(latest_end, k.end_ns);
    }
  }
  std::vector<std::pair<std::string, PerName>> rows(names.begin(), names.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.adds > b.second.adds; });
  const double n = static_cast<double>(use.size());
  r += strfmt("  kernels of the graph with the most replays (wall %.1f us), per replay, by the time they add to it:\n",
              best.wall);
  r += strfmt("  %-64s %7s %10s %10s %10s %10s\n", "kernel", "count", "median us", "lead us", "adds us", "total us");
  for (const auto& [name, p] : rows) {
    r += strfmt("  %-64s %7.1f %10.2f %10.2f %10.1f %10.1f\n", name.c_str(), static_cast<double>(p.dur.size()) / n,
                median_of(p.dur), median_of(p.lead), p.adds / n, p.total / n);
  }
  return r;
}

}  // namespace tandem
