// Tensor views and Buffers.
#include <gtest/gtest.h>

#include "tensor/buffer.h"

namespace tandem {
namespace {

TEST(Tensor, ViewsAndSlices) {
  auto buf = Buffer::host(4 * 3 * 4);
  ASSERT_TRUE(buf.ok());
  Tensor t = buf->view(DType::kF32, {4, 3});
  EXPECT_EQ(t.numel(), 12);
  EXPECT_EQ(t.stride[0], 3);
  EXPECT_TRUE(t.is_contiguous());
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape[0], 2);
  EXPECT_EQ(s.ptr<float>(), t.ptr<float>() + 3);
  Tensor r = t.reshape({2, 2, 3});
  EXPECT_EQ(r.dim(-1), 3);
  EXPECT_EQ(r.rows(), 4);
  EXPECT_EQ(t.describe(), "[4, 3] f32");
}

TEST(Buffer, MoveReleasesOnce) {
  auto a = Buffer::host(128);
  ASSERT_TRUE(a.ok());
  Buffer b = std::move(*a);
  EXPECT_EQ(b.size(), 128u);
  Buffer c;
  c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_NE(c.data(), nullptr);
}

}  // namespace
}  // namespace tandem
