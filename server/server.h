// The decoded gRPC server: the Decoder service, grpc.health.v1 health,
// server reflection (v1 and v1alpha), and the Prometheus endpoint, started
// before the model so health can say NOT_SERVING while it loads.
//
// Connections come from the daemon's own Listener (server/listener.h:
// connection limits, in all and per client, and it survives running out of
// file descriptors); plaintext ones pass through the HTTP/2 guard
// (server/http2_guard.h: header blocks and resets bounded at the frame
// level). Further HTTP/2 limits are gRPC channel arguments: at most
// max_streams_per_connection concurrent streams per connection, the handshake
// within handshake_timeout, keepalive pings to notice dead clients.
//
// The listener watchdog probes the listening address every
// listener_probe_interval with a new connection (server/listener_probe.h).
// When the listener stops accepting (kListenerProbeFailures probes in a row,
// or its socket fails), health turns NOT_SERVING for good, the reason is
// logged, and on_listener_failure is called: the daemon then drains and exits
// non-zero so that its supervisor (Docker's HEALTHCHECK and restart policy,
// Kubernetes' probes) restarts it.
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
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "grpcpp/grpcpp.h"
#include "server/decoder_service.h"
#include "server/health_service.h"
#include "server/http/http_server.h"
#include "server/http/openai_routes.h"
#include "server/http2_guard.h"
#include "server/listener.h"
#include "server/metrics.h"
#include "server/reflection_service.h"
#include "server/request_pool.h"
#include "server/reset_guard.h"

namespace decoded::server {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // port 0 picks a free port
  std::string metrics_listen;              // empty: no /metrics endpoint
  // The OpenAI API over HTTP/1.1 (server/http/openai_routes.h); empty: off.
  std::string http_listen;
  // What /v1/models lists and requests name as "model".
  std::string served_model_name;
  std::string tls_cert_file;               // both set: TLS on gRPC and HTTP, else plaintext
  std::string tls_key_file;
  std::string auth_token;                  // non-empty: bearer token required (Decoder, reflection)
  std::string metrics_auth_token;          // non-empty: bearer token required on /metrics
  // Health turns NOT_SERVING while a worker has been inside one step for
  // longer than this (a wedged engine), and SERVING again once it returns.
  absl::Duration stuck_step_threshold = absl::Seconds(30);

  // Connections and streams (server/listener.h, server/stream_registry.h).
  int max_connections = 1024;            // on each door: gRPC, and HTTP (http_listen)
  int max_streams_per_connection = 100;  // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS
  int max_streams = 1024;                // Generate streams, all connections
  int max_sessions_per_peer = 0;         // 0: no limit
  int max_streams_per_peer = 256;        // Generate streams of one client address; 0: no limit
  int max_connections_per_peer = 64;     // connections of one client address; 0: no limit
  // A Generate stream idle this long ends (see GenerateReactor);
  // InfiniteDuration: never.
  absl::Duration idle_session_timeout = absl::Seconds(300);
  // A Generate stream that sent no turn this long after opening ends.
  absl::Duration first_turn_timeout = absl::Seconds(30);
  // A connection older than this gets a GOAWAY (GRPC_ARG_MAX_CONNECTION_AGE,
  // +-10% jitter): its client opens a new one for its next streams, through
  // a fresh name resolution, so replicas added behind a Service or balancer
  // get existing clients' new sessions. Streams already open on it keep
  // running to their end (no grace limit). InfiniteDuration: never.
  absl::Duration max_connection_age = absl::Seconds(300);
  // A connection that has not finished its handshake (TLS, HTTP/2 preface
  // and SETTINGS) by then is closed.
  absl::Duration handshake_timeout = absl::Seconds(10);
  // A connection whose client resets streams faster than this (per second,
  // with twice as many at once) is closed (server/reset_guard.h). 0: no limit.
  double max_stream_resets_per_second = 500;
  // Request metadata beyond this is refused on its own stream
  // (RESOURCE_EXHAUSTED); see docs/deploy.md for what gRPC 1.51 does beyond
  // kMaxMetadataTransportBytes.
  int64_t max_metadata_bytes = 8192;

  // The listener watchdog: a new connection to the listening address every
  // interval; kListenerProbeFailures failures in a row mean the listener no
  // longer accepts. ZeroDuration: no probe.
  absl::Duration listener_probe_interval = absl::Seconds(5);
  // Called once (on a server thread) when the listener stops accepting, after
  // health has turned NOT_SERVING: the daemon drains and exits non-zero.
  std::function<void(const absl::Status&)> on_listener_failure;

  // Request pools (server/request_pool.h).
  int turn_threads = 2;
  int turn_queue = 64;
  int utility_threads = 1;
  int utility_queue = 16;
};

