// server/http/http_server.h over real sockets: requests and replies, keep-alive
// and pipelining in order, the limits answered before the handler (431, 414,
// 413, 400), Expect: 100-continue, chunked bodies, the request timeout against a
// client that trickles, max_connections, replies from other threads, an
// exchange dropped without a reply, Stop with a request still open, and
// streamed replies: chunked then the next request on the connection, closed
// when asked, raw to an HTTP/1.0 client; and what an outside tester found:
// transfer codings other than chunked (request smuggling), Host, Expect,
// absolute-form targets, HEAD's length, a reply cut by the server (write
// timeout, too many bytes sent while waiting) cancelling like a client gone,
// and a reply queued before Stop still written.
#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace decoded::server::http {
namespace {

// A blocking client socket with a receive deadline.
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~Client() { close(fd_); }
  bool connected() const { return connected_; }

  bool Send(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads until `pred(buffer)` or EOF or `timeout`; returns false on timeout.
  template <typename Pred>
  bool ReadUntil(Pred pred, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!pred(buf_)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char tmp[4096];
      const ssize_t n = recv(fd_, tmp, sizeof(tmp), 0);
      if (n <= 0) {
        eof_ = true;
        return pred(buf_);
      }
      buf_.append(tmp, static_cast<size_t>(n));
    }
    return true;
  }

  struct Response {
    int status = 0;
    std::string head;  // status line and headers
    std::string body;
  };

  // The next complete response (Content-Length framed); status 0 if none
  // came (EOF or timeout).
  Response ReadResponse() {
    Response r;
    size_t header_end = std::string::npos;
    size_t length = 0;
    auto complete = [&](const std::string& b) {
      header_end = b.find("\r\n\r\n");
      if (header_end == std::string::npos) return false;
      const std::string head = absl::AsciiStrToLower(b.substr(0, header_end));
      const size_t cl = head.find("content-length: ");
      length = 0;
      if (cl != std::string::npos) {
        const size_t eol = head.find("\r\n", cl);
        (void)absl::SimpleAtoi(head.substr(cl + 16, eol - cl - 16), &length);
      }
      return b.size() >= header_end + 4 + length;
    };
    if (!ReadUntil(complete)) return r;
    r.head = buf_.substr(0, header_end);
    r.body = buf_.substr(header_end + 4, length);
    buf_.erase(0, header_end + 4 + length);
    (void)absl::SimpleAtoi(r.head.substr(9, 3), &r.status);
    return r;
  }

  // True when the server closed the connection within `timeout`.
  bool ClosedWithin(std::chrono::milliseconds timeout) {
    ReadUntil([&](const std::string&) { return eof_; }, timeout);
    return eof_;
  }

  std::string& buffer() { return buf_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string buf_;
};

std::string Get(const std::string& path, const std::string& extra = "") {
  return absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: x\r\n", extra, "\r\n");
}

std::string Post(const std::string& path, const std::string& body, const std::string& extra = "") {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: x\r\nContent-Length: ", body.size(), "\r\n", extra, "\r\n",
                      body);
}

// Answers every request with "<method> <path>?<query> <x-test header> <body>".
HttpHandler Echo() {
  return [](std::shared_ptr<HttpExchange> ex) {
    const HttpRequest& r = ex->request();
    HttpResponse res;
    res.content_type = "text/plain";
    res.body = absl::StrCat(r.method, " ", r.path, "?", r.query, " ", r.header("x-test"), " ", r.body);
    ex->Respond(std::move(res));
  };
}

// Answers every request with an empty 200 and counts them in `*handled`.
HttpHandler Counting(std::atomic<int>* handled) {
  return [handled](std::shared_ptr<HttpExchange> ex) {
    ++*handled;
    ex->Respond(HttpResponse{});
  };
}

// "/stream": a streamed reply of "one", "two", "three" written from another
// thread (as the engine's events are), then its end; anything else: Echo.
// The writers are joined when the handler is destroyed.
class Streaming {
 public:
  ~Streaming() {
    absl::MutexLock lock(&mu_);
    for (std::thread& t : writers_) t.join();
  }
  HttpHandler handler() {
    return [this](std::shared_ptr<HttpExchange> ex) {
      if (ex->request().path != "/stream") return Echo()(std::move(ex));
      ex->StartStream(200, "text/event-stream");
      absl::MutexLock lock(&mu_);
      writers_.emplace_back([ex] {
        for (const char* part : {"one", "two", "three"}) ex->Write(part, nullptr);
        ex->EndStream();
      });
    };
  }

