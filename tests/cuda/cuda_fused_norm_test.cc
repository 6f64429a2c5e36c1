// rms_norm's fused epilogues (ops.h) on the GPU: residual + out_scale over model-sized rows (67..5376), and RoPE on
// heads of 64..512 with the default and proportional inverse-frequency tables of RopeSpec (spec §1.7). Each must equal
// the separate GPU ops (rms_norm, add, scale / rms_norm, rope) bit for bit in bf16 and f32, with out aliasing x or
// residual and with misaligned views, and match the reference kernels within the tolerances of cuda_fixture.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/strings.h"
#include "cuda/cuda_fixture.h"
#include "kernels/ref/ref.h"
#include "model/gemma4_config.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

using CudaFusedNorm = CudaTest;

// [rows, dim] view of `t`'s memory starting `offset` elements in (offset 1: not 16-byte aligned).
Tensor view_at(const DeviceTensor& t, int64_t offset, int64_t rows, int64_t dim) {
  char* p = static_cast<char*>(t.t().data) + offset * static_cast<int64_t>(dtype_size(t.t().dtype));
  return Tensor::make(p, t.t().dtype, {rows, dim}, t.t().device);
}

// Host copy of a device view (downloads the whole backing tensor).
HostTensor fetch(DeviceTensor& t, int64_t offset, int64_t rows, int64_t dim) {
  t.download();
  HostTensor h(t.t().dtype, {rows, dim});
  std::memcpy(h.t().data, static_cast<const char*>(t.host().t().data) + offset * dtype_size(t.t().dtype),
              h.t().nbytes());
  return h;
}

TEST_F(CudaFusedNorm, ResidualAndScaleEqualSeparateOps) {
  uint32_t seed = 1;
  for (DType dt : {kBF16, kF32}) {
    for (int64_t rows : {1, 3, 17}) {
      for (int64_t dim : {67, 256, 1544, 2816, 5376}) {
        for (int wk = 0; wk < 3; ++wk) {  // weightless, bf16 weight, f32 weight
          for (bool residual : {true, false}) {
            for (float s : {1.f, 0.37f}) {
              SCOPED_TRACE(strfmt("%s rows %lld dim %lld weight %d residual %d scale %g", dtype_name(dt),
                                  static_cast<long long>(rows), static_cast<long long>(dim), wk, residual,
                                  static_cast<double>(s)));
              DeviceTensor x(be(), dt, {rows, dim}), res(be(), dt, {rows, dim}), w(be(), wk == 2 ? kF32 : kBF16, {dim});
              fill_random(x.host(), seed++);
              fill_random(res.host(), seed++);
              std::mt19937 rng(seed++);
              w.host().fill_uniform(rng, 0.5f, 1.5f);
              for (int64_t i = 0; i < res.host().numel(); ++i) res.host().set(i, res.host().get(i) * 8.f);
              x.upload();
              res.upload();
              w.upload();
              const Tensor weight = wk == 0 ? Tensor{} : w.t();
              const Tensor res_t = residual ? res.t() : Tensor{};

              // The unfused sequence of the model: rms_norm into a temporary, add into the stream, scale.
              DeviceTensor y(be(), dt, {rows, dim}), sum(be(), dt, {rows, dim});
              be().rms_norm({.out = y, .x = x, .weight = weight});
              if (residual) be().add({.out = sum, .a = res, .b = y});
              DeviceTensor& want = residual ? sum : y;
              if (s != 1.f) be().scale({.x = want, .s = s});
              want.download();

              DeviceTensor got(be(), dt, {rows, dim});
              got.poison();
              be().rms_norm({.out = got, .x = x, .weight = weight, .residual = res_t, .out_scale = s});
              got.download();
              EXPECT_TRUE(same_bits(got.host(), want.host())) << "separate out";
              HostTensor want_ref(dt, {rows, dim});
              ref::rms_norm({.out = want_ref, .x = x.host(), .weight = wk == 0 ? Tensor{} : w.host().t(),
                             .residual = residual ? res.host().t() : Tensor{}, .out_scale = s});
              expect_close(got.host(), want_ref, tolerance_for(dt));

              got.host().copy_from(x.host());  // out aliases x
              got.upload();
              be().rms_norm({.out = got, .x = got, .weight = weight, .residual = res_t, .out_scale = s});
              got.download();
              EXPECT_TRUE(same_bits(got.host(), want.host())) << "out == x";

              if (residual) {
                got.host().copy_from(res.host());  // out aliases residual: x = (x + norm(o)) * layer_scalar
                got.upload();
                be().rms_norm({.out = got, .x = x, .weight = weight, .residual = got, .out_scale = s});
                got.download();
                EXPECT_TRUE(same_bits(got.host(), want.host())) << "out == residual";
              }
            }
          }
        }
      }
    }
  }
}

