// Test support: tiny synthetic Gemma 4 checkpoints (config.json + safetensors) for every layout and both
// full-attention head-dim formats. Tensor names and shapes are written here straight from the spec tables
// (§3.2-§3.4), independently of src/model/gemma4_weights.cc, so binding is checked against a second encoding.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/checkpoint_writer.h"

namespace tandem::testsupport {

enum class FixtureLayout { kConditionalGeneration, kCausalLM, kAssistant };
enum class HeadDimFormat { kRelease, kPerLayerConfig };

struct TinyModelSpec {
  int vocab = 64;
  int d_model = 16;
  int n_layers = 6;
  int n_heads = 4;
  int head_dim = 8;                      // sliding layers
  int global_head_dim = 16;              // full layers
  int n_kv_heads = 2;                    // sliding layers (and full layers unless k_eq_v)
  int n_global_kv_heads = 1;             // full layers when k_eq_v
  std::vector<std::string> layer_types;  // empty: not written (HF default pattern)
  bool k_eq_v = false;
  int n_kv_shared = 0;
  int d_ff = 32;
  bool double_wide = false;
  int ple_dim = 0;
  int ple_vocab = 0;
  int n_experts = 0, top_k_experts = 0, moe_d_ff = 0;
  int sliding_window = 8;
  // Assistant only.
  int backbone_d_model = 0;
  bool ordered_embeddings = false;
  int n_centroids = 0, centroid_top_k = 0;
  bool tied = true;

  // Layer types as written or as HF defaults them (period 6, last forced full).
  [[nodiscard]] std::vector<std::string> resolved_types() const;
  [[nodiscard]] int full_kv_heads() const { return k_eq_v ? n_global_kv_heads : n_kv_heads; }
};

// Small variants shaped like the released families (same features, tiny sizes).
TinyModelSpec tiny_e2b_like();  // PLE, KV sharing, double-wide MLP, period-5 pattern
TinyModelSpec tiny_26b_like();  // MoE, K=V full layers
TinyModelSpec tiny_31b_like();  // dense, K=V full layers
TinyModelSpec tiny_assistant(bool ordered_embeddings, const TinyModelSpec& target);
// The real E2B text dims of spec §2.1 (config only: far too large to write weights for).
TinyModelSpec real_e2b();

nlohmann::json make_text_config(const TinyModelSpec& s, HeadDimFormat f, bool assistant);
nlohmann::json make_config(const TinyModelSpec& s, FixtureLayout layout, HeadDimFormat f);
std::string weight_prefix(FixtureLayout layout);

struct TensorOptions {
  bool towers = false;             // add vision/audio tower tensors (ConditionalGeneration)
  bool shared_kv_weights = false;  // add the unused k/v weights of KV-shared layers
  bool lm_head = false;            // add a (tied, ignored) lm_head.weight
  std::string float_dtype = "BF16";
};
std::vector<FakeTensor> make_tensors(const TinyModelSpec& s, FixtureLayout layout, const TensorOptions& o = {});

// config.json + model.safetensors into `dir`.
void write_model(const std::string& dir, const TinyModelSpec& s, FixtureLayout layout, HeadDimFormat f,
                 const TensorOptions& o = {});

}  // namespace tandem::testsupport