 private:
  absl::Mutex mu_;
  std::vector<std::thread> writers_;
};

// A handler that keeps each exchange unanswered (as a turn still running
// does) for the test to answer, drop or watch; `on_request` runs first.
class KeptExchange {
 public:
  HttpHandler handler(std::function<void(HttpExchange&)> on_request = nullptr) {
    return [this, on_request](std::shared_ptr<HttpExchange> ex) {
      if (on_request) on_request(*ex);
      absl::MutexLock lock(&mu_);
      kept_ = std::move(ex);
    };
  }
  // The kept exchange once a request arrived (within 5 s), else null; the
  // caller holds it from then on.
  std::shared_ptr<HttpExchange> Take() {
    for (int i = 0; i < 1000; ++i) {
      {
        absl::MutexLock lock(&mu_);
        if (kept_ != nullptr) return std::move(kept_);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return nullptr;
  }

 private:
  absl::Mutex mu_;
  std::shared_ptr<HttpExchange> kept_;
};

// A chunked body: "<hex>\r\n<data>\r\n" ... "0\r\n\r\n".
const char kChunkedOneTwoThree[] = "3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n0\r\n\r\n";

std::unique_ptr<HttpServer> StartServer(HttpHandler handler, HttpServerOptions o = {}) {
  o.listen = "127.0.0.1:0";
  absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::Start(o, std::move(handler));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

TEST(HttpServerTest, RequestsOnAKeptAliveConnection) {
  auto server = StartServer(Echo());
  Client c(server->port());
  ASSERT_TRUE(c.connected());
  ASSERT_TRUE(c.Send(Get("/a?x=1", "X-Test: one\r\n")));
  Client::Response r = c.ReadResponse();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "GET /a?x=1 one ");
  EXPECT_TRUE(absl::StrContains(r.head, "Content-Type: text/plain"));
  ASSERT_TRUE(c.Send(Post("/b", "hello", "x-test: two\r\nX-Test: three\r\n")));
  r = c.ReadResponse();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST /b? two, three hello");  // repeated header joined
  EXPECT_EQ(server->Counters().requests, 2);
}

TEST(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  // The first request is answered late from another thread; the second,
  // sent in the same packet, is answered at once: the replies keep order.
  std::vector<std::thread> later;
  absl::Mutex mu;
  auto server = StartServer([&](std::shared_ptr<HttpExchange> ex) {
    if (ex->request().path == "/slow") {
      absl::MutexLock lock(&mu);
      later.emplace_back([ex] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        HttpResponse r;
        r.body = "slow";
        ex->Respond(std::move(r));
      });
      return;
    }
    HttpResponse r;
    r.body = "fast";
    ex->Respond(std::move(r));
  });
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/slow") + Get("/fast")));
  EXPECT_EQ(c.ReadResponse().body, "slow");
  EXPECT_EQ(c.ReadResponse().body, "fast");
  absl::MutexLock lock(&mu);
  for (std::thread& t : later) t.join();
}

TEST(HttpServerTest, TooLargeHeaderGets431AndTheConnectionEnds) {
  HttpServerOptions o;
  o.max_header_bytes = 4096;
  std::atomic<int> handled{0};
  auto server = StartServer(Counting(&handled), o);
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/", absl::StrCat("X-Big: ", std::string(8000, 'a'), "\r\n"))));
  Client::Response r = c.ReadResponse();
  EXPECT_EQ(r.status, 431);
  EXPECT_TRUE(absl::StrContains(r.body, "\"type\":\"invalid_request_error\"")) << r.body;
  EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(2000)));
  EXPECT_EQ(handled.load(), 0);
  EXPECT_EQ(server->Counters().requests_refused, 1);
}

