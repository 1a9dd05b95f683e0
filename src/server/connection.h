// Has the client of an HTTP request gone away? cpp-httplib 0.11 (Debian 12's)
// gives a handler neither its socket nor a closed-connection check (later
// releases added Request::is_connection_closed), and its DataSink's
// is_writable() only asks whether a write would block, which stays true
// after the peer has closed. So the server finds the request's socket by its
// address pair (the kernel's one connection with these four values) and
// asks the kernel whether the peer has closed it, the way uvicorn's
// is_disconnected() sees the end of the stream.
#pragma once

#include <string>

namespace kvq {

// The open TCP socket of this process whose local and peer addresses are
// these (numeric IPs as getnameinfo prints them, the form httplib's Request
// carries), or -1 if there is none. Scans the process's descriptors
// (/proc/self/fd): microseconds for a few hundred, once per request. The
// answer stays valid while the caller's connection is open, i.e. for the
// whole handler and its content provider.
int FindConnectionSocket(const std::string& local_ip, int local_port, const std::string& remote_ip,
                         int remote_port);

// True when the peer has closed the connection (end of stream or a socket
// error); false while it is open, including when it has sent more bytes
// (a pipelined request). Never blocks, never reads. -1 is never closed.
bool PeerClosed(int socket);

}  // namespace kvq
