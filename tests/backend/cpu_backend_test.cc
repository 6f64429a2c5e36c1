// CPU backend vs the reference kernels (kernels/ref) for every op of ops.h, on random data of odd sizes, every
// weight dtype and every instruction set this CPU supports (avx512, avx2, scalar). Outputs are poisoned with NaN
// before each op, so an element the backend forgot to write shows up as a mismatch.
#include "backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/host_centroid.h"
#include "kernels/host_tensor.h"
#include "kernels/ref/ref.h"
#include "sample/counter_rng.h"
#include "sample/rejection.h"

namespace tandem {
namespace {

using testing::HostTensor;
using testing::rel_error;
constexpr DType kF32 = DType::kF32;
constexpr DType kI32 = DType::kI32;
constexpr double kTol = 1e-5;  // f32 math vs the double-precision reference, normwise
const DType kWeightTypes[] = {DType::kBF16, DType::kF16, DType::kF32};

// One backend per instruction set this CPU supports, with 2 threads so the row/head splits are exercised.
std::vector<std::unique_ptr<Backend>> backends() {
  std::vector<std::unique_ptr<Backend>> out;
  for (const char* isa : {"avx512", "avx2", "scalar"}) {
    auto b = make_cpu_backend_with({.threads = 2, .isa = isa});
    if (b.ok()) out.push_back(std::move(b).value());
  }
  return out;
}

std::string isa_of(Backend& be) { return static_cast<cpu::CpuBackend&>(be).summary(); }

TEST(CpuBackend, HasAtLeastTheScalarKernels) {
  auto all = backends();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(make_cpu_backend_with({.isa = "no-such-isa"}).status().code(), StatusCode::kUnsupported);
  auto best = make_cpu_backend();
  EXPECT_STREQ(best->name(), "cpu");
  EXPECT_EQ(best->activation_dtype(), DType::kF32);
  EXPECT_TRUE(best->supports(Op::kLinear, DType::kBF16));
  EXPECT_FALSE(best->supports(Op::kLinear, DType::kI32));
}

TEST(CpuBackend, Linear) {
  struct Case {
    int64_t n_in, n_out, n_tok;
  };
  std::vector<Case> cases;
  for (int64_t n_in : {67, 1000, 1543})
    for (int64_t n_out : {13, 517})
      for (int64_t n_tok : {1, 3, 9}) cases.push_back({n_in, n_out, n_tok});
  for (int64_t n_in : {1, 5, 16, 17, 33}) cases.push_back({n_in, 6, 2});
  cases.push_back({1543, 517, 2});  // the two-token kernel, and token groups of 4 + remainders
  cases.push_back({1000, 13, 8});
  cases.push_back({67, 517, 5});
  cases.push_back({67, 13, 70});  // more tokens than one chunk (64)
  for (auto& be : backends()) {
    for (DType wt : kWeightTypes) {
      for (const Case& c : cases) {
        SCOPED_TRACE(isa_of(*be) + " w " + dtype_name(wt) + " n_in " + std::to_string(c.n_in) +
                     " n_out " + std::to_string(c.n_out) + " tokens " + std::to_string(c.n_tok));
        std::mt19937 rng(static_cast<unsigned>(c.n_in * 31 + c.n_out * 7 + c.n_tok));
        HostTensor x(kF32, {c.n_tok, c.n_in}), w(wt, {c.n_out, c.n_in});
        x.fill_uniform(rng, -1, 1);
        w.fill_uniform(rng, -1, 1);
        HostTensor want(kF32, {c.n_tok, c.n_out}), got(kF32, {c.n_tok, c.n_out});
        ref::linear({.out = want, .x = x, .w = w});
        got.poison();
        be->linear({.out = got, .x = x, .w = w});
        EXPECT_LE(rel_error(got, want), kTol);
        // alpha and accumulate on top of existing values.
        HostTensor base(kF32, {c.n_tok, c.n_out});
        base.fill_uniform(rng, -3, 3);
        want.copy_from(base);
        got.copy_from(base);
        ref::linear({.out = want, .x = x, .w = w, .alpha = 0.37f, .accumulate = true});
        be->linear({.out = got, .x = x, .w = w, .alpha = 0.37f, .accumulate = true});
        EXPECT_LE(rel_error(got, want), kTol);
      }
    }
  }
}

TEST(CpuBackend, Embedding) {
  for (auto& be : backends()) {
    for (DType wt : kWeightTypes) {
      SCOPED_TRACE(isa_of(*be) + " " + dtype_name(wt));
      std::mt19937 rng(11);
      HostTensor table(wt, {37, 67});
      table.fill_uniform(rng, -1, 1);
      HostTensor ids(kI32, {9}, {0, 36, 5, 5, 17, 2, 36, 1, 30});
      HostTensor want(kF32, {9, 67}), got(kF32, {9, 67});
      ref::embedding({.out = want, .table = table, .ids = ids, .scale = 39.25f});
      got.poison();
      be->embedding({.out = got, .table = table, .ids = ids, .scale = 39.25f});
      EXPECT_LE(rel_error(got, want), 1e-7);
    }
  }
}

TEST(CpuBackend, EmbeddingStridedTable) {
  // A column block of a packed table (one layer of the per-layer-embedding table, spec §1.4).
  for (auto& be : backends()) {
    std::mt19937 rng(12);
    HostTensor packed(DType::kBF16, {37, 3 * 23});
    packed.fill_uniform(rng, -1, 1);
    Tensor slice = packed.t();
    slice.shape = {37, 23, 0, 0};
    slice.data = static_cast<char*>(slice.data) + 23 * dtype_size(DType::kBF16);  // columns [23, 46)
    HostTensor ids(kI32, {4}, {36, 0, 7, 7});
    HostTensor want(kF32, {4, 23}), got(kF32, {4, 23});
    ref::embedding({.out = want, .table = slice, .ids = ids, .scale = 16.f});
    got.poison();
    be->embedding({.out = got, .table = slice, .ids = ids, .scale = 16.f});
    const int32_t id_list[] = {36, 0, 7, 7};
    for (int t = 0; t < 4; ++t)
      for (int d = 0; d < 23; ++d) {
        const float expect = packed.get(id_list[t] * 69 + 23 + d) * 16.f;
        EXPECT_EQ(want.get(t * 23 + d), expect);
        EXPECT_EQ(got.get(t * 23 + d), expect);
      }
  }
}

TEST(CpuBackend, RmsNorm) {
  for (auto& be : backends()) {
    for (int64_t dim : {1, 7, 256, 1543}) {
      for (int64_t rows : {1, 3, 9}) {
        for (int wi = 0; wi < 4; ++wi) {  // bf16, f16, f32 weights, then weightless
          SCOPED_TRACE(isa_of(*be) + " dim " + std::to_string(dim) + " rows " + std::to_string(rows) +
                       " weight " + std::to_string(wi));
          std::mt19937 rng(static_cast<unsigned>(dim + rows + wi));
          HostTensor x(kF32, {rows, dim}), w(wi < 3 ? kWeightTypes[wi] : kF32, {dim});
          x.fill_uniform(rng, -4, 4);
          w.fill_uniform(rng, -2, 2);
          const Tensor weight = wi < 3 ? w.t() : Tensor{};
          HostTensor want(kF32, {rows, dim}), got(kF32, {rows, dim});
          ref::rms_norm({.out = want, .x = x, .weight = weight, .eps = 1e-6f});
          got.poison();
          be->rms_norm({.out = got, .x = x, .weight = weight, .eps = 1e-6f});
          EXPECT_LE(rel_error(got, want), kTol);
          be->rms_norm({.out = x, .x = x, .weight = weight, .eps = 1e-6f});  // in place
          EXPECT_LE(rel_error(x, want), kTol);
        }
      }
    }
  }
}

TEST(CpuBackend, Rope) {
  for (auto& be : backends()) {
    for (int64_t head_dim : {2, 6, 66, 512}) {
      for (int64_t n_tok : {1, 3, 9}) {
        const int64_t n_heads = 3, half = head_dim / 2;
        SCOPED_TRACE(isa_of(*be) + " head_dim " + std::to_string(head_dim) + " tokens " +
                     std::to_string(n_tok));
        std::mt19937 rng(static_cast<unsigned>(head_dim * 13 + n_tok));
        HostTensor x(kF32, {n_tok, n_heads, head_dim}), inv(kF32, {half}), pos(kI32, {n_tok});
        x.fill_uniform(rng, -2, 2);
        for (int64_t j = 0; j < half; ++j)  // the proportional layout: a quarter rotated, the rest zero frequency
          inv.set(j, head_dim == 512 && j >= 64 ? 0.f : static_cast<float>(std::pow(1e4, -2.0 * j / head_dim)));
        std::uniform_int_distribution<int> pd(0, 100000);
        for (int64_t t = 0; t < n_tok; ++t) pos.seti(t, t == 0 ? 0 : pd(rng));
        HostTensor want(kF32, {n_tok, n_heads, head_dim});
        want.copy_from(x);
        ref::rope({.x = want, .pos = pos, .inv_freq = inv});
        be->rope({.x = x, .pos = pos, .inv_freq = inv});
        EXPECT_LE(rel_error(x, want), kTol);
      }
    }
  }
}

// KV storage with room for `extra` unused slots per head, so the views handed to the ops are strided.
struct KvStore {
  HostTensor k, v;
  KvView view;
  KvStore(DType dt, int64_t n_kv, int64_t capacity, int64_t head_dim, bool ring, int64_t extra)
      : k(dt, {n_kv, capacity + extra, head_dim}), v(dt, {n_kv, capacity + extra, head_dim}) {
    view.k = k;
    view.v = v;
    view.k.shape[1] = view.v.shape[1] = capacity;  // stride[0] stays (capacity + extra) * head_dim
    view.ring = ring;
  }
};

TEST(CpuBackend, KvWrite) {
  for (auto& be : backends()) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (bool ring : {false, true}) {
        SCOPED_TRACE(isa_of(*be) + " " + dtype_name(dt) + (ring ? " ring" : " full"));
        const int64_t n_kv = 2, cap = 11, hd = 67, n_tok = 9;
        std::mt19937 rng(static_cast<unsigned>(ring));
        KvStore want(dt, n_kv, cap, hd, ring, 3), got(dt, n_kv, cap, hd, ring, 3);
        want.k.fill_uniform(rng, -1, 1);
        want.v.fill_uniform(rng, -1, 1);
        got.k.copy_from(want.k);
        got.v.copy_from(want.v);
        HostTensor kn(kF32, {n_tok, n_kv, hd}), vn(kF32, {n_tok, n_kv, hd}), pos(kI32, {n_tok});
        kn.fill_uniform(rng, -1, 1);
        vn.fill_uniform(rng, -1, 1);
        for (int64_t t = 0; t < n_tok; ++t) pos.seti(t, static_cast<int32_t>(ring ? 7 + t : 2 + t));  // ring wraps
        ref::kv_write({.kv = want.view, .k_new = kn, .v_new = vn, .pos = pos});
        be->kv_write({.kv = got.view, .k_new = kn, .v_new = vn, .pos = pos});
        EXPECT_EQ(rel_error(got.k, want.k), 0.0);
        EXPECT_EQ(rel_error(got.v, want.v), 0.0);
      }
    }
  }
}

