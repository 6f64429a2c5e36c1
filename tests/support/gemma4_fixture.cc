// Tiny synthetic Gemma 4 checkpoints for tests (see gemma4_fixture.h). Names and shapes follow spec §3.2-§3.4.
#include "support/gemma4_fixture.h"

namespace tandem::testsupport {

using nlohmann::json;

std::vector<std::string> TinyModelSpec::resolved_types() const {
  std::vector<std::string> t = layer_types;
  if (t.empty()) {
    for (int i = 0; i < n_layers; ++i) t.push_back((i + 1) % 6 ? "sliding_attention" : "full_attention");
  }
  t.back() = "full_attention";
  return t;
}

static std::vector<std::string> pattern(int period, int n) {
  std::vector<std::string> t;
  for (int i = 0; i < n; ++i) t.push_back((i + 1) % period ? "sliding_attention" : "full_attention");
  return t;
}

TinyModelSpec tiny_e2b_like() {
  TinyModelSpec s;
  s.n_layers = 10;
  s.layer_types = pattern(5, 10);
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.n_global_kv_heads = 1;
  s.n_kv_shared = 4;
  s.double_wide = true;
  s.ple_dim = 4;
  s.ple_vocab = 64;
  return s;
}

TinyModelSpec tiny_26b_like() {
  TinyModelSpec s;
  s.n_layers = 6;  // layer_types left out: HF's default period-6 pattern
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.n_global_kv_heads = 1;
  s.k_eq_v = true;
  s.d_ff = 24;
  s.n_experts = 4;
  s.top_k_experts = 2;
  s.moe_d_ff = 8;
  s.sliding_window = 16;
  return s;
}

TinyModelSpec tiny_31b_like() {
  TinyModelSpec s;
  s.n_layers = 4;
  s.layer_types = pattern(4, 4);
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.n_global_kv_heads = 1;
  s.k_eq_v = true;
  s.sliding_window = 16;
  return s;
}

TinyModelSpec tiny_assistant(bool ordered_embeddings, const TinyModelSpec& target) {
  TinyModelSpec s;
  s.vocab = target.vocab;
  s.d_model = 8;
  s.n_layers = 4;
  s.layer_types = pattern(4, 4);
  s.n_heads = 2 * target.n_kv_heads;
  s.head_dim = target.head_dim;
  s.global_head_dim = target.global_head_dim;
  s.n_kv_heads = target.n_kv_heads;
  s.n_global_kv_heads = target.n_global_kv_heads;
  s.k_eq_v = target.k_eq_v;
  s.n_kv_shared = 0;  // HF forces it to num_hidden_layers
  s.d_ff = 16;
  s.sliding_window = target.sliding_window;
  s.backbone_d_model = target.d_model;
  s.ordered_embeddings = ordered_embeddings;
  s.n_centroids = 8;
  s.centroid_top_k = 2;
  return s;
}

TinyModelSpec real_e2b() {
  TinyModelSpec s;
  s.vocab = 262144;
  s.d_model = 1536;
  s.n_layers = 35;
  s.layer_types = pattern(5, 35);
  s.n_heads = 8;
  s.head_dim = 256;
  s.global_head_dim = 512;
  s.n_kv_heads = 1;
  s.n_global_kv_heads = 1;
  s.k_eq_v = false;
  s.n_kv_shared = 20;
  s.d_ff = 6144;
  s.double_wide = true;
  s.ple_dim = 256;
  s.ple_vocab = 262144;
  s.sliding_window = 512;
  return s;
}

json make_text_config(const TinyModelSpec& s, HeadDimFormat f, bool assistant) {
  json j = {
      {"model_type", "gemma4_text"},
      {"vocab_size", s.vocab},
      {"hidden_size", s.d_model},
      {"intermediate_size", s.d_ff},
      {"num_hidden_layers", s.n_layers},
      {"num_attention_heads", s.n_heads},
      {"num_key_value_heads", s.n_kv_heads},
      {"head_dim", s.head_dim},
      {"hidden_activation", "gelu_pytorch_tanh"},
      {"max_position_embeddings", 4096},
      {"rms_norm_eps", 1e-6},
      {"sliding_window", s.sliding_window},
      {"attention_k_eq_v", s.k_eq_v},
      {"num_kv_shared_layers", s.n_kv_shared},
      {"enable_moe_block", s.n_experts > 0},
      {"use_double_wide_mlp", s.double_wide},
      {"hidden_size_per_layer_input", s.ple_dim},
      {"vocab_size_per_layer_input", s.ple_vocab},
      {"final_logit_softcapping", assistant ? json(nullptr) : json(30.0)},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"use_bidirectional_attention", nullptr},
      {"tie_word_embeddings", s.tied},
      {"pad_token_id", 0},
      {"bos_token_id", 2},
      {"eos_token_id", 1},
      {"rope_parameters",
       {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
        {"full_attention",
         {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1000000.0}}}}},
  };
  if (!s.layer_types.empty()) j["layer_types"] = s.layer_types;
  if (s.n_experts > 0) {
    j["num_experts"] = s.n_experts;
    j["top_k_experts"] = s.top_k_experts;
    j["moe_intermediate_size"] = s.moe_d_ff;
  } else {
    j["num_experts"] = nullptr;
    j["top_k_experts"] = nullptr;
    j["moe_intermediate_size"] = nullptr;
  }
  if (f == HeadDimFormat::kRelease) {
    j["global_head_dim"] = s.global_head_dim;
    j["num_global_key_value_heads"] = s.k_eq_v ? json(s.n_global_kv_heads) : json(nullptr);
  } else {
    json plc = json::object();
    const std::vector<std::string> types = s.resolved_types();
    for (int i = 0; i < s.n_layers; ++i) {
      if (types[static_cast<size_t>(i)] != "full_attention") continue;
      json o = {{"head_dim", s.global_head_dim}};
      if (s.k_eq_v) o["num_key_value_heads"] = s.n_global_kv_heads;
      plc[std::to_string(i)] = o;
    }
    j["per_layer_config"] = plc;
  }
  return j;
}

