// Helpers several test files share. Each test binary's files may also be
// compiled as one unit (CMake's unity build), so file-local copies of these
// would collide.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kvq::test_util {

// A per-process path in the build folder for a test's scratch file.
inline std::string TestPath(const std::string& test, const std::string& name) {
  return (std::filesystem::path(KVQ_BINARY_DIR) /
          (test + "_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Removes every scratch file TestPath made for `test` in this process.
inline void RemoveTestFiles(const std::string& test) {
  const std::string prefix = std::filesystem::path(TestPath(test, "")).filename().string();
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(KVQ_BINARY_DIR, ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
}

// Deterministic ASCII text of exactly `bytes` bytes; with a byte-level test
// vocabulary one byte is one token.
inline std::string WordText(size_t bytes) {
  static const char* kWords[] = {"the ", "cache ", "stores ", "keys ",      "and ",   "values ",
                                 "per ", "token ", "while ",  "attention ", "reads ", "them, "};
  std::string s;
  for (size_t i = 0; s.size() < bytes; ++i) s += kWords[(i * 7 + i / 3) % 12];
  s.resize(bytes);
  return s;
}

inline std::vector<uint8_t> ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace kvq::test_util