TEST_F(CudaFusedNorm, MisalignedViewsEqualSeparateOps) {
  // The reduction's geometry depends on x alone, so misaligned out/residual views (scalar stores) and a misaligned
  // x (scalar everything) still give the bits of the separate ops on the same x.
  const int64_t rows = 3, dim = 1544;
  for (DType dt : {kBF16, kF32}) {
    for (int64_t x_off : {0, 1}) {
      SCOPED_TRACE(strfmt("%s x offset %lld", dtype_name(dt), static_cast<long long>(x_off)));
      DeviceTensor xb(be(), dt, {rows * dim + 1}), rb(be(), dt, {rows * dim + 1}), w(be(), kBF16, {dim});
      DeviceTensor y(be(), dt, {rows, dim}), want(be(), dt, {rows, dim}), gb(be(), dt, {rows * dim + 1});
      fill_random(xb.host(), 11);
      fill_random(rb.host(), 12);
      fill_random(w.host(), 13);
      xb.upload();
      rb.upload();
      w.upload();
      const Tensor x = view_at(xb, x_off, rows, dim), r = view_at(rb, 1, rows, dim), out = view_at(gb, 1, rows, dim);
      be().rms_norm({.out = y, .x = x, .weight = w});
      be().add({.out = want, .a = r, .b = y});
      be().scale({.x = want, .s = 1.25f});
      want.download();
      gb.poison();
      be().rms_norm({.out = out, .x = x, .weight = w, .residual = r, .out_scale = 1.25f});
      const HostTensor got = fetch(gb, 1, rows, dim);
      EXPECT_TRUE(same_bits(got, want.host()));
      EXPECT_TRUE(std::isnan(gb.host().get(0)));  // the element before the view is untouched
    }
  }
}

TEST_F(CudaFusedNorm, ThenEqualsTwoNormsBitwise) {
  // rms_norm_then (a layer's residual norm, then the next block's input norm of its result) in one launch gives the
  // bits of the two rms_norm launches: bf16 and f32, vector and scalar geometry (dim 1037), weightless second norm,
  // with and without residual / out_scale, out aliasing the residual as in the model; and a misaligned out (other
  // geometry than x) falls back to the two ops with the same result.
  uint32_t seed = 500;
  for (DType dt : {kBF16, kF32}) {
    for (int64_t rows : {1, 3}) {
      for (int64_t dim : {1037, 1536, 5376}) {
        for (int variant = 0; variant < 3; ++variant) {  // 0: residual + scale, 1: residual, 2: neither
          SCOPED_TRACE(strfmt("%s rows %lld dim %lld variant %d", dtype_name(dt), static_cast<long long>(rows),
                              static_cast<long long>(dim), variant));
          DeviceTensor o(be(), dt, {rows, dim}), x0(be(), dt, {rows, dim}), w1(be(), kBF16, {dim}),
              w2(be(), kBF16, {dim});
          fill_random(o.host(), seed++);
          fill_random(x0.host(), seed++);
          std::mt19937 rng(seed++);
          w1.host().fill_uniform(rng, 0.5f, 1.5f);
          w2.host().fill_uniform(rng, 0.5f, 1.5f);
          for (DeviceTensor* t : {&o, &x0, &w1, &w2}) t->upload();
          const float s = variant == 0 ? 0.37f : 1.f;
          for (bool weightless : {false, true}) {
            const Tensor w2t = weightless ? Tensor{} : w2.t();
            DeviceTensor xa(be(), dt, {rows, dim}), xna(be(), dt, {rows, dim}), xb(be(), dt, {rows, dim}),
                xnb(be(), dt, {rows, dim});
            xa.host().copy_from(x0.host());
            xb.host().copy_from(x0.host());
            xa.upload();
            xb.upload();
            xna.poison();
            xnb.poison();
            const Tensor ra = variant < 2 ? xa.t() : Tensor{}, rb = variant < 2 ? xb.t() : Tensor{};
            be().rms_norm({.out = xa, .x = o, .weight = w1, .residual = ra, .out_scale = s});
            be().rms_norm({.out = xna, .x = xa, .weight = w2t});
            be().rms_norm_then({.out = xb, .x = o, .weight = w1, .residual = rb, .out_scale = s},
                               {.out = xnb, .x = xb, .weight = w2t});
            for (DeviceTensor* t : {&xa, &xna, &xb, &xnb}) t->download();
            EXPECT_TRUE(same_bits(xb.host(), xa.host())) << "first output, weightless " << weightless;
            EXPECT_TRUE(same_bits(xnb.host(), xna.host())) << "second output, weightless " << weightless;
          }
        }
      }
    }
  }
  // Misaligned first output: its norm geometry differs from x's, so the op runs as two launches.
  const int64_t rows = 2, dim = 1536;
  DeviceTensor o(be(), kBF16, {rows, dim}), ob(be(), kBF16, {rows * dim + 1}), w(be(), kBF16, {dim});
  DeviceTensor want1(be(), kBF16, {rows, dim}), want2(be(), kBF16, {rows, dim}), got2(be(), kBF16, {rows, dim});
  fill_random(o.host(), 900);
  fill_random(w.host(), 901);
  o.upload();
  w.upload();
  be().rms_norm({.out = want1, .x = o, .weight = w});
  be().rms_norm({.out = want2, .x = want1, .weight = w});
  want2.download();
  const Tensor out = view_at(ob, 1, rows, dim);
  be().rms_norm_then({.out = out, .x = o, .weight = w}, {.out = got2, .x = out, .weight = w});
  got2.download();
  EXPECT_TRUE(same_bits(got2.host(), want2.host()));
  EXPECT_TRUE(be().last_error().ok()) << be().last_error().to_string();
}

