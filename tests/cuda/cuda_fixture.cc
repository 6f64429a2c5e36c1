// The shared CUDA backend of the test binary and the helpers of cuda_fixture.h.
#include "cuda/cuda_fixture.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "core/strings.h"

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

}  // namespace tandem::testing
