// decoded: the gRPC decode-serving daemon.
//
// Starts listening at once (health NOT_SERVING), loads and warms the model,
// then reports SERVING. SIGTERM, SIGINT or SIGHUP drains (see
// DecodedServer::Drain): health NOT_SERVING, new streams refused, running
// turns get --drain_seconds to finish, then end with finish reason SHUTDOWN;
// the process exits within --drain_seconds. A signal while the model loads
// exits at once. A second stop signal during the drain exits at once (the
// drain is cut: turns still running get no final event). Signals are set up
// before anything else runs (server/signals.h).
//
// Exit status:
//   0  stopped by a signal (drained, or before serving)
//   1  could not start (model file, address in use, ...), or a second signal
//      cut the drain short
//   2  invalid flags (a value out of range, limits that cannot hold)
//   3  the listener stopped accepting connections (drained first)
//   4  the model file changed on disk while mapped (--mmap; drained first)
// 3 and 4 ask the supervisor for a restart: the daemon cannot serve on.
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "decoded/version.h"
#include "engine/backend.h"
#include "engine/cpu_isa.h"
#include "engine/device_spec.h"
#include "engine/kv_layout.h"
#include "google/protobuf/stubs/logging.h"
#include "engine/serving/engine.h"
#include "server/cpu_budget.h"
#include "server/model_file_watch.h"
#include "server/server.h"
#include "server/signals.h"
#include "server/unknown_flags.h"

namespace {

std::string DefaultModelPath() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/decoded/gemma-3-270m-q4_k_m.gguf";
}

constexpr int kExitSignal = 0;
constexpr int kExitFailed = 1;
constexpr int kExitBadFlags = 2;
constexpr int kExitListenerFailed = 3;
constexpr int kExitModelFileChanged = 4;

// File descriptors the daemon needs besides its gRPC connections: the model
// file, /metrics connections (its threads and civetweb's accept queue),
// gRPC's and the workers' eventfds and epoll, the listener's spare, logs.
constexpr int64_t kReservedDescriptors = 128;
constexpr int kDefaultMaxConnections = 1024;

// Protobuf's own log lines (a request field that is not UTF-8 in a typed
// call, ...) at most once a second, so a client cannot flood the log.
void ThrottledProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                          const std::string& message) {
  static std::atomic<int64_t> last_ms{0};
  static std::atomic<int64_t> suppressed{0};
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  int64_t last = last_ms.load();
  if (now_ms - last < 1000 || !last_ms.compare_exchange_strong(last, now_ms)) {
    suppressed.fetch_add(1);
    return;
  }
  std::cerr << "decoded: protobuf: " << message;
  if (const int64_t n = suppressed.exchange(0); n > 0) std::cerr << " (and " << n << " more in the last seconds)";
  std::cerr << "\n";
}

// The first stop wins: a signal, a failed listener, a changed model file.
class StopRequest {
 public:
  void Request(std::string why, int exit_status) {
    absl::MutexLock lock(&mu_);
    if (requested_) return;
    requested_ = true;
    why_ = std::move(why);
    exit_status_ = exit_status;
  }
  // Blocks until a stop is requested; its reason and the exit status.
  std::pair<std::string, int> Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&requested_));
    return {why_, exit_status_};
  }

 private:
  absl::Mutex mu_;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  std::string why_ ABSL_GUARDED_BY(mu_);
  int exit_status_ ABSL_GUARDED_BY(mu_) = 0;
};

// Raises the soft open-files limit to the hard one (connections are file
// descriptors; distributions default the soft limit to 1024) and returns the
// soft limit in force.
int64_t RaiseOpenFilesLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 1024;
  const rlim_t before = limit.rlim_cur;
  rlim_t target = limit.rlim_max;
  // RLIM_INFINITY cannot be set; the kernel's per-process ceiling can.
  if (target == RLIM_INFINITY) {
    std::ifstream nr_open("/proc/sys/fs/nr_open");
    int64_t ceiling = 1 << 20;
    nr_open >> ceiling;
    target = static_cast<rlim_t>(ceiling);
  }
  if (target > limit.rlim_cur) {
    limit.rlim_cur = target;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) getrlimit(RLIMIT_NOFILE, &limit);
  }
  std::cerr << "decoded: open files limit: soft " << before;
  if (limit.rlim_cur != before) std::cerr << ", raised to " << limit.rlim_cur;
  std::cerr << " (hard "
            << (limit.rlim_max == RLIM_INFINITY ? std::string("unlimited") : std::to_string(limit.rlim_max))
            << ")\n";
  return static_cast<int64_t>(limit.rlim_cur);
}

}  // namespace

