// Weight binding (src/model/gemma4_weights.cc) on synthetic checkpoints whose tensor lists come from the spec
// tables encoded separately in tests/support/gemma4_fixture.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "io/safetensors.h"
#include "model/gemma4_weights.h"
#include "support/gemma4_fixture.h"

namespace tandem {
namespace {

using nlohmann::json;
using namespace testsupport;

struct Loaded {
  ModelConfig cfg;
  SafetensorsModel st;
};

Loaded load(const TempDir& dir) {
  auto cfg = load_model_config(dir.path());
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto st = SafetensorsModel::open(dir.path());
  EXPECT_TRUE(st.ok()) << st.status().to_string();
  return {cfg.ok() ? *cfg : ModelConfig{}, st.ok() ? std::move(*st) : SafetensorsModel{}};
}

bool is_extra(const std::string& name) {
  return name.rfind("model.vision_tower.", 0) == 0 || name.rfind("model.audio_tower.", 0) == 0 ||
         name.rfind("model.embed_vision.", 0) == 0 || name.rfind("model.embed_audio.", 0) == 0 ||
         name == "lm_head.weight";
}

// Every non-extra tensor the fixture wrote is visited exactly once, with the fixture's shape.
template <class W>
void expect_visits_fixture(const ModelConfig& cfg, W& w, const std::vector<FakeTensor>& written,
                           const std::set<std::string>& also_extra = {}) {
  std::map<std::string, std::vector<int64_t>> want;
  for (const FakeTensor& t : written) {
    if (!is_extra(t.name) && !also_extra.count(t.name)) want[t.name] = t.shape;
  }
  std::map<std::string, std::vector<int64_t>> got;
  for_each_tensor(cfg, w, [&](const std::string& name, Tensor& t) {
    EXPECT_FALSE(got.count(name)) << name << " visited twice";
    got[name] = std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim);
  });
  EXPECT_EQ(got, want);
}

TEST(Weights, BindsConditionalGenerationWithExtras) {
  TempDir dir;
  const TinyModelSpec s = tiny_e2b_like();
  const TensorOptions opts{.towers = true, .shared_kv_weights = true, .lm_head = true};
  write_model(dir.path(), s, FixtureLayout::kConditionalGeneration, HeadDimFormat::kRelease, opts);
  Loaded l = load(dir);
  auto w = bind_target_weights(l.cfg, l.st);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  const auto written = make_tensors(s, FixtureLayout::kConditionalGeneration, opts);
  std::set<std::string> shared_kv;
  for (const FakeTensor& t : written) {
    for (int i = 6; i < 10; ++i) {
      const std::string p = "model.language_model.layers." + std::to_string(i) + ".self_attn.";
      if (t.name.rfind(p + "k_", 0) == 0 || t.name.rfind(p + "v_", 0) == 0) shared_kv.insert(t.name);
    }
  }
  EXPECT_EQ(shared_kv.size(), 12u);  // k_proj, k_norm, v_proj on the four shared layers
  expect_visits_fixture(l.cfg, *w, written, shared_kv);
  EXPECT_EQ(w->embed.describe(), "[64, 16] bf16");
  EXPECT_EQ(w->ple_embed.describe(), "[64, 40] bf16");
  EXPECT_EQ(w->layers[5].mlp.gate.dim(0), 32);
  EXPECT_EQ(w->layers[6].mlp.gate.dim(0), 64);  // double-wide from the first shared layer
  EXPECT_TRUE(w->layers[6].attn.k_proj.empty());
  EXPECT_FALSE(w->layers[5].attn.k_proj.empty());
  EXPECT_FALSE(w->layers[4].attn.v_proj.empty());                   // no K=V on E models
  EXPECT_EQ(w->layers[4].attn.q_proj.describe(), "[32, 16] bf16");  // full layer: 2 heads x 16
  EXPECT_EQ(w->layers[0].layer_scalar.describe(), "[1] bf16");
  EXPECT_EQ(w->layers[0].ple.gate.describe(), "[4, 16] bf16");
  EXPECT_EQ(l.st.find("model.language_model.embed_tokens.weight")->data, w->embed.data);
}

TEST(Weights, BindsMoeCausalLmPerLayerConfig) {
  TempDir dir;
  const TinyModelSpec s = tiny_26b_like();
  write_model(dir.path(), s, FixtureLayout::kCausalLM, HeadDimFormat::kPerLayerConfig, {.float_dtype = "F32"});
  Loaded l = load(dir);
  auto w = bind_target_weights(l.cfg, l.st);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  expect_visits_fixture(l.cfg, *w, make_tensors(s, FixtureLayout::kCausalLM));
  EXPECT_EQ(w->layers[0].moe.gate_up.describe(), "[4, 16, 16] f32");
  EXPECT_EQ(w->layers[0].moe.down.describe(), "[4, 16, 8] f32");
  EXPECT_EQ(w->layers[0].moe.router_proj.describe(), "[4, 16] f32");
  EXPECT_TRUE(w->layers[5].attn.v_proj.empty());                   // K=V full layer
  EXPECT_EQ(w->layers[5].attn.k_proj.describe(), "[16, 16] f32");  // 1 global KV head x 16
  EXPECT_FALSE(w->layers[4].attn.v_proj.empty());
  EXPECT_TRUE(w->ple_embed.empty());
}

TEST(Weights, BindsShardedDense) {
  TempDir dir;
  const TinyModelSpec s = tiny_31b_like();
  write_file(dir.file("config.json"), make_config(s, FixtureLayout::kCausalLM, HeadDimFormat::kRelease).dump());
  const auto tensors = make_tensors(s, FixtureLayout::kCausalLM, {.float_dtype = "F16"});
  std::vector<int> shard_of;
  for (size_t i = 0; i < tensors.size(); ++i) shard_of.push_back(i < tensors.size() / 2 ? 0 : 1);
  write_sharded_checkpoint(dir.path(), tensors, shard_of, 2);
  Loaded l = load(dir);
  ASSERT_EQ(l.st.files().size(), 2u);
  auto w = bind_target_weights(l.cfg, l.st);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  expect_visits_fixture(l.cfg, *w, tensors);
}

TEST(Weights, BindsAssistants) {
  for (bool ordered : {true, false}) {
    TempDir dir;
    const TinyModelSpec s = tiny_assistant(ordered, tiny_e2b_like());
    write_model(dir.path(), s, FixtureLayout::kAssistant, HeadDimFormat::kRelease, {.lm_head = true});
    Loaded l = load(dir);
    auto w = bind_assistant_weights(l.cfg, l.st);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    expect_visits_fixture(l.cfg, *w, make_tensors(s, FixtureLayout::kAssistant));
    EXPECT_EQ(w->pre_projection.describe(), "[8, 32] bf16");
    EXPECT_EQ(w->post_projection.describe(), "[16, 8] bf16");
    EXPECT_TRUE(w->lm_head.empty());  // tied: the stored copy is ignored
    EXPECT_EQ(w->centroids.empty(), !ordered);
    if (ordered) {
      EXPECT_EQ(w->token_ordering.describe(), "[64] i64");
    }
    for (const LayerWeights& lw : w->layers) {
      EXPECT_TRUE(lw.attn.k_proj.empty());
      EXPECT_TRUE(lw.attn.v_proj.empty());
      EXPECT_FALSE(lw.attn.q_proj.empty());
    }
  }
}

TEST(Weights, UntiedAssistantNeedsLmHead) {
  TempDir dir;
  TinyModelSpec s = tiny_assistant(false, tiny_31b_like());
  s.tied = false;
  write_model(dir.path(), s, FixtureLayout::kAssistant, HeadDimFormat::kRelease);
  Loaded l = load(dir);
  auto w = bind_assistant_weights(l.cfg, l.st);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_EQ(w->lm_head.describe(), "[64, 8] bf16");
  auto tensors = make_tensors(s, FixtureLayout::kAssistant);
  tensors.erase(
      std::remove_if(tensors.begin(), tensors.end(), [](const FakeTensor& t) { return t.name == "lm_head.weight"; }),
      tensors.end());
  write_single_checkpoint(dir.path(), tensors);
  l = load(dir);
  auto w2 = bind_assistant_weights(l.cfg, l.st);
  ASSERT_FALSE(w2.ok());
  EXPECT_NE(w2.status().message().find("missing lm_head.weight [64, 8]"), std::string::npos) << w2.status().message();
}

// Writes the fixture after `edit` and returns the bind error message.
std::string bind_error(const TinyModelSpec& s, FixtureLayout layout,
                       const std::function<void(std::vector<FakeTensor>&)>& edit) {
  TempDir dir;
  write_file(dir.file("config.json"), make_config(s, layout, HeadDimFormat::kRelease).dump());
  auto tensors = make_tensors(s, layout);
  edit(tensors);
  write_single_checkpoint(dir.path(), tensors);
  Loaded l = load(dir);
  Status st = layout == FixtureLayout::kAssistant ? bind_assistant_weights(l.cfg, l.st).status()
                                                  : bind_target_weights(l.cfg, l.st).status();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(dir.file("model.safetensors")), std::string::npos) << st.message();
  return st.message();
}

