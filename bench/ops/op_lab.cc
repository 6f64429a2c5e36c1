// Op lab for the CPU backend (llm.c style): measures the memory-bandwidth floor of this machine (large memcpy and
// read-only sum, 1 thread and all threads), then times linear at the Gemma 4 E2B decode shapes for 1..8 tokens and
// prints achieved GB/s of weights read and the ratio to the floor; also attention at decode. Each timed op is first
// checked against kernels/ref on a slice. --results appends every number to bench/RESULTS.md.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/strings.h"
#include "kernels/ref/ref.h"
#include "tensor/buffer.h"

namespace tandem {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best (minimum) seconds of `reps` runs of f after one warm-up: the machine is shared, and the minimum is the
// estimate least disturbed by other processes.
template <class F>
double time_best(int reps, F&& f) {
  f();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    f();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

std::string machine() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(in, line)) {
    if (starts_with(line, "model name")) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return strfmt("%s, %d cores", model.c_str(), omp_get_num_procs());
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::localtime(&t));
  return buf;
}

struct Report {
  std::string command, results_path;
  std::vector<std::string> lines;
  void add(const std::string& what) {
    std::printf("%s\n", what.c_str());
    std::fflush(stdout);
    lines.push_back(what);
  }
  void flush() const {
    if (results_path.empty()) return;
    std::ofstream out(results_path, std::ios::app);
    const std::string prefix = strfmt("%s | %s | `%s` | ", today().c_str(), machine().c_str(), command.c_str());
    for (const auto& l : lines) out << "- " << prefix << l << "\n";
    std::printf("appended %zu lines to %s\n", lines.size(), results_path.c_str());
  }
};

Buffer host_buffer(size_t bytes) {
  auto b = Buffer::host(bytes);
  TANDEM_CHECK_MSG(b.ok(), "%s", b.status().to_string().c_str());
  return std::move(b).value();
}

// Deterministic pseudo-random bf16 values in [-1, 1] (parallel: the LM head has 400M of them).
void fill_random_bf16(const Tensor& t, uint32_t seed) {
  auto* p = t.ptr<uint16_t>();
  const int64_t n = t.numel();
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9e3779b97f4a7c15ull;
    p[i] = f32_to_bf16(static_cast<float>(h >> 40) / static_cast<float>(1 << 23) - 1.f);
  }
}

// Sum of n floats split over nt threads: the read-bandwidth probe.
double parallel_sum(const cpu::SimdOps& simd, const float* f, int64_t n, int nt) {
  double s = 0;
#pragma omp parallel for num_threads(nt) reduction(+ : s) schedule(static)
  for (int c = 0; c < nt; ++c) {
    const int64_t b = n * c / nt, e = n * (c + 1) / nt;
    s += simd.sum(f + b, e - b);
  }
  return s;
}

// Read and copy bandwidth of a buffer far larger than the caches; returns the multi-thread read GB/s.
void bandwidth(Report& rep, const cpu::SimdOps& simd, int threads, size_t bytes) {
  Buffer src = host_buffer(bytes), dst = host_buffer(bytes);
  const auto* f = static_cast<const float*>(src.data());
  const int64_t n = static_cast<int64_t>(bytes / 4);
  std::memset(dst.data(), 1, bytes);
  volatile double sink = 0;
  for (int nt : {1, threads}) {
    const double t_read = time_best(10, [&] { sink = sink + parallel_sum(simd, f, n, nt); });
    const double t_copy = time_best(5, [&] {
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int c = 0; c < nt; ++c) {
        const size_t b = bytes * c / nt, e = bytes * (c + 1) / nt;
        std::memcpy(static_cast<char*>(dst.data()) + b, static_cast<const char*>(src.data()) + b, e - b);
      }
    });
    rep.add(strfmt("memory read (sum of %s, %d thread%s): %.1f GB/s", human_bytes(bytes).c_str(), nt,
                   nt > 1 ? "s" : "", bytes / t_read / 1e9));
    rep.add(strfmt("memcpy (%s, %d thread%s): %.1f GB/s copied (%.1f GB/s read+write)", human_bytes(bytes).c_str(),
                   nt, nt > 1 ? "s" : "", bytes / t_copy / 1e9, 2.0 * bytes / t_copy / 1e9));
    if (threads == 1) break;
  }
}

