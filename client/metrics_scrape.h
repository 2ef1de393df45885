// Reads the daemon's Prometheus /metrics (text exposition format 0.0.4,
// https://prometheus.io/docs/instrumenting/exposition_formats/) over plain
// HTTP/1.0, for clients that check gauges after a run (decoded-loadgen).
#ifndef DECODED_CLIENT_METRICS_SCRAPE_H_
#define DECODED_CLIENT_METRICS_SCRAPE_H_

#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace decoded::client {

// The body of GET /metrics from `address` ("host:port", e.g.
// "127.0.0.1:9464"). INVALID_ARGUMENT when the address has no port;
// UNAVAILABLE when the host does not resolve, the connection fails or the
// reply is not an HTTP 200.
absl::StatusOr<std::string> ScrapeMetrics(const std::string& address);

// The value of the sample named `series` (metric name with its labels exactly
// as exposed, e.g. `decoded_sessions_total{outcome="error"}`) in an
// exposition body; nullopt when no line holds it.
std::optional<double> MetricSample(absl::string_view body, absl::string_view series);

}  // namespace decoded::client

#endif  // DECODED_CLIENT_METRICS_SCRAPE_H_
