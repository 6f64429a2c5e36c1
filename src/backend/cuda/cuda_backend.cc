// CudaBackend (cuda_backend.h): device selection, memory, streams, error recording, and the op entry points that
// check shapes (invariants of the calling code, TANDEM_CHECKed like the CPU backend) before enqueueing the
// kernels of kernels.h / gemm.h on the current stream. Also make_cuda_backend() of backend.h.
#include "backend/cuda/cuda_backend.h"

#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_trace.h"
#include "backend/cuda/kernels.h"
#include "core/log.h"
#include "core/strings.h"

namespace tandem {
namespace cuda {
namespace {

cudaMemcpyKind to_cuda(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice: return cudaMemcpyHostToDevice;
    case CopyKind::kDeviceToHost: return cudaMemcpyDeviceToHost;
    case CopyKind::kDeviceToDevice: return cudaMemcpyDeviceToDevice;
    case CopyKind::kHostToHost: return cudaMemcpyHostToHost;
  }
  return cudaMemcpyDefault;
}

// Op arguments must live on this GPU; passing a host tensor to a CUDA op is a bug of the calling code.
void expect_gpu(const Tensor& t, int index, const char* op, const char* what, bool contiguous = true) {
  if (t.numel() == 0) return;
  TANDEM_CHECK_MSG(!t.empty(), "cuda %s: %s %s has no data", op, what, t.describe().c_str());
  TANDEM_CHECK_MSG(t.device.kind == DeviceKind::kCuda && t.device.index == index, "cuda %s: %s is on %s, not cuda:%d",
                   op, what, t.device.to_string().c_str(), index);
  TANDEM_CHECK_MSG(!contiguous || t.is_contiguous(), "cuda %s: %s %s is not contiguous", op, what,
                   t.describe().c_str());
}

// Profiler labels that tell the fused variants and the attention kinds apart.
std::string rms_norm_label(const RmsNormArgs& a) {
  if (!a.rope_pos.empty()) return "rms_norm+rope";
  if (!a.residual.empty()) return a.out_scale != 1.f ? "rms_norm+residual+scale" : "rms_norm+residual";
  return "rms_norm";
}

std::string attention_label(const AttentionArgs& a) {
  return strfmt("attention %lld tok, %s, head_dim %lld", static_cast<long long>(a.q.shape[0]),
                a.kv.ring ? "ring" : (a.window > 0 ? "window" : "full"), static_cast<long long>(a.q.shape[2]));
}

void expect_i32(const Tensor& t, const char* op, const char* what) {
  TANDEM_CHECK_MSG(t.dtype == DType::kI32, "cuda %s: %s must be i32, got %s", op, what, t.describe().c_str());
}

// The arguments of a KV-cache write (kv_write, kv_norm_write): new keys/values and positions on this GPU, and a
// [n_kv_heads, capacity, head_dim] storage (strided in its first two dims) that matches them.
void expect_kv_write(const KvWriteArgs& a, int index, const char* op) {
  expect_gpu(a.k_new, index, op, "k_new");
  expect_gpu(a.v_new, index, op, "v_new");
  expect_gpu(a.pos, index, op, "pos");
  expect_i32(a.pos, op, "pos");
  TANDEM_CHECK_MSG(a.k_new.ndim == 3 && a.k_new.same_shape(a.v_new) && a.pos.numel() == a.k_new.shape[0],
                   "cuda %s: k_new %s, v_new %s, pos %s", op, a.k_new.describe().c_str(), a.v_new.describe().c_str(),
                   a.pos.describe().c_str());
  for (const Tensor* t : {&a.kv.k, &a.kv.v}) {
    expect_gpu(*t, index, op, "kv storage", /*contiguous=*/false);
    TANDEM_CHECK_MSG(t->ndim == 3 && t->shape[0] == a.k_new.shape[1] && t->shape[2] == a.k_new.shape[2] &&
                         t->stride[2] == 1 && t->shape[1] == a.kv.k.shape[1],
                     "cuda %s: storage %s for k_new %s", op, t->describe().c_str(), a.k_new.describe().c_str());
  }
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int index) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return unsupported(strfmt("no usable CUDA device: %s (%s)", cudaGetErrorName(err), cudaGetErrorString(err)));
  }
  if (count == 0) return unsupported("no CUDA device");
  if (index < 0 || index >= count)
    return invalid_argument(strfmt("cuda:%d: this machine has %d CUDA device(s)", index, count));
  std::unique_ptr<CudaBackend> b(new CudaBackend(index));
  TANDEM_TRY(b->init().with_context(strfmt("cuda:%d", index)));
  return b;
}

