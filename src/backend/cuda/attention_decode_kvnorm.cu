// The decode attention kernel's instantiation that norms its query rows and writes the new keys and values into the cache itself (kv_norm_write_attention): kNorm 2
// (attention_decode_kernel.cuh), in a file of its own so that it compiles beside the others.
#include "backend/cuda/attention_decode_kernel.cuh"

namespace tandem::cuda::decode {

template Status launch_decode<2>(const DecodeParams&, int, const DecodeShape&, const Scratch&, cudaStream_t);

}  // namespace tandem::cuda::decode
