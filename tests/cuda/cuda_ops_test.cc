// CUDA op parity against the scalar reference kernels (kernels/ref) on random data of odd sizes: rms_norm,
// rope, embedding, kv_write, gelu_mul, add, scale, softcap, argmax. Outputs are poisoned (NaN) before each op so
// unwritten elements fail; tolerances per output dtype are explained in cuda_fixture.h.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "backend/host_centroid.h"
#include "core/strings.h"
#include "cuda/cuda_fixture.h"
#include "kernels/ref/ref.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

using CudaOps = CudaTest;

TEST_F(CudaOps, RmsNormMatchesReference) {
  const DType pairs[][2] = {{kBF16, kBF16}, {kF32, kF32}, {kBF16, kF32}, {kF32, kBF16}};
  uint32_t seed = 1;
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t dim : {67, 256, 1544, 5376}) {
      for (const auto& p : pairs) {
        for (int wk = 0; wk < 3; ++wk) {  // weightless, bf16 weight, f32 weight
          SCOPED_TRACE(strfmt("rows %lld dim %lld x %s out %s weight %d", static_cast<long long>(rows),
                              static_cast<long long>(dim), dtype_name(p[0]), dtype_name(p[1]), wk));
          DeviceTensor x(be(), p[0], {rows, dim}), out(be(), p[1], {rows, dim});
          DeviceTensor w(be(), wk == 2 ? kF32 : kBF16, {dim});
          fill_random(x.host(), seed++);
          std::mt19937 rng(seed++);
          w.host().fill_uniform(rng, 0.5f, 1.5f);
          x.upload();
          w.upload();
          out.poison();
          const Tensor weight = wk == 0 ? Tensor{} : w.t();
          be().rms_norm({.out = out, .x = x, .weight = weight});
          out.download();
          HostTensor want(p[1], {rows, dim});
          ref::rms_norm({.out = want, .x = x.host(), .weight = wk == 0 ? Tensor{} : w.host().t()});
          expect_close(out.host(), want, tolerance_for(p[1]));
        }
      }
    }
  }
}

TEST_F(CudaOps, RmsNormInPlaceAndMisaligned) {
  const int64_t rows = 3, dim = 1544;
  // In place (out aliases x), vectorised path.
  DeviceTensor x(be(), kBF16, {rows, dim}), w(be(), kBF16, {dim});
  fill_random(x.host(), 5);
  fill_random(w.host(), 6);
  HostTensor want(kBF16, {rows, dim});
  ref::rms_norm({.out = want, .x = x.host(), .weight = w.host()});
  x.upload();
  w.upload();
  be().rms_norm({.out = x, .x = x, .weight = w});
  x.download();
  expect_close(x.host(), want, tolerance_for(kBF16));
  // A view starting 2 bytes into its buffer: not 16-byte aligned, so the scalar path runs.
  DeviceTensor big(be(), kBF16, {rows * dim + 1}), big_out(be(), kBF16, {rows * dim + 1});
  fill_random(big.host(), 7);
  big.upload();
  big_out.poison();
  const Tensor xv = Tensor::make(static_cast<uint16_t*>(big.t().data) + 1, kBF16, {rows, dim}, be().device());
  const Tensor ov = Tensor::make(static_cast<uint16_t*>(big_out.t().data) + 1, kBF16, {rows, dim}, be().device());
  be().rms_norm({.out = ov, .x = xv, .weight = w});
  big_out.download();
  HostTensor xh(kBF16, {rows, dim}), want2(kBF16, {rows, dim}), got(kBF16, {rows, dim});
  for (int64_t i = 0; i < rows * dim; ++i) {
    xh.set(i, big.host().get(i + 1));
    got.set(i, big_out.host().get(i + 1));
  }
  EXPECT_TRUE(std::isnan(big_out.host().get(0)));  // the element before the view is untouched
  ref::rms_norm({.out = want2, .x = xh, .weight = w.host()});
  expect_close(got, want2, tolerance_for(kBF16));
}

// Proportional-RoPE-like frequencies: the first `rotated` pairs rotate, the rest have frequency 0.
HostTensor make_inv_freq(int64_t half, int64_t rotated) {
  HostTensor f(kF32, {half});
  for (int64_t j = 0; j < half; ++j)
    f.set(j, j < rotated ? static_cast<float>(std::pow(10000.0, -2.0 * static_cast<double>(j) / (2.0 * half))) : 0.f);
  return f;
}

