// The CUDA backend (backend.h) on one GPU: device / pinned memory through the Allocator interface (cudaMalloc,
// cudaMallocHost; never managed memory), async copies and ops on owned non-blocking streams, and the ops of
// kernels.h plus linear() through cuBLASLt (gemm.h). Activations are bf16 with f32 accumulation. Ops never abort
// on a device error or an unsupported dtype/op: the first failure is recorded and returned by last_error() or by
// the next synchronize(), whichever comes first (each failure is reported once). One host thread drives a
// backend at a time. This header is internal: model code uses Backend; tests and benches use the extras below.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/fused_choice.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/op_profiler.h"

namespace tandem::cuda {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (the tests skip then).
int device_count();

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<CudaBackend>> create(int index);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  [[nodiscard]] const char* name() const override { return "cuda"; }
  [[nodiscard]] std::string describe_device() const override;
  [[nodiscard]] Device device() const override { return Device{DeviceKind::kCuda, index_}; }
  [[nodiscard]] DType activation_dtype() const override { return DType::kBF16; }
  [[nodiscard]] bool supports(Op op, DType weight_dtype) const override;

  // Allocator: kDevice -> cudaMalloc, kPinned -> cudaMallocHost, kHost -> the plain host allocator.
  void* allocate(size_t bytes, MemKind kind) override;
  void deallocate(void* ptr, size_t bytes, MemKind kind) override;

  Status copy(void* dst, const void* src, size_t bytes, CopyKind kind, StreamId stream = kDefaultStream) override;
  Status memset_zero(void* dst, size_t bytes, StreamId stream = kDefaultStream) override;
  Result<StreamId> create_stream() override;
  void set_stream(StreamId stream) override;
  // Waits for `stream`; returns its failure, else the first recorded op failure (then cleared).
  Status synchronize(StreamId stream = kDefaultStream) override;
  [[nodiscard]] StreamId current_stream() const override { return current_; }
  // True unless TANDEM_BRANCHES=0.
  [[nodiscard]] bool concurrent_streams() const override { return concurrent_streams_; }
  Status wait_stream(StreamId waiter, StreamId done) override;
  Status last_error() override;

  Result<GraphId> capture(const std::function<Status()>& body) override;
  Status replay(GraphId graph) override;
  void release_graph(GraphId graph) override;
  void set_profiling(bool on) override;
  std::string profile_report(int forwards) override;
  Status start_kernel_trace() override;
  Result<std::string> stop_kernel_trace(const std::string& title) override;

  void embedding(const EmbeddingArgs& a) override;
  void linear(const LinearArgs& a) override;
  void rms_norm(const RmsNormArgs& a) override;
  void rope(const RopeArgs& a) override;
  void kv_write(const KvWriteArgs& a) override;
  void attention(const AttentionArgs& a) override;
  void gelu_mul(const GeluMulArgs& a) override;
  void add(const AddArgs& a) override;
  void scale(const ScaleArgs& a) override;
  void softcap(const SoftcapArgs& a) override;
  void argmax(const ArgmaxArgs& a) override;
  void centroid_candidates(const CentroidCandidatesArgs& a) override;
  void sample(const SampleArgs& a) override;
  void reject_drafts(const RejectDraftsArgs& a) override;
  void moe_route(const MoeRouteArgs& a) override;
  void moe_experts(const MoeExpertsArgs& a) override;
  void geglu(const GegluArgs& a) override;
  void linear_gelu_mul(const LinearGeluMulArgs& a) override;
  void per_layer_input(const PerLayerInputArgs& a) override;
  void attn_out_mlp(const AttnOutMlpArgs& a) override;
  void linear_group(const LinearGroupArgs& a) override;
  void rms_norm_then(const RmsNormArgs& a, const RmsNormArgs& next) override;
  void rms_norm_seq(std::span<const RmsNormArgs> stages) override;
  void kv_norm_write(const KvNormWriteArgs& a) override;

