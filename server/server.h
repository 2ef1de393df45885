// The decoded gRPC server: the Decoder service, grpc.health.v1 health,
// server reflection, and the Prometheus endpoint, started before the model so
// health can say NOT_SERVING while it loads.
//
// Order of life: Start (NOT_SERVING, RPCs answer UNAVAILABLE) -> AttachEngine
// (SERVING) -> Drain -> destruction (engine after server).
//
// Drain(period), all within `period`:
//   at once     health NOT_SERVING for every watcher, then the health service
//               shuts down, which ends open grpc.health.v1 Watch calls
//               (server/health_service.h); new
//               RPCs and new turns get UNAVAILABLE; idle Generate streams
//               end with UNAVAILABLE; a stream whose turn runs ends after
//               that turn's TurnEnd.
//   cut point   (period minus a reserve for teardown) turns still running
//               end with finish reason SHUTDOWN and their streams with
//               UNAVAILABLE.
//   end         anything still open is cancelled; the gRPC server stops.
#ifndef DECODED_SERVER_SERVER_H_
#define DECODED_SERVER_SERVER_H_

#include <atomic>
#include <memory>
#include <thread>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "grpcpp/grpcpp.h"
#include "server/decoder_service.h"
#include "server/health_service.h"
#include "server/metrics.h"

namespace decoded::server {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // port 0 picks a free port
  std::string metrics_listen;              // empty: no /metrics endpoint
  std::string tls_cert_file;               // both set: TLS, else plaintext
  std::string tls_key_file;
  std::string auth_token;                  // non-empty: bearer token required
  // Health turns NOT_SERVING while a worker has been inside one step for
  // longer than this (a wedged engine), and SERVING again once it returns.
  absl::Duration stuck_step_threshold = absl::Seconds(30);
};

class DecodedServer {
 public:
  // UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT for a bad
  // metrics address or unreadable TLS files.
  static absl::StatusOr<std::unique_ptr<DecodedServer>> Start(const ServerOptions& options);
  ~DecodedServer();
  DecodedServer(const DecodedServer&) = delete;
  DecodedServer& operator=(const DecodedServer&) = delete;

  int port() const { return port_; }
  // Port of the /metrics endpoint; 0 when disabled.
  int metrics_port() const;
  // The attached engine (null before AttachEngine).
  serving::Engine* engine() const { return engine_.get(); }
  ServerMetrics& metrics() { return *metrics_; }

  // Serves `engine` from now on and reports SERVING.
  void AttachEngine(std::unique_ptr<serving::Engine> engine);

  // See the file comment; returns once every RPC is done. Idempotent.
  void Drain(absl::Duration period);

 private:
  DecodedServer() = default;
  void SetServing(bool serving);
  // Polls the engine's longest running step and flips health accordingly.
  void WatchForStuckSteps();

  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  std::unique_ptr<DecoderService> service_;
  std::unique_ptr<HealthService> health_;    // outlives server_ (declared before it)
  std::unique_ptr<serving::Engine> engine_;  // outlives server_ (declared before it)
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Duration stuck_step_threshold_;
  std::atomic<bool> drained_{false};
  absl::Notification stop_watchdog_;
  std::thread watchdog_;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_SERVER_H_
