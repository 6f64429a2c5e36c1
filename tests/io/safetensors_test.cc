// safetensors header validation and single-file loading (src/io/safetensors.cc): one test per kind of bad input.
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "support/checkpoint_writer.h"

namespace tandem {
namespace {

using nlohmann::json;
using namespace testsupport;

Result<std::vector<TensorInfo>> parse(const std::vector<uint8_t>& bytes, const std::string& name = "t.safetensors") {
  return parse_safetensors_header(bytes.data(), bytes.size(), name);
}

// Expects failure with `code` and every fragment in the message.
void expect_error(const Status& s, StatusCode code, std::initializer_list<const char*> fragments) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const char* f : fragments)
    EXPECT_NE(s.message().find(f), std::string::npos) << "'" << f << "' not in: " << s.message();
}

std::vector<FakeTensor> sample_tensors() {
  return {f32_tensor("a.weight", {2, 3}, {1, 2, 3, 4, 5, 6}), fake_tensor("b.bf16", "BF16", {4}),
          i64_tensor("c.ids", {3}, {7, -8, 9}), f32_tensor("d.scalar", {}, {2.5f}),
          fake_tensor("e.empty", "F16", {0, 5})};
}

TEST(SafetensorsHeader, ValidFileParses) {
  auto bytes = safetensors_bytes(sample_tensors());
  auto r = parse(bytes);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), 5u);
  std::map<std::string, TensorInfo> by;
  for (const TensorInfo& t : *r) by[t.name] = t;
  EXPECT_EQ(by["a.weight"].dtype, DType::kF32);
  EXPECT_EQ(by["a.weight"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(by["a.weight"].nbytes, 24u);
  float v[6];
  std::memcpy(v, by["a.weight"].data, 24);
  EXPECT_EQ(v[5], 6.0f);
  EXPECT_EQ(by["b.bf16"].dtype, DType::kBF16);
  EXPECT_EQ(by["c.ids"].dtype, DType::kI64);
  EXPECT_EQ(static_cast<const int64_t*>(by["c.ids"].data)[1], -8);
  EXPECT_EQ(by["d.scalar"].shape.size(), 0u);
  EXPECT_EQ(by["d.scalar"].numel(), 1);
  EXPECT_EQ(by["e.empty"].nbytes, 0u);
  EXPECT_EQ(by["e.empty"].shape_str(), "[0, 5]");
  Tensor t = by["a.weight"].view();
  EXPECT_EQ(t.describe(), "[2, 3] f32");
}

TEST(SafetensorsHeader, TruncatedBelowEightBytes) {
  std::vector<uint8_t> b = {1, 2, 3, 4, 5};
  expect_error(parse(b, "tiny.safetensors").status(), StatusCode::kCorrupt, {"tiny.safetensors", "truncated"});
}

TEST(SafetensorsHeader, TruncatedDataSection) {
  auto b = safetensors_bytes(sample_tensors());
  b.resize(b.size() - 10);
  expect_error(parse(b).status(), StatusCode::kCorrupt, {"t.safetensors", "past the end of the data section"});
}

TEST(SafetensorsHeader, HeaderLengthPastEnd) {
  auto b = safetensors_bytes(sample_tensors());
  b[0] = 0xff;
  b[1] = 0xff;
  b[2] = 0x01;
  expect_error(parse(b).status(), StatusCode::kCorrupt, {"header length", "past the end of the file"});
}

TEST(SafetensorsHeader, AbsurdHeaderLength) {
  // The declared file is large enough, so only the size limit stops a 200 MB header; nothing past byte 8 is read.
  std::vector<uint8_t> b(8, 0);
  const uint64_t n = 200'000'000;
  for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  auto r = parse_safetensors_header(b.data(), uint64_t{1} << 40, "big.safetensors");
  expect_error(r.status(), StatusCode::kCorrupt, {"big.safetensors", "absurdly large"});
}

TEST(SafetensorsHeader, BadJson) {
  expect_error(parse(raw_safetensors_bytes("{\"a\": {\"dtype\": ", {})).status(), StatusCode::kCorrupt,
               {"t.safetensors", "invalid JSON"});
}

TEST(SafetensorsHeader, NonObjectHeader) {
  expect_error(parse(raw_safetensors_bytes("[1, 2]", {})).status(), StatusCode::kCorrupt,
               {"array", "expected an object"});
}

TEST(SafetensorsHeader, DuplicateTensorName) {
  const std::string h = R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                            "x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(8))).status(), StatusCode::kCorrupt,
               {"duplicate key \"x\""});
}

TEST(SafetensorsHeader, UnknownDtypeIsNamed) {
  const std::string h = R"({"w": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(8))).status(), StatusCode::kUnsupported,
               {"t.safetensors", "\"w\"", "F64"});
  const std::string h2 = R"({"w": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}})";
  expect_error(parse(raw_safetensors_bytes(h2, std::vector<uint8_t>(1))).status(), StatusCode::kUnsupported,
               {"F8_E4M3"});
}

TEST(SafetensorsHeader, NegativeShape) {
  const std::string h = R"({"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(8))).status(), StatusCode::kCorrupt,
               {"\"w\"", "negative dimension"});
}

TEST(SafetensorsHeader, NonIntegerShape) {
  const std::string h = R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(8))).status(), StatusCode::kCorrupt,
               {"\"w\"", "non-integer dimension"});
  const std::string h2 = R"({"w": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}})";
  expect_error(parse(raw_safetensors_bytes(h2, std::vector<uint8_t>(8))).status(), StatusCode::kCorrupt,
               {"shape is a string"});
}

