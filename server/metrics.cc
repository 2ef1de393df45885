#include "server/metrics.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "decoded/version.h"
#include "engine/cpu_isa.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/one_value_family.h"
#include "server/process_metrics.h"

namespace decoded::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// Latency buckets in seconds, from 1 ms (a decode step of a small model) to
// 30 s (a long prompt on a loaded server).
const Histogram::BucketBoundaries& LatencyBuckets() {
  static const Histogram::BucketBoundaries* b = new Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  return *b;
}

const char* FinishReasonLabel(serving::FinishReason r) {
  switch (r) {
    case serving::FinishReason::kStopToken: return "stop";
    case serving::FinishReason::kStopSequence: return "stop_sequence";
    case serving::FinishReason::kLength: return "length";
    case serving::FinishReason::kCancelled: return "cancelled";
    case serving::FinishReason::kContextFull: return "context_full";
    case serving::FinishReason::kShutdown: return "shutdown";
    case serving::FinishReason::kError: return "error";
  }
  return "error";
}

double KvUsage(const serving::EngineStats& s) {
  if (s.kv_blocks_total > 0) return static_cast<double>(s.kv_blocks_used) / static_cast<double>(s.kv_blocks_total);
  if (s.kv_budget_bytes > 0) return std::min(1.0, static_cast<double>(s.kv_bytes) / s.kv_budget_bytes);
  return 0.0;
}

