// libFuzzer target: Hugging Face config.json parsing.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/hf_config.h"
#include "model/tensor_names.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = kvq::ParseHfConfig(std::string_view(reinterpret_cast<const char*>(data), size),
                                   "fuzz/config.json");
  if (config.ok()) {
    // A config that passes validation must give a writable, re-parsable model.
    (void)kvq::ExpectedTensors(*config).size();
    auto again = kvq::ParseHfConfig(kvq::HfConfigJson(*config), "again");
    if (!again.ok()) __builtin_trap();
  }
  return 0;
}