TEST_F(CudaFusedNorm, SeqEqualsNormsInOrderBitwise) {
  // rms_norm_seq as a MoE layer runs it around its experts: x = x + norm(o), then three norms of the new x (one with
  // out_scale); and f = norm(f) in place, f = f + norm(f2), x = (x + norm(f)) * s, xn = norm(x). One launch; each
  // stage's bits those of its own rms_norm run in order. bf16 and f32, vector and scalar geometry (dim 1037).
  uint32_t seed = 1700;
  for (DType dt : {kBF16, kF32}) {
    for (int64_t rows : {1, 5}) {
      for (int64_t dim : {1037, 2816}) {
        SCOPED_TRACE(
            strfmt("%s rows %lld dim %lld", dtype_name(dt), static_cast<long long>(rows), static_cast<long long>(dim)));
        DeviceTensor o(be(), dt, {rows, dim}), x0(be(), dt, {rows, dim}), f0(be(), dt, {rows, dim}),
            f2(be(), dt, {rows, dim});
        DeviceTensor w1(be(), kBF16, {dim}), w2(be(), kF32, {dim}), w3(be(), kBF16, {dim}), w4(be(), kBF16, {dim});
        for (DeviceTensor* t : {&o, &x0, &f0, &f2}) fill_random(t->host(), seed++);
        std::mt19937 rng(seed++);
        for (DeviceTensor* w : {&w1, &w2, &w3, &w4}) w->host().fill_uniform(rng, 0.5f, 1.5f);
        for (DeviceTensor* t : {&o, &x0, &f0, &f2, &w1, &w2, &w3, &w4}) t->upload();
        // a: the norms one by one; b: the sequence. x and f are updated in place, so each side has its own copies.
        struct Side {
          DeviceTensor x, f, xn, z, y;
        };
        auto side = [&] {
          Side sd{DeviceTensor(be(), dt, {rows, dim}), DeviceTensor(be(), dt, {rows, dim}),
                  DeviceTensor(be(), dt, {rows, dim}), DeviceTensor(be(), dt, {rows, dim}),
                  DeviceTensor(be(), dt, {rows, dim})};
          sd.x.host().copy_from(x0.host());
          sd.f.host().copy_from(f0.host());
          sd.x.upload();
          sd.f.upload();
          for (DeviceTensor* t : {&sd.xn, &sd.z, &sd.y}) t->poison();
          return sd;
        };
        Side a = side(), b = side();
        auto into_ffn = [&](Side& sd) {
          return std::vector<RmsNormArgs>{{.out = sd.x, .x = o, .weight = w1, .residual = sd.x},
                                          {.out = sd.xn, .x = sd.x, .weight = w3},
                                          {.out = sd.z, .x = sd.x, .weight = w2, .out_scale = 0.0188f},
                                          {.out = sd.y, .x = sd.x, .weight = Tensor{}}};
        };
        auto out_of_ffn = [&](Side& sd) {
          return std::vector<RmsNormArgs>{{.out = sd.f, .x = sd.f, .weight = w4},
                                          {.out = sd.f, .x = f2, .weight = w2, .residual = sd.f},
                                          {.out = sd.x, .x = sd.f, .weight = w1, .residual = sd.x, .out_scale = 0.71f},
                                          {.out = sd.xn, .x = sd.x, .weight = w3}};
        };
        for (const RmsNormArgs& s : into_ffn(a)) be().rms_norm(s);
        const std::vector<RmsNormArgs> in_b = into_ffn(b);
        EXPECT_TRUE(cuda::rms_norm_seq_fusable(in_b));
        be().rms_norm_seq(in_b);
        for (Side* sd : {&a, &b})
          for (DeviceTensor* t : {&sd->x, &sd->xn, &sd->z, &sd->y}) t->download();
        EXPECT_TRUE(same_bits(b.x.host(), a.x.host())) << "residual norm";
        EXPECT_TRUE(same_bits(b.xn.host(), a.xn.host())) << "norm of its result";
        EXPECT_TRUE(same_bits(b.z.host(), a.z.host())) << "out_scale";
        EXPECT_TRUE(same_bits(b.y.host(), a.y.host())) << "weightless";

        for (const RmsNormArgs& s : out_of_ffn(a)) be().rms_norm(s);
        const std::vector<RmsNormArgs> out_b = out_of_ffn(b);
        EXPECT_TRUE(cuda::rms_norm_seq_fusable(out_b));
        be().rms_norm_seq(out_b);
        for (Side* sd : {&a, &b})
          for (DeviceTensor* t : {&sd->x, &sd->f, &sd->xn}) t->download();
        EXPECT_TRUE(same_bits(b.f.host(), a.f.host())) << "f";
        EXPECT_TRUE(same_bits(b.x.host(), a.x.host())) << "x";
        EXPECT_TRUE(same_bits(b.xn.host(), a.xn.host())) << "xn";
      }
    }
  }
  // Not one launch (the op runs the norms in order instead): a stage reading a shifted view of an earlier out, a
  // stage writing a weight another reads, rows that differ.
  const int64_t rows = 3, dim = 256;
  DeviceTensor buf(be(), kBF16, {rows + 1, dim}), x(be(), kBF16, {rows, dim}), w(be(), kBF16, {dim}),
      y(be(), kBF16, {rows, dim});
  const Tensor lo = buf.t().slice(0, rows), hi = buf.t().slice(1, rows + 1);
  const RmsNormArgs shifted[] = {{.out = lo, .x = x, .weight = w}, {.out = y, .x = hi, .weight = w}};
  EXPECT_FALSE(cuda::rms_norm_seq_fusable(shifted));
  const Tensor w_as_row = w.t().reshape({1, dim});
  const RmsNormArgs writes_weight[] = {{.out = y, .x = x, .weight = w}, {.out = w_as_row, .x = x.t().slice(0, 1)}};
  EXPECT_FALSE(cuda::rms_norm_seq_fusable(writes_weight));
  const RmsNormArgs other_rows[] = {{.out = y, .x = x, .weight = w},
                                    {.out = y.t().slice(0, 1), .x = y.t().slice(0, 1), .weight = w}};
  EXPECT_FALSE(cuda::rms_norm_seq_fusable(other_rows));
  EXPECT_TRUE(be().last_error().ok()) << be().last_error().to_string();
}

