// The Prometheus /metrics HTTP endpoint: a civetweb server on one address
// whose one handler serializes the registered collectables with
// prometheus-cpp's TextSerializer (text format 0.0.4).
//
// Not prometheus::Exposer: it adds its own exposer_request_latencies summary,
// whose quantiles are NaN until a scrape has been timed and again after a
// minute without one, which tools that read every series (dashboards, the
// Gateway API endpoint picker's parser) trip over.
//
// Slow clients cannot starve scrapes: civetweb gives each connection one of
// kMetricsThreads worker threads for as long as it reads the request, and
// drops a connection whose request has not arrived within
// kMetricsRequestTimeout (prometheus-cpp's defaults, 2 threads and civetweb's
// 30 s, let two slowloris connections block scraping for 30 s). So up to
// kMetricsThreads - 1 connections that trickle their requests still leave a
// thread for the scraper; beyond that a scrape waits for a thread, each freed
// within the timeout (a scraper's request arrives in one packet: a second is
// plenty).
//
// With a token, a request without "Authorization: Bearer <token>" gets 401
// (Prometheus sends it with `authorization: {type: Bearer, credentials: ...}`
// in its scrape config), checked before anything is collected.
//
// Stopping is fast: civetweb's accept loop only notices a stop request when
// its poll() wakes, which takes up to a second on an idle port (measured: the
// daemon's exit took 1.0 s longer with /metrics enabled). The destructor wakes
// it with a connection to its own port, so it returns within milliseconds and
// a drain fits --drain_seconds.
//
// Thread-safety: construction and destruction on one thread; port() on any.
#ifndef DECODED_SERVER_METRICS_ENDPOINT_H_
#define DECODED_SERVER_METRICS_ENDPOINT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/collectable.h"

struct mg_connection;  // civetweb.h
class CivetServer;     // CivetServer.h
struct CivetCallbacks;  // civetweb.h

namespace decoded::server {

inline constexpr int kMetricsThreads = 32;
inline constexpr absl::Duration kMetricsRequestTimeout = absl::Seconds(1);

class MetricsEndpoint {
 public:
  // Serves `collectables` at http://`address`/metrics ("host:port"; port 0
  // picks a free one). INVALID_ARGUMENT when the address cannot be bound
  // (civetweb throws; the exception stops here). The endpoint holds the
  // collectables weakly: one whose owner let it go is no longer scraped.
  // `auth_token` non-empty: requests must carry it as a bearer token.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables,
      const std::string& auth_token = "");
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const;

 private:
  MetricsEndpoint() = default;
  // civetweb's begin_request: 401 unless the bearer token matches.
  static int CheckToken(::mg_connection* conn);

  class Handler;

  std::string auth_token_;
  std::unique_ptr<CivetCallbacks> callbacks_;  // outlives the server
  std::unique_ptr<Handler> handler_;           // outlives the server
  std::unique_ptr<CivetServer> server_;
  std::string host_;  // where to connect to wake the accept loop
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_METRICS_ENDPOINT_H_
