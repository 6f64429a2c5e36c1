// q_norm_attention on the GPU (backend.h): the decode attention kernel that norms and rotates its query rows itself
// must give the bits of the composite (rms_norm of q with RoPE, then attention) for the released head dims (256 and
// 512, proportional RoPE with zero frequencies included), GQA groups of 2..8, 1..16 query tokens over several row
// chunks, sliding windows, contexts long enough to split the keys, bf16 and f32 norm weights, and from a CUDA graph
// replayed at other cache lengths. Shapes the kernel does not take run the composite.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "backend/cuda/kernels.h"
#include "core/strings.h"
#include "cuda/cuda_fixture.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

using CudaQNormAttention = CudaAttentionNormsTest;

struct Shape {
  int64_t n_tok, n_heads, n_kv, head_dim, capacity, window, end;
  double rotary;  // share of the pairs with a nonzero frequency (global layers: 0.25)
};

// One case's tensors: the raw q (kept on the host to restore it), the cache, the norm weight and the frequencies.
struct Case {
  Case(cuda::CudaBackend& be, const Shape& s, DType w_dtype, uint32_t seed)
      : s(s),
        q(be, kBF16, {s.n_tok, s.n_heads, s.head_dim}),
        out(be, kBF16, {s.n_tok, s.n_heads, s.head_dim}),
        k(be, kBF16, {s.n_kv, s.capacity, s.head_dim}),
        v(be, kBF16, {s.n_kv, s.capacity, s.head_dim}),
        w(be, w_dtype, {s.head_dim}),
        inv_freq(be, kF32, {s.head_dim / 2}),
        pos(be, kI32, {s.n_tok}),
        end(be, kI32, {1}) {
    fill_random(q.host(), seed);
    fill_random(k.host(), seed + 1);
    fill_random(v.host(), seed + 2);
    std::mt19937 rng(seed + 3);
    w.host().fill_uniform(rng, 0.5f, 1.5f);
    fill_inv_freq(inv_freq.host(), s.head_dim, s.rotary);
    for (DeviceTensor* t : {&q, &k, &v, &w, &inv_freq}) t->upload();
    set_end(s.end);
  }
  void set_end(int64_t e) {
    for (int64_t t = 0; t < s.n_tok; ++t) pos.host().seti(t, static_cast<int32_t>(e - s.n_tok + t));
    end.host().seti(0, static_cast<int32_t>(e));
    pos.upload();
    end.upload();
  }
  // q back to its raw values (the op norms it in place or leaves it; either way it is scratch afterwards).
  void reset_q() { q.upload(); }
  RmsNormArgs norm() const {
    return {.out = q, .x = q, .weight = w, .eps = 1e-6f, .rope_pos = pos, .rope_inv_freq = inv_freq};
  }
  AttentionArgs attention(int64_t kv_end_host, bool device_end) const {
    return {.out = out,
            .q = q,
            .kv = {.k = k, .v = v, .begin = 0, .end = kv_end_host, .ring = false},
            .q_pos = pos,
            .kv_end = device_end ? end.t() : Tensor(),
            .window = s.window};
  }
  Shape s;
  DeviceTensor q, out, k, v, w, inv_freq, pos, end;
};

std::string describe(const Shape& s, DType w_dtype) {
  return strfmt("%lld tok, %lld/%lld heads, head_dim %lld, window %lld, end %lld, rotary %.2f, %s weight",
                static_cast<long long>(s.n_tok), static_cast<long long>(s.n_heads), static_cast<long long>(s.n_kv),
                static_cast<long long>(s.head_dim), static_cast<long long>(s.window), static_cast<long long>(s.end),
                s.rotary, dtype_name(w_dtype));
}

// The composite's output, into want (shaped as out).
void run_composite(cuda::CudaBackend& be, Case& c, const AttentionArgs& a, HostTensor& want) {
  c.reset_q();
  c.out.poison();
  be.Backend::q_norm_attention(c.norm(), a);
  c.out.download();
  want.copy_from(c.out.host());
}

