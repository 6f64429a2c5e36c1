// CUDA op lab (design.md §2, llm.c style): measures the device-to-device copy bandwidth as the floor, then times
// linear() at Gemma 4 31B's MLP shape [T, 5376] x [21504, 5376]^T bf16 (decode GEMV and verify/prefill sizes) and
// rms_norm, its fused epilogues at decode size, then attention (31B and E2B full/sliding decode and verify, long and
// short contexts), MoE (26B-A4B routing + experts) and sampling (argmax, sample, reject_drafts), printing achieved
// GB/s (TFLOP/s for the large GEMM) and the ratio to the floor measured in this run.
// Usage: cuda_bench [--quick | --attention | --moe | --prefill-attention] (a section: the copy floor and that
// section's shapes only; --prefill-attention: prompt chunks on the two tensor-core attention kernels). Exits 0 with a
// message when there is no GPU, 1 on any device error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/kernels.h"

namespace tandem {
namespace {

using cuda::CudaBackend;

// Mean milliseconds per call of fn over `iters` calls after `warmup`, timed with CUDA events on the current stream.
// The calls are captured into one CUDA graph and replayed, so the figure is device time as a decode graph sees it,
// without the host's per-launch cost (which dominates small ops run eagerly); eager calls if capture fails.
// (graph = false: eager calls, for the copy floor: a copy node in a graph runs slower than cudaMemcpyAsync.)
double time_ms(CudaBackend& be, int warmup, int iters, const std::function<void()>& fn, bool graph_ok = true) {
  for (int i = 0; i < warmup; ++i) fn();
  cudaStream_t s = be.cuda_stream(be.current_stream());
  Result<Backend::GraphId> graph = !graph_ok ? Result<Backend::GraphId>(unsupported("eager")) : be.capture([&] {
    for (int i = 0; i < iters; ++i) fn();
    return ok_status();
  });
  const bool replay = graph.ok() && be.replay(*graph).ok();  // the first replay uploads the graph
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, s);
  if (replay) {
    (void)be.replay(*graph);
  } else {
    for (int i = 0; i < iters; ++i) fn();
  }
  cudaEventRecord(b, s);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (graph.ok()) be.release_graph(*graph);
  return ms / iters;
}

// Uploads pseudo-random bf16 values in [-1, 1) (a fast LCG; the values only need to be non-trivial).
bool fill_bf16(CudaBackend& be, const Buffer& dst, size_t n) {
  std::vector<uint16_t> h(n);
  uint32_t s = 12345;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    h[i] = f32_to_bf16(static_cast<float>(s >> 8) / static_cast<float>(1u << 23) - 1.f);
  }
  return be.copy(dst.data(), h.data(), n * 2, CopyKind::kHostToDevice).ok() && be.synchronize().ok();
}

// One printed row: `bytes` is what the op must read/write at least; the floor ratio compares against the copy.
void report(const char* label, double ms, double bytes, double copy_gbs) {
  std::printf("%-44s %10.3f %10.0f %10s %12.2f\n", label, ms, bytes / (ms * 1e6), "-", ms / (bytes / (copy_gbs * 1e6)));
}

