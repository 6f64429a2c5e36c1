// Sharded checkpoints (model.safetensors.index.json): a valid two-shard load and each kind of broken index.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "io/safetensors.h"
#include "support/checkpoint_writer.h"

namespace tandem {
namespace {

using nlohmann::json;
using namespace testsupport;

std::vector<FakeTensor> tensors() {
  return {f32_tensor("a", {2}, {1, 2}), f32_tensor("b", {3}, {3, 4, 5}), fake_tensor("c", "BF16", {2, 2}),
          i64_tensor("d", {1}, {42})};
}

void expect_error(const Status& s, StatusCode code, std::initializer_list<std::string> fragments) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const std::string& f : fragments)
    EXPECT_NE(s.message().find(f), std::string::npos) << f << " not in: " << s.message();
}

json read_index(const TempDir& dir) {
  auto m = SafetensorsModel::open(dir.path());  // not used: just make sure the helper wrote something sane
  (void)m;
  std::ifstream f(dir.file("model.safetensors.index.json"));
  return json::parse(f);
}

TEST(Sharded, ValidTwoShards) {
  TempDir dir;
  write_sharded_checkpoint(dir.path(), tensors(), {0, 1, 1, 0}, 2);
  for (const std::string& p : {dir.path(), dir.file("model.safetensors.index.json")}) {
    auto m = SafetensorsModel::open(p);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ASSERT_EQ(m->files().size(), 2u);
    EXPECT_EQ(m->tensors().size(), 4u);
    EXPECT_EQ(m->find("a")->file_index, m->find("d")->file_index);
    EXPECT_NE(m->find("a")->file_index, m->find("b")->file_index);
    EXPECT_EQ(static_cast<const float*>(m->find("b")->data)[2], 5.0f);
    EXPECT_EQ(static_cast<const int64_t*>(m->find("d")->data)[0], 42);
    EXPECT_EQ(m->total_tensor_bytes(), 8u + 12u + 8u + 8u);
  }
}

TEST(Sharded, MissingShard) {
  TempDir dir;
  write_sharded_checkpoint(dir.path(), tensors(), {0, 1, 1, 0}, 2);
  std::remove(dir.file(shard_name(1, 2)).c_str());
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kNotFound, {shard_name(1, 2), "no such file"});
}

TEST(Sharded, TensorInTwoShards) {
  TempDir dir;
  write_sharded_checkpoint(dir.path(), tensors(), {0, 1, 1, 0}, 2);
  // Rewrite shard 2 so that it also holds "a" (the index keeps saying shard 1).
  auto t = tensors();
  write_file(dir.file(shard_name(1, 2)), safetensors_bytes({t[0], t[1], t[2]}));
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kCorrupt, {"\"a\"", "two shards"});
}

TEST(Sharded, IndexPointsAtWrongShard) {
  TempDir dir;
  write_sharded_checkpoint(dir.path(), tensors(), {0, 1, 1, 0}, 2);
  json idx = read_index(dir);
  idx["weight_map"]["b"] = shard_name(0, 2);
  write_file(dir.file("model.safetensors.index.json"), idx.dump());
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kCorrupt,
               {"\"b\"", shard_name(0, 2), shard_name(1, 2)});
}

TEST(Sharded, IndexListsTensorNoShardHas) {
  TempDir dir;
  write_sharded_checkpoint(dir.path(), tensors(), {0, 1, 1, 0}, 2);
  json idx = read_index(dir);
  idx["weight_map"]["ghost"] = shard_name(1, 2);
  write_file(dir.file("model.safetensors.index.json"), idx.dump());
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kCorrupt, {"\"ghost\"", "does not contain it"});
}

TEST(Sharded, ShardHoldsUnlistedTensor) {
  TempDir dir;
  write_sharded_checkpoint(dir.path(), tensors(), {0, 1, 1, 0}, 2);
  json idx = read_index(dir);
  idx["weight_map"].erase("c");
  write_file(dir.file("model.safetensors.index.json"), idx.dump());
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kCorrupt, {"\"c\"", "does not list"});
}

TEST(Sharded, MalformedIndex) {
  TempDir dir;
  write_sharded_checkpoint(dir.path(), tensors(), {0, 1, 1, 0}, 2);
  const std::string index = dir.file("model.safetensors.index.json");
  write_file(index, std::string("{\"weight_map\": {\"a\": "));
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kCorrupt, {index, "invalid JSON"});
  write_file(index, std::string("{\"metadata\": {}}"));
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kCorrupt, {"missing \"weight_map\""});
  write_file(index, std::string("{\"weight_map\": {\"a\": 3}}"));
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kCorrupt, {"weight_map[\"a\"]"});
  write_file(index, std::string("{\"weight_map\": {\"a\": \"../model-00001-of-00002.safetensors\"}}"));
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kCorrupt, {"inside the checkpoint directory"});
  write_file(index, std::string("{\"weight_map\": {}}"));
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kCorrupt, {"no tensors"});
}

TEST(Sharded, BrokenShardIsNamed) {
  TempDir dir;
  write_sharded_checkpoint(dir.path(), tensors(), {0, 1, 1, 0}, 2);
  write_file(dir.file(shard_name(1, 2)), std::vector<uint8_t>{1, 2, 3});
  expect_error(SafetensorsModel::open(dir.path()).status(), StatusCode::kCorrupt, {shard_name(1, 2), "truncated"});
}

}  // namespace
}  // namespace tandem
