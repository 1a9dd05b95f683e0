// The request framing rules, each test naming the RFC 9110 / RFC 9112 rule
// it checks. Every input is fed whole and one byte at a time: the reader
// must give the same answer however the bytes arrive.
#include "server/http1.h"

#include <gtest/gtest.h>

#include <string>

namespace kvq {
namespace {

using State = HttpRequestReader::State;

struct Parsed {
  State state = State::kNeedMore;
  int status = 0;
  std::vector<HttpRequest> requests;
};

// Feeds `input` in pieces of `step` bytes (0 = all at once), taking every
// whole request, until an error or the end of the input.
Parsed Parse(const std::string& input, size_t step = 0, HttpLimits limits = HttpLimits{}) {
  HttpRequestReader reader(limits);
  Parsed out;
  size_t at = 0;
  State s = State::kNeedMore;
  while (true) {
    if (s == State::kComplete) {
      out.requests.push_back(reader.TakeRequest());
      s = reader.Resume();
      continue;
    }
    if (s == State::kHeadComplete) {
      s = reader.Resume();
      continue;
    }
    if (s == State::kError || at >= input.size()) break;
    const size_t n = step == 0 ? input.size() - at : std::min(step, input.size() - at);
    s = reader.Feed(input.data() + at, n);
    at += n;
  }
  out.state = s;
  out.status = s == State::kError ? reader.error_status() : 0;
  return out;
}

// Same outcome whole and byte by byte.
Parsed ParseBoth(const std::string& input, HttpLimits limits = HttpLimits{}) {
  const Parsed whole = Parse(input, 0, limits);
  const Parsed bytes = Parse(input, 1, limits);
  EXPECT_EQ(whole.status, bytes.status) << input.substr(0, 200);
  EXPECT_EQ(whole.requests.size(), bytes.requests.size()) << input.substr(0, 200);
  for (size_t i = 0; i < std::min(whole.requests.size(), bytes.requests.size()); ++i) {
    EXPECT_EQ(whole.requests[i].body, bytes.requests[i].body);
    EXPECT_EQ(whole.requests[i].target, bytes.requests[i].target);
  }
  return whole;
}

int ErrorOf(const std::string& input, HttpLimits limits = HttpLimits{}) {
  return ParseBoth(input, limits).status;
}

TEST(Http1Test, SimpleGet) {
  const Parsed p = ParseBoth("GET /health?x=1 HTTP/1.1\r\nHost: a\r\nX-Y:  v w \r\n\r\n");
  ASSERT_EQ(p.requests.size(), 1u);
  const HttpRequest& r = p.requests[0];
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.path, "/health");
  EXPECT_EQ(r.target, "/health?x=1");
  EXPECT_EQ(r.Header("x-y"), "v w");  // OWS trimmed (RFC 9110 §5.5)
  EXPECT_EQ(r.Header("X-Y"), "v w");  // names are case-insensitive (RFC 9110 §5.1)
  EXPECT_TRUE(r.keep_alive);
  EXPECT_TRUE(r.body.empty());
}

// RFC 9112 §9.3: HTTP/1.1 persists unless "close"; HTTP/1.0 only with
// "keep-alive".
TEST(Http1Test, PersistenceRules) {
  EXPECT_FALSE(ParseBoth("GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                   .requests.at(0)
                   .keep_alive);
  EXPECT_FALSE(ParseBoth("GET / HTTP/1.0\r\n\r\n").requests.at(0).keep_alive);
  EXPECT_TRUE(
      ParseBoth("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").requests.at(0).keep_alive);
  EXPECT_TRUE(ParseBoth("GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, bar\r\n\r\n")
                  .requests.at(0)
                  .keep_alive);
}

// RFC 9112 §3.2: an HTTP/1.1 request without Host, or with two, is 400.
TEST(Http1Test, HostIsRequiredOnceIn11) {
  EXPECT_EQ(ErrorOf("GET / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("GET / HTTP/1.0\r\n\r\n"), 0);  // HTTP/1.0 clients need not send it
}

// RFC 9112 §6.2 / §6.3 rule 5-6: Content-Length frames the body; without it
// (and without Transfer-Encoding) a request has no body.
TEST(Http1Test, ContentLengthFramesTheBody) {
  const Parsed p = ParseBoth(
      "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\n"
      "Host: a\r\n\r\n");
  ASSERT_EQ(p.requests.size(), 2u);  // pipelined (RFC 9112 §9.3.2), in order
  EXPECT_EQ(p.requests[0].body, "hello");
  EXPECT_EQ(p.requests[1].path, "/b");
  const Parsed none = ParseBoth("POST /a HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_EQ(none.requests.size(), 1u);
  EXPECT_EQ(none.requests[0].body, "");
  // Repeated identical values are one value (RFC 9110 §8.6).
  EXPECT_EQ(
      ParseBoth("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 2\r\n\r\nok").requests.at(0).body,
      "ok");
}

// RFC 9112 §6.3 rule 5: an invalid or conflicting Content-Length is 400.
TEST(Http1Test, InvalidContentLength) {
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"),
            400);
}

// RFC 9110 §15.5.14: a body over the limit is 413, decided from the
// Content-Length before any of the body is read.
TEST(Http1Test, ContentLengthOverLimitIs413AtOnce) {
  HttpLimits limits;
  limits.max_body_bytes = 100;
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n", limits), 413);
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999999\r\n\r\n",
                    limits),
            413);
  EXPECT_EQ(
      ParseBoth("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n" + std::string(100, 'x'),
                limits)
          .requests.size(),
      1u);
}

// RFC 9112 §7.1: chunked coding, with extensions (ignored) and a trailer
// section (discarded, RFC 9112 §7.1.2).
TEST(Http1Test, ChunkedBody) {
  const Parsed p = ParseBoth(
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n");
  ASSERT_EQ(p.requests.size(), 1u);
  EXPECT_EQ(p.requests[0].body, "hello world");
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "5\r\nhelloXX\r\n0\r\n\r\n"),
            400);  // chunk data longer than its size
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"), 400);
}

// Issue 21, failure 1: a chunked body is bounded like any other: 413 as
// soon as the decoded size crosses the limit, from the chunk size alone.
TEST(Http1Test, ChunkedOverLimitIs413WhenCrossed) {
  HttpLimits limits;
  limits.max_body_bytes = 1000;
  const std::string head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
  // One huge chunk: refused at its size line, before its data.
  EXPECT_EQ(ErrorOf(head + "FFFFFFFF\r\n", limits), 413);
  EXPECT_EQ(ErrorOf(head + "FFFFFFFFFFFFFFFFFFFFFFFF\r\n", limits), 413);
  // Many small chunks: refused at the chunk that crosses the limit.
  HttpRequestReader reader(limits);
  State s = reader.Feed(head.data(), head.size());
  ASSERT_EQ(s, State::kHeadComplete);
  s = reader.Resume();
  size_t fed = 0;
  const std::string chunk = "64\r\n" + std::string(100, 'x') + "\r\n";
  while (s == State::kNeedMore && fed < 100000) {
    s = reader.Feed(chunk.data(), chunk.size());
    fed += 100;
  }
  EXPECT_EQ(s, State::kError);
  EXPECT_EQ(reader.error_status(), 413);
  EXPECT_EQ(fed, 1100u);  // the 11th chunk crosses 1000 bytes
  EXPECT_LE(reader.request().body.size(), 1000u);
}

// RFC 9112 §6.1 / §6.3 rules 3-4: Transfer-Encoding with Content-Length is
// refused (request smuggling), a final coding other than chunked is 400, an
// unknown coding 501, and Transfer-Encoding in HTTP/1.0 is faulty framing.
TEST(Http1Test, TransferEncodingRules) {
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
                    "Content-Length: 3\r\n\r\n0\r\n\r\n"),
            400);
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), 501);
  EXPECT_EQ(ErrorOf("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n"),
            0);  // codings are case-insensitive (RFC 9112 §7)
}

