// Read-only memory map of a whole file. Model weights are used in place from
// the map; nothing is copied at load time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

namespace kvq {

class MappedFile {
 public:
  static StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Whole file into a string; errors name the path. Only a regular file is
// read (a directory, FIFO or device such as /dev/zero is refused before any
// byte is read, and opening never waits for a FIFO's writer), and only when
// its size is at most `max_bytes`, checked before reading: no input makes it
// read without bound. Every text input (texts, policies, JSON, keys) uses it.
inline constexpr size_t kMaxTextFileBytes = size_t{1} << 30;
StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes = kMaxTextFileBytes);

// An open file descriptor, closed when it goes out of scope; `Release` hands it
// on (to fdopen, say) without closing it.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// The same checks for a reader that streams the file itself: open for
// reading, regular, at most `max_bytes`. `*size` gets the size.
StatusOr<UniqueFd> OpenRegularFile(const std::string& path, size_t max_bytes, size_t* size);

// One read(2) of at most `n` bytes, retried when a signal interrupts it:
// the bytes read, 0 at the end of the file, or an error naming `path`.
StatusOr<size_t> ReadSome(int fd, void* buf, size_t n, const std::string& path);

// Writes `text` as the whole of `path`. A regular file is replaced at once
// (written beside it, then renamed over it: a killed run never leaves half a
// file, and a failed write keeps the old one); a device or symlink is written
// in place. Errors name the path and the reason, a full disk included: the
// check comes after the close, where a buffered write would otherwise fail
// unseen.
Status WriteTextFile(const std::string& path, std::string_view text);

}  // namespace kvq
