#include "server/server.h"

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"

namespace decoded::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodedServer>> DecodedServer::Start(const ServerOptions& options) {
  std::unique_ptr<DecodedServer> server(new DecodedServer());
  server->stuck_step_threshold_ = options.stuck_step_threshold;
  server->metrics_ = std::make_unique<ServerMetrics>();
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint = server->metrics_->Expose(options.metrics_listen);
    if (!endpoint.ok()) return endpoint.status();
    server->metrics_endpoint_ = *std::move(endpoint);
  }

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(options.tls_cert_file);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(options.tls_key_file);
    if (!key.ok()) return key.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    creds = grpc::SslServerCredentials(ssl);
  }

  server->service_ = std::make_unique<DecoderService>(server->metrics_.get(), options.auth_token);
  server->health_ = std::make_unique<HealthService>(std::vector<std::string>{v1::Decoder::service_full_name()});
  grpc::EnableDefaultHealthCheckService(false);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, creds, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->health_.get());
  // Keepalive: notice dead clients (and free their sessions) within a minute.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A second daemon on a busy port must fail, not share it (gRPC defaults to SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  server->SetServing(false);
  return server;
}

DecodedServer::~DecodedServer() {
  Drain(absl::ZeroDuration());
  server_.reset();
  metrics_->SetEngine(nullptr);
  engine_.reset();
}

int DecodedServer::metrics_port() const {
  return metrics_endpoint_ == nullptr ? 0 : metrics_endpoint_->port();
}

void DecodedServer::AttachEngine(std::unique_ptr<serving::Engine> engine) {
  engine_ = std::move(engine);
  metrics_->SetEngine(engine_.get());
  service_->AttachEngine(engine_.get());
  SetServing(true);
  watchdog_ = std::thread([this] { WatchForStuckSteps(); });
}

void DecodedServer::WatchForStuckSteps() {
  bool stuck = false;
  while (!stop_watchdog_.WaitForNotificationWithTimeout(absl::Milliseconds(500))) {
    const double age = engine_->Stats().longest_running_step_seconds;
    const bool now_stuck = age > absl::ToDoubleSeconds(stuck_step_threshold_);
    if (now_stuck == stuck || drained_.load()) continue;
    stuck = now_stuck;
    if (stuck) {
      std::cerr << "decoded: a worker has been inside one step for " << age << " s; health reports NOT_SERVING\n";
    } else {
      std::cerr << "decoded: the stuck step returned; health reports SERVING again\n";
    }
    SetServing(!stuck);
  }
}

void DecodedServer::Drain(absl::Duration period) {
  if (drained_.load() || server_ == nullptr) return;
  drained_ = true;
  const absl::Time end = absl::Now() + period;
  if (watchdog_.joinable()) {
    stop_watchdog_.Notify();
    watchdog_.join();
  }
  SetServing(false);
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
  if (!streams.WaitUntilEmpty(end - reserve) && engine_ != nullptr) {
    engine_->BeginShutdown();
    streams.WaitUntilEmpty(end - teardown);
  }
  streams.MarkCancellingAll();
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_->Wait();
  // A stream cancelled with a step still running is released when it returns.
  streams.WaitUntilEmpty(end);
}

void DecodedServer::SetServing(bool serving) {
  health_->SetServing(serving);
  metrics_->SetServing(serving);
}

}  // namespace decoded::server