TEST_F(CudaQNormAttention, OneLaunchEqualsTheCompositeBitwise) {
  // E2B's sliding (256, one KV head) and full (512) layers, E4B's two KV heads, 31B's groups of two, a verify pass
  // of 9 tokens over several row chunks, a drafter-like window, and contexts that split the keys.
  const Shape shapes[] = {{1, 8, 1, 256, 1024, 512, 130, 1.0},     {1, 8, 1, 512, 2048, 0, 1500, 0.25},
                          {1, 8, 2, 256, 512, 0, 77, 1.0},         {5, 8, 2, 512, 1024, 0, 400, 0.25},
                          {9, 32, 16, 256, 2048, 1024, 2000, 1.0}, {16, 16, 2, 256, 256, 0, 200, 1.0},
                          {1, 32, 4, 512, 4096, 0, 4096, 0.25}};
  uint32_t seed = 8100;
  for (const Shape& s : shapes) {
    for (DType wd : {kBF16, kF32}) {
      SCOPED_TRACE(describe(s, wd));
      Case c(be(), s, wd, seed);
      seed += 4;
      const AttentionArgs a = c.attention(s.end, /*device_end=*/false);
      ASSERT_TRUE(cuda::q_norm_attention_fusable(c.norm(), a));
      HostTensor want(kBF16, {s.n_tok, s.n_heads, s.head_dim});
      run_composite(be(), c, a, want);
      c.reset_q();
      c.out.poison();
      be().q_norm_attention(c.norm(), a);
      ASSERT_TRUE(be().last_error().ok()) << be().last_error().to_string();
      c.out.download();
      EXPECT_TRUE(same_bits(c.out.host(), want));
    }
  }
}

TEST_F(CudaQNormAttention, GraphReplayEqualsTheCompositeAtOtherLengths) {
  const Shape s{1, 8, 1, 512, 4096, 0, 40, 0.25};
  Case c(be(), s, kBF16, 8300);
  const AttentionArgs a = c.attention(s.end, /*device_end=*/true);
  ASSERT_TRUE(cuda::q_norm_attention_fusable(c.norm(), a));
  be().q_norm_attention(c.norm(), a);  // warm-up outside the capture (the kernel's shared-memory attribute)
  ASSERT_TRUE(be().synchronize().ok());
  Result<Backend::GraphId> graph = be().capture([&] {
    be().q_norm_attention(c.norm(), a);
    return be().last_error();
  });
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  for (int64_t e : {int64_t{40}, int64_t{700}, int64_t{4096}}) {
    SCOPED_TRACE(strfmt("end %lld", static_cast<long long>(e)));
    c.set_end(e);
    HostTensor want(kBF16, {s.n_tok, s.n_heads, s.head_dim});
    run_composite(be(), c, c.attention(e, /*device_end=*/false), want);
    c.reset_q();
    c.out.poison();
    ASSERT_TRUE(be().replay(*graph).ok());
    c.out.download();
    EXPECT_TRUE(same_bits(c.out.host(), want));
  }
  be().release_graph(*graph);
}

TEST_F(CudaQNormAttention, OtherArgumentsRunTheComposite) {
  // More query tokens than the decode kernel takes, and a norm that is not q's own: the two ops, with their bits.
  const Shape s{20, 8, 2, 256, 512, 0, 300, 1.0};
  Case c(be(), s, kBF16, 8500);
  const AttentionArgs a = c.attention(s.end, false);
  EXPECT_FALSE(cuda::q_norm_attention_fusable(c.norm(), a));
  HostTensor want(kBF16, {s.n_tok, s.n_heads, s.head_dim});
  run_composite(be(), c, a, want);
  c.reset_q();
  c.out.poison();
  be().q_norm_attention(c.norm(), a);
  c.out.download();
  EXPECT_TRUE(same_bits(c.out.host(), want));
  RmsNormArgs no_rope = c.norm();
  no_rope.rope_pos = Tensor();
  no_rope.rope_inv_freq = Tensor();
  EXPECT_FALSE(cuda::q_norm_attention_fusable(no_rope, c.attention(s.end, false)));
  EXPECT_TRUE(be().last_error().ok()) << be().last_error().to_string();
}

}  // namespace
}  // namespace tandem::testing
