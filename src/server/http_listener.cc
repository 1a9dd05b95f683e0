#include "server/http_listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace kvq {
namespace {

using Clock = std::chrono::steady_clock;

// After an error response the connection is shut for writing and what the
// client still sends is read and dropped for a moment, so the response is not
// lost to a reset (RFC 9112 §9.6); bounded in time and bytes.
constexpr auto kLingerTime = std::chrono::milliseconds(5000);
constexpr size_t kLingerBytes = size_t{64} << 20;  // read and dropped: time, not memory
constexpr size_t kReadChunk = 16 << 10;

}  // namespace

// Named, not anonymous: HttpListener::Impl (external linkage) holds one.
namespace http_listener_internal {

class ThreadPool {
 public:
  explicit ThreadPool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  void Post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_one();
  }

 private:
  void Work() {
    while (true) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, and every task has run
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stopping_ = false;
};

}  // namespace http_listener_internal

namespace {

// Writes everything, waiting at most `timeout` for each step of progress.
bool WriteAll(int fd, std::string_view data, std::chrono::milliseconds timeout) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
      if (r <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) return false;
      continue;
    }
    return false;
  }
  return true;
}

// IMF-fixdate (RFC 9110 §5.6.7) for the Date field (RFC 9110 §6.6.1).
std::string HttpDate() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[64];
  std::strftime(buffer, sizeof(buffer), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buffer;
}

std::string ResponseHead(int status, const HttpResponse& res, const std::string& framing,
                         bool keep_alive, bool http10) {
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + HttpReason(status) + "\r\n";
  head += "Date: " + HttpDate() + "\r\nServer: kvq\r\n";
  if (!res.content_type.empty()) head += "Content-Type: " + res.content_type + "\r\n";
  for (const auto& [name, value] : res.headers) head += name + ": " + value + "\r\n";
  head += framing;
  if (!keep_alive) {
    head += "Connection: close\r\n";
  } else if (http10) {
    head += "Connection: keep-alive\r\n";  // HTTP/1.0 persists only when told (RFC 9112 §9.3)
  }
  return head + "\r\n";
}

class SocketSink : public StreamSink {
 public:
  SocketSink(int fd, bool chunked, std::chrono::milliseconds timeout)
      : fd_(fd), chunked_(chunked), timeout_(timeout) {}
  bool Write(std::string_view data) override {
    if (failed_ || done_) return false;
    if (data.empty()) return true;  // an empty chunk would end the body
    bool ok;
    if (chunked_) {
      char size[24];
      std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
      std::string frame = size;
      frame.append(data);
      frame += "\r\n";
      ok = WriteAll(fd_, frame, timeout_);
    } else {
      ok = WriteAll(fd_, data, timeout_);
    }
    failed_ = !ok;
    return ok;
  }
  void Done() override {
    if (done_ || failed_) return;
    done_ = true;
    if (chunked_) failed_ = !WriteAll(fd_, "0\r\n\r\n", timeout_);
  }
  bool done() const { return done_ && !failed_; }
  bool failed() const { return failed_; }

 private:
  int fd_;
  bool chunked_;
  std::chrono::milliseconds timeout_;
  bool failed_ = false;
  bool done_ = false;
};

}  // namespace

struct HttpListener::Impl {
  enum class Phase { kIdle, kHead, kBody, kHandler, kLinger };
  struct Conn {
    int fd = -1;
    HttpRequestReader reader;
    Phase phase = Phase::kIdle;
    Clock::time_point deadline;
    size_t counted = 0;  // bytes of this connection in `buffered`
    size_t lingered = 0;
    bool close_after = false;  // handed back by a worker to be closed gracefully
    explicit Conn(const HttpLimits& limits) : reader(limits) {}
  };

  HttpListenerOptions options;
  HttpHandler handler;
  HttpErrorBody error_body;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::atomic<bool> stopping{false};
  std::atomic<int> open{0};
  // Owned by the loop thread: connections it reads (not those in handlers).
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  // Request bytes held: bodies being received, and those of requests
  // waiting for or in a handler (workers subtract theirs when done).
  std::atomic<size_t> buffered{0};
  std::mutex returned_mutex;
  std::vector<std::unique_ptr<Conn>> returned;  // back from workers
  bool loop_done = false;                       // under returned_mutex
  std::unique_ptr<http_listener_internal::ThreadPool> workers, probes;

