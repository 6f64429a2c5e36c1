// Status / Result<T> behaviour and the string helpers.
#include <gtest/gtest.h>

#include "core/status.h"
#include "core/strings.h"

namespace tandem {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument(strfmt("%d is not positive", v));
  return v;
}

Status chain(int v) {
  TANDEM_ASSIGN_OR_RETURN(int x, parse_positive(v));
  if (x > 10) return out_of_range("too big");
  return ok_status();
}

TEST(Status, OkAndErrors) {
  EXPECT_TRUE(ok_status().ok());
  Status s = corrupt("bad header");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kCorrupt);
  s.with_context("model.safetensors");
  EXPECT_EQ(s.message(), "model.safetensors: bad header");
  EXPECT_EQ(s.to_string(), "corrupt input: model.safetensors: bad header");
}

TEST(Status, ResultPropagation) {
  EXPECT_TRUE(chain(3).ok());
  EXPECT_EQ(chain(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(chain(-1).message(), "-1 is not positive");
  EXPECT_EQ(chain(11).code(), StatusCode::kOutOfRange);
  Result<int> r = parse_positive(5);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 5);
}

TEST(Strings, Helpers) {
  EXPECT_EQ(strfmt("%s-%03d", "a", 7), "a-007");
  EXPECT_EQ(join({"a", "b", "c"}, ", "), "a, b, c");
  EXPECT_EQ(split("a,,b", ','), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_TRUE(starts_with("model.language_model.x", "model."));
  EXPECT_TRUE(ends_with("x.safetensors", ".safetensors"));
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(3u << 20), "3.00 MiB");
}

}  // namespace
}  // namespace tandem
