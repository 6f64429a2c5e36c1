// The verify-pass products on the tensor cores (gemv_tc.cu): linear, linear_group, geglu and linear_gelu_mul of
// 2..9 rows with K % 32 == 0 and at least 2M weights, against ref::linear and bitwise against their own composites;
// the sums of a row do not depend on the other rows; switched off, the CUDA-core GEMV takes the same shapes;
// gemm.cu's per-shape timing with the CUDA cores as a third candidate. Every shape asserts that the tensor-core path
// takes it, so a silent fallback cannot pass.
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/strings.h"
#include "cuda/cuda_fixture.h"
#include "kernels/ref/ref.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
constexpr DType kF32 = DType::kF32;

using CudaGemvTc = CudaTest;

// Pins the GEMV, the tensor-core switch and its K split for a test, with the tensor cores taking products from two
// rows (the kernel's fewest; the default is 3), then restores them.
struct TcMode {
  TcMode(cuda::CudaBackend& be, bool tc, bool split = true)
      : gemv(be),
        tc_before(cuda::gemv_tc()),
        split_before(cuda::gemv_tc_split()),
        min_rows_before(cuda::gemv_tc_min_rows()) {
    cuda::set_gemv_tc(tc);
    cuda::set_gemv_tc_split(split);
    cuda::set_gemv_tc_min_rows(2);
  }
  ~TcMode() {
    cuda::set_gemv_tc(tc_before);
    cuda::set_gemv_tc_split(split_before);
    cuda::set_gemv_tc_min_rows(min_rows_before);
  }
  TcMode(const TcMode&) = delete;
  TcMode& operator=(const TcMode&) = delete;
  GemvOn gemv;
  bool tc_before, split_before;
  int min_rows_before;
};

struct Shape {
  int64_t n_in, n_out;
};
// K from one step per warp to 31B's 5376 (1 to 8 warps, shares that are not multiples of the unrolled steps); N not
// a multiple of the 16 rows of a block; from 2049 strips (one block each) to 25 (K split over clusters of 8).
constexpr Shape kShapes[] = {{64, 32776}, {1536, 1384}, {4096, 520}, {5376, 392}};

TEST_F(CudaGemvTc, LinearMatchesReferenceAtEveryVerifySize) {
  uint32_t seed = 9000;
  // Tensor cores with and without the K split, then the CUDA cores.
  for (auto [tc, split] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, true}}) {
    TcMode mode(be(), tc, split);
    for (const Shape& s : kShapes) {
      for (int64_t n_tok = 2; n_tok <= 9; ++n_tok) {
        const DType out_dt = n_tok % 2 ? kF32 : kBF16;
        const bool accumulate = n_tok % 3 == 0;
        SCOPED_TRACE(strfmt("tc %d split %d K %lld N %lld T %lld", tc, split, static_cast<long long>(s.n_in),
                            static_cast<long long>(s.n_out), static_cast<long long>(n_tok)));
        EXPECT_EQ(cuda::gemv_tc_takes(n_tok, s.n_in, s.n_out), tc);
        // The GEMV must take it (check_linear asserts the path); against ref::linear.
        check_linear(be(), {s.n_in, s.n_out, kBF16, kBF16, out_dt, cuda::LinearPath::kGemv}, n_tok, accumulate, seed);
        seed += 3;
      }
    }
  }
}

TEST_F(CudaGemvTc, RowSumsDoNotDependOnTheOtherRows) {
  // The first two rows of a 9-row product (two n tiles) equal a 2-row product of those rows, bit for bit.
  TcMode mode(be(), true);
  const int64_t K = 1536, N = 1384;
  DeviceTensor x9(be(), kBF16, {9, K}), x2(be(), kBF16, {2, K}), w(be(), kBF16, {N, K});
  DeviceTensor out9(be(), kBF16, {9, N}), out2(be(), kBF16, {2, N});
  fill_random(x9.host(), 9100);
  fill_random(w.host(), 9101);
  for (int64_t i = 0; i < 2 * K; ++i) x2.host().set(i, x9.host().get(i));
  for (DeviceTensor* t : {&x9, &x2, &w}) t->upload();
  out9.poison();
  out2.poison();
  ASSERT_TRUE(cuda::gemv_tc_takes(2, K, N));
  be().linear({.out = out9, .x = x9, .w = w});
  be().linear({.out = out2, .x = x2, .w = w});
  out9.download();
  out2.download();
  for (int64_t j = 0; j < 2 * N; ++j) ASSERT_EQ(out2.host().get(j), out9.host().get(j)) << "element " << j;
}

