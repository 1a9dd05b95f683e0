#include "eval/logits_file.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "base/fp16.h"
#include "io/mapped_file.h"

namespace kvq {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'Q', 'L', 'O', 'G', 'P', '\0'};
constexpr char kLlamaMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};
constexpr size_t kLlamaHeaderBytes = 8 + 3 * 4;
// llama-perplexity keeps log-probs within 16 nats of the top one.
constexpr float kLlamaLogProbRange = 16.0f;
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 6 * 4;
constexpr double kF16Lowest = -65504.0;

size_t RowBytes(uint32_t n_vocab, bool f16) {
  return 4 + 4 + static_cast<size_t>(n_vocab) * (f16 ? 2 : 4);
}

// u16 values per llama.cpp row: two f32 header values, n_vocab codes, padded
// to an even count.
size_t LlamaRowValues(uint32_t n_vocab) { return 2 * ((static_cast<size_t>(n_vocab) + 1) / 2) + 4; }

size_t RowBytes(const LogitsFileHeader& h) {
  return h.format == LogitsFormat::kLlamaCpp ? 2 * LlamaRowValues(h.n_vocab)
                                             : RowBytes(h.n_vocab, h.f16);
}

// One row in llama.cpp's encoding from log-probs: the clamp, scale and
// round-to-nearest-even of llama-perplexity, in f32 as there.
void EncodeLlamaRow(const double* log_probs, uint32_t n_vocab, uint8_t* out) {
  float max = static_cast<float>(log_probs[0]);
  float min = max;
  for (uint32_t i = 1; i < n_vocab; ++i) {
    max = std::max(max, static_cast<float>(log_probs[i]));
    min = std::min(min, static_cast<float>(log_probs[i]));
  }
  min = std::max(min, max - kLlamaLogProbRange);
  const float scale = (max - min) / 65535.0f;
  std::memcpy(out, &scale, 4);
  std::memcpy(out + 4, &min, 4);
  uint8_t* codes = out + 8;
  std::memset(codes, 0, 2 * (LlamaRowValues(n_vocab) - 4));
  if (scale == 0.0f) return;
  const float inv_scale = 1.0f / scale;
  for (uint32_t i = 0; i < n_vocab; ++i) {
    const float lp = static_cast<float>(log_probs[i]);
    const uint16_t q =
        lp > min ? static_cast<uint16_t>(std::min(65535.0f, std::nearbyint(inv_scale * (lp - min))))
                 : 0;
    std::memcpy(codes + 2 * i, &q, 2);
  }
}

// The rest of a llama.cpp header after its magic, checked against the size.
Status ParseLlamaHeader(std::FILE* file, uintmax_t size, const std::string& path,
                        LogitsFileHeader* h) {
  uint8_t head[kLlamaHeaderBytes - 8];
  if (size < kLlamaHeaderBytes || std::fread(head, 1, sizeof(head), file) != sizeof(head)) {
    return Status::Error(path + ": truncated llama.cpp logits header");
  }
  uint32_t n_ctx;
  int32_t n_vocab, n_chunk;
  std::memcpy(&n_ctx, head, 4);
  std::memcpy(&n_vocab, head + 4, 4);
  std::memcpy(&n_chunk, head + 8, 4);
  if (n_vocab <= 0 || n_chunk < 0 || n_ctx < 4 || n_ctx > (1u << 24)) {
    return Status::Error(path + ": corrupt llama.cpp logits header (n_ctx " +
                         std::to_string(n_ctx) + ", n_vocab " + std::to_string(n_vocab) +
                         ", n_chunk " + std::to_string(n_chunk) + ")");
  }
  h->format = LogitsFormat::kLlamaCpp;
  h->n_vocab = static_cast<uint32_t>(n_vocab);
  h->n_ctx = n_ctx;
  h->first = n_ctx / 2;
  h->n_windows = static_cast<uint32_t>(n_chunk);
  h->f16 = false;
  const uintmax_t expected = kLlamaHeaderBytes + static_cast<uintmax_t>(n_chunk) * n_ctx * 4 +
                             static_cast<uintmax_t>(n_chunk) * h->RowsPerWindow() * RowBytes(*h);
  if (size != expected) {
    return Status::Error(path + ": size " + std::to_string(size) +
                         " bytes, its llama.cpp header implies " + std::to_string(expected) +
                         " (truncated or corrupt)");
  }
  return Status::Ok();
}

void PutU32(std::vector<uint8_t>& out, uint32_t v) {
  uint8_t b[4];
  std::memcpy(b, &v, 4);
  out.insert(out.end(), b, b + 4);
}

}  // namespace