void erase_named(std::vector<FakeTensor>& v, const std::string& name) {
  auto it = std::find_if(v.begin(), v.end(), [&](const FakeTensor& t) { return t.name == name; });
  ASSERT_NE(it, v.end()) << name;
  v.erase(it);
}

FakeTensor& get(std::vector<FakeTensor>& v, const std::string& name) {
  auto it = std::find_if(v.begin(), v.end(), [&](const FakeTensor& t) { return t.name == name; });
  EXPECT_NE(it, v.end()) << name;
  return *it;
}

TEST(Weights, NamesEveryMissingTensor) {
  std::string m = bind_error(tiny_31b_like(), FixtureLayout::kCausalLM, [](auto& v) {
    erase_named(v, "model.layers.1.mlp.up_proj.weight");
    erase_named(v, "model.norm.weight");
    erase_named(v, "model.layers.3.layer_scalar");
  });
  EXPECT_NE(m.find("3 problems"), std::string::npos) << m;
  EXPECT_NE(m.find("missing model.layers.1.mlp.up_proj.weight [32, 16]"), std::string::npos) << m;
  EXPECT_NE(m.find("missing model.norm.weight [16]"), std::string::npos) << m;
  EXPECT_NE(m.find("missing model.layers.3.layer_scalar [1]"), std::string::npos) << m;
}

