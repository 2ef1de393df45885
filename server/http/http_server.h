// An HTTP/1.1 server for the daemon's second front door (the OpenAI API,
// issue 19), on Boost.Beast over Asio.
//
// Why Beast: it is asynchronous (a few io threads serve every connection, so
// a slow or idle client costs a socket and a buffer, not a thread: what
// cpp-httplib's thread per connection and civetweb's worker pool give away
// to a slow-loris client), its parser enforces header and body limits while
// it reads, and it writes chunked bodies (SSE). Boost 1.74 in Debian 12,
// header-only.
//
// One connection reads a request, hands it to the handler and reads the next
// only once the reply is written, so pipelined requests are answered in
// order. Limits, each answered before any handler sees the request:
//   max_connections     a connection beyond it is closed at once (also one
//                       beyond max_connections_per_peer from one address);
//   max_header_bytes    431 Request Header Fields Too Large (414 URI Too Long
//                       when the request line alone overflows it), then close;
//   max_body_bytes      413 Content Too Large, then close (Content-Length
//                       or chunked, counted as the body arrives);
//   malformed framing   400 Bad Request, then close;
//   TLS handshake       (with tls_cert_file/tls_key_file) done within
//                       request_timeout, else the connection ends; a
//                       plaintext client on a TLS port is closed unanswered;
//   request_timeout     a request whose header and body have not arrived
//                       within it (from its first byte, or from the end of
//                       the previous reply on a kept-alive connection) ends
//                       the connection: a client that trickles a request
//                       holds a socket for this long at most.
// Replies are written within write_timeout or the connection ends.
//
// Thread-safety: Start/Stop from one thread; a handler runs on an io thread
// and must not block it: it answers at once or keeps the exchange and
// answers later from any thread.
#ifndef DECODED_SERVER_HTTP_HTTP_SERVER_H_
#define DECODED_SERVER_HTTP_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/http/http_types.h"

namespace decoded::server::http {

struct HttpServerOptions {
  std::string listen = "127.0.0.1:8000";  // host:port (IPv6 as [addr]:port); port 0 picks a free port
  int threads = 1;                        // io threads
  int max_connections = 1024;
  int max_connections_per_peer = 0;  // of one client address, beyond which it is closed at once; 0: no limit
  int64_t max_header_bytes = 16 << 10;
  int64_t max_body_bytes = 8 << 20;
  absl::Duration request_timeout = absl::Seconds(30);
  absl::Duration write_timeout = absl::Seconds(30);
  // Both set: HTTPS (TLS 1.2/1.3) with this PEM certificate chain and PEM
  // private key (unencrypted); both empty: plaintext. The daemon passes its
  // --tls_cert/--tls_key, the pair gRPC serves.
  std::string tls_cert_file;
  std::string tls_key_file;
};

struct HttpServerCounters {
  int64_t connections_open = 0;
  int64_t connections_accepted = 0;
  int64_t connections_refused = 0;  // closed at once: max_connections (or the peer's) were open
  int64_t requests = 0;             // requests handed to the handler
  int64_t requests_refused = 0;     // answered 400 / 413 / 414 / 431 by the server itself
  int64_t tls_handshakes_failed = 0;  // TLS: closed before a request (plaintext client, timeout, bad handshake)
};

class HttpServer {
 public:
  // INVALID_ARGUMENT for a malformed address or option or an unusable TLS
  // certificate/key pair (unreadable, not PEM, not matching, only one of
  // the two given), UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options, HttpHandler handler);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  HttpServerCounters Counters() const;

  // Stops accepting and ends every connection, then joins the io threads.
  // Until `graceful_until` a connection still writing (a stream's last
  // events) closes once its queued bytes are out; idle ones and those
  // waiting for a reply close at once; whatever is left then is closed
  // with its bytes unwritten. Idempotent.
  void Stop(absl::Time graceful_until = absl::InfinitePast());

  struct Impl;

 private:
  explicit HttpServer(std::shared_ptr<Impl> impl);
  // Shared with every connection: an exchange answered after Stop still
  // finds the io context (its reply is dropped).
  std::shared_ptr<Impl> impl_;
};

}  // namespace decoded::server::http

#endif  // DECODED_SERVER_HTTP_HTTP_SERVER_H_