// Checks rows [0, 64) of a linear against the reference; aborts the lab on a mismatch.
void check_linear(cpu::CpuBackend& be, const Tensor& w, const Tensor& x) {
  const int64_t rows = std::min<int64_t>(64, w.shape[0]), n_tok = x.shape[0];
  Tensor ws = w.slice(0, rows);
  Buffer a = host_buffer(n_tok * rows * 4), b = host_buffer(n_tok * rows * 4);
  Tensor got = a.view(DType::kF32, {n_tok, rows}), want = b.view(DType::kF32, {n_tok, rows});
  be.linear({.out = got, .x = x, .w = ws});
  ref::linear({.out = want, .x = x, .w = ws});
  double md = 0, mr = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    md = std::max(md, static_cast<double>(std::fabs(got.ptr<float>()[i] - want.ptr<float>()[i])));
    mr = std::max(mr, static_cast<double>(std::fabs(want.ptr<float>()[i])));
  }
  TANDEM_CHECK_MSG(md <= 1e-5 * mr, "linear check failed: max diff %g, max ref %g", md, mr);
}

// Times a linear [T, n_in] x [n_out, n_in]^T (bf16 weights) for T in tokens. Cycles through enough copies of the
// weight to exceed the last-level cache, so every call streams its weights from memory as a decode step does.
// The floor is measured alongside, rep by rep: a plain read (sum) of another cold weight copy, the same bytes with
// the same threads, because this machine's memory bandwidth drifts with its neighbours' load.
void bench_linear(Report& rep, cpu::CpuBackend& be, const char* label, int64_t n_out, int64_t n_in, size_t llc_bytes,
                  int reps) {
  const size_t wbytes = static_cast<size_t>(n_out * n_in * 2);
  const int copies = static_cast<int>(std::max<size_t>(1, std::min<size_t>(16, 4 * llc_bytes / wbytes + 1)));
  std::vector<Buffer> wb;
  std::vector<Tensor> w;
  for (int c = 0; c < copies; ++c) {
    wb.push_back(host_buffer(wbytes));
    w.push_back(wb.back().view(DType::kBF16, {n_out, n_in}));
    fill_random_bf16(w.back(), static_cast<uint32_t>(c + 1));
  }
  constexpr int64_t kMaxTok = 64;
  Buffer xb = host_buffer(kMaxTok * n_in * 4), ob = host_buffer(kMaxTok * n_out * 4);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (int64_t i = 0; i < kMaxTok * n_in; ++i) static_cast<float*>(xb.data())[i] = d(rng);
  double t1 = 0;
  for (int64_t T : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}, kMaxTok}) {
    Tensor x = xb.view(DType::kF32, {T, n_in}), out = ob.view(DType::kF32, {T, n_out});
    check_linear(be, w[0], x);
    int next = 0;
    double t = 1e30, t_floor = 1e30;
    volatile double sink = 0;
    be.linear({.out = out, .x = x, .w = w[0]});
    for (int r = 0; r < reps; ++r) {
      const int64_t n_floats = static_cast<int64_t>(wbytes / 4);
      next = (next + 1) % copies;
      double t0 = now_s();
      sink = sink + parallel_sum(be.simd(), static_cast<const float*>(w[next].data), n_floats, be.threads());
      t_floor = std::min(t_floor, now_s() - t0);
      next = (next + 1) % copies;
      t0 = now_s();
      be.linear({.out = out, .x = x, .w = w[next]});
      t = std::min(t, now_s() - t0);
    }
    if (T == 1) t1 = t;
    rep.add(strfmt("linear %s [%lld, %lld] x [%lld, %lld]^T bf16 (%s, %d cold copies): %.3f ms, %.1f GB/s; read "
                   "floor of the same bytes %.3f ms (%.1f GB/s): %.2fx the floor, %.2fx the 1-token time, %.1f GFLOP/s",
                   label, static_cast<long long>(T), static_cast<long long>(n_in), static_cast<long long>(n_out),
                   static_cast<long long>(n_in), be.summary().c_str(), copies, t * 1e3, wbytes / t / 1e9,
                   t_floor * 1e3, wbytes / t_floor / 1e9, t / t_floor, t / t1, 2.0 * T * n_out * n_in / t / 1e9));
  }
}

