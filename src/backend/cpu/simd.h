// The CPU backend's vector kernels behind a table of function pointers, one table per instruction set (AVX-512F,
// AVX2+FMA+F16C, portable scalar), chosen at run time so one binary runs on any x86-64 (and non-x86) CPU.
// The ISA-specific translation units include only this header and <immintrin.h>: nothing with external-linkage
// inline code may be compiled with -mavx512f, or the linker could hand AVX-512 code to callers on other CPUs.
#pragma once

#include <cstdint>

namespace tandem::cpu {

// Element types the kernels read (weights, KV storage, embedding rows).
enum SimdType : int { kSimdF32 = 0, kSimdBF16 = 1, kSimdF16 = 2 };

// out[t * out_stride + r] = alpha * dot(x[t * x_stride + :n_in], w[r * w_stride + :n_in]) (+ old value if
// accumulate) for t < n_tok. Activations and outputs are f32; the weights are converted to f32 on the fly.
struct LinearJob {
  const void* w = nullptr;
  int wtype = kSimdF32;
  int64_t w_stride = 0;  // elements between weight rows
  int64_t n_in = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;
  int64_t n_tok = 0;
  float* out = nullptr;
  int64_t out_stride = 0;
  float alpha = 1.f;
  bool accumulate = false;
  // bf16 weights on tables with pair_lanes > 0: x re-laid out per token in blocks of 2 * pair_lanes, the even
  // elements of the block first, then the odd ones (run by CpuBackend::run_linear). Token stride n_in.
  const float* x_pair = nullptr;
};

struct SimdOps {
  const char* name;
  // > 0: bf16 weights are read two at a time from each 32-bit word (the high half is already an f32 once the low
  // half is masked off, the low half after a 16-bit shift), halving the conversion work; the kernels then need
  // LinearJob::x_pair. Every token count uses the same order of additions, so results do not depend on batching.
  int pair_lanes;
  // Rows [row_begin, row_end) of job->out, every token. Row ranges of different threads must not overlap.
  void (*linear_rows)(const LinearJob* job, int64_t row_begin, int64_t row_end);
  // sum_i a[i] * b[i], b of type btype.
  float (*dot)(const float* a, const void* b, int btype, int64_t n);
  // y[i] += s * x[i], x of type xtype.
  void (*axpy)(float* y, float s, const void* x, int xtype, int64_t n);
  // dst[i] = float(src[i]).
  void (*to_f32)(float* dst, const void* src, int stype, int64_t n);
  // sum_i x[i] (a streaming read, used by the op lab to measure read bandwidth).
  double (*sum)(const float* x, int64_t n);
  // out[i] = gelu_tanh(g[i]) * u[i] in PyTorch's evaluation order, with a vectorised tanh (<= 2 ulp).
  void (*gelu_mul)(float* out, const float* g, const float* u, int64_t n);
  // x[i] = tanh(x[i] / cap) * cap (the final logit soft-cap), same tanh.
  void (*softcap)(float* x, int64_t n, float cap);
};

// The tables, or nullptr when this build or this CPU lacks the instruction set.
const SimdOps* simd_ops_avx512();
const SimdOps* simd_ops_avx2();
const SimdOps& simd_ops_scalar();

// The best table this CPU supports.
const SimdOps& simd_ops_best();
// "avx512", "avx2", "scalar", or "" / "best" for simd_ops_best(); nullptr when unknown or unsupported here.
const SimdOps* simd_ops_named(const char* name);

}  // namespace tandem::cpu
