// MappedFile: each way of failing to open gives a clear error naming the path.
#include "io/mapped_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support/checkpoint_writer.h"

namespace tandem {
namespace {

using namespace testsupport;

TEST(MappedFile, MapsContents) {
  TempDir dir;
  write_file(dir.file("x"), std::string("hello"));
  auto m = MappedFile::open(dir.file("x"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->size(), 5u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*m)->data()), 5), "hello");
  EXPECT_EQ((*m)->path(), dir.file("x"));
}

TEST(MappedFile, Errors) {
  TempDir dir;
  auto missing = MappedFile::open(dir.file("nope"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir.file("nope")), std::string::npos);

  auto is_dir = MappedFile::open(dir.path());
  EXPECT_EQ(is_dir.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(is_dir.status().message().find("directory"), std::string::npos);

  write_file(dir.file("empty"), std::string());
  auto empty = MappedFile::open(dir.file("empty"));
  EXPECT_EQ(empty.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(empty.status().message().find("empty file"), std::string::npos);
}

TEST(MappedFile, PermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root ignores file permissions";
  TempDir dir;
  write_file(dir.file("secret"), std::string("x"));
  ASSERT_EQ(::chmod(dir.file("secret").c_str(), 0), 0);
  auto r = MappedFile::open(dir.file("secret"));
  EXPECT_EQ(r.status().code(), StatusCode::kIoError);
  EXPECT_NE(r.status().message().find("permission denied"), std::string::npos);
}

TEST(ReadTextFile, ReadsAndFails) {
  TempDir dir;
  write_file(dir.file("c.json"), std::string("{}"));
  auto t = read_text_file(dir.file("c.json"));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, "{}");
  EXPECT_EQ(read_text_file(dir.file("none.json")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(read_text_file(dir.path()).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
