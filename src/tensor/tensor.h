// Tensor: a non-owning view (pointer, dtype, shape, strides, device). Owning memory is a Buffer (buffer.h).
// Shapes are row-major with the last dimension contiguous; strides are in elements. Up to 4 dimensions.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/check.h"
#include "tensor/dtype.h"

namespace tandem {

enum class DeviceKind : uint8_t { kCpu, kCuda };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;
  bool operator==(const Device&) const = default;
  [[nodiscard]] bool is_cpu() const { return kind == DeviceKind::kCpu; }
  [[nodiscard]] std::string to_string() const;
};

inline constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};
  Device device{};

  // A contiguous view over `data`.
  static Tensor make(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device = {});
  static Tensor make(void* data, DType dtype, const int64_t* shape, int ndim, Device device = {});

  [[nodiscard]] bool empty() const { return data == nullptr; }
  [[nodiscard]] int64_t numel() const;
  [[nodiscard]] size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  [[nodiscard]] bool is_contiguous() const;
  // Size of dimension i; negative i counts from the end.
  [[nodiscard]] int64_t dim(int i) const;
  // Number of rows when viewed as [rows, last_dim].
  [[nodiscard]] int64_t rows() const { return ndim == 0 ? 1 : numel() / shape[ndim - 1]; }

  template <class T>
  [[nodiscard]] T* ptr() const { return static_cast<T*>(data); }

  // Rows [begin, end) of dimension 0 (a view).
  [[nodiscard]] Tensor slice(int64_t begin, int64_t end) const;
  // Same memory, new contiguous shape with the same number of elements.
  [[nodiscard]] Tensor reshape(std::initializer_list<int64_t> new_shape) const;
  // "[3, 4] bf16"
  [[nodiscard]] std::string describe() const;
  [[nodiscard]] bool same_shape(const Tensor& o) const;
};

}  // namespace tandem
