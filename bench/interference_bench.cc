// interference_bench: what heavy requests of other clients do to a streaming
// client and to health checks, through a running daemon.
//
// Streams one turn alone, then the same turn while --tokenize_calls clients
// each send one Tokenize of --tokenize_bytes (each on its own connection, as
// separate clients would), while a prober sends a grpc.health.v1 Check every
// --health_interval_ms on a connection of its own. Prints one JSON object:
// the stream's inter-token p50 / p99 / max alone and under load, their
// ratio, the health calls' p99 / max latency and how many failed, and how the
// Tokenize calls ended. Run it against two builds of the daemon in one
// session to compare them (issue 16's target: p99 within 2x, health within
// 100 ms, for 8 x 1 MiB).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/client_unary_call.h"
#include "proto/decoded.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "daemon address");
ABSL_FLAG(int, tokens, 100, "tokens the streaming turn generates");
ABSL_FLAG(int, tokenize_calls, 8, "concurrent Tokenize calls");
ABSL_FLAG(int, tokenize_bytes, 1 << 20, "text bytes of each Tokenize call");
ABSL_FLAG(int, health_interval_ms, 50, "pause between health checks");
ABSL_FLAG(int, call_deadline_seconds, 60, "deadline of each Tokenize and health call");
ABSL_FLAG(bool, print_gaps, false, "also print the loaded turn's inter-token gaps (ms, in order) on stderr");

namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<grpc::Channel> OwnChannel() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
  return grpc::CreateCustomChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials(), args);
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

// Inter-token gaps (seconds) of one streamed turn.
std::vector<double> Stream(decoded::v1::Decoder::Stub& stub) {
  grpc::ClientContext ctx;
  auto stream = stub.Generate(&ctx);
  decoded::v1::GenerateRequest req;
  req.mutable_turn()->set_text("Count to one thousand:");
  req.mutable_turn()->mutable_stopping()->set_max_new_tokens(absl::GetFlag(FLAGS_tokens));
  req.mutable_turn()->mutable_stopping()->set_ignore_eos(true);
  std::vector<double> gaps;
  if (!stream->Write(req)) return gaps;
  decoded::v1::GenerateResponse resp;
  Clock::time_point last;
  bool first = true;
  while (stream->Read(&resp) && resp.has_token()) {
    const Clock::time_point now = Clock::now();
    if (!first) gaps.push_back(std::chrono::duration<double>(now - last).count());
    first = false;
    last = now;
  }
  stream->WritesDone();
  stream->Finish().IgnoreError();
  return gaps;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto stream_stub = decoded::v1::Decoder::NewStub(OwnChannel());
  Stream(*stream_stub);  // warm-up
  const std::vector<double> alone = Stream(*stream_stub);

  std::atomic<bool> stop{false};
  std::vector<double> health;
  int health_failed = 0;
  std::thread prober([&] {
    auto channel = OwnChannel();
    while (!stop.load()) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(absl::GetFlag(FLAGS_call_deadline_seconds)));
      grpc::Slice empty("", 0);
      grpc::ByteBuffer request(&empty, 1), response;
      const Clock::time_point start = Clock::now();
      const grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
          channel.get(),
          grpc::internal::RpcMethod("/grpc.health.v1.Health/Check", grpc::internal::RpcMethod::NORMAL_RPC), &ctx,
          request, &response);
      health.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      if (!s.ok()) ++health_failed;
      std::this_thread::sleep_for(std::chrono::milliseconds(absl::GetFlag(FLAGS_health_interval_ms)));
    }
  });
  std::vector<std::thread> tokenizers;
  std::vector<std::unique_ptr<grpc::ClientContext>> calls;
  std::map<std::string, int> endings;
  std::mutex endings_mu;
  for (int i = 0; i < absl::GetFlag(FLAGS_tokenize_calls); ++i) {
    calls.push_back(std::make_unique<grpc::ClientContext>());
    calls.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(absl::GetFlag(FLAGS_call_deadline_seconds)));
  }
  for (int i = 0; i < absl::GetFlag(FLAGS_tokenize_calls); ++i) {
    tokenizers.emplace_back([&, i] {
      auto stub = decoded::v1::Decoder::NewStub(OwnChannel());
      decoded::v1::TokenizeRequest req;
      std::string text;
      while (static_cast<int>(text.size()) < absl::GetFlag(FLAGS_tokenize_bytes) - 32) {
        absl::StrAppend(&text, "word", i, " of a long text ");
      }
      req.set_text(text);
      decoded::v1::TokenizeResponse resp;
      const grpc::Status s = stub->Tokenize(calls[i].get(), req, &resp);
      std::lock_guard<std::mutex> lock(endings_mu);
      ++endings[s.ok() ? "ok" : absl::StrCat("code_", s.error_code())];
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the Tokenize calls are running
  const std::vector<double> loaded = Stream(*stream_stub);
  if (absl::GetFlag(FLAGS_print_gaps)) {
    for (double g : loaded) std::fprintf(stderr, "%.1f ", g * 1e3);
    std::fprintf(stderr, "\n");
  }
  stop = true;
  prober.join();
  for (auto& c : calls) c->TryCancel();
  for (std::thread& t : tokenizers) t.join();

  std::string ends;
  for (const auto& [name, n] : endings) absl::StrAppend(&ends, ends.empty() ? "" : ", ", "\"", name, "\": ", n);
  std::printf(
      "{\"itl_ms_alone\": {\"p50\": %.2f, \"p99\": %.2f, \"max\": %.2f}, "
      "\"itl_ms_loaded\": {\"p50\": %.2f, \"p99\": %.2f, \"max\": %.2f}, \"p99_ratio\": %.2f, "
      "\"health_ms\": {\"p99\": %.2f, \"max\": %.2f, \"calls\": %zu, \"failed\": %d}, \"tokenize\": {%s}}\n",
      Percentile(alone, 0.5) * 1e3, Percentile(alone, 0.99) * 1e3, Percentile(alone, 1.0) * 1e3,
      Percentile(loaded, 0.5) * 1e3, Percentile(loaded, 0.99) * 1e3, Percentile(loaded, 1.0) * 1e3,
      Percentile(loaded, 0.99) / std::max(1e-9, Percentile(alone, 0.99)), Percentile(health, 0.99) * 1e3,
      Percentile(health, 1.0) * 1e3, health.size(), health_failed, ends.c_str());
  return 0;
}
