// A minimal HTTP/1.1 client over raw loopback sockets for the server tests:
// it sends exactly the bytes a test writes (malformed ones included) and
// reads one response, framed by Content-Length, chunked coding or close.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <map>
#include <string>

namespace kvq {

inline int RawConnect(int port, int timeout_seconds = 30) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  timeval timeout{timeout_seconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  return fd;
}

inline bool RawSend(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

struct RawResponse {
  int status = -1;                             // -1: no response (closed or timed out first)
  std::map<std::string, std::string> headers;  // lowercased names
  std::string body;
  bool chunked = false;
};

// Reads one response from `fd`; `buffer` keeps bytes past it (pipelining).
inline RawResponse RawRead(int fd, std::string* buffer, bool head_request = false) {
  RawResponse r;
  auto fill = [&]() {
    char data[16384];
    const ssize_t n = recv(fd, data, sizeof(data), 0);
    if (n <= 0) return false;
    buffer->append(data, static_cast<size_t>(n));
    return true;
  };
  size_t end;
  while (true) {
    end = buffer->find("\r\n\r\n");
    if (end != std::string::npos) {
      const std::string status_line = buffer->substr(0, buffer->find("\r\n"));
      // Skip interim 1xx responses (100 Continue).
      if (status_line.size() > 9 && status_line[9] == '1') {
        buffer->erase(0, end + 4);
        continue;
      }
      break;
    }
    if (!fill()) return r;
  }
  const std::string head = buffer->substr(0, end + 2);
  buffer->erase(0, end + 4);
  size_t line_end = head.find("\r\n");
  if (head.size() < 12) return r;
  r.status = std::atoi(head.substr(9, 3).c_str());
  while (line_end + 2 < head.size()) {
    const size_t next = head.find("\r\n", line_end + 2);
    const std::string line = head.substr(line_end + 2, next - line_end - 2);
    const size_t colon = line.find(':');
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    size_t v = colon + 1;
    while (v < line.size() && line[v] == ' ') ++v;
    r.headers[name] = line.substr(v);
    line_end = next;
  }
  if (head_request) return r;
  if (r.headers.count("content-length")) {
    const size_t length = std::stoul(r.headers["content-length"]);
    while (buffer->size() < length && fill()) {
    }
    r.body = buffer->substr(0, length);
    buffer->erase(0, std::min(length, buffer->size()));
  } else if (r.headers.count("transfer-encoding") && r.headers["transfer-encoding"] == "chunked") {
    r.chunked = true;
    while (true) {
      size_t nl;
      while ((nl = buffer->find("\r\n")) == std::string::npos && fill()) {
      }
      if (nl == std::string::npos) return r;
      const size_t size = std::stoul(buffer->substr(0, nl), nullptr, 16);
      while (buffer->size() < nl + 2 + size + 2 && fill()) {
      }
      if (buffer->size() < nl + 2 + size + 2) return r;
      r.body += buffer->substr(nl + 2, size);
      buffer->erase(0, nl + 2 + size + 2);
      if (size == 0) break;
    }
  } else {
    while (fill()) {
    }
    r.body = *buffer;
    buffer->clear();
  }
  return r;
}

// One request on a fresh connection.
inline RawResponse RawExchange(int port, const std::string& request) {
  const int fd = RawConnect(port);
  if (fd < 0) return {};
  std::string buffer;
  RawResponse r;
  if (RawSend(fd, request)) r = RawRead(fd, &buffer, request.rfind("HEAD ", 0) == 0);
  close(fd);
  return r;
}

// True when the peer closed the connection (reads EOF within the timeout).
inline bool RawClosed(int fd) {
  char byte;
  while (true) {
    const ssize_t n = recv(fd, &byte, 1, 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

inline std::string JsonPost(
    const std::string& path, const std::string& body,
    const std::string& extra_headers = "Content-Type: application/json\r\n") {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace kvq
