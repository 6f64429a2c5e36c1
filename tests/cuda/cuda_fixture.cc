// The shared CUDA backend of the test binary and the helpers of cuda_fixture.h.
#include "cuda/cuda_fixture.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "core/strings.h"
#include "kernels/ref/ref.h"

namespace tandem::testing {
namespace {

struct Shared {
  std::unique_ptr<cuda::CudaBackend> backend;
  std::string skip;   // set when there is no GPU
  std::string error;  // set when there is a GPU but no backend
};

Shared& shared() {
  static Shared s = [] {
    Shared r;
    if (cuda::device_count() == 0) {
      r.skip = "no CUDA device or driver on this machine: CUDA tests skipped (run them on the GPU machine)";
      return r;
    }
    auto b = cuda::CudaBackend::create(0);
    if (!b.ok()) {
      r.error = "a CUDA device is present but the backend failed: " + b.status().to_string();
      return r;
    }
    r.backend = std::move(b).value();
    return r;
  }();
  return s;
}

// Releases the backend before the CUDA runtime unloads at exit.
class ReleaseBackend : public ::testing::Environment {
 public:
  void TearDown() override { shared().backend.reset(); }
};
[[maybe_unused]] ::testing::Environment* const kReleaseBackend =
    ::testing::AddGlobalTestEnvironment(new ReleaseBackend);

}  // namespace

void CudaTest::SetUp() {
  Shared& s = shared();
  if (!s.skip.empty()) GTEST_SKIP() << s.skip;
  ASSERT_TRUE(s.error.empty()) << s.error;
  be_ = s.backend.get();
  be_->set_stream(kDefaultStream);
  const Status pending = be_->last_error();
  ASSERT_TRUE(pending.ok()) << "error left by an earlier test: " << pending.to_string();
}

void CudaTest::TearDown() {
  if (!be_) return;
  be_->set_stream(kDefaultStream);
  const Status st = be_->synchronize();
  EXPECT_TRUE(st.ok()) << st.to_string();
  const Status pending = be_->last_error();
  EXPECT_TRUE(pending.ok()) << pending.to_string();
}

DeviceTensor::DeviceTensor(cuda::CudaBackend& be, DType dtype, std::initializer_list<int64_t> shape)
    : be_(&be), host_(dtype, shape) {
  const size_t bytes = host_.t().nbytes();
  buf_ = be.alloc(bytes ? bytes : 1).value();
  dev_ = buf_.view(dtype, shape);
}

void DeviceTensor::upload() {
  const StreamId s = be_->current_stream();
  const Status st = be_->copy(dev_.data, host_.t().data, host_.t().nbytes(), CopyKind::kHostToDevice, s);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const Status sync = be_->synchronize(s);
  ASSERT_TRUE(sync.ok()) << sync.to_string();
}

void DeviceTensor::download() {
  const StreamId s = be_->current_stream();
  const Status st = be_->copy(host_.t().data, dev_.data, host_.t().nbytes(), CopyKind::kDeviceToHost, s);
  ASSERT_TRUE(st.ok()) << st.to_string();
  const Status sync = be_->synchronize(s);
  ASSERT_TRUE(sync.ok()) << sync.to_string();
}

void DeviceTensor::poison() {
  host_.poison();
  upload();
}

Tolerance tolerance_for(DType out, bool is_linear) {
  if (out == DType::kF32) return is_linear ? Tolerance{1e-3, 1e-2, 1e-3} : Tolerance{1e-5, 1e-4, 1e-5};
  return {1e-2, 1.0 / 64, 2e-2};
}

void expect_close(const HostTensor& got, const HostTensor& want, const Tolerance& tol) {
  ASSERT_EQ(got.numel(), want.numel());
  double diff2 = 0, ref2 = 0;
  int64_t nan_count = 0, first_nan = -1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    if (std::isnan(g)) {
      if (nan_count++ == 0) first_nan = i;
      continue;
    }
    diff2 += (g - w) * (g - w);
    ref2 += w * w;
  }
  ASSERT_EQ(nan_count, 0) << nan_count << " elements not written (NaN), the first at " << first_nan;
  const double rms = std::sqrt(ref2 / static_cast<double>(want.numel() ? want.numel() : 1));
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  EXPECT_LE(rel, tol.rel_l2) << "normwise relative error over " << want.numel() << " elements";
  int64_t bad = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    if (std::fabs(g - w) > tol.rtol * std::fabs(w) + tol.atol_rms * rms) {
      if (bad++ < 3) ADD_FAILURE() << "element " << i << ": got " << g << ", want " << w;
    }
  }
  EXPECT_EQ(bad, 0) << "elements outside the elementwise bound";
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.t().nbytes() == b.t().nbytes() && std::memcmp(a.t().data, b.t().data, a.t().nbytes()) == 0;
}

