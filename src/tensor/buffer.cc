// Buffer and the host allocator.
#include "tensor/buffer.h"

#include <cstdlib>
#include <cstring>

#include "core/strings.h"

namespace tandem {
namespace {
class HostAllocator final : public Allocator {
 public:
  void* allocate(size_t bytes, MemKind) override {
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    return std::aligned_alloc(64, rounded);
  }
  void deallocate(void* ptr, size_t, MemKind) override { std::free(ptr); }
  Device device() const override { return Device{}; }
};
}  // namespace

Allocator& host_allocator() {
  static HostAllocator a;
  return a;
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    alloc_ = o.alloc_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    kind_ = o.kind_;
    o.alloc_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Result<Buffer> Buffer::allocate(Allocator& alloc, size_t bytes, MemKind kind) {
  void* p = alloc.allocate(bytes, kind);
  if (!p) return resource_exhausted(strfmt("could not allocate %s of %s memory", human_bytes(bytes).c_str(),
                                           kind == MemKind::kDevice ? "device" : "host"));
  return Buffer(&alloc, p, bytes, kind);
}

Result<Buffer> Buffer::host(size_t bytes) {
  TANDEM_ASSIGN_OR_RETURN(Buffer b, allocate(host_allocator(), bytes, MemKind::kHost));
  std::memset(b.data(), 0, bytes);
  return b;
}

void Buffer::reset() {
  if (ptr_ && alloc_) alloc_->deallocate(ptr_, bytes_, kind_);
  alloc_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

Device Buffer::device() const {
  if (kind_ != MemKind::kDevice || !alloc_) return Device{};
  return alloc_->device();
}

Tensor Buffer::view(DType dtype, std::initializer_list<int64_t> shape, size_t offset) const {
  Tensor t = Tensor::make(static_cast<char*>(ptr_) + offset, dtype, shape, device());
  TANDEM_CHECK_MSG(offset + t.nbytes() <= bytes_, "view %s at offset %zu exceeds buffer of %zu bytes",
                   t.describe().c_str(), offset, bytes_);
  return t;
}

}  // namespace tandem