TEST_F(CudaOps, RopeMatchesReference) {
  uint32_t seed = 100;
  for (DType dt : {kBF16, kF32}) {
    for (int64_t n_tok : {1, 3, 17}) {
      for (int64_t n_heads : {1, 3}) {
        for (int64_t head_dim : {64, 256}) {
          SCOPED_TRACE(strfmt("%s tok %lld heads %lld head_dim %lld", dtype_name(dt), static_cast<long long>(n_tok),
                              static_cast<long long>(n_heads), static_cast<long long>(head_dim)));
          DeviceTensor x(be(), dt, {n_tok, n_heads, head_dim}), pos(be(), kI32, {n_tok});
          DeviceTensor inv(be(), kF32, {head_dim / 2});
          inv.host().copy_from(make_inv_freq(head_dim / 2, head_dim == 256 ? 32 : head_dim / 2));
          fill_random(x.host(), seed++);
          std::mt19937 rng(seed++);
          for (int64_t t = 0; t < n_tok; ++t) pos.host().seti(t, static_cast<int32_t>(rng() % 100000));
          HostTensor want(dt, {n_tok, n_heads, head_dim});
          want.copy_from(x.host());
          ref::rope({.x = want, .pos = pos.host(), .inv_freq = inv.host()});
          x.upload();
          pos.upload();
          inv.upload();
          be().rope({.x = x, .pos = pos, .inv_freq = inv});
          HostTensor before(dt, {n_tok, n_heads, head_dim});
          before.copy_from(x.host());
          x.download();
          expect_close(x.host(), want, tolerance_for(dt));
          if (head_dim == 256) {  // unrotated pairs are bit-for-bit unchanged
            for (int64_t r = 0; r < n_tok * n_heads; ++r)
              for (int64_t j = 32; j < 128; ++j) {
                ASSERT_EQ(x.host().get(r * 256 + j), before.get(r * 256 + j));
                ASSERT_EQ(x.host().get(r * 256 + j + 128), before.get(r * 256 + j + 128));
              }
          }
        }
      }
    }
  }
}

TEST_F(CudaOps, EmbeddingMatchesReference) {
  uint32_t seed = 200;
  const int64_t n_vocab = 1000;
  for (DType table_dt : {kBF16, kF32}) {
    for (DType out_dt : {kBF16, kF32}) {
      for (int64_t dim : {67, 1536}) {
        for (int64_t n_tok : {1, 3, 17}) {
          SCOPED_TRACE(strfmt("table %s out %s dim %lld tok %lld", dtype_name(table_dt), dtype_name(out_dt),
                              static_cast<long long>(dim), static_cast<long long>(n_tok)));
          DeviceTensor table(be(), table_dt, {n_vocab, dim}), ids(be(), kI32, {n_tok}), out(be(), out_dt, {n_tok, dim});
          fill_random(table.host(), seed++);
          std::mt19937 rng(seed++);
          for (int64_t t = 0; t < n_tok; ++t) ids.host().seti(t, static_cast<int32_t>(rng() % n_vocab));
          ids.host().seti(0, static_cast<int32_t>(n_vocab - 1));
          table.upload();
          ids.upload();
          out.poison();
          be().embedding({.out = out, .table = table, .ids = ids, .scale = 39.25f});
          out.download();
          HostTensor want(out_dt, {n_tok, dim});
          ref::embedding({.out = want, .table = table.host(), .ids = ids.host(), .scale = 39.25f});
          expect_close(out.host(), want, tolerance_for(out_dt));
        }
      }
    }
  }
}

