// Buffer: owning memory of one kind (host, pinned host, device), released by the Allocator that made it.
// Move-only; copies of weights or activations are always explicit.
#pragma once

#include <cstdint>
#include <cstddef>
#include <initializer_list>

#include "core/status.h"
#include "tensor/tensor.h"

namespace tandem {

enum class MemKind : uint8_t { kHost, kPinned, kDevice };

class Allocator {
 public:
  virtual ~Allocator() = default;
  // nullptr on failure.
  virtual void* allocate(size_t bytes, MemKind kind) = 0;
  virtual void deallocate(void* ptr, size_t bytes, MemKind kind) = 0;
  [[nodiscard]] virtual Device device() const = 0;
};

// 64-byte aligned host memory.
Allocator& host_allocator();

class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator* alloc, void* ptr, size_t bytes, MemKind kind) : alloc_(alloc), ptr_(ptr), bytes_(bytes), kind_(kind) {}
  ~Buffer() { reset(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;

  // Allocates `bytes` of `kind` from `alloc`; a clear error when the allocation fails.
  static Result<Buffer> allocate(Allocator& alloc, size_t bytes, MemKind kind);
  // Host buffer, zero-filled.
  static Result<Buffer> host(size_t bytes);

  void reset();
  [[nodiscard]] void* data() const { return ptr_; }
  [[nodiscard]] size_t size() const { return bytes_; }
  [[nodiscard]] MemKind kind() const { return kind_; }
  [[nodiscard]] Device device() const;
  // A contiguous tensor view at byte offset `offset` (checked to fit).
  [[nodiscard]] Tensor view(DType dtype, std::initializer_list<int64_t> shape, size_t offset = 0) const;

 private:
  Allocator* alloc_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  MemKind kind_ = MemKind::kHost;
};

}  // namespace tandem
