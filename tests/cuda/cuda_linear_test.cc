// CUDA linear() parity against ref::linear: the GEMV kernel (1..9 bf16 rows), the cuBLASLt path (bf16 operands
// with 16-byte aligned rows; more rows, or the GEMV switched off) and the plain kernel (odd K or N, misaligned views, f32 operands), with alpha and accumulate, odd token counts, and the
// per-shape plan cache. Which path ran is asserted, so a silent fallback cannot pass for cuBLASLt.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/strings.h"
#include "cuda/cuda_fixture.h"
#include "kernels/ref/ref.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
constexpr DType kF32 = DType::kF32;
using cuda::LinearPath;

using CudaLinear = CudaTest;

using Case = LinearCase;

TEST_F(CudaLinear, MatchesReferenceOnBothPaths) {
  const Case cases[] = {
      {1544, 264, kBF16, kBF16, kBF16, LinearPath::kCublasLt},
      {1544, 264, kBF16, kBF16, kF32, LinearPath::kCublasLt},
      {1544, 257, kBF16, kBF16, kBF16, LinearPath::kSimple},  // odd N: out rows not 16-byte aligned
      {1544, 257, kBF16, kBF16, kF32, LinearPath::kSimple},
      {67, 40, kBF16, kBF16, kBF16, LinearPath::kSimple},  // odd K
      {67, 40, kF32, kBF16, kF32, LinearPath::kSimple},    // f32 activations (CPU-style)
      {1544, 264, kF32, kF32, kF32, LinearPath::kSimple},  // f32 weights
      {1544, 264, kBF16, kF32, kBF16, LinearPath::kSimple},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    for (int64_t n_tok : {1, 3, 17}) {
      for (bool accumulate : {false, true}) {
        check_linear(be(), c, n_tok, accumulate, seed);
        seed += 3;
      }
    }
  }
}

TEST_F(CudaLinear, GemvMatchesReferenceAtEveryDecodeAndVerifySize) {
  // Every token count the GEMV kernel takes (1..9), with N not a multiple of any rows-per-block choice, small and
  // large N (the kernel picks 1, 2, 4 or 8 rows per block), K from one 16-byte chunk per thread to several, bf16
  // and f32 out, alpha and accumulate; then the same shapes with the GEMV off (cuBLASLt).
  const Case cases[] = {
      {8, 5, kBF16, kBF16, kBF16, LinearPath::kCublasLt},       // K = one chunk
      {2056, 131, kBF16, kBF16, kBF16, LinearPath::kCublasLt},   // N odd: cuBLASLt cannot, the GEMV can
      {5376, 4104, kBF16, kBF16, kF32, LinearPath::kCublasLt},   // 31B-like K, N = 4104 (1-2 rows per block)
      {1536, 8200, kBF16, kBF16, kBF16, LinearPath::kCublasLt},  // 4-8 rows per block
  };
  uint32_t seed = 100;
  for (const Case& c0 : cases) {
    Case c = c0;
    for (int64_t n_tok = 1; n_tok <= 9; ++n_tok) {
      for (bool accumulate : {false, true}) {
        c.path = c0.n_out % 8 == 0 ? LinearPath::kCublasLt : LinearPath::kSimple;  // what runs with the GEMV off
        if (c.out == kF32 && c0.n_out % 4 == 0) c.path = LinearPath::kCublasLt;
        check_linear(be(), {c.n_in, c.n_out, c.x, c.w, c.out, c.path}, n_tok, accumulate, seed, /*gemv=*/false);
        Case g = c;
        g.path = LinearPath::kGemv;
        check_linear(be(), g, n_tok, accumulate, seed + 1);
        seed += 3;
      }
    }
  }
}

