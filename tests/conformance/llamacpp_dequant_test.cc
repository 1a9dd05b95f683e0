// Bit-exactness of kvq's reference weight decode (ops::DequantizeRowRef)
// with ggml's own dequantization (its type traits' to_float, through the
// harness's `dequant` command), on the real model files in .deps/models:
// for every weight type a file uses, a few rows (first, middle, last) of up
// to two of its tensors.
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

}  // namespace
}  // namespace kvq