// Reads Engine::Stats() at scrape time.
class EngineCollectable final : public prometheus::Collectable {
 public:
  explicit EngineCollectable(std::shared_ptr<std::atomic<const serving::Engine*>> engine)
      : engine_(std::move(engine)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    serving::EngineStats s;
    const serving::Engine* engine = engine_->load();
    if (engine != nullptr) s = engine->Stats();
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> families = {
        OneValue("decoded_graph_builds_total", "Decode and prefill graphs built (D1 and D2).", MetricType::Counter,
                 s.graph_builds),
        OneValue("decoded_optimizer_runs_total", "Graph optimizer passes run.", MetricType::Counter,
                 s.optimizer_runs),
        OneValue("decoded_rebinds_total", "Decode steps that reused a held plan.", MetricType::Counter, s.rebinds),
        OneValue("decoded_bound_nodes",
                 "Data-node bindings held by decode plans (workers keep theirs while any session is open).",
                 MetricType::Gauge, s.bound_nodes),
        OneValue("decoded_kv_bytes", "KV cache bytes held by live sessions.", MetricType::Gauge, s.kv_bytes),
        OneValue("decoded_workers_busy", "Workers running a step.", MetricType::Gauge, s.workers_busy),
        OneValue("decoded_workers", "Worker threads stepping sessions (--workers).", MetricType::Gauge, s.workers),
        OneValue("decoded_kv_budget_bytes",
                 "KV cache bytes all open sessions may hold: with paged KV the pool's (--kv_budget_mb, capped at every "
                 "session's full context); else --kv_budget_mb, 0: no limit.", MetricType::Gauge,
                 s.kv_budget_bytes),
        OneValue("decoded_sessions_queued", "Sessions waiting for a worker.", MetricType::Gauge, s.turns_queued),
        // The model server protocol's three gauges (Gateway API Inference
        // Extension; vLLM's num_requests_waiting, num_requests_running,
        // kv_cache_usage_perc), read from one Stats() call.
        OneValue("decoded_requests_waiting", "Turns accepted and not yet started (their first step has not run).",
                 MetricType::Gauge, s.turns_waiting),
        OneValue("decoded_requests_running", "Turns started and not yet ended.", MetricType::Gauge, s.turns_running),
        OneValue("decoded_kv_cache_usage_ratio",
                 "KV cache in use, 0..1: paged KV, the pool's blocks sessions hold over its blocks; contiguous KV, "
                 "bytes held over the KV budget (0 without a budget).",
                 MetricType::Gauge, KvUsage(s)),
        OneValue("decoded_kv_blocks_total", "Blocks of the paged KV pool, each one layer group's KV of --kv_block_tokens positions (0: "
                 "contiguous KV, --kv_block_tokens=0).",
                 MetricType::Gauge, s.kv_blocks_total),
        OneValue("decoded_kv_blocks_used", "Blocks of the paged KV pool that sessions hold.", MetricType::Gauge,
                 s.kv_blocks_used),
        OneValue("decoded_kv_block_tokens", "Token positions per KV block (--kv_block_tokens).", MetricType::Gauge,
                 s.kv_block_tokens),
        OneValue("decoded_kv_preemptions_total",
                 "Sessions (idle, or with a queued turn not yet started) whose KV blocks were taken back for other "
                 "sessions' prompts (their next turn prefills their context again).",
                 MetricType::Counter, s.kv_preemptions),
        OneValue("decoded_kv_blocks_cached",
                 "Free KV blocks that hold a cached prefix (reused by a prompt that starts with it, else evicted "
                 "least recently used first when blocks are needed).",
                 MetricType::Gauge, s.kv_blocks_cached),
        OneValue("decoded_prefix_cache_queried_tokens_total",
                 "Prompt tokens (with any context a session recomputes) looked up in the prefix cache.",
                 MetricType::Counter, s.prefix_cache_queried_tokens),
        OneValue("decoded_prefix_cache_hit_tokens_total",
                 "Of those, tokens whose KV was found in the prefix cache and not computed again.",
                 MetricType::Counter, s.prefix_cache_hit_tokens),
        OneValue("decoded_kv_exhausted_turns_total",
                 "Turns ended RESOURCE_EXHAUSTED because a decoding session needed a KV block and none was free.",
                 MetricType::Counter, s.kv_exhausted_turns),
        OneValue("decoded_sessions_waiting_for_client",
                 "Sessions not stepped because their client has not consumed its last events (backpressure).",
                 MetricType::Gauge, s.sessions_waiting_for_client),
        OneValue("decoded_nonfinite_logits_total",
                 "Turns ended with an error because a step produced NaN or infinite logits.", MetricType::Counter,
                 s.nonfinite_logits_turns),
        OneValue("decoded_device_memory_bytes",
                 "Memory the serving device's buffers hold: on a GPU its weights, KV caches and plans; on cpu the "
                 "KV caches and plans (reserved; weights are the model file's copy or mapping).",
                 MetricType::Gauge, s.device_memory_bytes),
        OneValue("decoded_device_memory_capacity_bytes",
                 "Memory of the serving device (0 on cpu: host memory).", MetricType::Gauge,
                 s.device_memory_capacity_bytes),
        OneValue("decoded_device_lost", "1 once the serving device was lost (health NOT_SERVING until restarted).",
                 MetricType::Gauge, s.device_lost ? 1 : 0),
        OneValue("decoded_device_validation_messages_total",
                 "Warnings and errors of the Vulkan validation layer (--vulkan_validation).", MetricType::Counter,
                 s.device_validation_messages),
    };
    if (engine != nullptr) {
      // An info metric (value 1) naming what serves: dashboards put it beside
      // throughput, and an operator sees which GPU a replica got.
      prometheus::MetricFamily info;
      info.name = "decoded_device_info";
      info.help = "The backend (cpu, vulkan) and device (cpu, or the GPU's name) serving the model (--device).";
      info.type = MetricType::Gauge;
      prometheus::ClientMetric m;
      m.label = {{"backend", engine->ModelInfo().backend}, {"device", engine->ModelInfo().device}};
      m.gauge.value = 1;
      info.metric.push_back(m);
      families.push_back(std::move(info));
      // The KV cache's element type (--kv_type), as vLLM's cache_config_info
      // says its cache_dtype: what a replica's capacity and quality depend on.
      prometheus::MetricFamily kv;
      kv.name = "decoded_kv_cache_info";
      kv.help = "The KV cache's element type (--kv_type: f32, f16 or q8_0).";
      kv.type = MetricType::Gauge;
      prometheus::ClientMetric k;
      k.label = {{"type", engine->ModelInfo().kv_type}};
      k.gauge.value = 1;
      kv.metric.push_back(k);
      families.push_back(std::move(kv));
      // What runs and on what model, as vLLM's and TGI's info metrics say:
      // the build (version, git revision) and the served model.
      prometheus::MetricFamily build;
      build.name = "decoded_build_info";
      build.help = "The daemon's version and git revision, and the model it serves (GGUF general.name, family).";
      build.type = MetricType::Gauge;
      prometheus::ClientMetric b;
      b.label = {{"version", kVersion},
                 {"revision", kRevision},
                 {"model", engine->ModelInfo().name},
                 {"family", engine->ModelInfo().family}};
      b.gauge.value = 1;
      build.metric.push_back(b);
      families.push_back(std::move(build));
    }
    return families;
  }

