// pdl_chain: what a kernel boundary costs in a chain of dependent kernels in a CUDA graph (not a test; prints a
// table). 1000 small kernels, each reading what the one before wrote, launched three ways:
//  - plain: stream order only;
//  - pdl: programmatic dependent launch as tandem's kernels use it (griddepcontrol.wait, then launch_dependents);
//  - spin: PDL launches that wait on a flag set by the previous kernel's last block (a fence and an atomic counter
//    per block) instead of griddepcontrol.wait.
// Reports microseconds per kernel for grids of 1 to 264 blocks. Usage: build-gpu/bench/cuda/pdl_chain
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                               \
  do {                                                                      \
    cudaError_t e = (x);                                                    \
    if (e != cudaSuccess) {                                                 \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

__device__ __forceinline__ void gd_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void gd_go() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Each block: read data[i] (written by the previous kernel), write data[i + 1] (block 0) and its own slot.
__device__ __forceinline__ void work(float* data, float* scratch, int i) {
  __shared__ float s;
  if (threadIdx.x == 0) s = data[i];
  __syncthreads();
  scratch[blockIdx.x * blockDim.x + threadIdx.x] = s + threadIdx.x;
  if (blockIdx.x == 0 && threadIdx.x == 0) data[i + 1] = s + 1.f;
}

__global__ void k_plain(float* data, float* scratch, unsigned* flags, unsigned* count, int i) {
  work(data, scratch, i);
}

__global__ void k_pdl(float* data, float* scratch, unsigned* flags, unsigned* count, int i) {
  gd_wait();
  gd_go();
  work(data, scratch, i);
}

__global__ void k_spin(float* data, float* scratch, unsigned* flags, unsigned* count, int i) {
  if (i > 0) {
    if (threadIdx.x == 0) {
      unsigned v;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flags + i) : "memory");
      } while (v == 0);
    }
    __syncthreads();
  }
  gd_go();
  work(data, scratch, i);
  // Last block to finish sets flags[i + 1].
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned done = atomicAdd(count + i, 1u) + 1;
    if (done == gridDim.x) {
      asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + i + 1), "r"(1u) : "memory");
    }
  }
}

using Kern = void (*)(float*, float*, unsigned*, unsigned*, int);

float time_chain(Kern k, bool pdl, int n, int blocks, int threads, float* data, float* scratch, unsigned* flags,
                 unsigned* count, cudaStream_t st) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  CK(cudaMemsetAsync(flags, 0, (n + 2) * sizeof(unsigned), st));
  CK(cudaMemsetAsync(count, 0, (n + 2) * sizeof(unsigned), st));
  for (int i = 0; i < n; ++i) {
    cudaLaunchAttribute attr[1] = {};
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = (pdl && i > 0) ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, k, data, scratch, flags, count, i));
  }
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int reps = 10;
  CK(cudaEventRecord(a, st));
  for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, st));
  CK(cudaEventRecord(b, st));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return ms * 1000.f / reps / n;
}

int main() {
  const int n = 1000;
  float *data, *scratch;
  unsigned *flags, *count;
  CK(cudaMalloc(&data, (n + 2) * sizeof(float)));
  CK(cudaMalloc(&scratch, 1024 * 1024 * sizeof(float)));
  CK(cudaMalloc(&flags, (n + 2) * sizeof(unsigned)));
  CK(cudaMalloc(&count, (n + 2) * sizeof(unsigned)));
  CK(cudaMemset(data, 0, (n + 2) * sizeof(float)));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  for (int blocks : {1, 16, 132, 264}) {
    for (int threads : {256}) {
      const float plain = time_chain(k_plain, false, n, blocks, threads, data, scratch, flags, count, st);
      const float pdl = time_chain(k_pdl, true, n, blocks, threads, data, scratch, flags, count, st);
      const float spin = time_chain(k_spin, true, n, blocks, threads, data, scratch, flags, count, st);
      float last = 0;
      CK(cudaMemcpy(&last, data + n, sizeof(float), cudaMemcpyDeviceToHost));
      std::printf("blocks %4d threads %4d: plain %.2f us  pdl %.2f us  spin %.2f us per kernel (chain value %g)\n",
                  blocks, threads, plain, pdl, spin, last);
    }
  }
  return 0;
}