// An outside tester's long URL got 431: the limit counts the request line,
// but what is too long there is the target.
TEST(HttpServerTest, TooLongRequestTargetGets414AndTheConnectionEnds) {
  HttpServerOptions o;
  o.max_header_bytes = 4096;
  std::atomic<int> handled{0};
  auto server = StartServer(Counting(&handled), o);
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get(absl::StrCat("/v1/models?x=", std::string(8000, 'a')))));
  Client::Response r = c.ReadResponse();
  EXPECT_EQ(r.status, 414);
  EXPECT_TRUE(absl::StrContains(r.body, "\"type\":\"invalid_request_error\"")) << r.body;
  EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(2000)));
  EXPECT_EQ(handled.load(), 0);
  EXPECT_EQ(server->Counters().requests_refused, 1);
  // A target that fits, with headers that do not: still 431.
  Client d(server->port());
  ASSERT_TRUE(
      d.Send(Get(absl::StrCat("/", std::string(3000, 'a')), absl::StrCat("X-Big: ", std::string(3000, 'b'), "\r\n"))));
  EXPECT_EQ(d.ReadResponse().status, 431);
}

TEST(HttpServerTest, TooLargeBodyGets413ByContentLengthOrChunks) {
  HttpServerOptions o;
  o.max_body_bytes = 1000;
  std::atomic<int> handled{0};
  auto server = StartServer(Counting(&handled), o);
  {
    // Refused on the header alone: the body is never read.
    Client c(server->port());
    ASSERT_TRUE(c.Send("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n"));
    EXPECT_EQ(c.ReadResponse().status, 413);
    EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(2000)));
  }
  {
    Client c(server->port());
    std::string chunked = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (int i = 0; i < 3; ++i) absl::StrAppend(&chunked, "1f4\r\n", std::string(500, 'b'), "\r\n");
    absl::StrAppend(&chunked, "0\r\n\r\n");
    ASSERT_TRUE(c.Send(chunked));
    EXPECT_EQ(c.ReadResponse().status, 413);
  }
  EXPECT_EQ(handled.load(), 0);
}

TEST(HttpServerTest, ChunkedBodyIsAssembled) {
  auto server = StartServer(Echo());
  Client c(server->port());
  ASSERT_TRUE(c.Send("POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  Client::Response r = c.ReadResponse();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST /c?  abcde");
}

TEST(HttpServerTest, MalformedRequestsGet400) {
  auto server = StartServer(Echo());
  for (const std::string& bad : {std::string("GARBAGE\r\n\r\n"), std::string("GET / HTTP/9.9\r\n\r\n"),
                                std::string("GET / HTTP/1.1\r\nBad Header Without Colon\r\n\r\n"),
                                std::string("POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n")}) {
    Client c(server->port());
    ASSERT_TRUE(c.Send(bad));
    Client::Response r = c.ReadResponse();
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_TRUE(absl::StrContains(r.body, "malformed HTTP request")) << r.body;
    EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(2000))) << bad;
  }
}

TEST(HttpServerTest, ExpectContinueGets100BeforeTheBody) {
  auto server = StartServer(Echo());
  Client c(server->port());
  ASSERT_TRUE(c.Send("POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"));
  ASSERT_TRUE(c.ReadUntil([](const std::string& b) { return absl::StrContains(b, "\r\n\r\n"); }));
  EXPECT_TRUE(absl::StartsWith(c.buffer(), "HTTP/1.1 100 Continue\r\n\r\n")) << c.buffer();
  c.buffer().erase(0, std::string("HTTP/1.1 100 Continue\r\n\r\n").size());
  ASSERT_TRUE(c.Send("body"));
  EXPECT_EQ(c.ReadResponse().body, "POST /e?  body");
}

TEST(HttpServerTest, ARequestTrickledPastTheTimeoutEndsTheConnection) {
  HttpServerOptions o;
  o.request_timeout = absl::Milliseconds(300);
  auto server = StartServer(Echo(), o);
  Client slow(server->port());
  ASSERT_TRUE(slow.Send("GET / HTTP/1.1\r\nHost: x\r\n"));  // never finishes its header
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(slow.ClosedWithin(std::chrono::milliseconds(3000)));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250));
  // An idle kept-alive connection ends the same way.
  Client idle(server->port());
  ASSERT_TRUE(idle.Send(Get("/")));
  EXPECT_EQ(idle.ReadResponse().status, 200);
  EXPECT_TRUE(idle.ClosedWithin(std::chrono::milliseconds(3000)));
}