Status CudaBackend::init() {
  TANDEM_CUDA_TRY(cudaSetDevice(index_));
  TANDEM_CUDA_TRY(cudaGetDeviceProperties(&props_, index_));
  Status image = check_kernel_image();
  if (!image.ok()) {
    return unsupported(strfmt("%s (sm_%d%d) cannot run this build's kernels (built for CUDA architectures %s): %s",
                              props_.name, props_.major, props_.minor, TANDEM_CUDA_ARCHS, image.message().c_str()));
  }
  // Switches that are on unless their variable is "0".
  auto switched_off = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && std::string_view(v) == "0";
  };
  // An integer setting in [lo, hi]; unset or anything else (with a warning) leaves the default.
  auto env_int = [](const char* name, long lo, long hi) -> std::optional<int> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end != v && *end == '\0' && n >= lo && n <= hi) return static_cast<int>(n);
    TANDEM_LOG_WARN("%s=%s ignored (an integer %ld..%ld)", name, v, lo, hi);
    return std::nullopt;
  };
  set_programmatic_launch(props_.major >= 9 && !switched_off("TANDEM_PDL"));
  set_weight_prefetch(!switched_off("TANDEM_WEIGHT_PREFETCH"));
  if (const auto rows = env_int("TANDEM_GEMV_EARLY_ROWS", 1, 9)) set_gemv_early_rows(*rows);
  set_gemv_tc(!switched_off("TANDEM_GEMV_TC"));
  set_gemv_tc_split(!switched_off("TANDEM_GEMV_TC_SPLIT"));
  if (const auto rows = env_int("TANDEM_GEMV_TC_MIN_ROWS", 2, 10)) set_gemv_tc_min_rows(*rows);
  set_gemv_balance(!switched_off("TANDEM_GEMV_BALANCE"));
  set_moe_staged(!switched_off("TANDEM_MOE_STAGED"));
  set_moe_down_early(!switched_off("TANDEM_MOE_EARLY"));
  concurrent_streams_ = !switched_off("TANDEM_BRANCHES");
  set_fused_per_layer_input(!switched_off("TANDEM_FUSED_PLE"));
  set_norm_regs(!switched_off("TANDEM_NORM_REGS"));
  set_keep_norm_weights(!switched_off("TANDEM_L2_KEEP"));
  set_per_layer_input_prefetch(!switched_off("TANDEM_PLI_PREFETCH"));
  if (const char* mlp = std::getenv("TANDEM_FUSED_MLP")) set_fused_attn_out_mlp(std::string_view(mlp) == "1");
  if (const char* fit = std::getenv("TANDEM_GEMV_FIT")) {
    if (std::string_view(fit) == "0" || std::string_view(fit) == "1" || std::string_view(fit) == "2") {
      set_gemv_fit(fit[0] - '0');
    } else {
      TANDEM_LOG_WARN("TANDEM_GEMV_FIT=%s ignored (0, 1 or 2)", fit);
    }
  }
  if (const auto rows = env_int("TANDEM_FUSED_GEMV_ROWS", 0, kMaxFusedGemvRows)) {
    fused_gemv_rows_ = *rows;
    fused_timing_ = false;  // a fixed threshold: more rows take the composite
  }
  TANDEM_TRY(add_stream());
  TANDEM_ASSIGN_OR_RETURN(gemm_, Gemm::create(props_.multiProcessorCount));
  TANDEM_LOG_DEBUG("cuda:%d: %s, sm_%d%d, %s", index_, props_.name, props_.major, props_.minor,
                   human_bytes(props_.totalGlobalMem).c_str());
  return ok_status();
}

std::string CudaBackend::describe_device() const {
  return strfmt("%s (sm_%d%d, %d SMs, %s)", props_.name, props_.major, props_.minor, props_.multiProcessorCount,
                human_bytes(props_.totalGlobalMem).c_str());
}

CudaBackend::~CudaBackend() {
  if (cudaSetDevice(index_) != cudaSuccess) return;  // no context left to clean up
  for (const StreamState& s : streams_) (void)cudaStreamSynchronize(s.stream);
  for (cudaGraphExec_t g : graphs_)
    if (g) (void)cudaGraphExecDestroy(g);
  gemm_.reset();
  for (const StreamState& s : streams_) {
    if (s.workspace) (void)cudaFree(s.workspace);
    if (s.moe_scratch) (void)cudaFree(s.moe_scratch);
    if (s.done) (void)cudaEventDestroy(s.done);
    (void)cudaStreamDestroy(s.stream);
  }
  (void)cudaGetLastError();
}

Status CudaBackend::add_stream() {
  StreamState s;
  // Non-blocking: never serialises with the legacy default stream, and capturable into CUDA graphs.
  TANDEM_CUDA_TRY(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  Status st = TANDEM_CUDA_STATUS(cudaMalloc(&s.workspace, Gemm::kWorkspaceBytes));
  if (st.ok()) st = TANDEM_CUDA_STATUS(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  if (!st.ok()) {
    if (s.workspace) (void)cudaFree(s.workspace);
    (void)cudaStreamDestroy(s.stream);
    (void)cudaGetLastError();
    return st.with_context("stream workspace");
  }
  streams_.push_back(s);
  return ok_status();
}

bool CudaBackend::activate() {
  if (capturing_) return true;  // capture() made the device current; no runtime calls inside a capture
  Status st = TANDEM_CUDA_STATUS(cudaSetDevice(index_));
  if (st.ok()) return true;
  record(std::move(st));
  return false;
}

void CudaBackend::record(Status s) {
  if (!s.ok() && pending_.ok()) pending_ = std::move(s);
}

bool CudaBackend::supports(Op op, DType weight_dtype) const {
  const bool f32_or_bf16 = weight_dtype == DType::kF32 || weight_dtype == DType::kBF16;
  switch (op) {
    case Op::kEmbedding:
    case Op::kLinear:
    case Op::kRmsNorm:
    case Op::kRope:
    case Op::kKvWrite:
    case Op::kGeluMul:
    case Op::kAdd:
    case Op::kScale:
    case Op::kSoftcap:
    case Op::kArgmax:
    case Op::kSample:
    case Op::kRejectDrafts:
    case Op::kAttention:
    case Op::kMoeRoute:
    case Op::kMoeExperts: return f32_or_bf16;
    default: return false;
  }
}

cudaStream_t CudaBackend::cuda_stream(StreamId id) const {
  TANDEM_CHECK_MSG(valid_stream(id), "cuda: no stream %d", id);
  return streams_[static_cast<size_t>(id)].stream;
}

// ---- memory ----

void* CudaBackend::allocate(size_t bytes, MemKind kind) {
  if (kind == MemKind::kHost) return host_allocator().allocate(bytes, kind);
  if (!activate()) return nullptr;
  void* p = nullptr;
  const size_t n = bytes == 0 ? 1 : bytes;
  const cudaError_t err = kind == MemKind::kDevice ? cudaMalloc(&p, n) : cudaMallocHost(&p, n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: clear it so later calls do not see it; the caller gets a Status
    TANDEM_LOG_DEBUG("cuda:%d: allocating %s of %s memory: %s", index_, human_bytes(bytes).c_str(),
                     kind == MemKind::kDevice ? "device" : "pinned", cudaGetErrorString(err));
    return nullptr;
  }
  return p;
}

void CudaBackend::deallocate(void* ptr, size_t bytes, MemKind kind) {
  if (!ptr) return;
  if (kind == MemKind::kHost) return host_allocator().deallocate(ptr, bytes, kind);
  if (!activate()) return;
  record(kind == MemKind::kDevice ? TANDEM_CUDA_STATUS(cudaFree(ptr)) : TANDEM_CUDA_STATUS(cudaFreeHost(ptr)));
}

Status CudaBackend::copy(void* dst, const void* src, size_t bytes, CopyKind kind, StreamId stream) {
  if (bytes == 0) return ok_status();
  if (!dst || !src) return invalid_argument(strfmt("cuda copy of %zu bytes: null pointer", bytes));
  if (!valid_stream(stream)) return invalid_argument(strfmt("cuda copy: no stream %d", stream));
  TANDEM_CUDA_TRY(cudaSetDevice(index_));
  TANDEM_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, to_cuda(kind), streams_[static_cast<size_t>(stream)].stream));
  return ok_status();
}