 private:
  std::shared_ptr<std::atomic<const serving::Engine*>> engine_;
};

// Reads ServerState at scrape time.
class ServerCollectable final : public prometheus::Collectable {
 public:
  ServerCollectable(std::shared_ptr<absl::Mutex> mu, std::shared_ptr<std::function<ServerState()>> read)
      : mu_(std::move(mu)), read_(std::move(read)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::function<ServerState()> read;
    {
      absl::MutexLock lock(mu_.get());
      read = *read_;
    }
    if (!read) return {};
    const ServerState s = read();
    using prometheus::MetricType;
    return {
        OneValue("decoded_connections_open", "gRPC connections open (--max_connections).", MetricType::Gauge,
                 s.connections_open),
        OneValue("decoded_connections_accepted_total", "gRPC connections accepted.", MetricType::Counter,
                 s.connections_accepted_total),
        OneValue("decoded_connections_refused_total",
                 "gRPC connections closed at once because --max_connections were open.", MetricType::Counter,
                 s.connections_refused_total),
        OneValue("decoded_accept_errors_total",
                 "Failed accepts on the gRPC listening socket (e.g. out of file descriptors).",
                 MetricType::Counter, s.accept_errors_total),
        OneValue("decoded_connections_reset_flood_closed_total",
                 "Connections closed because their client reset streams faster than --max_stream_resets_per_second.",
                 MetricType::Counter, s.connections_closed_for_resets_total),
        OneValue("decoded_connections_header_block_closed_total",
                 "Connections sent GOAWAY and closed for a header block over the transport's metadata limit "
                 "(plaintext; server/http2_guard.h).",
                 MetricType::Counter, s.connections_closed_for_header_blocks_total),
        OneValue("decoded_connections_without_progress_closed_total",
                 "Connections closed for sending bytes that started no call and carried no message (e.g. a header "
                 "block that never ends; server/listener.h).",
                 MetricType::Counter, s.connections_closed_without_progress_total),
        OneValue("decoded_streams_open", "Generate streams open, with or without a session (--max_streams).",
                 MetricType::Gauge, s.streams_open),
        OneValue("decoded_turn_queue", "Turns waiting for the turn pool (tokenizing, session open).",
                 MetricType::Gauge, s.turn_queue),
        OneValue("decoded_utility_queue", "Tokenize and Detokenize calls waiting for the utility pool.",
                 MetricType::Gauge, s.utility_queue),
        OneValue("decoded_http_connections_open", "HTTP (OpenAI API) connections open.", MetricType::Gauge,
                 s.http_connections_open),
        OneValue("decoded_http_connections_accepted_total", "HTTP connections accepted.", MetricType::Counter,
                 s.http_connections_accepted_total),
        OneValue("decoded_http_connections_refused_total",
                 "HTTP connections closed at once because the server's connection limit was reached.",
                 MetricType::Counter, s.http_connections_refused_total),
        OneValue("decoded_http_requests_total", "HTTP requests handed to the API's routes.", MetricType::Counter,
                 s.http_requests_total),
        OneValue("decoded_http_requests_refused_total",
                 "HTTP requests the server answered itself: malformed framing or a limit (400, 413, 414, 417, 431, "
                 "501).",
                 MetricType::Counter, s.http_requests_refused_total),
        OneValue("decoded_http_tls_handshakes_failed_total",
                 "HTTPS connections closed before a request: a plaintext client, a failed or timed-out handshake.",
                 MetricType::Counter, s.http_tls_handshakes_failed_total),
    };
  }

