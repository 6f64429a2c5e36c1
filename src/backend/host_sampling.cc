// The default sampling ops of Backend (backend.h): the rows go to the host, the sample/ reference processes them
// (processed_probs, sample_at, verify_draft_at) and the results come back. Exact for the CPU backend, whose
// "device" memory is host memory; the CUDA backend overrides both ops with kernels.
#include <vector>

#include "backend/backend.h"
#include "core/check.h"
#include "sample/counter_rng.h"
#include "sample/rejection.h"
#include "sample/sampling.h"

namespace tandem {
namespace {

// Rows of a [rows, n] tensor as host floats.
std::vector<float> to_host_f32(Backend& be, const Tensor& t) {
  const size_t count = static_cast<size_t>(t.numel());
  std::vector<uint8_t> raw(count * dtype_size(t.dtype));
  TANDEM_CHECK_MSG(be.copy(raw.data(), t.data, raw.size(), CopyKind::kDeviceToHost).ok() && be.synchronize().ok(),
                   "%s: reading %s back for sampling failed", be.name(), t.describe().c_str());
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = load_as_f32(raw.data(), t.dtype, static_cast<int64_t>(i));
  return out;
}

void to_device(Backend& be, const Tensor& dst, const void* src, size_t bytes) {
  TANDEM_CHECK_MSG(be.copy(dst.data, src, bytes, CopyKind::kHostToDevice).ok() && be.synchronize().ok(),
                   "%s: writing sampling results to %s failed", be.name(), dst.describe().c_str());
}

void expect_i32_rows(const Tensor& t, int64_t rows, const char* what) {
  TANDEM_CHECK_MSG(t.dtype == DType::kI32 && t.numel() == rows && t.is_contiguous(),
                   "sampling: %s is %s, wants i32 [%lld]", what, t.describe().c_str(), static_cast<long long>(rows));
}

void expect_probs(const Tensor& t, int64_t rows, int64_t n, const char* what) {
  TANDEM_CHECK_MSG(t.dtype == DType::kF32 && t.rows() == rows && t.dim(-1) == n && t.is_contiguous(),
                   "sampling: %s is %s, wants f32 [%lld, %lld]", what, t.describe().c_str(),
                   static_cast<long long>(rows), static_cast<long long>(n));
}

}  // namespace

void Backend::sample(const SampleArgs& a) {
  const int64_t rows = a.x.rows(), n = a.x.dim(-1);
  TANDEM_CHECK_MSG(n > 0 && a.temperature > 0.f, "sample: x %s, temperature %g", a.x.describe().c_str(),
                   static_cast<double>(a.temperature));
  expect_i32_rows(a.out, rows, "out");
  if (!a.probs.empty()) expect_probs(a.probs, rows, n, "probs");
  if (rows == 0) return;
  const std::vector<float> x = to_host_f32(*this, a.x);
  const SamplingParams sp{.temperature = a.temperature, .top_k = a.top_k, .top_p = a.top_p, .min_p = a.min_p};
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  std::vector<float> all_probs, p;
  for (int64_t r = 0; r < rows; ++r) {
    processed_probs(std::span(x).subspan(static_cast<size_t>(r * n), static_cast<size_t>(n)), sp, &p);
    tokens[static_cast<size_t>(r)] = sample_at(p, uniform_at(a.seed, a.counter + static_cast<uint64_t>(r)));
    if (!a.probs.empty()) all_probs.insert(all_probs.end(), p.begin(), p.end());
  }
  to_device(*this, a.out, tokens.data(), tokens.size() * sizeof(int32_t));
  if (!a.probs.empty()) to_device(*this, a.probs, all_probs.data(), all_probs.size() * sizeof(float));
}

void Backend::reject_drafts(const RejectDraftsArgs& a) {
  const int64_t rows = a.p.rows(), n = a.p.dim(-1);
  expect_probs(a.p, rows, n, "p");
  expect_probs(a.q, rows, n, "q");
  expect_i32_rows(a.draft, rows, "draft");
  expect_i32_rows(a.accepted, rows, "accepted");
  expect_i32_rows(a.token, rows, "token");
  if (rows == 0) return;
  const std::vector<float> p = to_host_f32(*this, a.p), q = to_host_f32(*this, a.q);
  std::vector<int32_t> draft(static_cast<size_t>(rows)), accepted(draft.size()), token(draft.size());
  TANDEM_CHECK_MSG(copy(draft.data(), a.draft.data, draft.size() * sizeof(int32_t), CopyKind::kDeviceToHost).ok() &&
                       synchronize().ok(),
                   "%s: reading the drafts back failed", name());
  for (int64_t r = 0; r < rows; ++r) {
    const size_t i = static_cast<size_t>(r);
    TANDEM_CHECK_MSG(draft[i] >= 0 && draft[i] < n, "reject_drafts: draft %d outside [0, %lld)", draft[i],
                     static_cast<long long>(n));
    const auto row = [&](const std::vector<float>& v) {
      return std::span(v).subspan(i * static_cast<size_t>(n), static_cast<size_t>(n));
    };
    const uint64_t c = a.counter + 2 * static_cast<uint64_t>(r);
    const Verdict v = verify_draft_at(row(p), row(q), draft[i], uniform_at(a.seed, c), uniform_at(a.seed, c + 1));
    accepted[i] = v.accepted ? 1 : 0;
    token[i] = v.token;
  }
  to_device(*this, a.accepted, accepted.data(), accepted.size() * sizeof(int32_t));
  to_device(*this, a.token, token.data(), token.size() * sizeof(int32_t));
}

}  // namespace tandem
