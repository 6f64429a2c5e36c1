// Counter-based uniforms shared by the host and the GPU: uniform_at(seed, i) is a pure function of its arguments,
// so a sampler on any backend draws the same uniform for the same (seed, counter) without carrying RNG state
// between launches. A splitmix64 finaliser over the seed and the counter (both mixed, so nearby seeds and
// counters give unrelated streams); 53 random bits map to a double in [0, 1).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem {

TANDEM_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

TANDEM_HOST_DEVICE inline double uniform_at(uint64_t seed, uint64_t counter) {
  const uint64_t bits = mix64(mix64(seed + 0x9e3779b97f4a7c15ull) ^ (counter * 0xd1342543de82ef95ull + 1));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace tandem