 private:
  std::shared_ptr<absl::Mutex> mu_;
  std::shared_ptr<std::function<ServerState()>> read_;
};

}  // namespace

ServerMetrics::ServerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      engine_(std::make_shared<std::atomic<const serving::Engine*>>(nullptr)) {
  engine_collectable_ = std::make_shared<EngineCollectable>(engine_);
  server_state_mu_ = std::make_shared<absl::Mutex>();
  server_state_ = std::make_shared<std::function<ServerState()>>();
  server_collectable_ = std::make_shared<ServerCollectable>(server_state_mu_, server_state_);
  process_collectable_ = std::make_shared<ProcessCollectable>();
  // An info metric (value 1): dashboards and benchmark figures can name the
  // kernels the process runs, which the CPU decides at startup.
  BuildGauge()
      .Name("decoded_cpu_isa_info")
      .Help("Instruction-set tier of the CPU kernels (label cpu_isa: avx512vnni, avx2 or scalar).")
      .Register(*registry_)
      .Add({{"cpu_isa", CpuIsaName(ActiveCpuIsa())}})
      .Set(1);
  sessions_active_ = &BuildGauge()
                          .Name("decoded_sessions_active")
                          .Help("Sessions open: Generate streams holding a session slot (taken at a stream's first "
                                "turn, --max_sessions) and HTTP completions being answered.")
                          .Register(*registry_)
                          .Add({});
  health_serving_ = &BuildGauge()
                         .Name("decoded_health_serving")
                         .Help("1 while grpc.health.v1 reports SERVING, 0 while NOT_SERVING (loading, stuck step, "
                               "draining).")
                         .Register(*registry_)
                         .Add({});
  auto& sessions = BuildCounter()
                       .Name("decoded_sessions_total")
                       .Help("Sessions ended, by outcome (idle: ended by --idle_session_seconds; invalid: the request's "
                             "fault, 4xx; rejected: a server limit, RESOURCE_EXHAUSTED / 429; error: the server's).")
                       .Register(*registry_);
  sessions_ok_ = &sessions.Add({{"outcome", "ok"}});
  sessions_client_gone_ = &sessions.Add({{"outcome", "client_gone"}});
  sessions_shutdown_ = &sessions.Add({{"outcome", "shutdown"}});
  sessions_idle_ = &sessions.Add({{"outcome", "idle"}});
  sessions_invalid_ = &sessions.Add({{"outcome", "invalid"}});
  sessions_rejected_ = &sessions.Add({{"outcome", "rejected"}});
  sessions_error_ = &sessions.Add({{"outcome", "error"}});
  streams_total_ = &BuildCounter()
                        .Name("decoded_streams_total")
                        .Help("Generate streams ended, by outcome (as decoded_sessions_total), with or without a "
                              "session (one that never sent a turn, or whose first turn was refused before a session "
                              "opened, has none).")
                        .Register(*registry_);
  for (const char* outcome : {"ok", "client_gone", "shutdown", "idle", "invalid", "rejected", "error"}) {
    streams_total_->Add({{"outcome", outcome}});
  }
  admission_rejections_ = &BuildCounter()
                               .Name("decoded_admission_rejections_total")
                               .Help("Sessions or turns refused with RESOURCE_EXHAUSTED.")
                               .Register(*registry_)
                               .Add({});
  ttft_ = &BuildHistogram()
               .Name("decoded_time_to_first_token_seconds")
               .Help("From a turn's acceptance to its first sampled token.")
               .Register(*registry_)
               .Add({}, LatencyBuckets());
  inter_token_ = &BuildHistogram()
                      .Name("decoded_inter_token_latency_seconds")
                      .Help("Between consecutive tokens of a turn.")
                      .Register(*registry_)
                      .Add({}, LatencyBuckets());
  queue_time_ = &BuildHistogram()
                     .Name("decoded_queue_time_seconds")
                     .Help("From a turn's acceptance to its first step.")
                     .Register(*registry_)
                     .Add({}, LatencyBuckets());
  auto& steps = BuildHistogram()
                    .Name("decoded_step_duration_seconds")
                    .Help("Duration of one engine step, by phase.")
                    .Register(*registry_);
  step_prefill_ = &steps.Add({{"phase", "prefill"}}, LatencyBuckets());
  step_decode_ = &steps.Add({{"phase", "decode"}}, LatencyBuckets());
  // Powers of two up to the largest batch, and to the largest step.
  const Histogram::BucketBoundaries count_buckets = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048};
  auto& step_tokens = BuildHistogram()
                          .Name("decoded_step_tokens")
                          .Help("Tokens one engine step put through the model, by phase (prefill: a step that ran prompt "
                                "tokens, with any decode rows beside them; decode: a step of decode rows only, one "
                                "per session).")
                          .Register(*registry_);
  step_tokens_prefill_ = &step_tokens.Add({{"phase", "prefill"}}, count_buckets);
  step_tokens_decode_ = &step_tokens.Add({{"phase", "decode"}}, count_buckets);
  batch_size_ = &BuildHistogram()
                     .Name("decoded_batch_size")
                     .Help("Decode sessions stepped together in one step (continuous batching), steps with any.")
                     .Register(*registry_)
                     .Add({}, Histogram::BucketBoundaries{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64});
  prompt_tokens_ = &BuildCounter()
                        .Name("decoded_prompt_tokens_total")
                        .Help("Tokens prefilled.")
                        .Register(*registry_)
                        .Add({});
  generated_tokens_ = &BuildCounter()
                           .Name("decoded_generated_tokens_total")
                           .Help("Tokens sampled.")
                           .Register(*registry_)
                           .Add({});
  auto& turns = BuildCounter()
                    .Name("decoded_turns_total")
                    .Help("Turns ended, by finish reason (stop: a stop token; stop_sequence; length: max_new_tokens; "
                          "cancelled; context_full; shutdown; error).")
                    .Register(*registry_);
  for (serving::FinishReason r :
       {serving::FinishReason::kStopToken, serving::FinishReason::kStopSequence, serving::FinishReason::kLength,
        serving::FinishReason::kCancelled, serving::FinishReason::kContextFull, serving::FinishReason::kShutdown,
        serving::FinishReason::kError}) {
    turns_by_reason_[static_cast<size_t>(r)] = &turns.Add({{"finish_reason", FinishReasonLabel(r)}});
  }
  turn_duration_ = &BuildHistogram()
                        .Name("decoded_turn_duration_seconds")
                        .Help("From a turn's acceptance to its end (end-to-end request latency).")
                        .Register(*registry_)
                        .Add({}, Histogram::BucketBoundaries{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                                                             120, 300});
  // Powers of two from 1 to 32768 tokens: prompts and replies alike.
  Histogram::BucketBoundaries lengths;
  for (double b = 1; b <= 32768; b *= 2) lengths.push_back(b);
  turn_prompt_tokens_ = &BuildHistogram()
                             .Name("decoded_turn_prompt_tokens")
                             .Help("Prompt tokens of each turn (a BOS the server added included).")
                             .Register(*registry_)
                             .Add({}, lengths);
  turn_generated_tokens_ = &BuildHistogram()
                                .Name("decoded_turn_generated_tokens")
                                .Help("Tokens each turn generated.")
                                .Register(*registry_)
                                .Add({}, lengths);
}