Status CudaBackend::memset_zero(void* dst, size_t bytes, StreamId stream) {
  if (bytes == 0) return ok_status();
  if (!dst) return invalid_argument(strfmt("cuda memset of %zu bytes: null pointer", bytes));
  if (!valid_stream(stream)) return invalid_argument(strfmt("cuda memset: no stream %d", stream));
  TANDEM_CUDA_TRY(cudaSetDevice(index_));
  TANDEM_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, streams_[static_cast<size_t>(stream)].stream));
  return ok_status();
}

// ---- streams and errors ----

Result<StreamId> CudaBackend::create_stream() {
  TANDEM_CUDA_TRY(cudaSetDevice(index_));
  TANDEM_TRY(add_stream());
  return static_cast<StreamId>(streams_.size() - 1);
}

void CudaBackend::set_stream(StreamId stream) {
  TANDEM_CHECK_MSG(valid_stream(stream), "cuda: set_stream(%d) of %zu streams", stream, streams_.size());
  current_ = stream;
}

Status CudaBackend::synchronize(StreamId stream) {
  if (!valid_stream(stream)) return invalid_argument(strfmt("cuda synchronize: no stream %d", stream));
  TANDEM_CUDA_TRY(cudaSetDevice(index_));
  TANDEM_CUDA_TRY(cudaStreamSynchronize(streams_[static_cast<size_t>(stream)].stream));
  return std::exchange(pending_, Status());
}

Status CudaBackend::wait_stream(StreamId waiter, StreamId done) {
  if (!valid_stream(waiter) || !valid_stream(done))
    return invalid_argument(strfmt("cuda wait_stream(%d, %d) of %zu streams", waiter, done, streams_.size()));
  if (waiter == done) return ok_status();
  if (!capturing_) TANDEM_CUDA_TRY(cudaSetDevice(index_));
  // One event per signalling stream is enough: a wait takes the event's state at the time it is enqueued.
  const StreamState& d = streams_[static_cast<size_t>(done)];
  TANDEM_CUDA_TRY(cudaEventRecord(d.done, d.stream));
  TANDEM_CUDA_TRY(cudaStreamWaitEvent(streams_[static_cast<size_t>(waiter)].stream, d.done, 0));
  return ok_status();
}

Status CudaBackend::last_error() {
  if (!pending_.ok()) return std::exchange(pending_, Status());
  return TANDEM_CUDA_STATUS(cudaGetLastError());
}

// ---- graphs ----

Result<Backend::GraphId> CudaBackend::capture(const std::function<Status()>& body) {
  TANDEM_CHECK_MSG(!capturing_, "cuda: nested graph capture");
  TANDEM_CUDA_TRY(cudaSetDevice(index_));
  TANDEM_TRY(std::exchange(pending_, Status()));  // an earlier failure is reported, not captured over
  const cudaStream_t stream = cuda_stream(current_);
  TANDEM_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  Status st = body();
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  if (st.ok()) st = std::exchange(pending_, Status());
  if (st.ok()) st = TANDEM_CUDA_STATUS(end);
  cudaGraphExec_t exec = nullptr;
  if (st.ok()) st = TANDEM_CUDA_STATUS(cudaGraphInstantiate(&exec, graph, 0));
  if (graph) (void)cudaGraphDestroy(graph);
  if (!st.ok()) {
    (void)cudaGetLastError();  // a failed capture leaves no sticky error behind
    pending_ = Status();
    return std::move(st).with_context("capturing a CUDA graph");
  }
  for (size_t i = 0; i < graphs_.size(); ++i) {
    if (!graphs_[i]) {
      graphs_[i] = exec;
      return static_cast<GraphId>(i);
    }
  }
  graphs_.push_back(exec);
  return static_cast<GraphId>(graphs_.size() - 1);
}

Status CudaBackend::replay(GraphId graph) {
  if (graph < 0 || static_cast<size_t>(graph) >= graphs_.size() || !graphs_[static_cast<size_t>(graph)])
    return invalid_argument(strfmt("cuda: no graph %d", graph));
  TANDEM_CUDA_TRY(cudaSetDevice(index_));
  TANDEM_CUDA_TRY(cudaGraphLaunch(graphs_[static_cast<size_t>(graph)], cuda_stream(current_)));
  return ok_status();
}

void CudaBackend::set_profiling(bool on) { prof_.set_enabled(on); }

std::string CudaBackend::profile_report(int forwards) {
  std::string r = prof_.report(forwards);
  prof_.set_enabled(false);
  return r;
}

Status CudaBackend::start_kernel_trace() {
  TANDEM_TRY(synchronize(current_));  // earlier work stays out of the trace
  return kernel_trace_begin();
}

Result<std::string> CudaBackend::stop_kernel_trace(const std::string& title) {
  const Status done = synchronize(current_);  // every traced kernel has ended before the flush
  TANDEM_ASSIGN_OR_RETURN(std::vector<KernelSpan> spans, kernel_trace_end());
  TANDEM_TRY(done);
  return timeline_report(spans, title);
}

void CudaBackend::release_graph(GraphId graph) {
  if (graph < 0 || static_cast<size_t>(graph) >= graphs_.size() || !graphs_[static_cast<size_t>(graph)]) return;
  if (!activate()) return;
  // A replay may still run: cudaGraphExecDestroy defers the release until it completes.
  record(TANDEM_CUDA_STATUS(cudaGraphExecDestroy(graphs_[static_cast<size_t>(graph)])));
  graphs_[static_cast<size_t>(graph)] = nullptr;
}

Result<LinearPath> CudaBackend::linear_path(const LinearArgs& a) {
  TANDEM_CUDA_TRY(cudaSetDevice(index_));
  return gemm_->choose(a);
}