TEST_F(CudaOps, KvWriteMatchesReferenceFullAndRing) {
  uint32_t seed = 300;
  const int64_t n_kv = 2, cap = 13, head_dim = 72;
  for (DType dt : {kBF16, kF32}) {
    for (bool ring : {false, true}) {
      for (int64_t n_tok : {1, 3, 9}) {
        SCOPED_TRACE(strfmt("%s ring %d tok %lld", dtype_name(dt), ring, static_cast<long long>(n_tok)));
        DeviceTensor k(be(), dt, {n_kv, cap, head_dim}), v(be(), dt, {n_kv, cap, head_dim});
        DeviceTensor k_new(be(), dt, {n_tok, n_kv, head_dim}), v_new(be(), dt, {n_tok, n_kv, head_dim});
        DeviceTensor pos(be(), kI32, {n_tok});
        for (DeviceTensor* t : {&k, &v, &k_new, &v_new}) fill_random(t->host(), seed++);
        // Consecutive positions; the ring case starts past the capacity so the slots wrap.
        const int64_t first = ring ? 20 : 2;
        for (int64_t t = 0; t < n_tok; ++t) pos.host().seti(t, static_cast<int32_t>(first + t));
        HostTensor want_k(dt, {n_kv, cap, head_dim}), want_v(dt, {n_kv, cap, head_dim});
        want_k.copy_from(k.host());
        want_v.copy_from(v.host());
        ref::kv_write({.kv = {.k = want_k, .v = want_v, .begin = 0, .end = 0, .ring = ring},
                       .k_new = k_new.host(), .v_new = v_new.host(), .pos = pos.host()});
        for (DeviceTensor* t : {&k, &v, &k_new, &v_new, &pos}) t->upload();
        be().kv_write({.kv = {.k = k, .v = v, .begin = 0, .end = 0, .ring = ring}, .k_new = k_new, .v_new = v_new,
                       .pos = pos});
        k.download();
        v.download();
        for (int64_t i = 0; i < want_k.numel(); ++i) {  // a copy: exact
          ASSERT_EQ(k.host().get(i), want_k.get(i)) << i;
          ASSERT_EQ(v.host().get(i), want_v.get(i)) << i;
        }
      }
    }
  }
}

TEST_F(CudaOps, ElementwiseMatchReference) {
  uint32_t seed = 400;
  for (DType dt : {kBF16, kF32}) {
    for (int64_t n : {1, 67, 17 * 1544}) {
      SCOPED_TRACE(strfmt("%s n %lld", dtype_name(dt), static_cast<long long>(n)));
      DeviceTensor a(be(), dt, {n}), b(be(), dt, {n}), out(be(), dt, {n});
      fill_random(a.host(), seed++);
      fill_random(b.host(), seed++);
      for (int64_t i = 0; i < n; ++i) a.host().set(i, a.host().get(i) * 4.f);  // gelu and tanh see their curves
      a.upload();
      b.upload();
      HostTensor want(dt, {n});

      out.poison();
      be().gelu_mul({.out = out, .gate = a, .up = b});
      out.download();
      ref::gelu_mul({.out = want, .gate = a.host(), .up = b.host()});
      { SCOPED_TRACE("gelu_mul"); expect_close(out.host(), want, tolerance_for(dt)); }

      out.poison();
      be().add({.out = out, .a = a, .b = b, .b_scale = -0.75f});
      out.download();
      ref::add({.out = want, .a = a.host(), .b = b.host(), .b_scale = -0.75f});
      { SCOPED_TRACE("add"); expect_close(out.host(), want, tolerance_for(dt)); }

      HostTensor want_sum(dt, {n});
      ref::add({.out = want_sum, .a = a.host(), .b = b.host()});
      be().add({.out = a, .a = a, .b = b});  // out aliases a
      a.download();
      { SCOPED_TRACE("add in place"); expect_close(a.host(), want_sum, tolerance_for(dt)); }

      DeviceTensor x(be(), dt, {n});
      fill_random(x.host(), seed++);
      for (int64_t i = 0; i < n; ++i) x.host().set(i, x.host().get(i) * 80.f);  // beyond the cap of 30
      HostTensor want_x(dt, {n});
      want_x.copy_from(x.host());
      x.upload();
      be().softcap({.x = x, .cap = 30.f});
      x.download();
      ref::softcap({.x = want_x, .cap = 30.f});
      { SCOPED_TRACE("softcap"); expect_close(x.host(), want_x, tolerance_for(dt)); }

      be().scale({.x = x, .s = 0.3f});
      x.download();
      ref::scale({.x = want_x, .s = 0.3f});
      { SCOPED_TRACE("scale"); expect_close(x.host(), want_x, tolerance_for(dt)); }
    }
  }
}