ABSL_FLAG(std::string, model, DefaultModelPath(), "GGUF model file");
ABSL_FLAG(std::string, device, "cpu",
          "where the model runs: cpu, vulkan (the first Vulkan device) or vulkan:N (device N in the order "
          "`vulkaninfo --summary` lists); a device that does not exist, or a model it cannot run or hold, exits 2");
ABSL_FLAG(bool, vulkan_validation, false,
          "enable the Khronos validation layer on a Vulkan device (Debian vulkan-validationlayers; slow): its "
          "reports go to stderr and decoded_device_validation_messages_total");
ABSL_FLAG(bool, mmap, false,
          "map the model file instead of reading it into memory: faster start, pages shared with other processes, "
          "but a file truncated or overwritten while served crashes the daemon (SIGBUS) or changes its weights "
          "(it then stops and exits 4 as soon as it notices)");
ABSL_FLAG(std::string, listen, "127.0.0.1:50051", "gRPC listen address (host:port)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464", "Prometheus /metrics address; empty disables");
ABSL_FLAG(std::string, http_listen, "",
          "OpenAI-compatible HTTP API address (host:port: /health, /v1/models); empty disables");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's id in the HTTP API (/v1/models, a request's \"model\"); default: the model file's name "
          "without .gguf");
ABSL_FLAG(int, workers, 1, "worker threads stepping sessions");
ABSL_FLAG(int, threads, 0,
          "compute threads per worker; 0: the CPUs this process may use (cgroup CPU quota, affinity mask) "
          "divided among --workers, at least 1");
ABSL_FLAG(int, max_sessions, 16,
          "sessions (KV caches) open at once; a stream takes one with its first turn, beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_sessions_per_peer, 0,
          "sessions one client address may hold, gRPC and HTTP together (0: no limit; behind a proxy every "
          "client is the proxy)");
ABSL_FLAG(int, max_streams_per_peer, 256,
          "Generate streams one client address may hold open (0: no limit; raise it behind a busy proxy)");
ABSL_FLAG(int, max_connections_per_peer, 64,
          "connections one client address may hold open on each door (gRPC, HTTP); more are closed at accept (0: no "
          "limit)");
ABSL_FLAG(int, max_batch, 16,
          "decode sessions a worker steps together in one plan run (continuous batching; 1 = one at a time, <= 64)");
ABSL_FLAG(int, max_step_tokens, 512,
          "tokens one step runs: every decoding session's next token plus prefill spans of waiting prompts, in one "
          "plan run (0: each prompt chunk runs alone, through a graph built for it; else > --max_batch, <= 2048)");
ABSL_FLAG(int, max_queued, 64, "queued turns beyond which turns get RESOURCE_EXHAUSTED");
ABSL_FLAG(int, context_length, 2048, "KV capacity of one session, in tokens");
ABSL_FLAG(int, max_connections, 0,
          "connections open at once on each door (gRPC, and HTTP with --http_listen); more are closed at accept. "
          "0: 1024, or fewer if the open files limit (raised to its hard limit at start) leaves less");
ABSL_FLAG(int, max_streams_per_connection, 100, "concurrent streams per connection (HTTP/2 MAX_CONCURRENT_STREAMS)");
ABSL_FLAG(int, max_streams, 1024, "Generate streams open at once, with or without a session; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_stream_resets_per_second, 500,
          "a connection whose client resets streams faster than this (twice as many at once) is closed (HTTP/2 "
          "Rapid Reset); 0: no limit");
ABSL_FLAG(int, max_connection_age_seconds, 300,
          "a gRPC connection older than this gets a GOAWAY, so its client reconnects (and re-resolves: new replicas "
          "get new sessions); open streams keep running; 0: never");
ABSL_FLAG(int, first_turn_seconds, 30,
          "a Generate stream that sends no turn this long after opening ends (DEADLINE_EXCEEDED); 0: never");
ABSL_FLAG(int, idle_session_seconds, 300,
          "a Generate stream with no turn for this long ends (DEADLINE_EXCEEDED) and frees its session, as does "
          "a turn whose client takes none of its events for this long; 0: never");
