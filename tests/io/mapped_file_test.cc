// ReadTextFile: whole files byte for byte; a missing path or a directory is an
// error that names the path (kvq perplexity/calibrate/tune/study read -f with it).
#include "io/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kvq {
namespace {

namespace fs = std::filesystem;

TEST(ReadTextFile, ReadsEveryByteAndNamesBadPaths) {
  const fs::path dir = fs::path(KVQ_BINARY_DIR) / ("read_text_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string bytes = std::string("line one\r\nzero \0 byte\n", 22) + std::string(70000, 'x');
  const std::string path = (dir / "text.txt").string();
  std::ofstream(path, std::ios::binary) << bytes;
  auto text = ReadTextFile(path);
  ASSERT_TRUE(text.ok()) << text.status().message();
  EXPECT_EQ(*text, bytes);

  const std::string empty_path = (dir / "empty.txt").string();
  std::ofstream(empty_path, std::ios::binary).flush();
  auto empty = ReadTextFile(empty_path);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());

  auto missing = ReadTextFile((dir / "missing.txt").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing.txt: cannot open"), std::string::npos)
      << missing.status().message();

  auto directory = ReadTextFile(dir.string());
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.status().message().find("is a directory"), std::string::npos)
      << directory.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvq
