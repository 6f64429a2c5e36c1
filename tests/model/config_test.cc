// ModelConfig parsing and LayerSpec resolution (src/model/gemma4_config.cc) for every layout and both
// full-attention head-dim formats, against the numbers of spec §1.8, §2.1 and HF's config defaults.
#include <gtest/gtest.h>

#include <cmath>

#include "model/gemma4_config.h"
#include "support/gemma4_fixture.h"

namespace tandem {
namespace {

using nlohmann::json;
using namespace testsupport;

ModelConfig parse_ok(const json& j, const std::string& src = "config.json") {
  auto r = parse_model_config(j.dump(), src);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : ModelConfig{};
}

bool same_layers(const TextConfig& a, const TextConfig& b) {
  if (a.layers.size() != b.layers.size()) return false;
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerSpec& x = a.layers[i];
    const LayerSpec& y = b.layers[i];
    if (x.index != y.index || x.attn != y.attn || x.head_dim != y.head_dim || x.n_kv_heads != y.n_kv_heads ||
        x.window != y.window || x.k_eq_v != y.k_eq_v || x.owns_kv != y.owns_kv || x.kv_source != y.kv_source ||
        x.publishes_shared_kv != y.publishes_shared_kv || x.d_ff != y.d_ff || x.moe != y.moe) {
      return false;
    }
  }
  return a.head_dim == b.head_dim && a.global_head_dim == b.global_head_dim && a.n_kv_heads == b.n_kv_heads &&
         a.n_global_kv_heads == b.n_global_kv_heads;
}

TEST(Config, ConditionalGenerationLayout) {
  ModelConfig c =
      parse_ok(make_config(tiny_e2b_like(), FixtureLayout::kConditionalGeneration, HeadDimFormat::kRelease));
  EXPECT_EQ(c.layout, CheckpointLayout::kConditionalGeneration);
  EXPECT_EQ(c.model_type, "gemma4");
  EXPECT_EQ(c.weight_prefix, "model.language_model.");
  EXPECT_FALSE(c.is_assistant());
  EXPECT_EQ(c.text.d_model, 16);
  EXPECT_EQ(c.text.n_layers, 10);
  EXPECT_EQ(c.text.ple_dim, 4);
  ASSERT_TRUE(c.text.final_logit_softcap.has_value());
  EXPECT_EQ(*c.text.final_logit_softcap, 30.0f);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{1, 6}));  // top-level [1, 6] united with text_config's 1
}

TEST(Config, CausalLmLayout) {
  ModelConfig c = parse_ok(make_config(tiny_26b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kPerLayerConfig));
  EXPECT_EQ(c.layout, CheckpointLayout::kCausalLM);
  EXPECT_EQ(c.weight_prefix, "model.");
  EXPECT_TRUE(c.text.moe);
  EXPECT_EQ(c.text.n_experts, 4);
  EXPECT_EQ(c.text.top_k_experts, 2);
  EXPECT_EQ(c.text.moe_d_ff, 8);
  for (const LayerSpec& l : c.text.layers) EXPECT_TRUE(l.moe);
  // No layer_types in the file: HF's period-6 default.
  EXPECT_EQ(c.text.layer(4).attn, AttnType::kSliding);
  EXPECT_EQ(c.text.layer(5).attn, AttnType::kFull);
}

TEST(Config, AssistantLayout) {
  const TinyModelSpec target = tiny_e2b_like();
  ModelConfig c =
      parse_ok(make_config(tiny_assistant(true, target), FixtureLayout::kAssistant, HeadDimFormat::kRelease));
  EXPECT_EQ(c.layout, CheckpointLayout::kAssistant);
  EXPECT_EQ(c.weight_prefix, "model.");
  ASSERT_TRUE(c.is_assistant());
  EXPECT_EQ(c.assistant->backbone_d_model, 16);
  EXPECT_TRUE(c.assistant->use_ordered_embeddings);
  EXPECT_EQ(c.assistant->n_centroids, 8);
  EXPECT_EQ(c.assistant->centroid_top_k, 2);
  EXPECT_EQ(c.text.n_kv_shared_layers, 4);  // 0 in the file, forced to num_hidden_layers
  EXPECT_FALSE(c.text.final_logit_softcap.has_value());
  for (const LayerSpec& l : c.text.layers) {
    EXPECT_FALSE(l.owns_kv);
    EXPECT_FALSE(l.publishes_shared_kv);
    EXPECT_EQ(l.kv_source, -1);
    EXPECT_EQ(l.d_ff, 16);  // never double-wide (first_shared == 0)
  }
  EXPECT_EQ(c.text.layer(3).attn, AttnType::kFull);
  EXPECT_EQ(c.text.layer(3).head_dim, 16);
  ModelConfig t = parse_ok(make_config(target, FixtureLayout::kCausalLM, HeadDimFormat::kRelease));
  EXPECT_TRUE(check_assistant_compatible(t, c).ok()) << check_assistant_compatible(t, c).to_string();
  TinyModelSpec bad = tiny_assistant(false, target);
  bad.backbone_d_model = 24;
  bad.global_head_dim = 32;
  Status s =
      check_assistant_compatible(t, parse_ok(make_config(bad, FixtureLayout::kAssistant, HeadDimFormat::kRelease)));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("backbone_hidden_size 24"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("full layers"), std::string::npos) << s.message();
}

