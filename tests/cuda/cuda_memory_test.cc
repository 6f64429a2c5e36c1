// CUDA backend memory, streams and error paths: H2D/D2H/D2D round trips with pageable and pinned host memory,
// async copies on created streams, memset, and failures that must come back as a Status (absurd allocation,
// bad arguments, unsupported ops and dtypes) without aborting or poisoning later work.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/cuda_fixture.h"

namespace tandem::testing {
namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

using CudaMemory = CudaTest;

TEST_F(CudaMemory, Identity) {
  EXPECT_STREQ(be().name(), "cuda");
  EXPECT_EQ(be().device(), (Device{DeviceKind::kCuda, 0}));
  EXPECT_EQ(be().activation_dtype(), DType::kBF16);
  EXPECT_TRUE(be().supports(Op::kLinear, DType::kBF16));
  EXPECT_TRUE(be().supports(Op::kRmsNorm, DType::kF32));
  EXPECT_FALSE(be().supports(Op::kLinear, DType::kF16));
  EXPECT_TRUE(be().supports(Op::kAttention, DType::kBF16));
  EXPECT_TRUE(be().supports(Op::kMoeExperts, DType::kBF16));
  EXPECT_FALSE(be().supports(Op::kMoeExperts, DType::kF16));
  std::printf("device: %s, sm_%d%d, %.1f GiB\n", be().properties().name, be().properties().major,
              be().properties().minor, static_cast<double>(be().properties().totalGlobalMem) / (1 << 30));
}

TEST_F(CudaMemory, PageableRoundTripThroughTwoDeviceBuffers) {
  for (size_t n : {size_t{1}, size_t{3}, size_t{4097}, (size_t{1} << 20) + 5}) {
    SCOPED_TRACE(n);
    const auto src = random_bytes(n, static_cast<uint32_t>(n));
    std::vector<uint8_t> back(n, 0);
    Buffer d1 = be().alloc(n).value(), d2 = be().alloc(n).value();
    EXPECT_EQ(d1.device(), be().device());
    ASSERT_TRUE(be().copy(d1.data(), src.data(), n, CopyKind::kHostToDevice).ok());
    ASSERT_TRUE(be().copy(d2.data(), d1.data(), n, CopyKind::kDeviceToDevice).ok());
    ASSERT_TRUE(be().copy(back.data(), d2.data(), n, CopyKind::kDeviceToHost).ok());
    ASSERT_TRUE(be().synchronize().ok());
    EXPECT_EQ(back, src);
  }
}

TEST_F(CudaMemory, PinnedAsyncCopiesOnACreatedStream) {
  const size_t n = (size_t{8} << 20) + 12;
  Result<StreamId> s = be().create_stream();
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_NE(*s, kDefaultStream);
  Buffer src = be().alloc(n, MemKind::kPinned).value(), dst = be().alloc(n, MemKind::kPinned).value();
  Buffer d1 = be().alloc(n).value(), d2 = be().alloc(n).value();
  EXPECT_TRUE(src.device().is_cpu());
  const auto bytes = random_bytes(n, 7);
  std::memcpy(src.data(), bytes.data(), n);
  std::memset(dst.data(), 0, n);
  ASSERT_TRUE(be().copy(d1.data(), src.data(), n, CopyKind::kHostToDevice, *s).ok());
  ASSERT_TRUE(be().copy(d2.data(), d1.data(), n, CopyKind::kDeviceToDevice, *s).ok());
  ASSERT_TRUE(be().copy(dst.data(), d2.data(), n, CopyKind::kDeviceToHost, *s).ok());
  ASSERT_TRUE(be().synchronize(*s).ok());
  EXPECT_EQ(std::memcmp(dst.data(), bytes.data(), n), 0);
  // Host-to-host through the stream, and plain host memory from the backend's allocator.
  Buffer h = be().alloc(n, MemKind::kHost).value();
  ASSERT_TRUE(be().copy(h.data(), dst.data(), n, CopyKind::kHostToHost, *s).ok());
  ASSERT_TRUE(be().synchronize(*s).ok());
  EXPECT_EQ(std::memcmp(h.data(), bytes.data(), n), 0);
}

TEST_F(CudaMemory, MemsetZero) {
  const size_t n = 1000003;
  Buffer d = be().alloc(n).value();
  const auto bytes = random_bytes(n, 3);
  ASSERT_TRUE(be().copy(d.data(), bytes.data(), n, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(be().memset_zero(static_cast<char*>(d.data()) + 1, n - 2).ok());
  std::vector<uint8_t> back(n, 0xAB);
  ASSERT_TRUE(be().copy(back.data(), d.data(), n, CopyKind::kDeviceToHost).ok());
  ASSERT_TRUE(be().synchronize().ok());
  EXPECT_EQ(back[0], bytes[0]);
  EXPECT_EQ(back[n - 1], bytes[n - 1]);
  for (size_t i = 1; i + 1 < n; ++i) ASSERT_EQ(back[i], 0) << i;
}

TEST_F(CudaMemory, OpsRunOnTheCurrentStream) {
  Result<StreamId> s = be().create_stream();
  ASSERT_TRUE(s.ok());
  be().set_stream(*s);
  EXPECT_EQ(be().current_stream(), *s);
  DeviceTensor x(be(), DType::kF32, {3, 1001});
  fill_random(x.host(), 11);
  HostTensor want(DType::kF32, {3, 1001});
  want.copy_from(x.host());
  x.upload();  // on stream s
  be().scale({.x = x, .s = -2.5f});
  be().scale({.x = x, .s = 0.5f});
  x.download();  // on stream s, after the ops
  be().set_stream(kDefaultStream);
  for (int64_t i = 0; i < want.numel(); ++i) want.set(i, want.get(i) * -2.5f * 0.5f);
  expect_close(x.host(), want, tolerance_for(DType::kF32));
}

TEST_F(CudaMemory, WaitStreamOrdersTwoStreams) {
  // A fork and a join: stream s waits for a large upload on the default stream before copying its result, and the
  // default stream waits for s before reading that copy back. Without the waits the copies would race (64 MiB
  // takes milliseconds from pageable memory).
  Result<StreamId> s = be().create_stream();
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(be().concurrent_streams());
  const size_t n = size_t{64} << 20;
  Buffer a = be().alloc(n).value(), b = be().alloc(n).value();
  ASSERT_TRUE(be().memset_zero(b.data(), n, *s).ok());
  ASSERT_TRUE(be().synchronize(*s).ok());
  const auto bytes = random_bytes(n, 21);
  ASSERT_TRUE(be().copy(a.data(), bytes.data(), n, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(be().wait_stream(*s, kDefaultStream).ok());
  ASSERT_TRUE(be().copy(b.data(), a.data(), n, CopyKind::kDeviceToDevice, *s).ok());
  ASSERT_TRUE(be().wait_stream(kDefaultStream, *s).ok());
  std::vector<uint8_t> back(n);
  ASSERT_TRUE(be().copy(back.data(), b.data(), n, CopyKind::kDeviceToHost).ok());
  ASSERT_TRUE(be().synchronize().ok());
  EXPECT_EQ(std::memcmp(back.data(), bytes.data(), n), 0);
  EXPECT_EQ(be().wait_stream(*s, 1000).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(be().wait_stream(-1, *s).code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaMemory, AbsurdAllocationIsAStatusAndLeavesNoError) {
  Result<Buffer> huge = be().alloc(size_t{1} << 60);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted) << huge.status().to_string();
  Result<Buffer> huge_pinned = be().alloc(size_t{1} << 60, MemKind::kPinned);
  EXPECT_FALSE(huge_pinned.ok());
  EXPECT_TRUE(be().last_error().ok());
  // The device still works.
  DeviceTensor x(be(), DType::kBF16, {5});
  fill_random(x.host(), 1);
  HostTensor want(DType::kBF16, {5});
  want.copy_from(x.host());
  x.upload();
  x.download();
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(x.host().get(i), want.get(i));
}

TEST_F(CudaMemory, BadCopyArgumentsAreStatuses) {
  Buffer d = be().alloc(64).value();
  EXPECT_EQ(be().copy(nullptr, d.data(), 64, CopyKind::kDeviceToDevice).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(be().copy(d.data(), d.data(), 64, CopyKind::kDeviceToDevice, 999).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(be().memset_zero(nullptr, 8).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(be().synchronize(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(be().copy(nullptr, nullptr, 0, CopyKind::kHostToDevice).ok());  // nothing to do
}

TEST_F(CudaMemory, UnsupportedOpsAreRecordedOnceNotFatal) {
  // f16 activations reach no attention / MoE kernel: each call records kUnsupported instead of aborting.
  DeviceTensor q(be(), DType::kF16, {1, 2, 16}), kv(be(), DType::kF16, {1, 4, 16}), pos(be(), DType::kI32, {1});
  DeviceTensor logits(be(), DType::kF16, {1, 4}), pes(be(), DType::kF16, {4});
  DeviceTensor idx(be(), DType::kI32, {1, 2}), w(be(), DType::kF32, {1, 2});
  DeviceTensor gate_up(be(), DType::kF16, {4, 8, 16}), down(be(), DType::kF16, {4, 16, 4});
  DeviceTensor x(be(), DType::kF16, {1, 16}), y(be(), DType::kF16, {1, 16});
  be().attention({.out = q, .q = q, .kv = {.k = kv, .v = kv, .begin = 0, .end = 1}, .q_pos = pos});
  be().moe_route({.idx = idx, .weights = w, .logits = logits, .per_expert_scale = pes, .k = 2});  // only the first is kept
  Status st = be().last_error();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("attention"), std::string::npos) << st.to_string();
  EXPECT_TRUE(be().last_error().ok());
  // synchronize() reports a recorded failure too, once.
  be().moe_experts({.out = y, .x = x, .gate_up = gate_up, .down = down, .idx = idx, .weights = w});
  st = be().synchronize();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("moe_experts"), std::string::npos) << st.to_string();
  EXPECT_TRUE(be().last_error().ok());
}

TEST_F(CudaMemory, UnsupportedDtypeIsRecordedAndLeavesTheOutputAlone) {
  DeviceTensor x(be(), DType::kBF16, {2, 16}), w(be(), DType::kF16, {8, 16}), out(be(), DType::kBF16, {2, 8});
  fill_random(x.host(), 1);
  fill_random(w.host(), 2);
  x.upload();
  w.upload();
  out.poison();
  be().linear({.out = out, .x = x, .w = w});
  const Status st = be().last_error();
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  out.download();
  EXPECT_FALSE(has_no_nan(out.host()));  // still the poison: nothing was written
}

TEST(CudaBackendFactory, NoDeviceOrBadIndexIsAStatus) {
  auto b = make_cuda_backend(1000);
  ASSERT_FALSE(b.ok());
  if (cuda::device_count() == 0) {
    EXPECT_EQ(b.status().code(), StatusCode::kUnsupported) << b.status().to_string();
  } else {
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status().to_string();
  }
}

}  // namespace
}  // namespace tandem::testing
