// Typed weight structs of the Gemma 4 target and assistant, bound from a checkpoint through ONE table of HF
// tensor names (gemma4_weights.cc). Binding checks presence, shape and dtype of every expected tensor, names the
// missing and the unexpected ones (known multimodal towers and the unused k/v weights of KV-shared layers are
// expected extras), and ties the LM head to the embedding. Tensors are zero-copy views into the mmapped files
// until a backend uploads them (for_each_tensor drives loading, validation, memory accounting and placement).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "io/safetensors.h"
#include "model/gemma4_config.h"
#include "tensor/tensor.h"

namespace tandem {

struct AttentionWeights {
  Tensor q_proj;   // [n_heads * head_dim, d_model]
  Tensor q_norm;   // [head_dim]
  Tensor k_proj;   // [n_kv_heads * head_dim, d_model]   empty on KV-shared layers
  Tensor v_proj;   // [n_kv_heads * head_dim, d_model]   empty on KV-shared layers and k_eq_v layers
  Tensor k_norm;   // [head_dim]                         empty on KV-shared layers (v_norm has no weight)
  Tensor o_proj;   // [d_model, n_heads * head_dim]
};

struct MlpWeights {
  Tensor gate;     // [d_ff, d_model]
  Tensor up;       // [d_ff, d_model]
  Tensor down;     // [d_model, d_ff]
};

struct MoeWeights {                // 26B-A4B only
  Tensor router_proj;              // [n_experts, d_model]
  Tensor router_scale;             // [d_model]
  Tensor per_expert_scale;         // [n_experts]
  Tensor gate_up;                  // [n_experts, 2 * moe_d_ff, d_model]  rows [0, moe_d_ff) gate, then up
  Tensor down;                     // [n_experts, d_model, moe_d_ff]
  Tensor pre_ffn_norm_2;           // [d_model]
  Tensor post_ffn_norm_1;          // [d_model]
  Tensor post_ffn_norm_2;          // [d_model]
};

struct PleLayerWeights {           // E2B/E4B only
  Tensor gate;                     // [ple_dim, d_model]  per_layer_input_gate
  Tensor proj;                     // [d_model, ple_dim]  per_layer_projection
  Tensor post_norm;                // [d_model]           post_per_layer_input_norm
};

struct LayerWeights {
  Tensor input_norm;               // [d_model]
  Tensor post_attn_norm;           // [d_model]
  Tensor pre_ffn_norm;             // [d_model]
  Tensor post_ffn_norm;            // [d_model]
  Tensor layer_scalar;             // [1]
  AttentionWeights attn;
  MlpWeights mlp;
  MoeWeights moe;
  PleLayerWeights ple;
};

struct TargetWeights {
  Tensor embed;                    // [n_vocab, d_model]   also the tied LM head
  Tensor final_norm;               // [d_model]
  Tensor ple_embed;                // [ple_vocab, n_layers * ple_dim]   E models
  Tensor ple_model_proj;           // [n_layers * ple_dim, d_model]     E models
  Tensor ple_proj_norm;            // [ple_dim]                         E models
  std::vector<LayerWeights> layers;
};

struct AssistantWeights {
  Tensor pre_projection;           // [d_model, 2 * backbone_d_model]
  Tensor post_projection;          // [backbone_d_model, d_model]
  Tensor embed;                    // [n_vocab, d_model]   the drafter's own table = its tied LM head
  Tensor lm_head;                  // [n_vocab, d_model]   only when tie_word_embeddings is false
  Tensor final_norm;               // [d_model]
  Tensor centroids;                // [n_centroids, d_model]   masked embedder (use_ordered_embeddings)
  Tensor token_ordering;           // i64 [n_vocab]            masked embedder
  std::vector<LayerWeights> layers;
};

// Visits every bound (non-empty) tensor with its HF name.
using TensorVisitor = std::function<void(const std::string& hf_name, Tensor& t)>;
void for_each_tensor(const ModelConfig& cfg, TargetWeights& w, const TensorVisitor& fn);
void for_each_tensor(const ModelConfig& cfg, AssistantWeights& w, const TensorVisitor& fn);

// True for tensors of the multimodal towers a text-only engine skips (model.vision_tower., model.audio_tower.,
// model.embed_vision., model.embed_audio.; spec §3.3).
[[nodiscard]] bool is_multimodal_tower_tensor(std::string_view hf_name);

// Every tensor the config expects, in table order, with its expected shape; `index` marks i64/i32 tensors
// (token_ordering), all others are float weights. Drives synthetic checkpoints.
struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool index = false;
};
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& cfg);

// Bytes of weights one decoded token reads: everything, except embedding tables (one row; the tied LM head reads
// the whole table once more), MoE experts (top-k of n), and the drafter's centroid head (its candidate rows).
uint64_t weight_bytes_per_token(const ModelConfig& cfg, TargetWeights& w);
uint64_t weight_bytes_per_token(const ModelConfig& cfg, AssistantWeights& w);

// Host copies of every layer's learned layer_scalar (read before the weights move to a device).
std::vector<float> host_layer_scalars(const std::vector<LayerWeights>& layers);

// Binds the checkpoint's tensors. Fails with a message naming every missing, misshaped, wrongly typed and
// unexpected tensor (the first 200 of them). Known extras are skipped: the multimodal towers, the k/v weights of
// KV-shared layers, lm_head.weight when tied. An assistant's token_ordering is checked to be a permutation.
Result<TargetWeights> bind_target_weights(const ModelConfig& cfg, const SafetensorsModel& st);
Result<AssistantWeights> bind_assistant_weights(const ModelConfig& cfg, const SafetensorsModel& st);

}  // namespace tandem