TEST(Config, BothHeadDimFormatsResolveIdentically) {
  const TinyModelSpec e2b = tiny_e2b_like();
  for (const TinyModelSpec& s : {e2b, tiny_26b_like(), tiny_31b_like(), tiny_assistant(true, e2b)}) {
    const FixtureLayout layout = s.backbone_d_model ? FixtureLayout::kAssistant : FixtureLayout::kCausalLM;
    ModelConfig a = parse_ok(make_config(s, layout, HeadDimFormat::kRelease));
    ModelConfig b = parse_ok(make_config(s, layout, HeadDimFormat::kPerLayerConfig));
    EXPECT_TRUE(same_layers(a.text, b.text)) << "n_layers " << s.n_layers;
    EXPECT_EQ(a.text.global_head_dim, s.global_head_dim);
    EXPECT_EQ(a.text.n_global_kv_heads, s.full_kv_heads());
  }
}

TEST(Config, GlobalKvHeadsApplyOnlyWithKEqV) {
  // HF __post_init__: num_global_key_value_heads is ignored unless attention_k_eq_v is set.
  json j = make_config(tiny_31b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kRelease);
  j["attention_k_eq_v"] = false;
  j["num_global_key_value_heads"] = 1;
  ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.text.layer(3).n_kv_heads, 2);
  EXPECT_FALSE(c.text.layer(3).k_eq_v);
  j["attention_k_eq_v"] = true;
  c = parse_ok(j);
  EXPECT_EQ(c.text.layer(3).n_kv_heads, 1);
  EXPECT_TRUE(c.text.layer(3).k_eq_v);
  EXPECT_EQ(c.text.layer(2).n_kv_heads, 2);
  EXPECT_FALSE(c.text.layer(2).k_eq_v);
}

