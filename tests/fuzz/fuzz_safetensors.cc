// libFuzzer target: parse_safetensors_header on arbitrary bytes (the whole input is the file). Any crash,
// sanitizer report or hang is a bug: a bad file must only ever produce a Status (spec §3.1, io/safetensors.h).
#include <cstddef>
#include <cstdint>

#include "core/log.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::set_log_level(tandem::LogLevel::kOff);
  auto r = tandem::parse_safetensors_header(data, size, "fuzz.safetensors");
  if (r.ok()) {
    // Every tensor handed out must lie inside the input and have a consistent size.
    for (const tandem::TensorInfo& t : *r) {
      const auto* p = static_cast<const uint8_t*>(t.data);
      if (p < data || p + t.nbytes > data + size) __builtin_trap();
      if (static_cast<uint64_t>(t.numel()) * tandem::dtype_size(t.dtype) != t.nbytes) __builtin_trap();
      if (t.shape.size() <= static_cast<size_t>(tandem::kMaxDims)) (void)t.view();
    }
  }
  return 0;
}
