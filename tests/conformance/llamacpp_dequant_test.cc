// Bit-exactness of kvq's reference weight decode (ops::DequantizeRowRef)
// with ggml's own dequantization (its type traits' to_float, through the
// harness's `dequant` command), on the real model files in .deps/models:
// for every weight type a file uses, a few rows (first, middle, last) of up
// to two of its tensors. And every block type kvq reads, including those no
// shipped model uses, on blocks made by ggml's own quantizer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "io/gguf.h"
#include "model/transformer.h"
#include "ops/matvec.h"
#include "ops/weights.h"

namespace kvq {
namespace {

namespace fs = std::filesystem;

struct Request {
  const TensorRef* tensor;
  int64_t first_row, rows;
};

std::vector<fs::path> RealModels() {
  std::vector<fs::path> files;
  const fs::path dir = fs::path(KVQ_DEPS_DIR) / "models";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Up to two tensors per dtype (the first and the last in file order, so a
// file's token embedding or output matrix is usually among them), each
// with rows 0, the middle row and the last row.
std::vector<Request> ChooseRows(const GgufFile& file) {
  std::map<DType, std::vector<const TensorRef*>> by_type;
  for (const TensorRef& t : file.tensors()) by_type[t.dtype].push_back(&t);
  std::vector<Request> out;
  for (const auto& [dtype, list] : by_type) {
    std::vector<const TensorRef*> chosen = {list.front()};
    if (list.size() > 1) chosen.push_back(list.back());
    for (const TensorRef* t : chosen) {
      const int64_t rows = t->NumElements() / t->shape.back();
      for (int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
        out.push_back({t, r, 1});
        if (rows == 1) break;
      }
    }
  }
  return out;
}

void CompareFile(const fs::path& path) {
  auto opened = GgufFile::Open(path.string());
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  const GgufFile& file = **opened;
  const std::vector<Request> requests = ChooseRows(file);
  const std::string out_path = std::string(KVQ_BINARY_DIR) + "/dequant_" + path.stem().string();
  std::string cmd =
      std::string(KVQ_LLAMACPP_HARNESS) + " dequant '" + path.string() + "' '" + out_path + ".bin'";
  for (const Request& r : requests) {
    cmd += " " + r.tensor->name + " " + std::to_string(r.first_row) + " " + std::to_string(r.rows);
  }
  ASSERT_EQ(std::system((cmd + " 2>" + out_path + ".log").c_str()), 0) << cmd;
  std::ifstream in(out_path + ".bin", std::ios::binary);
  char magic[8];
  uint32_t count = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&count), 4);
  ASSERT_TRUE(in && std::memcmp(magic, "KVQDEQNT", 8) == 0 && count == requests.size());
  std::map<std::string, int> checked;  // dtype -> rows compared
  for (const Request& r : requests) {
    uint32_t ggml_type = 0;
    int64_t cols = 0;
    in.read(reinterpret_cast<char*>(&ggml_type), 4);
    in.read(reinterpret_cast<char*>(&cols), 8);
    ASSERT_EQ(cols, r.tensor->shape.back()) << r.tensor->name;
    std::vector<float> ggml(static_cast<size_t>(cols * r.rows));
    in.read(reinterpret_cast<char*>(ggml.data()), static_cast<std::streamsize>(ggml.size() * 4));
    ASSERT_TRUE(in) << "short harness output for " << r.tensor->name;

    const ops::WeightView view{ToWeightType(r.tensor->dtype), r.tensor->NumElements() / cols, cols,
                               r.tensor->data};
    ASSERT_TRUE(ops::ValidateWeightView(view).ok()) << r.tensor->name;
    std::vector<float> kvq(static_cast<size_t>(cols));
    for (int64_t i = 0; i < r.rows; ++i) {
      ops::DequantizeRowRef(view, r.first_row + i, kvq.data());
      // Bit for bit: memcmp also tells -0 from +0.
      const float* want = ggml.data() + i * cols;
      if (std::memcmp(kvq.data(), want, static_cast<size_t>(cols) * 4) != 0) {
        int64_t c = 0;
        while (std::memcmp(&kvq[c], &want[c], 4) == 0) ++c;
        FAIL() << path.filename() << " " << r.tensor->name << " (" << DTypeName(r.tensor->dtype)
               << ") row " << r.first_row + i << " col " << c << ": kvq " << kvq[c] << " ggml "
               << want[c];
      }
    }
    checked[DTypeName(r.tensor->dtype)] += static_cast<int>(r.rows);
  }
  fs::remove(out_path + ".bin");
  std::string summary;
  for (const auto& [name, rows] : checked) summary += " " + name + ":" + std::to_string(rows);
  std::printf("%s: bit-exact rows per type:%s\n", path.filename().c_str(), summary.c_str());
}

TEST(LlamaCppDequant, ReferenceDecodeIsBitExactOnRealModels) {
  const std::vector<fs::path> models = RealModels();
  if (models.empty()) {
    GTEST_SKIP() << "no real model files in " << KVQ_DEPS_DIR << "/models (scripts/setup.sh)";
  }
  for (const fs::path& m : models) {
    SCOPED_TRACE(m.string());
    CompareFile(m);
  }
}

// ggml quantizes random rows (varied scales, outliers) with its own
// quantizer; kvq's reference and fast row decoders must reproduce ggml's
// to_float bit for bit on those blocks.
TEST(LlamaCppDequant, EveryBlockTypeOnGgmlQuantizedBlocks) {
  const struct {
    uint32_t ggml;
    ops::WeightType type;
  } kTypes[] = {
      {8, ops::WeightType::kQ8_0},  {2, ops::WeightType::kQ4_0},  {3, ops::WeightType::kQ4_1},
      {6, ops::WeightType::kQ5_0},  {7, ops::WeightType::kQ5_1},  {20, ops::WeightType::kIQ4_NL},
      {10, ops::WeightType::kQ2_K}, {11, ops::WeightType::kQ3_K}, {12, ops::WeightType::kQ4_K},
      {13, ops::WeightType::kQ5_K}, {14, ops::WeightType::kQ6_K}};
  const int64_t rows = 26, cols = 768;
  for (const auto& t : kTypes) {
    const std::string out = std::string(KVQ_BINARY_DIR) + "/quantize_" + std::to_string(t.ggml);
    const std::string cmd = std::string(KVQ_LLAMACPP_HARNESS) + " quantize " +
                            std::to_string(t.ggml) + " " + std::to_string(rows) + " " +
                            std::to_string(cols) + " '" + out + ".bin' 2>" + out + ".log";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::ifstream in(out + ".bin", std::ios::binary);
    char magic[8];
    int64_t row_bytes = 0;
    in.read(magic, 8);
    in.read(reinterpret_cast<char*>(&row_bytes), 8);
    ASSERT_TRUE(in && std::memcmp(magic, "KVQQUANT", 8) == 0);
    ASSERT_EQ(row_bytes, ops::RowBytes(t.type, cols)) << ops::WeightTypeName(t.type);
    std::vector<uint8_t> blocks(static_cast<size_t>(rows * row_bytes));
    std::vector<float> ggml(static_cast<size_t>(rows * cols));
    in.read(reinterpret_cast<char*>(blocks.data()), static_cast<std::streamsize>(blocks.size()));
    in.read(reinterpret_cast<char*>(ggml.data()), static_cast<std::streamsize>(ggml.size() * 4));
    ASSERT_TRUE(in) << "short harness output " << out;
    const ops::WeightView view{t.type, rows, cols, blocks.data()};
    std::vector<float> ref(ggml.size()), fast(ggml.size());
    for (int64_t r = 0; r < rows; ++r) ops::DequantizeRowRef(view, r, ref.data() + r * cols);
    ops::DequantizeRows(view, 0, rows, fast.data());
    EXPECT_EQ(std::memcmp(ref.data(), ggml.data(), ggml.size() * 4), 0)
        << ops::WeightTypeName(t.type) << ": DequantizeRowRef differs from ggml";
    EXPECT_EQ(std::memcmp(fast.data(), ggml.data(), ggml.size() * 4), 0)
        << ops::WeightTypeName(t.type) << ": DequantizeRows differs from ggml";
    fs::remove(out + ".bin");
  }
}

}  // namespace
}  // namespace kvq
