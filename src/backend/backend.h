// Backend: one device's memory, streams, capability queries and ops. The CPU backend (backend/cpu) and the CUDA
// backend (backend/cuda) implement it; model code calls only this interface, so it never special-cases devices.
// Ops are asynchronous on the backend's current stream (the CPU runs them inline); shapes are invariants of the
// calling code and are TANDEM_CHECKed, while device failures surface through last_error() and synchronize().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "backend/ops.h"
#include "core/status.h"
#include "tensor/buffer.h"

namespace tandem {

enum class CopyKind : uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost };
using StreamId = int;
inline constexpr StreamId kDefaultStream = 0;

class Backend : public Allocator {
 public:
  ~Backend() override = default;

  [[nodiscard]] virtual const char* name() const = 0;
  // The hardware in words, for reports (e.g. "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)").
  [[nodiscard]] virtual std::string describe_device() const { return name(); }
  [[nodiscard]] Device device() const override = 0;
  // Dtype of activations and of the KV cache this backend computes in (f32 on the CPU).
  [[nodiscard]] virtual DType activation_dtype() const = 0;
  // Whether `op` runs here with weights of `weight_dtype` (a query, never a crash).
  [[nodiscard]] virtual bool supports(Op op, DType weight_dtype) const = 0;

  // Memory. alloc() returns device memory for kDevice, host memory (pinned where possible) otherwise.
  Result<Buffer> alloc(size_t bytes, MemKind kind = MemKind::kDevice) { return Buffer::allocate(*this, bytes, kind); }
  virtual Status copy(void* dst, const void* src, size_t bytes, CopyKind kind, StreamId stream = kDefaultStream) = 0;
  virtual Status memset_zero(void* dst, size_t bytes, StreamId stream = kDefaultStream) = 0;

  // Streams. Ops run on the current stream.
  virtual Result<StreamId> create_stream() = 0;
  virtual void set_stream(StreamId stream) = 0;
  virtual Status synchronize(StreamId stream = kDefaultStream) = 0;
  [[nodiscard]] virtual StreamId current_stream() const = 0;
  // Whether ops on two streams may run at the same time (CUDA), so that model code gains from putting independent
  // work on a second stream; false where ops run inline in the order they are called (the CPU).
  [[nodiscard]] virtual bool concurrent_streams() const { return false; }
  // Cross-stream order (a fork or a join): work enqueued on `waiter` from now on starts only after all the work
  // enqueued on `done` so far. Also inside a graph capture, where it forks the side stream off the captured one or
  // joins it back (capture() requires every fork to be joined before body returns). Backends that run ops inline
  // have nothing to do.
  virtual Status wait_stream(StreamId /*waiter*/, StreamId /*done*/) { return ok_status(); }
  // The first asynchronous failure since the last call (ok if none), then cleared.
  virtual Status last_error() = 0;

  // Graphs (CUDA graphs): capture() records the ops that `body` enqueues on the current stream into a replayable
  // graph instead of running them, and returns its id; replay() runs it again on the current stream, reading the
  // same buffers (their contents may change in between). body must not synchronize, allocate or free device
  // memory, or copy from pageable host memory. Backends without graphs (the CPU) return kUnsupported from
  // capture(); callers then run body directly.
  using GraphId = int;
  virtual Result<GraphId> capture(const std::function<Status()>& /*body*/) {
    return unsupported(std::string("the ") + name() + " backend has no graphs");
  }
  virtual Status replay(GraphId /*graph*/) { return unsupported(std::string("the ") + name() + " backend has no graphs"); }
  virtual void release_graph(GraphId /*graph*/) {}

  // Per-op device times (`tandem bench --profile`): ops enqueued outside graph captures while profiling is on are
  // timed; profile_report() returns a table per forward (divided by `forwards`) and turns profiling off. Backends
  // without a profiler return an empty report.
  virtual void set_profiling(bool /*on*/) {}
  virtual std::string profile_report(int /*forwards*/) { return {}; }
  // Kernel timelines of graph replays (`tandem bench --trace`, kernel_timeline.h): start_kernel_trace() records the
  // device start and end of every kernel from then on; stop_kernel_trace() ends the trace and returns its report
  // headed by `title`. kUnsupported on backends (or builds) without a tracer.
  virtual Status start_kernel_trace() { return unsupported(std::string(name()) + ": no kernel tracer"); }
  virtual Result<std::string> stop_kernel_trace(const std::string& /*title*/) {
    return unsupported(std::string(name()) + ": no kernel tracer");
  }