TEST(CpuBackend, Attention) {
  struct Case {
    int64_t n_heads, n_kv, head_dim, n_tok;
  };
  const Case cases[] = {{1, 1, 4, 1}, {4, 2, 67, 3}, {8, 1, 256, 1}, {3, 3, 16, 9}, {8, 2, 512, 2}, {3, 1, 16, 1}};
  for (auto& be : backends()) {
    for (const Case& c : cases) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        for (bool ring : {false, true}) {
          for (int64_t window : {0, 1, 5}) {
            for (bool causal : {true, false}) {
              SCOPED_TRACE(isa_of(*be) + " heads " + std::to_string(c.n_heads) + "/" +
                           std::to_string(c.n_kv) + " hd " + std::to_string(c.head_dim) + " tokens " +
                           std::to_string(c.n_tok) + " " + dtype_name(dt) + (ring ? " ring" : " full") +
                           " window " + std::to_string(window) + (causal ? " causal" : " bidirectional"));
              const int64_t cap = ring ? 13 : 40, begin = ring ? 20 : 6, end = ring ? 33 : 40;
              std::mt19937 rng(static_cast<unsigned>(c.head_dim * 7 + window * 3 + causal + ring * 5));
              KvStore kv(dt, c.n_kv, cap, c.head_dim, ring, 2);
              kv.k.fill_uniform(rng, -1, 1);
              kv.v.fill_uniform(rng, -1, 1);
              kv.view.begin = begin;
              kv.view.end = end;
              HostTensor q(kF32, {c.n_tok, c.n_heads, c.head_dim}), qpos(kI32, {c.n_tok});
              q.fill_uniform(rng, -1, 1);
              // The last tokens sit at the end of the cache; the first one of several sits before begin (causal:
              // nothing visible, must give zeros).
              for (int64_t t = 0; t < c.n_tok; ++t) qpos.seti(t, static_cast<int32_t>(end - c.n_tok + t));
              if (c.n_tok > 1) qpos.seti(0, static_cast<int32_t>(begin - 2));
              const float scale = c.head_dim == 4 ? 1.f : 0.3f;
              HostTensor want(kF32, {c.n_tok, c.n_heads, c.head_dim}), got(kF32, {c.n_tok, c.n_heads, c.head_dim});
              const AttentionArgs base{.q = q, .kv = kv.view, .q_pos = qpos, .window = window, .causal = causal,
                                       .scale = scale};
              AttentionArgs ra = base, ca = base;
              ra.out = want;
              ca.out = got;
              ref::attention(ra);
              got.poison();
              be->attention(ca);
              EXPECT_LE(rel_error(got, want), kTol);
              ca.out = q;  // out aliasing q
              be->attention(ca);
              EXPECT_LE(rel_error(q, want), kTol);
            }
          }
        }
      }
    }
  }
}

