#include "engine/logits_file.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "base/fp16.h"
#include "io/mapped_file.h"

namespace kvq {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'Q', 'L', 'O', 'G', 'P', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8 + 6 * 4;
constexpr double kF16Lowest = -65504.0;

size_t RowBytes(uint32_t n_vocab, bool f16) {
  return 4 + 4 + static_cast<size_t>(n_vocab) * (f16 ? 2 : 4);
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
  w->n_vocab_ = header.n_vocab;
  w->f16_ = header.f16;
  w->file_ = std::fopen(path.c_str(), "wb");
  if (w->file_ == nullptr) {
    return Status::Error(path + ": cannot open for writing: " + std::strerror(errno));
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
  KVQ_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, SIZE_MAX, &file_bytes));
  const uintmax_t size = file_bytes;
  std::unique_ptr<LogitsFileReader> r(new LogitsFileReader());
  r->path_ = path;
  r->file_ = ::fdopen(fd, "rb");
  if (r->file_ == nullptr) {
    ::close(fd);
    return Status::Error(path + ": cannot open: " + std::strerror(errno));
  }
  uint8_t head[kHeaderBytes];
  if (size < kHeaderBytes || std::fread(head, 1, kHeaderBytes, r->file_) != kHeaderBytes ||
      std::memcmp(head, kMagic, 8) != 0) {
    return Status::Error(path +
                         ": not a kvq logits file (bad magic; write one with "
                         "kvq perplexity --save-logits)");
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
  buffer_.resize(RowBytes(header_.n_vocab, header_.f16));
  if (std::fread(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    return Status::Error(path_ + ": unexpected end of file");
  }
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

}  // namespace kvq
