// The fused-or-composite choice above fused_gemv_rows() (fused_choice.h): in the timed GEMV mode, the first geglu,
// linear_gelu_mul or linear_group of a verify-size shape times its fused launch against its composite ops and keeps
// the faster, whose output matches the reference; later calls take the same path (the same bits) without timing
// again; with timing off, in another mode or inside a graph capture nothing is timed and the composite runs. With
// the tensor cores off and on, so that both kinds of fused launch are timed.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "backend/cuda/kernels.h"
#include "core/strings.h"
#include "cuda/cuda_fixture.h"
#include "kernels/ref/ref.h"

namespace tandem::testing {
namespace {

constexpr DType kBF16 = DType::kBF16;
using Key = cuda::FusedChoice::Key;
using Op = cuda::FusedChoice::Op;
using CudaFusedChoice = CudaTest;

// Timing on above 2 fused rows, the timed mode and the tensor-core switch for a test; restores them after.
struct ChoiceScope {
  ChoiceScope(cuda::CudaBackend& b, bool tc)
      : be(b),
        mode(b, cuda::GemvMode::kAuto),
        rows(b.fused_gemv_rows()),
        timing(b.fused_gemv_timing()),
        tc_before(cuda::gemv_tc()) {
    be.set_fused_gemv_rows(2);
    be.set_fused_gemv_timing(true);
    cuda::set_gemv_tc(tc);
  }
  ~ChoiceScope() {
    be.set_fused_gemv_rows(rows);
    be.set_fused_gemv_timing(timing);
    cuda::set_gemv_tc(tc_before);
  }
  ChoiceScope(const ChoiceScope&) = delete;
  ChoiceScope& operator=(const ChoiceScope&) = delete;
  cuda::CudaBackend& be;
  GemvModeScope mode;
  int rows;
  bool timing, tc_before;
};

// One op on random inputs: run() enqueues it, out is what it writes, want the reference.
struct OpCase {
  Key key;
  std::function<void()> run;
  DeviceTensor* out;
  HostTensor want;
};

// Runs `c` four times: the first call must time its shape (one more timed shape, the key recorded) and match the
// reference; the next three must give the first call's bits and time nothing.
void expect_timed_once(cuda::CudaBackend& be, OpCase& c) {
  SCOPED_TRACE(strfmt("op %d, %lld rows, %lld -> %lld", static_cast<int>(c.key.op), static_cast<long long>(c.key.rows),
                      static_cast<long long>(c.key.n_in), static_cast<long long>(c.key.n_out)));
  const size_t timed = be.fused_choices().size();
  ASSERT_FALSE(be.fused_choices().find(c.key).has_value()) << "shape timed before the test";
  c.out->poison();
  c.run();
  c.out->download();
  ASSERT_TRUE(be.last_error().ok());
  EXPECT_EQ(be.fused_choices().size(), timed + 1);
  const std::optional<bool> pick = be.fused_choices().find(c.key);
  ASSERT_TRUE(pick.has_value());
  std::printf("[fused choice] op %d, %lld rows, %lld -> %lld, tensor cores %s: %s\n", static_cast<int>(c.key.op),
              static_cast<long long>(c.key.rows), static_cast<long long>(c.key.n_in),
              static_cast<long long>(c.key.n_out), cuda::gemv_tc() ? "on" : "off", *pick ? "fused" : "composite");
  expect_close(c.out->host(), c.want, tolerance_for(kBF16, true));
  HostTensor first(kBF16, {c.out->host().numel()});
  first.copy_from(c.out->host());
  for (int i = 0; i < 3; ++i) {
    c.out->poison();
    c.run();
    c.out->download();
    ASSERT_TRUE(same_bits(c.out->host(), first)) << "call " << i + 2;
  }
  EXPECT_EQ(be.fused_choices().size(), timed + 1);
}

// The three ops at `rows` rows over K = 1536 values into N outputs per matrix (seeded by `seed`).
void check_ops(cuda::CudaBackend& be, int64_t rows, int64_t N, uint32_t seed) {
  constexpr int64_t K = 1536;
  DeviceTensor x(be, kBF16, {rows, K}), wg(be, kBF16, {N, K}), wu(be, kBF16, {N, K}), wv(be, kBF16, {264, K});
  DeviceTensor out(be, kBF16, {rows, N}), up(be, kBF16, {rows, N}), out_v(be, kBF16, {rows, 264});
  DeviceTensor ple(be, kBF16, {rows, N});
  for (DeviceTensor* t : {&x, &wg, &wu, &wv, &ple}) {
    fill_random(t->host(), seed++);
    t->upload();
  }
  HostTensor g(kBF16, {rows, N}), u(kBF16, {rows, N}), geglu_want(kBF16, {rows, N}), gm_want(kBF16, {rows, N});
  ref::linear({.out = g, .x = x.host(), .w = wg.host()});
  ref::linear({.out = u, .x = x.host(), .w = wu.host()});
  ref::gelu_mul({.out = geglu_want, .gate = g, .up = u});
  ref::gelu_mul({.out = gm_want, .gate = g, .up = ple.host()});

  OpCase geglu{{Op::kGeglu, rows, K, 2 * N, kBF16},
               [&] { be.geglu({.out = out, .x = x, .w_gate = wg, .w_up = wu, .up = up}); },
               &out,
               std::move(geglu_want)};
  expect_timed_once(be, geglu);
  OpCase gelu_mul{{Op::kLinearGeluMul, rows, K, N, kBF16},
                  [&] { be.linear_gelu_mul({.out = out, .x = x, .w = wg, .up = ple}); },
                  &out,
                  std::move(gm_want)};
  expect_timed_once(be, gelu_mul);
  // A group of two: the gate matrix and a narrow one; its second output is checked after.
  LinearGroupArgs group{.x = x, .n = 2};
  group.out[0] = out;
  group.w[0] = wg;
  group.out[1] = out_v;
  group.w[1] = wv;
  OpCase grp{{Op::kLinearGroup, rows, K, N + 264, kBF16}, [&] { be.linear_group(group); }, &out, std::move(g)};
  expect_timed_once(be, grp);
  out_v.download();
  HostTensor v_want(kBF16, {rows, 264});
  ref::linear({.out = v_want, .x = x.host(), .w = wv.host()});
  expect_close(out_v.host(), v_want, tolerance_for(kBF16, true));
}

TEST_F(CudaFusedChoice, EachShapeAboveTheFusedRowsIsTimedOnceAndKeepsItsPick) {
  for (const bool tc : {false, true}) {
    ChoiceScope scope(be(), tc);
    for (const int64_t rows : {3, 5, 9}) check_ops(be(), rows, tc ? 2056 : 1032, 900 + static_cast<uint32_t>(rows));
  }
}

TEST_F(CudaFusedChoice, NothingIsTimedWithTimingOffInAnotherModeOrInACapture) {
  ChoiceScope scope(be(), false);
  constexpr int64_t rows = 4, K = 1536, N = 776;
  DeviceTensor x(be(), kBF16, {rows, K}), wg(be(), kBF16, {N, K}), wu(be(), kBF16, {N, K});
  DeviceTensor out(be(), kBF16, {rows, N}), up(be(), kBF16, {rows, N});
  for (DeviceTensor* t : {&x, &wg, &wu}) {
    fill_random(t->host(), 950);
    t->upload();
  }
  HostTensor g(kBF16, {rows, N}), u(kBF16, {rows, N}), want(kBF16, {rows, N});
  ref::linear({.out = g, .x = x.host(), .w = wg.host()});
  ref::linear({.out = u, .x = x.host(), .w = wu.host()});
  ref::gelu_mul({.out = want, .gate = g, .up = u});
  const GegluArgs args{.out = out, .x = x, .w_gate = wg, .w_up = wu, .up = up};
  const Key key{Op::kGeglu, rows, K, 2 * N, kBF16};
  const size_t timed = be().fused_choices().size();
  auto run_and_check = [&](const char* what) {
    SCOPED_TRACE(what);
    out.download();
    expect_close(out.host(), want, tolerance_for(kBF16, true));
    EXPECT_EQ(be().fused_choices().size(), timed);
    EXPECT_FALSE(be().fused_choices().find(key).has_value());
  };
  be().set_fused_gemv_timing(false);
  out.poison();
  be().geglu(args);
  run_and_check("timing off");
  be().set_fused_gemv_timing(true);
  {
    GemvModeScope on(be(), cuda::GemvMode::kOn);
    out.poison();
    be().geglu(args);
    run_and_check("GEMV mode on");
  }
  // Inside a capture the untimed shape takes the composite and stays untimed; the replay computes the op.
  out.poison();
  Result<Backend::GraphId> graph = be().capture([&] {
    be().geglu(args);
    return ok_status();
  });
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  ASSERT_TRUE(be().replay(*graph).ok());
  ASSERT_TRUE(be().synchronize().ok());
  be().release_graph(*graph);
  run_and_check("captured");
}

}  // namespace
}  // namespace tandem::testing
