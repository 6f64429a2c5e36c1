// rms_norm's fused epilogues (ops.h: residual, out_scale, RoPE) against the separate ops they replace: bit-identical
// on the CPU backend (every instruction set) and in the reference kernels (f32 and bf16, whose staged rounding the
// bf16 host engine of the CUDA model tests relies on), with out aliasing x or residual, on odd sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "kernels/host_tensor.h"
#include "kernels/ref/ref.h"

namespace tandem {
namespace {

using testing::HostTensor;
using testing::rel_error;
constexpr DType kF32 = DType::kF32;
constexpr DType kBF16 = DType::kBF16;
constexpr DType kI32 = DType::kI32;

// The ops under test: a backend's, or the reference kernels.
struct Ops {
  std::string name;
  std::function<void(const RmsNormArgs&)> rms_norm;
  std::function<void(const AddArgs&)> add;
  std::function<void(const ScaleArgs&)> scale;
  std::function<void(const RopeArgs&)> rope;
};

std::vector<std::unique_ptr<Backend>> cpu_backends() {
  std::vector<std::unique_ptr<Backend>> out;
  for (const char* isa : {"avx512", "avx2", "scalar"}) {
    auto b = make_cpu_backend_with({.threads = 2, .isa = isa});
    if (b.ok()) out.push_back(std::move(b).value());
  }
  return out;
}

Ops ops_of(Backend& be) {
  return {static_cast<cpu::CpuBackend&>(be).summary(), [&be](const RmsNormArgs& a) { be.rms_norm(a); },
          [&be](const AddArgs& a) { be.add(a); }, [&be](const ScaleArgs& a) { be.scale(a); },
          [&be](const RopeArgs& a) { be.rope(a); }};
}

Ops ref_ops() { return {"ref", ref::rms_norm, ref::add, ref::scale, ref::rope}; }

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.t().nbytes() == b.t().nbytes() && std::memcmp(a.t().data, b.t().data, a.t().nbytes()) == 0;
}

// Fused (residual + rms_norm(x) * w) * out_scale, with out separate, aliasing x and aliasing residual, against
// rms_norm into a temporary, add, scale.
void check_residual_fusion(const Ops& ops, DType dt, int64_t rows, int64_t dim, bool weighted, bool residual,
                           float out_scale) {
  SCOPED_TRACE(ops.name + " " + dtype_name(dt) + " rows " + std::to_string(rows) + " dim " + std::to_string(dim) +
               (weighted ? " weighted" : " weightless") + (residual ? " residual" : "") + " scale " +
               std::to_string(out_scale));
  std::mt19937 rng(static_cast<unsigned>(rows * 131 + dim * 7 + weighted * 3 + residual));
  HostTensor x(dt, {rows, dim}), res(dt, {rows, dim}), w(kBF16, {dim});
  x.fill_uniform(rng, -4, 4);
  res.fill_uniform(rng, -8, 8);
  w.fill_uniform(rng, -2, 2);
  const Tensor weight = weighted ? w.t() : Tensor{};
  const Tensor residual_t = residual ? res.t() : Tensor{};

  HostTensor want(dt, {rows, dim});
  {
    HostTensor y(dt, {rows, dim});
    ops.rms_norm({.out = y, .x = x, .weight = weight});
    if (residual) {
      ops.add({.out = want, .a = res, .b = y});
    } else {
      want.copy_from(y);
    }
    if (out_scale != 1.f) ops.scale({.x = want, .s = out_scale});
  }
  HostTensor got(dt, {rows, dim});
  got.poison();
  ops.rms_norm({.out = got, .x = x, .weight = weight, .residual = residual_t, .out_scale = out_scale});
  EXPECT_TRUE(same_bits(got, want)) << "separate out, rel error " << rel_error(got, want);

  got.copy_from(x);  // out aliases x
  ops.rms_norm({.out = got, .x = got, .weight = weight, .residual = residual_t, .out_scale = out_scale});
  EXPECT_TRUE(same_bits(got, want)) << "out == x, rel error " << rel_error(got, want);

  if (residual) {
    got.copy_from(res);  // out aliases residual (the model's x = x + norm(o))
    ops.rms_norm({.out = got, .x = x, .weight = weight, .residual = got, .out_scale = out_scale});
    EXPECT_TRUE(same_bits(got, want)) << "out == residual, rel error " << rel_error(got, want);
  }
}

// Inverse frequencies of RoPE over head_dim: default (all pairs), or proportional (spec §1.7: the first quarter of
// the pairs rotate with exponents over the full head dim, the rest have frequency 0).
HostTensor inv_freq_table(int64_t head_dim, bool proportional) {
  const int64_t half = head_dim / 2;
  HostTensor f(kF32, {half});
  const int64_t rotated = proportional ? head_dim / 8 : half;
  const double theta = proportional ? 1e6 : 1e4;
  for (int64_t j = 0; j < half; ++j)
    f.set(j, j < rotated ? static_cast<float>(std::pow(theta, -2.0 * static_cast<double>(j) / head_dim)) : 0.f);
  return f;
}

// Fused rope(rms_norm(x) * w) against rms_norm then rope, out separate and aliasing x.
void check_rope_fusion(const Ops& ops, DType dt, int64_t n_tok, int64_t n_heads, int64_t head_dim, bool proportional) {
  SCOPED_TRACE(ops.name + " " + dtype_name(dt) + " tokens " + std::to_string(n_tok) + " heads " +
               std::to_string(n_heads) + " head_dim " + std::to_string(head_dim) +
               (proportional ? " proportional" : " default"));
  std::mt19937 rng(static_cast<unsigned>(n_tok * 17 + n_heads * 5 + head_dim));
  HostTensor x(dt, {n_tok, n_heads, head_dim}), w(kBF16, {head_dim}), pos(kI32, {n_tok});
  x.fill_uniform(rng, -3, 3);
  w.fill_uniform(rng, 0.5f, 1.5f);
  std::uniform_int_distribution<int> pd(0, 100000);
  for (int64_t t = 0; t < n_tok; ++t) pos.seti(t, t == 0 ? 0 : pd(rng));
  const HostTensor inv = inv_freq_table(head_dim, proportional);

  HostTensor want(dt, {n_tok, n_heads, head_dim});
  ops.rms_norm({.out = want, .x = x, .weight = w});
  ops.rope({.x = want, .pos = pos, .inv_freq = inv});

  HostTensor got(dt, {n_tok, n_heads, head_dim});
  got.poison();
  ops.rms_norm({.out = got, .x = x, .weight = w, .rope_pos = pos, .rope_inv_freq = inv});
  EXPECT_TRUE(same_bits(got, want)) << "separate out, rel error " << rel_error(got, want);
  got.copy_from(x);  // out aliases x, as the model's q = rope(q_norm(q))
  ops.rms_norm({.out = got, .x = got, .weight = w, .rope_pos = pos, .rope_inv_freq = inv});
  EXPECT_TRUE(same_bits(got, want)) << "out == x, rel error " << rel_error(got, want);
  // x as [n_tok * n_heads, head_dim] rows: the same op.
  const Tensor flat = Tensor::make(x.t().data, dt, {n_tok * n_heads, head_dim});
  HostTensor got2(dt, {n_tok * n_heads, head_dim});
  ops.rms_norm({.out = got2, .x = flat, .weight = w, .rope_pos = pos, .rope_inv_freq = inv});
  EXPECT_TRUE(same_bits(got2, want)) << "2-d view";
}

TEST(FusedRmsNorm, ResidualAndScaleEqualSeparateOps) {
  auto backends = cpu_backends();
  ASSERT_FALSE(backends.empty());
  std::vector<std::pair<Ops, DType>> cases;
  for (auto& be : backends) cases.emplace_back(ops_of(*be), kF32);
  cases.emplace_back(ref_ops(), kF32);
  cases.emplace_back(ref_ops(), kBF16);
  for (const auto& [ops, dt] : cases)
    for (int64_t dim : {1, 7, 256, 1543})
      for (int64_t rows : {1, 3, 9})
        for (bool weighted : {true, false})
          for (bool residual : {true, false})
            for (float s : {1.f, 0.37f}) check_residual_fusion(ops, dt, rows, dim, weighted, residual, s);
}

TEST(FusedRmsNorm, RopeEqualsSeparateOps) {
  auto backends = cpu_backends();
  std::vector<std::pair<Ops, DType>> cases;
  for (auto& be : backends) cases.emplace_back(ops_of(*be), kF32);
  cases.emplace_back(ref_ops(), kF32);
  cases.emplace_back(ref_ops(), kBF16);
  for (const auto& [ops, dt] : cases)
    for (int64_t head_dim : {2, 6, 66, 256, 512})
      for (int64_t n_tok : {1, 3})
        for (int64_t n_heads : {1, 3})
          check_rope_fusion(ops, dt, n_tok, n_heads, head_dim, /*proportional=*/head_dim >= 256 && n_heads == 3);
}

TEST(FusedRmsNorm, CpuMatchesReference) {
  for (auto& be : cpu_backends()) {
    SCOPED_TRACE(ops_of(*be).name);
    std::mt19937 rng(3);
    const int64_t rows = 5, dim = 1543, n_heads = 4, head_dim = 512;
    HostTensor x(kF32, {rows, dim}), res(kF32, {rows, dim}), w(kBF16, {dim});
    x.fill_uniform(rng, -4, 4);
    res.fill_uniform(rng, -8, 8);
    w.fill_uniform(rng, -2, 2);
    HostTensor want(kF32, {rows, dim}), got(kF32, {rows, dim});
    ref::rms_norm({.out = want, .x = x, .weight = w, .residual = res, .out_scale = 0.37f});
    got.poison();
    be->rms_norm({.out = got, .x = x, .weight = w, .residual = res, .out_scale = 0.37f});
    EXPECT_LE(rel_error(got, want), 1e-5);

    HostTensor q(kF32, {rows, n_heads, head_dim}), qw(kBF16, {head_dim}), pos(kI32, {rows});
    q.fill_uniform(rng, -3, 3);
    qw.fill_uniform(rng, 0.5f, 1.5f);
    for (int64_t t = 0; t < rows; ++t) pos.seti(t, static_cast<int32_t>(t * 9973));
    const HostTensor inv = inv_freq_table(head_dim, true);
    HostTensor want_q(kF32, {rows, n_heads, head_dim}), got_q(kF32, {rows, n_heads, head_dim});
    ref::rms_norm({.out = want_q, .x = q, .weight = qw, .rope_pos = pos, .rope_inv_freq = inv});
    got_q.poison();
    be->rms_norm({.out = got_q, .x = q, .weight = qw, .rope_pos = pos, .rope_inv_freq = inv});
    EXPECT_LE(rel_error(got_q, want_q), 1e-5);
  }
}

}  // namespace
}  // namespace tandem