// ---- ops ----

void CudaBackend::embedding(const EmbeddingArgs& a) {
  expect_gpu(a.out, index_, "embedding", "out");
  expect_gpu(a.table, index_, "embedding", "table", /*contiguous=*/false);  // row-strided PLE column slices
  expect_gpu(a.ids, index_, "embedding", "ids");
  expect_i32(a.ids, "embedding", "ids");
  TANDEM_CHECK_MSG(a.table.ndim == 2 && a.out.rows() == a.ids.numel() && a.out.dim(-1) == a.table.dim(1),
                   "cuda embedding: out %s, table %s, ids %s", a.out.describe().c_str(), a.table.describe().c_str(),
                   a.ids.describe().c_str());
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_embedding(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "embedding");
}

void CudaBackend::linear(const LinearArgs& a) {
  expect_gpu(a.out, index_, "linear", "out");
  expect_gpu(a.x, index_, "linear", "x");
  expect_gpu(a.w, index_, "linear", "w");
  TANDEM_CHECK_MSG(a.w.ndim == 2 && a.x.ndim >= 1 && a.out.ndim >= 1 && a.x.dim(-1) == a.w.dim(1) &&
                       a.out.dim(-1) == a.w.dim(0) && a.out.rows() == a.x.rows(),
                   "cuda linear: out %s, x %s, w %s", a.out.describe().c_str(), a.x.describe().c_str(),
                   a.w.describe().c_str());
  if (!activate()) return;
  const StreamState& s = streams_[static_cast<size_t>(current_)];
  const int pt = prof_.begin(s.stream);
  record(gemm_->run(a, s.stream, s.workspace));
  if (pt >= 0) {
    Result<LinearPath> path = gemm_->choose(a);
    prof_.end(pt, s.stream, strfmt("linear %lldx%lld -> %lld (%s)", static_cast<long long>(a.x.rows()),
                                   static_cast<long long>(a.w.dim(1)), static_cast<long long>(a.w.dim(0)),
                                   path.ok() ? linear_path_name(*path) : "?"));
  }
}

void CudaBackend::expect_rms_norm(const RmsNormArgs& a) const {
  expect_gpu(a.out, index_, "rms_norm", "out");
  expect_gpu(a.x, index_, "rms_norm", "x");
  TANDEM_CHECK_MSG(a.x.ndim >= 1 && a.out.numel() == a.x.numel() && a.out.dim(-1) == a.x.dim(-1),
                   "cuda rms_norm: out %s, x %s", a.out.describe().c_str(), a.x.describe().c_str());
  if (!a.weight.empty()) {
    expect_gpu(a.weight, index_, "rms_norm", "weight");
    TANDEM_CHECK_MSG(a.weight.numel() == a.x.dim(-1), "cuda rms_norm: weight %s for x %s",
                     a.weight.describe().c_str(), a.x.describe().c_str());
  }
  if (!a.residual.empty()) {
    expect_gpu(a.residual, index_, "rms_norm", "residual");
    TANDEM_CHECK_MSG(a.residual.numel() == a.out.numel(), "cuda rms_norm: residual %s for out %s",
                     a.residual.describe().c_str(), a.out.describe().c_str());
  }
  if (!a.rope_pos.empty() || !a.rope_inv_freq.empty()) {
    expect_gpu(a.rope_pos, index_, "rms_norm", "rope_pos");
    expect_gpu(a.rope_inv_freq, index_, "rms_norm", "rope_inv_freq");
    expect_i32(a.rope_pos, "rms_norm", "rope_pos");
    const int64_t head_dim = a.x.dim(-1), n_tok = a.rope_pos.numel();
    TANDEM_CHECK_MSG(a.residual.empty() && a.out_scale == 1.f && head_dim % 2 == 0 && n_tok > 0 &&
                         a.x.rows() % n_tok == 0 && a.rope_inv_freq.dtype == DType::kF32 &&
                         a.rope_inv_freq.numel() == head_dim / 2,
                     "cuda rms_norm with rope: x %s, pos %s, inv_freq %s, residual %s, out_scale %g",
                     a.x.describe().c_str(), a.rope_pos.describe().c_str(), a.rope_inv_freq.describe().c_str(),
                     a.residual.empty() ? "none" : a.residual.describe().c_str(), static_cast<double>(a.out_scale));
  }
}

void CudaBackend::rms_norm(const RmsNormArgs& a) {
  expect_rms_norm(a);
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_rms_norm(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), rms_norm_label(a));
}

void CudaBackend::rms_norm_then(const RmsNormArgs& a, const RmsNormArgs& next) {
  // One launch when the second norm can reduce in the order its own launch would; otherwise the two ops.
  if (!rms_norm_then_fusable(a, next)) return Backend::rms_norm_then(a, next);
  for (const Tensor* t : {&a.out, &a.x, &next.out}) expect_gpu(*t, index_, "rms_norm_then", "out/x");
  for (const Tensor* t : {&a.weight, &a.residual, &next.weight})
    if (!t->empty()) expect_gpu(*t, index_, "rms_norm_then", "weight/residual");
  TANDEM_CHECK_MSG(a.x.ndim >= 1 && a.out.numel() == a.x.numel() && a.out.dim(-1) == a.x.dim(-1) &&
                       (a.weight.empty() || a.weight.numel() == a.x.dim(-1)) &&
                       (next.weight.empty() || next.weight.numel() == a.x.dim(-1)) &&
                       (a.residual.empty() || a.residual.numel() == a.out.numel()),
                   "cuda rms_norm_then: out %s, x %s, next out %s", a.out.describe().c_str(), a.x.describe().c_str(),
                   next.out.describe().c_str());
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_rms_norm_then(a, next, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), rms_norm_label(a) + " + rms_norm");
}