// Two connections admitted and served, a third closed at once (refused
// once), and the two still served: a limit of two, whichever it is.
void ExpectTwoAdmittedAndTheThirdClosed(HttpServer& server) {
  Client a(server.port()), b(server.port());
  ASSERT_TRUE(a.Send(Get("/a")));
  ASSERT_EQ(a.ReadResponse().status, 200);
  ASSERT_TRUE(b.Send(Get("/b")));
  ASSERT_EQ(b.ReadResponse().status, 200);
  Client c(server.port());
  EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(2000)));
  EXPECT_EQ(server.Counters().connections_refused, 1);
  // The two admitted ones still work.
  ASSERT_TRUE(a.Send(Get("/again")));
  EXPECT_EQ(a.ReadResponse().status, 200);
}

TEST(HttpServerTest, ConnectionsBeyondTheLimitAreClosedAtOnce) {
  HttpServerOptions o;
  o.max_connections = 2;
  auto server = StartServer(Echo(), o);
  ExpectTwoAdmittedAndTheThirdClosed(*server);
}

// An outside tester found --max_connections_per_peer applied to gRPC only:
// one address could take the HTTP door's every connection.
TEST(HttpServerTest, ConnectionsOfOneAddressBeyondItsLimitAreClosedAtOnce) {
  HttpServerOptions o;
  o.max_connections = 10;
  o.max_connections_per_peer = 2;
  auto server = StartServer(Echo(), o);
  ExpectTwoAdmittedAndTheThirdClosed(*server);
  // Once they closed, the address has its slots back.
  for (int i = 0; i < 100 && server->Counters().connections_open > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Client d(server->port());
  ASSERT_TRUE(d.Send(Get("/d")));
  EXPECT_EQ(d.ReadResponse().status, 200);
}

TEST(HttpServerTest, ConnectionCloseIsHonoured) {
  auto server = StartServer(Echo());
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/", "Connection: close\r\n")));
  Client::Response r = c.ReadResponse();
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(absl::StrContains(absl::AsciiStrToLower(r.head), "connection: close"));
  EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(2000)));
}

TEST(HttpServerTest, AnExchangeDroppedWithoutAReplyAnswers500) {
  auto server = StartServer([](std::shared_ptr<HttpExchange>) {});
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/")));
  Client::Response r = c.ReadResponse();
  EXPECT_EQ(r.status, 500);
  EXPECT_TRUE(absl::StrContains(r.body, "server_error")) << r.body;
}

TEST(HttpServerTest, StopWithARequestStillOpenReturnsAndALateReplyIsDropped) {
  KeptExchange keeper;
  auto server = StartServer(keeper.handler());
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/")));
  std::shared_ptr<HttpExchange> kept = keeper.Take();
  const auto start = std::chrono::steady_clock::now();
  server->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(2000)));
  ASSERT_NE(kept, nullptr);
  kept->Respond(HttpResponse{});  // after Stop: dropped, no crash
  kept.reset();
  server.reset();
}

TEST(HttpServerTest, AStreamedReplyKeepsTheConnectionForTheNextRequest) {
  Streaming streaming;
  auto server = StartServer(streaming.handler());
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/stream")));
  ASSERT_TRUE(c.ReadUntil([](const std::string& b) { return absl::StrContains(b, "0\r\n\r\n"); }));
  const std::string head = c.buffer().substr(0, c.buffer().find("\r\n\r\n"));
  EXPECT_TRUE(absl::StrContains(head, "Transfer-Encoding: chunked")) << head;
  EXPECT_FALSE(absl::StrContains(absl::AsciiStrToLower(head), "connection: close")) << head;
  EXPECT_TRUE(absl::EndsWith(c.buffer(), kChunkedOneTwoThree)) << c.buffer();
  c.buffer().clear();
  // The same connection serves the next request, and a stream pipelined
  // with a request after it answers both in order.
  ASSERT_TRUE(c.Send(Get("/after")));
  EXPECT_EQ(c.ReadResponse().body, "GET /after?  ");
  ASSERT_TRUE(c.Send(Get("/stream") + Get("/pipelined")));
  ASSERT_TRUE(c.ReadUntil([](const std::string& b) { return absl::StrContains(b, "0\r\n\r\n"); }));
  c.buffer().erase(0, c.buffer().find("0\r\n\r\n") + 5);
  EXPECT_EQ(c.ReadResponse().body, "GET /pipelined?  ");
  EXPECT_EQ(server->Counters().connections_accepted, 1);
  EXPECT_EQ(server->Counters().requests, 4);
}

