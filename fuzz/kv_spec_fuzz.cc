// libFuzzer target: user-written KV cache specs — codec names with their
// options (--kv-cache-dtype), scheme names and K/V pairs, and --kv-policy
// text. A spec that parses must build a cache layout without crashing, and
// a parsed codec's canonical name must parse back to itself. The dictionary
// fuzz/kv_spec.dict is generated from the codec registry (`kvq help
// cache-types --fuzz-dict`; a test keeps it equal).
#include <cstddef>
#include <cstdint>
#include <string>

#include "kv/codec.h"
#include "kv/codec_registry.h"
#include "kv/kv_factory.h"
#include "kv/kv_policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (int64_t head_dim : {16, 64, 80}) (void)kvq::ParseKvCodec(text, head_dim);
  if (auto spec = kvq::ParseKvCodecSpec(text); spec.ok()) {
    auto again = kvq::ParseKvCodecSpec(spec->Name());
    if (!again.ok() || again->Name() != spec->Name()) __builtin_trap();
  }
  (void)kvq::ExpandKvScheme(text);
  auto layers = kvq::ParseKvPolicy(text, 5, {"f16", "f16"});
  if (layers.ok() && layers->size() != 5) __builtin_trap();
  kvq::KvShape shape(5, 4, 2, 64);
  shape.rope_inv_freq.assign(32, 1.0f);
  kvq::KvCacheOptions options;
  options.max_tokens = 64;
  options.policy = text;
  (void)kvq::ComputeKvLayout(shape, options);
  options.policy.clear();
  options.k_type = options.v_type = text;
  (void)kvq::ComputeKvLayout(shape, options);
  return 0;
}
