#include "server/connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

namespace kvq {

bool PeerClosed(int socket) {
  if (socket < 0) return false;
  pollfd p{socket, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;  // nothing to report (or EINTR): still open
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  // Readable: either bytes (a pipelined request: open) or the end of the
  // stream (closed). Peek so the listener still reads them itself.
  char byte;
  const ssize_t n = recv(socket, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

}  // namespace kvq