TEST(HttpServerTest, AStreamedReplyToConnectionCloseEndsTheConnection) {
  Streaming streaming;
  auto server = StartServer(streaming.handler());
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/stream", "Connection: close\r\n")));
  EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(2000)));
  EXPECT_TRUE(absl::StrContains(c.buffer(), "Connection: close\r\n")) << c.buffer();
  EXPECT_TRUE(absl::EndsWith(c.buffer(), kChunkedOneTwoThree)) << c.buffer();
}

TEST(HttpServerTest, AnHttp10ClientGetsTheStreamUnchunkedUntilTheClose) {
  Streaming streaming;
  auto server = StartServer(streaming.handler());
  Client c(server->port());
  ASSERT_TRUE(c.Send("GET /stream HTTP/1.0\r\nHost: x\r\n\r\n"));
  EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(2000)));
  EXPECT_FALSE(absl::StrContains(c.buffer(), "Transfer-Encoding")) << c.buffer();
  EXPECT_TRUE(absl::EndsWith(c.buffer(), "\r\n\r\nonetwothree")) << c.buffer();
}

TEST(HttpServerTest, TransferCodingsOtherThanChunkedAreRefusedAndTheConnectionEnds) {
  std::atomic<int> handled{0};
  auto server = StartServer(Counting(&handled));
  // With "identity" the body would be taken for a second request.
  const std::string smuggled = "GET /v1/SMUGGLED HTTP/1.1\r\nHost: x\r\n\r\n";
  for (const auto& [coding, status] : std::vector<std::pair<std::string, int>>{
           {"identity", 400}, {"chunked, identity", 400}, {"xchunked", 501}, {"gzip, chunked", 501}, {"chunked", 400}}) {
    Client c(server->port());
    // The last case: chunked is fine, but not in HTTP/1.0.
    const std::string version = coding == "chunked" ? "HTTP/1.0" : "HTTP/1.1";
    ASSERT_TRUE(c.Send(
        absl::StrCat("POST / ", version, "\r\nHost: x\r\nTransfer-Encoding: ", coding, "\r\n\r\n", smuggled)));
    EXPECT_EQ(c.ReadResponse().status, status) << coding;
    EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(2000))) << coding;
    EXPECT_FALSE(absl::StrContains(c.buffer(), "HTTP/1.1")) << coding << ": a second reply";
  }
  EXPECT_EQ(handled.load(), 0);
}

TEST(HttpServerTest, HostExpectAndAbsoluteFormTargets) {
  auto server = StartServer(Echo());
  {
    Client c(server->port());
    ASSERT_TRUE(c.Send("GET / HTTP/1.1\r\n\r\n"));
    EXPECT_EQ(c.ReadResponse().status, 400);  // HTTP/1.1 without Host
  }
  {
    Client c(server->port());
    ASSERT_TRUE(c.Send("GET /old HTTP/1.0\r\n\r\n"));
    EXPECT_EQ(c.ReadResponse().status, 200);  // HTTP/1.0 needs none
  }
  {
    Client c(server->port());
    ASSERT_TRUE(c.Send(Post("/", "abc", "Expect: something-else\r\n")));
    EXPECT_EQ(c.ReadResponse().status, 417);
  }
  Client c(server->port());
  ASSERT_TRUE(c.Send("GET http://example.com:8000/a/b?q=1 HTTP/1.1\r\nHost: example.com\r\n\r\n"));
  EXPECT_EQ(c.ReadResponse().body, "GET /a/b?q=1  ");
  ASSERT_TRUE(c.Send("GET https://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n"));
  EXPECT_EQ(c.ReadResponse().body, "GET /?  ");
  ASSERT_TRUE(c.Send("GET HTTP://example.com/up HTTP/1.1\r\nHost: example.com\r\n\r\n"));
  EXPECT_EQ(c.ReadResponse().body, "GET /up?  ");
}