TEST(Config, PerLayerConfigToleratesLayerTypeKeys) {
  json j = make_config(tiny_31b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kPerLayerConfig);
  j["per_layer_config"] = {{"full_attention", {{"head_dim", 16}, {"num_key_value_heads", 1}}},
                           {"sliding_attention", {{"head_dim", 8}}}};
  ModelConfig a = parse_ok(j);
  ModelConfig b = parse_ok(make_config(tiny_31b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kRelease));
  EXPECT_TRUE(same_layers(a.text, b.text));
  j["per_layer_config"] = {{"7", {{"head_dim", 16}}}};
  auto r = parse_model_config(j.dump(), "c.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("per_layer_config"), std::string::npos);
}

// Spec §1.8 table and §1.9 for the real E2B numbers of §2.1.
TEST(Config, E2bSharingTable) {
  ModelConfig c = parse_ok(make_config(real_e2b(), FixtureLayout::kConditionalGeneration, HeadDimFormat::kRelease));
  const TextConfig& t = c.text;
  EXPECT_EQ(t.first_shared_layer(), 15);
  EXPECT_EQ(t.shared_kv_layer(AttnType::kSliding), 13);
  EXPECT_EQ(t.shared_kv_layer(AttnType::kFull), 14);
  EXPECT_EQ(t.layer(13).attn, AttnType::kSliding);
  EXPECT_TRUE(t.layer(13).publishes_shared_kv);
  EXPECT_EQ(t.layer(13).kv_source, 13);
  EXPECT_EQ(t.layer(14).attn, AttnType::kFull);
  EXPECT_TRUE(t.layer(14).publishes_shared_kv);
  EXPECT_EQ(t.layer(14).head_dim, 512);
  EXPECT_EQ(t.layer(14).n_kv_heads, 1);
  EXPECT_FALSE(t.layer(15).owns_kv);
  EXPECT_EQ(t.layer(15).attn, AttnType::kSliding);
  EXPECT_EQ(t.layer(15).kv_source, 13);
  EXPECT_EQ(t.layer(34).attn, AttnType::kFull);
  EXPECT_EQ(t.layer(34).kv_source, 14);
  EXPECT_FALSE(t.layer(34).publishes_shared_kv);
  EXPECT_EQ(t.layer(19).kv_source, 14);
  int publishers = 0;
  for (const LayerSpec& l : t.layers) {
    publishers += l.publishes_shared_kv;
    EXPECT_EQ(l.owns_kv, l.index < 15);
    EXPECT_EQ(l.d_ff, l.index < 15 ? 6144 : 12288) << "layer " << l.index;
    EXPECT_EQ(l.window, l.attn == AttnType::kSliding ? 512 : 0);
    EXPECT_FALSE(l.k_eq_v);
    EXPECT_EQ(l.head_dim, l.attn == AttnType::kSliding ? 256 : 512);
    EXPECT_EQ(l.attn == AttnType::kFull, (l.index + 1) % 5 == 0);
  }
  EXPECT_EQ(publishers, 2);
}

// 31B (spec §2.1): K=V full layers with 4 global KV heads, no sharing; source layers 58 / 59 (§1.8).
TEST(Config, Real31bKEqV) {
  TinyModelSpec s;
  s.vocab = 262144;
  s.d_model = 5376;
  s.n_layers = 60;
  s.n_heads = 32;
  s.n_kv_heads = 16;
  s.n_global_kv_heads = 4;
  s.head_dim = 256;
  s.global_head_dim = 512;
  s.k_eq_v = true;
  s.d_ff = 21504;
  s.sliding_window = 1024;
  for (HeadDimFormat f : {HeadDimFormat::kRelease, HeadDimFormat::kPerLayerConfig}) {
    ModelConfig c = parse_ok(make_config(s, FixtureLayout::kCausalLM, f));
    const TextConfig& t = c.text;
    EXPECT_EQ(t.shared_kv_layer(AttnType::kSliding), 58);
    EXPECT_EQ(t.shared_kv_layer(AttnType::kFull), 59);
    EXPECT_EQ(t.n_global_kv_heads, 4);
    EXPECT_EQ(t.n_kv_heads, 16);
    for (const LayerSpec& l : t.layers) {
      const bool full = (l.index + 1) % 6 == 0;
      EXPECT_EQ(l.attn == AttnType::kFull, full);
      EXPECT_EQ(l.k_eq_v, full);
      EXPECT_EQ(l.n_kv_heads, full ? 4 : 16);
      EXPECT_TRUE(l.owns_kv);
      EXPECT_EQ(l.kv_source, l.index);
      EXPECT_EQ(l.window, full ? 0 : 1024);
      EXPECT_EQ(l.d_ff, 21504);
    }
  }
}

// 26B-A4B (spec §2.1): MoE 128 x top-8 x 704 beside a 2112-wide dense MLP, K=V with 2 global KV heads.
TEST(Config, Real26bMoe) {
  TinyModelSpec s;
  s.vocab = 262144;
  s.d_model = 2816;
  s.n_layers = 30;
  s.n_heads = 16;
  s.n_kv_heads = 8;
  s.n_global_kv_heads = 2;
  s.head_dim = 256;
  s.global_head_dim = 512;
  s.k_eq_v = true;
  s.d_ff = 2112;
  s.n_experts = 128;
  s.top_k_experts = 8;
  s.moe_d_ff = 704;
  s.sliding_window = 1024;
  ModelConfig c = parse_ok(make_config(s, FixtureLayout::kConditionalGeneration, HeadDimFormat::kPerLayerConfig));
  EXPECT_EQ(c.text.shared_kv_layer(AttnType::kSliding), 28);
  EXPECT_EQ(c.text.shared_kv_layer(AttnType::kFull), 29);
  EXPECT_EQ(c.text.layer(29).n_kv_heads, 2);
  EXPECT_TRUE(c.text.layer(29).k_eq_v);
  EXPECT_TRUE(c.text.layer(0).moe);
  EXPECT_EQ(c.text.layer(0).d_ff, 2112);
}

TEST(Config, HfDefaults) {
  json j = {{"model_type", "gemma4_text"}, {"vocab_size", 1000},      {"hidden_size", 64},
            {"intermediate_size", 128},    {"num_hidden_layers", 12}, {"num_attention_heads", 8}};
  ModelConfig c = parse_ok(j);
  const TextConfig& t = c.text;
  EXPECT_EQ(t.n_kv_heads, 4);
  EXPECT_EQ(t.head_dim, 256);
  EXPECT_EQ(t.global_head_dim, 512);
  EXPECT_EQ(t.n_global_kv_heads, 4);
  EXPECT_EQ(t.sliding_window, 512);
  EXPECT_EQ(t.max_position, 131072);
  EXPECT_FLOAT_EQ(t.rms_eps, 1e-6f);
  EXPECT_EQ(t.ple_dim, 256);
  EXPECT_EQ(t.ple_vocab, 262144);
  EXPECT_EQ(t.n_kv_shared_layers, 0);
  EXPECT_FALSE(t.attention_k_eq_v);
  EXPECT_FALSE(t.moe);
  EXPECT_FALSE(t.double_wide_mlp);
  EXPECT_TRUE(t.tie_word_embeddings);
  EXPECT_FALSE(t.final_logit_softcap.has_value());
  EXPECT_EQ(t.rope_sliding.kind, RopeKind::kDefault);
  EXPECT_EQ(t.rope_sliding.theta, 10000.0);
  EXPECT_EQ(t.rope_full.kind, RopeKind::kProportional);
  EXPECT_EQ(t.rope_full.theta, 1000000.0);
  EXPECT_EQ(t.rope_full.partial_rotary_factor, 0.25);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(t.layer(i).attn == AttnType::kFull, i == 5 || i == 11) << i;
  EXPECT_EQ(c.pad_id, 0);
  EXPECT_EQ(c.bos_id, 2);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{1}));  // Gemma4TextConfig's class default
}

