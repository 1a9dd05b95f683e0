// libFuzzer target: safetensors header parsing and bounds checks.
#include <cstddef>
#include <cstdint>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = kvq::SafetensorsFile::Parse(data, size, "fuzz.safetensors");
  if (!file.ok()) return 0;
  uint8_t sum = 0;
  for (const kvq::TensorRef& t : (*file)->tensors()) {
    for (size_t i = 0; i < t.nbytes; ++i) sum ^= t.data[i];
    (void)(*file)->Find(t.name);
  }
  // A volatile sink keeps the reads from being optimized out.
  volatile uint8_t sink = sum;
  (void)sink;
  return 0;
}
