#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/generic/async_generic_service.h"
#include "server/listener_probe.h"

namespace decoded::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// gRPC checks a certificate chain and key only when a port starts with them
// (an external connection acceptor just refuses every handshake): a
// throwaway server on a loopback port finds out at start instead.
absl::Status CheckServerCredentials(const std::shared_ptr<grpc::ServerCredentials>& creds) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", creds, &port);
  grpc::CallbackGenericService nothing;  // a server needs a service to start
  builder.RegisterCallbackGenericService(&nothing);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::InvalidArgumentError("gRPC cannot serve TLS with them (its log line above says why)");
  }
  server->Shutdown(std::chrono::system_clock::now());
  return absl::OkStatus();
}

int Millis(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1, INT32_MAX));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodedServer>> DecodedServer::Start(const ServerOptions& options) {
  std::unique_ptr<DecodedServer> server(new DecodedServer());
  server->options_ = options;
  server->metrics_ = std::make_unique<ServerMetrics>();
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
        server->metrics_->Expose(options.metrics_listen, options.metrics_auth_token);
    if (!endpoint.ok()) return endpoint.status();
    server->metrics_endpoint_ = *std::move(endpoint);
  }

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    if (options.tls_cert_file.empty() || options.tls_key_file.empty()) {
      return absl::InvalidArgumentError("--tls_cert and --tls_key go together: give both, or neither");
    }
    absl::StatusOr<std::string> cert = ReadFile(options.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(options.tls_key_file);
    if (!key.ok()) return key.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    creds = grpc::SslServerCredentials(ssl);
    if (absl::Status usable = CheckServerCredentials(creds); !usable.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--tls_cert ", options.tls_cert_file, " with --tls_key ",
                                                     options.tls_key_file, ": ", usable.message()));
    }
  }

  const bool tls = !options.tls_cert_file.empty();
  if (!tls) {
    // Plaintext frames can be read on the way: the guard bounds header
    // blocks and resets exactly (server/http2_guard.h).
    Http2GuardLimits limits;
    limits.max_header_block_bytes = kMaxMetadataTransportBytes + kMaxHeaderBlockSlack;
    limits.max_resets_per_second = options.max_stream_resets_per_second;
    limits.reset_burst = 2 * options.max_stream_resets_per_second;
    absl::StatusOr<std::unique_ptr<Http2Guard>> guard = Http2Guard::Start(limits);
    if (!guard.ok()) return guard.status();
    server->guard_ = *std::move(guard);
  }
  ListenerOptions listen;
  listen.address = options.listen;
  listen.guard = server->guard_.get();
  listen.max_connections = options.max_connections;
  listen.max_connections_per_peer = options.max_connections_per_peer;
  absl::StatusOr<std::unique_ptr<Listener>> bound = Listener::Bind(listen);
  if (!bound.ok()) return bound.status();
  server->listener_ = *std::move(bound);
  Listener* const listener = server->listener_.get();

  server->turn_pool_ = std::make_unique<RequestPool>(
      RequestPoolOptions{"turn", "--turn_queue", options.turn_threads, options.turn_queue, /*nice=*/0});
  // Tokenize and Detokenize are utilities, not the decode path: they get what
  // CPU the compute workers leave.
  server->utility_pool_ = std::make_unique<RequestPool>(
      RequestPoolOptions{"utility", "--utility_queue", options.utility_threads, options.utility_queue, /*nice=*/10});
  DecoderServiceOptions service_options;
  service_options.auth_token = options.auth_token;
  service_options.max_streams = options.max_streams;
  service_options.max_sessions_per_peer = options.max_sessions_per_peer;
  service_options.max_streams_per_peer = options.max_streams_per_peer;
  service_options.max_metadata_bytes = options.max_metadata_bytes;
  if (tls && options.max_stream_resets_per_second > 0) {
    // TLS frames are not readable on the way: streams cancelled by the
    // client are counted instead, and the connection is shut down.
    server->resets_ = std::make_unique<ResetGuard>(
        options.max_stream_resets_per_second, 2 * options.max_stream_resets_per_second,
        [listener](const std::string& peer) { return listener->CloseConnection(peer); });
  }
  server->service_ = std::make_unique<DecoderService>(server->metrics_.get(), server->turn_pool_.get(),
                                                      server->utility_pool_.get(), server->resets_.get(), listener,
                                                      service_options);
  server->health_ = std::make_unique<HealthService>(
      std::vector<std::string>{v1::Decoder::service_full_name()},
      [listener](const std::string& peer) { listener->NoteProgress(peer); });
  const std::vector<std::string> services = {
      v1::Decoder::service_full_name(), grpc::health::v1::Health::service_full_name(),
      grpc::reflection::v1::ServerReflection::service_full_name(),
      grpc::reflection::v1alpha::ServerReflection::service_full_name()};
  DecoderService* decoder = server->service_.get();
  auto authorized = [decoder](const grpc::CallbackServerContext& context) { return decoder->Authorized(context); };
  server->reflection_v1_ = std::make_unique<ReflectionV1Service>(services, authorized, listener);
  server->reflection_v1alpha_ = std::make_unique<ReflectionV1AlphaService>(services, authorized, listener);

  grpc::EnableDefaultHealthCheckService(false);
  grpc::ServerBuilder builder;
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->health_.get());
  builder.RegisterService(server->reflection_v1_.get());
  builder.RegisterService(server->reflection_v1alpha_.get());
  if (options.max_connection_age != absl::InfiniteDuration()) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, Millis(options.max_connection_age));
  }
  // Keepalive: notice dead clients (and free their sessions) within a minute.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_streams_per_connection);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, Millis(options.handshake_timeout));
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, kMaxMetadataTransportBytes);
  server->acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, creds);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot serve on ", options.listen));
  DecodedServer* self = server.get();
  server->listener_->Start(server->acceptor_.get(), [self](const absl::Status& why) { self->ListenerFailed(why); });
  server->UpdateHealth();
  server->watchdog_ = std::thread([self] { self->Watchdog(); });
  if (options.listener_probe_interval > absl::ZeroDuration()) {
    server->prober_ = std::thread([self] { self->ProbeListener(); });
  }
  if (!options.http_listen.empty()) {
    http::CompletionsOptions completions;
    completions.engine = [self]() -> serving::Engine* {
      return self->engine_attached_unix_seconds_.load() == 0 ? nullptr : self->engine_.get();
    };
    completions.served_model_name = [self] { return self->options_.served_model_name; };
    completions.run = [self](absl::AnyInvocable<void()> task) { return self->turn_pool_->Submit(std::move(task)); };
    completions.not_serving_reason = [self] { return self->HttpServingState().reason; };
    ServerMetrics* metrics = server->metrics_.get();
    completions.on_token = [metrics] { metrics->TokenGenerated(); };
    completions.on_inter_token = [metrics](double seconds) { metrics->InterToken(seconds); };
    completions.on_turn_end = [metrics](const serving::TurnEnd& end) { metrics->TurnEnded(end); };
    completions.on_rejected = [metrics] { metrics->AdmissionRejected(); };
    completions.on_session_opened = [metrics] { metrics->SessionOpened(); };
    if (options.max_sessions_per_peer > 0) {
      DecoderService* service = server->service_.get();
      completions.acquire_peer_slot = [service](const std::string& peer) -> absl::StatusOr<std::shared_ptr<void>> {
        // In gRPC's form ("ipv4:10.0.0.7:51234", "ipv6:[::1]:40000"): an
        // address's HTTP and gRPC sessions count together.
        absl::StatusOr<PeerSessions::Slot> slot =
            service->peers().Acquire(absl::StrCat(absl::StartsWith(peer, "[") ? "ipv6:" : "ipv4:", peer));
        if (!slot.ok()) return slot.status();
        return std::make_shared<PeerSessions::Slot>(*std::move(slot));
      };
    }
    completions.on_session_closed = [metrics](serving::FinishReason reason, absl::StatusCode code) {
      // An HTTP turn is cancelled only when its client went away.
      metrics->SessionClosed(reason == serving::FinishReason::kCancelled  ? SessionOutcome::kClientGone
                             : reason == serving::FinishReason::kShutdown ? SessionOutcome::kShutdown
                             : reason == serving::FinishReason::kError    ? OutcomeOfError(code)
                                                                          : SessionOutcome::kOk);
    };
    server->completions_ = std::make_shared<http::OpenAiCompletions>(std::move(completions));
    http::OpenAiRoutesOptions routes;
    routes.completions = server->completions_;
    routes.auth_token = options.auth_token;
    routes.metrics_text = [metrics] { return metrics->Render(); };
    // One thread and a short queue of its own: a scrape flood gets 503s and
    // leaves the turn pool to turns (an outside tester filled --turn_queue
    // with scrapes: 28 of 30 completions got 429).
    server->scrape_pool_ = std::make_unique<RequestPool>(
        RequestPoolOptions{"metrics scrape", "(fixed: 4)", /*threads=*/1, /*max_queued=*/4, /*nice=*/10});
    routes.run = [self](absl::AnyInvocable<void()> task) { return self->scrape_pool_->Submit(std::move(task)); };
    routes.metrics_auth_token = options.metrics_auth_token;
    routes.serving_state = [self] { return self->HttpServingState(); };
    routes.served_model = [self] {
      http::ServedModel m;
      const int64_t created = self->engine_attached_unix_seconds_.load();
      if (created == 0) return m;  // no engine yet
      m.id = self->options_.served_model_name;
      m.created = created;
      m.max_model_len = self->engine_->ModelInfo().session_context_length;
      return m;
    };
    http::HttpServerOptions http_options;
    http_options.listen = options.http_listen;
    http_options.tls_cert_file = options.tls_cert_file;  // one certificate for both doors
    http_options.tls_key_file = options.tls_key_file;
    // The daemon's descriptor budget counts each door's connections alike
    // (server/main.cc).
    http_options.max_connections = options.max_connections;
    http_options.max_connections_per_peer = options.max_connections_per_peer;
    absl::StatusOr<std::unique_ptr<http::HttpServer>> http =
        http::HttpServer::Start(http_options, http::OpenAiRoutes(std::move(routes)));
    if (!http.ok()) return http.status();
    server->http_ = *std::move(http);
  }
  // Last: State() reads http_, which is set by now and not changed again.
  server->metrics_->SetServerState([self] { return self->State(); });
  return server;
}

