// The bf16 host backend of bf16_host_backend.h: memory is plain host memory, every op forwards to kernels/ref.
#include "cuda/bf16_host_backend.h"

#include <cstring>
#include <memory>

#include "kernels/ref/ref.h"

namespace tandem::testing {
namespace {

class Bf16HostBackend final : public Backend {
 public:
  [[nodiscard]] const char* name() const override { return "bf16-host"; }
  [[nodiscard]] Device device() const override { return Device{}; }
  [[nodiscard]] DType activation_dtype() const override { return DType::kBF16; }
  [[nodiscard]] bool supports(Op, DType weight_dtype) const override { return dtype_is_float(weight_dtype); }

  void* allocate(size_t bytes, MemKind kind) override { return host_allocator().allocate(bytes, kind); }
  void deallocate(void* ptr, size_t bytes, MemKind kind) override { host_allocator().deallocate(ptr, bytes, kind); }
  Status copy(void* dst, const void* src, size_t bytes, CopyKind, StreamId) override {
    if (bytes) std::memmove(dst, src, bytes);
    return ok_status();
  }
  Status memset_zero(void* dst, size_t bytes, StreamId) override {
    if (bytes) std::memset(dst, 0, bytes);
    return ok_status();
  }
  Result<StreamId> create_stream() override { return next_stream_++; }
  void set_stream(StreamId stream) override { stream_ = stream; }
  Status synchronize(StreamId) override { return ok_status(); }
  [[nodiscard]] StreamId current_stream() const override { return stream_; }
  Status last_error() override { return ok_status(); }

  void embedding(const EmbeddingArgs& a) override { ref::embedding(a); }
  void linear(const LinearArgs& a) override { ref::linear(a); }
  void rms_norm(const RmsNormArgs& a) override { ref::rms_norm(a); }
  void rope(const RopeArgs& a) override { ref::rope(a); }
  void kv_write(const KvWriteArgs& a) override { ref::kv_write(a); }
  void attention(const AttentionArgs& a) override { ref::attention(a); }
  void gelu_mul(const GeluMulArgs& a) override { ref::gelu_mul(a); }
  void add(const AddArgs& a) override { ref::add(a); }
  void scale(const ScaleArgs& a) override { ref::scale(a); }
  void softcap(const SoftcapArgs& a) override { ref::softcap(a); }
  void argmax(const ArgmaxArgs& a) override { ref::argmax(a); }
  void moe_route(const MoeRouteArgs& a) override { ref::moe_route(a); }
  void moe_experts(const MoeExpertsArgs& a) override { ref::moe_experts(a); }

 private:
  StreamId next_stream_ = 1;
  StreamId stream_ = kDefaultStream;
};

}  // namespace

std::unique_ptr<Backend> make_bf16_host_backend() { return std::make_unique<Bf16HostBackend>(); }

}  // namespace tandem::testing
