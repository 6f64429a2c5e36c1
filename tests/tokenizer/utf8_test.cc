// UTF-8 validation offsets and Python-compatible stripping (the chat template's `trim`).
#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace tandem::tok {
namespace {

TEST(Utf8, InvalidOffsets) {
  EXPECT_EQ(utf8_invalid_offset("hello"), 5u);
  EXPECT_EQ(utf8_invalid_offset("h\xC3\xA9llo"), 6u);  // é is fine
  EXPECT_EQ(utf8_invalid_offset("ab\xFF"
                                "cd"),
            2u);                                                    // 0xFF never valid
  EXPECT_EQ(utf8_invalid_offset("abc\xC3"), 3u);                    // truncated
  EXPECT_EQ(utf8_invalid_offset("\xC0\x80"), 0u);                   // overlong NUL
  EXPECT_EQ(utf8_invalid_offset("x\xE0\x80\x80"), 1u);              // overlong 3-byte
  EXPECT_EQ(utf8_invalid_offset("xy\xED\xA0\x80"), 2u);             // surrogate U+D800
  EXPECT_EQ(utf8_invalid_offset("\xF4\x90\x80\x80"), 0u);           // above U+10FFFF
  EXPECT_EQ(utf8_invalid_offset("\xF4\x8F\xBF\xBF"), 4u);           // U+10FFFF itself is valid
  EXPECT_EQ(utf8_invalid_offset("0123456789abcdef\x80"), 16u);      // after the 8-byte fast path
  EXPECT_EQ(utf8_invalid_offset(std::string_view("a\0b", 3)), 3u);  // NUL is valid
}

TEST(Utf8, ValidateMessageNamesOffset) {
  Status s = validate_utf8("ok\xFE", "prompt");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt"), std::string::npos);
  EXPECT_NE(s.message().find("byte 2"), std::string::npos);
}

TEST(Utf8, RoundTripAppendDecode) {
  for (char32_t cp : {0x41u, 0xE9u, 0x20ACu, 0x1F600u, 0x10FFFFu}) {
    std::string s;
    utf8_append(&s, cp);
    int len = 0;
    EXPECT_EQ(utf8_decode(s, 0, &len), cp);
    EXPECT_EQ(static_cast<size_t>(len), s.size());
  }
}

TEST(Utf8, PythonStrip) {
  // Python: " \t\n x y \u3000\x1c".strip() == "x y"
  EXPECT_EQ(python_strip(" \t\n x y \xE3\x80\x80\x1C"), "x y");
  EXPECT_EQ(python_strip("\xC2\xA0"
                         "a"
                         "\xE2\x80\xA8"),
            "a");  // NBSP, LINE SEPARATOR
  EXPECT_EQ(python_strip("\xE2\x80\x8B"
                         "a"),
            "\xE2\x80\x8B"
            "a");  // ZERO WIDTH SPACE is not whitespace
  EXPECT_EQ(python_strip("   "), "");
  EXPECT_EQ(python_strip(""), "");
}

}  // namespace
}  // namespace tandem::tok