TEST_F(CudaLinear, MisalignedViewTakesThePlainKernel) {
  const int64_t n_tok = 3, n_in = 1544, n_out = 264;
  DeviceTensor xb(be(), kBF16, {n_tok * n_in + 4}), w(be(), kBF16, {n_out, n_in}), out(be(), kBF16, {n_tok, n_out});
  fill_random(xb.host(), 9);
  fill_random(w.host(), 10);
  xb.upload();
  w.upload();
  out.poison();
  // x starts 8 bytes into its buffer.
  const Tensor x = Tensor::make(static_cast<uint16_t*>(xb.t().data) + 4, kBF16, {n_tok, n_in}, be().device());
  const LinearArgs args{.out = out, .x = x, .w = w};
  Result<LinearPath> path = be().linear_path(args);
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, LinearPath::kSimple);
  be().linear(args);
  out.download();
  HostTensor xh(kBF16, {n_tok, n_in}), want(kBF16, {n_tok, n_out});
  for (int64_t i = 0; i < n_tok * n_in; ++i) xh.set(i, xb.host().get(i + 4));
  ref::linear({.out = want, .x = xh, .w = w.host()});
  expect_close(out.host(), want, tolerance_for(kBF16, true));
}

TEST_F(CudaLinear, BatchedInputAndPlanCache) {
  DeviceTensor x(be(), kBF16, {2, 29, 1544}), w(be(), kBF16, {264, 1544}), out(be(), kBF16, {2, 29, 264});
  fill_random(x.host(), 21);
  fill_random(w.host(), 22);
  x.upload();
  w.upload();
  const LinearArgs args{.out = out, .x = x, .w = w};
  const size_t before = be().gemm_plan_count();
  for (int i = 0; i < 3; ++i) {
    out.poison();
    be().linear(args);
  }
  EXPECT_EQ(be().gemm_plan_count(), before + 1) << "one plan for the shape [58, 1544] x [264, 1544]^T";
  Result<LinearPath> path = be().linear_path(args);
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(*path, LinearPath::kCublasLt);
  out.download();
  HostTensor want(kBF16, {2, 29, 264});
  ref::linear({.out = want, .x = x.host(), .w = w.host()});
  expect_close(out.host(), want, tolerance_for(kBF16, true));
}

}  // namespace
}  // namespace tandem::testing

