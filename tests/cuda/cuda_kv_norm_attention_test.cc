// kv_norm_write_attention on the GPU (backend.h): the decode attention kernel that norms its query rows and writes
// the new keys and values into the cache itself, before reading it, must leave the bits of the composite
// (kv_norm_write with its q norm, then attention) in the output and in the whole cache: full caches and wrapped rings
// under sliding windows, head dims 256 and 512 (proportional RoPE), GQA groups of 2..8, decode and verify passes of
// up to 16 tokens, contexts long enough to split the keys, and a CUDA graph replayed at other cache lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/strings.h"
#include "cuda/cuda_fixture.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;

using CudaKvNormAttention = CudaAttentionNormsTest;

struct Shape {
  int64_t n_tok, n_heads, n_kv, head_dim, capacity, window, end;
  bool ring;
  double rotary;  // share of the pairs with a nonzero frequency
};

std::string describe(const Shape& s) {
  return strfmt("%lld tok, %lld/%lld heads, head_dim %lld, capacity %lld%s, window %lld, end %lld",
                static_cast<long long>(s.n_tok), static_cast<long long>(s.n_heads), static_cast<long long>(s.n_kv),
                static_cast<long long>(s.head_dim), static_cast<long long>(s.capacity), s.ring ? " ring" : "",
                static_cast<long long>(s.window), static_cast<long long>(s.end));
}

// One layer's step: the raw q, k, v of the new tokens, the cache before the step, the norm weights and frequencies.
// run() restores every input and runs the op on a copy of the cache; out and cache then hold its results.
struct Step {
  Step(cuda::CudaBackend& be, const Shape& s, uint32_t seed)
      : s(s),
        q(be, kBF16, {s.n_tok, s.n_heads, s.head_dim}),
        k_new(be, kBF16, {s.n_tok, s.n_kv, s.head_dim}),
        v_new(be, kBF16, {s.n_tok, s.n_kv, s.head_dim}),
        out(be, kBF16, {s.n_tok, s.n_heads, s.head_dim}),
        k(be, kBF16, {s.n_kv, s.capacity, s.head_dim}),
        v(be, kBF16, {s.n_kv, s.capacity, s.head_dim}),
        k0(be, kBF16, {s.n_kv, s.capacity, s.head_dim}),
        v0(be, kBF16, {s.n_kv, s.capacity, s.head_dim}),
        q_norm(be, kBF16, {s.head_dim}),
        k_norm(be, kF32, {s.head_dim}),
        inv_freq(be, kF32, {s.head_dim / 2}),
        pos(be, kI32, {s.n_tok}),
        end(be, kI32, {1}) {
    fill_random(q.host(), seed);
    fill_random(k_new.host(), seed + 1);
    fill_random(v_new.host(), seed + 2);
    fill_random(k0.host(), seed + 3);
    fill_random(v0.host(), seed + 4);
    std::mt19937 rng(seed + 5);
    q_norm.host().fill_uniform(rng, 0.5f, 1.5f);
    k_norm.host().fill_uniform(rng, 0.5f, 1.5f);
    fill_inv_freq(inv_freq.host(), s.head_dim, s.rotary);
    for (DeviceTensor* t : {&k0, &v0, &q_norm, &k_norm, &inv_freq}) t->upload();
    set_end(s.end);
  }
  void set_end(int64_t e) {
    for (int64_t t = 0; t < s.n_tok; ++t) pos.host().seti(t, static_cast<int32_t>(e - s.n_tok + t));
    end.host().seti(0, static_cast<int32_t>(e));
    pos.upload();
    end.upload();
  }
  KvView view(int64_t e) const {
    return {.k = k, .v = v, .begin = s.ring ? std::max<int64_t>(0, e - s.capacity) : 0, .end = e, .ring = s.ring};
  }
  KvNormWriteArgs write(int64_t e) const {
    return {.write = {.kv = view(e), .k_new = k_new, .v_new = v_new, .pos = pos},
            .k_norm = k_norm,
            .rope_inv_freq = inv_freq,
            .eps = 1e-6f,
            .q = q,
            .q_norm = q_norm};
  }
  AttentionArgs attention(int64_t e, bool device_end) const {
    return {
        .out = out, .q = q, .kv = view(e), .q_pos = pos, .kv_end = device_end ? end.t() : Tensor(), .window = s.window};
  }
  // The inputs and the cache as before the step (the op writes q, k_new, v_new and the cache).
  void reset(cuda::CudaBackend& be) {
    for (DeviceTensor* t : {&q, &k_new, &v_new}) t->upload();
    ASSERT_TRUE(be.copy(k.t().data, k0.t().data, k0.t().nbytes(), CopyKind::kDeviceToDevice).ok());
    ASSERT_TRUE(be.copy(v.t().data, v0.t().data, v0.t().nbytes(), CopyKind::kDeviceToDevice).ok());
    out.poison();
  }
  // out, k and v downloaded, as bytes.
  std::vector<unsigned char> results() {
    std::vector<unsigned char> bytes;
    for (DeviceTensor* t : {&out, &k, &v}) {
      t->download();
      const auto* p = static_cast<const unsigned char*>(t->host().t().data);
      bytes.insert(bytes.end(), p, p + t->host().t().nbytes());
    }
    return bytes;
  }
  Shape s;
  DeviceTensor q, k_new, v_new, out, k, v, k0, v0, q_norm, k_norm, inv_freq, pos, end;
};

