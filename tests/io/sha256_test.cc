#include "io/sha256.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace kvq {
namespace {

// FIPS 180-4 example digests (one block, two blocks, a million 'a').
TEST(Sha256Test, StandardVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths around the padding boundary (55, 56, 64 bytes) agree between the
// one-shot digest and the file reader, which feeds 64 KiB pieces.
TEST(Sha256Test, FileEqualsString) {
  const std::string path =
      (std::filesystem::path(KVQ_BINARY_DIR) / ("sha256_" + std::to_string(::getpid()))).string();
  for (size_t n : {0, 55, 56, 63, 64, 65, 70000}) {
    std::string data(n, '\0');
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>(i * 7 + 3);
    {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f.write(data.data(), static_cast<std::streamsize>(data.size()));
    }
    auto digest = Sha256File(path);
    ASSERT_TRUE(digest.ok());
    EXPECT_EQ(*digest, Sha256Hex(data)) << n;
  }
  std::filesystem::remove(path);
  EXPECT_FALSE(Sha256File(path).ok());
}

}  // namespace
}  // namespace kvq