DecodedServer::~DecodedServer() {
  Drain(absl::ZeroDuration());
  if (http_ != nullptr) http_->Stop();  // no new HTTP request after this
  // An HTTP turn's sink and its reply task use the engine until its session
  // is released: Drain's BeginShutdown has ended every turn by now.
  if (completions_ != nullptr && !completions_->WaitUntilIdle(absl::Now() + absl::Seconds(10))) {
    std::cerr << "decoded: " << completions_->in_flight() << " HTTP requests still open at exit\n";
  }
  stop_threads_.Notify();
  if (watchdog_.joinable()) watchdog_.join();
  if (prober_.joinable()) prober_.join();
  // No scrape may still be reading the server or the engine below: the
  // endpoint's worker threads are joined first.
  metrics_endpoint_.reset();
  metrics_->SetServerState(nullptr);
  server_.reset();
  listener_.reset();
  metrics_->SetEngine(nullptr);
  engine_.reset();
}

int DecodedServer::http_port() const { return http_ == nullptr ? 0 : http_->port(); }

http::ServingState DecodedServer::HttpServingState() {
  absl::MutexLock lock(&health_mu_);
  http::ServingState s;
  s.serving = attached_ && !stuck_ && !listener_failed_ && !draining_ && !device_lost_;
  if (!attached_) {
    s.reason = "loading the model";
  } else if (draining_) {
    s.reason = "draining (shutting down)";
  } else if (device_lost_) {
    s.reason = "the serving device was lost";
  } else if (listener_failed_) {
    s.reason = "the gRPC listener failed";
  } else if (stuck_) {
    s.reason = "a step has run past --stuck_step_seconds";
  }
  return s;
}

