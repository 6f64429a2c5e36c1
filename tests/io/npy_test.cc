// .npy reading/writing (src/io/npy.cc) against the byte layout numpy itself writes.
#include "io/npy.h"

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>

#include "support/checkpoint_writer.h"

namespace tandem {
namespace {

using namespace testsupport;

std::vector<uint8_t> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A .npy v1.0 file from a header dict text (padded like numpy) and raw data.
std::vector<uint8_t> npy_bytes(const std::string& dict, const std::vector<uint8_t>& data, int major = 1) {
  std::string h = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  out.push_back(static_cast<uint8_t>(h.size() & 0xff));
  out.push_back(static_cast<uint8_t>(h.size() >> 8));
  if (major == 2) out.insert(out.end(), {0, 0});
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

TEST(Npy, WritesNumpyByteLayout) {
  TempDir dir;
  const float v[6] = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(write_npy(dir.file("a.npy"), DType::kF32, {2, 3}, v).ok());
  auto b = read_all(dir.file("a.npy"));
  // numpy.save(np.arange(1, 7, dtype='<f4').reshape(2, 3)): 128-byte header, then the data.
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_EQ(b.size(), 128u + 24u);
  EXPECT_EQ(b[6], 1);
  EXPECT_EQ(b[7], 0);
  EXPECT_EQ(b[8] | (b[9] << 8), 118);
  EXPECT_EQ(std::string(b.begin() + 10, b.begin() + 10 + static_cast<long>(dict.size())), dict);
  EXPECT_EQ(b[127], '\n');
  EXPECT_EQ(b, npy_bytes(dict, std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(v),
                                                    reinterpret_cast<const uint8_t*>(v) + 24)));
}

TEST(Npy, RoundTripsEveryDtypeAndRank) {
  TempDir dir;
  const int32_t i32[3] = {-1, 0, 7};
  const int64_t i64[1] = {int64_t{1} << 40};
  const float f = 0.5f;
  ASSERT_TRUE(write_npy(dir.file("i.npy"), DType::kI32, {3}, i32).ok());
  ASSERT_TRUE(write_npy(dir.file("l.npy"), DType::kI64, {1, 1}, i64).ok());
  ASSERT_TRUE(write_npy(dir.file("s.npy"), DType::kF32, {}, &f).ok());
  ASSERT_TRUE(write_npy(dir.file("e.npy"), DType::kF32, {0, 4}, nullptr).ok());
  auto a = read_npy(dir.file("i.npy"));
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(a->dtype, DType::kI32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(a->i32()[0], -1);
  EXPECT_EQ(a->i32()[2], 7);
  auto l = read_npy(dir.file("l.npy"));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->i64()[0], int64_t{1} << 40);
  auto s = read_npy(dir.file("s.npy"));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  EXPECT_EQ(s->f32()[0], 0.5f);
  auto e = read_npy(dir.file("e.npy"));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->numel(), 0);
  EXPECT_NE(std::string(reinterpret_cast<const char*>(read_all(dir.file("i.npy")).data()) + 10, 60).find("(3,)"),
            std::string::npos);
}

TEST(Npy, ReadsKeysInAnyOrderAndVersion2) {
  std::vector<uint8_t> data(8, 0);
  auto b = npy_bytes("{'shape': (2,), 'fortran_order': False, 'descr': '<i4'}", data, 2);
  auto r = parse_npy(b.data(), b.size(), "v2.npy");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->dtype, DType::kI32);
  EXPECT_EQ(r->shape, (std::vector<int64_t>{2}));
}

TEST(Npy, RejectsBadFiles) {
  auto check = [](const std::vector<uint8_t>& b, StatusCode code, const char* frag) {
    auto r = parse_npy(b.data(), b.size(), "x.npy");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status().to_string();
    EXPECT_NE(r.status().message().find("x.npy"), std::string::npos);
    EXPECT_NE(r.status().message().find(frag), std::string::npos) << r.status().message();
  };
  std::vector<uint8_t> d8(8, 0);
  check({'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0}, StatusCode::kCorrupt, "bad magic");
  check(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", d8), StatusCode::kUnsupported, "Fortran");
  check(npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", d8), StatusCode::kUnsupported, ">f4");
  check(npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", d8), StatusCode::kUnsupported, "<f8");
  check(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", d8), StatusCode::kCorrupt, "needs 12");
  check(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", d8), StatusCode::kCorrupt, "shape");
  check(npy_bytes("{'descr': '<f4', 'shape': (2,), }", d8), StatusCode::kCorrupt, "lacks");
  // Found by fuzz_npy: partial products past int64 before a zero dimension (the total is 0 elements).
  check(npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (3, 3074457345618258603, 2, 0), }", {}),
        StatusCode::kCorrupt, "overflows");
  check(npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (4611686018427387904, 2, 0), }", {}),
        StatusCode::kCorrupt, "overflows");
  auto trunc = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", d8);
  trunc.resize(40);
  check(trunc, StatusCode::kCorrupt, "past the end");
}

TEST(Npy, WriteRejectsUnsupportedDtype) {
  TempDir dir;
  uint16_t h[1] = {0};
  auto s = write_npy(dir.file("b.npy"), DType::kBF16, {1}, h);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
}

}  // namespace
}  // namespace tandem