TEST(Weights, NamesMisshapedAndMistypedTensors) {
  std::string m = bind_error(tiny_31b_like(), FixtureLayout::kCausalLM, [](auto& v) {
    get(v, "model.layers.3.self_attn.k_proj.weight") =
        fake_tensor("model.layers.3.self_attn.k_proj.weight", "BF16", {32, 16});
    get(v, "model.layers.0.input_layernorm.weight") = fake_tensor("model.layers.0.input_layernorm.weight", "I32", {16});
  });
  EXPECT_NE(m.find("model.layers.3.self_attn.k_proj.weight has shape [32, 16], expected [16, 16]"), std::string::npos)
      << m;
  EXPECT_NE(m.find("model.layers.0.input_layernorm.weight has dtype I32"), std::string::npos) << m;
}

TEST(Weights, RejectsUnexpectedTensors) {
  std::string m = bind_error(tiny_31b_like(), FixtureLayout::kCausalLM, [](auto& v) {
    v.push_back(fake_tensor("model.layers.0.self_attn.bogus.weight", "BF16", {2}));
    v.push_back(fake_tensor("model.layers.3.self_attn.v_proj.weight", "BF16", {16, 16}));  // K=V layer has no v_proj
    v.push_back(fake_tensor("model.layers.9.input_layernorm.weight", "BF16", {16}));       // past the last layer
  });
  EXPECT_NE(m.find("unexpected tensor model.layers.0.self_attn.bogus.weight [2]"), std::string::npos) << m;
  EXPECT_NE(m.find("unexpected tensor model.layers.3.self_attn.v_proj.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("unexpected tensor model.layers.9.input_layernorm.weight"), std::string::npos) << m;
  // Owning layers' k/v are not "unused shared" extras; towers are not extras for an assistant.
  m = bind_error(tiny_assistant(true, tiny_e2b_like()), FixtureLayout::kAssistant,
                 [](auto& v) { v.push_back(fake_tensor("model.vision_tower.x", "BF16", {2})); });
  EXPECT_NE(m.find("unexpected tensor model.vision_tower.x"), std::string::npos) << m;
}

TEST(Weights, TokenOrderingMustBePermutation) {
  std::string m = bind_error(tiny_assistant(true, tiny_e2b_like()), FixtureLayout::kAssistant, [](auto& v) {
    std::vector<int64_t> ids(64);
    for (int i = 0; i < 64; ++i) ids[static_cast<size_t>(i)] = i;
    ids[10] = 3;
    get(v, "masked_embedding.token_ordering") = i64_tensor("masked_embedding.token_ordering", {64}, ids);
  });
  EXPECT_NE(m.find("not a permutation"), std::string::npos) << m;
  m = bind_error(tiny_assistant(true, tiny_e2b_like()), FixtureLayout::kAssistant, [](auto& v) {
    get(v, "masked_embedding.token_ordering") = fake_tensor("masked_embedding.token_ordering", "BF16", {64});
  });
  EXPECT_NE(m.find("masked_embedding.token_ordering has dtype BF16, expected I64 or I32"), std::string::npos) << m;
}

TEST(Weights, WrongKindOfCheckpoint) {
  TempDir dir;
  write_model(dir.path(), tiny_31b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kRelease);
  Loaded l = load(dir);
  auto a = bind_assistant_weights(l.cfg, l.st);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("not an assistant"), std::string::npos);
  TempDir dir2;
  write_model(dir2.path(), tiny_assistant(false, tiny_31b_like()), FixtureLayout::kAssistant, HeadDimFormat::kRelease);
  Loaded l2 = load(dir2);
  auto t = bind_target_weights(l2.cfg, l2.st);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("not a target"), std::string::npos);
}

TEST(Weights, TowerPredicate) {
  EXPECT_TRUE(is_multimodal_tower_tensor("model.vision_tower.encoder.layers.0.mlp.up_proj.linear.weight"));
  EXPECT_TRUE(is_multimodal_tower_tensor("model.embed_audio.embedding_projection.weight"));
  EXPECT_FALSE(is_multimodal_tower_tensor("model.language_model.embed_tokens.weight"));
  EXPECT_FALSE(is_multimodal_tower_tensor("vision_tower.x"));
}

}  // namespace
}  // namespace tandem
