// The file `kvq perplexity --save-logits` writes and `--kl-divergence` reads:
// a baseline run's log-probabilities at every scored position, so another
// run (another cache type) can be compared token by token.
//
// Layout (little-endian, no padding):
//   char[8]  magic "KVQLOGP\0"
//   u32      version (1)
//   u32      n_vocab
//   u32      n_ctx            window length in tokens
//   u32      first            first scored logit row of a window (n_ctx / 2)
//   u32      n_windows
//   u32      dtype            of the log-probs: 1 = f16, 0 = f32
//   i32      tokens[n_windows * n_ctx]   as fed to the model (BOS substituted)
//   then per window, per scored row r = first .. n_ctx - 2 (row r predicts
//   token r + 1 of the window), n_ctx - 1 - first rows per window:
//     i32    argmax           top-1 token of the f32 log-probs
//     f32    nll              -log p(token r + 1), from the f32 log-probs
//     f16|f32 log_probs[n_vocab]   log-softmax of the row's logits; f16 values
//                                   are clamped to >= -65504 (finite)
//
// The same classes also read and write llama.cpp's `llama-perplexity
// --kl-divergence-base` file, so either tool can be scored against the
// other's baseline (the reader tells the two apart by their magic):
//   char[8]  "_logits_"
//   u32      n_ctx;  i32 n_vocab;  i32 n_chunk
//   i32      tokens[n_chunk * n_ctx]   the text's tokens (BOS not substituted)
//   then per chunk, per scored row (first = n_ctx / 2, as above), nv =
//   2 * ((n_vocab + 1) / 2) + 4 u16 values: two f32 (scale, min_log_prob),
//   then per token q = round((log_prob - min_log_prob) / scale), where
//   min_log_prob is the smallest log-prob clamped to >= max - 16 and
//   scale = (max - min_log_prob) / 65535; tokens at or below the clamp get 0.
// Decoded log-prob = scale * q + min_log_prob (f32), as llama.cpp decodes it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace kvq {

enum class LogitsFormat : uint8_t {
  kKvq,       // "KVQLOGP": f16 or f32 log-probs, argmax and nll per row
  kLlamaCpp,  // "_logits_": llama-perplexity's 16-bit linear log-prob rows
};

struct LogitsFileHeader {
  LogitsFormat format = LogitsFormat::kKvq;
  uint32_t n_vocab = 0;
  uint32_t n_ctx = 0;
  uint32_t first = 0;
  uint32_t n_windows = 0;
  bool f16 = true;  // kKvq only
  // [n_windows * n_ctx]. kKvq stores them as fed to the model (each window's
  // first token replaced by BOS when the model adds one); kLlamaCpp stores
  // the text's tokens, and its reader substitutes nothing.
  std::vector<int32_t> tokens;
  int64_t RowsPerWindow() const { return static_cast<int64_t>(n_ctx) - 1 - first; }
};

// One scored row as stored (log-probs widened to double).
struct LogitsRow {
  int32_t argmax = 0;
  float nll = 0;
  std::vector<double> log_probs;  // [n_vocab]
};

class LogitsFileWriter {
 public:
  static StatusOr<std::unique_ptr<LogitsFileWriter>> Create(const std::string& path,
                                                            const LogitsFileHeader& header);
  ~LogitsFileWriter();
  // log_probs: [n_vocab]
  Status WriteRow(int32_t argmax, float nll, const double* log_probs);
  Status Close();

 private:
  LogitsFileWriter() = default;
  std::string path_;
  std::FILE* file_ = nullptr;
  LogitsFormat format_ = LogitsFormat::kKvq;
  uint32_t n_vocab_ = 0;
  bool f16_ = true;
  std::vector<uint8_t> buffer_;
};

class LogitsFileReader {
 public:
  // Reads and checks the header (magic, version, sizes against the file
  // length) of either format.
  static StatusOr<std::unique_ptr<LogitsFileReader>> Open(const std::string& path);
  ~LogitsFileReader();
  const LogitsFileHeader& header() const { return header_; }
  Status ReadRow(LogitsRow* row);

 private:
  LogitsFileReader() = default;
  Status DecodeLlamaRow(LogitsRow* row);
  std::string path_;
  std::FILE* file_ = nullptr;
  LogitsFileHeader header_;
  int64_t rows_read_ = 0;  // kLlamaCpp rows carry no nll: found from the tokens
  std::vector<uint8_t> buffer_;
};

}  // namespace kvq