void ServerMetrics::SetEngine(const serving::Engine* engine) { engine_->store(engine); }

void ServerMetrics::SetServerState(std::function<ServerState()> read) {
  absl::MutexLock lock(server_state_mu_.get());
  *server_state_ = std::move(read);
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> ServerMetrics::Expose(const std::string& address,
                                                                        const std::string& auth_token) {
  return MetricsEndpoint::Start(address, {registry_, engine_collectable_, server_collectable_, process_collectable_},
                                auth_token);
}

SessionOutcome OutcomeOfError(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied: return SessionOutcome::kInvalid;
    case absl::StatusCode::kResourceExhausted: return SessionOutcome::kRejected;
    default: return SessionOutcome::kError;
  }
}

void ServerMetrics::SetServing(bool serving) { health_serving_->Set(serving ? 1 : 0); }

void ServerMetrics::SessionOpened() { sessions_active_->Increment(); }

void ServerMetrics::SessionClosed(SessionOutcome outcome) {
  sessions_active_->Decrement();
  switch (outcome) {
    case SessionOutcome::kOk: sessions_ok_->Increment(); break;
    case SessionOutcome::kClientGone: sessions_client_gone_->Increment(); break;
    case SessionOutcome::kShutdown: sessions_shutdown_->Increment(); break;
    case SessionOutcome::kIdle: sessions_idle_->Increment(); break;
    case SessionOutcome::kInvalid: sessions_invalid_->Increment(); break;
    case SessionOutcome::kRejected: sessions_rejected_->Increment(); break;
    case SessionOutcome::kError: sessions_error_->Increment(); break;
  }
}

