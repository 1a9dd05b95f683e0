// HTTP/1.1 request framing (RFC 9112) as a pure byte-stream parser, apart
// from any socket so it can be unit-tested and fuzzed on raw bytes. It is
// bounded everywhere: the request line, the header section, the number of
// fields, every chunk-size line and the body all have limits, checked as
// bytes arrive, so no input makes it hold more than the limits allow.
//
// cpp-httplib 0.11 (Debian 12's) reads a header line or a chunked body into
// memory without limit and reads a body without framing until the peer
// closes; the server therefore parses requests itself with this reader.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvq {

struct HttpLimits {
  size_t max_target_bytes = 8 << 10;  // request-target; longer: 414
  size_t max_head_bytes = 64 << 10;   // request line + header section; larger: 431
  size_t max_fields = 100;            // header (and trailer) fields; more: 431
  size_t max_body_bytes = 8 << 20;    // decoded body; larger: 413
};

struct HttpRequest {
  std::string method;
  std::string target;     // as sent
  std::string path;       // target without the query
  int minor_version = 1;  // HTTP/1.0 or HTTP/1.1
  // Field names lowercased (they are case-insensitive, RFC 9110 §5.1);
  // values without surrounding whitespace.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  bool keep_alive = true;        // the connection persists after the response (RFC 9112 §9.3)
  bool expect_continue = false;  // "Expect: 100-continue" with a body to come

  // The field's value ("" when absent); repeated fields joined by ", ".
  std::string Header(std::string_view name) const;
  bool HasHeader(std::string_view name) const;
};

// Reads one request at a time from the bytes of a connection.
class HttpRequestReader {
 public:
  enum class State {
    kNeedMore,      // feed more bytes
    kHeadComplete,  // the head is parsed and valid; the body (if any) follows
    kComplete,      // request() is whole; leftover bytes belong to the next one
    kError,         // error_status()/error_message(); the connection must close
  };

  explicit HttpRequestReader(const HttpLimits& limits) : limits_(limits) {}

  // Appends bytes; returns the new state. kHeadComplete is returned once per
  // request (the caller may answer 100 Continue), then feeding goes on.
  State Feed(const char* data, size_t size);
  // Continues with bytes already buffered (pipelined requests, or after
  // kHeadComplete) without new input.
  State Resume() { return Feed(nullptr, 0); }

  State state() const { return state_; }
  const HttpRequest& request() const { return request_; }
  HttpRequest TakeRequest();  // kComplete only; then starts the next request
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }
  // Bytes received but not yet consumed (the start of the next request).
  size_t buffered() const { return buffer_.size() - pos_; }
  // True once any byte of the current request has arrived.
  bool started() const { return started_; }

 private:
  enum class Phase { kHead, kBodyLength, kChunkSize, kChunkData, kChunkDataEnd, kTrailer, kDone };

  State Fail(int status, std::string message);
  State ParseHead(std::string_view head);
  State Framing();  // body length and connection rules from the parsed fields
  State ContinueBody();
  State ChunkSizeLine(std::string_view line);
  bool NextLine(std::string_view* line, size_t max_line, bool* too_long);
  void Compact();

  HttpLimits limits_;
  State state_ = State::kNeedMore;
  Phase phase_ = Phase::kHead;
  std::string buffer_;
  size_t pos_ = 0;   // start of unconsumed bytes in buffer_
  size_t scan_ = 0;  // where the search for the end of the head resumes
  bool started_ = false;
  HttpRequest request_;
  uint64_t remaining_ = 0;  // body bytes (Content-Length) or chunk bytes still to come
  size_t trailer_fields_ = 0;
  size_t trailer_bytes_ = 0;
  int error_status_ = 0;
  std::string error_message_;
};

// Reason phrase for a status code ("OK", "Not Found", ...).
const char* HttpReason(int status);

}  // namespace kvq
