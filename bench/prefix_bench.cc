// prefix_bench: sessions that share a long system prompt, through a running
// `decoded` (issue 18, part 6b): what the prefix cache saves.
//
// --sessions streams start together (a barrier). Each sends --turns turns:
// the first is BOS, the --system_tokens ids every session shares, then
// --user_tokens ids of its own; each later turn is --user_tokens new ids of
// its own. Every turn generates --new_tokens tokens (greedy, ignore_eos).
// Run it against a daemon with --prefix_cache=true and again with false.
//
// Reported (JSON on stdout):
//   wall_s               the barrier -> the last turn's end.
//   generated_tokens     tokens every turn generated, and their sum over wall_s
//   aggregate_tok_s      (the sessions' aggregate throughput).
//   prefilled_tokens     sum of Usage.prefilled_tokens: prefill work done.
//   cached_tokens        sum of Usage.cached_tokens over the first turns:
//                        tokens served from the prefix cache.
//   first_ttft_ms_p50/p99  the first turns' write -> first token.
// Every turn must end LENGTH after --new_tokens tokens (else exit 1).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/barrier.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "proto/decoded.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "daemon address");
ABSL_FLAG(std::string, auth_token, "", "bearer token, if the daemon requires one");
ABSL_FLAG(int, sessions, 16, "concurrent sessions");
ABSL_FLAG(int, system_tokens, 1000, "the shared system prompt's ids (after BOS)");
ABSL_FLAG(int, user_tokens, 16, "ids of each user turn (distinct per session and turn)");
ABSL_FLAG(int, turns, 3, "turns per session (the first carries the system prompt)");
ABSL_FLAG(int, new_tokens, 16, "tokens generated per turn");
ABSL_FLAG(int64_t, salt, 1, "changes every id (a new salt: a system prompt the daemon has not cached)");

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = decoded::v1;

// `n` ids spread over the vocabulary, determined by `seed`.
std::vector<int32_t> Ids(const v1::ModelInfo& info, int n, int64_t seed) {
  const int64_t vocab = info.vocab_size();
  const int64_t spread = std::max<int64_t>(1, std::min<int64_t>(50000, vocab - 1000));
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) {
    ids.push_back(static_cast<int32_t>((1000 + (i * 7919 + seed * 104729) % spread) % vocab));
  }
  return ids;
}

