#include "server/api_key.h"

#include <algorithm>

#include "io/mapped_file.h"

namespace kvq {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer string is looked at whatever the others hold;
  // volatile keeps the compiler from turning the loop into an early exit.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

StatusOr<std::string> ReadApiKeyFile(const std::string& path) {
  KVQ_ASSIGN_OR_RETURN(std::string key, ReadTextFile(path, 4096));
  if (!key.empty() && key.back() == '\n') key.pop_back();
  if (!key.empty() && key.back() == '\r') key.pop_back();
  if (key.empty()) return Status::Error(path + ": the API key file is empty");
  for (unsigned char c : key) {
    if (c <= 0x20 || c >= 0x7f) {
      return Status::Error(path +
                           ": the API key file must hold one line of visible ASCII characters "
                           "(no spaces)");
    }
  }
  return key;
}

}  // namespace kvq
