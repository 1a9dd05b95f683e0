#include "kv/dense_cache.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "base/fp16.h"
#include "base/thread_pool.h"
#include "base/threads.h"

namespace kvq {
namespace {

// Storage element and its conversions. f16 rounds to nearest even on store.
struct F32Elem {
  using Type = float;
  static constexpr const char* kName = "f32";
  static Type Store(float x) { return x; }
  static float Load(Type x) { return x; }
};
struct F16Elem {
  using Type = uint16_t;
  static constexpr const char* kName = "f16";
  static Type Store(float x) { return F32ToF16(x); }
  static float Load(Type x) { return F16ToF32(x); }
};

template <typename Elem>
class DenseKvCache final : public KvCache {
  using T = typename Elem::Type;

 public:
  DenseKvCache(const KvShape& shape, int64_t max_tokens, int num_threads)
      : shape_(shape),
        max_tokens_(max_tokens),
        row_(shape.num_kv_heads * shape.head_dim),
        pool_(std::make_unique<ThreadPool>(num_threads > 0 ? num_threads : AvailableThreads())) {}

  Status AddSequence(SeqId seq) override {
    if (sequences_.count(seq) != 0)
      return Status::Error("sequence " + std::to_string(seq) + " exists");
    sequences_[seq].layers.resize(static_cast<size_t>(shape_.num_layers));
    return Status::Ok();
  }
  void ReleaseSequence(SeqId seq) override { sequences_.erase(seq); }

  // A dense cache has nothing to share: a fork is a deep copy.
  Status Fork(SeqId src, SeqId dst) override {
    auto it = sequences_.find(src);
    if (it == sequences_.end())
      return Status::Error("fork: unknown sequence " + std::to_string(src));
    if (sequences_.count(dst) != 0)
      return Status::Error("fork: sequence " + std::to_string(dst) + " exists");
    for (const Layer& l : it->second.layers) {
      if (l.k.size() != it->second.layers[0].k.size())
        return Status::Error("fork: sequence " + std::to_string(src) +
                             " is in the middle of a forward pass");
    }
    Sequence copy = it->second;
    sequences_[dst] = std::move(copy);
    return Status::Ok();
  }
  Status Truncate(SeqId seq, int64_t length) override {
    auto it = sequences_.find(seq);
    if (it == sequences_.end())
      return Status::Error("truncate: unknown sequence " + std::to_string(seq));
    for (Layer& l : it->second.layers) {
      const int64_t stored = static_cast<int64_t>(l.k.size()) / row_;
      if (length < 0 || length > stored) {
        return Status::Error("truncate: length " + std::to_string(length) + " outside [0, " +
                             std::to_string(stored) + "]");
      }
    }
    for (Layer& l : it->second.layers) {
      l.k.resize(static_cast<size_t>(length * row_));
      l.v.resize(static_cast<size_t>(length * row_));
    }
    return Status::Ok();
  }

  int64_t Length(SeqId seq, int64_t layer) const override {
    auto it = sequences_.find(seq);
    if (it == sequences_.end()) return 0;
    return static_cast<int64_t>(it->second.layers[layer].k.size()) / row_;
  }
  int64_t Capacity(SeqId seq) const override { return max_tokens_ - Length(seq, 0); }

  Status Append(SeqId seq, int64_t layer, int64_t n, const float* /*k_pre_rope*/, const float* k,
                const float* v) override {
    auto it = sequences_.find(seq);
    if (it == sequences_.end()) return Status::Error("unknown sequence " + std::to_string(seq));
    Layer& cache = it->second.layers[layer];
    const int64_t length = static_cast<int64_t>(cache.k.size()) / row_;
    if (length + n > max_tokens_) {
      return Status::Error("KV cache full: " + std::to_string(length) + " + " + std::to_string(n) +
                           " tokens exceed the context of " + std::to_string(max_tokens_));
    }
    for (int64_t i = 0; i < n * row_; ++i) {
      cache.k.push_back(Elem::Store(k[i]));
      cache.v.push_back(Elem::Store(v[i]));
    }
    return Status::Ok();
  }