ABSL_FLAG(int64_t, max_text_bytes, int64_t{1} << 20,
          "largest text of one request: Tokenize's text, a text turn, a chat turn's messages (roles and contents, "
          "16 more bytes per message), Detokenize's reply");
ABSL_FLAG(int, max_chat_messages, 4096, "most messages in one chat turn");
ABSL_FLAG(int, max_token_ids, 131072, "most token ids in one request (Detokenize, a token turn)");
ABSL_FLAG(int, max_stop_sequences, 16, "most stop sequences in one turn (stop token ids: at most 1024)");
ABSL_FLAG(int64_t, max_metadata_bytes, 8192,
          "largest request metadata (HPACK sizes: names + values + 32 per entry); beyond, that call alone gets "
          "RESOURCE_EXHAUSTED");
ABSL_FLAG(int, turn_queue, 64, "turns waiting to be tokenized and submitted; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(int, utility_queue, 16, "Tokenize/Detokenize calls waiting for their thread; beyond: RESOURCE_EXHAUSTED");
ABSL_FLAG(int, listener_probe_seconds, 5,
          "probe the listening address this often; 3 failed probes in a row turn health NOT_SERVING, drain, and "
          "exit 3. 0: no probe");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain; with --tls_key enables TLS on gRPC and on --http_listen (HTTPS)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key");
ABSL_FLAG(std::string, auth_token, "",
          "if set, RPCs (and reflection) need 'authorization: Bearer <token>'; health stays open for probes");
ABSL_FLAG(std::string, metrics_auth_token, "", "if set, /metrics needs 'Authorization: Bearer <token>'");
ABSL_FLAG(int, drain_seconds, 10,
          "on SIGTERM/SIGINT/SIGHUP, running turns get this long to finish; the process exits within it");
ABSL_FLAG(int, stuck_step_seconds, 30, "health turns NOT_SERVING while one step runs longer than this");
ABSL_FLAG(int, max_unconsumed_events, 8,
          "a stream whose client has not taken this many token events is not stepped until it reads (>= 1)");
ABSL_FLAG(int64_t, kv_budget_mb, -1,
          "KV cache memory, MiB: with paged KV the size of the block pool all sessions share (a prompt waits for "
          "free blocks); with --kv_block_tokens=0 what open sessions may reserve (beyond: RESOURCE_EXHAUSTED at "
          "open). -1: 75% of the memory the KV cache lives in (physical memory on cpu; on a GPU, its memory the "
          "weights leave); 0: no limit (the pool: every session at its full context); less than one session's "
          "full context, or more than a GPU has left, is refused at start");
ABSL_FLAG(std::string, kv_type, "f16",
          "element type of the KV cache: f32, f16 (half the bytes; perplexity within 0.1% of f32 on the real "
          "models, docs/benchmarks.md) or q8_0 (34 bytes per 32 values; needs head dims that are multiples of 32)");
ABSL_FLAG(int, kv_block_tokens, 16,
          "paged KV: token positions per block of the shared KV pool; a session holds the blocks its length "
          "needs (0: each session reserves a contiguous cache of --context_length at open; <= 1024)");
ABSL_FLAG(bool, prefix_cache, true,
          "paged KV: keep full KV blocks under the hash of their tokens after sessions let go of them, so a prompt "
          "that starts with the same tokens (a shared system prompt, a resent conversation) maps them instead of "
          "prefilling them again; evicted least recently used first when blocks are needed");
ABSL_FLAG(std::string, chat_template, "",
          "file with a Jinja chat template that replaces the model file's tokenizer.chat_template (for models "
          "without one, e.g. a base model); empty: the file's own");
ABSL_FLAG(bool, chat_content_specials, false,
          "parse special-token spellings (<start_of_turn>, ...) in chat message content into their ids; "
          "for trusted clients only (off, content is plain text and cannot forge turns)");

int main(int argc, char** argv) {
  // Before anything else, while this is the only thread: every thread started
  // from here on inherits the mask, and no signal takes its default action.
  decoded::server::BlockProcessSignals();
  // Blocks of 1 MiB and more are mapped and unmapped on their own, always:
  // glibc otherwise raises this threshold to the largest block freed (up to
  // 32 MiB), after which the load's big temporaries (the GGUF metadata's
  // arrays, 12 MB each for a 262k vocabulary, dropped after the load) come
  // from the heap and leave holes there that later small allocations pin:
  // an abort storm's resident memory then wandered by +-16 MiB, against +1
  // with this (engine/cpu/cpu_backend.cc maps its buffers for the same reason).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  std::atomic<bool> serving{false};
  StopRequest stop;
  decoded::server::SignalWatcher signal_watcher([&](int sig, int earlier_stops) {
    const std::string name = decoded::server::SignalName(sig);
    if (earlier_stops > 0) {
      // The operator wants out now. Turns still running get no final event;
      // the status says the drain was cut.
      std::cerr << "decoded: second stop signal (" << name << ") while draining, exiting at once\n";
      std::_Exit(kExitFailed);
    }
    if (!serving.load()) {
      // Nothing to drain yet; the same exit status as a drained stop.
      std::cerr << "decoded: " << name << " before serving, exiting\n";
      std::_Exit(kExitSignal);
    }
    stop.Request(absl::StrCat(name, ", draining"), kExitSignal);
  });

  google::protobuf::SetLogHandler(&ThrottledProtobufLog);
  absl::SetProgramUsageMessage("decoded --model FILE [--listen ADDR] [--workers N] ...");
  // --help lists this file's flags (absl matches flags by their defining file).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) { return absl::EndsWith(file, "server/main.cc"); };
  usage.version_string = [] { return absl::StrCat("decoded ", decoded::kVersion, " (", decoded::kRevision, ")\n"); };
  absl::SetFlagsUsageConfig(usage);
  auto bad_flags = [](const std::string& message) {
    std::cerr << "decoded: " << message << "\n";
    return kExitBadFlags;
  };
  if (std::optional<std::string> unknown = decoded::FirstUnknownFlag(argc, argv)) {
    return bad_flags(absl::StrCat("unknown flag --", *unknown, " (decoded --help lists them)"));
  }
  if (std::optional<std::string> bad = decoded::FirstBadFlagValue(argc, argv)) return bad_flags(*bad);
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    return bad_flags(absl::StrCat("unexpected argument '", rest[1], "' (the model is given with --model)"));
  }
  if (absl::GetFlag(FLAGS_drain_seconds) < 0 || absl::GetFlag(FLAGS_stuck_step_seconds) <= 0) {
    return bad_flags("--drain_seconds must be >= 0 and --stuck_step_seconds > 0");
  }
  if (absl::GetFlag(FLAGS_workers) < 1 || absl::GetFlag(FLAGS_threads) < 0) {
    return bad_flags("--workers must be >= 1 and --threads >= 0 (0: from the CPU budget)");
  }
  if (absl::GetFlag(FLAGS_max_connections) < 0 || absl::GetFlag(FLAGS_max_streams_per_connection) < 1 ||
      absl::GetFlag(FLAGS_max_streams) < 1 || absl::GetFlag(FLAGS_max_sessions_per_peer) < 0 ||
      absl::GetFlag(FLAGS_max_stream_resets_per_second) < 0 || absl::GetFlag(FLAGS_max_streams_per_peer) < 0 ||
      absl::GetFlag(FLAGS_max_connections_per_peer) < 0 || absl::GetFlag(FLAGS_first_turn_seconds) < 0 ||
      absl::GetFlag(FLAGS_idle_session_seconds) < 0 || absl::GetFlag(FLAGS_listener_probe_seconds) < 0 ||
      absl::GetFlag(FLAGS_turn_queue) < 1 || absl::GetFlag(FLAGS_utility_queue) < 1 ||
      absl::GetFlag(FLAGS_max_metadata_bytes) < 1) {
    return bad_flags(
        "--max_connections, the --max_*_per_peer flags, --max_stream_resets_per_second, --first_turn_seconds, "
        "--idle_session_seconds and --listener_probe_seconds must be "
        ">= 0; --max_streams_per_connection, --max_streams, --turn_queue, --utility_queue and "
        "--max_metadata_bytes >= 1");
  }
  if (absl::GetFlag(FLAGS_max_text_bytes) < 1 || absl::GetFlag(FLAGS_max_chat_messages) < 1 ||
      absl::GetFlag(FLAGS_max_token_ids) < 1) {
    return bad_flags("--max_text_bytes, --max_chat_messages and --max_token_ids must be >= 1");
  }
  // The kernels' instruction-set tier, before anything runs a kernel: a bad
  // DECODED_CPU_ISA is a startup error, and the log names what runs.
  if (absl::Status isa = decoded::InitCpuIsaFromEnvironment(); !isa.ok()) {
    std::cerr << "decoded: " << isa << "\n";
    return kExitFailed;
  }
  const decoded::CpuIsa isa = decoded::ActiveCpuIsa();
  std::cerr << "decoded: CPU kernels " << decoded::CpuIsaName(isa);
  if (isa != decoded::BestSupportedCpuIsa()) {
    std::cerr << " (" << decoded::kCpuIsaEnv << "; this CPU supports "
              << decoded::CpuIsaName(decoded::BestSupportedCpuIsa()) << ")";
  }
  std::cerr << "\n";
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

  // Connections are file descriptors: the limit must hold them all, or
  // accepting one more fails. A plaintext gRPC connection is relayed through
  // the HTTP/2 guard (server/http2_guard.h): three descriptors; a TLS one,
  // one. With --http_listen the HTTP door takes as many connections again, one
  // descriptor each.
  const int64_t open_files = RaiseOpenFilesLimit();
  const int64_t per_connection =
      (absl::GetFlag(FLAGS_tls_cert).empty() ? 3 : 1) + (absl::GetFlag(FLAGS_http_listen).empty() ? 0 : 1);
  const int64_t room = (open_files - kReservedDescriptors) / per_connection;
  int max_connections = absl::GetFlag(FLAGS_max_connections);
  if (max_connections == 0) {
    if (room < 16) {
      return bad_flags(absl::StrCat("the open files limit of ", open_files, " leaves room for ", std::max<int64_t>(room, 0),
                                    " connections beside the daemon's own ", kReservedDescriptors,
                                    " descriptors; raise it (ulimit -n, --ulimit nofile=)"));
    }
    max_connections = static_cast<int>(std::min<int64_t>(kDefaultMaxConnections, room));
  } else if (max_connections > room) {
    return bad_flags(absl::StrCat("--max_connections ", max_connections, " needs ",
                                  max_connections * per_connection + kReservedDescriptors,
                                  " file descriptors; the open files limit is ", open_files,
                                  " (raise it, or lower --max_connections)"));
  }
  std::cerr << "decoded: at most " << max_connections << " connections, "
            << absl::GetFlag(FLAGS_max_streams_per_connection) << " streams each, "
            << absl::GetFlag(FLAGS_max_streams) << " Generate streams in all\n";

  decoded::serving::EngineOptions engine_options;
  engine_options.model_path = absl::GetFlag(FLAGS_model);
  engine_options.mmap_weights = absl::GetFlag(FLAGS_mmap);
  engine_options.workers = workers;
  engine_options.threads_per_worker = threads;
  // Teams that take every CPU leave none for Tokenize and long prompts: they
  // lend a thread while such work runs (EngineOptions).
  engine_options.lend_threads_to_host_work = threads > 1 && compute_threads >= budget.cpus;
  if (engine_options.lend_threads_to_host_work) {
    std::cerr << "decoded: the compute teams take every CPU: each lends a thread while a large Tokenize, "
                 "Detokenize or prompt is encoded\n";
  }
  engine_options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  engine_options.max_batch = absl::GetFlag(FLAGS_max_batch);
  engine_options.max_step_tokens = absl::GetFlag(FLAGS_max_step_tokens);
  engine_options.max_queued = absl::GetFlag(FLAGS_max_queued);
  engine_options.context_length = absl::GetFlag(FLAGS_context_length);
  engine_options.max_unconsumed_events = absl::GetFlag(FLAGS_max_unconsumed_events);
  engine_options.parse_special_in_chat_content = absl::GetFlag(FLAGS_chat_content_specials);
  engine_options.limits.max_text_bytes = absl::GetFlag(FLAGS_max_text_bytes);
  engine_options.limits.max_chat_messages = absl::GetFlag(FLAGS_max_chat_messages);
  engine_options.limits.max_token_ids = absl::GetFlag(FLAGS_max_token_ids);
  engine_options.limits.max_stop_sequences = absl::GetFlag(FLAGS_max_stop_sequences);
  if (const std::string path = absl::GetFlag(FLAGS_chat_template); !path.empty()) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in || text.str().empty()) {
      return bad_flags(absl::StrCat("--chat_template ", path, ": cannot read a template from it"));
    }
    engine_options.chat_template = text.str();
  }
  const int64_t kv_budget_mb = absl::GetFlag(FLAGS_kv_budget_mb);
  if (kv_budget_mb < -1) return bad_flags("--kv_budget_mb must be >= -1 (-1: from the memory there is; 0: no limit)");
  engine_options.kv_budget_bytes = kv_budget_mb < 0 ? -1 : kv_budget_mb * (int64_t{1} << 20);
  if (const absl::StatusOr<decoded::DType> t = decoded::KvTypeFromName(absl::GetFlag(FLAGS_kv_type)); t.ok()) {
    engine_options.kv_type = *t;
  } else {
    return bad_flags(absl::StrCat("--kv_type ", t.status().message()));
  }
  engine_options.kv_block_tokens = absl::GetFlag(FLAGS_kv_block_tokens);
  engine_options.prefix_cache = absl::GetFlag(FLAGS_prefix_cache);
  // The device before anything listens: a device that does not exist is a
  // flag that cannot hold.
  decoded::DeviceOptions device_options;
  device_options.validation = absl::GetFlag(FLAGS_vulkan_validation);
  absl::StatusOr<std::shared_ptr<decoded::Backend>> backend =
      decoded::OpenBackend(absl::GetFlag(FLAGS_device), device_options);
  if (!backend.ok()) return bad_flags(absl::StrCat("--device ", absl::GetFlag(FLAGS_device), ": ",
                                                   backend.status().message()));
  engine_options.backend = *backend;
  if ((*backend)->name() != "cpu") {
    std::cerr << "decoded: device " << (*backend)->name() << " (" << (*backend)->device_name() << "), "
              << ((*backend)->memory_capacity_bytes() >> 20) << " MiB of memory; --threads " << threads
              << " per worker for sampling\n";
  }
  // Every engine option is checked before the server starts and the model loads.
  if (absl::Status valid = decoded::serving::CheckEngineOptions(engine_options); !valid.ok()) {
    return bad_flags(absl::StrCat(valid.message(), " (the flag of that name)"));
  }

  decoded::server::ServerOptions server_options;
  server_options.listen = absl::GetFlag(FLAGS_listen);
  server_options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  server_options.http_listen = absl::GetFlag(FLAGS_http_listen);
  server_options.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  if (server_options.served_model_name.empty()) {
    server_options.served_model_name = std::filesystem::path(absl::GetFlag(FLAGS_model)).filename().string();
    if (absl::EndsWith(server_options.served_model_name, ".gguf")) {
      server_options.served_model_name.resize(server_options.served_model_name.size() - 5);
    }
  }
  server_options.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  server_options.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  server_options.auth_token = absl::GetFlag(FLAGS_auth_token);
  server_options.metrics_auth_token = absl::GetFlag(FLAGS_metrics_auth_token);
  server_options.stuck_step_threshold = absl::Seconds(absl::GetFlag(FLAGS_stuck_step_seconds));
  server_options.max_connections = max_connections;
  server_options.max_streams_per_connection = absl::GetFlag(FLAGS_max_streams_per_connection);
  server_options.max_streams = absl::GetFlag(FLAGS_max_streams);
  server_options.max_sessions_per_peer = absl::GetFlag(FLAGS_max_sessions_per_peer);
  server_options.max_stream_resets_per_second = absl::GetFlag(FLAGS_max_stream_resets_per_second);
  server_options.max_streams_per_peer = absl::GetFlag(FLAGS_max_streams_per_peer);
  server_options.max_connections_per_peer = absl::GetFlag(FLAGS_max_connections_per_peer);
  const int first_turn = absl::GetFlag(FLAGS_first_turn_seconds);
  server_options.first_turn_timeout = first_turn == 0 ? absl::InfiniteDuration() : absl::Seconds(first_turn);
  server_options.max_metadata_bytes = absl::GetFlag(FLAGS_max_metadata_bytes);
  const int connection_age = absl::GetFlag(FLAGS_max_connection_age_seconds);
  server_options.max_connection_age =
      connection_age <= 0 ? absl::InfiniteDuration() : absl::Seconds(connection_age);
  const int idle = absl::GetFlag(FLAGS_idle_session_seconds);
  server_options.idle_session_timeout = idle == 0 ? absl::InfiniteDuration() : absl::Seconds(idle);
  server_options.listener_probe_interval = absl::Seconds(absl::GetFlag(FLAGS_listener_probe_seconds));
  server_options.turn_queue = absl::GetFlag(FLAGS_turn_queue);
  server_options.utility_queue = absl::GetFlag(FLAGS_utility_queue);
  server_options.on_listener_failure = [&](const absl::Status& why) {
    if (!serving.load()) {
      std::cerr << "decoded: " << why.message() << " before serving; exiting\n";
      std::_Exit(kExitListenerFailed);
    }
    stop.Request(absl::StrCat(why.message(), "; draining, then exiting ", kExitListenerFailed,
                              " so that the supervisor restarts the daemon"),
                 kExitListenerFailed);
  };
  auto server = decoded::server::DecodedServer::Start(server_options);
  if (!server.ok()) {
    std::cerr << "decoded: " << server.status() << "\n";
    // A bad address or TLS files are flags that cannot hold; an address in
    // use is the machine's state.
    return absl::IsInvalidArgument(server.status()) ? kExitBadFlags : kExitFailed;
  }
  std::cerr << "decoded: listening on port " << (*server)->port();
  if ((*server)->metrics_port() > 0) std::cerr << ", metrics on port " << (*server)->metrics_port();
  std::cerr << ", loading " << absl::GetFlag(FLAGS_model) << "\n";

  (*server)->ObserveEngine(engine_options);
  // The file as it is when the load begins: what a later change is measured against.
  const struct stat loaded = decoded::server::StatModelFile(engine_options.model_path);
  auto engine = decoded::serving::Engine::Create(engine_options);
  if (!engine.ok()) {
    std::cerr << "decoded: " << engine.status() << "\n";
    // A model the device cannot run (FAILED_PRECONDITION) or hold, or a KV
    // budget it cannot hold (RESOURCE_EXHAUSTED): --device, --model and
    // --kv_budget_mb that cannot hold together.
    return absl::IsFailedPrecondition(engine.status()) || absl::IsResourceExhausted(engine.status())
               ? kExitBadFlags
               : kExitFailed;
  }
  const decoded::serving::EngineModelInfo& info = (*engine)->ModelInfo();
  const int64_t kv_budget_bytes = (*engine)->Stats().kv_budget_bytes;
  if (kv_budget_bytes > 0 && kv_budget_bytes < info.session_kv_bytes) {
    // Every session would be refused while health said SERVING.
    return bad_flags(absl::StrCat("--kv_budget_mb ", kv_budget_bytes >> 20, " is less than one session's KV cache (",
                                  (info.session_kv_bytes + (1 << 20) - 1) >> 20, " MiB for --context_length ",
                                  info.session_context_length, "): no session could reach it"));
  }
  if (info.session_context_length < engine_options.context_length) {
    std::cerr << "decoded: warning: --context_length " << engine_options.context_length << " exceeds the model's "
              << info.session_context_length << "; sessions get " << info.session_context_length << "\n";
  }
  std::cerr << "decoded: weights " << (engine_options.mmap_weights ? "mapped from" : "copied from")
            << " the file (" << info.weight_dtype << "), KV cache " << info.kv_type << " ("
            << info.session_kv_bytes / std::max(info.session_context_length, 1) << " bytes per token)\n";
  const bool mapped = engine_options.mmap_weights;
  decoded::server::ModelFileWatch file_watch(
      engine_options.model_path, loaded, absl::Seconds(1), [&stop, mapped](const std::string& what, bool in_place) {
        if (!mapped || !in_place) {
          std::cerr << "decoded: " << what << "; still serving "
                    << (mapped ? "the mapped file as it was (its inode stays)" : "the copy loaded at start")
                    << " (restart to serve the new file)\n";
          return;
        }
        stop.Request(absl::StrCat(what, "; its mapped weights are no longer the ones loaded (--mmap): stopping "
                                        "at once, then exiting ",
                                  kExitModelFileChanged, " so that the supervisor restarts the daemon"),
                     kExitModelFileChanged);
      });
  (*server)->AttachEngine(*std::move(engine));
  serving = true;
  std::cerr << "decoded: serving\n";

  const auto [why, exit_status] = stop.Wait();
  std::cerr << "decoded: " << why << "\n";
  absl::Duration drain = absl::Seconds(absl::GetFlag(FLAGS_drain_seconds));
  if (exit_status == kExitModelFileChanged) {
    // Mapped weights that changed serve garbage: every turn ends at its next
    // step (finish reason SHUTDOWN), and the drain waits only for those ends.
    (*server)->engine()->BeginShutdown();
    drain = std::min(drain, absl::Seconds(2));
  }
  (*server)->Drain(drain);
  std::cerr << "decoded: stopped\n";
  return exit_status;
}
