#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>

namespace kvq {

StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  // A model file may be as large as the address space allows: the map reads
  // only what is used. The checks (regular file, no wait for a FIFO's writer)
  // are the text readers'.
  size_t size = 0;
  KVQ_ASSIGN_OR_RETURN(const UniqueFd fd,
                       OpenRegularFile(path, std::numeric_limits<size_t>::max(), &size));
  std::unique_ptr<MappedFile> file(new MappedFile());
  file->path_ = path;
  file->size_ = size;
  if (file->size_ > 0) {
    void* map = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    const int err = errno;  // read before the message's allocations
    if (map == MAP_FAILED) return Status::Error(path + ": mmap failed: " + std::strerror(err));
    file->data_ = static_cast<const uint8_t*>(map);
  }
  return file;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.Release();
  }
  return *this;
}

StatusOr<UniqueFd> OpenRegularFile(const std::string& path, size_t max_bytes, size_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return Status::Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    return Status::Error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    const char* what = S_ISDIR(st.st_mode)    ? "a directory"
                       : S_ISFIFO(st.st_mode) ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a regular file";
    return Status::Error(path + ": is " + std::string(what) + ", not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::Error(path + ": " + std::to_string(st.st_size) + " bytes, more than the " +
                         std::to_string(max_bytes) + " this input may have");
  }
  // Back to blocking reads for a regular file (O_NONBLOCK has no effect on
  // them, but say so rather than rely on it).
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
  *size = static_cast<size_t>(st.st_size);
  return fd;
}

StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes) {
  size_t size = 0;
  KVQ_ASSIGN_OR_RETURN(const UniqueFd fd, OpenRegularFile(path, max_bytes, &size));
  std::string out(size, '\0');
  size_t got = 0;
  // Read what the size promised and one byte more: a file that grows while
  // it is read is refused rather than followed.
  char extra;
  while (true) {
    KVQ_ASSIGN_OR_RETURN(const size_t n,
                         got < size ? ReadSome(fd.get(), out.data() + got, size - got, path)
                                    : ReadSome(fd.get(), &extra, 1, path));
    if (n == 0) break;
    if (got >= size) return Status::Error(path + ": the file grew while it was read");
    got += n;
  }
  out.resize(got);
  return out;
}

StatusOr<size_t> ReadSome(int fd, void* buf, size_t n, const std::string& path) {
  while (true) {
    const ssize_t got = ::read(fd, buf, n);
    if (got >= 0) return static_cast<size_t>(got);
    if (errno != EINTR) return Status::Error(path + ": read error: " + std::strerror(errno));
  }
}

Status WriteTextFile(const std::string& path, std::string_view text) {
  // A regular file, or a new one, is written beside its place and renamed
  // over it, so a run killed mid-write leaves the old file or the new one,
  // never half of one. Anything else (/dev/stdout, a symlink, a FIFO) is
  // written where it is.
  struct stat st {};
  const bool in_place = ::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
  const std::string target = in_place ? path : path + ".tmp-" + std::to_string(::getpid());
  std::ofstream out(target, std::ios::binary | std::ios::trunc);
  if (!out) return Status::Error(path + ": cannot open for writing: " + std::strerror(errno));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  out.close();
  Status written = Status::Ok();
  if (!out) written = Status::Error(path + ": write failed: " + std::strerror(errno));
  if (!in_place && written.ok() && ::rename(target.c_str(), path.c_str()) != 0) {
    written = Status::Error(path + ": cannot replace: " + std::strerror(errno));
  }
  if (!in_place && !written.ok()) ::unlink(target.c_str());
  return written;
}

}  // namespace kvq