void fill_random(HostTensor& t, uint32_t seed) {
  std::mt19937 rng(seed);
  t.fill_uniform(rng, -1.f, 1.f);
}

void check_linear(cuda::CudaBackend& be, const LinearCase& c, int64_t n_tok, bool accumulate, uint32_t seed,
                  bool gemv) {
  SCOPED_TRACE(strfmt("T %lld K %lld N %lld x %s w %s out %s accumulate %d gemv %d", static_cast<long long>(n_tok),
                      static_cast<long long>(c.n_in), static_cast<long long>(c.n_out), dtype_name(c.x), dtype_name(c.w),
                      dtype_name(c.out), accumulate, gemv));
  GemvModeScope mode(be, gemv ? cuda::GemvMode::kOn : cuda::GemvMode::kOff);
  DeviceTensor x(be, c.x, {n_tok, c.n_in}), w(be, c.w, {c.n_out, c.n_in}), out(be, c.out, {n_tok, c.n_out});
  fill_random(x.host(), seed);
  fill_random(w.host(), seed + 1);
  x.upload();
  w.upload();
  HostTensor want(c.out, {n_tok, c.n_out});
  if (accumulate) {
    fill_random(out.host(), seed + 2);
    out.upload();
    want.copy_from(out.host());
  } else {
    out.poison();
  }
  const float alpha = accumulate ? 0.5f : 1.f;
  const LinearArgs args{.out = out, .x = x, .w = w, .alpha = alpha, .accumulate = accumulate};
  Result<cuda::LinearPath> path = be.linear_path(args);
  ASSERT_TRUE(path.ok()) << path.status().to_string();
  // While it is on, the GEMV kernel takes every bf16 product of 1..9 rows with K % 8 == 0 (fresh, aligned buffers).
  const bool gemv_takes = gemv && n_tok <= 9 && c.x == DType::kBF16 && c.w == DType::kBF16 && c.n_in % 8 == 0;
  const cuda::LinearPath want_path = gemv_takes ? cuda::LinearPath::kGemv : c.path;
  EXPECT_EQ(*path, want_path) << "path " << cuda::linear_path_name(*path);
  be.linear(args);
  out.download();
  ref::linear({.out = want, .x = x.host(), .w = w.host(), .alpha = alpha, .accumulate = accumulate});
  expect_close(out.host(), want, tolerance_for(c.out, /*is_linear=*/true));
}

void check_auto_linear(cuda::CudaBackend& be, int64_t n_tok, int64_t n_out, int64_t n_in, uint32_t seed,
                       const char* label) {
  SCOPED_TRACE(strfmt("%s: T=%lld [%lld x %lld]", label, static_cast<long long>(n_tok), static_cast<long long>(n_out),
                      static_cast<long long>(n_in)));
  GemvModeScope mode(be, cuda::GemvMode::kAuto);
  constexpr DType kBF16 = DType::kBF16;
  DeviceTensor x(be, kBF16, {n_tok, n_in}), w(be, kBF16, {n_out, n_in}), out(be, kBF16, {n_tok, n_out});
  fill_random(x.host(), seed);
  fill_random(w.host(), seed + 1);
  x.upload();
  w.upload();
  const LinearArgs args{.out = out, .x = x, .w = w};
  out.poison();
  be.linear(args);
  out.download();
  HostTensor first(kBF16, {n_tok, n_out}), want(kBF16, {n_tok, n_out});
  first.copy_from(out.host());
  ref::linear({.out = want, .x = x.host(), .w = w.host()});
  expect_close(first, want, tolerance_for(kBF16, true));
  Result<cuda::LinearPath> path = be.linear_path(args);
  ASSERT_TRUE(path.ok()) << path.status().to_string();
  if (n_tok == 1) {
    EXPECT_EQ(*path, cuda::LinearPath::kGemv) << "one row takes the GEMV untimed: " << cuda::linear_path_name(*path);
  } else {
    EXPECT_TRUE(*path == cuda::LinearPath::kGemv || *path == cuda::LinearPath::kCublasLt)
        << cuda::linear_path_name(*path);
  }
  std::printf("[%s] T=%lld [%lld x %lld]: %s\n", label, static_cast<long long>(n_tok), static_cast<long long>(n_out),
              static_cast<long long>(n_in), cuda::linear_path_name(*path));
  for (int i = 0; i < 3; ++i) {
    out.poison();
    be.linear(args);
    out.download();
    for (int64_t j = 0; j < n_tok * n_out; ++j) ASSERT_EQ(out.host().get(j), first.get(j)) << "element " << j;
  }
}

}  // namespace tandem::testing