TEST(SafetensorsHeader, ShapeOverflow) {
  const std::string h = R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 0], "data_offsets": [0, 0]}})";
  expect_error(parse(raw_safetensors_bytes(h, {})).status(), StatusCode::kCorrupt, {"overflows"});
}

TEST(SafetensorsHeader, OffsetsPastEnd) {
  const std::string h = R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(8))).status(), StatusCode::kCorrupt,
               {"\"w\"", "past the end of the data section"});
}

TEST(SafetensorsHeader, ReversedOffsets) {
  const std::string h = R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(8))).status(), StatusCode::kCorrupt,
               {"end before they begin"});
}

TEST(SafetensorsHeader, MalformedOffsets) {
  const std::string h = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(4))).status(), StatusCode::kCorrupt,
               {"data_offsets must be an array"});
  const std::string h2 = R"({"w": {"dtype": "F32", "shape": [1]}})";
  expect_error(parse(raw_safetensors_bytes(h2, std::vector<uint8_t>(4))).status(), StatusCode::kCorrupt,
               {"missing \"data_offsets\""});
}

TEST(SafetensorsHeader, OverlappingRanges) {
  const std::string h = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(12))).status(), StatusCode::kCorrupt,
               {"\"b\"", "overlaps", "\"a\""});
}

TEST(SafetensorsHeader, HoleInData) {
  const std::string h = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(12))).status(), StatusCode::kCorrupt,
               {"hole of 4", "\"b\""});
}

TEST(SafetensorsHeader, TrailingBytes) {
  const std::string h = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(12))).status(), StatusCode::kCorrupt,
               {"8 bytes after the last tensor"});
}

TEST(SafetensorsHeader, ShapeTimesDtypeNotSize) {
  const std::string h = R"({"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}})";
  expect_error(parse(raw_safetensors_bytes(h, std::vector<uint8_t>(8))).status(), StatusCode::kCorrupt,
               {"\"a\"", "needs 6 bytes", "span 8"});
}

TEST(SafetensorsHeader, MisalignedData) {
  // Unpadded header of odd length: the F32 data starts at an odd file offset.
  std::string h = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  if ((8 + h.size()) % 2 == 0) h += " ";
  auto b = raw_safetensors_bytes(h, std::vector<uint8_t>(4), /*pad8=*/false);
  expect_error(parse(b).status(), StatusCode::kUnsupported, {"\"a\"", "not aligned"});
  // A 1-byte-aligned dtype would be fine there, and so is a 2-byte one at an even offset.
  std::string h2 = R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})";
  if ((8 + h2.size()) % 4 != 2) h2 += std::string((2 + 4 - (8 + h2.size()) % 4) % 4, ' ');
  EXPECT_TRUE(parse(raw_safetensors_bytes(h2, std::vector<uint8_t>(4), false)).ok());
}

TEST(SafetensorsHeader, MetadataMustBeStrings) {
  const std::string h = R"({"__metadata__": {"format": 3}})";
  expect_error(parse(raw_safetensors_bytes(h, {})).status(), StatusCode::kCorrupt, {"__metadata__", "format"});
  const std::string ok = R"({"__metadata__": {"format": "pt"}})";
  auto r = parse(raw_safetensors_bytes(ok, {}));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->empty());
}

TEST(SafetensorsHeader, EntryMustBeObject) {
  expect_error(parse(raw_safetensors_bytes(R"({"a": 3})", {})).status(), StatusCode::kCorrupt,
               {"\"a\"", "expected an object"});
}

TEST(SafetensorsHeader, DeepNestingRejected) {
  std::string h = "{\"__metadata__\": " + std::string(200, '[') + std::string(200, ']') + "}";
  expect_error(parse(raw_safetensors_bytes(h, {})).status(), StatusCode::kCorrupt, {"nesting"});
}

TEST(SafetensorsModel, OpensDirectoryAndFile) {
  TempDir dir;
  write_single_checkpoint(dir.path(), sample_tensors());
  for (const std::string& p : {dir.path(), dir.file("model.safetensors")}) {
    auto m = SafetensorsModel::open(p);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    ASSERT_EQ(m->files().size(), 1u);
    EXPECT_EQ(m->tensors().size(), 5u);
    EXPECT_TRUE(std::is_sorted(m->tensors().begin(), m->tensors().end(),
                               [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; }));
    const TensorInfo* a = m->find("a.weight");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(static_cast<const float*>(a->data)[4], 5.0f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 4, 0u);
    EXPECT_EQ(m->find("nope"), nullptr);
    EXPECT_EQ(m->total_tensor_bytes(), 24u + 8u + 24u + 4u + 0u);
  }
}

TEST(SafetensorsModel, MoveKeepsViewsValid) {
  TempDir dir;
  write_single_checkpoint(dir.path(), sample_tensors());
  auto m = SafetensorsModel::open(dir.path());
  ASSERT_TRUE(m.ok());
  const void* p = m->find("a.weight")->data;
  SafetensorsModel moved = std::move(*m);
  EXPECT_EQ(moved.find("a.weight")->data, p);
  EXPECT_EQ(static_cast<const float*>(p)[0], 1.0f);
}

TEST(SafetensorsModel, FileErrorsNameTheFile) {
  TempDir dir;
  auto r = SafetensorsModel::open(dir.path());
  expect_error(r.status(), StatusCode::kNotFound, {dir.path().c_str(), "model.safetensors"});
  auto b = safetensors_bytes(sample_tensors());
  b.resize(b.size() - 3);
  write_file(dir.file("model.safetensors"), b);
  r = SafetensorsModel::open(dir.path());
  expect_error(r.status(), StatusCode::kCorrupt, {dir.file("model.safetensors").c_str()});
}

}  // namespace
}  // namespace tandem
