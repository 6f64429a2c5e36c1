// Random-weight checkpoints written to disk (model/synthetic.h): the files hold exactly the values the in-memory
// synthetic weights have, load like a downloaded checkpoint, and an existing checkpoint is never overwritten.
#include "model/synthetic.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "model/gemma4.h"
#include "model/gemma4_weights.h"
#include "support/checkpoint_writer.h"
#include "support/fixture_refs.h"

namespace tandem {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(SyntheticCheckpoint, FileHoldsTheInMemoryRandomWeightsAndLoads) {
  testsupport::TempDir tmp;
  const std::string dir = tmp.file("e2b");
  // The e2b-tiny fixture's config (per-layer inputs, KV sharing, double-wide MLP), and a drafter's (index tensor).
  for (const char* fixture : {"models/e2b-tiny", "models/e2b-tiny-assistant"}) {
    SCOPED_TRACE(fixture);
    const std::string json = read_text(testing::fixture_path(std::string(fixture) + "/config.json"));
    const std::string out = dir + (std::strstr(fixture, "assistant") ? "/assistant" : "");
    uint64_t last_done = 0, last_total = 0;
    ASSERT_TRUE(write_random_checkpoint(json, out, 5, [&](uint64_t d, uint64_t t) {
                  EXPECT_GE(d, last_done);
                  last_done = d;
                  last_total = t;
                }).ok());
    EXPECT_EQ(last_done, last_total);
    EXPECT_FALSE(std::filesystem::exists(out + "/model.safetensors.partial"));
    auto cfg = load_model_config(out);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    auto disk = WeightStore::open(out);
    ASSERT_TRUE(disk.ok()) << disk.status().to_string();
    auto mem = make_random_weights(*cfg, 5);
    ASSERT_TRUE(mem.ok());
    const auto expected = expected_tensors(*cfg);
    ASSERT_FALSE(expected.empty());
    for (const ExpectedTensor& e : expected) {
      const TensorInfo* a = disk->safetensors().find(e.name);
      const TensorInfo* b = mem->safetensors().find(e.name);
      ASSERT_NE(a, nullptr) << e.name;
      ASSERT_NE(b, nullptr) << e.name;
      EXPECT_EQ(a->dtype, b->dtype) << e.name;
      EXPECT_EQ(a->shape, e.shape) << e.name;
      ASSERT_EQ(a->nbytes, b->nbytes) << e.name;
      EXPECT_EQ(std::memcmp(a->data, b->data, a->nbytes), 0) << e.name << ": values differ from the in-memory ones";
    }
  }
  auto be = make_cpu_backend(1);
  auto target = Gemma4Model::load(dir, *be);
  ASSERT_TRUE(target.ok()) << target.status().to_string();
}

TEST(SyntheticCheckpoint, RefusesToOverwriteAndRejectsBadConfigs) {
  testsupport::TempDir tmp;
  const std::string json = read_text(testing::fixture_path("models/e2b-tiny/config.json"));
  ASSERT_TRUE(write_random_checkpoint(json, tmp.path(), 1).ok());
  const auto size = std::filesystem::file_size(tmp.file("model.safetensors"));
  Status again = write_random_checkpoint(json, tmp.path(), 2);
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(again.message().find("already exists"), std::string::npos) << again.to_string();
  EXPECT_EQ(std::filesystem::file_size(tmp.file("model.safetensors")), size);

  testsupport::TempDir other;
  EXPECT_FALSE(write_random_checkpoint("{not json", other.path(), 1).ok());
  EXPECT_FALSE(std::filesystem::exists(other.file("model.safetensors")));
  EXPECT_FALSE(arch_config_json("gemma4-7b", false).ok());
  auto e2b = arch_config_json("gemma4-e2b", false);
  ASSERT_TRUE(e2b.ok());
  EXPECT_NE(e2b->find("\"hidden_size\":1536"), std::string::npos);
}

}  // namespace
}  // namespace tandem
