// Has the client of an HTTP request gone away? The handler knows its
// connection's socket (HttpExchange::socket) and asks the kernel whether the
// peer has closed it, the way uvicorn's is_disconnected() sees the end of
// the stream.
#pragma once

namespace kvq {

// True when the peer has closed the connection (end of stream or a socket
// error); false while it is open, including when it has sent more bytes
// (a pipelined request). Never blocks, never reads. -1 is never closed.
bool PeerClosed(int socket);

}  // namespace kvq
