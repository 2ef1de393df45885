// server/http/http_server.h with a certificate (HTTPS): requests on a
// kept-alive TLS connection verified against the test certificate, a
// streamed (chunked) reply, a client gone mid-stream seen through TLS, a
// plaintext client and a silent one closed unanswered while TLS clients go
// on, and certificate/key pairs that cannot serve refused at Start.
//
// tests/data/tls_test_{cert,key}.pem: the self-signed pair for localhost and
// 127.0.0.1 the gRPC TLS test uses (see hardening_e2e_test.cc).
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ssl.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "gtest/gtest.h"
#include "server/http/http_server.h"
#include "tests/common/model_path.h"

namespace decoded::server::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using decoded::testing::TestDataPath;

HttpServerOptions TlsOptions() {
  HttpServerOptions o;
  o.listen = "127.0.0.1:0";
  o.tls_cert_file = TestDataPath("tls_test_cert.pem");
  o.tls_key_file = TestDataPath("tls_test_key.pem");
  return o;
}

std::unique_ptr<HttpServer> StartTls(HttpHandler handler, HttpServerOptions o = TlsOptions()) {
  absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::Start(o, std::move(handler));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// A blocking HTTPS client that trusts only the test certificate and checks
// the server's name against it (127.0.0.1 is in its subjectAltName).
class TlsClient {
 public:
  explicit TlsClient(int port) : ctx_(asio::ssl::context::tls_client), stream_(ioc_, ctx_) {
    ctx_.load_verify_file(TestDataPath("tls_test_cert.pem"));
    stream_.set_verify_mode(asio::ssl::verify_peer);
    stream_.set_verify_callback(asio::ssl::host_name_verification("127.0.0.1"));
    beast::error_code ec;
    stream_.next_layer().connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)), ec);
    if (!ec) stream_.handshake(asio::ssl::stream_base::client, ec);
    handshake_error_ = ec;
  }
  beast::error_code handshake_error() const { return handshake_error_; }

  // Sends one request (GET without a body, else POST).
  bool Send(const std::string& target, const std::string& body = "") {
    bhttp::request<bhttp::string_body> req(body.empty() ? bhttp::verb::get : bhttp::verb::post, target, 11);
    req.set(bhttp::field::host, "127.0.0.1");
    req.body() = body;
    req.prepare_payload();
    beast::error_code ec;
    bhttp::write(stream_, req, ec);
    return !ec;
  }

  // One request, its whole reply (status 0 when none came).
  bhttp::response<bhttp::string_body> Request(const std::string& target, const std::string& body = "") {
    bhttp::response<bhttp::string_body> res;
    beast::error_code ec;
    if (Send(target, body)) bhttp::read(stream_, buffer_, res, ec);
    if (ec || res.result_int() == 0) res.result(0);
    return res;
  }

  void Close() {
    beast::error_code ignored;
    stream_.next_layer().close(ignored);
  }

 private:
  asio::io_context ioc_;
  asio::ssl::context ctx_;
  asio::ssl::stream<tcp::socket> stream_;
  beast::flat_buffer buffer_;
  beast::error_code handshake_error_;
};

HttpHandler Echo() {
  return [](std::shared_ptr<HttpExchange> ex) {
    HttpResponse res;
    res.content_type = "text/plain";
    res.body = absl::StrCat(ex->request().method, " ", ex->request().path, " ", ex->request().body);
    ex->Respond(std::move(res));
  };
}