void CudaBackend::per_layer_input(const PerLayerInputArgs& a) {
  // One launch for 1..9 tokens where it gives the composite's bits (its products on the GEMV); else the composite.
  if (gemm_->gemv_mode() == GemvMode::kOff || fused_gemv_rows_ < 1 || !per_layer_input_fusable(a))
    return Backend::per_layer_input(a);
  for (const Tensor* t : {&a.x, &a.f, &a.gate, &a.proj}) expect_gpu(*t, index_, "per_layer_input", "x/f/w");
  expect_gpu(a.ple, index_, "per_layer_input", "ple", /*contiguous=*/false);
  for (const Tensor* t : {&a.post_ffn_norm, &a.post_norm, &a.next_out, &a.next_norm})
    if (!t->empty()) expect_gpu(*t, index_, "per_layer_input", "norm");
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_per_layer_input(a, cuda_stream(current_)));
  if (pt >= 0)
    prof_.end(
        pt, cuda_stream(current_),
        strfmt("per_layer_input %lldx%lld", static_cast<long long>(a.x.rows()), static_cast<long long>(a.x.dim(-1))));
}

void CudaBackend::attn_out_mlp(const AttnOutMlpArgs& a) {
  // One persistent launch for one token where it gives the composite's bits (its products on the GEMV); else the
  // composite.
  if (gemm_->gemv_mode() == GemvMode::kOff || fused_gemv_rows_ < 1 || !attn_out_mlp_fusable(a))
    return Backend::attn_out_mlp(a);
  for (const Tensor* t : {&a.attn, &a.o_proj, &a.o, &a.x, &a.gate, &a.up, &a.g, &a.down, &a.f})
    expect_gpu(*t, index_, "attn_out_mlp", "tensor");
  for (const Tensor* t : {&a.post_attn_norm, &a.pre_ffn_norm})
    if (!t->empty()) expect_gpu(*t, index_, "attn_out_mlp", "norm");
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_attn_out_mlp(a, cuda_stream(current_)));
  if (pt >= 0)
    prof_.end(pt, cuda_stream(current_),
              strfmt("attn_out_mlp %lld -> %lld -> %lld", static_cast<long long>(a.attn.dim(-1)),
                     static_cast<long long>(a.x.dim(-1)), static_cast<long long>(a.gate.dim(0))));
}

void CudaBackend::rms_norm_seq(std::span<const RmsNormArgs> stages) {
  // One launch when every stage has the first one's rows and geometry and reads earlier outputs only as whole
  // tensors; otherwise one rms_norm each, in order.
  if (stages.size() < 2 || !rms_norm_seq_fusable(stages)) return Backend::rms_norm_seq(stages);
  for (const RmsNormArgs& a : stages) expect_rms_norm(a);
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_rms_norm_seq(stages, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), strfmt("rms_norm seq x%zu", stages.size()));
}

void CudaBackend::rope(const RopeArgs& a) {
  expect_gpu(a.x, index_, "rope", "x");
  expect_gpu(a.pos, index_, "rope", "pos");
  expect_gpu(a.inv_freq, index_, "rope", "inv_freq");
  expect_i32(a.pos, "rope", "pos");
  TANDEM_CHECK_MSG(a.x.ndim == 3 && a.x.shape[2] % 2 == 0 && a.pos.numel() == a.x.shape[0] &&
                       a.inv_freq.dtype == DType::kF32 && a.inv_freq.numel() == a.x.shape[2] / 2,
                   "cuda rope: x %s, pos %s, inv_freq %s", a.x.describe().c_str(), a.pos.describe().c_str(),
                   a.inv_freq.describe().c_str());
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_rope(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "rope");
}

void CudaBackend::kv_write(const KvWriteArgs& a) {
  expect_kv_write(a, index_, "kv_write");
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_kv_write(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "kv_write");
}

void CudaBackend::kv_norm_write(const KvNormWriteArgs& a) {
  // One launch when it gives the bits of the three ops; otherwise the three ops (which check their arguments).
  if (!kv_norm_write_fusable(a)) return Backend::kv_norm_write(a);
  const KvWriteArgs& w = a.write;
  expect_kv_write(w, index_, "kv_norm_write");
  expect_gpu(a.rope_inv_freq, index_, "kv_norm_write", "rope_inv_freq");
  if (!a.k_norm.empty()) expect_gpu(a.k_norm, index_, "kv_norm_write", "k_norm");
  TANDEM_CHECK_MSG(a.k_norm.empty() || a.k_norm.numel() == w.k_new.shape[2],
                   "cuda kv_norm_write: k_norm %s for k_new %s", a.k_norm.describe().c_str(),
                   w.k_new.describe().c_str());
  if (!a.q.empty()) expect_gpu(a.q, index_, "kv_norm_write", "q");
  if (!a.q_norm.empty()) {
    expect_gpu(a.q_norm, index_, "kv_norm_write", "q_norm");
    TANDEM_CHECK_MSG(a.q_norm.numel() == w.k_new.shape[2], "cuda kv_norm_write: q_norm %s",
                     a.q_norm.describe().c_str());
  }
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_kv_norm_write(a, cuda_stream(current_)));
  if (pt >= 0)
    prof_.end(pt, cuda_stream(current_),
              a.q.empty() ? "k norm+rope, v norm, kv_write" : "q+k norm+rope, v norm, kv_write");
}

void CudaBackend::gelu_mul(const GeluMulArgs& a) {
  expect_gpu(a.out, index_, "gelu_mul", "out");
  expect_gpu(a.gate, index_, "gelu_mul", "gate");
  expect_gpu(a.up, index_, "gelu_mul", "up", /*contiguous=*/a.up.ndim != 2);  // rows may be strided
  TANDEM_CHECK_MSG(a.out.numel() == a.gate.numel() && a.up.numel() == a.gate.numel() &&
                       (a.up.is_contiguous() || (a.up.stride[1] == 1 && a.up.stride[0] >= a.up.shape[1])),
                   "cuda gelu_mul: out %s, gate %s, up %s", a.out.describe().c_str(), a.gate.describe().c_str(),
                   a.up.describe().c_str());
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_gelu_mul(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "gelu_mul");
}

void CudaBackend::add(const AddArgs& a) {
  expect_gpu(a.out, index_, "add", "out");
  expect_gpu(a.a, index_, "add", "a");
  expect_gpu(a.b, index_, "add", "b");
  TANDEM_CHECK_MSG(a.out.numel() == a.a.numel() && a.b.numel() == a.a.numel(), "cuda add: out %s, a %s, b %s",
                   a.out.describe().c_str(), a.a.describe().c_str(), a.b.describe().c_str());
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_add(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "add");
}