// attention() at Gemma 4 31B's shapes: the full layer (32 query heads on 4 KV heads, head_dim 512) over a long
// context for decode (1 query, split-K) and verify (4 and 9 queries: 3 and 8 drafts), and the sliding layer (16 KV
// heads, head_dim 256, window 1024 over a ring) for decode and a 9-query verify; then short contexts (300 keys) at
// 31B's and E2B's shapes (E2B: 8 query heads on 1 KV head), where launch and merge latency rule, two of them with
// the end on the device so the launch is sized for the capacity as in a decode graph. The bytes are the K/V rows
// the queries see, read once (the floor: those bytes over the measured copy bandwidth).
bool bench_attention(CudaBackend& be, int iters, double copy_gbs) {
  struct Shape {
    const char* label;
    int64_t n_tok, n_heads, n_kv, head_dim, context, capacity, window;
    bool ring, device_end = false;  // device_end: kv_end on the device, launch sized by the capacity (as in graphs)
  };
  const Shape shapes[] = {
      {"attention full decode ctx 32768 (31B)", 1, 32, 4, 512, 32768, 32768, 0, false},
      {"attention full verify 4 tok ctx 32768 (31B)", 4, 32, 4, 512, 32768, 32768, 0, false},
      {"attention full verify 9 tok ctx 32768 (31B)", 9, 32, 4, 512, 32768, 32768, 0, false},
      {"attention full decode ctx 4096 (31B)", 1, 32, 4, 512, 4096, 4096, 0, false},
      {"attention sliding decode W 1024 (31B)", 1, 32, 16, 256, 32768, 1024 + 1 + 256, 1024, true},
      {"attention sliding verify 9 tok W 1024 (31B)", 9, 32, 16, 256, 32768, 1024 + 1 + 256, 1024, true},
      {"attention sliding decode ctx 300 (31B)", 1, 32, 16, 256, 300, 4096, 1024, false},
      {"attention full decode ctx 300 (31B)", 1, 32, 4, 512, 300, 4096, 0, false},
      {"attention sliding decode ctx 300 (E2B)", 1, 8, 1, 256, 300, 4096, 512, false},
      {"attention full decode ctx 300 (E2B)", 1, 8, 1, 512, 300, 4096, 0, false},
      {"attention full decode ctx 4096 (E2B)", 1, 8, 1, 512, 4096, 4096, 0, false},
      {"attention sliding verify 5 tok ctx 300 (E2B)", 5, 8, 1, 256, 300, 4096, 512, false},
      {"attention sliding decode ctx 300 cap 4096 (E2B)", 1, 8, 1, 256, 300, 4096, 512, false, true},
      {"attention full decode ctx 300 cap 4096 (31B)", 1, 32, 4, 512, 300, 4096, 0, false, true},
  };
  for (const Shape& sh : shapes) {
    const size_t kv_elems = static_cast<size_t>(sh.n_kv * sh.capacity * sh.head_dim);
    const size_t q_elems = static_cast<size_t>(sh.n_tok * sh.n_heads * sh.head_dim);
    Buffer k = be.alloc(kv_elems * 2).value(), v = be.alloc(kv_elems * 2).value();
    Buffer q = be.alloc(q_elems * 2).value(), out = be.alloc(q_elems * 2).value();
    Buffer pos = be.alloc(static_cast<size_t>(sh.n_tok) * sizeof(int32_t)).value();
    Buffer end = be.alloc(sizeof(int32_t)).value();
    const int32_t hend = static_cast<int32_t>(sh.context);
    if (!be.copy(end.data(), &hend, sizeof hend, CopyKind::kHostToDevice).ok()) return false;
    if (!fill_bf16(be, k, kv_elems) || !fill_bf16(be, v, kv_elems) || !fill_bf16(be, q, q_elems)) return false;
    std::vector<int32_t> hpos(static_cast<size_t>(sh.n_tok));
    for (int64_t t = 0; t < sh.n_tok; ++t) hpos[static_cast<size_t>(t)] = static_cast<int32_t>(sh.context - sh.n_tok + t);
    if (!be.copy(pos.data(), hpos.data(), hpos.size() * sizeof(int32_t), CopyKind::kHostToDevice).ok()) return false;
    const KvView kv{.k = k.view(DType::kBF16, {sh.n_kv, sh.capacity, sh.head_dim}),
                    .v = v.view(DType::kBF16, {sh.n_kv, sh.capacity, sh.head_dim}),
                    .begin = sh.ring ? sh.context - sh.capacity : 0, .end = sh.context, .ring = sh.ring};
    const AttentionArgs args{.out = out.view(DType::kBF16, {sh.n_tok, sh.n_heads, sh.head_dim}),
                             .q = q.view(DType::kBF16, {sh.n_tok, sh.n_heads, sh.head_dim}),
                             .kv = kv,
                             .q_pos = pos.view(DType::kI32, {sh.n_tok}),
                             .kv_end = sh.device_end ? end.view(DType::kI32, {1}) : Tensor{},
                             .window = sh.window};
    const double ms = time_ms(be, 3, iters, [&] { be.attention(args); });
    // Keys any query sees: the window slides by one per query (window + n_tok - 1 in all), else the context.
    const int64_t keys = sh.window > 0 ? std::min(sh.window + sh.n_tok - 1, sh.context) : sh.context;
    report(sh.label, ms, 2.0 * 2.0 * static_cast<double>(sh.n_kv * keys * sh.head_dim), copy_gbs);
  }
  return be.synchronize().ok();
}

