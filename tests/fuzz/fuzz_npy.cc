// libFuzzer target: parse_npy on arbitrary bytes. A bad .npy must produce a Status; an accepted one must hold
// exactly numel * dtype size bytes.
#include <cstddef>
#include <cstdint>

#include "io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = tandem::parse_npy(data, size, "fuzz.npy");
  if (r.ok() && static_cast<uint64_t>(r->numel()) * tandem::dtype_size(r->dtype) != r->bytes.size()) __builtin_trap();
  return 0;
}