TEST(CpuBackend, Elementwise) {
  for (auto& be : backends()) {
    for (int64_t n : {1, 13, 1003}) {
      SCOPED_TRACE(isa_of(*be) + " n " + std::to_string(n));
      std::mt19937 rng(static_cast<unsigned>(n));
      HostTensor g(kF32, {n}), u(kF32, {n}), want(kF32, {n}), got(kF32, {n});
      g.fill_uniform(rng, -6, 6);
      u.fill_uniform(rng, -2, 2);
      ref::gelu_mul({.out = want, .gate = g, .up = u});
      got.poison();
      be->gelu_mul({.out = got, .gate = g, .up = u});
      EXPECT_LE(rel_error(got, want), kTol);

      ref::add({.out = want, .a = g, .b = u, .b_scale = -0.7f});
      got.poison();
      be->add({.out = got, .a = g, .b = u, .b_scale = -0.7f});
      EXPECT_LE(rel_error(got, want), kTol);
      be->add({.out = g, .a = g, .b = u, .b_scale = -0.7f});  // out aliasing a
      EXPECT_LE(rel_error(g, want), kTol);

      want.copy_from(u);
      got.copy_from(u);
      ref::scale({.x = want, .s = 1.7f});
      be->scale({.x = got, .s = 1.7f});
      EXPECT_LE(rel_error(got, want), kTol);

      HostTensor big(kF32, {n});
      big.fill_uniform(rng, -200, 200);
      want.copy_from(big);
      got.copy_from(big);
      ref::softcap({.x = want, .cap = 30.f});
      be->softcap({.x = got, .cap = 30.f});
      EXPECT_LE(rel_error(got, want), kTol);
    }
  }
}

