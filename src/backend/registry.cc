// make_backend: the backend named by a device string ("cpu", "cuda", "cuda:N") from a flag or a config.
// The string comes from the user, so every malformed spec is an invalid_argument Status, never a crash.
#include <charconv>
#include <string>

#include "backend/backend.h"
#include "core/strings.h"

namespace tandem {

Result<std::unique_ptr<Backend>> make_backend(const std::string& spec) {
  if (spec == "cpu") return make_cpu_backend();
  if (spec == "cuda") return make_cuda_backend(0);
  if (starts_with(spec, "cuda:")) {
    const std::string_view digits = std::string_view(spec).substr(5);
    int index = -1;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || index < 0)
      return invalid_argument(strfmt("device '%s': expected cuda:N with N a device index", spec.c_str()));
    return make_cuda_backend(index);
  }
  return invalid_argument(strfmt("device '%s': expected \"cpu\", \"cuda\" or \"cuda:N\"", spec.c_str()));
}

}  // namespace tandem
