// Tensor view helpers.
#include "tensor/tensor.h"

#include "core/strings.h"

namespace tandem {

std::string Device::to_string() const {
  return kind == DeviceKind::kCpu ? std::string("cpu") : strfmt("cuda:%d", index);
}

Tensor Tensor::make(void* data, DType dtype, std::initializer_list<int64_t> shape, Device device) {
  TANDEM_CHECK(shape.size() <= kMaxDims);
  int64_t dims[kMaxDims];
  int n = 0;
  for (int64_t d : shape) dims[n++] = d;
  return make(data, dtype, dims, n, device);
}

Tensor Tensor::make(void* data, DType dtype, const int64_t* shape, int ndim, Device device) {
  TANDEM_CHECK(ndim >= 0 && ndim <= kMaxDims);
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  t.device = device;
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    TANDEM_CHECK_MSG(shape[i] >= 0, "negative dimension");
    t.shape[i] = shape[i];
    t.stride[i] = s;
    s *= shape[i];
  }
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != s) return false;
    s *= shape[i];
  }
  return true;
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += ndim;
  TANDEM_CHECK_MSG(i >= 0 && i < ndim, "dim %d of a %d-d tensor", i, ndim);
  return shape[i];
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  TANDEM_CHECK(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[0]);
  Tensor t = *this;
  t.shape[0] = end - begin;
  t.data = static_cast<char*>(data) + static_cast<size_t>(begin * stride[0]) * dtype_size(dtype);
  return t;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> new_shape) const {
  TANDEM_CHECK_MSG(is_contiguous(), "reshape of a non-contiguous tensor");
  Tensor t = make(data, dtype, new_shape, device);
  TANDEM_CHECK_MSG(t.numel() == numel(), "reshape %s to a shape of %lld elements", describe().c_str(),
                   static_cast<long long>(t.numel()));
  return t;
}

std::string Tensor::describe() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "] " + dtype_name(dtype);
}

bool Tensor::same_shape(const Tensor& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (shape[i] != o.shape[i]) return false;
  return true;
}

}  // namespace tandem