TEST(CpuBackend, Argmax) {
  for (auto& be : backends()) {
    for (int64_t n : {1, 13, 262147}) {
      for (int64_t rows : {1, 3}) {
        SCOPED_TRACE(isa_of(*be) + " n " + std::to_string(n) + " rows " + std::to_string(rows));
        std::mt19937 rng(static_cast<unsigned>(n + rows));
        HostTensor x(kF32, {rows, n});
        x.fill_uniform(rng, -1, 1);
        if (n > 5) {
          x.set(3, 5.f);  // row 0: a tie at 3 and n-1
          x.set(n - 1, 5.f);
          if (rows > 1) {
            x.set(n + 4, std::numeric_limits<float>::quiet_NaN());  // row 1: NaN wins
            x.set(n + 2, 7.f);
          }
        }
        HostTensor want(kI32, {rows}), got(kI32, {rows});
        ref::argmax({.out = want, .x = x});
        got.poison();
        be->argmax({.out = got, .x = x});
        EXPECT_EQ(got.values(), want.values());
      }
    }
  }
}

TEST(CpuBackend, ArgmaxByIdAndCentroidCandidates) {
  // The masked embedder's ops: argmax with ids (ties and NaNs to the lowest token id) against the reference, and
  // centroid_candidates (Backend's host default) against top_clusters and the ordering table.
  auto be = make_cpu_backend(2);
  const int64_t n = 12;
  HostTensor x(kF32, {1, n}), ids(kI32, {n}), got(kI32, {1}), want(kI32, {1});
  for (int64_t i = 0; i < n; ++i) {
    x.set(i, static_cast<float>(i % 5));
    ids.seti(i, static_cast<int32_t>(100 - 7 * i));
  }
  // 4 at i = 4 (id 72) and 9 (id 37): the lower id wins.
  ref::argmax({.out = want, .x = x, .ids = ids});
  got.poison();
  be->argmax({.out = got, .x = x, .ids = ids});
  EXPECT_EQ(want.geti(0), 37);
  EXPECT_EQ(got.geti(0), 37);
  x.set(2, std::numeric_limits<float>::quiet_NaN());  // NaNs beat numbers; among them the lower id
  x.set(6, std::numeric_limits<float>::quiet_NaN());
  ref::argmax({.out = want, .x = x, .ids = ids});
  be->argmax({.out = got, .x = x, .ids = ids});
  EXPECT_EQ(want.geti(0), 58);
  EXPECT_EQ(got.geti(0), 58);

  const int64_t C = 40, m = 3;
  const int k = 6;
  HostTensor logits(kF32, {1, C}), ordering(kI32, {C * m}), cand(kI32, {k * m});
  std::mt19937 rng(5);
  logits.fill_uniform(rng, -2, 2);
  logits.set(7, 3.f);  // a tie for first place (7 before 31), and a NaN above both
  logits.set(31, 3.f);
  logits.set(20, std::numeric_limits<float>::quiet_NaN());
  for (int64_t i = 0; i < C * m; ++i) ordering.seti(i, static_cast<int32_t>((i * 37) % (C * m)));
  cand.poison();
  be->centroid_candidates({.ids = cand, .logits = logits, .ordering = ordering, .k = k});
  std::vector<float> lv(static_cast<size_t>(C));
  for (int64_t i = 0; i < C; ++i) lv[static_cast<size_t>(i)] = logits.get(i);
  const std::vector<int> top = top_clusters(lv, k);
  ASSERT_EQ(top.size(), static_cast<size_t>(k));
  EXPECT_EQ(top[0], 20);
  EXPECT_EQ(top[1], 7);
  EXPECT_EQ(top[2], 31);
  for (int j = 0; j < k; ++j) {
    if (j > 2) {
      EXPECT_GE(lv[static_cast<size_t>(top[static_cast<size_t>(j - 1)])],
                lv[static_cast<size_t>(top[static_cast<size_t>(j)])]);
    }
    for (int64_t i = 0; i < m; ++i)
      EXPECT_EQ(cand.geti(j * m + i), ordering.geti(top[static_cast<size_t>(j)] * m + i)) << "cluster rank " << j;
  }
}

