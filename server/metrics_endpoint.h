// The Prometheus /metrics HTTP endpoint: prometheus-cpp's Exposer (civetweb)
// on one address, serving the registered collectables.
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
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace decoded::server {

class MetricsEndpoint {
 public:
  // Serves `collectables` at http://`address`/metrics ("host:port"; port 0
  // picks a free one). INVALID_ARGUMENT when the address cannot be bound
  // (prometheus-cpp throws; the exception stops here).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& address, const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables);
  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  int port() const;

 private:
  MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer, std::string host)
      : exposer_(std::move(exposer)), host_(std::move(host)) {}

  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string host_;  // where to connect to wake the accept loop
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_METRICS_ENDPOINT_H_