TEST_F(CudaOps, ArgmaxMatchesReferenceWithTiesAndNaN) {
  uint32_t seed = 500;
  for (DType dt : {kBF16, kF32}) {
    for (int64_t rows : {1, 3, 17}) {
      for (int64_t n : {5, 67, 262144}) {  // 5: fewer values than the blocks of a row's cluster
        SCOPED_TRACE(strfmt("%s rows %lld n %lld", dtype_name(dt), static_cast<long long>(rows),
                            static_cast<long long>(n)));
        DeviceTensor x(be(), dt, {rows, n}), out(be(), kI32, {rows});
        fill_random(x.host(), seed++);
        // Row 0: the maximum twice (the lower index must win). Row 1: a NaN after a large value (NaN wins).
        x.host().set(n / 2, 7.f);
        x.host().set(n - 1, 7.f);
        x.host().set(n / 3, 5.f);
        if (rows > 1) {
          x.host().set(n + 1, 100.f);
          x.host().set(n + n - 2, std::numeric_limits<float>::quiet_NaN());
        }
        x.upload();
        out.poison();
        be().argmax({.out = out, .x = x});
        out.download();
        HostTensor want(kI32, {rows});
        ref::argmax({.out = want, .x = x.host()});
        for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(out.host().geti(r), want.geti(r)) << "row " << r;
        EXPECT_EQ(out.host().geti(0), n / 2);
      }
    }
  }
}

TEST_F(CudaOps, ArgmaxByIdAndCentroidCandidatesMatchTheHost) {
  // The masked embedder on the device: argmax with ids (ties and NaNs to the lowest token id) over 4096 candidates,
  // and centroid_candidates over 2048 (and 37) clusters with ties and a NaN, against the host reference.
  uint32_t seed = 600;
  for (DType dt : {kBF16, kF32}) {
    SCOPED_TRACE(dtype_name(dt));
    const int64_t n = 4096;
    DeviceTensor x(be(), dt, {1, n}), ids(be(), kI32, {n}), out(be(), kI32, {1});
    fill_random(x.host(), seed++);
    for (int64_t i = 0; i < n; ++i) ids.host().seti(i, static_cast<int32_t>((i * 2654435761u) % 262144u));
    x.host().set(100, 9.f);
    x.host().set(3000, 9.f);
    for (DeviceTensor* t : {&x, &ids}) t->upload();
    for (int pass = 0; pass < 2; ++pass) {
      if (pass == 1) {
        x.host().set(50, std::numeric_limits<float>::quiet_NaN());
        x.host().set(4000, std::numeric_limits<float>::quiet_NaN());
        x.upload();
      }
      out.poison();
      be().argmax({.out = out, .x = x, .ids = ids});
      out.download();
      HostTensor want(kI32, {1});
      ref::argmax({.out = want, .x = x.host(), .ids = ids.host()});
      EXPECT_EQ(out.host().geti(0), want.geti(0)) << "pass " << pass;
    }
    for (int64_t C : {int64_t{2048}, int64_t{37}}) {
      const int64_t m = C == 2048 ? 128 : 5;
      const int k = C == 2048 ? 32 : 7;
      DeviceTensor logits(be(), dt, {1, C}), ordering(be(), kI32, {C * m}), cand(be(), kI32, {k * m});
      fill_random(logits.host(), seed++);
      logits.host().set(C / 2, 5.f);
      logits.host().set(C - 1, 5.f);
      logits.host().set(3, std::numeric_limits<float>::quiet_NaN());
      for (int64_t i = 0; i < C * m; ++i) ordering.host().seti(i, static_cast<int32_t>((i * 7919) % (C * m)));
      for (DeviceTensor* t : {&logits, &ordering}) t->upload();
      cand.poison();
      be().centroid_candidates({.ids = cand, .logits = logits, .ordering = ordering, .k = k});
      cand.download();
      std::vector<float> lv(static_cast<size_t>(C));
      for (int64_t i = 0; i < C; ++i) lv[static_cast<size_t>(i)] = logits.host().get(i);
      const std::vector<int> top = top_clusters(lv, k);
      for (int j = 0; j < k; ++j)
        for (int64_t i = 0; i < m; ++i)
          ASSERT_EQ(cand.host().geti(j * m + i), ordering.host().geti(top[static_cast<size_t>(j)] * m + i))
              << "clusters " << C << ", rank " << j;
    }
  }
}

}  // namespace
}  // namespace tandem::testing
