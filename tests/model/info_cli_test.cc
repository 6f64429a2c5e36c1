// `tandem info` end to end: runs the built binary on synthetic checkpoints and checks its JSON accounting against
// sums computed here from the fixture's tensor list. Also `tandem bench --kv-capacity` on the CPU: the capacity it
// allocates, and a clear error for one below the positions the bench writes or above the model's context.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "support/gemma4_fixture.h"

namespace tandem {
namespace {

using nlohmann::json;
using namespace testsupport;

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

RunResult run_cli(const std::string& args, const TempDir& scratch) {
  const std::string out = scratch.file("stdout.txt"), err = scratch.file("stderr.txt");
  const std::string cmd = std::string(TANDEM_CLI_PATH) + " " + args + " > " + out + " 2> " + err;
  const int rc = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

bool starts(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }

TEST(InfoCli, TargetAccounting) {
  TempDir dir, scratch;
  const TinyModelSpec s = tiny_e2b_like();
  const TensorOptions opts{.towers = true};
  write_model(dir.path(), s, FixtureLayout::kConditionalGeneration, HeadDimFormat::kRelease, opts);
  RunResult r = run_cli("info --model " + dir.path() + " --json", scratch);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["layout"], "Gemma4ForConditionalGeneration");
  EXPECT_EQ(j["model_type"], "gemma4");
  ASSERT_EQ(j["layers"].size(), 10u);
  EXPECT_EQ(j["layers"][15 - 8]["kv_source"], 5);  // layer 7 (sliding, shared) reads layer 5
  EXPECT_EQ(j["layers"][9]["kv_source"], 4);
  EXPECT_EQ(j["layers"][9]["d_ff"], 64);
  EXPECT_EQ(j["layers"][5]["publishes_shared_kv"], true);

  uint64_t params = 0, bytes = 0, per_token = 0, towers = 0;
  for (const FakeTensor& t : make_tensors(s, FixtureLayout::kConditionalGeneration, opts)) {
    if (starts(t.name, "model.vision_tower.") || starts(t.name, "model.audio_tower.") ||
        starts(t.name, "model.embed_vision.") || starts(t.name, "model.embed_audio.")) {
      towers += t.data.size();
      continue;
    }
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    params += static_cast<uint64_t>(n);
    bytes += t.data.size();
    const uint64_t row = t.data.size() / static_cast<uint64_t>(t.shape.empty() ? 1 : t.shape[0]);
    if (t.name == "model.language_model.embed_tokens.weight") {
      per_token += t.data.size() + row;  // tied LM head + one input row
    } else if (t.name == "model.language_model.embed_tokens_per_layer.weight") {
      per_token += row;
    } else {
      per_token += t.data.size();
    }
  }
  EXPECT_EQ(j["parameters"], params);
  EXPECT_EQ(j["weight_bytes"], bytes);
  EXPECT_EQ(j["weight_bytes_per_token"], per_token);
  EXPECT_EQ(j["skipped"]["tower_bytes"], towers);
  // Owning layers 0-5: five sliding (1 KV head x 8) and one full (1 x 16), K and V in f32.
  EXPECT_EQ(j["kv_cache_bytes_per_token"], 5 * 2 * 1 * 8 * 4 + 2 * 1 * 16 * 4);
  EXPECT_EQ(j["eos_ids"], json({1, 6}));

  RunResult text = run_cli("info --model " + dir.path(), scratch);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("Gemma4ForConditionalGeneration"), std::string::npos);
  EXPECT_NE(text.out.find("skipped 7 tower tensors"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("publishes"), std::string::npos);
}

TEST(InfoCli, MoeReadsTopKExperts) {
  TempDir dir, scratch;
  const TinyModelSpec s = tiny_26b_like();
  write_model(dir.path(), s, FixtureLayout::kCausalLM, HeadDimFormat::kPerLayerConfig);
  RunResult r = run_cli("info --model " + dir.path() + " --json", scratch);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  uint64_t per_token = 0;
  for (const FakeTensor& t : make_tensors(s, FixtureLayout::kCausalLM)) {
    if (t.name == "model.embed_tokens.weight") {
      per_token += t.data.size() + t.data.size() / 64;
    } else if (t.name.find("experts.") != std::string::npos) {
      per_token += t.data.size() / 4 * 2;  // top-2 of 4 experts
    } else {
      per_token += t.data.size();
    }
  }
  EXPECT_EQ(j["weight_bytes_per_token"], per_token);
  EXPECT_EQ(j["lm_head"], "tied");
}

TEST(InfoCli, Assistant) {
  TempDir dir, scratch;
  const TinyModelSpec s = tiny_assistant(true, tiny_e2b_like());
  write_model(dir.path(), s, FixtureLayout::kAssistant, HeadDimFormat::kRelease);
  RunResult r = run_cli("info --model " + dir.path() + " --json", scratch);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json j = json::parse(r.out);
  EXPECT_EQ(j["lm_head"], "centroid");
  EXPECT_EQ(j["kv_cache_bytes_per_token"], 0);
  EXPECT_EQ(j["assistant"]["backbone_d_model"], 16);
  RunResult text = run_cli("info --model " + dir.path(), scratch);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("centroid LM head: 8 centroids, top 2 -> 16 candidate tokens"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("requires d_model 16"), std::string::npos) << text.out;
}

TEST(InfoCli, ErrorsGoToStderrWithExitCode1) {
  TempDir dir, scratch;
  RunResult r = run_cli("info --model " + dir.path(), scratch);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
  write_model(dir.path(), tiny_31b_like(), FixtureLayout::kCausalLM, HeadDimFormat::kRelease);
  auto tensors = make_tensors(tiny_31b_like(), FixtureLayout::kCausalLM);
  tensors.pop_back();
  write_single_checkpoint(dir.path(), tensors);
  r = run_cli("info --model " + dir.path(), scratch);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("missing model.layers.3.mlp.down_proj.weight"), std::string::npos) << r.err;
}

TEST(InfoCli, VerbosityFlagsGoBeforeOrAfterTheCommand) {
  TempDir dir, scratch;
  write_model(dir.path(), tiny_e2b_like(), FixtureLayout::kConditionalGeneration, HeadDimFormat::kRelease);
  for (const std::string& args :
       {"-v info --model " + dir.path(), "info --model " + dir.path() + " -v", "info -q --model " + dir.path()}) {
    RunResult r = run_cli(args, scratch);
    EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
    EXPECT_NE(r.out.find("gemma4"), std::string::npos) << args << ": " << r.out;
  }
  RunResult r = run_cli("info --model " + dir.path() + " --no-such-flag", scratch);
  EXPECT_NE(r.exit_code, 0);  // an unknown option is still refused
  EXPECT_NE(r.err.find("--no-such-flag"), std::string::npos) << r.err;
}

TEST(BenchCli, KvCapacityIsAllocatedOrRefused) {
  TempDir dir, scratch;
  write_model(dir.path(), tiny_e2b_like(), FixtureLayout::kConditionalGeneration, HeadDimFormat::kRelease);
  const std::string base = "bench --model " + dir.path() + " --iters 1 --context 8 --max-k 1 --threads 1";
  // The bench writes 8 + 1 x (1 + 3) + 80 = 92 positions.
  RunResult r = run_cli(base + " --kv-capacity 91", scratch);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--kv-capacity 91: the bench writes 92 positions"), std::string::npos) << r.err;
  r = run_cli(base + " --kv-capacity -5", scratch);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--kv-capacity -5"), std::string::npos) << r.err;
  r = run_cli(base + " --kv-capacity 5000", scratch);  // the fixture's context is 4096
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("5000"), std::string::npos) << r.err;
  r = run_cli(base + " --kv-capacity 4096", scratch);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("per token, 4096 positions"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decode 1 token"), std::string::npos) << r.out;
  r = run_cli(base, scratch);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("per token, 92 positions"), std::string::npos) << r.out;
}

TEST(BenchCli, PrefillChunkIsUsedOrRefused) {
  TempDir dir, scratch;
  write_model(dir.path(), tiny_e2b_like(), FixtureLayout::kConditionalGeneration, HeadDimFormat::kRelease);
  const std::string base = "bench --model " + dir.path() + " --iters 1 --context 8 --max-k 1 --threads 1";
  for (const char* bad : {"0", "-3", "8193"}) {
    RunResult r = run_cli(base + " --prefill-chunk " + bad, scratch);
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_NE(r.err.find(std::string("--prefill-chunk must be 1..8192 (got ") + bad + ")"), std::string::npos) << r.err;
  }
  RunResult r = run_cli(base + " --prefill-chunk 3", scratch);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("prefill 8 tokens, chunks of 3 ("), std::string::npos) << r.out;
  r = run_cli(base, scratch);  // the default chunk (1024) takes the whole prompt
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("prefill 8 tokens ("), std::string::npos) << r.out;
  r = run_cli("generate --model " + dir.path() + " --ids 5,6,7 --max-tokens 2 --prefill-chunk 0", scratch);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--prefill-chunk must be 1..8192 (got 0)"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
