#include "io/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "base/fp16.h"
#include "test_util.h"

namespace kvq {
namespace {

GgufValue Int(GgufType t, int64_t v) {
  GgufValue x;
  x.type = t;
  x.as_int = v;
  return x;
}
GgufValue Uint(GgufType t, uint64_t v) {
  GgufValue x;
  x.type = t;
  x.as_uint = v;
  return x;
}
GgufValue Float(GgufType t, double v) {
  GgufValue x;
  x.type = t;
  x.as_float = v;
  return x;
}
GgufValue Str(std::string s) {
  GgufValue x;
  x.type = GgufType::kString;
  x.as_string = std::move(s);
  return x;
}
GgufValue Array(GgufType elem, std::vector<GgufValue> elements) {
  GgufValue x;
  x.type = GgufType::kArray;
  x.element_type = elem;
  x.elements = std::move(elements);
  return x;
}

// A small file with every metadata type, a nested array and one tensor per
// dtype; shared by the round-trip and corruption tests.
std::vector<float> TestValues(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (static_cast<float>(i % 17) - 8.0f);
  return v;
}

void BuildSample(GgufWriter& w) {
  w.SetString("general.architecture", "llama");
  w.SetString("general.name", "sample \xE2\x9C\x93");
  w.SetUint32("u32", 4000000000u);
  w.SetInt32("i32", -123456);
  w.SetFloat32("f32", 1.5f);
  w.SetBool("flag", true);
  w.SetValue("u8", Uint(GgufType::kUint8, 250));
  w.SetValue("i8", Int(GgufType::kInt8, -100));
  w.SetValue("u16", Uint(GgufType::kUint16, 65000));
  w.SetValue("i16", Int(GgufType::kInt16, -32000));
  w.SetValue("u64", Uint(GgufType::kUint64, 1ull << 60));
  w.SetValue("i64", Int(GgufType::kInt64, -(1ll << 60)));
  w.SetValue("f64", Float(GgufType::kFloat64, 3.141592653589793));
  w.SetStringArray("strs", {"a", "", "hello world"});
  w.SetInt32Array("ints", {1, -2, 3});
  w.SetFloat32Array("floats", {0.5f, -0.25f});
  w.SetValue("nested",
             Array(GgufType::kArray, {Array(GgufType::kInt32, {Int(GgufType::kInt32, 7)}),
                                      Array(GgufType::kString, {Str("x"), Str("y")}),
                                      Array(GgufType::kArray, {Array(GgufType::kUint8, {})})}));
  w.SetValue("empty", Array(GgufType::kFloat64, {}));

  const std::vector<float> f32 = TestValues(6, 0.125f);
  ASSERT_TRUE(w.AddTensor("t.f32", DType::kF32, {2, 3}, f32.data(), f32.size() * 4).ok());
  std::vector<uint16_t> f16(5), bf16(7);
  for (size_t i = 0; i < f16.size(); ++i) f16[i] = F32ToF16(0.5f * i);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = F32ToBf16(-0.25f * i);
  ASSERT_TRUE(w.AddTensor("t.f16", DType::kF16, {5}, f16.data(), 10).ok());
  ASSERT_TRUE(w.AddTensor("t.bf16", DType::kBF16, {7, 1}, bf16.data(), 14).ok());
  std::vector<uint8_t> q8(2 * 34);
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(w.AddTensor("t.q8", DType::kQ8_0, {2, 32}, q8.data(), q8.size()).ok());
}

std::vector<uint8_t> SampleBytes() {
  GgufWriter w;
  BuildSample(w);
  const std::string path = test_util::TestPath("kvq_gguf_test", "sample.gguf");
  EXPECT_TRUE(w.Write(path).ok());
  std::vector<uint8_t> bytes = test_util::ReadFileBytes(path);
  std::filesystem::remove(path);
  return bytes;
}

TEST(GgufTest, RoundTripEveryType) {
  GgufWriter w;
  BuildSample(w);
  const std::string path = test_util::TestPath("kvq_gguf_test", "roundtrip.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto file_or = GgufFile::Open(path);
  ASSERT_TRUE(file_or.ok()) << file_or.status().message();
  const GgufFile& f = **file_or;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetString("general.name"), "sample \xE2\x9C\x93");
  EXPECT_EQ(*f.GetInt("u32"), 4000000000);
  EXPECT_EQ(*f.GetInt("i32"), -123456);
  EXPECT_EQ(*f.GetFloat("f32"), 1.5);
  EXPECT_TRUE(*f.GetBool("flag"));
  EXPECT_EQ(*f.GetInt("u8"), 250);
  EXPECT_EQ(*f.GetInt("i8"), -100);
  EXPECT_EQ(*f.GetInt("u16"), 65000);
  EXPECT_EQ(*f.GetInt("i16"), -32000);
  EXPECT_EQ(*f.GetInt("u64"), 1ll << 60);
  EXPECT_EQ(*f.GetInt("i64"), -(1ll << 60));
  EXPECT_DOUBLE_EQ(*f.GetFloat("f64"), 3.141592653589793);
  EXPECT_EQ(*f.GetFloat("i32"), -123456.0);  // integers convert to float
  EXPECT_EQ(*f.GetStringArray("strs"), (std::vector<std::string>{"a", "", "hello world"}));
  EXPECT_EQ(*f.GetIntArray("ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f.GetFloatArray("floats"), (std::vector<double>{0.5, -0.25}));
  EXPECT_TRUE(f.GetFloatArray("empty")->empty());
  const GgufValue* nested = f.Find("nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->elements.size(), 3u);
  EXPECT_EQ(nested->elements[0].element_type, GgufType::kInt32);
  EXPECT_EQ(nested->elements[0].elements[0].as_int, 7);
  EXPECT_EQ(nested->elements[1].elements[1].as_string, "y");
  EXPECT_EQ(nested->elements[2].elements[0].element_type, GgufType::kUint8);
  EXPECT_TRUE(nested->elements[2].elements[0].elements.empty());

  // Type mismatches and absent keys are errors naming the file and key.
  auto bad = f.GetString("u32");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path), std::string::npos);
  EXPECT_NE(bad.status().message().find("'u32'"), std::string::npos);
  EXPECT_FALSE(f.GetInt("missing").ok());
  EXPECT_FALSE(f.GetInt("f32").ok());
  EXPECT_FALSE(f.GetStringArray("ints").ok());

  ASSERT_EQ(f.tensors().size(), 4u);
  const TensorRef* t = f.FindTensor("t.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, DType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  const std::vector<float> expect = TestValues(6, 0.125f);
  EXPECT_EQ(std::memcmp(t->data, expect.data(), 24), 0);
  t = f.FindTensor("t.f16");
  EXPECT_EQ(t->dtype, DType::kF16);
  EXPECT_EQ(F16ToF32(reinterpret_cast<const uint16_t*>(t->data)[4]), 2.0f);
  t = f.FindTensor("t.bf16");
  EXPECT_EQ(t->shape, (std::vector<int64_t>{7, 1}));
  EXPECT_EQ(Bf16ToF32(reinterpret_cast<const uint16_t*>(t->data)[6]), -1.5f);
  t = f.FindTensor("t.q8");
  EXPECT_EQ(t->dtype, DType::kQ8_0);
  EXPECT_EQ(t->nbytes, 68u);
  EXPECT_EQ(t->data[67], static_cast<uint8_t>(67 * 7));
  for (const TensorRef& x : f.tensors()) {
    EXPECT_EQ((x.data - f.tensors()[0].data) % 32, 0) << x.name;
  }
  std::filesystem::remove(path);
}

// Every block type round-trips with ggml's block sizes: two rows of one
// block each (32 or 256 values), bytes kept.
TEST(GgufTest, BlockTypesRoundTrip) {
  const struct {
    DType dtype;
    int64_t block, bytes;
    uint32_t ggml;
  } kTypes[] = {{DType::kQ4_0, 32, 18, 2},    {DType::kQ4_1, 32, 20, 3},
                {DType::kQ5_0, 32, 22, 6},    {DType::kQ5_1, 32, 24, 7},
                {DType::kIQ4_NL, 32, 18, 20}, {DType::kQ2_K, 256, 84, 10},
                {DType::kQ3_K, 256, 110, 11}, {DType::kQ4_K, 256, 144, 12},
                {DType::kQ5_K, 256, 176, 13}, {DType::kQ6_K, 256, 210, 14}};
  GgufWriter w;
  for (const auto& t : kTypes) {
    std::vector<uint8_t> data(static_cast<size_t>(2 * t.bytes));
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 13 + t.ggml);
    ASSERT_TRUE(
        w.AddTensor(DTypeName(t.dtype), t.dtype, {2, t.block}, data.data(), data.size()).ok())
        << DTypeName(t.dtype);
    EXPECT_FALSE(w.AddTensor("bad", t.dtype, {2, t.block / 2}, data.data(), data.size() / 2).ok());
  }
  const std::string path = test_util::TestPath("kvq_gguf_test", "blocks.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  for (const auto& t : kTypes) {
    const TensorRef* r = (*f)->FindTensor(DTypeName(t.dtype));
    ASSERT_NE(r, nullptr) << DTypeName(t.dtype);
    EXPECT_EQ(r->dtype, t.dtype);
    EXPECT_EQ(r->nbytes, static_cast<size_t>(2 * t.bytes)) << DTypeName(t.dtype);
    EXPECT_EQ(r->data[2 * t.bytes - 1], static_cast<uint8_t>((2 * t.bytes - 1) * 13 + t.ggml));
  }
  std::filesystem::remove(path);
}

TEST(GgufTest, CustomAlignment) {
  GgufWriter w;
  w.SetUint32("general.alignment", 64);
  float x[3] = {1, 2, 3};
  ASSERT_TRUE(w.AddTensor("a", DType::kF32, {3}, x, 12).ok());
  ASSERT_TRUE(w.AddTensor("b", DType::kF32, {3}, x, 12).ok());
  const std::string path = test_util::TestPath("kvq_gguf_test", "align.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ((*f)->alignment(), 64u);
  EXPECT_EQ((*f)->data_offset() % 64, 0u);
  EXPECT_EQ((*f)->tensors()[1].data - (*f)->tensors()[0].data, 64);
  std::filesystem::remove(path);
}

TEST(GgufTest, WriterRejectsBadInput) {
  GgufWriter w;
  float x[4] = {};
  EXPECT_FALSE(w.AddTensor("a", DType::kF32, {3}, x, 16).ok());              // size mismatch
  EXPECT_FALSE(w.AddTensor("a", DType::kF32, {0}, x, 0).ok());               // zero dim
  EXPECT_FALSE(w.AddTensor("a", DType::kQ8_0, {4}, x, 0).ok());              // not a block multiple
  EXPECT_FALSE(w.AddTensor("a", DType::kF32, {1, 1, 1, 1, 4}, x, 16).ok());  // rank 5
  ASSERT_TRUE(w.AddTensor("a", DType::kF32, {4}, x, 16).ok());
  EXPECT_FALSE(w.AddTensor("a", DType::kF32, {4}, x, 16).ok());  // duplicate
  w.SetValue("mixed", Array(GgufType::kInt32, {Str("no")}));
  EXPECT_FALSE(w.Write(test_util::TestPath("kvq_gguf_test", "bad.gguf")).ok());
  std::filesystem::remove(test_util::TestPath("kvq_gguf_test", "bad.gguf"));
}

// --- Corrupt inputs -----------------------------------------------------------

Status ParseBytes(const std::vector<uint8_t>& b) {
  auto f = GgufFile::Parse(b.data(), b.size(), "x.gguf");
  return f.ok() ? Status::Ok() : f.status();
}

void ExpectError(const std::vector<uint8_t>& b, const std::string& fragment) {
  Status st = ParseBytes(b);
  ASSERT_FALSE(st.ok()) << "expected error containing: " << fragment;
  EXPECT_EQ(st.message().rfind("x.gguf: ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find(fragment), std::string::npos) << st.message();
}

TEST(GgufTest, EveryTruncationIsAnError) {
  const std::vector<uint8_t> full = SampleBytes();
  auto parsed = GgufFile::Parse(full.data(), full.size(), "x.gguf");
  ASSERT_TRUE(parsed.ok());
  // Only the last tensor's trailing padding may be cut without losing data.
  size_t data_end = 0;
  for (const TensorRef& t : (*parsed)->tensors()) {
    data_end = std::max<size_t>(data_end, t.data + t.nbytes - full.data());
  }
  ASSERT_GT(data_end, full.size() - 32);
  for (size_t n = 0; n < full.size(); ++n) {
    // Heap copy of exactly n bytes, so ASan catches any read past the end.
    std::vector<uint8_t> cut(full.begin(), full.begin() + n);
    Status st = ParseBytes(cut);
    EXPECT_EQ(st.ok(), n >= data_end) << "truncated at " << n << ": " << st.message();
  }
}

TEST(GgufTest, RandomByteFlipsNeverCrash) {
  const std::vector<uint8_t> full = SampleBytes();
  std::mt19937 rng(42);
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> b = full;
    const int flips = 1 + iter % 4;
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    (void)ParseBytes(b);  // must return, either way
  }
}

// Hand-built headers for targeted errors.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& Put(T v) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& Str(const std::string& s) {
    Put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    return Put<uint32_t>(version).Put<uint64_t>(n_tensors).Put<uint64_t>(n_kv);
  }
  Bytes& Tensor(const std::string& name, std::vector<int64_t> ne, uint32_t type, uint64_t offset) {
    Str(name).Put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (int64_t d : ne) Put<int64_t>(d);
    return Put<uint32_t>(type).Put<uint64_t>(offset);
  }
  Bytes& Pad(size_t align = 32, size_t extra = 0) {
    b.resize((b.size() + align - 1) / align * align + extra, 0);
    return *this;
  }
};

TEST(GgufTest, HeaderErrors) {
  ExpectError({'G', 'G', 'U', 'X', 3, 0, 0, 0}, "not a GGUF file");
  ExpectError({'G', 'G'}, "truncated");
  ExpectError(Bytes().Header(0, 0, 1).b, "unsupported GGUF version 1");
  ExpectError(Bytes().Header(0, 0, 0x03000000).b, "big-endian");
  ExpectError(Bytes().Header(0, 1ull << 62).b, "metadata count");
  ExpectError(Bytes().Header(1ull << 40, 0).b, "tensor count");
  EXPECT_TRUE(ParseBytes(Bytes().Header(0, 0).b).ok());
  EXPECT_TRUE(ParseBytes(Bytes().Header(0, 0, 2).b).ok());
}

TEST(GgufTest, MetadataErrors) {
  Bytes huge_str;
  huge_str.Header(0, 1).Str("k").Put<uint32_t>(8).Put<uint64_t>(1ull << 60);
  ExpectError(huge_str.b, "string length");
  Bytes huge_key;
  huge_key.Header(0, 1).Put<uint64_t>(~0ull).Put<uint64_t>(0);
  ExpectError(huge_key.b, "exceeds");
  Bytes bad_type;
  bad_type.Header(0, 1).Str("k").Put<uint32_t>(13).Put<uint8_t>(0);
  ExpectError(bad_type.b, "invalid value type 13");
  Bytes huge_array;
  huge_array.Header(0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(4).Put<uint64_t>(1ull << 62);
  ExpectError(huge_array.b, "array of 4611686018427387904 uint32");
  Bytes bad_elem;
  bad_elem.Header(0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(99).Put<uint64_t>(0);
  ExpectError(bad_elem.b, "invalid array element type 99");
  Bytes dup;
  dup.Header(0, 2).Str("k").Put<uint32_t>(0).Put<uint8_t>(1).Str("k").Put<uint32_t>(0).Put<uint8_t>(
      1);
  ExpectError(dup.b, "duplicate metadata key 'k'");
  Bytes deep;
  deep.Header(0, 1).Str("k").Put<uint32_t>(9);
  for (int i = 0; i < 40; ++i) deep.Put<uint32_t>(9).Put<uint64_t>(1);
  deep.Put<uint32_t>(0).Put<uint64_t>(0);
  ExpectError(deep.b, "nested deeper");
  for (uint32_t bad : {0u, 3u, 48u}) {
    Bytes align;
    align.Header(0, 1).Str("general.alignment").Put<uint32_t>(4).Put<uint32_t>(bad);
    ExpectError(align.b, "not a power of two");
  }
  Bytes align_type;
  align_type.Header(0, 1).Str("general.alignment").Put<uint32_t>(8).Str("32");
  ExpectError(align_type.b, "expected an integer");
}

TEST(GgufTest, TensorInfoErrors) {
  ExpectError(Bytes().Header(1, 0).Tensor("t", {4, 1, 1, 1, 1}, 0, 0).Pad(32, 64).b,
              "tensor 't' has 5 dimensions");
  ExpectError(Bytes().Header(1, 0).Tensor("t", {}, 0, 0).Pad(32, 64).b, "0 dimensions");
  ExpectError(Bytes().Header(1, 0).Tensor("t", {4, 0}, 0, 0).Pad(32, 64).b,
              "non-positive dimension 0");
  ExpectError(Bytes().Header(1, 0).Tensor("t", {4, -2}, 0, 0).Pad(32, 64).b,
              "non-positive dimension -2");
  ExpectError(Bytes().Header(1, 0).Tensor("t", {1ll << 32, 1ll << 32}, 0, 0).Pad(32, 64).b,
              "element count overflows");
  ExpectError(Bytes().Header(1, 0).Tensor("t", {1ll << 40}, 0, 0).Pad(32, 64).b, "cannot fit");
  ExpectError(Bytes().Header(1, 0).Tensor("blk.0.attn_k.weight", {32}, 16, 0).Pad(32, 64).b,
              "unsupported tensor type IQ2_XXS in tensor 'blk.0.attn_k.weight'");
  ExpectError(Bytes().Header(1, 0).Tensor("blk.0.attn_k.weight", {32}, 12, 0).Pad(32, 64).b,
              "is Q4_K but its row length 32 is not a multiple of 256");
  ExpectError(Bytes().Header(1, 0).Tensor("t", {32}, 1234, 0).Pad(32, 64).b,
              "unsupported tensor type 1234 in tensor 't'");
  ExpectError(Bytes().Header(1, 0).Tensor("t", {16}, 8, 0).Pad(32, 64).b, "multiple of 32");
  ExpectError(Bytes().Header(1, 0).Tensor("t", {4}, 0, 8).Pad(32, 64).b,
              "offset 8 is not a multiple of the alignment 32");
  ExpectError(Bytes().Header(1, 0).Tensor("t", {32}, 0, 0).Pad(32, 64).b,
              "tensor 't' extends past end of file");
  ExpectError(Bytes().Header(1, 0).Tensor("t", {4}, 0, 1ull << 63).Pad(32, 64).b,
              "extends past end of file");
  ExpectError(Bytes().Header(2, 0).Tensor("a", {16}, 0, 0).Tensor("b", {4}, 0, 32).Pad(32, 128).b,
              "tensor 'a' (offset 0, 64 bytes) overlaps tensor 'b'");
  ExpectError(Bytes().Header(2, 0).Tensor("a", {4}, 0, 0).Tensor("a", {4}, 0, 32).Pad(32, 128).b,
              "duplicate tensor name 'a'");
  // The valid counterpart of the above parses.
  EXPECT_TRUE(
      ParseBytes(Bytes().Header(2, 0).Tensor("a", {4}, 0, 0).Tensor("b", {4}, 0, 32).Pad(32, 64).b)
          .ok());
}

TEST(GgufTest, MissingFileNamesPath) {
  auto f = GgufFile::Open("/nonexistent/dir/m.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("/nonexistent/dir/m.gguf"), std::string::npos);
}

// --- Real vocabulary files from llama.cpp ----------------------------------

std::string VocabPath(const std::string& name) {
  return std::string(KVQ_DEPS_DIR) + "/llama.cpp/models/ggml-vocab-" + name + ".gguf";
}

TEST(GgufTest, ReadsRealVocabFiles) {
  struct Case {
    const char* name;
    const char* pre;
    size_t n_tokens;
  };
  for (const Case& c : {Case{"qwen2", "qwen2", 151936}, Case{"llama-bpe", "llama-bpe", 0},
                        Case{"gpt-2", "gpt-2", 50257}}) {
    const std::string path = VocabPath(c.name);
    if (!std::filesystem::exists(path)) {
      GTEST_SKIP() << path << " absent; run scripts/setup.sh";
    }
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_TRUE((*f)->tensors().empty());
    EXPECT_EQ(*(*f)->GetString("tokenizer.ggml.model"), "gpt2");
    EXPECT_EQ(*(*f)->GetString("tokenizer.ggml.pre"), c.pre);
    auto tokens = (*f)->GetStringArray("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.ok()) << tokens.status().message();
    if (c.n_tokens) {
      EXPECT_EQ(tokens->size(), c.n_tokens) << c.name;
    }
    EXPECT_GT(tokens->size(), 1000u);
    auto merges = (*f)->GetStringArray("tokenizer.ggml.merges");
    ASSERT_TRUE(merges.ok());
    EXPECT_GT(merges->size(), 1000u);
    auto types = (*f)->GetIntArray("tokenizer.ggml.token_type");
    ASSERT_TRUE(types.ok());
    EXPECT_EQ(types->size(), tokens->size());
  }
}

}  // namespace
}  // namespace kvq

namespace kvq {
namespace {

// The fuzz seeds are written by fuzz/make_corpus.py, an independent Python
// writer: kvq must read every one of them.
TEST(GgufTest, ReadsIndependentlyWrittenSeeds) {
  const std::filesystem::path dir = std::filesystem::path(KVQ_SOURCE_DIR) / "fuzz/corpus/gguf";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " absent";
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    auto f = GgufFile::Open(entry.path().string());
    EXPECT_TRUE(f.ok()) << f.status().message();
    ++n;
    if (entry.path().filename() == "every_type.gguf" && f.ok()) {
      EXPECT_EQ((*f)->alignment(), 64u);
      EXPECT_EQ(*(*f)->GetString("s"), "hello \xE2\x9C\x93");
      EXPECT_EQ(*(*f)->GetInt("u32"), 4000000000);
      EXPECT_EQ((*f)->Find("nested")->elements[1].elements[0].as_string, "q");
      EXPECT_EQ((*f)->FindTensor("d.q8")->nbytes, 68u);
      EXPECT_EQ((*f)->FindTensor("c.bf16")->shape, (std::vector<int64_t>{3, 1}));
    }
  }
  EXPECT_GE(n, 3);
}

}  // namespace
}  // namespace kvq