TEST(CpuBackend, SampleAndRejectDraftsRunTheReferencePerRow) {
  // The default sampling ops (host_sampling.cc): row r uses uniform_at(seed, counter + r) (reject_drafts: 2r and
  // 2r + 1), its own logits and the shared parameters; the results are the sample/ reference's exactly.
  auto be = make_cpu_backend(2);
  const int64_t rows = 5, n = 300;
  std::mt19937 rng(17);
  HostTensor x(kF32, {rows, n}), out(kI32, {rows}), probs(kF32, {rows, n});
  x.fill_uniform(rng, -4, 4);
  out.poison();
  probs.poison();
  const SamplingParams sp{.temperature = 0.9f, .top_k = 50, .top_p = 0.8f, .min_p = 0.01f};
  be->sample({.out = out,
              .x = x,
              .probs = probs,
              .temperature = sp.temperature,
              .top_k = sp.top_k,
              .top_p = sp.top_p,
              .min_p = sp.min_p,
              .seed = 5,
              .counter = 40});
  const std::vector<float> xs = x.values(), ps = probs.values();
  HostTensor draft(kI32, {rows}), accepted(kI32, {rows}), token(kI32, {rows}), q(kF32, {rows, n});
  std::vector<std::vector<float>> want_p(static_cast<size_t>(rows)), want_q(want_p.size());
  for (int64_t r = 0; r < rows; ++r) {
    const size_t at = static_cast<size_t>(r * n);
    auto& p = want_p[static_cast<size_t>(r)];
    processed_probs(std::span(xs).subspan(at, static_cast<size_t>(n)), sp, &p);
    EXPECT_EQ(std::vector<float>(ps.begin() + static_cast<long>(at), ps.begin() + static_cast<long>(at) + n), p);
    EXPECT_EQ(out.geti(r), sample_at(p, uniform_at(5, 40 + static_cast<uint64_t>(r)))) << "row " << r;
    // q: the same row at a higher temperature; the draft drawn from it.
    auto& qr = want_q[static_cast<size_t>(r)];
    processed_probs(std::span(xs).subspan(at, static_cast<size_t>(n)), {.temperature = 1.5f}, &qr);
    for (int64_t i = 0; i < n; ++i) q.set(r * n + i, qr[static_cast<size_t>(i)]);
    draft.seti(r, sample_at(qr, uniform_at(6, static_cast<uint64_t>(r))));
  }
  accepted.poison();
  token.poison();
  be->reject_drafts(
      {.accepted = accepted, .token = token, .p = probs, .q = q, .draft = draft, .seed = 8, .counter = 3});
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t c = 3 + 2 * static_cast<uint64_t>(r);
    const Verdict v = verify_draft_at(want_p[static_cast<size_t>(r)], want_q[static_cast<size_t>(r)], draft.geti(r),
                                      uniform_at(8, c), uniform_at(8, c + 1));
    EXPECT_EQ(accepted.geti(r), v.accepted ? 1 : 0) << "row " << r;
    EXPECT_EQ(token.geti(r), v.token) << "row " << r;
  }
}