json make_config(const TinyModelSpec& s, FixtureLayout layout, HeadDimFormat f) {
  switch (layout) {
    case FixtureLayout::kCausalLM: {
      json j = make_text_config(s, f, false);
      j["architectures"] = {"Gemma4ForCausalLM"};
      return j;
    }
    case FixtureLayout::kConditionalGeneration:
      return {{"model_type", "gemma4"},
              {"architectures", {"Gemma4ForConditionalGeneration"}},
              {"text_config", make_text_config(s, f, false)},
              {"vision_config", {{"model_type", "gemma4_vision"}, {"hidden_size", 8}}},
              {"audio_config", nullptr},
              {"image_token_id", 258880},
              {"tie_word_embeddings", true},
              {"eos_token_id", {1, 6}}};
    case FixtureLayout::kAssistant:
      return {{"model_type", "gemma4_assistant"},
              {"architectures", {"Gemma4AssistantForCausalLM"}},
              {"text_config", make_text_config(s, f, true)},
              {"backbone_hidden_size", s.backbone_d_model},
              {"use_ordered_embeddings", s.ordered_embeddings},
              {"num_centroids", s.n_centroids},
              {"centroid_intermediate_top_k", s.centroid_top_k},
              {"tie_word_embeddings", s.tied}};
  }
  return {};
}

std::string weight_prefix(FixtureLayout layout) {
  return layout == FixtureLayout::kConditionalGeneration ? "model.language_model." : "model.";
}

