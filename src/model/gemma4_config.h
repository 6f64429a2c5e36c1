// Typed Gemma 4 configuration, parsed once from config.json (+ generation_config.json) and resolved into one
// LayerSpec per layer, so the forward pass never re-derives layer policy (spec §1.6-§1.10, §2, §3).
// Handles the three checkpoint layouts (Gemma4ForConditionalGeneration, Gemma4ForCausalLM,
// Gemma4AssistantForCausalLM) and both ways of giving full-attention head dims (global_head_dim /
// num_global_key_value_heads, or transformers 5.x per_layer_config).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace tandem {

enum class AttnType : uint8_t { kSliding, kFull };
const char* attn_type_name(AttnType t);  // "sliding" / "full"

enum class CheckpointLayout : uint8_t {
  kConditionalGeneration,  // model_type gemma4: text weights under "model.language_model.", towers skipped
  kCausalLM,               // model_type gemma4_text: "model."
  kAssistant,              // model_type gemma4_assistant: "model." + pre/post_projection, masked_embedding
};
const char* layout_name(CheckpointLayout l);

enum class RopeKind : uint8_t { kDefault, kProportional };

struct RopeSpec {
  RopeKind kind = RopeKind::kDefault;
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;  // kProportional only (HF's default RoPE ignores it; parsed as 1.0)
  double factor = 1.0;                 // kProportional only: inverse frequencies are divided by it (HF)
  // Inverse frequencies for a head of `head_dim`: head_dim/2 entries, zero for the unrotated pairs of
  // proportional RoPE. Frequencies use the full head_dim as denominator (spec §1.7), computed in f32 like HF.
  [[nodiscard]] std::vector<float> inv_freq(int head_dim) const;
  [[nodiscard]] int rotated_pairs(int head_dim) const;
};

struct LayerSpec {
  int index = 0;
  AttnType attn = AttnType::kSliding;
  int head_dim = 0;
  int n_kv_heads = 0;
  int window = 0;              // sliding window W for sliding layers, 0 for full layers
  bool k_eq_v = false;         // values are the raw k_proj output (full layers with attention_k_eq_v)
  bool owns_kv = true;         // false for KV-shared layers (they own no k/v weights and no cache)
  int kv_source = 0;           // layer whose K/V this layer attends with (itself when owns_kv); -1 in an
                               // assistant, whose layers read the target's shared K/V of their type (spec §4.4)
  bool publishes_shared_kv = false;  // last KV-owning layer of its type: its K/V is what the drafter reads
  int d_ff = 0;                // dense MLP width (double-wide already resolved)
  bool moe = false;            // MoE block beside the dense MLP (26B-A4B)
};

struct TextConfig {
  int n_vocab = 0;
  int d_model = 0;
  int n_layers = 0;
  int n_heads = 0;
  int head_dim = 0;            // sliding layers
  int global_head_dim = 0;     // full layers
  int n_kv_heads = 0;          // sliding layers
  int n_global_kv_heads = 0;   // full layers (resolved)
  int d_ff = 0;                // config intermediate_size
  int sliding_window = 0;
  int n_kv_shared_layers = 0;
  bool attention_k_eq_v = false;
  bool double_wide_mlp = false;
  int ple_dim = 0;             // hidden_size_per_layer_input; 0 = no per-layer embeddings
  int ple_vocab = 0;           // vocab_size_per_layer_input
  bool moe = false;
  int n_experts = 0;
  int top_k_experts = 0;
  int moe_d_ff = 0;
  float rms_eps = 1e-6f;
  std::optional<float> final_logit_softcap;
  int max_position = 0;
  RopeSpec rope_sliding, rope_full;
  bool tie_word_embeddings = true;
  std::vector<LayerSpec> layers;

  [[nodiscard]] const LayerSpec& layer(int i) const { return layers.at(static_cast<size_t>(i)); }
  // First layer index that shares KV (n_layers when none do).
  [[nodiscard]] int first_shared_layer() const { return n_layers - n_kv_shared_layers; }
  // The layer whose K/V the drafter reads for attention type t (spec §1.8, §4.4); -1 if the type is absent.
  [[nodiscard]] int shared_kv_layer(AttnType t) const;
};

struct AssistantConfig {
  int backbone_d_model = 0;          // backbone_hidden_size: the target's d_model
  bool use_ordered_embeddings = false;  // centroid-routed masked embedder LM head (E2B/E4B drafters)
  int n_centroids = 0;
  int centroid_top_k = 0;
};

struct ModelConfig {
  CheckpointLayout layout = CheckpointLayout::kCausalLM;
  std::string model_type;            // as written in config.json
  std::string weight_prefix;         // "model.language_model." or "model."
  TextConfig text;
  std::optional<AssistantConfig> assistant;  // set for gemma4_assistant
  int pad_id = 0, bos_id = 2;
  std::vector<int> eos_ids;          // union of config.json and generation_config.json, deduplicated

  [[nodiscard]] bool is_assistant() const { return assistant.has_value(); }
};

// Parses config.json text. `source` names the file in error messages.
Result<ModelConfig> parse_model_config(std::string_view config_json, const std::string& source);
// Reads <dir>/config.json and, if present, <dir>/generation_config.json (extra EOS ids).
Result<ModelConfig> load_model_config(const std::string& dir);
// Checks that an assistant can draft for a target: backbone width, vocabulary, and per attention type the
// head dim, KV-head count and RoPE of the target layer whose K/V it reads. Lists every mismatch.
Status check_assistant_compatible(const ModelConfig& target, const ModelConfig& assistant);

}  // namespace tandem