std::vector<unsigned char> composite(cuda::CudaBackend& be, Step& st, int64_t e) {
  st.reset(be);
  be.Backend::kv_norm_write_attention(st.write(e), st.attention(e, false));
  return st.results();
}

TEST_F(CudaKvNormAttention, OneLaunchEqualsTheCompositeBitwise) {
  // E2B's sliding ring and full layers, E4B's two KV heads, 26B-A4B / 31B groups, verify passes over several row
  // chunks, wrapped rings, and contexts that split the keys.
  const Shape shapes[] = {{1, 8, 1, 256, 528, 512, 130, true, 1.0},     {1, 8, 1, 512, 2048, 0, 1500, false, 0.25},
                          {1, 8, 2, 256, 528, 512, 2000, true, 1.0},    {5, 8, 2, 512, 1024, 0, 400, false, 0.25},
                          {5, 16, 8, 256, 1040, 1024, 3000, true, 1.0}, {9, 32, 16, 256, 1040, 1024, 700, true, 1.0},
                          {16, 16, 2, 256, 256, 0, 200, false, 1.0},    {1, 32, 4, 512, 4096, 0, 4096, false, 0.25}};
  uint32_t seed = 9100;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(describe(s));
    Step st(be(), s, seed);
    seed += 8;
    ASSERT_TRUE(cuda::kv_norm_write_attention_fusable(st.write(s.end), st.attention(s.end, false)));
    const std::vector<unsigned char> want = composite(be(), st, s.end);
    st.reset(be());
    be().kv_norm_write_attention(st.write(s.end), st.attention(s.end, false));
    ASSERT_TRUE(be().last_error().ok()) << be().last_error().to_string();
    EXPECT_TRUE(st.results() == want);
  }
}

TEST_F(CudaKvNormAttention, GraphReplayEqualsTheCompositeAtOtherLengths) {
  for (const Shape& s : {Shape{1, 8, 1, 256, 528, 512, 40, true, 1.0}, Shape{5, 8, 2, 512, 4096, 0, 40, false, 0.25}}) {
    SCOPED_TRACE(describe(s));
    Step st(be(), s, 9300);
    st.reset(be());
    const KvNormWriteArgs w = st.write(s.end);
    const AttentionArgs a = st.attention(s.end, /*device_end=*/true);
    ASSERT_TRUE(cuda::kv_norm_write_attention_fusable(w, a));
    be().kv_norm_write_attention(w, a);  // warm-up outside the capture (the kernel's shared-memory attribute)
    ASSERT_TRUE(be().synchronize().ok());
    Result<Backend::GraphId> graph = be().capture([&] {
      be().kv_norm_write_attention(w, a);
      return be().last_error();
    });
    ASSERT_TRUE(graph.ok()) << graph.status().to_string();
    for (int64_t e : {int64_t{40}, int64_t{700}, int64_t{4096}}) {
      SCOPED_TRACE(strfmt("end %lld", static_cast<long long>(e)));
      st.set_end(e);
      const std::vector<unsigned char> want = composite(be(), st, e);
      st.reset(be());
      ASSERT_TRUE(be().replay(*graph).ok());
      EXPECT_TRUE(st.results() == want);
    }
    be().release_graph(*graph);
  }
}

TEST_F(CudaKvNormAttention, OtherArgumentsRunTheComposite) {
  // More tokens than the decode kernel takes, and a write into other storage than the attention reads: not fused,
  // the composite's bits.
  const Shape s{20, 8, 2, 256, 512, 0, 300, false, 1.0};
  Step st(be(), s, 9500);
  EXPECT_FALSE(cuda::kv_norm_write_attention_fusable(st.write(s.end), st.attention(s.end, false)));
  const std::vector<unsigned char> want = composite(be(), st, s.end);
  st.reset(be());
  be().kv_norm_write_attention(st.write(s.end), st.attention(s.end, false));
  EXPECT_TRUE(st.results() == want);
  const Shape s1{1, 8, 2, 256, 512, 0, 300, false, 1.0};
  Step other(be(), s1, 9600);
  KvNormWriteArgs w = other.write(s1.end);
  w.write.kv.k = other.k0;
  EXPECT_FALSE(cuda::kv_norm_write_attention_fusable(w, other.attention(s1.end, false)));
  EXPECT_TRUE(be().last_error().ok()) << be().last_error().to_string();
}

}  // namespace
}  // namespace tandem::testing
