#include "server/http1.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace kvq {
namespace {

// Chunk-size lines carry at most a size and short extensions.
constexpr size_t kMaxChunkLine = 4096;

// tchar (RFC 9110 §5.6.2): the characters of a token (methods, field names).
bool IsTokenChar(unsigned char c) {
  if (std::isalnum(c)) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return IsTokenChar(c); });
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The comma-separated elements of a list field (RFC 9110 §5.6.1), trimmed,
// empty elements dropped.
std::vector<std::string> ListElements(std::string_view value) {
  std::vector<std::string> out;
  while (true) {
    const size_t comma = value.find(',');
    const std::string_view item = Trim(value.substr(0, comma));
    if (!item.empty()) out.push_back(Lower(item));
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return out;
}

// Field values may hold visible characters, spaces, tabs and obs-text;
// CR, LF, NUL and other controls are invalid (RFC 9110 §5.5).
bool ValidFieldValue(std::string_view v) {
  for (unsigned char c : v) {
    if (c == '\t') continue;
    if (c < 0x20 || c == 0x7f) return false;
  }
  return true;
}

}  // namespace

std::string HttpRequest::Header(std::string_view name) const {
  const std::string key = Lower(name);
  std::string out;
  bool found = false;
  for (const auto& [k, v] : headers) {
    if (k != key) continue;
    if (found) out += ", ";
    out += v;
    found = true;
  }
  return out;
}

bool HttpRequest::HasHeader(std::string_view name) const {
  const std::string key = Lower(name);
  return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return h.first == key; });
}

HttpRequestReader::State HttpRequestReader::Fail(int status, std::string message) {
  error_status_ = status;
  error_message_ = std::move(message);
  phase_ = Phase::kDone;
  return state_ = State::kError;
}

void HttpRequestReader::Compact() {
  if (pos_ == 0) return;
  buffer_.erase(0, pos_);
  scan_ = scan_ > pos_ ? scan_ - pos_ : 0;
  pos_ = 0;
}

HttpRequest HttpRequestReader::TakeRequest() {
  HttpRequest out = std::move(request_);
  request_ = HttpRequest{};
  phase_ = Phase::kHead;
  state_ = State::kNeedMore;
  trailer_fields_ = trailer_bytes_ = 0;
  Compact();
  scan_ = 0;
  started_ = buffered() > 0;
  return out;
}

bool HttpRequestReader::NextLine(std::string_view* line, size_t max_line, bool* too_long) {
  *too_long = false;
  const size_t nl = buffer_.find('\n', pos_);
  if (nl == std::string::npos) {
    *too_long = buffered() > max_line;
    return false;
  }
  size_t end = nl;
  if (end > pos_ && buffer_[end - 1] == '\r') --end;  // CRLF, or a bare LF (RFC 9112 §2.2)
  *line = std::string_view(buffer_).substr(pos_, end - pos_);
  if (line->size() > max_line) {
    *too_long = true;
    return false;
  }
  pos_ = nl + 1;
  return true;
}

namespace {

// "HTTP/1.1" -> 1; -1 malformed; -2 another major version.
int ParseVersion(std::string_view v) {
  if (v.size() != 8 || v.substr(0, 5) != "HTTP/" ||
      !std::isdigit(static_cast<unsigned char>(v[5])) || v[6] != '.' ||
      !std::isdigit(static_cast<unsigned char>(v[7]))) {
    return -1;
  }
  if (v[5] != '1') return -2;
  return v[7] - '0';
}

}  // namespace