int DecodedServer::metrics_port() const {
  return metrics_endpoint_ == nullptr ? 0 : metrics_endpoint_->port();
}

void DecodedServer::AttachEngine(std::unique_ptr<serving::Engine> engine) {
  engine_ = std::move(engine);
  metrics_->SetEngine(engine_.get());
  service_->AttachEngine(engine_.get());
  engine_attached_unix_seconds_ = absl::ToUnixSeconds(absl::Now());
  {
    absl::MutexLock lock(&health_mu_);
    attached_ = true;
  }
  UpdateHealth();
}

void DecodedServer::UpdateHealth() {
  // Published under the lock: two threads updating at once (the watchdog, a
  // worker reporting a lost device) cannot publish in the other order than
  // they computed, leaving a stale SERVING.
  absl::MutexLock lock(&health_mu_);
  const bool serving = attached_ && !stuck_ && !listener_failed_ && !draining_ && !device_lost_;
  health_->SetServing(serving);
  metrics_->SetServing(serving);
}

void DecodedServer::ObserveEngine(serving::EngineOptions& options) {
  ServerMetrics* metrics = metrics_.get();
  options.on_step = [metrics](const serving::StepInfo& step) { metrics->Step(step); };
  options.on_device_lost = [this](const absl::Status& why) { DeviceLost(why); };
}