// attention() on prompt chunks of 64..1024 tokens ending at position 4096 (a long prompt's later chunks), at the
// sliding layers' shapes of E2B (8 query heads on 1 KV head, window 512), E4B (8 on 2), 26B-A4B (16 on 8, window
// 1024) and 31B (32 on 16), E2B's shape without a window and 31B's full layer (32 on 4, head dim 512), each on the
// decode kernel's tensor-core path (attention_decode.cu; the prefill kernel off) and on the flash-attention kernel
// (attention_prefill.cu, forced on, head dim 512 included) in its mma.sync form and, up to head dim 256, its wgmma
// forms (one and two warpgroups per block, two with four K/V stages), with the flash launch's block count: the
// figures behind PrefillAttention::kAuto's thresholds and the wgmma default. TFLOP/s counts the two products of every
// visible (query, key) pair.
bool bench_prefill_attention(CudaBackend& be, int iters) {
  struct Shape {
    const char* label;
    int64_t n_heads, n_kv, head_dim, window;
  };
  const Shape shapes[] = {{"E2B sliding", 8, 1, 256, 512},   {"E4B sliding", 8, 2, 256, 512},
                          {"26B sliding", 16, 8, 256, 1024}, {"31B sliding", 32, 16, 256, 1024},
                          {"E2B full", 8, 1, 256, 0},        {"31B full", 32, 4, 512, 0}};
  constexpr int64_t kCtx = 4096, kMaxTok = 1024;
  const cuda::PrefillAttention mode = cuda::prefill_attention();
  const bool wide = cuda::prefill_attention_512();
  const int wg = cuda::prefill_attention_wgmma();
  cuda::set_prefill_attention_512(true);  // the flash kernel's head dim 512 too (in case TANDEM_ATTN_PREFILL_512=0)
  std::printf("\n%-60s %7s %8s %9s %9s %9s %9s %9s %9s %9s %9s\n", "prompt-chunk attention (TFLOP/s)", "blocks",
              "tc ms", "flash ms", "flash/tc", "wg1 ms", "wg1/tc", "wg2 ms", "wg2/tc", "wg3 ms", "wg3/tc");
  for (const Shape& sh : shapes) {
    const size_t kv_elems = static_cast<size_t>(sh.n_kv * kCtx * sh.head_dim);
    const size_t q_elems = static_cast<size_t>(kMaxTok * sh.n_heads * sh.head_dim);
    Buffer k = be.alloc(kv_elems * 2).value(), v = be.alloc(kv_elems * 2).value();
    Buffer q = be.alloc(q_elems * 2).value(), out = be.alloc(q_elems * 2).value();
    Buffer pos = be.alloc(static_cast<size_t>(kMaxTok) * sizeof(int32_t)).value();
    if (!fill_bf16(be, k, kv_elems) || !fill_bf16(be, v, kv_elems) || !fill_bf16(be, q, q_elems)) return false;
    for (int64_t n_tok : {64, 128, 256, 512, 1024}) {
      std::vector<int32_t> hpos(static_cast<size_t>(n_tok));
      double pairs = 0;
      for (int64_t t = 0; t < n_tok; ++t) {
        const int64_t p = kCtx - n_tok + t;
        hpos[static_cast<size_t>(t)] = static_cast<int32_t>(p);
        pairs += static_cast<double>(sh.window > 0 ? std::min(sh.window, p + 1) : p + 1);
      }
      if (!be.copy(pos.data(), hpos.data(), hpos.size() * sizeof(int32_t), CopyKind::kHostToDevice).ok()) return false;
      const AttentionArgs args{.out = out.view(DType::kBF16, {n_tok, sh.n_heads, sh.head_dim}),
                               .q = q.view(DType::kBF16, {n_tok, sh.n_heads, sh.head_dim}),
                               .kv = {.k = k.view(DType::kBF16, {sh.n_kv, kCtx, sh.head_dim}),
                                      .v = v.view(DType::kBF16, {sh.n_kv, kCtx, sh.head_dim}),
                                      .begin = 0,
                                      .end = kCtx},
                               .q_pos = pos.view(DType::kI32, {n_tok}),
                               .window = sh.window};
      // Decode kernel, flash (mma.sync), flash (wgmma: 1 and 2 warpgroups, 2 with 4 stages).
      double ms[5] = {0, 0, 0, 0, 0};
      const int variants = sh.head_dim <= 256 ? 5 : 2;
      for (int i = 0; i < variants; ++i) {
        cuda::set_prefill_attention(i > 0 ? cuda::PrefillAttention::kAlways : cuda::PrefillAttention::kOff);
        cuda::set_prefill_attention_wgmma(i >= 2 ? i - 1 : 0);
        ms[i] = time_ms(be, 2, iters, [&] { be.attention(args); });
      }
      const int64_t blocks = (n_tok * (sh.n_heads / sh.n_kv) + 63) / 64 * sh.n_kv;  // 64-row blocks
      const double flops = 4.0 * pairs * static_cast<double>(sh.n_heads * sh.head_dim);
      std::string tflops = std::to_string(static_cast<int>(flops / (ms[1] * 1e9)));
      for (int i = 2; i < variants; ++i) tflops += " / " + std::to_string(static_cast<int>(flops / (ms[i] * 1e9)));
      char label[128], wg_cols[80] = "        -         -         -         -         -         -";
      std::snprintf(label, sizeof label, "%s, %lld tokens (%s)", sh.label, static_cast<long long>(n_tok),
                    tflops.c_str());
      if (variants > 2)
        std::snprintf(wg_cols, sizeof wg_cols, "%9.3f %9.2f %9.3f %9.2f %9.3f %9.2f", ms[2], ms[2] / ms[0], ms[3],
                      ms[3] / ms[0], ms[4], ms[4] / ms[0]);
      std::printf("%-60s %7lld %8.3f %9.3f %9.2f %s\n", label, static_cast<long long>(blocks), ms[0], ms[1],
                  ms[1] / ms[0], wg_cols);
    }
  }
  cuda::set_prefill_attention(mode);
  cuda::set_prefill_attention_512(wide);
  cuda::set_prefill_attention_wgmma(wg);
  return be.synchronize().ok();
}

