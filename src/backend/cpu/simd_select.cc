// Run-time choice of the CPU vector kernels (simd.h): AVX-512F when the CPU has it, else AVX2+FMA+F16C, else the
// portable scalar table. The ISA tables are only linked on x86-64 builds (see src/backend/CMakeLists.txt).
#include <cstring>

#if defined(TANDEM_CPU_X86_KERNELS)
#include <cpuid.h>
#endif

#include "backend/cpu/simd.h"

namespace tandem::cpu {

#if defined(TANDEM_CPU_X86_KERNELS)
extern const SimdOps kSimdOpsAvx512;
extern const SimdOps kSimdOpsAvx2;

namespace {
// F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know "f16c").
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
}  // namespace

const SimdOps* simd_ops_avx512() {
  // The AVX-512 file is also compiled with -mfma -mf16c, which every AVX-512F CPU has.
  return __builtin_cpu_supports("avx512f") && has_f16c() ? &kSimdOpsAvx512 : nullptr;
}
const SimdOps* simd_ops_avx2() {
  const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
  return ok ? &kSimdOpsAvx2 : nullptr;
}
#else
const SimdOps* simd_ops_avx512() { return nullptr; }
const SimdOps* simd_ops_avx2() { return nullptr; }
#endif

const SimdOps& simd_ops_best() {
  static const SimdOps* best = [] {
    if (const SimdOps* o = simd_ops_avx512()) return o;
    if (const SimdOps* o = simd_ops_avx2()) return o;
    return &simd_ops_scalar();
  }();
  return *best;
}

const SimdOps* simd_ops_named(const char* name) {
  if (name == nullptr || name[0] == '\0' || std::strcmp(name, "best") == 0) return &simd_ops_best();
  if (std::strcmp(name, "avx512") == 0) return simd_ops_avx512();
  if (std::strcmp(name, "avx2") == 0) return simd_ops_avx2();
  if (std::strcmp(name, "scalar") == 0) return &simd_ops_scalar();
  return nullptr;
}

}  // namespace tandem::cpu