void DecodedServer::DeviceLost(const absl::Status& why) {
  {
    absl::MutexLock lock(&health_mu_);
    if (device_lost_) return;
    device_lost_ = true;
  }
  // Nothing runs on a lost device again: running turns end UNAVAILABLE, new
  // sessions are refused, and a supervisor restarts us.
  std::cerr << "decoded: " << why.message() << "; health reports NOT_SERVING\n";
  UpdateHealth();
}

void DecodedServer::Watchdog() {
  auto chrono = [](absl::Duration d) {
    return d == absl::InfiniteDuration() ? std::chrono::nanoseconds::max() : absl::ToChronoNanoseconds(d);
  };
  IdleTimeouts idle;
  idle.idle_session = chrono(options_.idle_session_timeout);
  idle.first_turn = chrono(std::min(options_.first_turn_timeout, options_.idle_session_timeout));
  while (!stop_threads_.WaitForNotificationWithTimeout(absl::Milliseconds(500))) {
    service_->streams().ExpireIdle(idle);
    if (resets_ != nullptr) resets_->Prune();
    if (engine_ == nullptr || drained_.load()) continue;
    const serving::EngineStats stats = engine_->Stats();
    // A backstop: the engine reports a loss from the failing step itself.
    if (stats.device_lost) DeviceLost(absl::UnavailableError("the device was lost"));
    const double age = stats.longest_running_step_seconds;
    const bool now_stuck = age > absl::ToDoubleSeconds(options_.stuck_step_threshold);
    {
      absl::MutexLock lock(&health_mu_);
      if (now_stuck == stuck_) continue;
      stuck_ = now_stuck;
    }
    if (now_stuck) {
      std::cerr << "decoded: a worker has been inside one step for " << age << " s; health reports NOT_SERVING\n";
    } else {
      std::cerr << "decoded: the stuck step returned; health reports SERVING again\n";
    }
    UpdateHealth();
  }
}

void DecodedServer::ProbeListener() {
  const absl::Duration interval = options_.listener_probe_interval;
  const absl::Duration timeout = std::min(interval, absl::Seconds(2));
  int failures = 0;
  while (!stop_threads_.WaitForNotificationWithTimeout(interval)) {
    if (drained_.load()) return;
    absl::Status probe = decoded::server::ProbeListener(listener_->local_host(), listener_->port(), timeout,
                                                        [this](int port) { listener_->ExpectProbe(port); });
    if (probe.ok()) {
      failures = 0;
      continue;
    }
    if (++failures < kListenerProbeFailures) continue;
    ListenerFailed(absl::UnavailableError(absl::StrCat("the listener on port ", listener_->port(),
                                                       " no longer accepts connections (", kListenerProbeFailures,
                                                       " probes in a row, ", absl::FormatDuration(interval),
                                                       " apart; the last: ", probe.message(), ")")));
    return;
  }
}