TEST(Config, LastLayerForcedFull) {
  json j = make_config(tiny_31b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kRelease);
  j["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention"};
  ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.text.layer(3).attn, AttnType::kFull);
  EXPECT_EQ(c.text.layer(3).head_dim, 16);
}

TEST(Config, RopeInverseFrequencies) {
  const RopeSpec sliding{RopeKind::kDefault, 10000.0, 1.0};
  std::vector<float> f = sliding.inv_freq(256);
  ASSERT_EQ(f.size(), 128u);
  for (int j = 0; j < 128; ++j) {
    const double ref = 1.0 / std::pow(10000.0, 2.0 * j / 256.0);
    EXPECT_NEAR(f[static_cast<size_t>(j)], ref, 4e-7 * ref) << j;
  }
  EXPECT_NEAR(f[127], 1.0746e-4, 1e-8);  // spec §1.7
  EXPECT_EQ(sliding.rotated_pairs(256), 128);

  const RopeSpec full{RopeKind::kProportional, 1e6, 0.25};
  EXPECT_EQ(full.rotated_pairs(512), 64);
  std::vector<float> g = full.inv_freq(512);
  ASSERT_EQ(g.size(), 256u);
  for (int j = 0; j < 256; ++j) {
    const double ref = j < 64 ? 1.0 / std::pow(1e6, 2.0 * j / 512.0) : 0.0;
    EXPECT_NEAR(g[static_cast<size_t>(j)], ref, 4e-7 * ref) << j;
  }
  EXPECT_EQ(g[0], 1.0f);
  EXPECT_NEAR(g[1], 0.94746, 1e-5);  // spec §1.7
  EXPECT_NEAR(g[63], 0.033376, 1e-6);
  EXPECT_EQ(g[64], 0.0f);

  RopeSpec scaled = full;
  scaled.factor = 2.0;
  EXPECT_EQ(scaled.inv_freq(512)[1], g[1] / 2.0f);
  RopeSpec odd{RopeKind::kProportional, 1e6, 0.3};
  EXPECT_EQ(odd.rotated_pairs(512), 76);  // int(0.3 * 512 // 2) = int(153.6 // 2) = 76
}

TEST(Config, RopeParametersParsed) {
  json j = make_config(tiny_31b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kRelease);
  j["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 0.5;
  j["rope_parameters"]["sliding_attention"]["rope_theta"] = 5000.0;
  ModelConfig c = parse_ok(j);
  EXPECT_EQ(c.text.rope_full.partial_rotary_factor, 0.5);
  EXPECT_EQ(c.text.rope_sliding.theta, 5000.0);
  EXPECT_EQ(c.text.rope_full.rotated_pairs(16), 4);
}

TEST(Config, LoadMergesGenerationConfig) {
  TempDir dir;
  write_file(dir.file("config.json"),
             make_config(tiny_e2b_like(), FixtureLayout::kConditionalGeneration, HeadDimFormat::kRelease).dump());
  auto c = load_model_config(dir.path());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->eos_ids, (std::vector<int>{1, 6}));
  write_file(dir.file("generation_config.json"),
             json{{"eos_token_id", {1, 7, 6}}, {"bos_token_id", 2}, {"pad_token_id", 0}}.dump());
  c = load_model_config(dir.path());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->eos_ids, (std::vector<int>{1, 6, 7}));
  write_file(dir.file("generation_config.json"), std::string("{\"eos_token_id\": [1, 999]}"));
  c = load_model_config(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("generation_config.json"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("999"), std::string::npos);
  write_file(dir.file("generation_config.json"), std::string("{\"eos_token_id\": "));
  c = load_model_config(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("generation_config.json"), std::string::npos);
}

TEST(Config, LoadNamesMissingConfig) {
  TempDir dir;
  auto c = load_model_config(dir.path());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find(dir.file("config.json")), std::string::npos);
}

}  // namespace
}  // namespace tandem