TEST_F(CudaFusedNorm, RegisterPathEqualsPlainKernelsBitwise) {
  // The register path (norm_regs.cu, on by default for bf16) against the plain kernels (TANDEM_NORM_REGS=0): one
  // norm with residual and scale, rms_norm_then, rms_norm_seq as a MoE layer runs it on both sides of its experts, and
  // a sequence whose third stage reads the first stage's out and the second's as its residual. Widths of the models
  // (1536, 2816, 5376), one with idle threads (1544), one past the path (6144: the plain kernel either way); bf16,
  // f32 and no weight. The plain kernels read their weights with plain loads, the register path with L2's
  // evict_last hint (TANDEM_L2_KEEP, on by default), and the plain kernels once more with the hint: the same bits.
  struct Restore {
    ~Restore() {
      cuda::set_norm_regs(true);
      cuda::set_keep_norm_weights(true);
    }
  } restore;
  uint32_t seed = 2600;
  for (int64_t rows : {1, 5}) {
    for (int64_t dim : {1536, 1544, 2816, 5376, 6144}) {
      SCOPED_TRACE(strfmt("rows %lld dim %lld", static_cast<long long>(rows), static_cast<long long>(dim)));
      DeviceTensor o(be(), kBF16, {rows, dim}), x0(be(), kBF16, {rows, dim}), f0(be(), kBF16, {rows, dim}),
          f2(be(), kBF16, {rows, dim});
      DeviceTensor w1(be(), kBF16, {dim}), w2(be(), kF32, {dim}), w3(be(), kBF16, {dim});
      for (DeviceTensor* t : {&o, &x0, &f0, &f2}) fill_random(t->host(), seed++);
      std::mt19937 rng(seed++);
      for (DeviceTensor* w : {&w1, &w2, &w3}) w->host().fill_uniform(rng, 0.5f, 1.5f);
      for (DeviceTensor* t : {&o, &x0, &f0, &f2, &w1, &w2, &w3}) t->upload();
      auto run = [&](bool regs, bool keep) {
        cuda::set_norm_regs(regs);
        cuda::set_keep_norm_weights(keep);
        std::vector<DeviceTensor> t;
        t.reserve(9);
        for (int k = 0; k < 9; ++k) t.emplace_back(be(), kBF16, std::initializer_list<int64_t>{rows, dim});
        DeviceTensor &x = t[0], &f = t[1], &xn = t[2], &z = t[3], &y = t[4], &one = t[5], &a = t[6], &b = t[7],
                     &c = t[8];
        x.host().copy_from(x0.host());
        f.host().copy_from(f0.host());
        x.upload();
        f.upload();
        for (DeviceTensor* p : {&xn, &z, &y, &one, &a, &b, &c}) p->poison();
        be().rms_norm({.out = one, .x = o, .weight = w2, .residual = x, .out_scale = 0.37f});
        be().rms_norm_then({.out = x, .x = o, .weight = w1, .residual = x, .out_scale = 0.71f},
                           {.out = xn, .x = x, .weight = w3});
        const RmsNormArgs into_ffn[] = {{.out = x, .x = o, .weight = w1, .residual = x},
                                        {.out = xn, .x = x, .weight = w3},
                                        {.out = z, .x = x, .weight = w2, .out_scale = 0.0188f},
                                        {.out = y, .x = x, .weight = Tensor{}}};
        EXPECT_TRUE(cuda::rms_norm_seq_fusable(into_ffn));
        be().rms_norm_seq(into_ffn);
        const RmsNormArgs out_of_ffn[] = {{.out = f, .x = f, .weight = w3},
                                          {.out = f, .x = f2, .weight = w2, .residual = f},
                                          {.out = x, .x = f, .weight = w1, .residual = x, .out_scale = 0.71f},
                                          {.out = xn, .x = x, .weight = w3}};
        be().rms_norm_seq(out_of_ffn);
        const RmsNormArgs skip[] = {{.out = a, .x = o, .weight = w1},
                                    {.out = b, .x = f2, .weight = w3},
                                    {.out = c, .x = a, .weight = w2, .residual = b}};
        EXPECT_TRUE(cuda::rms_norm_seq_fusable(skip));
        be().rms_norm_seq(skip);
        std::vector<HostTensor> got;
        for (DeviceTensor& d : t) {
          d.download();
          got.emplace_back(kBF16, std::initializer_list<int64_t>{rows, dim});
          got.back().copy_from(d.host());
        }
        return got;
      };
      const std::vector<HostTensor> plain = run(false, false), regs = run(true, true), kept = run(false, true);
      const char* names[] = {"x", "f", "xn", "z", "y", "one norm", "skip a", "skip b", "skip c"};
      for (size_t k = 0; k < plain.size(); ++k) {
        EXPECT_TRUE(same_bits(regs[k], plain[k])) << names[k];
        EXPECT_TRUE(same_bits(kept[k], plain[k])) << names[k] << ", plain kernels with the L2 hint";
      }
    }
  }
  EXPECT_TRUE(be().last_error().ok()) << be().last_error().to_string();
}