TEST(HttpServerTest, HeadGetsTheGetRepliesLengthAndNoBody) {
  auto server = StartServer([](std::shared_ptr<HttpExchange> ex) {
    HttpResponse r;
    r.body = "0123456789";
    ex->Respond(std::move(r));
  });
  Client c(server->port());
  ASSERT_TRUE(c.Send("HEAD / HTTP/1.1\r\nHost: x\r\n\r\n" + Get("/next")));
  // The HEAD reply's header only, then the GET reply whole.
  ASSERT_TRUE(c.ReadUntil([](const std::string& b) { return absl::StrContains(b, "0123456789"); }));
  const size_t second = c.buffer().find("HTTP/1.1", 1);
  ASSERT_NE(second, std::string::npos) << c.buffer();
  const std::string head_reply = c.buffer().substr(0, second);
  EXPECT_TRUE(absl::StrContains(head_reply, "Content-Length: 10\r\n")) << head_reply;
  EXPECT_TRUE(absl::EndsWith(head_reply, "\r\n\r\n")) << head_reply;  // no body
}

// A stream the client does not read: once the socket's buffers are full the
// write timeout ends the connection, and the turn behind it must hear of it
// as of a client gone (else it decodes on for nobody).
TEST(HttpServerTest, AStreamCutByTheWriteTimeoutTellsItsClientIsGone) {
  HttpServerOptions o;
  o.write_timeout = absl::Milliseconds(300);
  std::atomic<bool> gone{false};
  std::vector<std::thread> writers;
  absl::Mutex mu;
  auto server = StartServer(
      [&](std::shared_ptr<HttpExchange> ex) {
        ex->OnClientGone([&gone] { gone = true; });
        ex->StartStream(200, "text/event-stream");
        absl::MutexLock lock(&mu);
        writers.emplace_back([ex] {
          for (int i = 0; i < 256; ++i) ex->Write(std::string(256 << 10, 'x'), nullptr);  // 64 MiB
        });
      },
      o);
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/")));  // and never read
  for (int i = 0; i < 500 && !gone; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(gone.load());
  absl::MutexLock lock(&mu);
  for (std::thread& t : writers) t.join();
}

// While a reply is pending the socket is watched; a client that sends more
// than 64 KiB meanwhile could not be watched further: it loses the
// connection, and its turn is told.
TEST(HttpServerTest, TooMuchSentWhileAReplyIsPendingEndsTheConnectionAndTheTurn) {
  std::atomic<bool> gone{false};
  KeptExchange keeper;
  auto server = StartServer(keeper.handler([&gone](HttpExchange& ex) { ex.OnClientGone([&gone] { gone = true; }); }));
  Client c(server->port());
  ASSERT_TRUE(c.Send(Get("/")));
  std::shared_ptr<HttpExchange> kept = keeper.Take();
  c.Send(std::string(100 << 10, 'j'));  // may fail once the server closes
  EXPECT_TRUE(c.ClosedWithin(std::chrono::milliseconds(3000)));
  for (int i = 0; i < 300 && !gone; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(gone.load());
}

// The drain's order: a turn's reply is handed over, then the server stops
// gracefully; the reply (queued behind the watching read) is still written.
TEST(HttpServerTest, AReplyGivenBeforeAGracefulStopIsWritten) {
  for (int round = 0; round < 20; ++round) {
    KeptExchange keeper;
    auto server = StartServer(keeper.handler());
    Client c(server->port());
    ASSERT_TRUE(c.Send(Get("/")));
    {
      std::shared_ptr<HttpExchange> kept = keeper.Take();
      ASSERT_NE(kept, nullptr);
      HttpResponse r;
      r.status = 503;
      r.body = "cut by the drain";
      kept->Respond(std::move(r));
    }
    server->Stop(absl::Now() + absl::Seconds(2));
    const Client::Response r = c.ReadResponse();
    EXPECT_EQ(r.status, 503) << "round " << round;
    EXPECT_EQ(r.body, "cut by the drain") << "round " << round;
  }
}

TEST(HttpServerTest, BadOptionsAndAddressesAreRefused) {
  HttpServerOptions o;
  o.listen = "no-port";
  EXPECT_EQ(HttpServer::Start(o, Echo()).status().code(), absl::StatusCode::kInvalidArgument);
  o.listen = "127.0.0.1:0";
  o.threads = 0;
  EXPECT_EQ(HttpServer::Start(o, Echo()).status().code(), absl::StatusCode::kInvalidArgument);
  // A port in use.
  auto first = StartServer(Echo());
  o.threads = 1;
  o.listen = absl::StrCat("127.0.0.1:", first->port());
  EXPECT_EQ(HttpServer::Start(o, Echo()).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace decoded::server::http