HttpRequestReader::State HttpRequestReader::ParseHead(std::string_view head) {
  // The same bound Feed applies while the request line arrives, so the
  // answer does not depend on how the bytes were split.
  if (std::min(head.find('\n'), head.size()) > limits_.max_target_bytes + 64) {
    return Fail(414, "the request target is longer than " +
                         std::to_string(limits_.max_target_bytes) + " bytes");
  }
  // Lines end in CRLF or a bare LF (RFC 9112 §2.2); a CR anywhere else is
  // invalid. The head ends with its empty line, which is dropped here.
  std::vector<std::string_view> lines;
  while (!head.empty()) {
    const size_t nl = head.find('\n');
    std::string_view line = head.substr(0, nl);
    head.remove_prefix(nl == std::string_view::npos ? head.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find('\r') != std::string_view::npos) {
      return Fail(400, "a bare CR in the request head (RFC 9112 §2.2)");
    }
    lines.push_back(line);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return Fail(400, "an empty request");

  // request-line = method SP request-target SP HTTP-version (RFC 9112 §3).
  const std::string_view line = lines[0];
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Fail(400, "malformed request line (expected 'METHOD TARGET HTTP/1.1')");
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const int minor = ParseVersion(line.substr(sp2 + 1));
  if (!IsToken(method)) return Fail(400, "malformed request method");
  if (minor == -2) return Fail(505, "only HTTP/1.0 and HTTP/1.1 are supported");
  if (minor < 0) return Fail(400, "malformed HTTP version");
  if (target.size() > limits_.max_target_bytes) {
    return Fail(414, "the request target is longer than " +
                         std::to_string(limits_.max_target_bytes) + " bytes");
  }
  for (unsigned char c : target) {
    if (c <= 0x20 || c >= 0x7f) return Fail(400, "invalid character in the request target");
  }
  request_.method = std::string(method);
  request_.target = std::string(target);
  request_.minor_version = std::min(minor, 1);  // HTTP/1.x, x > 1: as 1.1 (RFC 9110 §6.2)
  // origin-form "/path?query", absolute-form "http://host/path" (RFC 9112
  // §3.2.2: servers must accept it), asterisk-form "*" (OPTIONS).
  std::string_view path = target;
  if (const size_t scheme = path.find("://"); scheme != std::string_view::npos && path[0] != '/') {
    const size_t slash = path.find('/', scheme + 3);
    path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
  } else if (path != "*" && (path.empty() || path[0] != '/')) {
    return Fail(400, "the request target must be a path starting with '/'");
  }
  request_.path = std::string(path.substr(0, path.find('?')));

  for (size_t i = 1; i < lines.size(); ++i) {
    const std::string_view field = lines[i];
    if (field.front() == ' ' || field.front() == '\t') {
      return Fail(400, "obsolete line folding in a header field (RFC 9112 §5.2)");
    }
    const size_t colon = field.find(':');
    if (colon == std::string_view::npos || !IsToken(field.substr(0, colon))) {
      return Fail(400,
                  "malformed header field (no whitespace is allowed before ':', "
                  "RFC 9112 §5.1)");
    }
    const std::string_view value = Trim(field.substr(colon + 1));
    if (!ValidFieldValue(value)) return Fail(400, "invalid character in a header field value");
    if (request_.headers.size() >= limits_.max_fields) {
      return Fail(431, "more than " + std::to_string(limits_.max_fields) + " header fields");
    }
    request_.headers.emplace_back(Lower(field.substr(0, colon)), std::string(value));
  }
  return Framing();
}

HttpRequestReader::State HttpRequestReader::Framing() {
  HttpRequest& r = request_;
  size_t hosts = 0;
  for (const auto& h : r.headers) hosts += h.first == "host";
  if (r.minor_version == 1 ? hosts != 1 : hosts > 1) {
    return Fail(400, "an HTTP/1.1 request needs exactly one Host field (RFC 9112 §3.2)");
  }
  const std::vector<std::string> connection = ListElements(r.Header("connection"));
  auto has = [&](const char* token) {
    return std::find(connection.begin(), connection.end(), token) != connection.end();
  };
  r.keep_alive = r.minor_version == 1 ? !has("close") : has("keep-alive");

  const bool has_te = r.HasHeader("transfer-encoding");
  const bool has_cl = r.HasHeader("content-length");
  bool chunked = false;
  if (has_te) {
    if (r.minor_version == 0) {
      return Fail(400, "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 §6.1)");
    }
    if (has_cl) {
      return Fail(400,
                  "both Transfer-Encoding and Content-Length (RFC 9112 §6.3: a possible "
                  "request smuggling attempt)");
    }
    const std::vector<std::string> codings = ListElements(r.Header("transfer-encoding"));
    if (codings.empty() || codings.back() != "chunked") {
      return Fail(400, "Transfer-Encoding must end with chunked (RFC 9112 §6.3)");
    }
    if (codings.size() > 1) {
      return Fail(501, "transfer coding '" + codings[0] + "' is not supported (only chunked)");
    }
    chunked = true;
  }
  uint64_t length = 0;
  if (has_cl) {
    // 1*DIGIT; repeated or listed values must all agree (RFC 9110 §8.6,
    // RFC 9112 §6.3).
    bool first = true;
    for (const std::string& v : ListElements(r.Header("content-length"))) {
      if (v.empty() ||
          !std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return Fail(400, "invalid Content-Length '" + v + "'");
      }
      const std::string digits = v.substr(std::min(v.find_first_not_of('0'), v.size()));
      const uint64_t value = digits.size() > 18 ? UINT64_MAX : std::stoull("0" + digits);
      if (!first && value != length) return Fail(400, "conflicting Content-Length values");
      length = value;
      first = false;
    }
    if (first) return Fail(400, "empty Content-Length");
    if (length > limits_.max_body_bytes) {
      return Fail(413,
                  "the request body (" +
                      (length == UINT64_MAX ? std::string("over 10^18") : std::to_string(length)) +
                      " bytes) is larger than the server's limit of " +
                      std::to_string(limits_.max_body_bytes) + " bytes");
    }
  }
  const std::string expect = Lower(r.Header("expect"));
  if (!expect.empty() && expect != "100-continue") {
    return Fail(417, "unsupported expectation '" + expect + "'");
  }
  // Without Content-Length or Transfer-Encoding a request has no body
  // (RFC 9112 §6.3 rule 6).
  if (chunked) {
    phase_ = Phase::kChunkSize;
  } else if (length > 0) {
    phase_ = Phase::kBodyLength;
    remaining_ = length;
    r.body.reserve(static_cast<size_t>(length));
  } else {
    phase_ = Phase::kDone;
  }
  r.expect_continue = phase_ != Phase::kDone && !expect.empty() && r.minor_version == 1;
  return State::kNeedMore;
}

HttpRequestReader::State HttpRequestReader::ChunkSizeLine(std::string_view line) {
  // chunk = chunk-size [ chunk-ext ] CRLF (RFC 9112 §7.1); extensions are
  // ignored, as the RFC allows.
  const std::string_view size = Trim(line.substr(0, line.find(';')));
  if (size.empty() || !std::all_of(size.begin(), size.end(), [](char c) {
        return std::isxdigit(static_cast<unsigned char>(c));
      })) {
    return Fail(400, "malformed chunk size in the chunked request body (RFC 9112 §7.1)");
  }
  const std::string_view digits = size.substr(std::min(size.find_first_not_of('0'), size.size()));
  // At most 15 hex digits fit; more is a size no limit allows.
  uint64_t chunk = digits.size() > 15 ? UINT64_MAX : 0;
  for (char c : digits.size() > 15 ? std::string_view() : digits) {
    const int lower = std::tolower(static_cast<unsigned char>(c));
    chunk = chunk * 16 + static_cast<uint64_t>(lower <= '9' ? lower - '0' : lower - 'a' + 10);
  }
  if (chunk == 0) {
    phase_ = Phase::kTrailer;
    return State::kNeedMore;
  }
  if (chunk > limits_.max_body_bytes - request_.body.size()) {
    return Fail(413, "the chunked request body is larger than the server's limit of " +
                         std::to_string(limits_.max_body_bytes) + " bytes");
  }
  remaining_ = chunk;
  phase_ = Phase::kChunkData;
  return State::kNeedMore;
}

HttpRequestReader::State HttpRequestReader::ContinueBody() {
  while (true) {
    switch (phase_) {
      case Phase::kHead:
      case Phase::kDone:
        return state_ = phase_ == Phase::kDone ? State::kComplete : State::kNeedMore;
      case Phase::kBodyLength:
      case Phase::kChunkData: {
        const size_t take = static_cast<size_t>(std::min<uint64_t>(remaining_, buffered()));
        request_.body.append(buffer_, pos_, take);
        pos_ += take;
        remaining_ -= take;
        if (remaining_ > 0) return state_ = State::kNeedMore;
        phase_ = phase_ == Phase::kBodyLength ? Phase::kDone : Phase::kChunkDataEnd;
        break;
      }
      case Phase::kChunkDataEnd:
      case Phase::kChunkSize:
      case Phase::kTrailer: {
        std::string_view line;
        bool too_long = false;
        if (!NextLine(&line, kMaxChunkLine, &too_long)) {
          if (too_long) return Fail(400, "a chunk-size or trailer line is too long");
          return state_ = State::kNeedMore;
        }
        if (line.find('\r') != std::string_view::npos) {
          return Fail(400, "a bare CR in the chunked request body (RFC 9112 §2.2)");
        }
        if (phase_ == Phase::kChunkDataEnd) {
          if (!line.empty()) return Fail(400, "chunk data longer than its chunk size");
          phase_ = Phase::kChunkSize;
        } else if (phase_ == Phase::kChunkSize) {
          if (ChunkSizeLine(line) == State::kError) return state_;
        } else if (line.empty()) {
          phase_ = Phase::kDone;
        } else {
          // Trailer fields are read and discarded (RFC 9112 §7.1.2), bounded
          // like the header section.
          trailer_bytes_ += line.size();
          if (++trailer_fields_ > limits_.max_fields || trailer_bytes_ > limits_.max_head_bytes) {
            return Fail(431, "the trailer section of the chunked body is too large");
          }
          if (line.find(':') == std::string_view::npos) {
            return Fail(400, "malformed trailer field in the chunked request body");
          }
        }
        break;
      }
    }
  }
}

HttpRequestReader::State HttpRequestReader::Feed(const char* data, size_t size) {
  if (state_ == State::kError || state_ == State::kComplete) return state_;
  if (size > 0) {
    // Consumed bytes are dropped before more arrive, so the buffer holds at
    // most the unconsumed part of a head (bounded below) plus one read.
    if (pos_ > 0 && pos_ == buffer_.size()) {
      buffer_.clear();
      pos_ = scan_ = 0;
    } else if (pos_ > (64 << 10)) {
      Compact();
    }
    buffer_.append(data, size);
    started_ = true;
  }
  if (phase_ == Phase::kHead) {
    // Empty lines before the request line are ignored (RFC 9112 §2.2).
    while (true) {
      if (buffer_.compare(pos_, 1, "\n") == 0) {
        pos_ += 1;
      } else if (buffer_.compare(pos_, 2, "\r\n") == 0) {
        pos_ += 2;
      } else {
        break;
      }
      if (pos_ > limits_.max_head_bytes) return Fail(431, "the request head is too large");
    }
    scan_ = std::max(scan_, pos_);
    // The head ends at the first empty line: "\n\n" or "\n\r\n".
    size_t end = std::string::npos;
    for (size_t i = buffer_.find('\n', scan_); i != std::string::npos;
         i = buffer_.find('\n', i + 1)) {
      if (i + 1 < buffer_.size() && buffer_[i + 1] == '\n') {
        end = i + 2;
        break;
      }
      if (i + 2 < buffer_.size() && buffer_[i + 1] == '\r' && buffer_[i + 2] == '\n') {
        end = i + 3;
        break;
      }
      if (i + 2 >= buffer_.size()) break;  // the terminator may be split across reads
    }
    if (end == std::string::npos) {
      scan_ = buffer_.size() >= 2 ? buffer_.size() - 2 : 0;
      scan_ = std::max(scan_, pos_);
      const size_t pending = buffered();
      const size_t line_end = buffer_.find('\n', pos_);
      const size_t first_line = (line_end == std::string::npos ? buffer_.size() : line_end) - pos_;
      if (first_line > limits_.max_target_bytes + 64) {
        return Fail(414, "the request target is longer than " +
                             std::to_string(limits_.max_target_bytes) + " bytes");
      }
      if (pending > limits_.max_head_bytes) {
        return Fail(431, "the request head (request line and header fields) is larger than " +
                             std::to_string(limits_.max_head_bytes) + " bytes");
      }
      return state_ = State::kNeedMore;
    }
    if (end - pos_ > limits_.max_head_bytes) {
      return Fail(431, "the request head (request line and header fields) is larger than " +
                           std::to_string(limits_.max_head_bytes) + " bytes");
    }
    const std::string head = buffer_.substr(pos_, end - pos_);
    pos_ = end;
    if (ParseHead(head) == State::kError) return state_;
    if (phase_ == Phase::kDone) return state_ = State::kComplete;
    return state_ = State::kHeadComplete;
  }
  return ContinueBody();
}

const char* HttpReason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

}  // namespace kvq