// RFC 9112 §3: request-line = method SP request-target SP HTTP-version.
TEST(Http1Test, RequestLine) {
  EXPECT_EQ(ErrorOf("GET  / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("GET / HTTP/1.1 x\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("G(T / HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("GET / HTTX/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("GET / HTTP/2.0\r\nHost: a\r\n\r\n"), 505);  // RFC 9110 §15.6.6
  EXPECT_EQ(ErrorOf("GET nopath HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("GET /a\x01 HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
  // absolute-form must be accepted (RFC 9112 §3.2.2).
  EXPECT_EQ(ParseBoth("GET http://h:1/v1/models?x HTTP/1.1\r\nHost: h\r\n\r\n").requests.at(0).path,
            "/v1/models");
  // HTTP/1.2 is served as 1.1 (RFC 9110 §6.2).
  EXPECT_EQ(ParseBoth("GET / HTTP/1.2\r\nHost: a\r\n\r\n").requests.at(0).minor_version, 1);
  // Empty lines before the request line are ignored (RFC 9112 §2.2); so is
  // a bare LF as a line end.
  EXPECT_EQ(ParseBoth("\r\n\r\nGET / HTTP/1.1\nHost: a\n\n").requests.size(), 1u);
}

// RFC 9112 §5.1: no whitespace between field name and colon; §5.2: obs-fold
// is rejected; RFC 9110 §5.5: CR, LF and NUL are invalid in values; RFC 9112
// §2.2: a bare CR is invalid.
TEST(Http1Test, FieldSyntax) {
  EXPECT_EQ(ErrorOf("GET / HTTP/1.1\r\nHost : a\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n  folded\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf(std::string("GET / HTTP/1.1\r\nHost: a\r\nX: a\0b\r\n\r\n", 35)), 400);
  EXPECT_EQ(ErrorOf("GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n"), 400);
  EXPECT_EQ(ErrorOf("GET / HTTP/1.1\r\nHost: a\r\nno colon\r\n\r\n"), 400);
}

// RFC 9112 §3 (414 for a long target) and RFC 6585 §5 (431 for a large
// header section); both decided while the bytes still arrive, never by
// buffering an unbounded line first.
TEST(Http1Test, HeadLimits) {
  HttpLimits limits;
  EXPECT_EQ(ErrorOf("GET /" + std::string(limits.max_target_bytes + 1, 'a') +
                    " HTTP/1.1\r\nHost: a\r\n\r\n"),
            414);
  std::string many = "GET / HTTP/1.1\r\nHost: a\r\n";
  for (size_t i = 0; i < limits.max_fields; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  EXPECT_EQ(ErrorOf(many + "\r\n"), 431);
  EXPECT_EQ(ErrorOf("GET / HTTP/1.1\r\nHost: a\r\nX: " + std::string(limits.max_head_bytes, 'v') +
                    "\r\n\r\n"),
            431);
  // A header line that never ends is refused once it passes the limit:
  // the reader holds at most the limit plus one read.
  HttpRequestReader reader(limits);
  const std::string start = "GET / HTTP/1.1\r\nX: ";
  reader.Feed(start.data(), start.size());
  const std::string piece(4096, 'v');
  State s = State::kNeedMore;
  size_t fed = 0;
  while (s == State::kNeedMore && fed < (size_t{100} << 20)) {
    s = reader.Feed(piece.data(), piece.size());
    fed += piece.size();
  }
  EXPECT_EQ(s, State::kError);
  EXPECT_EQ(reader.error_status(), 431);
  EXPECT_LE(fed, limits.max_head_bytes + piece.size());
  // A request line that never ends: 414.
  HttpRequestReader line_reader(limits);
  s = line_reader.Feed("GET /", 5);
  fed = 0;
  while (s == State::kNeedMore && fed < (size_t{100} << 20)) {
    s = line_reader.Feed(piece.data(), piece.size());
    fed += piece.size();
  }
  EXPECT_EQ(line_reader.error_status(), 414);
}

// RFC 9110 §10.1.1: "Expect: 100-continue" is recognized; any other
// expectation may be refused with 417.
TEST(Http1Test, Expect) {
  HttpRequestReader reader{HttpLimits{}};
  const std::string head =
      "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
  EXPECT_EQ(reader.Feed(head.data(), head.size()), State::kHeadComplete);
  EXPECT_TRUE(reader.request().expect_continue);
  EXPECT_EQ(reader.Feed("ok", 2), State::kComplete);
  EXPECT_EQ(ErrorOf("POST / HTTP/1.1\r\nHost: a\r\nExpect: tea\r\n\r\n"), 417);
}

// Found by fuzz/http_request_fuzz: a request line over the limit gave 400
// when it arrived whole and 414 when split. The answer is 414 either way.
TEST(Http1Test, LongRequestLineIs414HoweverSplit) {
  HttpLimits limits;
  limits.max_target_bytes = 256;
  EXPECT_EQ(ErrorOf("GET" + std::string(400, '\t') + "p,alive\r\n\r\n", limits), 414);
  EXPECT_EQ(ErrorOf(std::string(340, '\0') + "\n", limits), 414);
}

}  // namespace
}  // namespace kvq
