// The Gemma 4 target model: loading and one forward entry point over a batch of sequences that serves prefill
// (many tokens), decode (1 token) and speculative verification (K+1 tokens), returning soft-capped logits and
// post-norm hidden states for the rows asked for (spec §1, §5.1). The KV caches belong to the caller.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/kv_cache.h"
#include "model/gemma4_config.h"
#include "model/gemma4_weights.h"
#include "model/rope_tables.h"
#include "model/weight_store.h"

namespace tandem {

// New tokens of one sequence, appended at positions cache->length() onwards.
struct SequenceInput {
  KvCache* cache = nullptr;
  std::span<const int32_t> tokens;
  int n_outputs = 1;  // logits + hidden for the last n_outputs tokens (0..tokens.size())
};

// Outputs of a forward, rows ordered by sequence then position. Device tensors in the activation dtype, valid
// until the next forward of this model.
struct ForwardOutputs {
  Tensor logits;  // [n_rows, n_vocab]  soft-capped
  Tensor hidden;  // [n_rows, d_model]  post-final-norm hidden (what the drafter consumes, spec §4.3)
};

struct LoadOptions {
  ProgressFn progress;  // weight placement progress (device backends)
};

class Gemma4Model {
 public:
  // Loads a target checkpoint directory (any of the target layouts) onto `backend`.
  static Result<std::unique_ptr<Gemma4Model>> load(const std::string& dir, Backend& backend,
                                                   const LoadOptions& opts = {});
  // Same, from a parsed config and an opened store (synthetic checkpoints); `name` labels error messages.
  static Result<std::unique_ptr<Gemma4Model>> load_from(ModelConfig cfg, WeightStore store, const std::string& name,
                                                        Backend& backend, const LoadOptions& opts = {});
  ~Gemma4Model();

  [[nodiscard]] const ModelConfig& config() const { return cfg_; }
  [[nodiscard]] const TextConfig& text() const { return cfg_.text; }
  [[nodiscard]] Backend& backend() const { return backend_; }
  [[nodiscard]] const TargetWeights& weights() const { return w_; }

  // The KV layout of this model and a fresh cache for one sequence.
  [[nodiscard]] std::vector<KvLayerSpec> kv_layout() const;
  Result<KvCache> new_cache(const KvCacheOptions& opts) const;

  // Runs the model over the new tokens of every sequence and commits them to the caches. A single sequence may
  // be longer than its cache's max_tokens_per_forward (it is split into chunks); in a batch of several, each
  // must fit in one chunk. Token ids are checked against the vocabulary.
  Status forward(std::span<const SequenceInput> batch, ForwardOutputs* out);

  // The scaled input embedding of `ids` (i32 [n] on the device) into out [n, d_model] (spec §1.3): the drafter
  // embeds its last token with the target's table (spec §4.2).
  void embed(const Tensor& ids, const Tensor& out);
  [[nodiscard]] float embed_scale() const { return embed_scale_; }

  // CUDA graphs for small single-sequence forwards (decode, verify): on by default where the backend has graphs,
  // unless the environment sets TANDEM_GRAPHS=0. A forward shape is captured the second time it is seen and
  // replayed from then on; growing the workspace drops the graphs.
  void set_graphs(bool on);
  [[nodiscard]] bool graphs_enabled() const { return graphs_on_; }
  [[nodiscard]] size_t graph_count() const { return graphs_.size(); }

 private:
  struct Workspace;
  explicit Gemma4Model(Backend& backend);
  Status forward_chunk(std::span<const SequenceInput> batch, int64_t out_row0);
  // The device work of forward_chunk after the inputs are uploaded (what a graph captures).
  Status run_chunk(std::span<const SequenceInput> batch, int64_t rows, int64_t n_out, int64_t out_row0);
  void drop_graphs();
  Status ensure_workspace(int64_t rows, int64_t out_rows);
  Status layer_forward(int layer, std::span<const SequenceInput> batch, int64_t rows);

  Backend& backend_;
  ModelConfig cfg_;
  WeightStore store_;
  TargetWeights w_;
  std::vector<float> layer_scalar_;       // host copies of layers.N.layer_scalar
  float embed_scale_ = 1.f;               // bf16(sqrt(d_model)) for bf16 tables (spec §1.3)
  float ple_embed_scale_ = 1.f;           // bf16(sqrt(ple_dim))
  RopeTables rope_;
  std::unique_ptr<Workspace> ws_;
  struct GraphKey {
    int64_t rows, n_out;
    uint64_t cache;
    auto operator<=>(const GraphKey&) const = default;
  };
  bool graphs_on_ = true;
  std::map<GraphKey, Backend::GraphId> graphs_;
  std::set<GraphKey> seen_;  // shapes run once eagerly (plans and buffers exist): the next one is captured
};

// Rounds `value` to the representable value of `dtype` (bf16/f16: RNE; f32: itself), as torch's
// `tensor.to(weight.dtype)` does for the embedding scales.
float round_to_dtype(float value, DType dtype);

}  // namespace tandem
