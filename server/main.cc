// decoded: the gRPC decode-serving daemon.
//
// Starts listening at once (health NOT_SERVING), loads and warms the model,
// then reports SERVING. SIGTERM or SIGINT drains (see DecodedServer::Drain):
// health NOT_SERVING, new streams refused, running turns get --drain_seconds
// to finish, then end with finish reason SHUTDOWN; the process exits within
// --drain_seconds. A signal while the model loads exits at once. Either way
// the exit status after SIGTERM/SIGINT is 0: the daemon stopped as asked. A
// second signal during the drain exits at once with status 1 (drain cut).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/cpu_isa.h"
#include "engine/serving/engine.h"
#include "server/cpu_budget.h"
#include "server/server.h"

namespace {

std::string DefaultModelPath() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/decoded/gemma-3-270m-q4_k_m.gguf";
}

}  // namespace

ABSL_FLAG(std::string, model, DefaultModelPath(), "GGUF model file");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address (host:port)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464", "Prometheus /metrics address; empty disables");
ABSL_FLAG(int, workers, 1, "worker threads stepping sessions");
ABSL_FLAG(int, threads, 0,
          "compute threads per worker; 0: the CPUs this process may use (cgroup CPU quota, affinity mask) "
          "divided among --workers, at least 1");
ABSL_FLAG(int, max_sessions, 16, "open sessions beyond which streams get RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_batch, 16,
          "decode sessions a worker steps together in one plan run (continuous batching; 1 = one at a time, <= 64)");
ABSL_FLAG(int, max_queued, 64, "queued turns beyond which turns get RESOURCE_EXHAUSTED");
ABSL_FLAG(int, context_length, 2048, "KV capacity of one session, in tokens");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain; with --tls_key enables TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key");
ABSL_FLAG(std::string, auth_token, "", "if set, RPCs need 'authorization: Bearer <token>'");
ABSL_FLAG(int, drain_seconds, 10,
          "on SIGTERM/SIGINT, running turns get this long to finish; the process exits within it");
ABSL_FLAG(int, stuck_step_seconds, 30, "health turns NOT_SERVING while one step runs longer than this");
ABSL_FLAG(int, max_unconsumed_events, 8,
          "a stream whose client has not taken this many token events is not stepped until it reads (>= 1)");
ABSL_FLAG(int64_t, kv_budget_mb, -1,
          "KV cache all open sessions may reserve, MiB; beyond it new streams get RESOURCE_EXHAUSTED. "
          "-1: 75% of physical memory; 0: no limit");
ABSL_FLAG(std::string, chat_template, "",
          "file with a Jinja chat template that replaces the model file's tokenizer.chat_template (for models "
          "without one, e.g. a base model); empty: the file's own");
