// grpc_latency_bench: token latency as a client sees it through the daemon.
//
// Opens one Generate stream to a running `decoded`, sends a text turn with
// greedy sampling and ignore_eos, and timestamps every TokenEvent on arrival.
// Prints one JSON object: client-side time to first token and mean / p50 /
// p99 inter-token latency, next to the server's own timings from TurnEnd.
// bench/run_bench.py compares it with the in-process D2 step time.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "grpcpp/grpcpp.h"
#include "proto/decoded.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "daemon address");
ABSL_FLAG(std::string, prompt, "The capital of France is", "prompt text");
ABSL_FLAG(int, tokens, 128, "tokens to generate");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using Clock = std::chrono::steady_clock;
  auto channel = grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials());
  auto stub = decoded::v1::Decoder::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Generate(&ctx);
  decoded::v1::GenerateRequest req;
  auto* turn = req.mutable_turn();
  turn->set_text(absl::GetFlag(FLAGS_prompt));
  turn->mutable_stopping()->set_max_new_tokens(absl::GetFlag(FLAGS_tokens));
  turn->mutable_stopping()->set_ignore_eos(true);
  const auto t0 = Clock::now();
  if (!stream->Write(req)) {
    std::fprintf(stderr, "write failed\n");
    return 1;
  }
  std::vector<double> arrivals;
  decoded::v1::GenerateResponse resp;
  decoded::v1::TurnEnd end;
  while (stream->Read(&resp)) {
    if (resp.has_token()) {
      arrivals.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    } else if (resp.has_turn_end()) {
      end = resp.turn_end();
      break;
    }
  }
  stream->WritesDone();
  grpc::Status st = stream->Finish();
  if (!st.ok() || arrivals.size() < 2) {
    std::fprintf(stderr, "stream failed: %s\n", st.error_message().c_str());
    return 1;
  }
  std::vector<double> gaps;
  for (size_t i = 1; i < arrivals.size(); ++i) gaps.push_back(arrivals[i] - arrivals[i - 1]);
  double sum = 0;
  for (double g : gaps) sum += g;
  std::sort(gaps.begin(), gaps.end());
  std::printf(
      "{\"tokens\": %zu, \"client_ttft_ms\": %.3f, \"client_inter_token_ms_mean\": %.4f, "
      "\"client_inter_token_ms_p50\": %.4f, \"client_inter_token_ms_p99\": %.4f, "
      "\"server_ttft_ms\": %.3f, \"server_inter_token_ms_mean\": %.4f}\n",
      arrivals.size(), arrivals[0], sum / gaps.size(), gaps[gaps.size() / 2],
      gaps[std::min(gaps.size() - 1, gaps.size() * 99 / 100)], end.timings().ttft_ms(),
      end.timings().mean_inter_token_ms());
  return 0;
}