void CudaBackend::scale(const ScaleArgs& a) {
  expect_gpu(a.x, index_, "scale", "x");
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_scale(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "scale");
}

void CudaBackend::softcap(const SoftcapArgs& a) {
  expect_gpu(a.x, index_, "softcap", "x");
  TANDEM_CHECK_MSG(a.cap > 0.f, "cuda softcap: cap %g", static_cast<double>(a.cap));
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_softcap(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "softcap");
}

void CudaBackend::argmax(const ArgmaxArgs& a) {
  expect_gpu(a.out, index_, "argmax", "out");
  expect_gpu(a.x, index_, "argmax", "x");
  expect_i32(a.out, "argmax", "out");
  if (!a.ids.empty()) {
    expect_gpu(a.ids, index_, "argmax", "ids");
    expect_i32(a.ids, "argmax", "ids");
  }
  TANDEM_CHECK_MSG(a.x.ndim >= 1 && a.x.dim(-1) > 0 && a.out.numel() == a.x.rows(), "cuda argmax: out %s, x %s",
                   a.out.describe().c_str(), a.x.describe().c_str());
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_argmax(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "argmax");
}

void CudaBackend::sample(const SampleArgs& a) {
  expect_gpu(a.out, index_, "sample", "out");
  expect_gpu(a.x, index_, "sample", "x");
  expect_i32(a.out, "sample", "out");
  const int64_t rows = a.x.rows(), n = a.x.dim(-1);
  TANDEM_CHECK_MSG(a.x.ndim >= 1 && n > 0 && a.out.numel() == rows && a.temperature > 0.f && a.top_k >= 0 &&
                       a.top_p > 0.f && a.top_p <= 1.f && a.min_p >= 0.f && a.min_p <= 1.f,
                   "cuda sample: out %s, x %s, temperature %g, top_k %d, top_p %g, min_p %g", a.out.describe().c_str(),
                   a.x.describe().c_str(), static_cast<double>(a.temperature), a.top_k, static_cast<double>(a.top_p),
                   static_cast<double>(a.min_p));
  if (!a.probs.empty()) {
    expect_gpu(a.probs, index_, "sample", "probs");
    TANDEM_CHECK_MSG(a.probs.dtype == DType::kF32 && a.probs.rows() == rows && a.probs.dim(-1) == n,
                     "cuda sample: probs %s for x %s", a.probs.describe().c_str(), a.x.describe().c_str());
  }
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_sample(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "sample");
}

void CudaBackend::reject_drafts(const RejectDraftsArgs& a) {
  const int64_t rows = a.p.rows(), n = a.p.dim(-1);
  for (const auto& [t, what] : {std::pair{&a.p, "p"}, std::pair{&a.q, "q"}}) {
    expect_gpu(*t, index_, "reject_drafts", what);
    TANDEM_CHECK_MSG(t->dtype == DType::kF32 && t->rows() == rows && t->dim(-1) == n, "cuda reject_drafts: %s %s", what,
                     t->describe().c_str());
  }
  for (const auto& [t, what] :
       {std::pair{&a.draft, "draft"}, std::pair{&a.accepted, "accepted"}, std::pair{&a.token, "token"}}) {
    expect_gpu(*t, index_, "reject_drafts", what);
    expect_i32(*t, "reject_drafts", what);
    TANDEM_CHECK_MSG(t->numel() == rows, "cuda reject_drafts: %s %s for %lld rows", what, t->describe().c_str(),
                     static_cast<long long>(rows));
  }
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_reject_drafts(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "reject_drafts");
}

Scratch CudaBackend::scratch() const {
  return {streams_[static_cast<size_t>(current_)].workspace, Gemm::kWorkspaceBytes, props_.multiProcessorCount};
}

Scratch CudaBackend::moe_scratch(size_t wanted) {
  const Scratch ws = scratch();
  if (wanted <= ws.bytes) return ws;
  StreamState& s = streams_[static_cast<size_t>(current_)];
  // A graph keeps only the workspace's address: the MoE scratch may be regrown (freed) later.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (capturing_ || cudaStreamIsCapturing(s.stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
    return ws;
  if (wanted <= s.moe_bytes) return {s.moe_scratch, s.moe_bytes, ws.sm_count};
  if (s.moe_refused != 0 && wanted >= s.moe_refused)
    return s.moe_bytes > ws.bytes ? Scratch{s.moe_scratch, s.moe_bytes, ws.sm_count} : ws;
  // The old buffer may still be read by this stream's queued kernels.
  if (s.moe_scratch != nullptr) {
    if (cudaStreamSynchronize(s.stream) != cudaSuccess) return ws;  // the error stays for the next check
    (void)cudaFree(s.moe_scratch);
    s.moe_scratch = nullptr;
    s.moe_bytes = 0;
  }
  if (cudaMalloc(&s.moe_scratch, wanted) != cudaSuccess) {
    (void)cudaGetLastError();  // out of memory: chunk the tokens in the workspace instead
    s.moe_scratch = nullptr;
    s.moe_refused = wanted;
    TANDEM_LOG_DEBUG("cuda moe_experts: no room for a %zu-byte scratch; prompt chunks' experts run in smaller chunks",
                     wanted);
    return ws;
  }
  s.moe_bytes = wanted;
  return {s.moe_scratch, s.moe_bytes, ws.sm_count};
}

