// attn_out_mlp (ops.h AttnOutMlpArgs) on the GPU: the one-launch persistent kernel must give the bits of the
// composite op (linear, rms_norm_then, geglu, linear on the GEMV) at E2B's and E4B's shapes, the double-wide MLP
// included, with bf16 and f32 norm weights, launch after launch (its grid barrier is reused) and from a CUDA graph;
// verify passes run the composite.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/strings.h"
#include "cuda/cuda_fixture.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
constexpr DType kF32 = DType::kF32;

// The kernel is off by default (TANDEM_FUSED_MLP=1): each test turns it on and restores the setting.
class CudaAttnOutMlp : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    was_on_ = cuda::fused_attn_out_mlp();
    cuda::set_fused_attn_out_mlp(true);
  }
  void TearDown() override {
    cuda::set_fused_attn_out_mlp(was_on_);
    CudaTest::TearDown();
  }

 private:
  bool was_on_ = false;
};

struct Shape {
  int64_t rows, d, k_o, ff;
};

// One layer's weights and inputs (random; norm weights in [0.5, 1.5)).
struct Layer {
  Layer(cuda::CudaBackend& be, const Shape& s, DType norm_dtype, uint32_t seed)
      : attn(be, kBF16, {s.rows, s.k_o}),
        o_proj(be, kBF16, {s.d, s.k_o}),
        x0(be, kBF16, {s.rows, s.d}),
        w_post(be, norm_dtype, {s.d}),
        w_pre(be, norm_dtype, {s.d}),
        gate(be, kBF16, {s.ff, s.d}),
        up(be, kBF16, {s.ff, s.d}),
        down(be, kBF16, {s.d, s.ff}) {
    for (DeviceTensor* t : {&attn, &o_proj, &x0, &gate, &up, &down}) fill_random(t->host(), seed++);
    std::mt19937 rng(seed);
    for (DeviceTensor* w : {&w_post, &w_pre}) w->host().fill_uniform(rng, 0.5f, 1.5f);
    for (DeviceTensor* t : {&attn, &o_proj, &x0, &w_post, &w_pre, &gate, &up, &down}) t->upload();
  }
  DeviceTensor attn, o_proj, x0, w_post, w_pre, gate, up, down;
};

// The outputs and scratch of one run, x starting as the layer's x0.
struct Outputs {
  Outputs(cuda::CudaBackend& be, const Layer& l, const Shape& s)
      : o(be, kBF16, {s.rows, s.d}),
        x(be, kBF16, {s.rows, s.d}),
        xn(be, kBF16, {s.rows, s.d}),
        g(be, kBF16, {s.rows, s.ff}),
        u(be, kBF16, {s.rows, s.ff}),
        f(be, kBF16, {s.rows, s.d}) {
    reset(l);
  }
  void reset(const Layer& l) {
    x.host().copy_from(l.x0.host());
    x.upload();
    f.poison();
  }
  AttnOutMlpArgs args(const Layer& l) const {
    return {.attn = l.attn,
            .o_proj = l.o_proj,
            .o = o,
            .x = x,
            .post_attn_norm = l.w_post,
            .xn = xn,
            .pre_ffn_norm = l.w_pre,
            .eps = 1e-6f,
            .gate = l.gate,
            .up = l.up,
            .g = g,
            .u = u,
            .down = l.down,
            .f = f};
  }
  void download() {
    for (DeviceTensor* t : {&x, &g, &f}) t->download();
  }
  DeviceTensor o, x, xn, g, u, f;
};

void expect_same(Outputs& got, Outputs& want) {
  got.download();
  want.download();
  EXPECT_TRUE(same_bits(got.x.host(), want.x.host())) << "x";
  EXPECT_TRUE(same_bits(got.g.host(), want.g.host())) << "g";
  EXPECT_TRUE(same_bits(got.f.host(), want.f.host())) << "f";
}

TEST_F(CudaAttnOutMlp, OneLaunchEqualsTheCompositeBitwise) {
  GemvOn gemv(be());
  uint32_t seed = 5100;
  // E2B (d_ff 6144, double-wide 12288), E4B; bf16 and f32 norm weights.
  const Shape shapes[] = {{1, 1536, 2048, 6144}, {1, 1536, 2048, 12288}, {1, 2560, 2048, 10240}};
  for (const Shape& s : shapes) {
    for (DType nd : {kBF16, kF32}) {
      SCOPED_TRACE(strfmt("d %lld, k_o %lld, d_ff %lld, %s norm weights", static_cast<long long>(s.d),
                          static_cast<long long>(s.k_o), static_cast<long long>(s.ff), dtype_name(nd)));
      const Layer l(be(), s, nd, seed);
      seed += 16;
      Outputs want(be(), l, s), got(be(), l, s);
      be().Backend::attn_out_mlp(want.args(l));
      const AttnOutMlpArgs a = got.args(l);
      ASSERT_TRUE(cuda::attn_out_mlp_fusable(a)) << "this GPU does not take the one-launch kernel";
      // Three launches in a row: the grid barrier's counters carry over from one launch to the next.
      for (int i = 0; i < 3; ++i) {
        got.reset(l);
        be().attn_out_mlp(a);
      }
      ASSERT_TRUE(be().last_error().ok()) << be().last_error().to_string();
      expect_same(got, want);
      EXPECT_FALSE(same_bits(got.x.host(), l.x0.host())) << "x unchanged";
    }
  }
}

TEST_F(CudaAttnOutMlp, GraphReplayEqualsTheComposite) {
  GemvOn gemv(be());
  const Shape s{1, 1536, 2048, 6144};
  const Layer l(be(), s, kBF16, 5300);
  Outputs want(be(), l, s), got(be(), l, s);
  be().Backend::attn_out_mlp(want.args(l));
  const AttnOutMlpArgs a = got.args(l);
  ASSERT_TRUE(cuda::attn_out_mlp_fusable(a));
  Result<Backend::GraphId> graph = be().capture([&] {
    be().attn_out_mlp(a);
    be().attn_out_mlp(a);  // twice: x advances, so the second launch reads the first one's x
    return be().last_error();
  });
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  be().Backend::attn_out_mlp(want.args(l));
  for (int replay = 0; replay < 2; ++replay) {
    got.reset(l);
    ASSERT_TRUE(be().replay(*graph).ok());
    expect_same(got, want);
  }
  be().release_graph(*graph);
}

TEST_F(CudaAttnOutMlp, OtherShapesRunTheComposite) {
  // A verify pass (two tokens) and a width the kernel does not take: not fusable, the composite's bits.
  GemvOn gemv(be());
  uint32_t seed = 5500;
  for (const Shape& s : {Shape{2, 1536, 2048, 6144}, Shape{1, 1288, 1024, 2048}}) {
    SCOPED_TRACE(strfmt("rows %lld d %lld", static_cast<long long>(s.rows), static_cast<long long>(s.d)));
    const Layer l(be(), s, kBF16, seed);
    seed += 16;
    Outputs want(be(), l, s), got(be(), l, s);
    const AttnOutMlpArgs a = got.args(l);
    EXPECT_FALSE(cuda::attn_out_mlp_fusable(a));
    be().Backend::attn_out_mlp(want.args(l));
    be().attn_out_mlp(a);
    expect_same(got, want);
  }
  EXPECT_TRUE(be().last_error().ok()) << be().last_error().to_string();
}

}  // namespace
}  // namespace tandem::testing