  Impl(const HttpListenerOptions& o, HttpHandler h, HttpErrorBody e)
      : options(o), handler(std::move(h)), error_body(std::move(e)) {}

  void CloseConn(std::unique_ptr<Conn> c) {
    if (c->fd >= 0) ::close(c->fd);
    --open;
  }
  void Untrack(Conn& c) {
    buffered -= c.counted;
    c.counted = 0;
  }
  void Forget(int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
    Untrack(*it->second);
    CloseConn(std::move(it->second));
    conns.erase(it);
  }
  // Answers an error itself (small: fits the socket buffer) and lingers.
  void RespondErrorAndLinger(Conn& c, int status, const std::string& message) {
    HttpResponse res;
    res.status = status;
    res.SetContent(error_body(status, message), "application/json");
    const std::string data =
        ResponseHead(status, res, "Content-Length: " + std::to_string(res.body.size()) + "\r\n",
                     false, false) +
        res.body;
    WriteAll(c.fd, data, std::chrono::milliseconds(100));
    StartLinger(c);
  }
  void StartLinger(Conn& c) {
    Untrack(c);
    ::shutdown(c.fd, SHUT_WR);
    c.phase = Phase::kLinger;
    c.deadline = Clock::now() + kLingerTime;
  }

  void Loop();
  void Accept();
  void OnReadable(Conn& c);
  // False when the connection left the loop (handed to a worker).
  bool Process(Conn& c);
  void Dispatch(int fd);
  void Serve(std::unique_ptr<Conn> c, HttpRequest request);
  bool WriteResponse(Conn& c, const HttpRequest& req, HttpResponse& res, bool* keep_alive);
  void GiveBack(std::unique_ptr<Conn> c);
  void CheckDeadlines();
  void TakeReturned();
};

void HttpListener::Impl::Accept() {
  while (true) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN, or out of descriptors: try again at the next event
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // SSE events go out at once
    if (open.load() >= options.max_connections) {
      const std::string body = error_body(503, "too many open connections");
      HttpResponse res;
      res.content_type = "application/json";
      WriteAll(fd,
               ResponseHead(503, res, "Content-Length: " + std::to_string(body.size()) + "\r\n",
                            false, false) +
                   body,
               std::chrono::milliseconds(0));
      ::close(fd);
      continue;
    }
    ++open;
    auto c = std::make_unique<Conn>(options.limits);
    c->fd = fd;
    c->deadline = Clock::now() + options.head_timeout;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
    conns[fd] = std::move(c);
  }
}

void HttpListener::Impl::OnReadable(Conn& c) {
  const int fd = c.fd;
  char buffer[kReadChunk];
  while (true) {
    const ssize_t n = ::recv(c.fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) return Forget(fd);  // closed or reset: nothing to answer
    if (c.phase == Phase::kLinger) {
      c.lingered += static_cast<size_t>(n);
      if (c.lingered > kLingerBytes) return Forget(fd);
      continue;
    }
    c.reader.Feed(buffer, static_cast<size_t>(n));
    // Stop reading once a request is whole (pipelined bytes wait in the
    // kernel; `c` now belongs to a worker) or the connection is done with.
    if (!Process(c) || c.phase == Phase::kLinger) return;
  }
}

// Acts on the reader's state after new bytes (or bytes left from before).
bool HttpListener::Impl::Process(Conn& c) {
  while (true) {
    const HttpRequestReader::State state = c.reader.state();
    if (state == HttpRequestReader::State::kError) {
      RespondErrorAndLinger(c, c.reader.error_status(), c.reader.error_message());
      return true;
    }
    const size_t held = c.reader.buffered() + c.reader.request().body.size();
    buffered += held;
    buffered -= c.counted;
    c.counted = held;
    if (state == HttpRequestReader::State::kComplete) {
      Dispatch(c.fd);
      return false;
    }
    if (state == HttpRequestReader::State::kHeadComplete) {
      c.phase = Phase::kBody;
      c.deadline = Clock::now() + options.body_timeout;
      if (c.reader.request().expect_continue && c.reader.buffered() == 0) {
        WriteAll(c.fd, "HTTP/1.1 100 Continue\r\n\r\n", std::chrono::milliseconds(100));
      }
      c.reader.Resume();
      continue;
    }
    // kNeedMore
    if (buffered > options.max_buffered_bytes && c.phase == Phase::kBody) {
      RespondErrorAndLinger(c, 503, "the server holds too many request bodies; retry later");
      return true;
    }
    if (c.phase == Phase::kIdle && c.reader.started()) {
      c.phase = Phase::kHead;
      c.deadline = Clock::now() + options.head_timeout;
    }
    return true;
  }
}

