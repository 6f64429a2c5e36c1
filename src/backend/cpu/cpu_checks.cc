// Argument checks of the CPU backend (cpu_checks.h).
#include "backend/cpu/cpu_checks.h"

namespace tandem::cpu {
namespace {
void check_plain(const Tensor& t, const char* what) {
  TANDEM_CHECK_MSG(!t.empty(), "%s is empty", what);
  TANDEM_CHECK_MSG(t.device.is_cpu(), "%s is on %s, not the CPU", what, t.device.to_string().c_str());
  TANDEM_CHECK_MSG(t.is_contiguous(), "%s %s is not contiguous", what, t.describe().c_str());
}
}  // namespace

void check_act(const Tensor& t, const char* what) {
  check_plain(t, what);
  TANDEM_CHECK_MSG(t.dtype == DType::kF32, "%s must be f32 on the CPU, got %s", what, t.describe().c_str());
}

void check_act_rows(const Tensor& t, const char* what) {
  if (t.is_contiguous()) return check_act(t, what);
  TANDEM_CHECK_MSG(!t.empty() && t.device.is_cpu() && t.dtype == DType::kF32 && t.ndim == 2 && t.stride[1] == 1 &&
                       t.stride[0] >= t.shape[1],
                   "%s %s: expected f32 rows on the CPU with a row stride >= the row length", what,
                   t.describe().c_str());
}

void check_float(const Tensor& t, const char* what) {
  check_plain(t, what);
  TANDEM_CHECK_MSG(dtype_is_float(t.dtype), "%s must be f32/bf16/f16, got %s", what, t.describe().c_str());
}

void check_i32(const Tensor& t, const char* what) {
  check_plain(t, what);
  TANDEM_CHECK_MSG(t.dtype == DType::kI32, "%s must be i32, got %s", what, t.describe().c_str());
}

}  // namespace tandem::cpu
