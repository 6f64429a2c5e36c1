// The decode attention kernel's instantiation that norms its query rows itself (q_norm_attention): kNorm 1
// (attention_decode_kernel.cuh), in a file of its own so that it compiles beside the others.
#include "backend/cuda/attention_decode_kernel.cuh"

namespace tandem::cuda::decode {

template Status launch_decode<1>(const DecodeParams&, int, const DecodeShape&, const Scratch&, cudaStream_t);

}  // namespace tandem::cuda::decode