struct TurnResult {
  double ttft_ms = 0;
  int generated = 0;
  v1::TurnEnd end;
  bool ended = false;
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(static_cast<double>(v.size()) * q))];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int n_sessions = std::clamp(absl::GetFlag(FLAGS_sessions), 1, 256);
  const int n_turns = std::max(1, absl::GetFlag(FLAGS_turns));
  const int new_tokens = std::max(1, absl::GetFlag(FLAGS_new_tokens));
  const int64_t salt = absl::GetFlag(FLAGS_salt);
  auto channel = grpc::CreateChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials());
  auto stub = v1::Decoder::NewStub(channel);
  const std::string token = absl::GetFlag(FLAGS_auth_token);
  auto authorize = [&token](grpc::ClientContext* ctx) {
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  };
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    authorize(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (grpc::Status st = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info); !st.ok()) {
      std::fprintf(stderr, "prefix_bench: GetModelInfo: %s\n", st.error_message().c_str());
      return 1;
    }
  }
  std::vector<int32_t> system = {std::max(0, info.bos_id())};
  const std::vector<int32_t> shared = Ids(info, absl::GetFlag(FLAGS_system_tokens), salt * 1000003);
  system.insert(system.end(), shared.begin(), shared.end());

  std::vector<std::vector<TurnResult>> results(static_cast<size_t>(n_sessions),
                                               std::vector<TurnResult>(static_cast<size_t>(n_turns)));
  std::vector<std::string> errors(static_cast<size_t>(n_sessions));
  absl::Barrier* start = new absl::Barrier(n_sessions + 1);
  std::vector<std::thread> threads;
  for (int s = 0; s < n_sessions; ++s) {
    threads.emplace_back([&, s] {
      grpc::ClientContext ctx;
      authorize(&ctx);
      auto stream = stub->Generate(&ctx);
      if (start->Block()) delete start;
      for (int t = 0; t < n_turns; ++t) {
        v1::GenerateRequest req;
        v1::Turn* turn = req.mutable_turn();
        std::vector<int32_t> ids = t == 0 ? system : std::vector<int32_t>();
        const std::vector<int32_t> user = Ids(info, absl::GetFlag(FLAGS_user_tokens), salt * 7777 + s * 97 + t + 1);
        ids.insert(ids.end(), user.begin(), user.end());
        for (int32_t id : ids) turn->mutable_tokens()->add_ids(id);
        turn->mutable_stopping()->set_max_new_tokens(new_tokens);
        turn->mutable_stopping()->set_ignore_eos(true);
        TurnResult& r = results[static_cast<size_t>(s)][static_cast<size_t>(t)];
        const Clock::time_point write = Clock::now();
        if (!stream->Write(req)) {
          errors[static_cast<size_t>(s)] = "write failed";
          break;
        }
        v1::GenerateResponse resp;
        while (stream->Read(&resp)) {
          if (resp.has_token()) {
            if (r.generated++ == 0) r.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - write).count();
          } else if (resp.has_turn_end()) {
            r.end = resp.turn_end();
            r.ended = true;
            break;
          }
        }
        if (!r.ended) {
          errors[static_cast<size_t>(s)] = "the stream ended before the turn";
          break;
        }
      }
      stream->WritesDone();
      grpc::Status st = stream->Finish();
      if (!st.ok() && errors[static_cast<size_t>(s)].empty()) errors[static_cast<size_t>(s)] = st.error_message();
    });
  }
  const Clock::time_point began = Clock::now();
  if (start->Block()) delete start;
  for (std::thread& t : threads) t.join();
  const double wall_s = std::chrono::duration<double>(Clock::now() - began).count();

  int64_t generated = 0, prefilled = 0, cached = 0;
  std::vector<double> first_ttft;
  for (int s = 0; s < n_sessions; ++s) {
    if (!errors[static_cast<size_t>(s)].empty()) {
      std::fprintf(stderr, "prefix_bench: session %d: %s\n", s, errors[static_cast<size_t>(s)].c_str());
      return 1;
    }
    for (int t = 0; t < n_turns; ++t) {
      const TurnResult& r = results[static_cast<size_t>(s)][static_cast<size_t>(t)];
      if (r.end.finish_reason() != v1::LENGTH || r.generated != new_tokens) {
        std::fprintf(stderr, "prefix_bench: session %d turn %d ended %d after %d tokens\n", s, t,
                     static_cast<int>(r.end.finish_reason()), r.generated);
        return 1;
      }
      generated += r.generated;
      prefilled += r.end.usage().prefilled_tokens();
      if (t == 0) {
        cached += r.end.usage().cached_tokens();
        first_ttft.push_back(r.ttft_ms);
      }
    }
  }
  std::printf(
      "{\"sessions\": %d, \"turns\": %d, \"system_tokens\": %d, \"user_tokens\": %d, \"new_tokens\": %d, "
      "\"wall_s\": %.3f, \"generated_tokens\": %lld, \"aggregate_tok_s\": %.1f, \"prefilled_tokens\": %lld, "
      "\"cached_tokens\": %lld, \"first_ttft_ms_p50\": %.1f, \"first_ttft_ms_p99\": %.1f}\n",
      n_sessions, n_turns, absl::GetFlag(FLAGS_system_tokens), absl::GetFlag(FLAGS_user_tokens), new_tokens, wall_s,
      static_cast<long long>(generated), static_cast<double>(generated) / wall_s, static_cast<long long>(prefilled),
      static_cast<long long>(cached), Percentile(first_ttft, 0.5), Percentile(first_ttft, 0.99));
  return 0;
}