void DecodedServer::ListenerFailed(const absl::Status& why) {
  {
    absl::MutexLock lock(&health_mu_);
    if (listener_failed_) return;
    listener_failed_ = true;
  }
  std::cerr << "decoded: " << why.message() << "; health reports NOT_SERVING\n";
  UpdateHealth();
  if (options_.on_listener_failure) options_.on_listener_failure(why);
}

ServerState DecodedServer::State() {
  const ListenerStats l = listener_->Stats();
  ServerState s;
  s.connections_open = l.open_connections;
  s.connections_accepted_total = l.accepted_total;
  s.connections_refused_total = l.refused_total;
  s.accept_errors_total = l.accept_errors_total;
  s.connections_closed_without_progress_total = l.closed_without_progress_total;
  s.streams_open = service_->streams().size();
  s.turn_queue = turn_pool_->queued();
  s.utility_queue = utility_pool_->queued();
  s.connections_closed_for_resets_total = resets_ == nullptr ? 0 : resets_->connections_closed();
  if (guard_ != nullptr) {
    const Http2GuardStats g = guard_->Stats();
    s.connections_closed_for_resets_total += g.closed_resets_total;
    s.connections_closed_for_header_blocks_total = g.closed_header_block_total;
  }
  if (http_ != nullptr) {
    const http::HttpServerCounters h = http_->Counters();
    s.http_connections_open = h.connections_open;
    s.http_connections_accepted_total = h.connections_accepted;
    s.http_connections_refused_total = h.connections_refused;
    s.http_requests_total = h.requests;
    s.http_requests_refused_total = h.requests_refused;
    s.http_tls_handshakes_failed_total = h.tls_handshakes_failed;
  }
  return s;
}

void DecodedServer::Drain(absl::Duration period) {
  if (drained_.load() || server_ == nullptr) return;
  drained_ = true;
  const absl::Time end = absl::Now() + period;
  {
    absl::MutexLock lock(&health_mu_);
    draining_ = true;
  }
  UpdateHealth();
  // Watchers are sent NOT_SERVING and their Watch calls end, which would
  // otherwise hold the drain open until its cut point.
  health_->Shutdown();
  service_->StartDraining();
  // Turns still running at the cut point end with SHUTDOWN; the reserve
  // leaves time for their last step (a loaded machine can take a few hundred
  // ms for one) and their final events, and the last sliver for cancelling
  // what is left and the teardown after Drain (measured: 50-120 ms on a busy
  // 2-core host, more when a stream's client stopped reading), so the process
  // exits within `period`.
  const absl::Duration reserve = std::min(period / 5, absl::Seconds(1));
  const absl::Duration teardown = std::min(reserve / 2, absl::Milliseconds(250));
  StreamRegistry& streams = service_->streams();
  // HTTP requests are turns too (their sessions end with their replies).
  auto http_idle = [&](absl::Time deadline) { return completions_ == nullptr || completions_->WaitUntilIdle(deadline); };
  const bool streams_done = streams.WaitUntilEmpty(end - reserve);
  const bool http_done = http_idle(end - reserve);
  if ((!streams_done || !http_done) && engine_ != nullptr) {
    engine_->BeginShutdown();
    streams.WaitUntilEmpty(end - teardown);
    http_idle(end - teardown);
  }
  streams.MarkCancellingAll();
  // Streams cut at the cut point still write their last events, in half of
  // the teardown reserve.
  if (http_ != nullptr) http_->Stop(end - teardown / 2);
  listener_->Stop();
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_->Wait();
  // A stream cancelled with a step still running is released when it returns.
  streams.WaitUntilEmpty(end);
}

}  // namespace decoded::server