  // CUDA extras (tests, benches, CUDA graphs later).
  [[nodiscard]] cudaStream_t cuda_stream(StreamId id) const;
  // Which implementation linear(a) would use (plans the cuBLASLt call on first use of a shape).
  Result<LinearPath> linear_path(const LinearArgs& a);
  [[nodiscard]] size_t gemm_plan_count() const { return gemm_->plan_count(); }
  // Decode/verify products: timed per shape (default), always on tandem's GEMV kernel, or on cuBLASLt (gemm.h).
  void set_gemv_mode(GemvMode m) { gemm_->set_gemv_mode(m); }
  [[nodiscard]] GemvMode gemv_mode() const { return gemm_->gemv_mode(); }
  // Most rows (0..9) geglu, linear_group and linear_gelu_mul always take as one GEMV launch. Default 2 (decode),
  // TANDEM_FUSED_GEMV_ROWS overrides. More rows, up to 9, take whichever of the fused launch and the composite ops
  // was faster when the shape was first timed (fused_choice.h; in the timed GEMV mode, unless timing is off); past
  // that, the composite.
  static constexpr int kMaxFusedGemvRows = 9;
  void set_fused_gemv_rows(int rows) {
    fused_gemv_rows_ = rows < 0 ? 0 : (rows > kMaxFusedGemvRows ? kMaxFusedGemvRows : rows);
  }
  [[nodiscard]] int fused_gemv_rows() const { return fused_gemv_rows_; }
  // Whether rows above fused_gemv_rows() are timed (on, unless TANDEM_FUSED_GEMV_ROWS is set); off, they take the
  // composite.
  void set_fused_gemv_timing(bool on) { fused_timing_ = on; }
  [[nodiscard]] bool fused_gemv_timing() const { return fused_timing_; }
  // The fused-or-composite shapes timed so far and their picks.
  [[nodiscard]] const FusedChoice& fused_choices() const { return fused_choice_; }
  [[nodiscard]] const cudaDeviceProp& properties() const { return props_; }

 private:
  explicit CudaBackend(int index) : index_(index) {}
  Status init();
  Status add_stream();
  // Makes this backend's GPU current for the calling thread; records and returns false on failure.
  bool activate();
  // Keeps the first failure until it is reported.
  void record(Status s);
  // rms_norm's argument checks (also for each stage of rms_norm_seq).
  void expect_rms_norm(const RmsNormArgs& a) const;
  // The current stream's workspace and the SM count, for attention's split-K and the MoE intermediates.
  [[nodiscard]] Scratch scratch() const;
  // moe_experts' scratch for `wanted` bytes: the workspace when it holds them or a graph capture is on (moe_experts
  // then runs the tokens in chunks that fit), else the stream's MoE scratch, grown now if it is smaller (when the
  // allocation fails: the largest scratch there is, and that size is not asked for again).
  Scratch moe_scratch(size_t wanted);
  [[nodiscard]] bool valid_stream(StreamId id) const { return id >= 0 && id < static_cast<StreamId>(streams_.size()); }
  // Whether an op of `key`'s shape runs as its fused launch: always up to fused_gemv_rows() rows; above that, the
  // timed pick (timing it now, outside a capture, where not yet timed; the composite while capturing). The timing
  // runs write the op's outputs.
  bool fuse(const FusedChoice::Key& key, const std::function<Status()>& fused, const std::function<void()>& composite);

  struct StreamState {
    cudaStream_t stream = nullptr;
    void* workspace = nullptr;  // cuBLASLt workspace, Gemm::kWorkspaceBytes
    // moe_experts' scratch when a prompt chunk's intermediates outgrow the workspace: grown on first need, outside
    // graph captures; moe_bytes = 0 when none.
    void* moe_scratch = nullptr;
    size_t moe_bytes = 0;
    size_t moe_refused = 0;  // the smallest size cudaMalloc refused (not asked for again); 0 when none
    cudaEvent_t done = nullptr;  // wait_stream(x, this stream) records it here
  };
  int index_;
  cudaDeviceProp props_{};
  std::vector<StreamState> streams_;
  StreamId current_ = kDefaultStream;
  std::unique_ptr<Gemm> gemm_;
  Status pending_;
  bool capturing_ = false;                 // inside capture(): ops skip cudaSetDevice
  int fused_gemv_rows_ = 2;                // see set_fused_gemv_rows
  bool fused_timing_ = true;               // see set_fused_gemv_timing
  FusedChoice fused_choice_;
  bool concurrent_streams_ = true;         // TANDEM_BRANCHES
  std::vector<cudaGraphExec_t> graphs_;    // by GraphId; released slots are null
  OpProfiler prof_;
};

}  // namespace tandem::cuda