  Status Attend(SeqId seq, int64_t layer, int64_t n, const float* q, float scale,
                float* out) const override {
    auto it = sequences_.find(seq);
    if (it == sequences_.end()) return Status::Error("attend: unknown sequence");
    if (layer < 0 || layer >= shape_.num_layers) return Status::Error("attend: bad layer");
    const Layer& cache = it->second.layers[static_cast<size_t>(layer)];
    const int64_t total = static_cast<int64_t>(cache.k.size()) / row_;
    if (n <= 0 || n > total) return Status::Error("attend: more queries than stored tokens");
    const int64_t dim = shape_.head_dim;
    const int64_t kv_heads = shape_.num_kv_heads;
    const int64_t group = shape_.num_heads / kv_heads;
    // One task per (query token, KV head): the group's query heads share each
    // K/V row read.
    const int64_t tasks = n * kv_heads;
    const int threads = static_cast<int>(std::min<int64_t>(pool_->size(), tasks));
    pool_->RunOnThreads(threads, [&](int thread) {
      std::vector<float> scores(static_cast<size_t>(group * total));  // [group, total]
      std::vector<float> row(static_cast<size_t>(dim));               // one K or V head row
      std::vector<float> acc(static_cast<size_t>(group * dim));       // [group, dim]
      const auto [first, last] = ThreadPool::StaticRange(tasks, threads, thread);
      for (int64_t task = first; task < last; ++task) {
        const int64_t i = task / kv_heads, g = task % kv_heads;
        const int64_t visible = total - n + i + 1;
        const float* q_group = q + (i * shape_.num_heads + g * group) * dim;  // [group, dim]
        for (int64_t t = 0; t < visible; ++t) {
          const T* kt = cache.k.data() + t * row_ + g * dim;
          for (int64_t d = 0; d < dim; ++d) row[d] = Elem::Load(kt[d]);
          for (int64_t h = 0; h < group; ++h) {
            float dot = 0;
            for (int64_t d = 0; d < dim; ++d) dot += q_group[h * dim + d] * row[d];
            scores[h * total + t] = dot * scale;
          }
        }
        for (int64_t h = 0; h < group; ++h) {
          float* s = &scores[h * total];
          const float max_score = *std::max_element(s, s + visible);
          float sum = 0;
          for (int64_t t = 0; t < visible; ++t) {
            s[t] = std::exp(s[t] - max_score);
            sum += s[t];
          }
          const float inv = 1.0f / sum;
          for (int64_t t = 0; t < visible; ++t) s[t] *= inv;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t t = 0; t < visible; ++t) {
          const T* vt = cache.v.data() + t * row_ + g * dim;
          for (int64_t d = 0; d < dim; ++d) row[d] = Elem::Load(vt[d]);
          for (int64_t h = 0; h < group; ++h) {
            const float p = scores[h * total + t];
            for (int64_t d = 0; d < dim; ++d) acc[h * dim + d] += p * row[d];
          }
        }
        for (int64_t h = 0; h < group; ++h) {
          std::copy_n(&acc[h * dim], dim, out + (i * shape_.num_heads + g * group + h) * dim);
        }
      }
    });
    return Status::Ok();
  }

  size_t BytesUsed() const override {
    size_t bytes = 0;
    for (const auto& [id, s] : sequences_) {
      for (const Layer& l : s.layers) bytes += (l.k.size() + l.v.size()) * sizeof(T);
    }
    return bytes;
  }
  KvUsage Usage() const override {
    KvUsage usage;
    usage.bytes_used = BytesUsed();
    usage.sequences = static_cast<int64_t>(sequences_.size());
    return usage;
  }
  const char* TypeName() const override { return Elem::kName; }

 private:
  struct Layer {
    std::vector<T> k;  // [tokens, num_kv_heads, head_dim]
    std::vector<T> v;  // [tokens, num_kv_heads, head_dim]
  };
  struct Sequence {
    std::vector<Layer> layers;
  };
  KvShape shape_;
  int64_t max_tokens_;
  int64_t row_;  // num_kv_heads * head_dim
  std::unique_ptr<ThreadPool> pool_;
  std::map<SeqId, Sequence> sequences_;
};

}  // namespace

std::unique_ptr<KvCache> MakeDenseKvCache(const KvShape& shape, DenseKvType type,
                                          int64_t max_tokens, int num_threads) {
  if (type == DenseKvType::kF16) {
    return std::make_unique<DenseKvCache<F16Elem>>(shape, max_tokens, num_threads);
  }
  return std::make_unique<DenseKvCache<F32Elem>>(shape, max_tokens, num_threads);
}

StatusOr<DenseKvType> ParseDenseKvType(const std::string& name) {
  if (name == "f32") return DenseKvType::kF32;
  if (name == "f16") return DenseKvType::kF16;
  return Status::Error("unknown KV cache type '" + name + "' (available: f32, f16)");
}

}  // namespace kvq
