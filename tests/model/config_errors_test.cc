// config.json errors: malformed JSON, missing and mistyped fields, bad sizes, and every unsupported value gives a
// clear error naming the file and the field (src/model/gemma4_config.cc).
#include <gtest/gtest.h>

#include <functional>

#include "model/gemma4_config.h"
#include "support/gemma4_fixture.h"

namespace tandem {
namespace {

using nlohmann::json;
using namespace testsupport;

const char* kSrc = "/ckpt/config.json";

void expect_error(const std::string& text, StatusCode code, std::initializer_list<const char*> fragments) {
  auto r = parse_model_config(text, kSrc);
  ASSERT_FALSE(r.ok()) << text.substr(0, 200);
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_NE(r.status().message().find(kSrc), std::string::npos) << r.status().message();
  for (const char* f : fragments) {
    EXPECT_NE(r.status().message().find(f), std::string::npos) << "'" << f << "' not in: " << r.status().message();
  }
}

// Mutates a tiny CausalLM / ConditionalGeneration / assistant config and expects an error.
void text_case(const std::function<void(json&)>& edit, StatusCode code, std::initializer_list<const char*> frags) {
  json j = make_config(tiny_31b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kRelease);
  edit(j);
  expect_error(j.dump(), code, frags);
}
void nested_case(const std::function<void(json&)>& edit, StatusCode code, std::initializer_list<const char*> frags) {
  json j = make_config(tiny_e2b_like(), FixtureLayout::kConditionalGeneration, HeadDimFormat::kPerLayerConfig);
  edit(j);
  expect_error(j.dump(), code, frags);
}
void assistant_case(const std::function<void(json&)>& edit, StatusCode code, std::initializer_list<const char*> frags) {
  json j = make_config(tiny_assistant(true, tiny_e2b_like()), FixtureLayout::kAssistant, HeadDimFormat::kRelease);
  edit(j);
  expect_error(j.dump(), code, frags);
}

TEST(ConfigErrors, MalformedJson) {
  expect_error("{\"model_type\": \"gemma4_text\", ", StatusCode::kCorrupt, {"invalid JSON"});
  expect_error("", StatusCode::kCorrupt, {"invalid JSON"});
  expect_error("[1, 2]", StatusCode::kCorrupt, {"array", "expected an object"});
  expect_error("{\"model_type\": \"gemma4_text\", \"model_type\": \"gemma4\"}", StatusCode::kCorrupt,
               {"duplicate key"});
}

TEST(ConfigErrors, ModelType) {
  expect_error("{}", StatusCode::kCorrupt, {"model_type", "missing"});
  expect_error("{\"model_type\": 4}", StatusCode::kCorrupt, {"model_type", "string"});
  expect_error("{\"model_type\": \"llama\"}", StatusCode::kUnsupported, {"model_type", "llama"});
  nested_case([](json& j) { j.erase("text_config"); }, StatusCode::kCorrupt, {"text_config", "missing"});
  nested_case([](json& j) { j["text_config"] = "x"; }, StatusCode::kCorrupt, {"text_config", "object"});
  nested_case([](json& j) { j["text_config"]["model_type"] = "gemma3_text"; }, StatusCode::kUnsupported,
              {"text_config.model_type", "gemma3_text"});
}

TEST(ConfigErrors, MissingRequiredFields) {
  for (const char* f : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    text_case([&](json& j) { j.erase(f); }, StatusCode::kCorrupt, {f, "missing"});
    nested_case([&](json& j) { j["text_config"].erase(f); }, StatusCode::kCorrupt,
                {(std::string("text_config.") + f).c_str(), "missing"});
  }
}

TEST(ConfigErrors, WrongTypes) {
  text_case([](json& j) { j["hidden_size"] = "big"; }, StatusCode::kCorrupt, {"hidden_size", "integer", "string"});
  text_case([](json& j) { j["hidden_size"] = 16.5; }, StatusCode::kCorrupt, {"hidden_size", "integer"});
  text_case([](json& j) { j["attention_k_eq_v"] = 1; }, StatusCode::kCorrupt, {"attention_k_eq_v", "true or false"});
  text_case([](json& j) { j["rms_norm_eps"] = "small"; }, StatusCode::kCorrupt, {"rms_norm_eps", "number"});
  text_case([](json& j) { j["layer_types"] = "sliding"; }, StatusCode::kCorrupt, {"layer_types", "array"});
  text_case([](json& j) { j["layer_types"][1] = 3; }, StatusCode::kCorrupt, {"layer_types[1]", "string"});
  text_case([](json& j) { j["rope_parameters"] = 3; }, StatusCode::kCorrupt, {"rope_parameters"});
  text_case([](json& j) { j["per_layer_config"] = json::array(); }, StatusCode::kCorrupt, {"per_layer_config"});
  text_case([](json& j) { j["eos_token_id"] = "eos"; }, StatusCode::kInvalidArgument, {"eos_token_id"});
  text_case([](json& j) { j["eos_token_id"] = {1, -2}; }, StatusCode::kInvalidArgument, {"eos_token_id"});
  text_case([](json& j) { j["final_logit_softcapping"] = "30"; }, StatusCode::kCorrupt, {"final_logit_softcapping"});
  nested_case([](json& j) { j["text_config"]["per_layer_config"]["4"] = 5; }, StatusCode::kCorrupt,
              {"text_config.per_layer_config.4"});
  nested_case([](json& j) { j["text_config"]["per_layer_config"]["4"]["head_dim"] = "16"; }, StatusCode::kCorrupt,
              {"text_config.per_layer_config.4.head_dim"});
}

TEST(ConfigErrors, NonPositiveSizes) {
  for (const char* f :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "global_head_dim", "sliding_window", "max_position_embeddings"}) {
    text_case([&](json& j) { j[f] = 0; }, StatusCode::kInvalidArgument, {f, "positive"});
    text_case([&](json& j) { j[f] = -3; }, StatusCode::kInvalidArgument, {f, "-3"});
  }
  text_case([](json& j) { j["hidden_size"] = 1ll << 40; }, StatusCode::kInvalidArgument, {"hidden_size", "too large"});
  text_case([](json& j) { j["num_hidden_layers"] = 5000; }, StatusCode::kInvalidArgument,
            {"num_hidden_layers", "too large"});
  text_case([](json& j) { j["rms_norm_eps"] = 0; }, StatusCode::kInvalidArgument, {"rms_norm_eps"});
  text_case([](json& j) { j["num_kv_shared_layers"] = 9; }, StatusCode::kInvalidArgument, {"num_kv_shared_layers"});
  text_case([](json& j) { j["final_logit_softcapping"] = 0.0; }, StatusCode::kInvalidArgument,
            {"final_logit_softcapping"});
  text_case([](json& j) { j["head_dim"] = 7; }, StatusCode::kInvalidArgument, {"head_dim", "odd"});
}

TEST(ConfigErrors, HeadsNotDivisibleByKvHeads) {
  text_case([](json& j) { j["num_key_value_heads"] = 3; }, StatusCode::kInvalidArgument,
            {"num_attention_heads", "not a multiple", "3 KV heads"});
  text_case([](json& j) { j["num_global_key_value_heads"] = 3; }, StatusCode::kInvalidArgument,
            {"num_attention_heads", "layer 3"});
}

TEST(ConfigErrors, MoeNeedsItsSizes) {
  text_case([](json& j) { j["enable_moe_block"] = true; }, StatusCode::kCorrupt, {"num_experts", "missing"});
  text_case(
      [](json& j) {
        j["enable_moe_block"] = true;
        j["num_experts"] = 4;
        j["top_k_experts"] = 8;
        j["moe_intermediate_size"] = 8;
      },
      StatusCode::kInvalidArgument, {"top_k_experts"});
}

TEST(ConfigErrors, UnsupportedValues) {
  text_case([](json& j) { j["use_bidirectional_attention"] = "all"; }, StatusCode::kUnsupported,
            {"use_bidirectional_attention", "all"});
  text_case([](json& j) { j["use_bidirectional_attention"] = "some"; }, StatusCode::kInvalidArgument,
            {"use_bidirectional_attention", "some"});
  text_case([](json& j) { j["hidden_activation"] = "silu"; }, StatusCode::kUnsupported, {"hidden_activation", "silu"});
  text_case([](json& j) { j["attention_bias"] = true; }, StatusCode::kUnsupported, {"attention_bias"});
  text_case([](json& j) { j["rope_parameters"]["full_attention"]["rope_type"] = "yarn"; }, StatusCode::kUnsupported,
            {"rope_parameters.full_attention.rope_type", "yarn"});
  text_case([](json& j) { j["rope_parameters"]["sliding_attention"]["rope_type"] = "linear"; },
            StatusCode::kUnsupported, {"rope_parameters.sliding_attention.rope_type", "linear"});
  text_case([](json& j) { j["rope_parameters"].erase("sliding_attention"); }, StatusCode::kCorrupt,
            {"rope_parameters", "sliding_attention"});
  text_case([](json& j) { j["rope_parameters"]["full_attention"]["partial_rotary_factor"] = 1.5; },
            StatusCode::kInvalidArgument, {"partial_rotary_factor"});
  text_case([](json& j) { j["layer_types"][0] = "chunked_attention"; }, StatusCode::kUnsupported,
            {"layer_types[0]", "chunked_attention"});
  text_case([](json& j) { j["layer_types"].push_back("full_attention"); }, StatusCode::kInvalidArgument,
            {"layer_types", "5 entries", "num_hidden_layers is 4"});
  text_case([](json& j) { j["tie_word_embeddings"] = false; }, StatusCode::kUnsupported, {"tie_word_embeddings"});
  nested_case([](json& j) { j["text_config"]["use_bidirectional_attention"] = "all"; }, StatusCode::kUnsupported,
              {"text_config.use_bidirectional_attention"});
  // "vision" (26B/31B) is fine for the text-only path.
  json j = make_config(tiny_31b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kRelease);
  j["use_bidirectional_attention"] = "vision";
  EXPECT_TRUE(parse_model_config(j.dump(), kSrc).ok());
}

TEST(ConfigErrors, PerLayerConfigVaryingHeadDims) {
  nested_case([](json& j) { j["text_config"]["per_layer_config"]["9"]["head_dim"] = 32; }, StatusCode::kUnsupported,
              {"per_layer_config", "full layers", "layer 9"});
}

TEST(ConfigErrors, SharedLayerWithoutSource) {
  json j = make_config(tiny_31b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kRelease);
  j["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention", "full_attention"};
  j["num_kv_shared_layers"] = 3;  // layers 1-3 shared; no sliding layer below 1 owns K/V
  expect_error(j.dump(), StatusCode::kInvalidArgument, {"layer 1", "no earlier layer"});
}

TEST(ConfigErrors, AssistantValidation) {
  assistant_case([](json& j) { j["text_config"]["hidden_size_per_layer_input"] = 4; }, StatusCode::kInvalidArgument,
                 {"text_config.hidden_size_per_layer_input"});
  assistant_case([](json& j) { j["text_config"].erase("hidden_size_per_layer_input"); }, StatusCode::kInvalidArgument,
                 {"hidden_size_per_layer_input"});  // HF's default 256 fails the same check
  assistant_case([](json& j) { j["text_config"]["vocab_size_per_layer_input"] = 64; }, StatusCode::kInvalidArgument,
                 {"vocab_size_per_layer_input"});
  assistant_case(
      [](json& j) {
        j["text_config"]["enable_moe_block"] = true;
        j["text_config"]["num_experts"] = 2;
        j["text_config"]["top_k_experts"] = 1;
        j["text_config"]["moe_intermediate_size"] = 4;
      },
      StatusCode::kInvalidArgument, {"enable_moe_block"});
  assistant_case([](json& j) { j["text_config"]["use_double_wide_mlp"] = true; }, StatusCode::kInvalidArgument,
                 {"use_double_wide_mlp"});
  assistant_case([](json& j) { j["text_config"]["num_kv_shared_layers"] = 2; }, StatusCode::kInvalidArgument,
                 {"num_kv_shared_layers", "all 4"});
  assistant_case([](json& j) { j["num_centroids"] = 7; }, StatusCode::kInvalidArgument,
                 {"num_centroids", "not a multiple of num_centroids 7"});
  assistant_case([](json& j) { j["centroid_intermediate_top_k"] = 9; }, StatusCode::kInvalidArgument,
                 {"centroid_intermediate_top_k"});
  assistant_case([](json& j) { j["backbone_hidden_size"] = 0; }, StatusCode::kInvalidArgument,
                 {"backbone_hidden_size"});
  assistant_case([](json& j) { j["use_ordered_embeddings"] = "yes"; }, StatusCode::kCorrupt,
                 {"use_ordered_embeddings"});
  // Without ordered embeddings the centroid numbers are unused and not checked.
  json j = make_config(tiny_assistant(false, tiny_e2b_like()), FixtureLayout::kAssistant, HeadDimFormat::kRelease);
  j["num_centroids"] = 7;
  EXPECT_TRUE(parse_model_config(j.dump(), kSrc).ok());
}

TEST(ConfigErrors, TokenIdsOutsideVocab) {
  text_case([](json& j) { j["eos_token_id"] = {1, 64}; }, StatusCode::kInvalidArgument, {"eos_token_id 64"});
  text_case([](json& j) { j["bos_token_id"] = 100; }, StatusCode::kInvalidArgument, {"bos_token_id 100"});
}

}  // namespace
}  // namespace tandem