void bench_attention(Report& rep, cpu::CpuBackend& be, int64_t ctx, int reps) {
  const int64_t n_heads = 8, n_kv = 1, hd = 256;
  Buffer kb = host_buffer(n_kv * ctx * hd * 4), vb = host_buffer(n_kv * ctx * hd * 4);
  Buffer qb = host_buffer(n_heads * hd * 4), ob = host_buffer(n_heads * hd * 4), pb = host_buffer(4);
  for (Buffer* b : {&kb, &vb, &qb})
    for (size_t i = 0; i < b->size() / 4; ++i) static_cast<float*>(b->data())[i] = static_cast<float>(i % 7) * 0.01f;
  KvView kv{.k = kb.view(DType::kF32, {n_kv, ctx, hd}), .v = vb.view(DType::kF32, {n_kv, ctx, hd}), .begin = 0,
            .end = ctx};
  *static_cast<int32_t*>(pb.data()) = static_cast<int32_t>(ctx - 1);
  AttentionArgs a{.out = ob.view(DType::kF32, {1, n_heads, hd}), .q = qb.view(DType::kF32, {1, n_heads, hd}),
                  .kv = kv, .q_pos = pb.view(DType::kI32, {1})};
  const double t = time_best(reps, [&] { be.attention(a); });
  const double bytes = 2.0 * n_kv * ctx * hd * 4;
  rep.add(strfmt("attention decode 8 q heads / 1 kv head, head_dim 256, context %lld, f32 KV (%s): %.3f ms, %.1f GB/s "
                 "of K/V",
                 static_cast<long long>(ctx), be.summary().c_str(), t * 1e3, bytes / t / 1e9));
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  CLI::App app{"tandem CPU op lab: memory-bandwidth floor and linear/attention throughput"};
  int threads = 0, reps = 15;
  int64_t vocab = 262144;
  std::string isa, results;
  bool quick = false;
  app.add_option("--threads", threads, "OpenMP threads (0 = all)");
  app.add_option("--isa", isa, "avx512, avx2 or scalar (default: best for this CPU)");
  app.add_option("--vocab", vocab, "LM-head rows (262144 = Gemma 4)");
  app.add_option("--reps", reps, "timed repetitions per measurement (the best is reported)");
  app.add_option("--results", results, "append the numbers to this file (bench/RESULTS.md)");
  app.add_flag("--quick", quick, "smaller buffers and fewer repetitions");
  CLI11_PARSE(app, argc, argv);

  std::string command = "tandem_op_lab";
  for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
  Report rep{.command = command, .results_path = results};
  auto be_or = make_cpu_backend_with({.threads = threads, .isa = isa});
  if (!be_or.ok()) {
    std::fprintf(stderr, "%s\n", be_or.status().to_string().c_str());
    return 1;
  }
  auto& be = static_cast<cpu::CpuBackend&>(**be_or);
  if (quick) reps = std::min(reps, 5);
  std::printf("machine: %s; backend: %s\n", machine().c_str(), be.summary().c_str());
  const size_t llc = 32u << 20;
  bandwidth(rep, be.simd(), be.threads(), quick ? (256u << 20) : (1024u << 20));
  bench_linear(rep, be, "q/gate/up-like", 6144, 1536, llc, reps);
  bench_linear(rep, be, "down-like", 1536, 6144, llc, reps);
  bench_linear(rep, be, "LM head", quick ? vocab / 8 : vocab, 1536, llc, std::max(3, reps / 3));
  for (int64_t ctx : {512, 4096}) bench_attention(rep, be, ctx, reps);
  rep.flush();
  return 0;
}