TEST(CpuBackend, MoeRoute) {
  for (auto& be : backends()) {
    for (int64_t n_exp : {16, 128}) {
      for (int k : {1, 8}) {
        for (int64_t n_tok : {1, 3, 9}) {
          SCOPED_TRACE(isa_of(*be) + " experts " + std::to_string(n_exp) + " k " + std::to_string(k) +
                       " tokens " + std::to_string(n_tok));
          std::mt19937 rng(static_cast<unsigned>(n_exp + k + n_tok));
          HostTensor logits(kF32, {n_tok, n_exp}), pes(DType::kBF16, {n_exp});
          logits.fill_normal(rng, 3.f);
          logits.set(1, logits.get(2));  // an exact tie
          pes.fill_uniform(rng, 0.5f, 2.f);
          HostTensor wi(kI32, {n_tok, k}), ww(kF32, {n_tok, k}), gi(kI32, {n_tok, k}), gw(kF32, {n_tok, k});
          ref::moe_route({.idx = wi, .weights = ww, .logits = logits, .per_expert_scale = pes, .k = k});
          gi.poison();
          gw.poison();
          be->moe_route({.idx = gi, .weights = gw, .logits = logits, .per_expert_scale = pes, .k = k});
          EXPECT_EQ(gi.values(), wi.values());
          EXPECT_LE(rel_error(gw, ww), kTol);
        }
      }
    }
  }
}