  // Ops (ops.h).
  virtual void embedding(const EmbeddingArgs& a) = 0;
  virtual void linear(const LinearArgs& a) = 0;
  virtual void rms_norm(const RmsNormArgs& a) = 0;
  virtual void rope(const RopeArgs& a) = 0;
  virtual void kv_write(const KvWriteArgs& a) = 0;
  virtual void attention(const AttentionArgs& a) = 0;
  virtual void gelu_mul(const GeluMulArgs& a) = 0;
  virtual void add(const AddArgs& a) = 0;
  virtual void scale(const ScaleArgs& a) = 0;
  virtual void softcap(const SoftcapArgs& a) = 0;
  virtual void argmax(const ArgmaxArgs& a) = 0;
  virtual void moe_route(const MoeRouteArgs& a) = 0;
  virtual void moe_experts(const MoeExpertsArgs& a) = 0;
  // Sampling ops. The defaults (host_sampling.cc) copy the rows to the host, run the sample/ reference
  // (processed_probs, sample_at, verify_draft_at) and copy the results back, synchronizing; the CUDA backend runs
  // them on the device without a host round trip.
  virtual void sample(const SampleArgs& a);
  virtual void reject_drafts(const RejectDraftsArgs& a);
  // The masked embedder's cluster top-k and candidate tokens (ops.h). The default (host_centroid.cc) reads the
  // logits back and runs the reference on the host; the CUDA backend runs it on the device.
  virtual void centroid_candidates(const CentroidCandidatesArgs& a);
  // Composite op: two products and gelu_mul unless a backend fuses them (CUDA at decode sizes).
  virtual void geglu(const GegluArgs& a) {
    linear({.out = a.out, .x = a.x, .w = a.w_gate});
    linear({.out = a.up, .x = a.x, .w = a.w_up});
    gelu_mul({.out = a.out, .gate = a.out, .up = a.up});
  }
  // Composite op: linear, then gelu_mul with an outside up (ops.h LinearGeluMulArgs); CUDA fuses them at decode
  // sizes.
  virtual void linear_gelu_mul(const LinearGeluMulArgs& a) {
    linear({.out = a.out, .x = a.x, .w = a.w});
    gelu_mul({.out = a.out, .gate = a.out, .up = a.up});
  }
  // Composite op: rms_norm(a), then rms_norm(next) of its result (next.x is a.out), e.g. a layer's residual norm
  // and the next block's input norm; a backend may run both in one pass (CUDA), with the same bits.
  virtual void rms_norm_then(const RmsNormArgs& a, const RmsNormArgs& next) {
    rms_norm(a);
    rms_norm(next);
  }
  // Composite op: rms_norms applied in order, each stage's x, residual and out either a tensor no earlier stage
  // wrote or exactly an earlier stage's out (rows of the same shape), e.g. a MoE layer's residual norm followed by
  // the three norms of its result. A backend may run them in one launch (CUDA), with the same bits.
  virtual void rms_norm_seq(std::span<const RmsNormArgs> stages) {
    for (const RmsNormArgs& a : stages) rms_norm(a);
  }
  // Composite op: the k norm + RoPE, the v norm and the KV write (ops.h KvNormWriteArgs); CUDA runs them as one
  // launch with the same bits.
  virtual void kv_norm_write(const KvNormWriteArgs& a) {
    const KvWriteArgs& w = a.write;
    auto norm_rope = [&](const Tensor& x, const Tensor& weight) {  // in place
      rms_norm({.out = x, .x = x, .weight = weight, .eps = a.eps, .rope_pos = w.pos, .rope_inv_freq = a.rope_inv_freq});
    };
    if (!a.q.empty()) norm_rope(a.q, a.q_norm);
    norm_rope(w.k_new, a.k_norm);
    rms_norm({.out = w.v_new, .x = w.v_new, .weight = Tensor(), .eps = a.eps});
    kv_write(w);
  }
  // Composite op: the per-layer-input block (ops.h PerLayerInputArgs); CUDA runs it as one launch for one token.
  virtual void per_layer_input(const PerLayerInputArgs& a) {
    rms_norm({.out = a.x, .x = a.f, .weight = a.post_ffn_norm, .eps = a.eps, .residual = a.x});
    linear_gelu_mul({.out = a.gate_out, .x = a.x, .w = a.gate, .up = a.ple});
    linear({.out = a.proj_out, .x = a.gate_out, .w = a.proj});
    const RmsNormArgs post{
        .out = a.x, .x = a.proj_out, .weight = a.post_norm, .eps = a.eps, .residual = a.x, .out_scale = a.layer_scalar};
    if (a.next_out.empty()) {
      rms_norm(post);
    } else {
      rms_norm_then(post, {.out = a.next_out, .x = a.x, .weight = a.next_norm, .eps = a.eps});
    }
  }
  // Composite op: a dense layer's attention output product, norms and GeGLU MLP (ops.h AttnOutMlpArgs); CUDA runs
  // it as one launch for one token.
  virtual void attn_out_mlp(const AttnOutMlpArgs& a) {
    linear({.out = a.o, .x = a.attn, .w = a.o_proj});
    rms_norm_then({.out = a.x, .x = a.o, .weight = a.post_attn_norm, .eps = a.eps, .residual = a.x},
                  {.out = a.xn, .x = a.x, .weight = a.pre_ffn_norm, .eps = a.eps});
    geglu({.out = a.g, .x = a.xn, .w_gate = a.gate, .w_up = a.up, .up = a.u});
    linear({.out = a.f, .x = a.g, .w = a.down});
  }
  // Composite op: n products unless a backend fuses them (CUDA: one GEMV launch at decode sizes).
  virtual void linear_group(const LinearGroupArgs& a) {
    for (int i = 0; i < a.n; ++i) linear({.out = a.out[i], .x = a.x, .w = a.w[i]});
  }
};

// The CPU backend (always available). `threads` <= 0 uses OpenMP's default.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// The CUDA backend on device `index`; unsupported when tandem was built without CUDA or no GPU is present.
Result<std::unique_ptr<Backend>> make_cuda_backend(int index = 0);
// "cpu" or "cuda[:N]".
Result<std::unique_ptr<Backend>> make_backend(const std::string& spec);

}  // namespace tandem
