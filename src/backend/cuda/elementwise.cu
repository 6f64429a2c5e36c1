// Elementwise ops and the embedding gather on the GPU: add, scale, softcap (spec §1.11), gelu_mul (GeGLU, spec
// §1.9), embedding (spec §1.3). Memory-bound grid-stride loops; dtypes are read at run time (f32/bf16/f16), math
// is f32. Where HF runs a composite op as several bf16 tensor ops (gelu then multiply; divide, tanh, multiply for
// the soft-cap), a bf16 output rounds each intermediate to bf16 the same way (spec §1.13).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_utils.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "core/strings.h"

namespace tandem::cuda {
namespace {

constexpr int kThreads = 256;

#define TANDEM_GRID_STRIDE(i, n)                                                                 \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

struct Operand {
  void* data;
  DType dtype;
};

Operand operand(const Tensor& t) { return {t.data, t.dtype}; }

bool is_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

__global__ void add_kernel(Operand out, Operand a, Operand b, float b_scale, int64_t n) {
  pdl_enter();
  TANDEM_GRID_STRIDE(i, n) {
    store_f32(out.data, out.dtype, i, load_f32(a.data, a.dtype, i) + load_f32(b.data, b.dtype, i) * b_scale);
  }
}

__global__ void scale_kernel(Operand x, float s, int64_t n) {
  pdl_enter();
  TANDEM_GRID_STRIDE(i, n) { store_f32(x.data, x.dtype, i, load_f32(x.data, x.dtype, i) * s); }
}

__global__ void softcap_kernel(Operand x, float cap, int64_t n) {
  pdl_enter();
  TANDEM_GRID_STRIDE(i, n) {
    const float v = round_to(x.dtype, load_f32(x.data, x.dtype, i) / cap);
    store_f32(x.data, x.dtype, i, round_to(x.dtype, tanhf(v)) * cap);
  }
}

// up's rows may be strided (up_stride >= dim elements; = dim when contiguous).
__global__ void gelu_mul_kernel(Operand out, Operand gate, Operand up, int64_t dim, int64_t up_stride, int64_t n) {
  pdl_enter();
  TANDEM_GRID_STRIDE(i, n) {
    const float g = round_to(out.dtype, gelu_tanh(load_f32(gate.data, gate.dtype, i)));
    store_f32(out.data, out.dtype, i, g * load_f32(up.data, up.dtype, i / dim * up_stride + i % dim));
  }
}

// gelu_mul_kernel for bf16 operands in whole 16-byte chunks (dim a multiple of 8; out, gate and each row of up
// 16-byte aligned): a thread takes 8 elements at a time, with gelu_mul_kernel's arithmetic for each (the same bits),
// and one row/column division per chunk instead of per element. out may be gate (each chunk is read before written).
__global__ void gelu_mul_bf16x8_kernel(__nv_bfloat16* out, const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                       int64_t dim, int64_t up_stride, int64_t n_chunks) {
  pdl_enter();
  const int64_t row_chunks = dim / 8;
  TANDEM_GRID_STRIDE(c, n_chunks) {
    const int64_t r = c / row_chunks, col = (c - r * row_chunks) * 8;
    const uint4 g = *reinterpret_cast<const uint4*>(gate + c * 8);
    const uint4 u = *reinterpret_cast<const uint4*>(up + r * up_stride + col);
    const __nv_bfloat16* gv = reinterpret_cast<const __nv_bfloat16*>(&g);
    const __nv_bfloat16* uv = reinterpret_cast<const __nv_bfloat16*>(&u);
    uint4 o;
    __nv_bfloat16* ov = reinterpret_cast<__nv_bfloat16*>(&o);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float h = round_to(DType::kBF16, gelu_tanh(__bfloat162float(gv[j])));
      ov[j] = __float2bfloat16_rn(h * __bfloat162float(uv[j]));
    }
    *reinterpret_cast<uint4*>(out + c * 8) = o;
  }
}

// out[t, d] = table[ids[t], d] * scale. An id outside the table writes NaN rather than reading out of bounds
// (ids are validated on the host before they get here; this only keeps a bug from corrupting memory).
__global__ void embedding_kernel(Operand out, Operand table, const int32_t* ids, int64_t n_vocab, int64_t dim,
                                 int64_t row_stride, float scale, int64_t n) {
  pdl_enter();
  TANDEM_GRID_STRIDE(i, n) {
    const int64_t t = i / dim, d = i % dim;
    const int64_t id = ids[t];
    const float v = (id >= 0 && id < n_vocab) ? load_f32(table.data, table.dtype, id * row_stride + d) * scale : __int_as_float(0x7fc00000);
    store_f32(out.data, out.dtype, i, v);
  }
}

Status check_float(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (!is_float(t->dtype)) return unsupported(strfmt("cuda %s: dtype %s is not a float type", op, dtype_name(t->dtype)));
  }
  return ok_status();
}

}  // namespace