TEST(CpuBackend, MoeExperts) {
  const int64_t n_exp = 5, d_model = 67, d_ff = 13;
  for (auto& be : backends()) {
    for (DType wt : kWeightTypes) {
      for (int64_t n_tok : {1, 3, 9}) {
        for (int64_t k : {1, 3}) {
          SCOPED_TRACE(isa_of(*be) + " " + dtype_name(wt) + " tokens " + std::to_string(n_tok) +
                       " k " + std::to_string(k));
          std::mt19937 rng(static_cast<unsigned>(n_tok * 3 + k));
          HostTensor gate_up(wt, {n_exp, 2 * d_ff, d_model}), down(wt, {n_exp, d_model, d_ff});
          gate_up.fill_uniform(rng, -0.5f, 0.5f);
          down.fill_uniform(rng, -0.5f, 0.5f);
          HostTensor x(kF32, {n_tok, d_model}), idx(kI32, {n_tok, k}), w(kF32, {n_tok, k});
          x.fill_uniform(rng, -1, 1);
          w.fill_uniform(rng, 0.f, 1.f);
          for (int64_t t = 0; t < n_tok; ++t)  // distinct experts per token, shared across tokens
            for (int64_t j = 0; j < k; ++j) idx.seti(t * k + j, static_cast<int32_t>((t + 2 * j) % n_exp));
          HostTensor want(kF32, {n_tok, d_model}), got(kF32, {n_tok, d_model});
          ref::moe_experts({.out = want, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w});
          got.poison();
          be->moe_experts({.out = got, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w});
          EXPECT_LE(rel_error(got, want), kTol);
        }
      }
    }
  }
}

TEST(BackendRegistry, ParsesDeviceStrings) {
  auto cpu = make_backend("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  EXPECT_TRUE((*cpu)->device().is_cpu());
  for (const char* bad : {"", "gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "CPU"})
    EXPECT_EQ(make_backend(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  auto cuda = make_backend("cuda:0");  // a GPU backend, or a clear "unsupported" without CUDA / without a GPU
  if (!cuda.ok()) {
    EXPECT_NE(cuda.status().message(), "");
  }
}

TEST(BackendRegistry, OpNamesAreDistinct) {
  std::vector<std::string> names;
  for (int i = 0; i < static_cast<int>(Op::kCount); ++i) {
    const std::string n = op_name(static_cast<Op>(i));
    EXPECT_NE(n, "?");
    for (const auto& m : names) EXPECT_NE(n, m);
    names.push_back(n);
  }
}

}  // namespace
}  // namespace tandem
