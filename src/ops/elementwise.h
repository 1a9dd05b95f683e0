// Small per-token kernels of the Qwen2/Llama block. Each fast kernel is
// Highway SIMD with runtime dispatch and has a scalar *Ref twin. They are
// cheap next to the matmuls, so they run on the calling thread.
#pragma once

#include <cstdint>

namespace kvq::ops {

// y[n, dim] = x[n, dim] / sqrt(mean_j(x[t, j]²) + eps) * weight[dim], per row
// t, all in f32 like HF's Qwen2RMSNorm (which upcasts to f32). y may equal x.
void RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y);
void RmsNormRef(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y);

// y[n, dim] += bias[dim] (Qwen2's q/k/v projection biases).
void AddBias(const float* bias, int64_t n, int64_t dim, float* y);
void AddBiasRef(const float* bias, int64_t n, int64_t dim, float* y);

// out[count] = silu(gate[count]) * up[count], silu(g) = g / (1 + e^-g).
// out may equal gate or up.
void SwiGlu(const float* gate, const float* up, int64_t count, float* out);
void SwiGluRef(const float* gate, const float* up, int64_t count, float* out);

// x[count] = softmax(x) in place, subtracting the max first so no exp
// overflows. -inf entries (masked positions) become 0; at least one entry
// must be finite.
void Softmax(float* x, int64_t count);
void SoftmaxRef(float* x, int64_t count);

}  // namespace kvq::ops