// Inverse-frequency tables as the model builds them (RopeTables uploads RopeSpec::inv_freq): sliding layers use
// the default RoPE over 256 dims, full layers proportional RoPE over 512 with a quarter of the pairs rotated.
HostTensor inv_freq_of(const RopeSpec& spec, int head_dim) {
  const std::vector<float> f = spec.inv_freq(head_dim);
  HostTensor t(kF32, {static_cast<int64_t>(f.size())});
  for (size_t j = 0; j < f.size(); ++j) t.set(static_cast<int64_t>(j), f[j]);
  return t;
}

TEST_F(CudaFusedNorm, RopeEqualsSeparateOps) {
  const RopeSpec sliding{.kind = RopeKind::kDefault, .theta = 1e4};
  const RopeSpec full{.kind = RopeKind::kProportional, .theta = 1e6, .partial_rotary_factor = 0.25};
  struct Case {
    int head_dim;
    const RopeSpec* spec;
  };
  const Case cases[] = {{256, &sliding}, {512, &full}, {256, &full}, {512, &sliding}, {64, &sliding}, {66, &sliding}};
  uint32_t seed = 100;
  for (DType dt : {kBF16, kF32}) {
    for (const Case& c : cases) {
      for (int64_t n_tok : {1, 3, 17}) {  // 17: a prompt chunk (one warp per row where the head dim allows)
        for (int64_t n_heads : {1, 8}) {
          for (bool weighted : {true, false}) {
            const int64_t hd = c.head_dim, half = hd / 2;
            SCOPED_TRACE(strfmt("%s head_dim %d %s tokens %lld heads %lld weighted %d", dtype_name(dt), c.head_dim,
                                c.spec == &full ? "proportional" : "default", static_cast<long long>(n_tok),
                                static_cast<long long>(n_heads), weighted));
            DeviceTensor x(be(), dt, {n_tok, n_heads, hd}), w(be(), kBF16, {hd}), pos(be(), kI32, {n_tok});
            DeviceTensor inv(be(), kF32, {half});
            inv.host().copy_from(inv_freq_of(*c.spec, c.head_dim));
            fill_random(x.host(), seed++);
            std::mt19937 rng(seed++);
            w.host().fill_uniform(rng, 0.5f, 1.5f);
            for (int64_t t = 0; t < n_tok; ++t) pos.host().seti(t, static_cast<int32_t>(rng() % 131072));
            pos.host().seti(n_tok - 1, 131071);  // the largest angles of a 128k context
            for (DeviceTensor* t : {&x, &w, &pos, &inv}) t->upload();
            const Tensor weight = weighted ? w.t() : Tensor{};

            DeviceTensor normed(be(), dt, {n_tok, n_heads, hd}), want(be(), dt, {n_tok, n_heads, hd});
            be().rms_norm({.out = normed, .x = x, .weight = weight});
            be().rms_norm({.out = want, .x = x, .weight = weight});
            be().rope({.x = want, .pos = pos, .inv_freq = inv});
            normed.download();
            want.download();

            DeviceTensor got(be(), dt, {n_tok, n_heads, hd});
            got.poison();
            be().rms_norm({.out = got, .x = x, .weight = weight, .rope_pos = pos, .rope_inv_freq = inv});
            got.download();
            EXPECT_TRUE(same_bits(got.host(), want.host())) << "separate out";
            HostTensor want_ref(dt, {n_tok, n_heads, hd});
            ref::rms_norm({.out = want_ref, .x = x.host(), .weight = weighted ? w.host().t() : Tensor{},
                           .rope_pos = pos.host(), .rope_inv_freq = inv.host()});
            expect_close(got.host(), want_ref, tolerance_for(dt));
            // Unrotated pairs (zero frequency) hold the norm output exactly.
            for (int64_t r = 0; r < n_tok * n_heads; ++r)
              for (int64_t j = 0; j < half; ++j) {
                if (inv.host().get(j) != 0.f) continue;
                ASSERT_EQ(got.host().get(r * hd + j), normed.host().get(r * hd + j)) << r << " " << j;
                ASSERT_EQ(got.host().get(r * hd + j + half), normed.host().get(r * hd + j + half)) << r << " " << j;
              }

            got.host().copy_from(x.host());  // out aliases x: q = rope(q_norm(q))
            got.upload();
            be().rms_norm({.out = got, .x = got, .weight = weight, .rope_pos = pos, .rope_inv_freq = inv});
            got.download();
            EXPECT_TRUE(same_bits(got.host(), want.host())) << "out == x";
          }
        }
      }
    }
  }
}