// moe_route + moe_experts at Gemma 4 26B-A4B's shapes (128 experts, top-8, d_model 2816, expert d_ff 704) for 1
// (decode), 4 and 9 tokens (verify), 128 and 1024 (prefill chunks, on the tensor cores: narrow tiles, then wide
// ones, kernels.h set_moe_tc_wide). The bytes are the selected experts' weights, each distinct expert once. Prefill
// chunks are timed eagerly, as the model runs them: inside a graph capture the experts get only the stream's
// workspace, so a 1024-token chunk would run in pieces that each re-read the weights (run BL's rows).
bool bench_moe(CudaBackend& be, int iters, double copy_gbs) {
  const int64_t n_exp = 128, k = 8, d_model = 2816, d_ff = 704, max_tok = 1024;
  const size_t gu_elems = static_cast<size_t>(n_exp * 2 * d_ff * d_model), dn_elems = static_cast<size_t>(n_exp * d_model * d_ff);
  Buffer gu = be.alloc(gu_elems * 2).value(), dn = be.alloc(dn_elems * 2).value();
  Buffer x = be.alloc(static_cast<size_t>(max_tok * d_model) * 2).value(), out = be.alloc(static_cast<size_t>(max_tok * d_model) * 2).value();
  Buffer logits = be.alloc(static_cast<size_t>(max_tok * n_exp) * 2).value(), pes = be.alloc(static_cast<size_t>(n_exp) * 2).value();
  Buffer idx = be.alloc(static_cast<size_t>(max_tok * k) * 4).value(), w = be.alloc(static_cast<size_t>(max_tok * k) * 4).value();
  if (!fill_bf16(be, gu, gu_elems) || !fill_bf16(be, dn, dn_elems) || !fill_bf16(be, x, static_cast<size_t>(max_tok * d_model)) ||
      !fill_bf16(be, logits, static_cast<size_t>(max_tok * n_exp)) || !fill_bf16(be, pes, static_cast<size_t>(n_exp)))
    return false;
  for (int64_t n_tok : {int64_t{1}, int64_t{4}, int64_t{9}, int64_t{128}, max_tok}) {
    const MoeRouteArgs route{.idx = idx.view(DType::kI32, {n_tok, k}), .weights = w.view(DType::kF32, {n_tok, k}),
                             .logits = logits.view(DType::kBF16, {n_tok, n_exp}),
                             .per_expert_scale = pes.view(DType::kBF16, {n_exp}), .k = static_cast<int>(k)};
    const MoeExpertsArgs experts{.out = out.view(DType::kBF16, {n_tok, d_model}), .x = x.view(DType::kBF16, {n_tok, d_model}),
                                 .gate_up = gu.view(DType::kBF16, {n_exp, 2 * d_ff, d_model}),
                                 .down = dn.view(DType::kBF16, {n_exp, d_model, d_ff}), .idx = route.idx, .weights = route.weights};
    be.moe_route(route);
    std::vector<int32_t> hidx(static_cast<size_t>(n_tok * k));
    if (!be.copy(hidx.data(), idx.data(), hidx.size() * 4, CopyKind::kDeviceToHost).ok() || !be.synchronize().ok()) return false;
    std::sort(hidx.begin(), hidx.end());
    const auto distinct = static_cast<double>(std::unique(hidx.begin(), hidx.end()) - hidx.begin());
    const cuda::MoeTcWide mode = cuda::moe_tc_wide();
    for (const bool wide : {false, true}) {
      if (wide && n_tok < 128) break;  // a second row, wide tiles, for the prefill-sized chunks only (128, 1024)
      cuda::set_moe_tc_wide(wide ? cuda::MoeTcWide::kAlways : cuda::MoeTcWide::kOff);
      const double ms = time_ms(
          be, 3, iters,
          [&] {
            be.moe_route(route);
            be.moe_experts(experts);
          },
          /*graph_ok=*/n_tok < 128);
      char label[96];
      std::snprintf(label, sizeof label, "moe route+experts %lld tok (26B, %.0f experts%s)",
                    static_cast<long long>(n_tok), distinct, wide ? ", wide" : "");
      report(label, ms, distinct * 3.0 * static_cast<double>(d_ff * d_model) * 2.0, copy_gbs);
    }
    cuda::set_moe_tc_wide(mode);
  }
  return be.synchronize().ok();
}

