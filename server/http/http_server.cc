#include "server/http/http_server.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>
#include <type_traits>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/dispatch.hpp"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ip/v6_only.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/ssl.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "boost/beast/ssl.hpp"
#include "server/host_port.h"
#include "server/http/openai_error.h"
#include "server/peer_limit.h"

namespace decoded::server::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

const std::string& HttpRequest::header(const std::string& lower_case_name) const {
  static const std::string* const kEmpty = new std::string();
  const auto it = headers.find(lower_case_name);
  return it == headers.end() ? *kEmpty : it->second;
}

namespace {

std::chrono::steady_clock::duration ToChrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

// What HttpServer::Stop needs of a connection, plaintext or TLS.
class ConnectionBase {
 public:
  virtual ~ConnectionBase() = default;
  // Any thread: posts CloseWhenWritten / Close to the connection's strand.
  virtual void PostCloseWhenWritten() = 0;
  virtual void PostClose() = 0;
};

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  HttpServerOptions options;
  HttpHandler handler;
  asio::io_context ioc;
  // The acceptor's operations and its close run on one strand (the io
  // threads may be several).
  tcp::acceptor acceptor{asio::make_strand(ioc)};
  asio::steady_timer accept_retry{acceptor.get_executor()};
  // Keeps run() going until Stop has posted every close: a connection
  // waiting for its reply has no operation pending, so once the acceptor
  // closed the threads could return before the other closes were posted.
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work{asio::make_work_guard(ioc)};
  int port = 0;
  std::vector<std::thread> threads;
  // Set when the server serves TLS (options.tls_cert_file): every
  // connection's handshake uses it.
  std::optional<asio::ssl::context> tls;

  std::atomic<int64_t> open{0}, accepted{0}, refused{0}, requests{0}, requests_refused{0}, tls_handshakes_failed{0};
  std::atomic<int64_t> not_closed{0};  // connections Close() has not ended yet

  absl::Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  absl::flat_hash_map<ConnectionBase*, std::weak_ptr<ConnectionBase>> connections ABSL_GUARDED_BY(mu);
  // Open connections per client address (options.max_connections_per_peer),
  // made with the options.
  std::unique_ptr<PeerLimit> per_peer;

  void Accept();
  // Posts `fn` to `strand` unless the server stopped (then the work is
  // dropped: nothing runs the io context any more).
  template <typename Executor, typename Fn>
  bool PostUnlessStopped(const Executor& strand, Fn&& fn) {
    absl::MutexLock lock(&mu);
    if (stopped) return false;
    asio::post(strand, std::forward<Fn>(fn));
    return true;
  }
};

namespace {

// Answers of the server itself (the request never reached the handler).
HttpResponse PlainError(int status, absl::string_view message) {
  return OpenAiError(status, "invalid_request_error", message);
}

// One client connection over `Stream`: beast::tcp_stream (plaintext) or
// beast::ssl_stream<beast::tcp_stream> (TLS, handshake first). Reads and
// writes go through `stream_`; timeouts, shutdown and cancellation act on
// the TCP layer under it (Lowest()). Asio's TLS stream allows one read and
// one write outstanding at once, which is all a connection ever has (the
// watching read beside a stream's writes).
template <typename Stream>
class Connection : public ConnectionBase, public std::enable_shared_from_this<Connection<Stream>> {
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;
  using std::enable_shared_from_this<Connection<Stream>>::shared_from_this;
  using std::enable_shared_from_this<Connection<Stream>>::weak_from_this;

 public:
  // `args`: the socket, then (TLS) the server's ssl::context.
  // `peer_slot`: the client address's count in Impl::per_peer.
  template <typename... Args>
  Connection(std::shared_ptr<HttpServer::Impl> server, PeerLimit::Slot peer_slot, Args&&... args)
      : server_(std::move(server)), peer_slot_(std::move(peer_slot)), stream_(std::forward<Args>(args)...) {
    beast::error_code ec;
    const tcp::endpoint remote = Lowest().socket().remote_endpoint(ec);
    if (!ec) {
      peer_ = remote.address().is_v6() ? absl::StrCat("[", remote.address().to_string(), "]:", remote.port())
                                       : absl::StrCat(remote.address().to_string(), ":", remote.port());
    }
  }