// Polls `done` for up to 5 s.
template <typename Pred>
bool Eventually(Pred done) {
  for (int i = 0; i < 500; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

TEST(HttpsServerTest, RequestsOnAKeptAliveTlsConnection) {
  auto server = StartTls(Echo());
  TlsClient c(server->port());
  ASSERT_FALSE(c.handshake_error()) << c.handshake_error().message();
  auto r = c.Request("/a");
  EXPECT_EQ(r.result_int(), 200);
  EXPECT_EQ(r.body(), "GET /a ");
  r = c.Request("/b", "hello");
  EXPECT_EQ(r.result_int(), 200);
  EXPECT_EQ(r.body(), "POST /b hello");
  EXPECT_EQ(server->Counters().connections_accepted, 1);
  EXPECT_EQ(server->Counters().requests, 2);
}

TEST(HttpsServerTest, AStreamedReplyArrivesWholeAndInOrder) {
  std::atomic<int> written{0};
  std::vector<std::thread> writers;
  absl::Mutex mu;
  auto server = StartTls([&](std::shared_ptr<HttpExchange> ex) {
    ex->StartStream(200, "text/event-stream");
    absl::MutexLock lock(&mu);
    writers.emplace_back([ex, &written] {  // from another thread, as the engine's events are
      for (int i = 0; i < 50; ++i) {
        ex->Write(absl::StrCat("data: ", i, "\n\n"), [&written](bool ok) {
          if (ok) ++written;
        });
      }
      ex->EndStream();
    });
  });
  TlsClient c(server->port());
  ASSERT_FALSE(c.handshake_error()) << c.handshake_error().message();
  auto r = c.Request("/stream");
  std::string expected;
  for (int i = 0; i < 50; ++i) absl::StrAppend(&expected, "data: ", i, "\n\n");
  EXPECT_EQ(r.result_int(), 200);
  EXPECT_EQ(r.body(), expected);
  EXPECT_TRUE(Eventually([&] { return written.load() == 50; })) << written.load();
  absl::MutexLock lock(&mu);
  for (std::thread& t : writers) t.join();
}

TEST(HttpsServerTest, AClientGoneMidStreamIsSeenThroughTls) {
  std::atomic<bool> gone{false};
  std::atomic<bool> started{false};
  std::shared_ptr<HttpExchange> kept;
  absl::Mutex mu;
  auto server = StartTls([&](std::shared_ptr<HttpExchange> ex) {
    ex->StartStream(200, "text/event-stream");
    ex->Write("data: first\n\n", nullptr);
    ex->OnClientGone([&gone] { gone = true; });
    absl::MutexLock lock(&mu);
    kept = std::move(ex);  // the stream stays open: only the client can end it
    started = true;
  });
  {
    TlsClient c(server->port());
    ASSERT_FALSE(c.handshake_error()) << c.handshake_error().message();
    ASSERT_TRUE(c.Send("/stream"));  // its reply never ends: nothing read
    ASSERT_TRUE(Eventually([&] { return started.load(); }));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_FALSE(gone.load());  // connected: not gone
    c.Close();
  }
  EXPECT_TRUE(Eventually([&] { return gone.load(); }));
  {
    absl::MutexLock lock(&mu);
    kept.reset();  // the handler lets go of the exchange, as a cancelled turn does
  }
  EXPECT_TRUE(Eventually([&] { return server->Counters().connections_open == 0; }));
}

// A plaintext HTTP request sent to the TLS port: the handshake fails, the
// connection is closed with no HTTP reply, and TLS clients are served on.
TEST(HttpsServerTest, APlaintextClientIsClosedUnanswered) {
  auto server = StartTls(Echo());
  asio::io_context ioc;
  tcp::socket plain(ioc);
  plain.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(server->port())));
  const std::string get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  asio::write(plain, asio::buffer(get));
  std::string got;
  beast::error_code ec;
  char buf[1024];
  while (!ec) {
    const size_t n = plain.read_some(asio::buffer(buf), ec);
    got.append(buf, n);
  }
  EXPECT_EQ(got.find("HTTP/1.1"), std::string::npos) << got;  // no HTTP answer in plaintext
  EXPECT_TRUE(Eventually([&] { return server->Counters().tls_handshakes_failed == 1; }));
  EXPECT_EQ(server->Counters().requests, 0);
  TlsClient c(server->port());
  ASSERT_FALSE(c.handshake_error()) << c.handshake_error().message();
  EXPECT_EQ(c.Request("/after").result_int(), 200);
}

// A client that connects and never starts the handshake holds its socket
// for request_timeout at most, as a silent plaintext client does.
TEST(HttpsServerTest, ASilentClientIsClosedAfterTheRequestTimeout) {
  HttpServerOptions o = TlsOptions();
  o.request_timeout = absl::Milliseconds(300);
  auto server = StartTls(Echo(), o);
  asio::io_context ioc;
  tcp::socket silent(ioc);
  silent.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(server->port())));
  const auto start = std::chrono::steady_clock::now();
  char buf[16];
  beast::error_code ec;
  silent.read_some(asio::buffer(buf), ec);  // returns when the server closes
  EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  // The timeout closes the socket before the handshake's handler runs.
  EXPECT_TRUE(Eventually([&] { return server->Counters().tls_handshakes_failed == 1; }));
}

// Writes a fresh P-256 key (not the certificate's) to a temporary file.
std::string WriteOtherKey() {
  const std::string path = ::testing::TempDir() + "https_server_test_other_key.pem";
  EVP_PKEY* key = EVP_EC_gen("P-256");
  FILE* f = std::fopen(path.c_str(), "w");
  if (key != nullptr && f != nullptr) PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  if (f != nullptr) std::fclose(f);
  EVP_PKEY_free(key);
  return path;
}

TEST(HttpsServerTest, PairsThatCannotServeAreRefusedAtStart) {
  auto refused = [](HttpServerOptions o, const std::string& what) {
    absl::StatusOr<std::unique_ptr<HttpServer>> s = HttpServer::Start(o, Echo());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << what;
    return s.ok() ? std::string() : std::string(s.status().message());
  };
  HttpServerOptions o = TlsOptions();
  o.tls_key_file.clear();
  EXPECT_NE(refused(o, "certificate alone").find("together"), std::string::npos);
  o = TlsOptions();
  o.tls_cert_file = TestDataPath("no_such_cert.pem");
  EXPECT_NE(refused(o, "missing certificate").find("no_such_cert.pem"), std::string::npos);
  o = TlsOptions();
  o.tls_key_file = o.tls_cert_file;  // a certificate where the key should be
  EXPECT_NE(refused(o, "certificate as key").find("not usable"), std::string::npos);
  o = TlsOptions();
  o.tls_key_file = WriteOtherKey();
  EXPECT_NE(refused(o, "key of another pair").find("does not match"), std::string::npos);
  // The real pair starts.
  EXPECT_TRUE(HttpServer::Start(TlsOptions(), Echo()).ok());
}

}  // namespace
}  // namespace decoded::server::http