// The sampling ops over Gemma 4's vocabulary (262144) of bf16 logits, for 1 row (a plain decode step) and 9 rows
// (a K = 8 verify pass): argmax (greedy, one read of the row: the reference cost), sample with temperature only,
// with top-k + top-p, and with the processed distributions written out (sampled drafts); then reject_drafts over 8
// rows of f32 distributions. The floor ratio is against one read of the logits at the copy bandwidth.
bool bench_sampling(CudaBackend& be, int iters, double copy_gbs) {
  const int64_t V = 262144, max_rows = 9;
  Buffer logits = be.alloc(static_cast<size_t>(max_rows * V) * 2).value();
  Buffer probs = be.alloc(static_cast<size_t>(max_rows * V) * 4).value(),
         q = be.alloc(static_cast<size_t>(max_rows * V) * 4).value();
  Buffer ids = be.alloc(max_rows * 4).value(), verdicts = be.alloc(2 * max_rows * 4).value();
  if (!fill_bf16(be, logits, static_cast<size_t>(max_rows * V))) return false;
  for (int64_t rows : {int64_t{1}, max_rows}) {
    const Tensor x = logits.view(DType::kBF16, {rows, V}), out = ids.view(DType::kI32, {rows});
    const double bytes = 2.0 * static_cast<double>(rows * V);
    char label[96];
    std::snprintf(label, sizeof label, "argmax %lld x 262144 bf16", static_cast<long long>(rows));
    report(label, time_ms(be, 3, iters, [&] { be.argmax({.out = out, .x = x}); }), bytes, copy_gbs);
    const SampleArgs plain{.out = out, .x = x, .temperature = 1.f, .seed = 1};
    std::snprintf(label, sizeof label, "sample %lld x 262144 bf16, T only", static_cast<long long>(rows));
    report(label, time_ms(be, 3, iters, [&] { be.sample(plain); }), bytes, copy_gbs);
    SampleArgs cut = plain;
    cut.temperature = 0.7f, cut.top_k = 64, cut.top_p = 0.95f;
    std::snprintf(label, sizeof label, "sample %lld x 262144 bf16, top-k 64 top-p .95", static_cast<long long>(rows));
    report(label, time_ms(be, 3, iters, [&] { be.sample(cut); }), bytes, copy_gbs);
    SampleArgs nucleus = plain;
    nucleus.top_p = 0.9f, nucleus.probs = probs.view(DType::kF32, {rows, V});
    std::snprintf(label, sizeof label, "sample %lld x 262144 bf16, top-p .9 + probs", static_cast<long long>(rows));
    report(label, time_ms(be, 3, iters, [&] { be.sample(nucleus); }), bytes, copy_gbs);
  }
  // reject_drafts over 8 rows: p and q from two samplings of different rows, the drafts drawn from q.
  const int64_t k = max_rows - 1;
  be.sample({.out = ids.view(DType::kI32, {k}),
             .x = logits.view(DType::kBF16, {k, V}),
             .probs = q.view(DType::kF32, {k, V}),
             .temperature = 1.f,
             .seed = 2});
  be.sample({.out = verdicts.view(DType::kI32, {k}),
             .x = logits.view(DType::kBF16, {k, V}, 2 * static_cast<size_t>(V)),
             .probs = probs.view(DType::kF32, {k, V}),
             .temperature = 1.f,
             .seed = 3});
  const RejectDraftsArgs rej{.accepted = verdicts.view(DType::kI32, {k}),
                             .token = verdicts.view(DType::kI32, {k}, static_cast<size_t>(k) * 4),
                             .p = probs.view(DType::kF32, {k, V}),
                             .q = q.view(DType::kF32, {k, V}),
                             .draft = ids.view(DType::kI32, {k}),
                             .seed = 4};
  report("reject_drafts 8 x 262144 f32", time_ms(be, 3, iters, [&] { be.reject_drafts(rej); }),
         2.0 * 4.0 * static_cast<double>(k * V), copy_gbs);
  return be.synchronize().ok();
}