void ServerMetrics::StreamEnded(SessionOutcome outcome) {
  const char* label = "error";
  switch (outcome) {
    case SessionOutcome::kOk: label = "ok"; break;
    case SessionOutcome::kClientGone: label = "client_gone"; break;
    case SessionOutcome::kShutdown: label = "shutdown"; break;
    case SessionOutcome::kIdle: label = "idle"; break;
    case SessionOutcome::kInvalid: label = "invalid"; break;
    case SessionOutcome::kRejected: label = "rejected"; break;
    case SessionOutcome::kError: label = "error"; break;
  }
  streams_total_->Add({{"outcome", label}}).Increment();
}

void ServerMetrics::AdmissionRejected() { admission_rejections_->Increment(); }

void ServerMetrics::TurnEnded(const serving::TurnEnd& end) {
  queue_time_->Observe(end.timings.queue_ms / 1e3);
  if (end.usage.generated_tokens > 0) ttft_->Observe(end.timings.ttft_ms / 1e3);
  prompt_tokens_->Increment(end.usage.prefilled_tokens);
  turns_by_reason_[static_cast<size_t>(end.reason)]->Increment();
  turn_duration_->Observe(end.timings.total_ms / 1e3);
  turn_prompt_tokens_->Observe(end.usage.prompt_tokens);
  turn_generated_tokens_->Observe(end.usage.generated_tokens);
}

void ServerMetrics::TokenGenerated() { generated_tokens_->Increment(); }

void ServerMetrics::InterToken(double seconds) { inter_token_->Observe(seconds); }

void ServerMetrics::Step(const serving::StepInfo& step) {
  (step.prefill ? step_prefill_ : step_decode_)->Observe(step.seconds);
  (step.prefill ? step_tokens_prefill_ : step_tokens_decode_)->Observe(step.tokens);
  if (step.decode_rows > 0) batch_size_->Observe(step.decode_rows);
}

std::string ServerMetrics::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (auto& f : engine_collectable_->Collect()) families.push_back(std::move(f));
  for (auto& f : server_collectable_->Collect()) families.push_back(std::move(f));
  for (auto& f : process_collectable_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace decoded::server
