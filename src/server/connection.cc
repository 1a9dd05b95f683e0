#include "server/connection.h"

#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace kvq {
namespace {

// Numeric IP and port of a socket address, as httplib renders them.
bool IpAndPort(const sockaddr_storage& addr, socklen_t len, std::string* ip, int* port) {
  if (addr.ss_family == AF_INET) {
    *port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    *port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return false;
  }
  char host[NI_MAXHOST];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return false;
  }
  *ip = host;
  return true;
}

bool Matches(int fd, const std::string& ip, int port, bool peer) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return false;
  std::string got_ip;
  int got_port = -1;
  return IpAndPort(addr, len, &got_ip, &got_port) && got_port == port && got_ip == ip;
}

}  // namespace

int FindConnectionSocket(const std::string& local_ip, int local_port, const std::string& remote_ip,
                         int remote_port) {
  if (local_port < 0 || remote_port < 0) return -1;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    // The peer first: a listening socket or another client fails it cheaply.
    if (Matches(static_cast<int>(fd), remote_ip, remote_port, /*peer=*/true) &&
        Matches(static_cast<int>(fd), local_ip, local_port, /*peer=*/false)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool PeerClosed(int socket) {
  if (socket < 0) return false;
  pollfd p{socket, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;  // nothing to report (or EINTR): still open
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  // Readable: either bytes (a pipelined request: open) or the end of the
  // stream (closed). Peek so httplib still reads any bytes itself.
  char byte;
  const ssize_t n = recv(socket, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace kvq