// rms_norm's fused epilogues (ops.h) at decode size against the separate ops they replace (launch-bound: the
// microseconds per layer that fusion saves): 31B's post-FFN norm + residual + layer_scalar on one token [1, 5376],
// and q_norm + RoPE of its full layer [1, 32, 512]. Prints fused vs unfused time per call.
bool bench_fused_norm(CudaBackend& be, int iters) {
  const int64_t d = 5376, nh = 32, hd = 512;
  Buffer x = be.alloc(d * 2).value(), f = be.alloc(d * 2).value(), y = be.alloc(d * 2).value();
  Buffer w = be.alloc(d * 2).value(), q = be.alloc(nh * hd * 2).value(), pos = be.alloc(4).value();
  Buffer inv = be.alloc(hd / 2 * 4).value();
  if (!fill_bf16(be, x, d) || !fill_bf16(be, f, d) || !fill_bf16(be, w, d) || !fill_bf16(be, q, nh * hd)) return false;
  std::vector<float> freq(hd / 2, 0.f);
  for (int j = 0; j < 64; ++j) freq[static_cast<size_t>(j)] = std::pow(1e6f, -2.f * static_cast<float>(j) / hd);
  const int32_t p = 1000;
  if (!be.copy(inv.data(), freq.data(), freq.size() * 4, CopyKind::kHostToDevice).ok() ||
      !be.copy(pos.data(), &p, 4, CopyKind::kHostToDevice).ok() || !be.synchronize().ok())
    return false;
  const Tensor xt = x.view(DType::kBF16, {1, d}), ft = f.view(DType::kBF16, {1, d}), yt = y.view(DType::kBF16, {1, d});
  const Tensor wt = w.view(DType::kBF16, {d}), qt = q.view(DType::kBF16, {1, nh, hd}), wq = w.view(DType::kBF16, {hd});
  const Tensor pt = pos.view(DType::kI32, {1}), it = inv.view(DType::kF32, {hd / 2});
  const double res_sep = time_ms(be, 10, iters, [&] {
    be.rms_norm({.out = yt, .x = ft, .weight = wt});
    be.add({.out = xt, .a = xt, .b = yt});
    be.scale({.x = xt, .s = 0.5f});
  });
  const double res_fused = time_ms(be, 10, iters, [&] {
    be.rms_norm({.out = xt, .x = ft, .weight = wt, .residual = xt, .out_scale = 0.5f});
  });
  const double rope_sep = time_ms(be, 10, iters, [&] {
    be.rms_norm({.out = qt, .x = qt, .weight = wq});
    be.rope({.x = qt, .pos = pt, .inv_freq = it});
  });
  const double rope_fused = time_ms(
      be, 10, iters, [&] { be.rms_norm({.out = qt, .x = qt, .weight = wq, .rope_pos = pt, .rope_inv_freq = it}); });
  std::printf("%-44s %10.4f ms fused, %10.4f ms as rms_norm+add+scale\n", "norm+residual+scale [1,5376] bf16",
              res_fused, res_sep);
  std::printf("%-44s %10.4f ms fused, %10.4f ms as rms_norm+rope\n", "q_norm+rope [1,32,512] bf16", rope_fused,
              rope_sep);
  return be.synchronize().ok();
}