TEST_F(CudaGemvTc, FusedProductsEqualTheirCompositesBitwise) {
  // geglu and linear_gelu_mul in one launch give the bits of their linear() + gelu_mul composites on the same
  // path, and a q/k/v group matches the reference.
  TcMode mode(be(), true);
  const int rows_before = be().fused_gemv_rows();
  be().set_fused_gemv_rows(9);
  const int64_t K = 1536, N = 1384;
  uint32_t seed = 9200;
  for (int64_t n_tok : {2, 5, 8, 9}) {
    SCOPED_TRACE(strfmt("%lld rows", static_cast<long long>(n_tok)));
    ASSERT_TRUE(cuda::gemv_tc_takes(n_tok, K, N));
    DeviceTensor x(be(), kBF16, {n_tok, K}), wg(be(), kBF16, {N, K}), wu(be(), kBF16, {N, K});
    DeviceTensor fused(be(), kBF16, {n_tok, N}), up(be(), kBF16, {n_tok, N}), comp(be(), kBF16, {n_tok, N});
    fill_random(x.host(), seed);
    fill_random(wg.host(), seed + 1);
    fill_random(wu.host(), seed + 2);
    seed += 3;
    for (DeviceTensor* t : {&x, &wg, &wu}) t->upload();
    fused.poison();
    comp.poison();
    ASSERT_TRUE(cuda::geglu_gemv_eligible({.out = fused, .x = x, .w_gate = wg, .w_up = wu, .up = up}, 9));
    be().geglu({.out = fused, .x = x, .w_gate = wg, .w_up = wu, .up = up});
    be().Backend::geglu({.out = comp, .x = x, .w_gate = wg, .w_up = wu, .up = up});
    fused.download();
    comp.download();
    EXPECT_TRUE(same_bits(fused.host(), comp.host())) << "geglu";
    HostTensor g(kBF16, {n_tok, N}), u(kBF16, {n_tok, N}), want(kBF16, {n_tok, N});
    ref::linear({.out = g, .x = x.host(), .w = wg.host()});
    ref::linear({.out = u, .x = x.host(), .w = wu.host()});
    ref::gelu_mul({.out = want, .gate = g, .up = u});
    expect_close(fused.host(), want, tolerance_for(kBF16, true));

    // linear_gelu_mul with up = u (the up product above, as a separate tensor).
    fused.poison();
    comp.poison();
    up.host().copy_from(u);
    up.upload();
    be().linear_gelu_mul({.out = fused, .x = x, .w = wg, .up = up});
    be().linear({.out = comp, .x = x, .w = wg});
    be().gelu_mul({.out = comp, .gate = comp, .up = up});
    fused.download();
    comp.download();
    EXPECT_TRUE(same_bits(fused.host(), comp.host())) << "linear_gelu_mul";

    // q, k and v of one x in one launch (the small k and v ride on q's tensor-core launch).
    const int64_t n_out[3] = {1384, 264, 264};
    std::vector<std::unique_ptr<DeviceTensor>> w, out;
    LinearGroupArgs group{.x = x};
    for (int i = 0; i < 3; ++i) {
      w.push_back(std::make_unique<DeviceTensor>(be(), kBF16, std::initializer_list<int64_t>{n_out[i], K}));
      out.push_back(std::make_unique<DeviceTensor>(be(), kF32, std::initializer_list<int64_t>{n_tok, n_out[i]}));
      fill_random(w.back()->host(), seed++);
      w.back()->upload();
      out.back()->poison();
      group.w[i] = *w.back();
      group.out[i] = *out.back();
    }
    group.n = 3;
    be().linear_group(group);
    for (int i = 0; i < 3; ++i) {
      out[static_cast<size_t>(i)]->download();
      HostTensor want_i(kF32, {n_tok, n_out[i]});
      ref::linear({.out = want_i, .x = x.host(), .w = w[static_cast<size_t>(i)]->host()});
      expect_close(out[static_cast<size_t>(i)]->host(), want_i, tolerance_for(kF32, true));
    }
  }
  be().set_fused_gemv_rows(rows_before);
}

TEST_F(CudaGemvTc, AutoModeTimesTheCudaCoresToo) {
  // kAuto with the tensor cores on: the first product of a shape they take times them, the CUDA-core GEMV and
  // cuBLASLt, and every later call takes the winner: bit-identical repeats that match the reference. (The shape is
  // used by no other test, so its timing runs here.)
  TcMode mode(be(), true);
  ASSERT_TRUE(cuda::gemv_tc_takes(5, 1536, 1400));
  check_auto_linear(be(), 5, 1400, 1536, 9300, "gemv auto, tensor cores on");
}

TEST_F(CudaGemvTc, SmallOrUnevenShapesKeepTheCudaCores) {
  TcMode mode(be(), true);
  EXPECT_FALSE(cuda::gemv_tc_takes(1, 1536, 12288)) << "one token";
  EXPECT_FALSE(cuda::gemv_tc_takes(10, 1536, 12288)) << "past the GEMV's rows";
  EXPECT_FALSE(cuda::gemv_tc_takes(5, 1544, 12288)) << "K % 32 != 0";
  EXPECT_FALSE(cuda::gemv_tc_takes(5, 1536, 256)) << "the per-layer-input gate: under 2M weights";
  EXPECT_TRUE(cuda::gemv_tc_takes(5, 1536, 12288));
  // TANDEM_GEMV_TC_MIN_ROWS: two rows back on the CUDA cores, three still on the tensor cores; 10 turns it off.
  const int min_before = cuda::gemv_tc_min_rows();
  cuda::set_gemv_tc_min_rows(3);
  EXPECT_FALSE(cuda::gemv_tc_takes(2, 1536, 12288));
  EXPECT_TRUE(cuda::gemv_tc_takes(3, 1536, 12288));
  cuda::set_gemv_tc_min_rows(10);
  EXPECT_FALSE(cuda::gemv_tc_takes(9, 1536, 12288));
  cuda::set_gemv_tc_min_rows(min_before);
}

}  // namespace
}  // namespace tandem::testing