void HttpListener::Impl::Dispatch(int fd) {
  auto it = conns.find(fd);
  std::unique_ptr<Conn> c = std::move(it->second);
  conns.erase(it);
  ::epoll_ctl(epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
  c->phase = Phase::kHandler;
  HttpRequest request = c->reader.TakeRequest();
  const bool probe = request.method == "GET" || request.method == "HEAD";
  // std::function needs a copyable callable: share the pieces.
  auto conn = std::make_shared<std::unique_ptr<Conn>>(std::move(c));
  auto req = std::make_shared<HttpRequest>(std::move(request));
  (probe ? probes : workers)->Post([this, conn, req] { Serve(std::move(*conn), std::move(*req)); });
}

bool HttpListener::Impl::WriteResponse(Conn& c, const HttpRequest& req, HttpResponse& res,
                                       bool* keep_alive) {
  const bool http10 = req.minor_version == 0;
  const bool head_only = req.method == "HEAD";
  if (!res.stream) {
    const std::string framing = "Content-Length: " + std::to_string(res.body.size()) + "\r\n";
    const std::string head = ResponseHead(res.status, res, framing, *keep_alive, http10);
    return WriteAll(c.fd, head_only ? head : head + res.body, options.write_timeout);
  }
  // A stream's length is unknown: chunked for HTTP/1.1; an HTTP/1.0 client
  // cannot read chunked (RFC 9112 §7), so its body ends when the connection
  // closes.
  if (http10) *keep_alive = false;
  const std::string framing = http10 ? "" : "Transfer-Encoding: chunked\r\n";
  bool ok = WriteAll(c.fd, ResponseHead(res.status, res, framing, *keep_alive, http10),
                     options.write_timeout);
  SocketSink sink(c.fd, !http10, options.write_timeout);
  while (ok && !head_only && !sink.done()) {
    bool more = false;
    try {
      more = res.stream(sink);
    } catch (...) {  // a producer bug ends this stream, not the process
    }
    if (!more) break;
  }
  if (head_only) sink.Done();
  ok = ok && sink.done();
  if (res.stream_end) res.stream_end(ok);
  return ok;
}

void HttpListener::Impl::Serve(std::unique_ptr<Conn> c, HttpRequest request) {
  HttpResponse res;
  try {
    handler(HttpExchange{request, c->fd}, res);
  } catch (...) {
    // A handler bug (or out of memory) answers 500; it must not end the process.
    res = HttpResponse{};
    res.status = 500;
    res.SetContent(error_body(500, "internal error"), "application/json");
  }
  buffered -= c->counted;  // the body is no longer needed
  c->counted = 0;
  request.body = std::string();
  bool keep_alive = request.keep_alive && !res.close && !stopping.load();
  const bool ok = WriteResponse(*c, request, res, &keep_alive);
  if (!ok) {
    // The client is gone or stopped reading: nothing more to say.
    CloseConn(std::move(c));
    return;
  }
  c->close_after = !keep_alive;
  GiveBack(std::move(c));
}

void HttpListener::Impl::GiveBack(std::unique_ptr<Conn> c) {
  {
    std::lock_guard<std::mutex> lock(returned_mutex);
    if (!loop_done) {
      returned.push_back(std::move(c));
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof(one));
      return;
    }
  }
  CloseConn(std::move(c));
}