StatusOr<std::unique_ptr<LogitsFileWriter>> LogitsFileWriter::Create(
    const std::string& path, const LogitsFileHeader& header) {
  if (header.tokens.size() != static_cast<size_t>(header.n_windows) * header.n_ctx) {
    return Status::Error(path + ": token count does not match n_windows * n_ctx");
  }
  std::unique_ptr<LogitsFileWriter> w(new LogitsFileWriter());
  w->path_ = path;
  w->format_ = header.format;
  w->n_vocab_ = header.n_vocab;
  w->f16_ = header.f16;
  w->file_ = std::fopen(path.c_str(), "wb");
  if (w->file_ == nullptr) {
    return Status::Error(path + ": cannot open for writing: " + std::strerror(errno));
  }
  if (header.format == LogitsFormat::kLlamaCpp) {
    if (header.first != header.n_ctx / 2) {
      return Status::Error(path + ": llama.cpp's format scores from n_ctx / 2 only");
    }
    std::vector<uint8_t> head(kLlamaMagic, kLlamaMagic + 8);
    PutU32(head, header.n_ctx);
    PutU32(head, header.n_vocab);
    PutU32(head, header.n_windows);
    const size_t token_bytes = header.tokens.size() * 4;
    head.resize(head.size() + token_bytes);
    std::memcpy(head.data() + kLlamaHeaderBytes, header.tokens.data(), token_bytes);
    if (std::fwrite(head.data(), 1, head.size(), w->file_) != head.size()) {
      return Status::Error(path + ": write failed");
    }
    return w;
  }
  std::vector<uint8_t> head(kMagic, kMagic + 8);
  PutU32(head, kVersion);
  PutU32(head, header.n_vocab);
  PutU32(head, header.n_ctx);
  PutU32(head, header.first);
  PutU32(head, header.n_windows);
  PutU32(head, header.f16 ? 1 : 0);
  const size_t token_bytes = header.tokens.size() * 4;
  head.resize(head.size() + token_bytes);
  std::memcpy(head.data() + kHeaderBytes, header.tokens.data(), token_bytes);
  if (std::fwrite(head.data(), 1, head.size(), w->file_) != head.size()) {
    return Status::Error(path + ": write failed");
  }
  return w;
}

LogitsFileWriter::~LogitsFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status LogitsFileWriter::WriteRow(int32_t argmax, float nll, const double* log_probs) {
  if (format_ == LogitsFormat::kLlamaCpp) {
    buffer_.resize(2 * LlamaRowValues(n_vocab_));
    EncodeLlamaRow(log_probs, n_vocab_, buffer_.data());
    if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
      return Status::Error(path_ + ": write failed");
    }
    return Status::Ok();
  }
  buffer_.resize(RowBytes(n_vocab_, f16_));
  std::memcpy(buffer_.data(), &argmax, 4);
  std::memcpy(buffer_.data() + 4, &nll, 4);
  uint8_t* out = buffer_.data() + 8;
  for (uint32_t i = 0; i < n_vocab_; ++i) {
    if (f16_) {
      const uint16_t h = F32ToF16(static_cast<float>(std::max(log_probs[i], kF16Lowest)));
      std::memcpy(out + 2 * i, &h, 2);
    } else {
      const float f = static_cast<float>(log_probs[i]);
      std::memcpy(out + 4 * i, &f, 4);
    }
  }
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    return Status::Error(path_ + ": write failed");
  }
  return Status::Ok();
}

Status LogitsFileWriter::Close() {
  std::FILE* f = file_;
  file_ = nullptr;
  if (f == nullptr || std::fclose(f) != 0) return Status::Error(path_ + ": close failed");
  return Status::Ok();
}