// Failed probes in a row before the listener counts as dead.
inline constexpr int kListenerProbeFailures = 3;
// What the HTTP/2 transport itself accepts as one request's metadata (its
// HPACK soft limit); the daemon refuses beyond max_metadata_bytes itself.
inline constexpr int kMaxMetadataTransportBytes = 1 << 20;
// A header block may encode a little more than it decodes to (length
// prefixes); beyond the metadata limit and this, the guard ends the connection.
inline constexpr int64_t kMaxHeaderBlockSlack = 64 << 10;

class DecodedServer {
 public:
  // UNAVAILABLE when the address cannot be bound; INVALID_ARGUMENT for a bad
  // address or unreadable TLS files.
  static absl::StatusOr<std::unique_ptr<DecodedServer>> Start(const ServerOptions& options);
  ~DecodedServer();
  DecodedServer(const DecodedServer&) = delete;
  DecodedServer& operator=(const DecodedServer&) = delete;

  int port() const { return listener_->port(); }
  // Port of the HTTP front door; 0 when disabled.
  int http_port() const;
  // Port of the /metrics endpoint; 0 when disabled.
  int metrics_port() const;
  // The attached engine (null before AttachEngine).
  serving::Engine* engine() const { return engine_.get(); }
  ServerMetrics& metrics() { return *metrics_; }

  // Serves `engine` from now on and reports SERVING.
  void AttachEngine(std::unique_ptr<serving::Engine> engine);

  // See the file comment; returns once every RPC is done. Idempotent.
  void Drain(absl::Duration period);

  // Points `options`' step and device-loss callbacks at this server (its
  // metrics and health), for the engine AttachEngine will be given.
  void ObserveEngine(serving::EngineOptions& options);

  // The serving device was lost (EngineOptions::on_device_lost, or the
  // watchdog finding EngineStats::device_lost): health NOT_SERVING for good,
  // logged once. Thread-safe; any thread, before or after AttachEngine.
  void DeviceLost(const absl::Status& why) ABSL_LOCKS_EXCLUDED(health_mu_);

 private:
  DecodedServer() = default;
  // Health from what is known now: serving once an engine is attached,
  // unless a step is stuck, the listener failed, or a drain began.
  void UpdateHealth() ABSL_LOCKS_EXCLUDED(health_mu_);
  // Every half second: stuck steps (health) and idle streams.
  void Watchdog();
  // Every listener_probe_interval: a probe connection (ListenerFailed after
  // kListenerProbeFailures failures in a row).
  void ProbeListener();
  void ListenerFailed(const absl::Status& why) ABSL_LOCKS_EXCLUDED(health_mu_);
  ServerState State();
  // Serving, or why not, for the HTTP front door's /health.
  http::ServingState HttpServingState() ABSL_LOCKS_EXCLUDED(health_mu_);

  ServerOptions options_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  // Declared before the gRPC server, so they outlive it: their tasks finish
  // its calls.
  std::unique_ptr<RequestPool> turn_pool_;
  std::unique_ptr<RequestPool> utility_pool_;
  // The HTTP door's /metrics renders (with --http_listen): apart from the
  // turn pool, so a flood of unauthenticated scrapes cannot take turn slots.
  std::unique_ptr<RequestPool> scrape_pool_;
  std::unique_ptr<ResetGuard> resets_;  // TLS connections' resets; null without a limit or TLS
  std::unique_ptr<Http2Guard> guard_;   // plaintext connections' relay; outlives listener_
  std::unique_ptr<DecoderService> service_;
  std::unique_ptr<HealthService> health_;    // outlives server_ (declared before it)
  std::unique_ptr<ReflectionV1Service> reflection_v1_;
  std::unique_ptr<ReflectionV1AlphaService> reflection_v1alpha_;
  std::unique_ptr<serving::Engine> engine_;  // outlives server_ (declared before it)
  std::atomic<int64_t> engine_attached_unix_seconds_{0};
  std::shared_ptr<http::OpenAiCompletions> completions_;  // the HTTP turns; idle before engine_ goes
  std::unique_ptr<http::HttpServer> http_;   // stopped before engine_ goes (declared after it)
  std::unique_ptr<Listener> listener_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;  // owned by server_'s life
  std::atomic<bool> drained_{false};

  absl::Mutex health_mu_;
  bool attached_ ABSL_GUARDED_BY(health_mu_) = false;
  bool stuck_ ABSL_GUARDED_BY(health_mu_) = false;
  bool listener_failed_ ABSL_GUARDED_BY(health_mu_) = false;
  bool device_lost_ ABSL_GUARDED_BY(health_mu_) = false;  // for good: a lost device never returns
  bool draining_ ABSL_GUARDED_BY(health_mu_) = false;

  absl::Notification stop_threads_;
  std::thread watchdog_;
  std::thread prober_;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_SERVER_H_