void CudaBackend::attention(const AttentionArgs& a) {
  expect_gpu(a.out, index_, "attention", "out");
  expect_gpu(a.q, index_, "attention", "q");
  expect_gpu(a.q_pos, index_, "attention", "q_pos");
  expect_i32(a.q_pos, "attention", "q_pos");
  const KvView& kv = a.kv;
  TANDEM_CHECK_MSG(a.q.ndim == 3 && a.out.same_shape(a.q) && a.q_pos.numel() == a.q.shape[0] && a.window >= 0,
                   "cuda attention: out %s, q %s, q_pos %s, window %lld", a.out.describe().c_str(),
                   a.q.describe().c_str(), a.q_pos.describe().c_str(), static_cast<long long>(a.window));
  for (const Tensor* t : {&kv.k, &kv.v}) {
    expect_gpu(*t, index_, "attention", "kv storage", /*contiguous=*/false);
    TANDEM_CHECK_MSG(t->ndim == 3 && t->shape[0] > 0 && a.q.shape[1] % t->shape[0] == 0 &&
                         t->shape[2] == a.q.shape[2] && t->stride[2] == 1 && t->shape[0] == kv.k.shape[0] &&
                         t->shape[1] == kv.k.shape[1],
                     "cuda attention: storage %s for q %s", t->describe().c_str(), a.q.describe().c_str());
  }
  TANDEM_CHECK_MSG(kv.begin >= 0 && kv.begin <= kv.end &&
                       (kv.ring ? kv.end - kv.begin <= kv.capacity() : kv.end <= kv.capacity()),
                   "cuda attention: positions [%lld, %lld) in %s storage of capacity %lld",
                   static_cast<long long>(kv.begin), static_cast<long long>(kv.end), kv.ring ? "ring" : "full",
                   static_cast<long long>(kv.capacity()));
  if (!a.kv_end.empty()) {  // the range end read on the device at run time (graph replays at any length)
    expect_gpu(a.kv_end, index_, "attention", "kv_end");
    expect_i32(a.kv_end, "attention", "kv_end");
    TANDEM_CHECK_MSG(a.kv_end.numel() == 1, "cuda attention: kv_end %s must hold one i32",
                     a.kv_end.describe().c_str());
  }
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_attention(a, scratch(), cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), attention_label(a));
}

void CudaBackend::centroid_candidates(const CentroidCandidatesArgs& a) {
  expect_gpu(a.ids, index_, "centroid_candidates", "ids");
  expect_gpu(a.logits, index_, "centroid_candidates", "logits");
  expect_gpu(a.ordering, index_, "centroid_candidates", "ordering");
  expect_i32(a.ids, "centroid_candidates", "ids");
  expect_i32(a.ordering, "centroid_candidates", "ordering");
  const int64_t C = a.logits.numel();
  TANDEM_CHECK_MSG(
      C > 0 && a.k >= 1 && a.k <= C && a.ordering.numel() % C == 0 && a.ids.numel() == a.k * (a.ordering.numel() / C),
      "cuda centroid_candidates: ids %s, logits %s, ordering %s, k %d", a.ids.describe().c_str(),
      a.logits.describe().c_str(), a.ordering.describe().c_str(), a.k);
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_centroid_candidates(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "centroid_candidates");
}

void CudaBackend::moe_route(const MoeRouteArgs& a) {
  expect_gpu(a.idx, index_, "moe_route", "idx");
  expect_gpu(a.weights, index_, "moe_route", "weights");
  expect_gpu(a.logits, index_, "moe_route", "logits");
  expect_gpu(a.per_expert_scale, index_, "moe_route", "per_expert_scale");
  expect_i32(a.idx, "moe_route", "idx");
  const int64_t n_tok = a.logits.rows(), n_exp = a.logits.ndim ? a.logits.dim(-1) : 0;
  TANDEM_CHECK_MSG(a.k >= 1 && a.k <= n_exp && a.per_expert_scale.numel() == n_exp &&
                       a.idx.numel() == n_tok * a.k && a.weights.numel() == n_tok * a.k,
                   "cuda moe_route: k %d, logits %s, per_expert_scale %s, idx %s, weights %s", a.k,
                   a.logits.describe().c_str(), a.per_expert_scale.describe().c_str(), a.idx.describe().c_str(),
                   a.weights.describe().c_str());
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_moe_route(a, cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), "moe_route");
}

void CudaBackend::moe_experts(const MoeExpertsArgs& a) {
  expect_gpu(a.out, index_, "moe_experts", "out");
  expect_gpu(a.x, index_, "moe_experts", "x");
  expect_gpu(a.gate_up, index_, "moe_experts", "gate_up");
  expect_gpu(a.down, index_, "moe_experts", "down");
  expect_gpu(a.idx, index_, "moe_experts", "idx");
  expect_gpu(a.weights, index_, "moe_experts", "weights");
  expect_i32(a.idx, "moe_experts", "idx");
  TANDEM_CHECK_MSG(a.gate_up.ndim == 3 && a.down.ndim == 3 && a.gate_up.shape[1] % 2 == 0 &&
                       a.down.shape[0] == a.gate_up.shape[0] && a.down.shape[1] == a.gate_up.shape[2] &&
                       a.down.shape[2] == a.gate_up.shape[1] / 2,
                   "cuda moe_experts: gate_up %s, down %s", a.gate_up.describe().c_str(), a.down.describe().c_str());
  const int64_t n_tok = a.x.rows(), k = a.idx.ndim ? a.idx.dim(-1) : 0;
  TANDEM_CHECK_MSG(a.x.ndim >= 1 && a.x.dim(-1) == a.gate_up.shape[2] && a.out.numel() == a.x.numel() &&
                       (a.out.data != a.x.data || a.x.numel() == 0) && k >= 1 && a.idx.numel() == n_tok * k &&
                       a.weights.numel() == n_tok * k,
                   "cuda moe_experts: out %s, x %s, idx %s, weights %s", a.out.describe().c_str(),
                   a.x.describe().c_str(), a.idx.describe().c_str(), a.weights.describe().c_str());
  if (!activate()) return;
  const int pt = prof_.begin(cuda_stream(current_));
  record(launch_moe_experts(a, moe_scratch(moe_experts_scratch_bytes(a)), cuda_stream(current_)));
  if (pt >= 0) prof_.end(pt, cuda_stream(current_), strfmt("moe_experts %lld tok", static_cast<long long>(a.x.rows())));
}

bool CudaBackend::fuse(const FusedChoice::Key& key, const std::function<Status()>& fused,
                       const std::function<void()>& composite) {
  if (key.rows <= fused_gemv_rows_) return true;
  if (!fused_timing_ || gemm_->gemv_mode() != GemvMode::kAuto) return false;
  if (const std::optional<bool> pick = fused_choice_.find(key)) return *pick;
  if (capturing_ || !pending_.ok()) return false;  // timed at the shape's first use outside a capture
  prof_.set_paused(true);
  Result<bool> win = fused_choice_.time(key, cuda_stream(current_), fused, [&] {
    composite();
    return std::exchange(pending_, Status());
  });
  prof_.set_paused(false);
  if (!win.ok()) {
    record(std::move(win).status());
    return false;
  }
  return *win;
}

