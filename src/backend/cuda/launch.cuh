// Kernel launches of the CUDA backend. launch_kernel() is `kernel<<<grid, block, smem, stream>>>(args...)` plus,
// where enabled, the programmatic-stream-serialization attribute: the kernel may begin launching while the one
// before it on the stream is still running, and waits in pdl_enter() (device_utils.cuh) until that one has
// completed. On a chain of small decode kernels this hides most of each launch's latency, also inside CUDA graphs
// (captured as programmatic edges). Enabled on sm_90 and newer unless TANDEM_PDL=0 (CudaBackend sets it).
// Launch errors reach cudaGetLastError() as with <<<>>>, so TANDEM_CUDA_TRY_LAUNCH() after a launch reports them.
// Included only by .cu files.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

inline std::atomic<bool>& pdl_flag() {
  static std::atomic<bool> on{false};
  return on;
}
inline bool pdl_enabled() { return pdl_flag().load(std::memory_order_relaxed); }

inline cudaLaunchConfig_t launch_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                        cudaLaunchAttribute* attrs, unsigned n_attrs) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attrs;
  cfg.numAttrs = n_attrs;
  return cfg;
}

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  const cudaLaunchConfig_t cfg = launch_config(grid, block, smem, stream, attr, pdl_enabled() ? 1 : 0);
  (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

// Lets Kernel launch with up to `bytes` of dynamic shared memory (past the 48 KB default), once per kernel and
// device: Kernel is a template argument because the instances of one kernel template share a signature, so a
// static per signature would serve several kernels. `bytes` must be the same at every call for one Kernel (the
// most any of its launches uses). Returns the attribute call's error (cudaSuccess when it was set before); a
// failure is not remembered, so the next call asks again.
template <auto Kernel>
cudaError_t allow_dynamic_smem(size_t bytes) {
  static std::atomic<uint64_t> done{0};  // bit d: device d set (devices past 63 ask every time)
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = dev >= 0 && dev < 64 ? uint64_t{1} << dev : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
  return e;
}

// The attributes of a launch of thread-block clusters of `cluster_x` consecutive blocks along x (sm_90+), and with
// `pdl` (where enabled) programmatic stream serialization as launch_kernel gives; returns how many are set.
inline unsigned cluster_attrs(cudaLaunchAttribute (&attr)[2], unsigned cluster_x, bool pdl) {
  attr[0] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1] = {};
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  return pdl && pdl_enabled() ? 2 : 1;
}

// A launch of thread-block clusters of `cluster_x` consecutive blocks along x, whose blocks share partial results
// through distributed shared memory (e.g. one cluster per logits row); launch_clusters_pdl also lets it start
// while the kernel before it runs (its kernel must call pdl_enter() before it touches global memory that kernel
// writes). Return the launch's error.
template <class... Params, class... Args>
cudaError_t launch_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                            unsigned cluster_x, Args&&... args) {
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = launch_config(grid, block, smem, stream, attr, cluster_attrs(attr, cluster_x, false));
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}
template <class... Params, class... Args>
cudaError_t launch_clusters_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                unsigned cluster_x, Args&&... args) {
  cudaLaunchAttribute attr[2];
  const cudaLaunchConfig_t cfg = launch_config(grid, block, smem, stream, attr, cluster_attrs(attr, cluster_x, true));
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

}  // namespace tandem::cuda
