// per_layer_input (ops.h PerLayerInputArgs) on the GPU: the one-launch cluster kernel must give the bits of the
// composite op (rms_norm, linear_gelu_mul, linear, rms_norm_then on the GEMV) at E2B's and E4B's widths for a decode
// step and verify passes of up to 9 tokens, with and without the next layer's input norm, bf16 and f32 norm
// weights; shapes it does not take run the composite.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/strings.h"
#include "cuda/cuda_fixture.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
constexpr DType kF32 = DType::kF32;

using CudaPerLayerInput = CudaTest;

// One block of random inputs; fused() and composite() run it from the same starting x.
struct Block {
  Block(cuda::CudaBackend& be, int64_t rows, int64_t d, DType norm_dtype, uint32_t seed)
      : x0(be, kBF16, {rows, d}),
        f(be, kBF16, {rows, d}),
        ple_all(be, kBF16, {rows, 3 * 256}),
        gate(be, kBF16, {256, d}),
        proj(be, kBF16, {d, 256}),
        w_ffn(be, norm_dtype, {d}),
        w_post(be, norm_dtype, {d}),
        w_next(be, kBF16, {d}) {
    for (DeviceTensor* t : {&x0, &f, &ple_all, &gate, &proj}) fill_random(t->host(), seed++);
    std::mt19937 rng(seed);
    for (DeviceTensor* w : {&w_ffn, &w_post, &w_next}) w->host().fill_uniform(rng, 0.5f, 1.5f);
    for (DeviceTensor* t : {&x0, &f, &ple_all, &gate, &proj, &w_ffn, &w_post, &w_next}) t->upload();
  }
  // Layer 1's per-layer inputs: columns [256, 512) of ple_all (row-strided, as the model passes them).
  [[nodiscard]] Tensor ple() const {
    Tensor p = ple_all.t();
    p.shape[1] = 256;
    p.data = static_cast<char*>(p.data) + 256 * dtype_size(kBF16);
    return p;
  }
  DeviceTensor x0, f, ple_all, gate, proj, w_ffn, w_post, w_next;
};

struct Outputs {
  Outputs(cuda::CudaBackend& be, const Block& b, int64_t rows, int64_t d)
      : x(be, kBF16, {rows, d}),
        xn(be, kBF16, {rows, d}),
        gate_out(be, kBF16, {rows, 256}),
        proj_out(be, kBF16, {rows, d}) {
    x.host().copy_from(b.x0.host());
    x.upload();
    xn.poison();
  }
  PerLayerInputArgs args(const Block& b, bool next) const {
    return {.x = x,
            .f = b.f,
            .post_ffn_norm = b.w_ffn,
            .gate = b.gate,
            .ple = b.ple(),
            .proj = b.proj,
            .post_norm = b.w_post,
            .layer_scalar = 0.71f,
            .eps = 1e-6f,
            .gate_out = gate_out,
            .proj_out = proj_out,
            .next_out = next ? xn.t() : Tensor(),
            .next_norm = next ? b.w_next.t() : Tensor(),
            // The prefetch hint for the next layer (this block's own weights will do): it changes no bit.
            .next_gate = next ? b.gate.t() : Tensor(),
            .next_proj = next ? b.proj.t() : Tensor()};
  }
  DeviceTensor x, xn, gate_out, proj_out;
};

TEST_F(CudaPerLayerInput, OneLaunchEqualsTheCompositeBitwise) {
  GemvOn gemv(be());
  uint32_t seed = 4100;
  struct Case {
    int64_t rows, d;
    DType norm_dtype;
    bool next;
  };
  std::vector<Case> cases;
  for (int64_t d : {1536, 2560})
    for (DType nd : {kBF16, kF32})
      for (bool next : {true, false}) cases.push_back({1, d, nd, next});
  for (int64_t rows : {2, 3, 5, 8, 9})
    for (int64_t d : {1536, 2560}) cases.push_back({rows, d, rows % 2 ? kBF16 : kF32, rows != 8});
  for (int64_t d : {1536, 2560})
    std::printf("per_layer_input at d %lld: %d clusters at once\n", static_cast<long long>(d),
                cuda::per_layer_input_max_clusters(d));
  int fused_passes = 0, n = 0;
  for (const Case& c : cases) {
    // The next layer's weights asked into L2 or not, in turn.
    const bool prefetch = n++ % 2 == 0;
    cuda::set_per_layer_input_prefetch(prefetch);
    SCOPED_TRACE(strfmt("%lld rows, d %lld, %s norm weights, next norm %d, prefetch %d", static_cast<long long>(c.rows),
                        static_cast<long long>(c.d), dtype_name(c.norm_dtype), c.next, prefetch));
    const Block b(be(), c.rows, c.d, c.norm_dtype, seed);
    seed += 16;
    Outputs want(be(), b, c.rows, c.d), got(be(), b, c.rows, c.d);
    be().Backend::per_layer_input(want.args(b, c.next));
    const PerLayerInputArgs a = got.args(b, c.next);
    // One token always fuses on sm_90; a verify pass fuses while its clusters (one per token) take at most two
    // thirds of those that fit at once.
    const bool fusable = cuda::per_layer_input_fusable(a);
    if (c.rows == 1) {
      ASSERT_TRUE(fusable) << "this GPU does not take the one-launch kernel";
    }
    fused_passes += c.rows > 1 && fusable;
    be().per_layer_input(a);
    for (Outputs* o : {&want, &got})
      for (DeviceTensor* t : {&o->x, &o->xn}) t->download();
    EXPECT_TRUE(same_bits(got.x.host(), want.x.host())) << "x";
    EXPECT_FALSE(same_bits(got.x.host(), b.x0.host())) << "x unchanged";
    if (c.next) {
      EXPECT_TRUE(same_bits(got.xn.host(), want.xn.host())) << "next input norm";
    }
    ASSERT_TRUE(be().last_error().ok()) << be().last_error().to_string();
  }
  cuda::set_per_layer_input_prefetch(true);
  EXPECT_GT(fused_passes, 0) << "no verify pass took the one-launch kernel";
}

TEST_F(CudaPerLayerInput, OtherShapesRunTheComposite) {
  // Ten tokens (past the GEMV's rows) and a width that is not a multiple of 256: not fusable, same bits as the
  // composite.
  GemvOn gemv(be());
  uint32_t seed = 4300;
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{10, 1536}, std::pair<int64_t, int64_t>{1, 1288}}) {
    SCOPED_TRACE(strfmt("rows %lld d %lld", static_cast<long long>(rows), static_cast<long long>(d)));
    const Block b(be(), rows, d, kBF16, seed);
    seed += 16;
    Outputs want(be(), b, rows, d), got(be(), b, rows, d);
    const PerLayerInputArgs a = got.args(b, true);
    EXPECT_FALSE(cuda::per_layer_input_fusable(a));
    be().Backend::per_layer_input(want.args(b, true));
    be().per_layer_input(a);
    for (Outputs* o : {&want, &got})
      for (DeviceTensor* t : {&o->x, &o->xn}) t->download();
    EXPECT_TRUE(same_bits(got.x.host(), want.x.host()));
    EXPECT_TRUE(same_bits(got.xn.host(), want.xn.host()));
  }
  EXPECT_TRUE(be().last_error().ok()) << be().last_error().to_string();
}

}  // namespace
}  // namespace tandem::testing