StatusOr<std::unique_ptr<LogitsFileReader>> LogitsFileReader::Open(const std::string& path) {
  // A regular file only (not a FIFO or device): its size is checked against
  // the header before anything large is read.
  size_t file_bytes = 0;
  KVQ_ASSIGN_OR_RETURN(UniqueFd fd, OpenRegularFile(path, SIZE_MAX, &file_bytes));
  const uintmax_t size = file_bytes;
  std::unique_ptr<LogitsFileReader> r(new LogitsFileReader());
  r->path_ = path;
  r->file_ = ::fdopen(fd.get(), "rb");
  if (r->file_ == nullptr) return Status::Error(path + ": cannot open: " + std::strerror(errno));
  fd.Release();  // the FILE owns it now
  uint8_t head[kHeaderBytes];
  if (size >= 8 && std::fread(head, 1, 8, r->file_) == 8 &&
      std::memcmp(head, kLlamaMagic, 8) == 0) {
    KVQ_RETURN_IF_ERROR(ParseLlamaHeader(r->file_, size, path, &r->header_));
  } else if (size < kHeaderBytes ||
             std::fread(head + 8, 1, kHeaderBytes - 8, r->file_) != kHeaderBytes - 8 ||
             std::memcmp(head, kMagic, 8) != 0) {
    return Status::Error(path +
                         ": neither a kvq nor a llama.cpp logits file (bad magic; write one "
                         "with kvq perplexity --save-logits or llama-perplexity "
                         "--kl-divergence-base)");
  }
  if (r->header_.format == LogitsFormat::kLlamaCpp) {
    LogitsFileHeader& h = r->header_;
    h.tokens.resize(static_cast<size_t>(h.n_windows) * h.n_ctx);
    if (std::fread(h.tokens.data(), 4, h.tokens.size(), r->file_) != h.tokens.size()) {
      return Status::Error(path + ": read failed");
    }
    return r;
  }
  uint32_t v[6];
  std::memcpy(v, head + 8, sizeof(v));
  if (v[0] != kVersion) {
    return Status::Error(path + ": logits file version " + std::to_string(v[0]) +
                         ", this kvq reads version " + std::to_string(kVersion));
  }
  LogitsFileHeader& h = r->header_;
  h.n_vocab = v[1];
  h.n_ctx = v[2];
  h.first = v[3];
  h.n_windows = v[4];
  h.f16 = v[5] == 1;
  if (h.n_vocab == 0 || h.n_ctx < 4 || h.first >= h.n_ctx - 1 || v[5] > 1) {
    return Status::Error(path + ": corrupt logits file header");
  }
  const uintmax_t expected =
      kHeaderBytes + static_cast<uintmax_t>(h.n_windows) * h.n_ctx * 4 +
      static_cast<uintmax_t>(h.n_windows) * h.RowsPerWindow() * RowBytes(h.n_vocab, h.f16);
  if (size != expected) {
    return Status::Error(path + ": size " + std::to_string(size) + " bytes, the header implies " +
                         std::to_string(expected) + " (truncated or corrupt)");
  }
  h.tokens.resize(static_cast<size_t>(h.n_windows) * h.n_ctx);
  if (std::fread(h.tokens.data(), 4, h.tokens.size(), r->file_) != h.tokens.size()) {
    return Status::Error(path + ": read failed");
  }
  return r;
}

LogitsFileReader::~LogitsFileReader() {
  if (file_ != nullptr) std::fclose(file_);
}

Status LogitsFileReader::ReadRow(LogitsRow* row) {
  buffer_.resize(RowBytes(header_));
  if (std::fread(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    return Status::Error(path_ + ": unexpected end of file");
  }
  if (header_.format == LogitsFormat::kLlamaCpp) return DecodeLlamaRow(row);
  std::memcpy(&row->argmax, buffer_.data(), 4);
  std::memcpy(&row->nll, buffer_.data() + 4, 4);
  row->log_probs.resize(header_.n_vocab);
  const uint8_t* in = buffer_.data() + 8;
  for (uint32_t i = 0; i < header_.n_vocab; ++i) {
    if (header_.f16) {
      uint16_t h;
      std::memcpy(&h, in + 2 * i, 2);
      row->log_probs[i] = F16ToF32(h);
    } else {
      float f;
      std::memcpy(&f, in + 4 * i, 4);
      row->log_probs[i] = f;
    }
  }
  return Status::Ok();
}

Status LogitsFileReader::DecodeLlamaRow(LogitsRow* row) {
  float scale, min_log_prob;
  std::memcpy(&scale, buffer_.data(), 4);
  std::memcpy(&min_log_prob, buffer_.data() + 4, 4);
  if (!std::isfinite(scale) || !std::isfinite(min_log_prob) || scale < 0) {
    return Status::Error(path_ + ": row " + std::to_string(rows_read_) +
                         " has a non-finite or negative scale");
  }
  const int64_t per_window = header_.RowsPerWindow();
  const int64_t window = rows_read_ / per_window;
  const int64_t r = rows_read_ % per_window;
  ++rows_read_;
  const int32_t target =
      header_.tokens[static_cast<size_t>(window * header_.n_ctx + header_.first + r + 1)];
  row->log_probs.resize(header_.n_vocab);
  const uint8_t* codes = buffer_.data() + 8;
  int32_t argmax = 0;
  float best = 0;
  for (uint32_t i = 0; i < header_.n_vocab; ++i) {
    uint16_t q;
    std::memcpy(&q, codes + 2 * i, 2);
    const float lp = scale * q + min_log_prob;
    // Code 0 is "at or below the floor 16 nats under the top": llama.cpp
    // leaves such tokens out of its KL sum, and so do kvq's readers (as
    // zero probability). Keeping them at the floor value would give the
    // ~50K tail tokens of a real vocabulary ~0.5% of the mass.
    row->log_probs[i] = q == 0 ? -INFINITY : lp;
    if (i == 0 || lp > best) {
      best = lp;
      argmax = static_cast<int32_t>(i);
    }
  }
  row->argmax = argmax;
  if (target >= 0 && static_cast<uint32_t>(target) < header_.n_vocab) {
    uint16_t q;
    std::memcpy(&q, codes + 2 * target, 2);
    row->nll = -(scale * q + min_log_prob);  // the floor value for a clamped target, as llama.cpp
  } else {
    row->nll = NAN;
  }
  return Status::Ok();
}

}  // namespace kvq
