#include "server/api_key.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace kvq {
namespace {

namespace fs = std::filesystem;

TEST(ApiKey, ConstantTimeEqualsIsEquality) {
  EXPECT_TRUE(ConstantTimeEquals("Bearer abc", "Bearer abc"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abc", "Bearer abd"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abc", "Bearer ab"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), "a"));
}

TEST(ApiKey, ReadsOneLineAndNeverEchoesIt) {
  const fs::path dir = fs::path(KVQ_BINARY_DIR) / ("api_key_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = (dir / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  };
  auto key = ReadApiKeyFile(write("ok", "k3y-Value\n"));
  ASSERT_TRUE(key.ok()) << key.status().message();
  EXPECT_EQ(*key, "k3y-Value");
  EXPECT_EQ(*ReadApiKeyFile(write("crlf", "abc\r\n")), "abc");
  for (const std::string& bad : {std::string(""), std::string("\n"), std::string("zqzq words\n"),
                                 std::string("zqzq1\nzqzq2\n"), std::string(5000, 'q')}) {
    auto r = ReadApiKeyFile(write("bad", bad));
    ASSERT_FALSE(r.ok()) << bad;
    if (bad.size() > 3) {
      EXPECT_EQ(r.status().message().find(bad.substr(0, 4)), std::string::npos)
          << "the key's content must not be printed: " << r.status().message();
    }
  }
  EXPECT_FALSE(ReadApiKeyFile(dir.string()).ok());
  EXPECT_FALSE(ReadApiKeyFile("/dev/zero").ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvq
