// The calibration file's fp8 per-tensor scales (version 2), version 1 files
// still read, and the vLLM KV-scale file: written, read back as the same
// scales (the codec then stores identical bytes), and hostile files refused
// with a message naming the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/fp16.h"
#include "io/safetensors.h"
#include "kv/codec_formats.h"
#include "kv/kv_calibration.h"
#include "kv_test_util.h"
#include "test_util.h"

namespace kvq {
namespace {

// A minimal valid calibration: 2 layers, 1 KV head, head_dim 32, 2-bit books.
KvCalibration Minimal() {
  KvCalibration c;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 32;
  c.k_offset.assign(64, 0.0f);
  c.k_scale.assign(64, 1.0f);
  c.codebooks[2].k = {-1, -0.3f, 0.3f, 1, -1, -0.3f, 0.3f, 1};
  c.codebooks[2].v = c.codebooks[2].k;
  c.fp8_k_scale = {0.5f, 0.03125f};
  c.fp8_v_scale = {0.0625f, 3.0f};
  return c;
}

// Every test's scratch files go when it ends.
class KvCalibrationFp8 : public ::testing::Test {
 protected:
  void TearDown() override { test_util::RemoveTestFiles("kvq_fp8cal"); }
};

TEST_F(KvCalibrationFp8, Version2RoundTripAndVersion1StillReads) {
  const KvCalibration c = Minimal();
  const std::string path = test_util::TestPath("kvq_fp8cal", "v2.safetensors");
  ASSERT_TRUE(SaveKvCalibration(c, path).ok());
  auto loaded = LoadKvCalibration(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  EXPECT_EQ(loaded->fp8_k_scale, c.fp8_k_scale);
  EXPECT_EQ(loaded->fp8_v_scale, c.fp8_v_scale);
  EXPECT_FALSE(loaded->scales_only);

  // A file as kvq calibrate wrote it before version 2.
  SafetensorsWriter old;
  old.SetMetadata("format", "kvq-kvquant-calibration/1");
  for (const char* key :
       {"num_layers", "num_heads", "num_kv_heads", "head_dim", "tokens", "outlier_percent"}) {
    const std::string k = key;
    const int64_t v = k == "num_layers" || k == "num_heads" ? 2 : k == "head_dim" ? 32 : 1;
    old.SetMetadata(k, std::to_string(v));
  }
  old.SetMetadata("bits", "2");
  ASSERT_TRUE(
      old.AddTensor("k.channel_offset", DType::kF32, {2, 1, 32}, c.k_offset.data(), 256).ok());
  ASSERT_TRUE(
      old.AddTensor("k.channel_scale", DType::kF32, {2, 1, 32}, c.k_scale.data(), 256).ok());
  ASSERT_TRUE(
      old.AddTensor("nuq2.k.levels", DType::kF32, {2, 4}, c.codebooks.at(2).k.data(), 32).ok());
  ASSERT_TRUE(
      old.AddTensor("nuq2.v.levels", DType::kF32, {2, 4}, c.codebooks.at(2).v.data(), 32).ok());
  const std::string v1 = test_util::TestPath("kvq_fp8cal", "v1.safetensors");
  ASSERT_TRUE(old.Write(v1).ok());
  auto read_v1 = LoadKvCalibration(v1);
  ASSERT_TRUE(read_v1.ok()) << read_v1.status().message();
  EXPECT_TRUE(read_v1->fp8_k_scale.empty());
  EXPECT_EQ(read_v1->codebooks.at(2).k, c.codebooks.at(2).k);
  auto tcal = MustParse("fp8_e4m3-tcal", 32);
  ASSERT_NE(tcal, nullptr);
  const Status no_scales = tcal->SetCalibration(*read_v1, 0, 0, false);
  ASSERT_FALSE(no_scales.ok());
  EXPECT_NE(no_scales.message().find("version 1"), std::string::npos) << no_scales.message();
  // And a vLLM export of a version 1 file is refused, not written empty.
  EXPECT_FALSE(
      SaveVllmKvScales(*read_v1, test_util::TestPath("kvq_fp8cal", "empty.safetensors")).ok());
}

TEST_F(KvCalibrationFp8, VllmExportReadsBackAsTheSameScalesAndBytes) {
  const KvCalibration c = Minimal();
  const std::string path = test_util::TestPath("kvq_fp8cal", "vllm.safetensors");
  ASSERT_TRUE(SaveVllmKvScales(c, path).ok());
  // The file holds exactly vLLM's checkpoint names, F32 [1] each.
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  ASSERT_EQ((*file)->tensors().size(), 4u);
  const TensorRef* k1 = (*file)->Find("model.layers.1.self_attn.k_scale");
  ASSERT_NE(k1, nullptr);
  EXPECT_EQ(k1->dtype, DType::kF32);
  EXPECT_EQ(k1->shape, std::vector<int64_t>{1});
  ASSERT_NE((*file)->Find("model.layers.0.self_attn.v_scale"), nullptr);

  auto vllm = LoadKvCalibration(path);
  ASSERT_TRUE(vllm.ok()) << vllm.status().message();
  EXPECT_TRUE(vllm->scales_only);
  EXPECT_EQ(vllm->num_layers, 2);
  EXPECT_EQ(vllm->fp8_k_scale, c.fp8_k_scale);
  EXPECT_EQ(vllm->fp8_v_scale, c.fp8_v_scale);
  KvShape shape{2, 2, 1, 32};
  EXPECT_TRUE(vllm->CheckShape(shape).ok());
  shape.num_layers = 3;
  EXPECT_FALSE(vllm->CheckShape(shape).ok());

  // The same rows stored through either file: identical bytes.
  std::mt19937 rng(9);
  const auto x = Normal(32 * 5, rng, 2.0f);
  ASSERT_TRUE(SaveKvCalibration(c, test_util::TestPath("kvq_fp8cal", "own.safetensors")).ok());
  auto own = LoadKvCalibration(test_util::TestPath("kvq_fp8cal", "own.safetensors"));
  ASSERT_TRUE(own.ok());
  for (bool is_v : {false, true}) {
    for (int64_t layer : {0, 1}) {
      auto a = MustParse("fp8_e4m3-tcal", 32);
      auto b = MustParse("fp8_e4m3-tcal", 32);
      ASSERT_TRUE(a->SetCalibration(*own, layer, 0, is_v).ok());
      ASSERT_TRUE(b->SetCalibration(*vllm, layer, 0, is_v).ok());
      std::vector<uint8_t> ra(5 * a->RowBytes()), rb(ra.size());
      a->Encode(x.data(), 5, ra.data());
      b->Encode(x.data(), 5, rb.data());
      EXPECT_EQ(ra, rb) << layer << is_v;
    }
  }
}

TEST_F(KvCalibrationFp8, HostileScaleFilesAreClearErrors) {
  auto write = [](const std::string& name, float k0, bool with_v1 = true) {
    SafetensorsWriter w;
    const float one = 1.0f;
    EXPECT_TRUE(w.AddTensor("model.layers.0.self_attn.k_scale", DType::kF32, {1}, &k0, 4).ok());
    EXPECT_TRUE(w.AddTensor("model.layers.0.self_attn.v_scale", DType::kF32, {1}, &one, 4).ok());
    EXPECT_TRUE(w.AddTensor("model.layers.1.self_attn.k_scale", DType::kF32, {}, &one, 4).ok());
    if (with_v1) {
      EXPECT_TRUE(w.AddTensor("model.layers.1.self_attn.v_scale", DType::kF32, {}, &one, 4).ok());
    }
    const std::string path = test_util::TestPath("kvq_fp8cal", name);
    EXPECT_TRUE(w.Write(path).ok());
    return path;
  };
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    auto loaded = LoadKvCalibration(write("bad.safetensors", bad));
    ASSERT_FALSE(loaded.ok()) << bad;
    EXPECT_NE(loaded.status().message().find("k_scale of layer 0"), std::string::npos)
        << loaded.status().message();
  }
  auto missing = LoadKvCalibration(write("missing.safetensors", 1.0f, false));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("model.layers.1.self_attn.v_scale"), std::string::npos)
      << missing.status().message();
  auto fine = LoadKvCalibration(write("fine.safetensors", 0.25f));  // [] and [1] shapes both read
  ASSERT_TRUE(fine.ok()) << fine.status().message();
  EXPECT_EQ(fine->fp8_k_scale, (std::vector<float>{0.25f, 1.0f}));
  // A scale that is not one element, or not a float type.
  SafetensorsWriter wide;
  const float two[2] = {1, 1};
  ASSERT_TRUE(wide.AddTensor("model.layers.0.self_attn.k_scale", DType::kF32, {2}, two, 8).ok());
  ASSERT_TRUE(wide.AddTensor("model.layers.0.self_attn.v_scale", DType::kF32, {1}, two, 4).ok());
  ASSERT_TRUE(wide.Write(test_util::TestPath("kvq_fp8cal", "wide.safetensors")).ok());
  auto wide_loaded = LoadKvCalibration(test_util::TestPath("kvq_fp8cal", "wide.safetensors"));
  ASSERT_FALSE(wide_loaded.ok());
  EXPECT_NE(wide_loaded.status().message().find("one element"), std::string::npos);
  // F16 and BF16 checkpoint scales are read too.
  SafetensorsWriter half;
  const uint16_t h = F32ToF16(0.5f), b = F32ToBf16(2.0f);
  ASSERT_TRUE(half.AddTensor("model.layers.0.self_attn.k_scale", DType::kF16, {1}, &h, 2).ok());
  ASSERT_TRUE(half.AddTensor("model.layers.0.self_attn.v_scale", DType::kBF16, {1}, &b, 2).ok());
  ASSERT_TRUE(half.Write(test_util::TestPath("kvq_fp8cal", "half.safetensors")).ok());
  auto half_loaded = LoadKvCalibration(test_util::TestPath("kvq_fp8cal", "half.safetensors"));
  ASSERT_TRUE(half_loaded.ok()) << half_loaded.status().message();
  EXPECT_EQ(half_loaded->fp8_k_scale[0], 0.5f);
  EXPECT_EQ(half_loaded->fp8_v_scale[0], 2.0f);
  // Non-finite measured amax cannot be saved as a kvq file either.
  KvCalibration c = Minimal();
  c.fp8_v_scale[1] = Fp8E4M3TensorScale(std::numeric_limits<float>::infinity());
  EXPECT_FALSE(SaveKvCalibration(c, test_util::TestPath("kvq_fp8cal", "inf.safetensors")).ok());
  EXPECT_EQ(Fp8E4M3TensorScale(0.0f), std::numeric_limits<float>::epsilon());
  EXPECT_EQ(Fp8E4M3TensorScale(448.0f), 1.0f);
}

}  // namespace
}  // namespace kvq
