// WeightStore: owns a checkpoint's memory. On the CPU the bound tensors stay zero-copy views into the mmapped
// safetensors files; on a device backend each tensor is copied once into device memory in its own dtype and
// the view is re-pointed there. Progress is reported for large checkpoints.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/safetensors.h"

namespace tandem {

// Called with (bytes done, bytes total) while weights are placed.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

class WeightStore {
 public:
  // Opens the safetensors files of checkpoint directory `dir`.
  static Result<WeightStore> open(const std::string& dir);
  // A store over tensors in host buffers it takes ownership of (synthetic checkpoints).
  static WeightStore from_memory(SafetensorsModel st, std::vector<Buffer> host_buffers);

  WeightStore() = default;
  WeightStore(WeightStore&&) noexcept = default;
  WeightStore& operator=(WeightStore&&) noexcept = default;

  [[nodiscard]] const SafetensorsModel& safetensors() const { return st_; }

  // Makes every tensor visited by `for_each` resident on `backend`: a no-op for host backends, one device
  // allocation + copy per tensor otherwise (the Tensor is re-pointed in place).
  using ForEach = std::function<void(const std::function<void(const std::string&, Tensor&)>&)>;
  Status place(Backend& backend, const ForEach& for_each, const ProgressFn& progress = {});
  [[nodiscard]] uint64_t device_bytes() const { return device_bytes_; }

 private:
  SafetensorsModel st_;
  std::vector<Buffer> host_;
  std::vector<Buffer> device_;
  uint64_t device_bytes_ = 0;
};

}  // namespace tandem
