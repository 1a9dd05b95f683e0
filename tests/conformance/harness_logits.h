// Logits from llama.cpp (through kvq-llamacpp-harness's `logits` command) and
// from kvq (f32 dense cache) for the same tokens, shared by the conformance
// tests that compare them position by position.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/loaded_model.h"
#include "kv/dense_cache.h"
#include "model/transformer.h"

namespace kvq {

struct Logits {
  int64_t positions = 0, vocab = 0;
  std::vector<float> values;  // [positions, vocab]
};

// Runs `command` (a harness `logits` call that writes `out_path`, stderr to
// out_path.log) and reads its KVQLOGIT file; false with a gtest failure when
// the harness fails or writes something else.
inline bool RunHarnessLogits(const std::string& command, const std::string& out_path, Logits* out) {
  if (std::system((command + " 2>'" + out_path + ".log'").c_str()) != 0) {
    ADD_FAILURE() << "harness failed: " << command << " (see " << out_path << ".log)";
    return false;
  }
  std::ifstream in(out_path, std::ios::binary);
  char magic[8];
  uint32_t header[2];
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  if (!in || std::memcmp(magic, "KVQLOGIT", 8) != 0) {
    ADD_FAILURE() << "bad harness output " << out_path;
    return false;
  }
  out->positions = header[0];
  out->vocab = header[1];
  out->values.resize(static_cast<size_t>(out->positions * out->vocab));
  in.read(reinterpret_cast<char*>(out->values.data()), out->values.size() * sizeof(float));
  std::filesystem::remove(out_path);
  return static_cast<bool>(in);
}

// kvq's logits with an f32 dense cache: every token in one Forward (prefill)
// or one Forward per token (decode, attention over the cache).
inline Logits RunKvqLogits(LoadedModel& model, const std::vector<int32_t>& tokens, bool decode) {
  Transformer& t = *model.transformer;
  auto cache = MakeDenseKvCache(t.kv_shape(), DenseKvType::kF32, 4096);
  EXPECT_TRUE(cache->AddSequence(0).ok());
  Logits out;
  out.vocab = t.config().vocab_size;
  out.positions = static_cast<int64_t>(tokens.size());
  std::vector<float> step;
  if (decode) {
    for (int32_t token : tokens) {
      Status s = t.Forward({{0, {token}, false}}, *cache, &step);
      EXPECT_TRUE(s.ok()) << s.message();
      out.values.insert(out.values.end(), step.begin(), step.end());
    }
  } else {
    Status s = t.Forward({{0, tokens, true}}, *cache, &out.values);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  return out;
}

}  // namespace kvq
