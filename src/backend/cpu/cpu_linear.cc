// CPU linear (x @ w^T with bf16/f16/f32 weights, f32 activations, f32 FMA) and the MoE experts (spec §1.10).
// Threads split the output rows; within a thread the SIMD kernels (simd_impl.inc) convert each block of weight
// rows in registers and reuse it for every token, so a verify of 8 tokens reads the weights about once.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_checks.h"

namespace tandem::cpu {

void CpuBackend::run_linear(const LinearJob& job_in, int64_t n_out) {
  if (n_out == 0 || job_in.n_tok == 0) return;
  LinearJob job = job_in;
  if (job.wtype == kSimdBF16 && simd_.pair_lanes > 0) {
    // Paired-bf16 kernels read x as [even | odd] halves of each 2L block (simd.h), built once per call.
    const int64_t L2 = 2 * simd_.pair_lanes, n = job.n_in;
    pair_x_.resize(static_cast<size_t>(job.n_tok * n));
    for (int64_t t = 0; t < job.n_tok; ++t) {
      const float* x = job.x + t * job.x_stride;
      float* d = pair_x_.data() + t * n;
      int64_t b = 0;
      for (; b + L2 <= n; b += L2)
        for (int64_t i = 0; i < L2 / 2; ++i) {
          d[b + i] = x[b + 2 * i];
          d[b + L2 / 2 + i] = x[b + 2 * i + 1];
        }
      for (; b < n; ++b) d[b] = x[b];
    }
    job.x_pair = pair_x_.data();
  }
  // Below ~64K multiply-adds a parallel region costs more than it saves.
  const int64_t work = n_out * job.n_in * job.n_tok;
  constexpr int64_t kGrain = 16;  // rows per unit of the split: a multiple of every kernel's row block
  const int64_t units = (n_out + kGrain - 1) / kGrain;
  const int n_threads = work < 65536 ? 1 : static_cast<int>(std::min<int64_t>(threads_, units));
  if (n_threads == 1) {
    simd_.linear_rows(&job, 0, n_out);
    return;
  }
#pragma omp parallel num_threads(n_threads)
  {
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    // Contiguous ranges of whole units, as equal as possible.
    const int64_t ub = units * tid / nt, ue = units * (tid + 1) / nt;
    const int64_t rb = ub * kGrain, re = std::min(n_out, ue * kGrain);
    if (rb < re) simd_.linear_rows(&job, rb, re);
  }
}

void CpuBackend::linear(const LinearArgs& a) {
  check_act(a.out, "linear out");
  check_act(a.x, "linear x");
  check_float(a.w, "linear w");
  const int64_t n_out = a.w.dim(0), n_in = a.w.dim(1), n_tok = a.x.rows();
  TANDEM_CHECK_MSG(a.w.ndim == 2 && a.x.dim(-1) == n_in && a.out.rows() == n_tok && a.out.dim(-1) == n_out,
                   "linear shapes: out %s, x %s, w %s", a.out.describe().c_str(), a.x.describe().c_str(),
                   a.w.describe().c_str());
  TANDEM_CHECK_MSG(a.out.data != a.x.data, "linear out must not alias x");
  LinearJob job;
  job.w = a.w.data;
  job.wtype = simd_type(a.w.dtype);
  job.w_stride = n_in;
  job.n_in = n_in;
  job.x = a.x.ptr<float>();
  job.x_stride = n_in;
  job.n_tok = n_tok;
  job.out = a.out.ptr<float>();
  job.out_stride = n_out;
  job.alpha = a.alpha;
  job.accumulate = a.accumulate;
  run_linear(job, n_out);
}

void CpuBackend::moe_experts(const MoeExpertsArgs& a) {
  check_act(a.out, "moe out");
  check_act(a.x, "moe x");
  check_float(a.gate_up, "moe gate_up");
  check_float(a.down, "moe down");
  check_i32(a.idx, "moe idx");
  check_act(a.weights, "moe weights");
  TANDEM_CHECK(a.gate_up.ndim == 3 && a.down.ndim == 3);
  const int64_t n_exp = a.gate_up.shape[0], d_ff = a.gate_up.shape[1] / 2, d_model = a.gate_up.shape[2];
  const int64_t n_tok = a.x.rows(), k = a.idx.dim(-1);
  TANDEM_CHECK_MSG(a.gate_up.shape[1] == 2 * d_ff && a.down.shape[0] == n_exp && a.down.shape[1] == d_model &&
                       a.down.shape[2] == d_ff,
                   "moe weights: gate_up %s, down %s", a.gate_up.describe().c_str(), a.down.describe().c_str());
  TANDEM_CHECK(a.x.dim(-1) == d_model && a.out.numel() == a.x.numel() && a.out.data != a.x.data);
  TANDEM_CHECK(a.idx.numel() == n_tok * k && a.weights.numel() == n_tok * k);

  // Group the (token, slot) pairs by expert, tokens in increasing order within each expert.
  std::vector<int64_t> start(static_cast<size_t>(n_exp + 1), 0);
  const int32_t* idx = a.idx.ptr<int32_t>();
  for (int64_t i = 0; i < n_tok * k; ++i) {
    TANDEM_CHECK_MSG(idx[i] >= 0 && idx[i] < n_exp, "expert index %d of %lld", idx[i], static_cast<long long>(n_exp));
    ++start[idx[i] + 1];
  }
  for (int64_t e = 0; e < n_exp; ++e) start[e + 1] += start[e];
  moe_tok_.resize(static_cast<size_t>(n_tok * k));
  moe_w_.resize(static_cast<size_t>(n_tok * k));
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t pos = fill[idx[t * k + j]]++;
      moe_tok_[pos] = static_cast<int32_t>(t);
      moe_w_[pos] = a.weights.ptr<float>()[t * k + j];
    }
  }

  float* out = a.out.ptr<float>();
  std::fill(out, out + n_tok * d_model, 0.f);
  const size_t esize = dtype_size(a.gate_up.dtype), dsize = dtype_size(a.down.dtype);
  for (int64_t e = 0; e < n_exp; ++e) {  // increasing expert index, as HF accumulates
    const int64_t n_sel = start[e + 1] - start[e];
    if (n_sel == 0) continue;
    moe_x_.resize(static_cast<size_t>(n_sel * d_model));
    moe_h_.resize(static_cast<size_t>(n_sel * 2 * d_ff));
    moe_y_.resize(static_cast<size_t>(n_sel * d_model));
    for (int64_t s = 0; s < n_sel; ++s)
      std::copy_n(a.x.ptr<float>() + moe_tok_[start[e] + s] * d_model, d_model, moe_x_.data() + s * d_model);

    LinearJob up;  // [n_sel, 2 d_ff] = x_sel @ gate_up[e]^T: gate in columns [0, d_ff), up in [d_ff, 2 d_ff)
    up.w = static_cast<const char*>(a.gate_up.data) + static_cast<size_t>(e * 2 * d_ff * d_model) * esize;
    up.wtype = simd_type(a.gate_up.dtype);
    up.w_stride = d_model;
    up.n_in = d_model;
    up.x = moe_x_.data();
    up.x_stride = d_model;
    up.n_tok = n_sel;
    up.out = moe_h_.data();
    up.out_stride = 2 * d_ff;
    run_linear(up, 2 * d_ff);

    for (int64_t s = 0; s < n_sel; ++s) {  // gelu(gate) * up, written over the gate half
      float* h = moe_h_.data() + s * 2 * d_ff;
      simd_.gelu_mul(h, h, h + d_ff, d_ff);
    }

    LinearJob down;  // [n_sel, d_model] = h @ down[e]^T
    down.w = static_cast<const char*>(a.down.data) + static_cast<size_t>(e * d_model * d_ff) * dsize;
    down.wtype = simd_type(a.down.dtype);
    down.w_stride = d_ff;
    down.n_in = d_ff;
    down.x = moe_h_.data();
    down.x_stride = 2 * d_ff;
    down.n_tok = n_sel;
    down.out = moe_y_.data();
    down.out_stride = d_model;
    run_linear(down, d_model);

    for (int64_t s = 0; s < n_sel; ++s) {
      const float w = moe_w_[start[e] + s];
      const float* y = moe_y_.data() + s * d_model;
      float* o = out + moe_tok_[start[e] + s] * d_model;
      for (int64_t d = 0; d < d_model; ++d) o[d] += y[d] * w;
    }
  }
}

}  // namespace tandem::cpu
