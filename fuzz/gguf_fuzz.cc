// libFuzzer target: GGUF parsing, then the model-config and tensor checks a
// loaded file goes through. Any crash, sanitizer report or leak is a bug;
// errors are the expected outcome for almost every input.
#include <cstddef>
#include <cstdint>

#include "io/gguf.h"
#include "model/gguf_config.h"
#include "model/model_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = kvq::GgufFile::Parse(data, size, "fuzz.gguf");
  if (!file.ok()) return 0;
  const kvq::GgufFile& f = **file;
  // Exercise every typed getter on every key.
  for (const auto& [key, value] : f.metadata()) {
    (void)f.GetString(key);
    (void)f.GetInt(key);
    (void)f.GetFloat(key);
    (void)f.GetBool(key);
    (void)f.GetStringArray(key);
    (void)f.GetIntArray(key);
    (void)f.GetFloatArray(key);
  }
  // Touch every tensor byte so ASan sees any pointer past the input.
  uint8_t sum = 0;
  for (const kvq::TensorRef& t : f.tensors()) {
    for (size_t i = 0; i < t.nbytes; ++i) sum ^= t.data[i];
  }
  auto config = kvq::ModelConfigFromGguf(f);
  if (config.ok()) (void)kvq::CheckModelTensors(*config, f.tensors(), f.name());
  // A volatile sink keeps the reads from being optimized out.
  volatile uint8_t sink = sum;
  (void)sink;
  return 0;
}