ABSL_FLAG(bool, chat_content_specials, false,
          "parse special-token spellings (<start_of_turn>, ...) in chat message content into their ids; "
          "for trusted clients only (off, content is plain text and cannot forge turns)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("decoded --model FILE [--listen ADDR] [--workers N] ...");
  // --help lists this file's flags (absl matches flags by their defining file).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) { return absl::EndsWith(file, "server/main.cc"); };
  absl::SetFlagsUsageConfig(usage);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "decoded: unexpected argument '" << rest[1] << "' (the model is given with --model)\n";
    return 1;
  }
  if (absl::GetFlag(FLAGS_drain_seconds) < 0 || absl::GetFlag(FLAGS_stuck_step_seconds) <= 0) {
    std::cerr << "decoded: --drain_seconds must be >= 0 and --stuck_step_seconds > 0\n";
    return 1;
  }
  // The kernels' instruction-set tier, before anything runs a kernel: a bad
  // DECODED_CPU_ISA is a startup error, and the log names what runs.
  if (absl::Status isa = decoded::InitCpuIsaFromEnvironment(); !isa.ok()) {
    std::cerr << "decoded: " << isa << "\n";
    return 1;
  }
  const decoded::CpuIsa isa = decoded::ActiveCpuIsa();
  std::cerr << "decoded: CPU kernels " << decoded::CpuIsaName(isa);
  if (isa != decoded::BestSupportedCpuIsa()) {
    std::cerr << " (" << decoded::kCpuIsaEnv << "; this CPU supports "
              << decoded::CpuIsaName(decoded::BestSupportedCpuIsa()) << ")";
  }
  std::cerr << "\n";
  if (absl::GetFlag(FLAGS_workers) < 1 || absl::GetFlag(FLAGS_threads) < 0) {
    std::cerr << "decoded: --workers must be >= 1 and --threads >= 0 (0: from the CPU budget)\n";
    return 1;
  }
  // The CPUs a container may use are its cgroup quota, not the host's cores.
  const decoded::server::CpuBudget budget = decoded::server::DetectCpuBudget();
  const int workers = absl::GetFlag(FLAGS_workers);
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads == 0) {
    threads = std::max(1, budget.cpus / workers);
    std::cerr << "decoded: " << budget.cpus << " CPUs (" << budget.explanation << "): --threads " << threads
              << " per worker, " << workers << (workers == 1 ? " worker\n" : " workers\n");
  } else {
    std::cerr << "decoded: " << budget.cpus << " CPUs (" << budget.explanation << "); --threads " << threads
              << " as given, " << workers << (workers == 1 ? " worker\n" : " workers\n");
  }
  const long compute_threads = static_cast<long>(workers) * threads;
  if (compute_threads > budget.cpus) {
    std::cerr << "decoded: warning: --workers x --threads = " << compute_threads << " compute threads on "
              << budget.cpus << " CPUs; oversubscribed compute teams run far slower than one thread per CPU\n";
  }

  // Block the drain signals in every thread; a dedicated thread waits for
  // them. Before the engine is serving there is nothing to drain, so a signal
  // then (e.g. during a long model load) exits at once.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::atomic<bool> serving{false};
  std::atomic<int> received{0};
  absl::Notification drain;
  std::thread signal_waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    received = sig;
    if (!serving.load()) {
      // Nothing to drain yet; the same exit status as a drained stop.
      std::cerr << "decoded: signal " << sig << " before serving, exiting\n";
      std::_Exit(0);
    }
    drain.Notify();
    // A second signal during the drain: the operator wants out now. Turns
    // still running get no final event; the status says the drain was cut.
    sigwait(&signals, &sig);
    std::cerr << "decoded: second signal " << sig << " while draining, exiting at once\n";
    std::_Exit(1);
  });
  signal_waiter.detach();

  decoded::server::ServerOptions server_options;
  server_options.listen = absl::GetFlag(FLAGS_listen);
  server_options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  server_options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  server_options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  server_options.auth_token = absl::GetFlag(FLAGS_auth_token);
  server_options.stuck_step_threshold = absl::Seconds(absl::GetFlag(FLAGS_stuck_step_seconds));
  auto server = decoded::server::DecodedServer::Start(server_options);
  if (!server.ok()) {
    std::cerr << "decoded: " << server.status() << "\n";
    return 1;
  }
  std::cerr << "decoded: listening on port " << (*server)->port();
  if ((*server)->metrics_port() > 0) std::cerr << ", metrics on port " << (*server)->metrics_port();
  std::cerr << ", loading " << absl::GetFlag(FLAGS_model) << "\n";

  decoded::serving::EngineOptions engine_options;
  engine_options.model_path = absl::GetFlag(FLAGS_model);
  engine_options.workers = workers;
  engine_options.threads_per_worker = threads;
  engine_options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  engine_options.max_batch = absl::GetFlag(FLAGS_max_batch);
  engine_options.max_queued = absl::GetFlag(FLAGS_max_queued);
  engine_options.context_length = absl::GetFlag(FLAGS_context_length);
  engine_options.max_unconsumed_events = absl::GetFlag(FLAGS_max_unconsumed_events);
  engine_options.parse_special_in_chat_content = absl::GetFlag(FLAGS_chat_content_specials);
  if (const std::string path = absl::GetFlag(FLAGS_chat_template); !path.empty()) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in || text.str().empty()) {
      std::cerr << "decoded: --chat_template " << path << ": cannot read a template from it\n";
      return 1;
    }
    engine_options.chat_template = text.str();
  }
  int64_t kv_budget_mb = absl::GetFlag(FLAGS_kv_budget_mb);
  if (kv_budget_mb < 0) {
    const int64_t physical = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
    kv_budget_mb = physical / (1 << 20) * 3 / 4;
  }
  engine_options.kv_budget_bytes = kv_budget_mb * (int64_t{1} << 20);
  decoded::server::ServerMetrics* metrics = &(*server)->metrics();
  engine_options.on_step = [metrics](const decoded::serving::StepInfo& step) { metrics->Step(step); };
  auto engine = decoded::serving::Engine::Create(engine_options);
  if (!engine.ok()) {
    std::cerr << "decoded: " << engine.status() << "\n";
    return 1;
  }
  if ((*engine)->ModelInfo().session_context_length < engine_options.context_length) {
    std::cerr << "decoded: warning: --context_length " << engine_options.context_length << " exceeds the model's "
              << (*engine)->ModelInfo().session_context_length << "; sessions get "
              << (*engine)->ModelInfo().session_context_length << "\n";
  }
  (*server)->AttachEngine(*std::move(engine));
  serving = true;
  std::cerr << "decoded: serving\n";

  drain.WaitForNotification();
  std::cerr << "decoded: signal " << received.load() << ", draining\n";
  (*server)->Drain(absl::Seconds(absl::GetFlag(FLAGS_drain_seconds)));
  std::cerr << "decoded: stopped\n";
  return 0;
}
