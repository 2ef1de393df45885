// kv_capacity_bench: how many sessions, each holding --context_tokens of
// context, a running `decoded` keeps at once within its KV budget (issue 18,
// part 6c: sessions at 2,048 tokens per GiB of KV).
//
// Sessions are opened one after another. Each sends one token-id turn of
// --context_tokens - --new_tokens prompt ids (BOS, then ids spread over the
// vocabulary, no two prompts sharing a prefix past BOS) generating
// --new_tokens (ignore_eos), so that when its turn ends it holds
// --context_tokens of context; its stream stays open, so the session and its
// KV stay held. The first session the daemon refuses (RESOURCE_EXHAUSTED, at
// open or at the turn: a contiguous cache per session) ends the count; so
// does, with paged KV (--metrics: the daemon's metrics address), the first
// turn whose blocks the daemon had to take back from an idle session
// (decoded_kv_preemptions_total rose: the pool no longer holds them all), not
// counted. Every held stream is then closed.
// Prints one JSON object: sessions held, the daemon's per-session context
// (ModelInfo), the refusal's message. Run the daemon with --kv_budget_mb B,
// --context_length >= --context_tokens and --max_sessions above what can fit
// (bench/run_kv_capacity_bench.py does): sessions per GiB =
// held / (B / 1024).
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "proto/decoded.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "daemon address");
ABSL_FLAG(int, context_tokens, 2048, "context each session holds (prompt + generated tokens)");
ABSL_FLAG(int, new_tokens, 8, "tokens each session generates after its prompt");
ABSL_FLAG(int, max_sessions, 4096, "stop counting here even if the daemon keeps admitting");
ABSL_FLAG(std::string, metrics, "",
          "the daemon's --metrics_listen (127.0.0.1:PORT): stop at the first KV preemption (paged KV)");

namespace {

namespace v1 = decoded::v1;
using Stream = grpc::ClientReaderWriter<v1::GenerateRequest, v1::GenerateResponse>;

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out + "\"";
}

// decoded_kv_preemptions_total from GET /metrics on `addr` (host:port), or -1.
double Preemptions(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return -1;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(addr.substr(0, colon).c_str(), addr.substr(colon + 1).c_str(), &hints, &res) != 0) return -1;
  const int fd = socket(res->ai_family, res->ai_socktype, 0);
  const bool connected = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
  freeaddrinfo(res);
  if (!connected) {
    if (fd >= 0) close(fd);
    return -1;
  }
  const std::string req = "GET /metrics HTTP/1.0\r\nHost: " + addr + "\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return -1;
  }
  std::string body;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) body.append(buf, static_cast<size_t>(n));
  close(fd);
  const std::string key = "\ndecoded_kv_preemptions_total ";
  const size_t at = body.find(key);
  return at == std::string::npos ? -1 : std::strtod(body.c_str() + at + key.size(), nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int context = absl::GetFlag(FLAGS_context_tokens);
  const int new_tokens = absl::GetFlag(FLAGS_new_tokens);
  if (new_tokens < 1 || context <= new_tokens + 1) {
    std::fprintf(stderr, "kv_capacity_bench: need --context_tokens > --new_tokens + 1 >= 2\n");
    return 1;
  }
  auto stub =
      v1::Decoder::NewStub(grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials()));
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status st = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!st.ok()) {
      std::fprintf(stderr, "kv_capacity_bench: GetModelInfo: %s\n", st.error_message().c_str());
      return 1;
    }
  }
  const int64_t vocab = info.vocab_size();
  const int64_t spread = std::max<int64_t>(1, std::min<int64_t>(50000, vocab - 1000));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<Stream>> held;
  std::string refusal;
  const auto start = std::chrono::steady_clock::now();
  while (static_cast<int>(held.size()) < absl::GetFlag(FLAGS_max_sessions)) {
    const int64_t s = static_cast<int64_t>(held.size());
    v1::GenerateRequest req;
    v1::Turn* turn = req.mutable_turn();
    turn->mutable_tokens()->add_ids(std::max(0, info.bos_id()));
    for (int64_t i = 1; i < context - new_tokens; ++i) {
      turn->mutable_tokens()->add_ids(static_cast<int32_t>((1000 + (i * 7919 + s * 104729) % spread) % vocab));
    }
    turn->mutable_stopping()->set_max_new_tokens(new_tokens);
    turn->mutable_stopping()->set_ignore_eos(true);
    auto ctx = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<Stream> stream = stub->Generate(ctx.get());
    bool ended = false;
    if (stream->Write(req)) {
      v1::GenerateResponse resp;
      int tokens = 0;
      while (stream->Read(&resp)) {
        tokens += resp.has_token() ? 1 : 0;
        if (resp.has_turn_end()) {
          ended = resp.turn_end().finish_reason() == v1::LENGTH && tokens == new_tokens;
          break;
        }
      }
    }
    if (!ended) {
      // Refused (the stream ended with its status) or cut short.
      stream->WritesDone();
      const grpc::Status st = stream->Finish();
      refusal = st.ok() ? "the turn ended before its tokens" : absl::StrCat(st.error_code(), ": ", st.error_message());
      if (st.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) {
        std::fprintf(stderr, "kv_capacity_bench: session %lld failed otherwise: %s\n", static_cast<long long>(s),
                     refusal.c_str());
        return 1;
      }
      break;
    }
    if (const std::string metrics = absl::GetFlag(FLAGS_metrics); !metrics.empty()) {
      const double preempted = Preemptions(metrics);
      if (preempted < 0) {
        std::fprintf(stderr, "kv_capacity_bench: no decoded_kv_preemptions_total at %s\n", metrics.c_str());
        return 1;
      }
      if (preempted > 0) {
        refusal = absl::StrCat("session ", s + 1, " took KV blocks back from an idle session (",
                               preempted, " preemptions): the pool holds ", s, " such sessions");
        stream->WritesDone();
        stream->Finish();
        break;
      }
    }
    contexts.push_back(std::move(ctx));
    held.push_back(std::move(stream));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& stream : held) {
    stream->WritesDone();
    stream->Finish();
  }
  std::printf(
      "{\"family\": \"%s\", \"cpu_isa\": \"%s\", \"context_tokens\": %d, \"session_context_length\": %d, "
      "\"sessions_held\": %zu, \"seconds\": %.1f, \"refusal\": %s}\n",
      info.family().c_str(), info.cpu_isa().c_str(), context, info.session_context_length(), held.size(), seconds,
      JsonString(refusal).c_str());
  return 0;
}
