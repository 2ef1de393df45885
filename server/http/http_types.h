// A request, its reply and the exchange that carries one to the other:
// what server/http/http_server.h hands its handler.
#ifndef DECODED_SERVER_HTTP_HTTP_TYPES_H_
#define DECODED_SERVER_HTTP_HTTP_TYPES_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace decoded::server::http {

struct HttpRequest {
  std::string method;  // "GET", "POST", ... as sent
  std::string path;    // the target up to '?'
  std::string query;   // after '?', "" if none
  // Header names in lower case; a repeated header's values joined with ", ".
  absl::flat_hash_map<std::string, std::string> headers;
  std::string body;
  std::string peer;  // the client's address, "ip:port"

  // The header's value, "" when absent.
  const std::string& header(const std::string& lower_case_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // more headers (e.g. "Allow")
};

// One request and its reply, answered once from any thread: either whole
// (Respond) or streamed (StartStream, Write..., EndStream: server-sent
// events). Everything is written on the connection's own strand, in call
// order. An exchange dropped without a reply answers 500 (a handler bug
// must not hang its client); one dropped mid-stream ends the stream.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;
  virtual void Respond(HttpResponse response) = 0;

  // A streamed reply: `status` and `content_type` with chunked transfer
  // encoding, and the connection ends after it (no keep-alive: the socket
  // is watched for the client going away meanwhile, see OnClientGone).
  virtual void StartStream(int status, std::string content_type) = 0;
  // One chunk of the body. `on_written` (optional) runs on an io thread with
  // true once the socket took the bytes, or false if the connection ended
  // first: what a producer paces itself by (backpressure).
  virtual void Write(std::string data, std::function<void(bool)> on_written = nullptr) = 0;
  // The end of the body; the connection then closes.
  virtual void EndStream() = 0;
  // `fn` runs once, on an io thread, if the client closes or resets the
  // connection before the reply is complete (at once if it already did), so
  // the producer can stop: the socket is watched from the request's end.
  virtual void OnClientGone(std::function<void()> fn) = 0;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

}  // namespace decoded::server::http

#endif  // DECODED_SERVER_HTTP_HTTP_TYPES_H_