namespace tandem::testing {
namespace {

TEST_F(CudaLinear, AutoModeTimesEachDecodeShapeOnceAndSticksToTheWinner) {
  // kAuto: the first product of a 2-9 row bf16 shape times the GEMV kernel against cuBLASLt and keeps the faster (one
  // row takes the GEMV untimed); every later call takes the same path, so repeated outputs are bit-identical, and
  // both match the reference.
  for (int64_t n_tok : {1, 2, 5, 9}) check_auto_linear(be(), n_tok, 1032, 2048, 51, "gemv auto");
}

TEST_F(CudaLinear, GegluEqualsItsCompositeBitwise) {
  // The fused GeGLU (1..fused_gemv_rows rows) gives the bits of linear + linear + gelu_mul on the GEMV path, and
  // the composite (more rows) matches the reference; N odd and not a multiple of the rows per block.
  const cuda::GemvMode before = be().gemv_mode();
  const int rows_before = be().fused_gemv_rows();
  for (int max_rows : {2, 9})
    for (int64_t n_tok : {1, 2, 3, 5, 9}) {
      SCOPED_TRACE(strfmt("fused up to %d rows, %lld rows", max_rows, static_cast<long long>(n_tok)));
      be().set_fused_gemv_rows(max_rows);
      const int64_t K = 1544, N = 1037;
      DeviceTensor x(be(), kBF16, {n_tok, K}), wg(be(), kBF16, {N, K}), wu(be(), kBF16, {N, K});
      DeviceTensor out(be(), kBF16, {n_tok, N}), up(be(), kBF16, {n_tok, N}), ref_out(be(), kBF16, {n_tok, N});
      fill_random(x.host(), 61);
      fill_random(wg.host(), 62);
      fill_random(wu.host(), 63);
      x.upload();
      wg.upload();
      wu.upload();
      out.poison();
      be().set_gemv_mode(cuda::GemvMode::kAuto);
      be().geglu({.out = out, .x = x, .w_gate = wg, .w_up = wu, .up = up});
      out.download();
      be().set_gemv_mode(cuda::GemvMode::kOn);
      ref_out.poison();
      be().Backend::geglu({.out = ref_out, .x = x, .w_gate = wg, .w_up = wu, .up = up});
      ref_out.download();
      be().set_gemv_mode(before);
      be().set_fused_gemv_rows(rows_before);
      if (n_tok <= max_rows) {
        for (int64_t j = 0; j < n_tok * N; ++j) ASSERT_EQ(out.host().get(j), ref_out.host().get(j)) << "element " << j;
      }
      HostTensor g(kBF16, {n_tok, N}), u(kBF16, {n_tok, N}), want(kBF16, {n_tok, N});
      ref::linear({.out = g, .x = x.host(), .w = wg.host()});
      ref::linear({.out = u, .x = x.host(), .w = wu.host()});
      ref::gelu_mul({.out = want, .gate = g, .up = u});
      expect_close(out.host(), want, tolerance_for(kBF16, true));
    }
}

TEST_F(CudaLinear, GroupEqualsSeparateProductsBitwise) {
  // linear_group (q, k, v of one x) in one GEMV launch for 1..fused_gemv_rows rows gives the bits of one GEMV
  // linear() per matrix, for bf16 and f32 outputs and segment sizes that are not multiples of the rows per block;
  // more rows take the composite (one linear() each, as the mode picks) and match the reference.
  const cuda::GemvMode before = be().gemv_mode();
  const int rows_before = be().fused_gemv_rows();
  const int64_t K = 1544;
  const int64_t n_out[3] = {2056, 517, 264};
  for (int max_rows : {2, 9})
    for (DType out_dt : {kBF16, kF32}) {
      for (int64_t n_tok : {1, 2, 3, 9}) {
        for (int n : {1, 2, 3}) {
          SCOPED_TRACE(strfmt("fused up to %d rows, out %s, %lld rows, %d products", max_rows, dtype_name(out_dt),
                              static_cast<long long>(n_tok), n));
          DeviceTensor x(be(), kBF16, {n_tok, K});
          fill_random(x.host(), 70);
          x.upload();
          std::vector<std::unique_ptr<DeviceTensor>> w, out, sep;
          LinearGroupArgs group{.x = x};
          for (int i = 0; i < n; ++i) {
            w.push_back(std::make_unique<DeviceTensor>(be(), kBF16, std::initializer_list<int64_t>{n_out[i], K}));
            out.push_back(
                std::make_unique<DeviceTensor>(be(), out_dt, std::initializer_list<int64_t>{n_tok, n_out[i]}));
            sep.push_back(
                std::make_unique<DeviceTensor>(be(), out_dt, std::initializer_list<int64_t>{n_tok, n_out[i]}));
            fill_random(w.back()->host(), 71 + static_cast<uint32_t>(i));
            w.back()->upload();
            out.back()->poison();
            sep.back()->poison();
            group.out[i] = *out.back();
            group.w[i] = *w.back();
          }
          group.n = n;
          be().set_gemv_mode(cuda::GemvMode::kAuto);
          be().set_fused_gemv_rows(max_rows);
          be().linear_group(group);
          be().set_fused_gemv_rows(rows_before);
          be().set_gemv_mode(cuda::GemvMode::kOn);
          for (int i = 0; i < n; ++i)
            be().linear({.out = *sep[static_cast<size_t>(i)], .x = x, .w = *w[static_cast<size_t>(i)]});
          be().set_gemv_mode(before);
          for (int i = 0; i < n; ++i) {
            out[static_cast<size_t>(i)]->download();
            sep[static_cast<size_t>(i)]->download();
            const HostTensor& got = out[static_cast<size_t>(i)]->host();
            if (n_tok <= max_rows) {
              for (int64_t j = 0; j < n_tok * n_out[i]; ++j)
                ASSERT_EQ(got.get(j), sep[static_cast<size_t>(i)]->host().get(j))
                    << "product " << i << " element " << j;
            }
            HostTensor want(out_dt, {n_tok, n_out[i]});
            ref::linear({.out = want, .x = x.host(), .w = w[static_cast<size_t>(i)]->host()});
            expect_close(got, want, tolerance_for(out_dt, true));
          }
        }
      }
    }
}

TEST_F(CudaLinear, LinearGeluMulEqualsItsCompositeBitwise) {
  // linear_gelu_mul (the per-layer-input gate: gelu(x W^T) * up, up one layer's block of a wider row) in one GEMV
  // launch for 1..fused_gemv_rows rows gives the bits of a GEMV linear() then gelu_mul, for bf16 and f32 outputs;
  // more rows take the composite and match the reference.
  const cuda::GemvMode before = be().gemv_mode();
  const int rows_before = be().fused_gemv_rows();
  const int64_t K = 1536, N = 256, layers = 3, layer = 1;
  for (int max_rows : {2, 9})
    for (DType out_dt : {kBF16, kF32}) {
      for (int64_t n_tok : {1, 2, 3, 7}) {
        SCOPED_TRACE(strfmt("fused up to %d rows, out %s, %lld rows", max_rows, dtype_name(out_dt),
                            static_cast<long long>(n_tok)));
        DeviceTensor x(be(), kBF16, {n_tok, K}), w(be(), kBF16, {N, K}), ple(be(), out_dt, {n_tok, layers * N});
        DeviceTensor got(be(), out_dt, {n_tok, N}), sep(be(), out_dt, {n_tok, N});
        fill_random(x.host(), 80);
        fill_random(w.host(), 81);
        fill_random(ple.host(), 82);
        for (DeviceTensor* t : {&x, &w, &ple}) t->upload();
        got.poison();
        sep.poison();
        Tensor up = ple.t();  // columns [layer N, layer N + N) of each row
        up.shape[1] = N;
        up.data = static_cast<char*>(up.data) + layer * N * static_cast<int64_t>(dtype_size(out_dt));
        be().set_gemv_mode(cuda::GemvMode::kAuto);
        be().set_fused_gemv_rows(max_rows);
        be().linear_gelu_mul({.out = got, .x = x, .w = w, .up = up});
        be().set_fused_gemv_rows(rows_before);
        be().set_gemv_mode(cuda::GemvMode::kOn);
        be().linear({.out = sep, .x = x, .w = w});
        be().gelu_mul({.out = sep, .gate = sep, .up = up});
        be().set_gemv_mode(before);
        ASSERT_TRUE(be().synchronize().ok());
        got.download();
        sep.download();
        ple.download();
        if (n_tok <= max_rows) {
          for (int64_t j = 0; j < n_tok * N; ++j) ASSERT_EQ(got.host().get(j), sep.host().get(j)) << "element " << j;
        }
        HostTensor prod(out_dt, {n_tok, N}), want(out_dt, {n_tok, N}), up_h(out_dt, {n_tok, N});
        ref::linear({.out = prod, .x = x.host(), .w = w.host()});
        for (int64_t t = 0; t < n_tok; ++t)
          for (int64_t j = 0; j < N; ++j) up_h.set(t * N + j, ple.host().get(t * layers * N + layer * N + j));
        ref::gelu_mul({.out = want, .gate = prod, .up = up_h});
        expect_close(got.host(), want, tolerance_for(out_dt, true));
      }
    }
}

// TANDEM_GEMV_EARLY_ROWS: the CUDA-core GEMV requests its first weights before the wait for the kernel before it for
// up to gemv_early_rows() rows. Requested early or not, every row count gives the same bits (GEMV forced, tensor
// cores off; K from one pass to several, over 2048 chunks (never early), bf16 and f32 out).
TEST_F(CudaLinear, EarlyWeightRequestsKeepTheBitsAtEveryRowCount) {
  const GemvOn gemv(be());
  const bool tc_before = cuda::gemv_tc();
  const int early_before = cuda::gemv_early_rows();
  cuda::set_gemv_tc(false);
  struct Shape {
    int64_t n_in, n_out;
    DType out;
  };
  uint32_t seed = 300;
  for (const Shape& s : {Shape{1544, 1037, kBF16}, Shape{5376, 264, kF32}, Shape{16392, 72, kBF16}}) {
    for (int64_t n_tok = 1; n_tok <= 9; ++n_tok) {
      SCOPED_TRACE(strfmt("K %lld, N %lld, %lld rows", static_cast<long long>(s.n_in), static_cast<long long>(s.n_out),
                          static_cast<long long>(n_tok)));
      DeviceTensor x(be(), kBF16, {n_tok, s.n_in}), w(be(), kBF16, {s.n_out, s.n_in});
      DeviceTensor early(be(), s.out, {n_tok, s.n_out}), late(be(), s.out, {n_tok, s.n_out});
      fill_random(x.host(), seed++);
      fill_random(w.host(), seed++);
      x.upload();
      w.upload();
      early.poison();
      late.poison();
      cuda::set_gemv_early_rows(9);
      be().linear({.out = early, .x = x, .w = w});
      cuda::set_gemv_early_rows(1);
      be().linear({.out = late, .x = x, .w = w});
      early.download();
      late.download();
      EXPECT_TRUE(same_bits(early.host(), late.host()));
      HostTensor want(s.out, {n_tok, s.n_out});
      ref::linear({.out = want, .x = x.host(), .w = w.host()});
      expect_close(early.host(), want, tolerance_for(s.out, true));
    }
  }
  cuda::set_gemv_early_rows(early_before);
  cuda::set_gemv_tc(tc_before);
}

// w_fresh: w gathered by the op just before (the centroid head's candidate rows) is read after that op ends. Four
// gathers into one buffer, each followed at once by the product that reads it; each product must see its own rows.
TEST_F(CudaLinear, FreshWeightsAreReadAfterTheOpThatWritesThem) {
  constexpr int kRounds = 4;
  const int64_t n_vocab = 4096, n_in = 1536, n_cand = 512;
  DeviceTensor table(be(), kBF16, {n_vocab, n_in}), x(be(), kBF16, {1, n_in}), emb(be(), kBF16, {n_cand, n_in});
  fill_random(table.host(), 41);
  fill_random(x.host(), 42);
  table.upload();
  x.upload();
  std::vector<std::unique_ptr<DeviceTensor>> ids, out;
  std::mt19937 rng(43);
  for (int r = 0; r < kRounds; ++r) {
    ids.push_back(std::make_unique<DeviceTensor>(be(), DType::kI32, std::initializer_list<int64_t>{n_cand}));
    out.push_back(std::make_unique<DeviceTensor>(be(), kBF16, std::initializer_list<int64_t>{1, n_cand}));
    for (int64_t i = 0; i < n_cand; ++i) ids[r]->host().seti(i, static_cast<int32_t>(rng() % n_vocab));
    ids[r]->upload();
    out[r]->poison();
  }
  for (int r = 0; r < kRounds; ++r) {
    be().embedding({.out = emb, .table = table, .ids = *ids[r], .scale = 1.f});
    be().linear({.out = *out[r], .x = x, .w = emb, .w_fresh = true});
  }
  for (int r = 0; r < kRounds; ++r) {
    SCOPED_TRACE(strfmt("round %d", r));
    out[r]->download();
    HostTensor rows(kBF16, {n_cand, n_in}), want(kBF16, {1, n_cand});
    ref::embedding({.out = rows, .table = table.host(), .ids = ids[r]->host(), .scale = 1.f});
    ref::linear({.out = want, .x = x.host(), .w = rows});
    expect_close(out[r]->host(), want, tolerance_for(kBF16, true));
  }
}

}  // namespace
}  // namespace tandem::testing