  ~Connection() {
    if (!closed_) server_->not_closed.fetch_sub(1);
    server_->open.fetch_sub(1);
    absl::MutexLock lock(&server_->mu);
    server_->connections.erase(this);
  }

  void Start() {
    server_->not_closed.fetch_add(1);
    {
      absl::MutexLock lock(&server_->mu);
      server_->connections[this] = weak_from_this();
    }
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Handshake(); });
  }

  void PostCloseWhenWritten() override {
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->CloseWhenWritten(); });
  }
  void PostClose() override {
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->Close(); });
  }

  // On the strand: ends the connection (pending operations complete with
  // operation_aborted).
  void Close() {
    if (closed_) return;
    closed_ = true;
    server_->not_closed.fetch_sub(1);
    // A reply that will never be whole: whatever the cause (a write
    // timeout, the server's stop, a client sending too much), its work is
    // for nobody, as when the client goes away.
    if (awaiting_reply_ && on_client_gone_) {
      std::function<void()> fn = std::move(on_client_gone_);
      on_client_gone_ = nullptr;
      fn();
    }
    // No TLS close_notify: every reply is framed (Content-Length or the
    // last chunk), so a client knows it has it all; waiting for the peer's
    // close_notify would let a client hold the socket.
    beast::error_code ec;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ec);
    Lowest().close();
    write_timer_.cancel();
    // Chunks not yet written never will be.
    while (!out_.empty()) {
      if (out_.front().on_written) out_.front().on_written(false);
      out_.pop_front();
    }
  }

  // Any thread: runs `fn` on the strand (unless the server stopped).
  template <typename Fn>
  void OnStrand(Fn&& fn) {
    server_->PostUnlessStopped(stream_.get_executor(), std::forward<Fn>(fn));
  }

  // On the strand: Close once the queued bytes are out (now if none are).
  void CloseWhenWritten() {
    if (pending_reply_) {
      pending_reply_->close = true;  // written once the watching read has returned
    } else if (writing_ || writing_reply_ || !out_.empty()) {
      close_when_written_ = true;
    } else {
      Close();
    }
  }

  // Any thread: writes `response` on the strand, then reads the next
  // request (or closes).
  void PostReply(HttpResponse response) {
    OnStrand([self = shared_from_this(), r = std::move(response)]() mutable { self->Write(std::move(r), false); });
  }

  // The request being answered: an exchange's strand operations carry its
  // number, and those of an earlier request on this connection are dropped.
  uint64_t request_id() const { return request_id_; }

  // Streamed replies, on the strand (HttpExchange's StartStream, Write,
  // EndStream, OnClientGone). For HTTP/1.1 the bytes are chunked encoding
  // written by hand: the status line and headers, then "<hex size>\r\n
  // <data>\r\n" per chunk, "0\r\n\r\n" at the end, after which a kept-alive
  // connection reads its next request (clients and proxies pool
  // connections; TLS would otherwise pay a handshake per streamed request).
  // An HTTP/1.0 client knows no chunks: it gets the bytes as they are and
  // the end of the body is the connection's close.
  void StreamStart(int status, const std::string& content_type) {
    const auto code = bhttp::int_to_status(static_cast<unsigned>(status));
    const beast::string_view reason = bhttp::obsolete_reason(code);
    chunked_ = version_ >= 11;
    Enqueue(absl::StrCat("HTTP/1.1 ", status, " ", absl::string_view(reason.data(), reason.size()),
                         "\r\nServer: decoded\r\nContent-Type: ", content_type, "\r\nCache-Control: no-cache\r\n",
                         chunked_ ? "Transfer-Encoding: chunked\r\n" : "",
                         chunked_ && keep_alive_ ? "" : "Connection: close\r\n", "\r\n"),
            nullptr);
    Watch();
  }
  void StreamWrite(const std::string& data, std::function<void(bool)> on_written) {
    if (data.empty()) {  // an empty chunk would end the body
      if (on_written) on_written(!closed_);
      return;
    }
    Enqueue(chunked_ ? absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n") : data, std::move(on_written));
  }
  void StreamEnd() {
    if (stream_ended_) return;
    stream_ended_ = true;
    if (chunked_) return Enqueue("0\r\n\r\n", nullptr);
    if (writing_ || !out_.empty()) {
      close_when_written_ = true;
    } else {
      awaiting_reply_ = false;
      Close();
    }
  }
  void SetOnClientGone(std::function<void()> fn) {
    if (client_gone_) {
      if (fn) fn();
      return;
    }
    on_client_gone_ = std::move(fn);
  }

 private:
  struct Chunk {
    std::string bytes;
    std::function<void(bool)> on_written;
  };

  void Enqueue(std::string bytes, std::function<void(bool)> on_written) {
    if (closed_) {
      if (on_written) on_written(false);
      return;
    }
    out_.push_back(Chunk{std::move(bytes), std::move(on_written)});
    if (!writing_) WriteNext();
  }

  // One chunk at a time, each within write_timeout (a client that stops
  // reading ends its connection instead of holding it and its session).
  // Its own timer, not the tcp_stream's (which has none set while a reply
  // is pending, see OnRequest): that one would also end the watching read.
  void WriteNext() {
    writing_ = true;
    write_timer_.expires_after(ToChrono(server_->options.write_timeout));
    write_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && self->writing_) self->Close();
    });
    asio::async_write(stream_, asio::buffer(out_.front().bytes),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        self->writing_ = false;
                        self->write_timer_.cancel();
                        if (ec || self->out_.empty()) return self->Close();
                        Chunk done = std::move(self->out_.front());
                        self->out_.pop_front();
                        if (done.on_written) done.on_written(true);
                        if (!self->out_.empty()) return self->WriteNext();
                        if (self->stream_ended_) self->awaiting_reply_ = false;
                        if (self->close_when_written_) return self->Close();
                        if (self->stream_ended_) self->AfterStream();
                      });
  }

  // From a request's end until its reply is complete the socket is read for
  // the client going away (EOF or an error: then OnClientGone's callback
  // runs and the connection ends). Bytes it sends meanwhile (a pipelined
  // request) are kept for the next read, up to kMaxBufferedWhileWaiting,
  // beyond which it is no longer watched. A whole reply cancels the watch
  // and is written once the read has returned.
  static constexpr size_t kMaxBufferedWhileWaiting = 64 << 10;

  void Watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->watching_ = false;
      if (self->closed_) return;
      if (!ec) {
        self->buffer_.commit(n);
        if (self->pending_reply_) return self->FlushPendingReply();
        if (self->read_after_watch_) {
          self->read_after_watch_ = false;
          return self->ReadHeader();
        }
        if (self->buffer_.size() < kMaxBufferedWhileWaiting) return self->Watch();
        // A client that sends this much while its reply is pending could
        // not be watched any more: it loses the connection and its turn.
        return self->Close();
      }
      if (ec == asio::error::operation_aborted && self->pending_reply_) return self->FlushPendingReply();
      if (ec == asio::error::operation_aborted && self->read_after_watch_) {
        self->read_after_watch_ = false;
        return self->ReadHeader();
      }
      self->client_gone_ = true;
      if (self->on_client_gone_) {
        std::function<void()> fn = std::move(self->on_client_gone_);
        fn();
      }
      self->Close();
    });
  }

  // A streamed reply is out: the next request on a kept-alive connection,
  // once the watching read has returned (cancelled, or with the first bytes
  // of a pipelined request, which stay in the buffer).
  void AfterStream() {
    if (!keep_alive_ || !chunked_) return Close();
    stream_ended_ = false;
    on_client_gone_ = nullptr;
    if (!watching_) return ReadHeader();
    read_after_watch_ = true;
    beast::error_code ignored;
    Lowest().socket().cancel(ignored);
  }

  void FlushPendingReply() {
    PendingReply p = std::move(*pending_reply_);
    pending_reply_.reset();
    Write(std::move(p.response), p.close);
  }

  // TLS: the handshake, within request_timeout (a client that opens a
  // connection and says nothing holds it that long at most, as in
  // plaintext), then the first request.
  void Handshake() {
    if constexpr (kTls) {
      Lowest().expires_after(ToChrono(server_->options.request_timeout));
      stream_.async_handshake(asio::ssl::stream_base::server, [self = shared_from_this()](beast::error_code ec) {
        if (ec) {
          // A plaintext client, a bad certificate on its side, a timeout:
          // nobody to answer in HTTP.
          self->server_->tls_handshakes_failed.fetch_add(1);
          return self->Close();
        }
        self->ReadHeader();
      });
    } else {
      ReadHeader();
    }
  }

  void ReadHeader() {
    head_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(std::min<int64_t>(server_->options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(static_cast<std::uint64_t>(server_->options.max_body_bytes));
    Lowest().expires_after(ToChrono(server_->options.request_timeout));
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    // curl and others wait for 100 Continue before a large body.
    const auto& req = parser_->get();
    // RFC 9112: a request's transfer coding is chunked, last, or the
    // framing is unknown (a body read otherwise would be taken for the
    // next request); a coding the server does not decode is 501.
    if (const auto te = req.find(bhttp::field::transfer_encoding); te != req.end()) {
      if (req.version() < 11) return Refuse(400, "HTTP/1.0 has no transfer codings");
      const std::string codings = absl::AsciiStrToLower(
          absl::StripAsciiWhitespace(absl::string_view(te->value().data(), te->value().size())));
      if (codings != "chunked") {
        return absl::EndsWith(codings, "chunked")
                   ? Refuse(501, absl::StrCat("transfer coding \"", codings, "\" is not supported: chunked only"))
                   : Refuse(400, "the request's last transfer coding must be chunked");
      }
    }
    if (req.version() >= 11 && req.find(bhttp::field::host) == req.end()) {
      return Refuse(400, "an HTTP/1.1 request needs a Host header");
    }
    const auto expect = req.find(bhttp::field::expect);
    if (expect != req.end() && !absl::EqualsIgnoreCase(absl::string_view(expect->value().data(), expect->value().size()),
                                                       "100-continue")) {
      return Refuse(417, "only \"Expect: 100-continue\" is supported");
    }
    if (expect != req.end() && absl::EqualsIgnoreCase(absl::string_view(expect->value().data(), expect->value().size()),
                                                      "100-continue") &&
        !parser_->is_done()) {
      static constexpr absl::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                        [self = shared_from_this()](beast::error_code wec, size_t) {
                          if (wec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    bhttp::async_read(stream_, buffer_, *parser_,
                      [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRequest(ec); });
  }

  void OnReadError(beast::error_code ec) {
    if (ec == bhttp::error::header_limit) {
      // The limit counts the request line too; when that line alone does
      // not end within it, the target is what is too long: 414 (RFC 9110
      // 15.5.15), as nginx answers a request line that overflows its header
      // buffer. Beast parses the request line once it has it whole (then
      // the target is set); until then the bytes stay in the buffer.
      const absl::string_view read(static_cast<const char*>(buffer_.data().data()), buffer_.size());
      if (parser_->get().target().empty() &&
          !absl::StrContains(read.substr(0, static_cast<size_t>(server_->options.max_header_bytes)), "\r\n")) {
        return Refuse(414, "request target too long");
      }
      return Refuse(431, "request header fields too large");
    }
    if (ec == bhttp::error::body_limit) {
      return Refuse(413, absl::StrCat("request body larger than ", server_->options.max_body_bytes, " bytes"));
    }
    // Beast's parse errors get a 400; a message cut short, a timeout, a
    // reset or a close leave nobody to answer.
    const bool parse_error = ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category() &&
                             ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message &&
                             ec != bhttp::error::short_read;
    if (!parse_error) return Close();
    Refuse(400, absl::StrCat("malformed HTTP request: ", ec.message()));
  }

  void Refuse(int status, absl::string_view message) {
    server_->requests_refused.fetch_add(1);
    Write(PlainError(status, message), /*close=*/true);
  }

  void OnRequest(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    bhttp::request<bhttp::string_body> req = parser_->release();
    parser_.reset();
    keep_alive_ = req.keep_alive();
    version_ = req.version();
    head_ = req.method() == bhttp::verb::head;
    awaiting_reply_ = true;
    on_client_gone_ = nullptr;  // an earlier request's
    auto exchange = std::make_shared<Exchange>(shared_from_this(), ++request_id_);
    HttpRequest& r = exchange->req;
    r.method = std::string(req.method_string());
    absl::string_view target(req.target().data(), req.target().size());
    // The absolute form (a proxy's "http://host/path"): the path is what
    // follows the authority.
    for (absl::string_view scheme : {"http://", "https://"}) {
      if (absl::StartsWithIgnoreCase(target, scheme)) {  // a scheme is case-insensitive
        target.remove_prefix(scheme.size());
        const size_t slash = target.find_first_of("/?");
        target = slash == absl::string_view::npos ? "/" : target.substr(slash);
        break;
      }
    }
    const size_t q = target.find('?');
    r.path = std::string(target.substr(0, q));
    if (q != absl::string_view::npos) r.query = std::string(target.substr(q + 1));
    for (const auto& field : req) {
      std::string name = absl::AsciiStrToLower(absl::string_view(field.name_string().data(), field.name_string().size()));
      const absl::string_view value(field.value().data(), field.value().size());
      auto [it, inserted] = r.headers.try_emplace(std::move(name), value);
      if (!inserted) absl::StrAppend(&it->second, ", ", value);
    }
    r.body = std::move(req.body());
    r.peer = peer_;
    server_->requests.fetch_add(1);
    // Until this request is answered the connection only watches for the
    // client going away.
    Lowest().expires_never();
    server_->handler(std::move(exchange));
    Watch();
  }

  void Write(HttpResponse r, bool close) {
    if (watching_) {  // the watching read returns first (cancelled), then this is written
      pending_reply_ = PendingReply{std::move(r), close};
      beast::error_code ignored;
      Lowest().socket().cancel(ignored);
      return;
    }
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>();
    res->version(11);
    res->result(static_cast<unsigned>(r.status));
    res->set(bhttp::field::server, "decoded");
    res->set(bhttp::field::content_type, r.content_type);
    for (auto& [name, value] : r.headers) res->set(name, value);
    res->keep_alive(keep_alive_ && !close);
    if (head_) {
      // HEAD: the GET reply's headers, its length included, and no body.
      res->content_length(r.body.size());
    } else {
      res->body() = std::move(r.body);
      res->prepare_payload();
    }
    Lowest().expires_after(ToChrono(server_->options.write_timeout));
    writing_reply_ = true;
    bhttp::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
      self->writing_reply_ = false;
      if (!ec) self->awaiting_reply_ = false;
      if (ec || !res->keep_alive() || self->close_when_written_) return self->Close();
      self->ReadHeader();
    });
  }

  // HttpExchange of one request: replies through the connection's strand.
  // Its stream operations are dropped once the connection has moved on to a
  // later request (a callback that fires after the stream's end).
  struct Exchange : HttpExchange {
    Exchange(std::shared_ptr<Connection> c, uint64_t request_id) : conn(std::move(c)), id(request_id) {}
    ~Exchange() override {
      if (!responded.exchange(true)) {
        conn->PostReply(OpenAiError(500, "server_error", "the request was dropped without a reply"));
      } else if (streaming) {
        EndStream();
      }
    }
    const HttpRequest& request() const override { return req; }
    void Respond(HttpResponse response) override {
      if (responded.exchange(true)) return;
      conn->PostReply(std::move(response));
    }
    void StartStream(int status, std::string content_type) override {
      if (responded.exchange(true)) return;
      streaming = true;
      conn->OnStrand([c = conn, status, ct = std::move(content_type)] { c->StreamStart(status, ct); });
    }
    void Write(std::string data, std::function<void(bool)> on_written) override {
      if (!streaming || ended) {
        if (on_written) on_written(false);
        return;
      }
      conn->OnStrand([c = conn, id = id, d = std::move(data), cb = std::move(on_written)]() mutable {
        if (c->request_id() != id) {
          if (cb) cb(false);
          return;
        }
        c->StreamWrite(d, std::move(cb));
      });
    }
    void EndStream() override {
      if (!streaming || ended.exchange(true)) return;
      conn->OnStrand([c = conn, id = id] {
        if (c->request_id() == id) c->StreamEnd();
      });
    }
    void OnClientGone(std::function<void()> fn) override {
      conn->OnStrand([c = conn, id = id, f = std::move(fn)]() mutable {
        if (c->request_id() == id) c->SetOnClientGone(std::move(f));
      });
    }
    std::shared_ptr<Connection> conn;
    const uint64_t id;
    HttpRequest req;
    std::atomic<bool> responded{false};
    std::atomic<bool> streaming{false};
    std::atomic<bool> ended{false};
  };

  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  std::shared_ptr<HttpServer::Impl> server_;
  const PeerLimit::Slot peer_slot_;  // released as the connection goes
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string peer_;
  bool keep_alive_ = false;
  bool head_ = false;             // the request is HEAD
  bool awaiting_reply_ = false;   // a request is in, its reply not all written
  bool writing_reply_ = false;    // a whole reply is being written
  unsigned version_ = 11;  // the request's HTTP version, 10 or 11
  uint64_t request_id_ = 0;
  bool chunked_ = true;            // the streamed reply's framing
  bool read_after_watch_ = false;  // a stream ended: read the next request once the watch returns
  // Streaming (strand only).
  asio::steady_timer write_timer_{stream_.get_executor()};
  std::deque<Chunk> out_;
  bool writing_ = false;
  bool closed_ = false;
  bool stream_ended_ = false;
  bool client_gone_ = false;
  bool close_when_written_ = false;
  std::function<void()> on_client_gone_;
  bool watching_ = false;
  struct PendingReply {
    HttpResponse response;
    bool close;
  };
  std::optional<PendingReply> pending_reply_;
};

// TLS 1.2 and 1.3 only, no compression (CRIME) and no renegotiation (a
// client could make the server redo handshakes at will); the certificate
// chain and key are PEM files, checked to match here so a bad pair fails at
// start, not at the first client.
absl::StatusOr<asio::ssl::context> MakeTlsContext(const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("HTTP TLS: the certificate chain and the key go together: give both, or neither");
  }
  asio::ssl::context ctx(asio::ssl::context::tls_server);
  beast::error_code ec;
  ctx.set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                      asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1 |
                      asio::ssl::context::no_compression | asio::ssl::context::single_dh_use,
                  ec);
  if (!ec) SSL_CTX_set_options(ctx.native_handle(), SSL_OP_NO_RENEGOTIATION);
  if (!ec) ctx.use_certificate_chain_file(cert_file, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP TLS: certificate chain ", cert_file, " is not usable: ", ec.message()));
  }
  ctx.use_private_key_file(key_file, asio::ssl::context::pem, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("HTTP TLS: key ", key_file, " is not usable: ", ec.message()));
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP TLS: key ", key_file, " does not match the certificate ", cert_file));
  }
  return ctx;
}

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor.async_accept(asio::make_strand(ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
    if (!ec) {
      self->accepted.fetch_add(1);
      beast::error_code addr_ec;
      std::string address = socket.remote_endpoint(addr_ec).address().to_string();
      if (addr_ec) address.clear();
      std::optional<PeerLimit::Slot> slot = self->open.load() < self->options.max_connections
                                                ? self->per_peer->TryAcquire(std::move(address))
                                                : std::nullopt;
      if (!slot.has_value()) {
        self->refused.fetch_add(1);
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        self->open.fetch_add(1);
        if (self->tls.has_value()) {
          std::make_shared<Connection<beast::ssl_stream<beast::tcp_stream>>>(self, *std::move(slot), std::move(socket),
                                                                              *self->tls)
              ->Start();
        } else {
          std::make_shared<Connection<beast::tcp_stream>>(self, *std::move(slot), std::move(socket))->Start();
        }
      }
    }
    if (!ec) return self->Accept();
    // Out of descriptors and the like: try again shortly (once connections
    // have closed), not at once, which would spin on the error.
    self->accept_retry.expires_after(std::chrono::milliseconds(50));
    self->accept_retry.async_wait([self](beast::error_code wait_ec) {
      if (!wait_ec && self->acceptor.is_open()) self->Accept();
    });
  });
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options, HttpHandler handler) {
  if (options.threads < 1 || options.max_connections < 1 || options.max_header_bytes < 1024 ||
      options.max_body_bytes < 1) {
    return absl::InvalidArgumentError(
        "HTTP server: threads and max_connections must be >= 1, max_header_bytes >= 1024, max_body_bytes >= 1");
  }
  absl::StatusOr<HostPort> hp = SplitAddress(options.listen);
  if (!hp.ok()) return hp.status();
  auto impl = std::make_shared<Impl>();
  impl->options = options;
  impl->per_peer = std::make_unique<PeerLimit>(options.max_connections_per_peer);
  impl->handler = std::move(handler);
  beast::error_code ec;
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    absl::StatusOr<asio::ssl::context> tls = MakeTlsContext(options.tls_cert_file, options.tls_key_file);
    if (!tls.ok()) return tls.status();
    impl->tls.emplace(*std::move(tls));
  }
  tcp::resolver resolver(impl->ioc);
  const auto found = resolver.resolve(hp->host.empty() ? "::" : hp->host, hp->port,
                                      tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || found.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP listen address \"", options.listen,
                                                   "\" does not resolve: ", ec.message()));
  }
  const tcp::endpoint endpoint = found.begin()->endpoint();
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec && endpoint.protocol() == tcp::v6()) impl->acceptor.set_option(asio::ip::v6_only(false), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("HTTP: cannot listen on ", options.listen, ": ", ec.message()));
  impl->port = impl->acceptor.local_endpoint(ec).port();
  impl->Accept();
  for (int i = 0; i < options.threads; ++i) {
    impl->threads.emplace_back([io = impl.get()] { io->ioc.run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }

HttpServerCounters HttpServer::Counters() const {
  return HttpServerCounters{impl_->open.load(),     impl_->accepted.load(),         impl_->refused.load(),
                            impl_->requests.load(), impl_->requests_refused.load(), impl_->tls_handshakes_failed.load()};
}

void HttpServer::Stop(absl::Time graceful_until) {
  // The references taken under the lock are dropped after it: the last one
  // to a connection runs its destructor, which takes the lock.
  std::vector<std::shared_ptr<ConnectionBase>> live;
  auto collect_live = [this, &live] {  // under impl_->mu
    live.clear();
    for (auto& [ptr, weak] : impl_->connections) {
      if (std::shared_ptr<ConnectionBase> c = weak.lock()) live.push_back(std::move(c));
    }
  };
  {
    absl::MutexLock lock(&impl_->mu);
    if (impl_->stopped) return;
    asio::post(impl_->acceptor.get_executor(), [impl = impl_] {
      beast::error_code ignored;
      impl->acceptor.close(ignored);
      impl->accept_retry.cancel();
    });
    collect_live();
    for (const std::shared_ptr<ConnectionBase>& c : live) c->PostCloseWhenWritten();
  }
  live.clear();
  while (impl_->not_closed.load() > 0 && absl::Now() < graceful_until) absl::SleepFor(absl::Milliseconds(5));
  {
    absl::MutexLock lock(&impl_->mu);
    // Closes go out before `stopped`: they must still be posted.
    collect_live();
    for (const std::shared_ptr<ConnectionBase>& c : live) c->PostClose();
    impl_->stopped = true;
  }
  live.clear();
  impl_->work.reset();
  // With the acceptor and every socket closed, run() returns once the
  // handlers those closes complete have run.
  for (std::thread& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace decoded::server::http