TEST_F(CudaFusedNorm, KvNormWriteEqualsThreeOps) {
  // kv_norm_write in one launch fills the cache with the bits of rms_norm + RoPE on k, the weightless rms_norm on
  // v and kv_write: head dims 256 / 512 with default / proportional RoPE, 1-3 KV heads, 1-5 tokens and a 40-token
  // prompt chunk (one warp per row: norm_rope_rows_kernel), a plain store and a ring (slots wrapping), positions the
  // store cannot hold (skipped by both), bf16 and f32.
  const RopeSpec sliding{.kind = RopeKind::kDefault, .theta = 1e4};
  const RopeSpec full{.kind = RopeKind::kProportional, .theta = 1e6, .partial_rotary_factor = 0.25};
  uint32_t seed = 700;
  for (DType dt : {kBF16, kF32}) {
    for (int hd : {256, 512}) {
      for (int64_t n_kv : {1, 3}) {
        for (int64_t n_tok : {1, 5, 40}) {
          for (bool ring : {false, true}) {
            SCOPED_TRACE(strfmt("%s head_dim %d kv heads %lld tokens %lld ring %d", dtype_name(dt), hd,
                                static_cast<long long>(n_kv), static_cast<long long>(n_tok), ring));
            const int64_t cap = std::max<int64_t>(8, n_tok);  // a ring's slots wrap, each written once
            DeviceTensor k(be(), dt, {n_tok, n_kv, hd}), v(be(), dt, {n_tok, n_kv, hd}), w(be(), kBF16, {hd});
            DeviceTensor pos(be(), kI32, {n_tok}), inv(be(), kF32, {hd / 2});
            DeviceTensor ka(be(), dt, {n_kv, cap, hd}), va(be(), dt, {n_kv, cap, hd});
            DeviceTensor kb(be(), dt, {n_kv, cap, hd}), vb(be(), dt, {n_kv, cap, hd});
            inv.host().copy_from(inv_freq_of(hd == 512 ? full : sliding, hd));
            fill_random(k.host(), seed++);
            fill_random(v.host(), seed++);
            std::mt19937 rng(seed++);
            w.host().fill_uniform(rng, 0.5f, 1.5f);
            // Consecutive positions from 6: the ring wraps; the plain store cannot hold those from `cap` on.
            for (int64_t t = 0; t < n_tok; ++t) pos.host().seti(t, static_cast<int32_t>(6 + t));
            for (DeviceTensor* t : {&k, &v, &w, &pos, &inv}) t->upload();
            for (DeviceTensor* t : {&ka, &va, &kb, &vb}) t->poison();
            DeviceTensor k2(be(), dt, {n_tok, n_kv, hd}), v2(be(), dt, {n_tok, n_kv, hd});
            k2.host().copy_from(k.host());
            v2.host().copy_from(v.host());
            k2.upload();
            v2.upload();
            const int64_t end = 6 + n_tok;
            const KvView va_view{.k = ka,
                                 .v = va,
                                 .begin = ring ? std::max<int64_t>(0, end - cap) : 0,
                                 .end = ring ? end : std::min(end, cap),
                                 .ring = ring};
            KvView vb_view = va_view;
            vb_view.k = kb;
            vb_view.v = vb;
            // Queries too (4 heads per KV head), normed and rotated in place; one token on a plain store without them.
            const int64_t n_heads = 4 * n_kv;
            const bool with_q = ring || n_tok > 1;
            DeviceTensor qa(be(), dt, {n_tok, n_heads, hd}), qb(be(), dt, {n_tok, n_heads, hd}), qw(be(), kBF16, {hd});
            fill_random(qa.host(), seed++);
            qb.host().copy_from(qa.host());
            qw.host().fill_uniform(rng, 0.5f, 1.5f);
            for (DeviceTensor* t : {&qa, &qb, &qw}) t->upload();
            // The ops of the Backend composite on copies, then the fused op.
            be().Backend::kv_norm_write({.write = {.kv = va_view, .k_new = k2, .v_new = v2, .pos = pos},
                                         .k_norm = w,
                                         .rope_inv_freq = inv,
                                         .q = with_q ? qa.t() : Tensor{},
                                         .q_norm = qw});
            be().kv_norm_write({.write = {.kv = vb_view, .k_new = k, .v_new = v, .pos = pos},
                                .k_norm = w,
                                .rope_inv_freq = inv,
                                .q = with_q ? qb.t() : Tensor{},
                                .q_norm = qw});
            for (DeviceTensor* t : {&ka, &va, &kb, &vb, &qa, &qb}) t->download();
            ASSERT_TRUE(be().last_error().ok()) << be().last_error().to_string();
            EXPECT_TRUE(same_bits(kb.host(), ka.host())) << "keys";
            EXPECT_TRUE(same_bits(vb.host(), va.host())) << "values";
            EXPECT_TRUE(same_bits(qb.host(), qa.host())) << "queries, with_q " << with_q;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem::testing
