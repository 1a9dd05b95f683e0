#include "kv/codec.h"

#include <cstring>
#include <vector>

#include "base/fp16.h"

namespace kvq {
namespace {

// Row codecs for plain float storage: one value per channel, no scales.
template <typename T, typename Store, typename Load>
class FloatCodec final : public KvCodec {
 public:
  FloatCodec(const char* name, int64_t head_dim, Store store, Load load)
      : KvCodec(head_dim), name_(name), store_(store), load_(load) {}

  std::string Name() const override { return name_; }
  size_t RowBytes() const override { return static_cast<size_t>(head_dim_) * sizeof(T); }

  void Encode(const float* x, int64_t n, uint8_t* rows) const override {
    for (int64_t i = 0; i < n * head_dim_; ++i) {
      const T value = store_(x[i]);
      std::memcpy(rows + i * sizeof(T), &value, sizeof(T));
    }
  }
  void Decode(const uint8_t* rows, int64_t n, float* x) const override {
    for (int64_t i = 0; i < n * head_dim_; ++i) {
      T value;
      std::memcpy(&value, rows + i * sizeof(T), sizeof(T));
      x[i] = load_(value);
    }
  }
  void Scores(const uint8_t* rows, int64_t n, const float* q, int64_t group, float scale,
              float* scores, int64_t stride) const override {
    std::vector<float> row(static_cast<size_t>(head_dim_));  // [head_dim]
    for (int64_t t = 0; t < n; ++t) {
      Decode(rows + t * RowBytes(), 1, row.data());
      for (int64_t h = 0; h < group; ++h) {
        float dot = 0;
        for (int64_t d = 0; d < head_dim_; ++d) dot += q[h * head_dim_ + d] * row[d];
        scores[h * stride + t] = dot * scale;
      }
    }
  }
  void AccumulateV(const uint8_t* rows, int64_t n, const float* p, int64_t group, int64_t stride,
                   float* acc) const override {
    std::vector<float> row(static_cast<size_t>(head_dim_));  // [head_dim]
    for (int64_t t = 0; t < n; ++t) {
      Decode(rows + t * RowBytes(), 1, row.data());
      for (int64_t h = 0; h < group; ++h) {
        const float weight = p[h * stride + t];
        for (int64_t d = 0; d < head_dim_; ++d) acc[h * head_dim_ + d] += weight * row[d];
      }
    }
  }

 private:
  const char* name_;
  Store store_;
  Load load_;
};

template <typename T, typename Store, typename Load>
std::unique_ptr<KvCodec> MakeFloatCodec(const char* name, int64_t head_dim, Store store,
                                        Load load) {
  return std::make_unique<FloatCodec<T, Store, Load>>(name, head_dim, store, load);
}

}  // namespace

StatusOr<std::unique_ptr<KvCodec>> ParseKvCodec(const std::string& name, int64_t head_dim) {
  if (head_dim <= 0) return Status::Error("KV codec: head_dim must be positive");
  if (name == "f32") {
    return MakeFloatCodec<float>(
        "f32", head_dim, [](float x) { return x; }, [](float x) { return x; });
  }
  if (name == "f16") {
    return MakeFloatCodec<uint16_t>("f16", head_dim, &F32ToF16, &F16ToF32);
  }
  return Status::Error("unknown KV cache type '" + name + "' (available: f32, f16)");
}

}  // namespace kvq
