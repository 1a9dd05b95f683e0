#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "test_util.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvq_st_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
}

// Raw file from a header string and a number of zero data bytes.
std::string Raw(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(out.data(), &len, 8);
  return out + header + std::string(data_bytes, '\0');
}

Status ParseRaw(const std::string& bytes) {
  std::vector<uint8_t> b(bytes.begin(), bytes.end());
  auto f = SafetensorsFile::Parse(b.data(), b.size(), "m.safetensors");
  return f.ok() ? Status::Ok() : f.status();
}

void ExpectError(const std::string& bytes, const std::string& fragment) {
  Status st = ParseRaw(bytes);
  ASSERT_FALSE(st.ok()) << "expected: " << fragment;
  EXPECT_EQ(st.message().rfind("m.safetensors: ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find(fragment), std::string::npos) << st.message();
}

TEST_F(SafetensorsTest, RoundTrip) {
  SafetensorsWriter w;
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const uint16_t b[3] = {0x3C00, 0x4000, 0xC000};
  const uint16_t c[2] = {0x3F80, 0xBF80};
  ASSERT_TRUE(w.AddTensor("a", DType::kF32, {2, 3}, a, sizeof(a)).ok());
  ASSERT_TRUE(w.AddTensor("b", DType::kF16, {3}, b, sizeof(b)).ok());
  ASSERT_TRUE(w.AddTensor("c.weight", DType::kBF16, {1, 2}, c, sizeof(c)).ok());
  ASSERT_TRUE(w.AddTensor("scalar", DType::kF32, {}, a, 4).ok());
  w.SetMetadata("format", "pt");
  EXPECT_FALSE(w.AddTensor("a", DType::kF32, {1}, a, 4).ok());
  const std::vector<uint8_t> q8(34);
  EXPECT_FALSE(w.AddTensor("q", DType::kQ8_0, {32}, q8.data(), q8.size()).ok());
  EXPECT_FALSE(w.AddTensor("x", DType::kF32, {2}, a, 4).ok());
  ASSERT_TRUE(w.Write(Path("model.safetensors")).ok());

  auto f = SafetensorsFile::Open(Path("model.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ((*f)->tensors().size(), 4u);
  const TensorRef* ta = (*f)->Find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(ta->data, a, sizeof(a)), 0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta->data) % 64, 0u);  // writer aligns the data
  const TensorRef* tb = (*f)->Find("b");
  EXPECT_EQ(tb->dtype, DType::kF16);
  EXPECT_EQ(std::memcmp(tb->data, b, sizeof(b)), 0);
  const TensorRef* tc = (*f)->Find("c.weight");
  EXPECT_EQ(tc->dtype, DType::kBF16);
  EXPECT_EQ(tc->shape, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ((*f)->Find("scalar")->nbytes, 4u);
  EXPECT_EQ((*f)->Find("__metadata__"), nullptr);

  // Folder without an index opens model.safetensors.
  auto set = OpenSafetensorsFolder(dir_.string());
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->tensors.size(), 4u);
}

TEST_F(SafetensorsTest, ShardedIndex) {
  const float x[2] = {1, 2};
  SafetensorsWriter w1, w2;
  ASSERT_TRUE(w1.AddTensor("t1", DType::kF32, {2}, x, 8).ok());
  ASSERT_TRUE(w1.AddTensor("t2", DType::kF32, {1}, x, 4).ok());
  ASSERT_TRUE(w2.AddTensor("t3", DType::kF32, {2}, x, 8).ok());
  ASSERT_TRUE(w1.Write(Path("model-00001-of-00002.safetensors")).ok());
  ASSERT_TRUE(w2.Write(Path("model-00002-of-00002.safetensors")).ok());
  const std::string index = R"({"metadata": {"total_size": 20}, "weight_map": {
      "t1": "model-00001-of-00002.safetensors", "t2": "model-00001-of-00002.safetensors",
      "t3": "model-00002-of-00002.safetensors"}})";
  WriteBytes(Path("model.safetensors.index.json"), index);
  auto set = OpenSafetensorsFolder(dir_.string());
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->files.size(), 2u);
  ASSERT_EQ(set->tensors.size(), 3u);
  EXPECT_EQ(set->tensors[2].name, "t3");
  EXPECT_EQ(std::memcmp(set->tensors[2].data, x, 8), 0);

  // A tensor mapped to the wrong shard.
  WriteBytes(Path("model.safetensors.index.json"),
             R"({"weight_map": {"t3": "model-00001-of-00002.safetensors"}})");
  set = OpenSafetensorsFolder(dir_.string());
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("'t3' is mapped to model-00001-of-00002.safetensors"),
            std::string::npos)
      << set.status().message();
  // Missing shard file names the file.
  WriteBytes(Path("model.safetensors.index.json"), R"({"weight_map": {"t9": "nope.safetensors"}})");
  set = OpenSafetensorsFolder(dir_.string());
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("nope.safetensors"), std::string::npos);
  // Path escapes and malformed index JSON.
  WriteBytes(Path("model.safetensors.index.json"), R"({"weight_map": {"t": "../x"}})");
  EXPECT_FALSE(OpenSafetensorsFolder(dir_.string()).ok());
  WriteBytes(Path("model.safetensors.index.json"), R"({"weight_map": )");
  set = OpenSafetensorsFolder(dir_.string());
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("malformed JSON"), std::string::npos);
  WriteBytes(Path("model.safetensors.index.json"), R"({"weight_map": {"t1": 3}})");
  EXPECT_FALSE(OpenSafetensorsFolder(dir_.string()).ok());
  // Same tensor in two shards.
  SafetensorsWriter w3;
  ASSERT_TRUE(w3.AddTensor("t1", DType::kF32, {2}, x, 8).ok());
  ASSERT_TRUE(w3.Write(Path("model-00002-of-00002.safetensors")).ok());
  WriteBytes(Path("model.safetensors.index.json"),
             R"({"weight_map": {"t1": "model-00001-of-00002.safetensors",
                                "t2": "model-00002-of-00002.safetensors"}})");
  set = OpenSafetensorsFolder(dir_.string());
  ASSERT_FALSE(set.ok());
}

