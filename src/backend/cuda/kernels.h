// Host-side launchers of the CUDA kernels, one section per op-family file (design.md §1: gemm, attention,
// norm_rope, elementwise, moe, sampling, kv). Each enqueues its work on `stream` and returns at once; the Status
// reports a dtype the kernel does not handle (kUnsupported) or a launch failure. Shapes were checked by the
// caller (cuda_backend.cc).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/ops.h"
#include "core/status.h"

namespace tandem::cuda {

// norm_rope.cu
Status launch_rms_norm(const RmsNormArgs& a, cudaStream_t stream);
Status launch_rope(const RopeArgs& a, cudaStream_t stream);
// rms_norm(a) then rms_norm(next) on its output in one launch, bit-identical to the two ops, when next.x is a.out
// (same norm geometry as a.x), next has no epilogue, and the dtypes are f32/bf16.
bool rms_norm_then_fusable(const RmsNormArgs& a, const RmsNormArgs& next);
Status launch_rms_norm_then(const RmsNormArgs& a, const RmsNormArgs& next, cudaStream_t stream);
// rms_norms applied in order in one launch (one block per row runs every stage), each stage bit-identical to its own
// rms_norm, when there are 2..4 stages with equal rows, dim and norm geometry, one x dtype and one out dtype,
// contiguous, no RoPE, and every tensor of a stage that overlaps an earlier stage's out is that out exactly (same
// data pointer and dtype): each thread then reads and writes the same elements in every stage.
bool rms_norm_seq_fusable(std::span<const RmsNormArgs> stages);
Status launch_rms_norm_seq(std::span<const RmsNormArgs> stages, cudaStream_t stream);
// Whether bf16 rms_norm, rms_norm_then and rms_norm_seq take the register path where it applies (norm_regs.cu; on
// unless TANDEM_NORM_REGS=0): the same bits in fewer memory round trips.
void set_norm_regs(bool on);
// Whether the norm kernels ask L2 to keep their weights and the RoPE frequencies resident between decode steps
// (norm_math.cuh NormWeight::keep; on unless TANDEM_L2_KEEP=0): the same bits.
void set_keep_norm_weights(bool on);
bool keep_norm_weights();
// kv_norm_write in one launch, bit-identical to rms_norm (+RoPE), rms_norm, kv_write, when k/v are contiguous
// bf16 or f32 like the cache and both norms read with the same vector width.
bool kv_norm_write_fusable(const KvNormWriteArgs& a);
Status launch_kv_norm_write(const KvNormWriteArgs& a, cudaStream_t stream);

// elementwise.cu
// Whether this build holds kernel code the current device can run (a clear error instead of failing launches
// when tandem was built for another architecture than the GPU's).
Status check_kernel_image();
// Programmatic dependent launch for every kernel launched after this (launch.cuh); CudaBackend turns it on for
// sm_90 and newer unless TANDEM_PDL=0.
void set_programmatic_launch(bool on);
bool programmatic_launch();
Status launch_embedding(const EmbeddingArgs& a, cudaStream_t stream);
Status launch_add(const AddArgs& a, cudaStream_t stream);
Status launch_scale(const ScaleArgs& a, cudaStream_t stream);
Status launch_softcap(const SoftcapArgs& a, cudaStream_t stream);
Status launch_gelu_mul(const GeluMulArgs& a, cudaStream_t stream);

// sampling.cu
Status launch_argmax(const ArgmaxArgs& a, cudaStream_t stream);
// The masked embedder's cluster top-k and candidate ids in one block (at most 4096 clusters).
Status launch_centroid_candidates(const CentroidCandidatesArgs& a, cudaStream_t stream);
// sampler.cu
Status launch_sample(const SampleArgs& a, cudaStream_t stream);
Status launch_reject_drafts(const RejectDraftsArgs& a, cudaStream_t stream);

// kv.cu
Status launch_kv_write(const KvWriteArgs& a, cudaStream_t stream);

// Device scratch an op may use while it runs: the current stream's workspace (shared with cuBLASLt, which is safe
// because ops on one stream run in order), and the SM count for launch geometry.
struct Scratch {
  void* data = nullptr;
  size_t bytes = 0;
  int sm_count = 0;
};

// attention.cu, attention_decode.cu (split-K partial states go to the scratch when a few rows face a long context;
// inside a graph capture with kv_end, the launch is sized for the storage's capacity)
Status launch_attention(const AttentionArgs& a, const Scratch& scratch, cudaStream_t stream);
// attention_prefill.cu: prompt chunks (32 or more bf16 query tokens, head_dim 64, 128 or 256) on a flash-attention
// kernel instead of the decode kernel. kOff (every chunk on the decode kernel), kAuto (the default: launches of 64
// blocks of 64 query rows or more), kAlways (every chunk it takes; tests). TANDEM_ATTN_PREFILL=0 / always sets it.
enum class PrefillAttention : uint8_t { kOff, kAuto, kAlways };
void set_prefill_attention(PrefillAttention m);
PrefillAttention prefill_attention();
// Head dim 512 (the full layers) on the flash kernel too, as the mode says (kAuto: launches of 128 blocks or more);
// on unless TANDEM_ATTN_PREFILL_512=0 (bench/RESULTS.md run BL).
void set_prefill_attention_512(bool on);
bool prefill_attention_512();
// Head dims 64-256 on the flash kernel's Hopper form (wgmma: each K/V tile read from shared memory once per 64 rows
// instead of once per warp) with 1 or 2 warpgroups per block (64 or 128 query rows sharing the K/V tiles), where the
// build has sm_90a code and the device is compute capability 9.0; otherwise (and with 0) the mma.sync form. -1, the
// default: two warpgroups for launches of 256 64-row blocks or more, else one (bench/RESULTS.md run BL). 3: two
// warpgroups with four K/V stages instead of two (not yet run on a GPU). TANDEM_ATTN_PREFILL_WGMMA=0-3 sets it.
void set_prefill_attention_wgmma(int warpgroups);
int prefill_attention_wgmma();

// moe.cu (moe_experts, grouped by expert, keeps its grouping tables and its f32 intermediates h [pairs, d_ff] and
// y [pairs, d_model] in the scratch, in token chunks when they do not fit; launch sizes depend on n_tokens and k
// only, so it can be captured in a CUDA graph)
Status launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream);
Status launch_moe_experts(const MoeExpertsArgs& a, const Scratch& scratch, cudaStream_t stream);
// The scratch bytes that let launch_moe_experts run all of a's tokens in one chunk (at most 8192 token-expert pairs,
// the grouping's limit): a prompt chunk's experts then read their weights once. 0 for a malformed a.
size_t moe_experts_scratch_bytes(const MoeExpertsArgs& a);
// Whether the GEMV-style expert kernels stage their weight rows in shared memory (moe.cu stage_rows; the same bits
// either way) for launches of 2 or more tokens, one pair per pass. On unless TANDEM_MOE_STAGED=0.
void set_moe_staged(bool on);
bool moe_staged();
// Whether a decode step's expert down kernel requests its expert's weights before waiting for the gate/up kernel
// (moe.cu moe_down_kernel EARLY; the same bits). On unless TANDEM_MOE_EARLY=0 (bench/RESULTS.md run BL: 26B-A4B
// decode 3.313 -> 3.273 ms on an H100).
void set_moe_down_early(bool on);
bool moe_down_early();
// The tensor-core expert tiles (moe_tc.cu, prompt chunks): kOff (64 rows x 64 pairs; TANDEM_MOE_TC_WIDE=0), kAuto
// (the default: 128 x 128 when the launch's expert slots average 48 pairs or more), kAlways (tests; =always). The
// same bits every way (bench/RESULTS.md run BL: 26B-A4B's 4096-token prefill 226.9 -> 183.4 ms on an H100).
enum class MoeTcWide : uint8_t { kOff, kAuto, kAlways };
void set_moe_tc_wide(MoeTcWide m);
MoeTcWide moe_tc_wide();
// gemv.cu: decode/verify products (1..9 bf16 rows, bf16 weights, K % 8 == 0, 16-byte aligned w and x).
// set_weight_prefetch / weight_prefetch: whether the GEMV kernels request their first weight chunks before waiting for
// the kernel before them (programmatic dependent launch; never for a LinearArgs with w_fresh). On unless
// TANDEM_WEIGHT_PREFETCH=0.
void set_weight_prefetch(bool on);
bool weight_prefetch();
// The most rows (1..9) whose CUDA-core GEMV makes those early requests (the tensor-core kernel makes them for any
// rows). Default 9; TANDEM_GEMV_EARLY_ROWS=N sets it.
void set_gemv_early_rows(int rows);
int gemv_early_rows();
// Whether products of 2..9 rows with K % 32 == 0 and at least 2M weights per launch run on the tensor cores
// (gemv_tc.cu) instead of the CUDA cores. On unless TANDEM_GEMV_TC=0 (bench/RESULTS.md run BA: from 3 rows, with
// the timed choices of gemm.cu and fused_choice.h, it made every architecture's K = 2..8 rounds 1-11% faster).
void set_gemv_tc(bool on);
bool gemv_tc();
// Whether a product of `rows` rows over n_in values into n_out_total outputs (all segments of the launch) takes
// the tensor cores: the switch is on, gemv_tc_min_rows() <= rows <= 9, n_in % 32 == 0 and n_in * n_out_total >= 2M
// (smaller products keep the CUDA-core order that the per-layer-input kernel reproduces).
bool gemv_tc_takes(int64_t rows, int64_t n_in, int64_t n_out_total);
// Whether a tensor-core product with too few 16-row strips to give every SM two blocks splits K over a cluster of
// up to 8 blocks per strip (rank 0 adds their sums in rank order). On unless TANDEM_GEMV_TC_SPLIT=0.
void set_gemv_tc_split(bool on);
bool gemv_tc_split();
// The fewest rows the tensor cores take (2..10; 10: none). Default 3; TANDEM_GEMV_TC_MIN_ROWS=N sets it. Runs AZ
// and BA: at 2 rows the CUDA-core products were faster on every architecture but 26B-A4B's longer verify passes.
void set_gemv_tc_min_rows(int rows);
int gemv_tc_min_rows();
// GEMV threads per block (gemv.cu block_threads): 0 = always 256; 1 (the default) = one pass of whole warps over
// rows of up to 320 16-byte chunks (K <= 2560); 2 = the same up to 512 chunks. TANDEM_GEMV_FIT=N sets it.
void set_gemv_fit(int mode);
// In mode 1, rows longer than one pass take their passes of at most 256 threads evenly (TANDEM_GEMV_BALANCE=0: 256).
void set_gemv_balance(bool on);
bool gemv_balance();
// The threads per block of a GEMV over rows of n_in values under the current mode (one thread per 16-byte chunk
// when the row fits one pass).
int gemv_block_threads(int64_t n_in);
bool gemv_eligible(const LinearArgs& a);
// allow_tc = false keeps a product that gemv_tc_takes on the CUDA cores (gemm.cu times both).
Status launch_gemv(const LinearArgs& a, int sm_count, cudaStream_t stream, bool allow_tc = true);
// The fused products below take 1..max_rows rows (at most 9; CudaBackend decides per shape which sizes use them).
// linear_group in one launch (every product GEMV-eligible with the same x and output dtype).
bool gemv_group_eligible(const LinearGroupArgs& a, int max_rows);
Status launch_gemv_group(const LinearGroupArgs& a, int sm_count, cudaStream_t stream);
// The geglu op in one pass over w_gate and w_up (bf16 x, weights and out).
bool geglu_gemv_eligible(const GegluArgs& a, int max_rows);
Status launch_geglu_gemv(const GegluArgs& a, int sm_count, cudaStream_t stream);
// linear_gelu_mul in one GEMV pass, gelu_mul in the epilogue (bf16 x and weights, out and up of one dtype, up's
// rows contiguous within a row).
bool linear_gelu_mul_gemv_eligible(const LinearGeluMulArgs& a, int max_rows);
Status launch_linear_gelu_mul_gemv(const LinearGeluMulArgs& a, int sm_count, cudaStream_t stream);