enum class Section : uint8_t { kAll, kAttention, kMoe, kPrefillAttention };

int run(bool quick, Section section) {
  auto made = CudaBackend::create(0);
  if (!made.ok()) {
    const bool has_gpu = cuda::device_count() > 0;  // a GPU the backend cannot use is a failure, not a skip
    std::printf("cuda_bench: %s: %s\n", has_gpu ? "FAILED" : "skipped", made.status().to_string().c_str());
    return has_gpu ? 1 : 0;
  }
  CudaBackend& be = **made;
  const cudaDeviceProp& p = be.properties();
  std::printf("cuda_bench on %s (sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB)\n", p.name, p.major, p.minor,
              p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1 << 30),
              static_cast<double>(p.l2CacheSize) / (1 << 20));
  const int iters = quick ? 5 : 20;
  std::printf("times: device ms per call, replayed from a CUDA graph of %d calls (no host launch cost; operands that "
              "fit in L2 stay there between calls)\n",
              iters);

  // Floor: D2D copy of 1 GiB, counting bytes read + bytes written.
  const size_t copy_bytes = size_t{1} << 30;
  Buffer c1 = be.alloc(copy_bytes).value(), c2 = be.alloc(copy_bytes).value();
  if (!be.memset_zero(c1.data(), copy_bytes).ok()) return 1;
  const double copy_ms = time_ms(
      be, 2, iters, [&] { (void)be.copy(c2.data(), c1.data(), copy_bytes, CopyKind::kDeviceToDevice); },
      /*graph_ok=*/false);
  const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) / (copy_ms * 1e6);
  c1.reset();
  c2.reset();

  std::printf("\n%-44s %10s %10s %10s %12s\n", "op", "ms", "GB/s", "TFLOP/s", "floor ratio");
  std::printf("%-44s %10.3f %10.0f %10s %12s\n", "copy D2D 1 GiB (read + write)", copy_ms, copy_gbs, "-", "1.00");
  if (section == Section::kAttention) return bench_attention(be, iters, copy_gbs) && be.synchronize().ok() ? 0 : 1;
  if (section == Section::kMoe) return bench_moe(be, iters, copy_gbs) && be.synchronize().ok() ? 0 : 1;
  if (section == Section::kPrefillAttention) return bench_prefill_attention(be, iters) ? 0 : 1;

  // 31B's gate/up [21504, 5376] and down [5376, 21504] (both 231 MB, far over the 60 MB L2): the GEMV kernel and
  // cuBLASLt at every decode/verify size, cuBLASLt alone beyond.
  const int64_t max_tok = 512, max_w = int64_t{21504} * 5376;
  Buffer w = be.alloc(static_cast<size_t>(max_w) * 2).value();
  if (!fill_bf16(be, w, static_cast<size_t>(max_w))) return 1;
  Buffer x = be.alloc(static_cast<size_t>(max_tok * 21504) * 2).value();
  Buffer out = be.alloc(static_cast<size_t>(max_tok * 21504) * 2).value();
  if (!fill_bf16(be, x, static_cast<size_t>(max_tok * 21504))) return 1;
  for (const auto& [n_out, n_in] : {std::pair<int64_t, int64_t>{21504, 5376}, {5376, 21504}}) {
    for (int64_t n_tok : {1, 2, 4, 5, 8, 9, 16, 512}) {
      for (bool gemv : {true, false}) {
        if (!gemv && n_tok > 9) continue;
        be.set_gemv_mode(gemv ? cuda::GemvMode::kOn : cuda::GemvMode::kOff);
        const LinearArgs args{.out = out.view(DType::kBF16, {n_tok, n_out}), .x = x.view(DType::kBF16, {n_tok, n_in}),
                              .w = w.view(DType::kBF16, {n_out, n_in})};
        const auto path = be.linear_path(args);
        const double ms = time_ms(be, 3, iters, [&] { be.linear(args); });
        const double bytes = 2.0 * static_cast<double>(n_out * n_in + n_tok * n_in + n_tok * n_out);
        const double gbs = bytes / (ms * 1e6), tflops = 2.0 * n_tok * n_out * n_in / (ms * 1e9);
        char label[96];
        std::snprintf(label, sizeof label, "linear [%lld,%lld]x[%lld,%lld]^T %s", static_cast<long long>(n_tok),
                      static_cast<long long>(n_in), static_cast<long long>(n_out), static_cast<long long>(n_in),
                      path.ok() ? cuda::linear_path_name(*path) : "?");
        // Floor ratio: measured time over the time the copy bandwidth needs to move the same bytes once.
        std::printf("%-44s %10.3f %10.0f %10.1f %12.2f\n", label, ms, gbs, tflops, ms / (bytes / (copy_gbs * 1e6)));
      }
    }
  }
  be.set_gemv_mode(cuda::GemvMode::kAuto);
  w.reset();
  x.reset();
  out.reset();

  const int64_t rows = 4096, dim = 5376;
  Buffer nx = be.alloc(static_cast<size_t>(rows * dim) * 2).value(), ny = be.alloc(static_cast<size_t>(rows * dim) * 2).value();
  Buffer nw = be.alloc(static_cast<size_t>(dim) * 2).value();
  if (!fill_bf16(be, nx, static_cast<size_t>(rows * dim)) || !fill_bf16(be, nw, static_cast<size_t>(dim))) return 1;
  const RmsNormArgs nargs{.out = ny.view(DType::kBF16, {rows, dim}), .x = nx.view(DType::kBF16, {rows, dim}),
                          .weight = nw.view(DType::kBF16, {dim})};
  const double nms = time_ms(be, 3, iters, [&] { be.rms_norm(nargs); });
  const double nbytes = 2.0 * 2.0 * static_cast<double>(rows * dim);
  std::printf("%-44s %10.3f %10.0f %10s %12.2f\n", "rms_norm [4096,5376] bf16", nms, nbytes / (nms * 1e6), "-",
              nms / (nbytes / (copy_gbs * 1e6)));

  nx.reset();
  ny.reset();
  if (!bench_fused_norm(be, iters) || !bench_attention(be, iters, copy_gbs) || !bench_prefill_attention(be, iters) ||
      !bench_moe(be, iters, copy_gbs) || !bench_sampling(be, iters, copy_gbs)) {
    const Status err = be.synchronize();
    std::printf("cuda_bench: fused norm/attention/moe/sampling failed: %s\n",
                err.ok() ? "setup" : err.to_string().c_str());
    return 1;
  }

  const Status st = be.synchronize();
  if (!st.ok()) {
    std::printf("cuda_bench: device error: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  using tandem::Section;
  const Section section = argc > 1 && std::strcmp(argv[1], "--attention") == 0           ? Section::kAttention
                          : argc > 1 && std::strcmp(argv[1], "--moe") == 0               ? Section::kMoe
                          : argc > 1 && std::strcmp(argv[1], "--prefill-attention") == 0 ? Section::kPrefillAttention
                                                                                         : Section::kAll;
  return tandem::run(quick, section);
}