TEST_F(SafetensorsTest, MissingFolderFile) {
  auto set = OpenSafetensorsFolder(dir_.string());
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.status().message().find("model.safetensors"), std::string::npos);
}

TEST_F(SafetensorsTest, CorruptHeaders) {
  ExpectError("abc", "truncated");
  std::string huge(8, '\xff');
  ExpectError(huge, "header length");
  ExpectError(Raw("{\"a\": ", 0), "malformed JSON header");
  ExpectError(Raw("[1, 2]", 0), "not an object");
  ExpectError(Raw("{\"a\": 3}", 0), "tensor 'a': header entry is not an object");
  ExpectError(Raw(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", 4), "'dtype'");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", 4), "'shape'");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "shape": [1]}})", 4), "data_offsets");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, -4]}})", 4),
              "data_offsets");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4),
              "data_offsets");
  ExpectError(Raw(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8),
              "tensor 'a' has unsupported dtype I64");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
              "non-negative");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
              "non-negative");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296],
                    "data_offsets": [0, 4]}})",
                  4),
              "overflows");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4),
              "out of order");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4),
              "tensor 'a' extends past end of file");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4),
              "4 data bytes, but F32 [2] needs 8");
  ExpectError(
      Raw(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551615, 0]}})", 4),
      "out of order");
  ExpectError(Raw(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F16", "shape": [2], "data_offsets": [6, 10]}})",
                  12),
              "overlaps");
  ExpectError(Raw("{\"a\": \"\xff\xfe\"}", 0), "malformed JSON");  // invalid UTF-8
  std::string deep(100000, '[');
  ExpectError(Raw(deep, 0), "malformed");
  // __metadata__ is ignored whatever it holds; empty files are fine.
  EXPECT_TRUE(ParseRaw(Raw(R"({"__metadata__": {"x": [1, {"y": 2}]}})", 0)).ok());
  EXPECT_TRUE(ParseRaw(Raw("{}", 0)).ok());
}

TEST_F(SafetensorsTest, TruncationsAndFlipsNeverCrash) {
  SafetensorsWriter w;
  const float a[6] = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(
      w.AddTensor("model.layers.0.self_attn.q_proj.weight", DType::kF32, {2, 3}, a, sizeof(a))
          .ok());
  ASSERT_TRUE(w.AddTensor("b", DType::kBF16, {2}, a, 4).ok());
  ASSERT_TRUE(w.Write(Path("x.safetensors")).ok());
  const std::vector<uint8_t> full = test_util::ReadFileBytes(Path("x.safetensors"));
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + n);
    auto f = SafetensorsFile::Parse(cut.data(), cut.size(), "x");
    EXPECT_FALSE(f.ok()) << n;
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) {
    std::vector<uint8_t> b = full;
    b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    (void)SafetensorsFile::Parse(b.data(), b.size(), "x");
  }
}

}  // namespace
}  // namespace kvq

namespace kvq {
namespace {

// Seeds written by fuzz/make_corpus.py (independent Python writer).
TEST(SafetensorsSeedsTest, ReadsIndependentlyWrittenSeeds) {
  const std::filesystem::path dir =
      std::filesystem::path(KVQ_SOURCE_DIR) / "fuzz/corpus/safetensors";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " absent";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    auto f = SafetensorsFile::Open(entry.path().string());
    EXPECT_TRUE(f.ok()) << f.status().message();
    ++n;
  }
  EXPECT_GE(n, 2);
}

}  // namespace
}  // namespace kvq