void HttpListener::Impl::TakeReturned() {
  std::vector<std::unique_ptr<Conn>> back;
  {
    std::lock_guard<std::mutex> lock(returned_mutex);
    back.swap(returned);
  }
  for (std::unique_ptr<Conn>& c : back) {
    const int fd = c->fd;
    Conn& ref = *c;
    conns[fd] = std::move(c);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
    if (ref.close_after) {
      StartLinger(ref);
      continue;
    }
    ref.phase = Phase::kIdle;
    ref.deadline = Clock::now() + options.idle_timeout;
    // A pipelined request may already be buffered (RFC 9112 §9.3.2).
    ref.reader.Resume();
    Process(ref);
  }
}

void HttpListener::Impl::CheckDeadlines() {
  const Clock::time_point now = Clock::now();
  std::vector<int> expired;
  for (auto& [fd, c] : conns) {
    if (c->deadline <= now) expired.push_back(fd);
  }
  for (int fd : expired) {
    Conn& c = *conns[fd];
    if (c.phase == Phase::kHead || c.phase == Phase::kBody) {
      RespondErrorAndLinger(c, 408,
                            c.phase == Phase::kHead ? "the request head did not arrive in time"
                                                    : "the request body did not arrive in time");
    } else {
      Forget(fd);  // idle keep-alive connection (RFC 9112 §9.5), or lingering done
    }
  }
}

void HttpListener::Impl::Loop() {
  epoll_event events[64];
  while (!stopping.load()) {
    const int n = ::epoll_wait(epoll_fd, events, 64, 100);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd) {
        Accept();
      } else if (fd == wake_fd) {
        uint64_t count;
        [[maybe_unused]] ssize_t r = ::read(wake_fd, &count, sizeof(count));
        TakeReturned();
      } else if (auto it = conns.find(fd); it != conns.end()) {
        OnReadable(*it->second);
      }
    }
    CheckDeadlines();
  }
  {
    std::lock_guard<std::mutex> lock(returned_mutex);
    loop_done = true;
    for (auto& c : returned) CloseConn(std::move(c));
    returned.clear();
  }
  for (auto& [fd, c] : conns) CloseConn(std::move(c));
  conns.clear();
}

HttpListener::HttpListener(const HttpListenerOptions& options, HttpHandler handler,
                           HttpErrorBody error_body)
    : impl_(std::make_unique<Impl>(options, std::move(handler), std::move(error_body))) {}

HttpListener::~HttpListener() {
  Stop();
  // Handlers still running finish (their connections close) before the pools go.
  impl_->workers.reset();
  impl_->probes.reset();
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  if (impl_->epoll_fd >= 0) ::close(impl_->epoll_fd);
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
}

StatusOr<int> HttpListener::Bind() {
  const HttpListenerOptions& o = impl_->options;
  const std::string where = o.host + ":" + std::to_string(o.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(o.port);
  if (const int rc = ::getaddrinfo(o.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Status::Error("cannot listen on " + where + ": " + ::gai_strerror(rc));
  }
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR lets a restarted server bind while old connections sit in
    // TIME_WAIT; on Linux it does not let two listeners share the port.
    // SO_REUSEPORT (which httplib sets) would, splitting traffic silently.
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, SOMAXCONN) != 0) {
      error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd < 0) return Status::Error("cannot listen on " + where + ": " + error);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int bound = addr.ss_family == AF_INET6
                        ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                        : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  impl_->listen_fd = fd;
  impl_->epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  impl_->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl_->epoll_fd < 0 || impl_->wake_fd < 0) {
    return Status::Error(std::string("cannot create the event loop: ") + std::strerror(errno));
  }
  for (int watched : {fd, impl_->wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = watched;
    ::epoll_ctl(impl_->epoll_fd, EPOLL_CTL_ADD, watched, &ev);
  }
  impl_->workers = std::make_unique<http_listener_internal::ThreadPool>(o.worker_threads);
  impl_->probes = std::make_unique<http_listener_internal::ThreadPool>(o.probe_threads);
  return bound;
}

void HttpListener::Run() {
  if (impl_->epoll_fd < 0) return;
  impl_->Loop();
}

void HttpListener::Stop() { impl_->stopping.store(true); }

int HttpListener::open_connections() const { return impl_->open.load(); }

}  // namespace kvq