std::vector<FakeTensor> make_tensors(const TinyModelSpec& s, FixtureLayout layout, const TensorOptions& o) {
  const bool assistant = layout == FixtureLayout::kAssistant;
  const std::string p = weight_prefix(layout);
  const std::string fd = o.float_dtype;
  const int64_t H = s.d_model, V = s.vocab, L = s.n_layers;
  std::vector<FakeTensor> out;
  uint8_t seed = 1;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    out.push_back(fake_tensor(name, fd, shape, seed++));
  };

  add(p + "embed_tokens.weight", {V, H});
  add(p + "norm.weight", {H});
  if (s.ple_dim > 0) {
    add(p + "embed_tokens_per_layer.weight", {s.ple_vocab, L * s.ple_dim});
    add(p + "per_layer_model_projection.weight", {L * s.ple_dim, H});
    add(p + "per_layer_projection_norm.weight", {s.ple_dim});
  }
  if (assistant) {
    add("pre_projection.weight", {H, 2 * int64_t{s.backbone_d_model}});
    add("post_projection.weight", {s.backbone_d_model, H});
    if (s.ordered_embeddings) {
      add("masked_embedding.centroids.weight", {s.n_centroids, H});
      std::vector<int64_t> perm(static_cast<size_t>(V));
      for (int64_t i = 0; i < V; ++i) perm[static_cast<size_t>(i)] = (i * 7 + 3) % V;
      out.push_back(i64_tensor("masked_embedding.token_ordering", {V}, perm));
    }
    if (!s.tied) add("lm_head.weight", {V, H});
  }
  const std::vector<std::string> types = s.resolved_types();
  const int n_shared = assistant ? s.n_layers : s.n_kv_shared;
  const int first_shared = s.n_layers - n_shared;
  for (int i = 0; i < s.n_layers; ++i) {
    const std::string l = p + "layers." + std::to_string(i) + ".";
    const bool full = types[static_cast<size_t>(i)] == "full_attention";
    const int64_t hd = full ? s.global_head_dim : s.head_dim;
    const int64_t kv = full ? s.full_kv_heads() : s.n_kv_heads;
    const bool shared = i >= first_shared;
    const int64_t dff = s.d_ff * ((s.double_wide && i >= first_shared && first_shared > 0) ? 2 : 1);
    for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight",
                          "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"}) {
      add(l + n, {H});
    }
    add(l + "layer_scalar", {1});
    add(l + "self_attn.q_proj.weight", {s.n_heads * hd, H});
    add(l + "self_attn.q_norm.weight", {hd});
    if (!shared || o.shared_kv_weights) {
      add(l + "self_attn.k_proj.weight", {kv * hd, H});
      add(l + "self_attn.k_norm.weight", {hd});
      if (!(s.k_eq_v && full)) add(l + "self_attn.v_proj.weight", {kv * hd, H});
    }
    add(l + "self_attn.o_proj.weight", {H, s.n_heads * hd});
    add(l + "mlp.gate_proj.weight", {dff, H});
    add(l + "mlp.up_proj.weight", {dff, H});
    add(l + "mlp.down_proj.weight", {H, dff});
    if (s.ple_dim > 0) {
      add(l + "per_layer_input_gate.weight", {s.ple_dim, H});
      add(l + "per_layer_projection.weight", {H, s.ple_dim});
      add(l + "post_per_layer_input_norm.weight", {H});
    }
    if (s.n_experts > 0) {
      add(l + "router.proj.weight", {s.n_experts, H});
      add(l + "router.scale", {H});
      add(l + "router.per_expert_scale", {s.n_experts});
      add(l + "experts.gate_up_proj", {s.n_experts, 2 * int64_t{s.moe_d_ff}, H});
      add(l + "experts.down_proj", {s.n_experts, H, s.moe_d_ff});
      add(l + "pre_feedforward_layernorm_2.weight", {H});
      add(l + "post_feedforward_layernorm_1.weight", {H});
      add(l + "post_feedforward_layernorm_2.weight", {H});
    }
  }
  if (o.towers) {
    add("model.vision_tower.encoder.layers.0.self_attn.q_proj.linear.weight", {8, 8});
    add("model.vision_tower.patch_embedder.position_embedding_table", {2, 4, 8});
    add("model.vision_tower.rank5_probe", {1, 1, 1, 2, 2});
    out.push_back(f32_tensor("model.vision_tower.encoder.layers.0.self_attn.q_proj.input_max", {}, {3.5f}));
    add("model.embed_vision.embedding_projection.weight", {H, 8});
    add("model.audio_tower.layers.0.feed_forward1.ffw_layer_1.linear.weight", {4, 4});
    add("model.embed_audio.embedding_projection.weight", {H, 4});
  }
  if (o.lm_head) add("lm_head.weight", {V, H});
  return out;
}

void write_model(const std::string& dir, const TinyModelSpec& s, FixtureLayout layout, HeadDimFormat f,
                 const TensorOptions& o) {
  write_file(dir + "/config.json", make_config(s, layout, f).dump(2));
  write_single_checkpoint(dir, make_tensors(s, layout, o));
}

}  // namespace tandem::testsupport