// gemm.cu: the plain kernel behind linear() for what cuBLASLt cannot take (odd sizes, f32 operands);
// the cuBLASLt path lives in class Gemm (gemm.h).
Status launch_linear_simple(const LinearArgs& a, cudaStream_t stream);

// attn_out_mlp.cu
// A dense layer's attention output product, norms and GeGLU MLP for one token as one persistent launch (one block
// per SM, grid-wide barriers between the steps), bit-identical to the composite op when its products run on the
// GEMV: bf16 tensors, 16-byte aligned, d a multiple of 256 up to 2560, rows of d and n_heads * head_dim values in
// one GEMV pass. Off unless TANDEM_FUSED_MLP=1 (slower than the composite so far: bench/RESULTS.md runs AJ-AL).
void set_fused_attn_out_mlp(bool on);
bool fused_attn_out_mlp();
bool attn_out_mlp_fusable(const AttnOutMlpArgs& a);
Status launch_attn_out_mlp(const AttnOutMlpArgs& a, cudaStream_t stream);

// per_layer_input.cu
// The per-layer-input block for 1..9 tokens as one launch of a 16-block cluster per token, bit-identical to the
// composite op when its products run on the GEMV: x [T, d] bf16 with d a multiple of 256 up to 2560, P = 256, bf16
// weights and activations, 16-byte aligned, GEMV rows in one pass, and a GPU that places 16-block clusters. On unless
// TANDEM_FUSED_PLE=0.
void set_fused_per_layer_input(bool on);
// Whether the one launch asks L2 for the next layer's gate and projection weights (PerLayerInputArgs next_gate /
// next_proj) as it finishes (on unless TANDEM_PLI_PREFETCH=0).
void set_per_layer_input_prefetch(bool on);
bool per_layer_input_fusable(const PerLayerInputArgs& a);
// How many of its 16-block clusters run at once at width d (a verify pass of T tokens fuses when 3 T <= 2 x that).
int per_layer_input_max_clusters(int64_t d);
Status launch_per_layer_input(const PerLayerInputArgs& a, cudaStream_t stream);

}  // namespace tandem::cuda
