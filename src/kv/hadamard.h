// Randomized Walsh-Hadamard rotation of KV head vectors (QuaRot-style):
// R = H · D / sqrt(dim), H the Sylvester Hadamard matrix (H[i][j] =
// (-1)^popcount(i & j)), D = diag(signs) a FIXED ±1 vector derived from a
// constant seed (HadamardSign), identical on every run and for every dim
// (the signs of a smaller dim are a prefix of a larger one's).
// R is orthogonal, so rotating q and k by it leaves q·k unchanged; V is
// stored rotated and the attention output is unrotated by Rᵀ, which spreads
// outlier channels across the whole head before an integer codec sees them.
#pragma once

#include <cstdint>

#include "base/status.h"

namespace kvq {

// OK when dim is a power of two in [1, 2^16].
Status CheckHadamardDim(int64_t dim);

// D's entry i (+1 or -1).
float HadamardSign(int64_t i);

// x: [n, dim], each row replaced in place by R · row (Rotate) or Rᵀ · row
// (Unrotate). Fast O(dim log dim) Highway kernels (runtime dispatch).
Status HadamardRotate(float* x, int64_t n, int64_t dim);
Status HadamardUnrotate(float* x, int64_t n, int64_t dim);

// Reference twins: multiply by the explicit matrix R (or Rᵀ), accumulating
// in double. O(dim^2) per row; for tests.
Status HadamardRotateRef(float* x, int64_t n, int64_t dim);
Status HadamardUnrotateRef(float* x, int64_t n, int64_t dim);

// llama.cpp's rotation (its PR 21038; kv/codec_ggml.h says when it applies):
// each `block` consecutive values of x [n, dim] replaced by H_block ·
// values / sqrt(block), H the Sylvester matrix without signs (ggml's
// matrix). Symmetric and orthogonal, so it is its own inverse. block: a
// power of two dividing dim.
Status WalshHadamardBlocks(float* x, int64_t n, int64_t dim, int64_t block);
// Its reference twin: the explicit matrix, accumulating in double.
Status WalshHadamardBlocksRef(float* x, int64_t n, int64_t dim, int64_t block);

}  // namespace kvq
