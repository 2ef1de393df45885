// Prometheus metrics of the daemon (DESIGN.md section 4).
//
// Naming: no colons, base units (seconds, bytes), `_total` for counters,
// labels of small fixed sets only (outcome, phase, cpu_isa). Families owned by the
// registry are updated by the server as events happen; the engine's own
// counters and gauges (plan builds, rebinds, bound nodes, KV bytes and
// budget, busy and configured workers, queued turns) are read from
// Engine::Stats() at scrape time by EngineCollectable, so they can never
// drift from the engine's truth.
//
// Thread-safety: every member may be used from any thread.
#ifndef DECODED_SERVER_METRICS_H_
#define DECODED_SERVER_METRICS_H_

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/serving/engine.h"
#include "server/metrics_endpoint.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace decoded::server {

// Outcomes for decoded_streams_total{outcome} (every Generate stream) and
// decoded_sessions_total{outcome} (the streams that opened a session).
// kShutdown: the server ended the stream because it shuts down.
// kIdle: the server ended it after --idle_session_seconds without a turn, or
// of a client that took none of its events.
// How a stream or session ended. Refusals are split as HTTP splits its
// classes, so an error rate reads the server's health (TGI likewise counts its
// validation failures apart): kInvalid, the request's own fault (a malformed
// or out-of-range turn, a turn sent while one runs, a missing or wrong token:
// INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION, UNAUTHENTICATED,
// PERMISSION_DENIED; HTTP 400, 401, 403); kRejected, a server limit
// (RESOURCE_EXHAUSTED; HTTP 429); kError, the server's (a failed step, an
// internal error; HTTP 5xx).
enum class SessionOutcome { kOk, kClientGone, kShutdown, kIdle, kInvalid, kRejected, kError };

// The outcome of a stream or turn that ended with `code` (not OK).
SessionOutcome OutcomeOfError(absl::StatusCode code);

// The server's own figures, read at scrape time (like Engine::Stats()).
struct ServerState {
  int64_t connections_open = 0;
  int64_t connections_accepted_total = 0;
  int64_t connections_refused_total = 0;  // over --max_connections
  int64_t accept_errors_total = 0;
  int64_t connections_closed_for_resets_total = 0;  // server/reset_guard.h
  int64_t connections_closed_without_progress_total = 0;  // server/listener.h
  int64_t connections_closed_for_header_blocks_total = 0;  // server/http2_guard.h
  int64_t streams_open = 0;               // Generate streams, with or without a session
  int64_t turn_queue = 0;                 // turns waiting for the turn pool
  int64_t utility_queue = 0;              // Tokenize/Detokenize calls waiting for the utility pool
  // The HTTP front door (server/http/http_server.h), when --http_listen is set.
  int64_t http_connections_open = 0;
  int64_t http_connections_accepted_total = 0;
  int64_t http_connections_refused_total = 0;  // over its max_connections
  int64_t http_requests_total = 0;             // handed to the routes
  int64_t http_requests_refused_total = 0;     // 400 / 413 / 414 / 417 / 431 / 501 by the server itself
  int64_t http_tls_handshakes_failed_total = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // The engine whose Stats() the scrape reads; null before it is loaded.
  void SetEngine(const serving::Engine* engine);

  // Where the scrape reads ServerState from; unset, nothing is exported.
  void SetServerState(std::function<ServerState()> read);

  // Serves /metrics on `address` ("host:port"), behind a bearer token when
  // `auth_token` is set. INVALID_ARGUMENT when the address cannot be bound.
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Expose(const std::string& address,
                                                          const std::string& auth_token = "");

  // decoded_health_serving: what grpc.health.v1 reports (starts 0).
  void SetServing(bool serving);
  void SessionOpened();                       // decoded_sessions_active + 1
  void SessionClosed(SessionOutcome outcome); // decoded_sessions_active - 1, outcome counted
  void StreamEnded(SessionOutcome outcome);   // decoded_streams_total{outcome}
  void AdmissionRejected();
  // Counted per event so tokens of a turn cut short by a disconnect count too.
  void TokenGenerated();
  void TurnEnded(const serving::TurnEnd& end);
  void InterToken(double seconds);
  // decoded_step_duration_seconds by phase, decoded_step_tokens by phase,
  // and for decode steps decoded_batch_size (sessions stepped together).
  void Step(const serving::StepInfo& step);

  // Body of a scrape, as the exposer serves it (the HTTP door's /metrics,
  // tests). Any thread.
  std::string Render() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> engine_collectable_;
  std::shared_ptr<prometheus::Collectable> server_collectable_;
  std::shared_ptr<prometheus::Collectable> process_collectable_;  // process_* (server/process_metrics.h)
  std::shared_ptr<absl::Mutex> server_state_mu_;
  std::shared_ptr<std::function<ServerState()>> server_state_;
  std::shared_ptr<std::atomic<const serving::Engine*>> engine_;

  prometheus::Gauge* sessions_active_;
  prometheus::Gauge* health_serving_;
  prometheus::Counter* sessions_ok_;
  prometheus::Counter* sessions_client_gone_;
  prometheus::Counter* sessions_shutdown_;
  prometheus::Counter* sessions_idle_;
  prometheus::Counter* sessions_invalid_;
  prometheus::Counter* sessions_rejected_;
  prometheus::Counter* sessions_error_;
  prometheus::Family<prometheus::Counter>* streams_total_;
  prometheus::Counter* admission_rejections_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* inter_token_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* step_prefill_;
  prometheus::Histogram* step_decode_;
  prometheus::Histogram* step_tokens_prefill_;
  prometheus::Histogram* step_tokens_decode_;
  prometheus::Histogram* batch_size_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generated_tokens_;
  // decoded_turns_total by serving::FinishReason (its enumerators in order).
  std::array<prometheus::Counter*, 7> turns_by_reason_{};
  prometheus::Histogram* turn_duration_;
  prometheus::Histogram* turn_prompt_tokens_;
  prometheus::Histogram* turn_generated_tokens_;
};

// Holds decoded_sessions_active up for its lifetime, so every exit path of a
// stream (error, cancel, disconnect) takes it back down.
class ActiveSessionGuard {
 public:
  explicit ActiveSessionGuard(ServerMetrics* metrics) : metrics_(metrics) { metrics_->SessionOpened(); }
  ~ActiveSessionGuard() { metrics_->SessionClosed(outcome_); }
  ActiveSessionGuard(const ActiveSessionGuard&) = delete;
  ActiveSessionGuard& operator=(const ActiveSessionGuard&) = delete;
  void set_outcome(SessionOutcome outcome) { outcome_ = outcome; }

 private:
  ServerMetrics* metrics_;
  SessionOutcome outcome_ = SessionOutcome::kOk;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_METRICS_H_