Status check_kernel_image() {
  cudaFuncAttributes attr{};
  return TANDEM_CUDA_STATUS(cudaFuncGetAttributes(&attr, scale_kernel));
}

void set_programmatic_launch(bool on) { pdl_flag().store(on, std::memory_order_relaxed); }
bool programmatic_launch() { return pdl_enabled(); }

Status launch_add(const AddArgs& a, cudaStream_t stream) {
  TANDEM_TRY(check_float("add", {&a.out, &a.a, &a.b}));
  const int64_t n = a.out.numel();
  if (n == 0) return ok_status();
  launch_kernel(add_kernel, grid_for(n, kThreads), kThreads, 0, stream, operand(a.out), operand(a.a), operand(a.b),
                a.b_scale, n);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_scale(const ScaleArgs& a, cudaStream_t stream) {
  TANDEM_TRY(check_float("scale", {&a.x}));
  const int64_t n = a.x.numel();
  if (n == 0) return ok_status();
  launch_kernel(scale_kernel, grid_for(n, kThreads), kThreads, 0, stream, operand(a.x), a.s, n);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_softcap(const SoftcapArgs& a, cudaStream_t stream) {
  TANDEM_TRY(check_float("softcap", {&a.x}));
  const int64_t n = a.x.numel();
  if (n == 0) return ok_status();
  launch_kernel(softcap_kernel, grid_for(n, kThreads), kThreads, 0, stream, operand(a.x), a.cap, n);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_gelu_mul(const GeluMulArgs& a, cudaStream_t stream) {
  TANDEM_TRY(check_float("gelu_mul", {&a.out, &a.gate, &a.up}));
  const int64_t n = a.out.numel();
  if (n == 0) return ok_status();
  const int64_t dim = a.up.dim(-1);
  const int64_t up_stride = a.up.is_contiguous() ? dim : a.up.stride[0];
  constexpr DType kB = DType::kBF16;
  if (a.out.dtype == kB && a.gate.dtype == kB && a.up.dtype == kB && dim % 8 == 0 && up_stride % 8 == 0 &&
      aligned16(a.out.data) && aligned16(a.gate.data) && aligned16(a.up.data)) {
    const int64_t chunks = n / 8;
    launch_kernel(gelu_mul_bf16x8_kernel, grid_for(chunks, kThreads), kThreads, 0, stream,
                  static_cast<__nv_bfloat16*>(a.out.data), static_cast<const __nv_bfloat16*>(a.gate.data),
                  static_cast<const __nv_bfloat16*>(a.up.data), dim, up_stride, chunks);
    TANDEM_CUDA_TRY_LAUNCH();
    return ok_status();
  }
  launch_kernel(gelu_mul_kernel, grid_for(n, kThreads), kThreads, 0, stream, operand(a.out), operand(a.gate),
                operand(a.up), dim, up_stride, n);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

Status launch_embedding(const EmbeddingArgs& a, cudaStream_t stream) {
  TANDEM_TRY(check_float("embedding", {&a.out, &a.table}));
  const int64_t dim = a.table.dim(1), n = a.out.numel();
  if (n == 0) return ok_status();
  launch_kernel(embedding_kernel, grid_for(n, kThreads), kThreads, 0, stream, operand(a.out), operand(a.table),
                static_cast<const int32_t*>(a.ids.data), a.table.dim(0), dim, a.table.stride[0], a.scale, n);
  TANDEM_CUDA_TRY_LAUNCH();
  return ok_status();
}

}  // namespace tandem::cuda