void CudaBackend::geglu(const GegluArgs& a) {
  // Decode sizes (and verify sizes where timed faster: fuse()): one pass over both weights with the GeGLU in the
  // epilogue; otherwise the composite.
  if (gemm_->gemv_mode() == GemvMode::kOff || !geglu_gemv_eligible(a, kMaxFusedGemvRows)) return Backend::geglu(a);
  expect_gpu(a.out, index_, "geglu", "out");
  expect_gpu(a.x, index_, "geglu", "x");
  expect_gpu(a.w_gate, index_, "geglu", "w_gate");
  expect_gpu(a.w_up, index_, "geglu", "w_up");
  TANDEM_CHECK_MSG(a.w_gate.ndim == 2 && a.x.dim(-1) == a.w_gate.dim(1) && a.out.rows() == a.x.rows() &&
                       a.out.dim(-1) == a.w_gate.dim(0),
                   "cuda geglu: out %s, x %s, w_gate %s", a.out.describe().c_str(), a.x.describe().c_str(),
                   a.w_gate.describe().c_str());
  if (!activate()) return;
  const auto fused = [&] { return launch_geglu_gemv(a, props_.multiProcessorCount, cuda_stream(current_)); };
  if (!fuse({FusedChoice::Op::kGeglu, a.x.rows(), a.w_gate.dim(1), 2 * a.w_gate.dim(0), a.out.dtype}, fused,
            [&] { Backend::geglu(a); }))
    return Backend::geglu(a);
  const int pt = prof_.begin(cuda_stream(current_));
  record(fused());
  if (pt >= 0)
    prof_.end(pt, cuda_stream(current_), strfmt("geglu %lldx%lld -> 2x%lld (gemv)", static_cast<long long>(a.x.rows()),
                                                static_cast<long long>(a.w_gate.dim(1)),
                                                static_cast<long long>(a.w_gate.dim(0))));
}

void CudaBackend::linear_gelu_mul(const LinearGeluMulArgs& a) {
  // Decode sizes (and verify sizes where timed faster): the gelu_mul in the GEMV's epilogue; otherwise the two ops.
  if (gemm_->gemv_mode() == GemvMode::kOff || !linear_gelu_mul_gemv_eligible(a, kMaxFusedGemvRows))
    return Backend::linear_gelu_mul(a);
  for (const Tensor* t : {&a.out, &a.x, &a.w}) expect_gpu(*t, index_, "linear_gelu_mul", "out/x/w");
  expect_gpu(a.up, index_, "linear_gelu_mul", "up", /*contiguous=*/false);
  TANDEM_CHECK_MSG(a.w.ndim == 2 && a.x.dim(-1) == a.w.dim(1) && a.out.rows() == a.x.rows() &&
                       a.out.dim(-1) == a.w.dim(0) && a.up.ndim == 2 && a.up.shape[0] == a.x.rows() &&
                       a.up.shape[1] == a.w.dim(0),
                   "cuda linear_gelu_mul: out %s, x %s, w %s, up %s", a.out.describe().c_str(), a.x.describe().c_str(),
                   a.w.describe().c_str(), a.up.describe().c_str());
  if (!activate()) return;
  const auto fused = [&] { return launch_linear_gelu_mul_gemv(a, props_.multiProcessorCount, cuda_stream(current_)); };
  if (!fuse({FusedChoice::Op::kLinearGeluMul, a.x.rows(), a.w.dim(1), a.w.dim(0), a.out.dtype}, fused,
            [&] { Backend::linear_gelu_mul(a); }))
    return Backend::linear_gelu_mul(a);
  const int pt = prof_.begin(cuda_stream(current_));
  record(fused());
  if (pt >= 0)
    prof_.end(pt, cuda_stream(current_),
              strfmt("linear+gelu_mul %lldx%lld -> %lld (gemv)", static_cast<long long>(a.x.rows()),
                     static_cast<long long>(a.w.dim(1)), static_cast<long long>(a.w.dim(0))));
}

void CudaBackend::linear_group(const LinearGroupArgs& a) {
  // Decode sizes (and verify sizes where timed faster): the products of one x in one GEMV launch; otherwise one
  // linear() each.
  if (gemm_->gemv_mode() == GemvMode::kOff || !gemv_group_eligible(a, kMaxFusedGemvRows))
    return Backend::linear_group(a);
  expect_gpu(a.x, index_, "linear_group", "x");
  int64_t n_out = 0;
  for (int i = 0; i < a.n; ++i) {
    expect_gpu(a.out[i], index_, "linear_group", "out");
    expect_gpu(a.w[i], index_, "linear_group", "w");
    TANDEM_CHECK_MSG(a.w[i].ndim == 2 && a.x.dim(-1) == a.w[i].dim(1) && a.out[i].rows() == a.x.rows() &&
                         a.out[i].dim(-1) == a.w[i].dim(0) && a.out[i].is_contiguous() && a.out[i].data != a.x.data,
                     "cuda linear_group %d: out %s, x %s, w %s", i, a.out[i].describe().c_str(), a.x.describe().c_str(),
                     a.w[i].describe().c_str());
    n_out += a.w[i].dim(0);
  }
  if (!activate()) return;
  const auto fused = [&] { return launch_gemv_group(a, props_.multiProcessorCount, cuda_stream(current_)); };
  if (!fuse({FusedChoice::Op::kLinearGroup, a.x.rows(), a.x.dim(-1), n_out, a.out[0].dtype}, fused,
            [&] { Backend::linear_group(a); }))
    return Backend::linear_group(a);
  const int pt = prof_.begin(cuda_stream(current_));
  record(fused());
  if (pt >= 0)
    prof_.end(pt, cuda_stream(current_),
              strfmt("linear_group %dx %lldx%lld -> %lld (gemv)", a.n, static_cast<long long>(a.x.rows()),
                     static_cast<long long>(a.x.dim(-1)), static_cast<long long>(n_out)));
}

}  // namespace cuda

Result<std::unique_ptr<Backend>> make_cuda_backend(int index) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaBackend> b, cuda::CudaBackend::create(index));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace tandem
