// grpc_concurrency_bench: aggregate decode rate and per-stream token latency
// of N concurrent Generate streams through a running `decoded`.
//
// For each N in --streams: N streams (one client thread each) are opened, then
// released together; each sends one token-id turn (the prompt formula of
// bench/batch_decode_bench.cc and bench/llamacpp_batched_bench.py: BOS, then
// --prompt_tokens - 1 ids spread over the vocabulary, offset per stream),
// greedy sampling, ignore_eos, max_new_tokens = --tokens, and timestamps every
// TokenEvent on arrival (steady clock). Before the measured run, N streams
// generate --warmup_tokens each (so the daemon holds the plans this batch size
// needs). Reported per N (best of --repeats by decode_tok_s; the latency
// percentiles pool every repeat):
//
//   decode_tok_s        the steady-state aggregate: the window runs from the
//                       last stream's first token (every stream is decoding
//                       from then on) to the first stream's last token (none
//                       has finished yet); decode_tok_s = token events that
//                       arrived inside (start, end] over all streams / (end -
//                       start). With N = 1 it is (tokens - 1) / (last - first):
//                       the single-stream decode rate. Prefill and the ramp
//                       up / down are outside the window.
//   window_ms           end - start of that window; window_tokens its count.
//   overall_tok_s       every token of every stream (the first included) /
//                       (the last token's arrival - the moment the turns were
//                       released): what N clients get end to end, prefill
//                       and ramp included.
//   inter_token_ms_p50/p99   gaps between consecutive tokens of one stream,
//                       pooled over all streams and all their tokens.
//   steady_inter_token_ms_p50/p99   the same, only gaps that lie wholly
//                       inside [start, end] (no stream was prefilling then).
//   ttft_ms_p50/p99     per stream: its turn's write -> its first token.
//   server_inter_token_ms_mean   mean of the streams' TurnEnd
//                       timings.mean_inter_token_ms (the daemon's own clock).
//   stream0_first_ids   stream 0's first greedy ids (compare with
//                       llamacpp_batched_bench.py's seq0_first_ids).
//
// Every stream must end its turn with finish_reason LENGTH after exactly
// --tokens tokens; anything else fails the run (exit 1, message on stderr).
// Prints one JSON object on stdout. bench/run_batch_bench.py runs it against a
// daemon it starts and compares it with the in-process and llama.cpp rates.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "proto/decoded.grpc.pb.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "daemon address");
ABSL_FLAG(std::string, auth_token, "", "bearer token, if the daemon requires one");
ABSL_FLAG(std::string, streams, "1,2,4,8,16", "comma-separated concurrency levels (streams open together)");
ABSL_FLAG(int, prompt_tokens, 16, "prompt length of each stream (BOS included)");
ABSL_FLAG(int, tokens, 64, "tokens each stream generates (max_new_tokens, ignore_eos)");
ABSL_FLAG(int, warmup_tokens, 4, "tokens per stream of the unmeasured run before each N; 0 skips it");
ABSL_FLAG(int, repeats, 1, "measured runs per N; the best decode_tok_s is reported");

namespace {

using Clock = std::chrono::steady_clock;

// One stream's record: all times in ms since the run's release instant.
struct StreamResult {
  double write_ms = 0;
  std::vector<double> arrivals_ms;
  std::vector<int32_t> ids;
  decoded::v1::TurnEnd end;
  std::string error;  // empty on success
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(static_cast<double>(v.size()) * q))];
}

// The same ids as bench/batch_decode_bench.cc for sequence `s`.
std::vector<int32_t> Prompt(int32_t vocab, int32_t bos, int n_prompt, int s) {
  const int32_t spread = std::max(1, std::min(50000, vocab - 1000));
  std::vector<int32_t> prompt = {bos};
  for (int i = 1; i < n_prompt; ++i) {
    prompt.push_back(static_cast<int32_t>((1000 + (static_cast<int64_t>(i) * 7919 + s * 104729) % spread) % vocab));
  }
  return prompt;
}

// Runs `n` concurrent streams generating `tokens` each; fills `out` (one entry
// per stream). Returns false (with a message on stderr) if any stream failed.
bool RunStreams(decoded::v1::Decoder::Stub* stub, int n, int tokens, const decoded::v1::ModelInfo& info,
                std::vector<StreamResult>* out) {
  out->assign(static_cast<size_t>(n), StreamResult{});
  const std::string auth = absl::GetFlag(FLAGS_auth_token);
  const int n_prompt = std::max(1, absl::GetFlag(FLAGS_prompt_tokens));
  // Threads open their streams, then wait here; the last one in records the
  // release instant, so every stream's write happens after it.
  Clock::time_point release;
  std::barrier sync(n, [&release]() noexcept { release = Clock::now(); });
  std::vector<std::thread> threads;
  for (int s = 0; s < n; ++s) {
    threads.emplace_back([&, s]() {
      StreamResult& r = (*out)[static_cast<size_t>(s)];
      grpc::ClientContext ctx;
      if (!auth.empty()) ctx.AddMetadata("authorization", "Bearer " + auth);
      auto stream = stub->Generate(&ctx);
      decoded::v1::GenerateRequest req;
      auto* turn = req.mutable_turn();
      for (int32_t id : Prompt(info.vocab_size(), std::max(0, info.bos_id()), n_prompt, s)) {
        turn->mutable_tokens()->add_ids(id);
      }
      turn->mutable_stopping()->set_max_new_tokens(tokens);
      turn->mutable_stopping()->set_ignore_eos(true);  // sampling left unset: greedy
      sync.arrive_and_wait();
      auto ms = [&release]() { return std::chrono::duration<double, std::milli>(Clock::now() - release).count(); };
      r.write_ms = ms();
      if (!stream->Write(req)) {
        r.error = "write failed";
      } else {
        decoded::v1::GenerateResponse resp;
        while (stream->Read(&resp)) {
          if (resp.has_token()) {
            r.arrivals_ms.push_back(ms());
            r.ids.push_back(resp.token().id());
          } else if (resp.has_turn_end()) {
            r.end = resp.turn_end();
            break;
          }
        }
      }
      stream->WritesDone();
      grpc::Status st = stream->Finish();
      if (r.error.empty() && !st.ok()) r.error = absl::StrCat("status ", st.error_code(), ": ", st.error_message());
      if (r.error.empty() && (r.end.finish_reason() != decoded::v1::LENGTH ||
                              static_cast<int>(r.arrivals_ms.size()) != tokens)) {
        r.error = absl::StrCat("turn ended with finish_reason ", r.end.finish_reason(), " after ",
                               r.arrivals_ms.size(), " of ", tokens, " tokens");
      }
    });
  }
  for (auto& t : threads) t.join();
  bool ok = true;
  for (int s = 0; s < n; ++s) {
    if (!(*out)[static_cast<size_t>(s)].error.empty()) {
      std::fprintf(stderr, "grpc_concurrency_bench: N=%d stream %d: %s\n", n, s,
                   (*out)[static_cast<size_t>(s)].error.c_str());
      ok = false;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int> levels;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_streams), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > 1024) {
      std::fprintf(stderr, "grpc_concurrency_bench: --streams: bad level '%s' (1..1024)\n",
                   std::string(part).c_str());
      return 1;
    }
    levels.push_back(n);
  }
  const int tokens = absl::GetFlag(FLAGS_tokens);
  if (tokens < 2) {
    std::fprintf(stderr, "grpc_concurrency_bench: --tokens must be >= 2 (inter-token gaps)\n");
    return 1;
  }
  grpc::ChannelArguments args;
  // One connection for all streams, as one client process would hold; the
  // default limit of 100 concurrent streams per connection is above --streams.
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_server), grpc::InsecureChannelCredentials(), args);
  auto stub = decoded::v1::Decoder::NewStub(channel);
  decoded::v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    if (!absl::GetFlag(FLAGS_auth_token).empty()) {
      ctx.AddMetadata("authorization", "Bearer " + absl::GetFlag(FLAGS_auth_token));
    }
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status st = stub->GetModelInfo(&ctx, decoded::v1::GetModelInfoRequest(), &info);
    if (!st.ok()) {
      std::fprintf(stderr, "grpc_concurrency_bench: GetModelInfo: %s\n", st.error_message().c_str());
      return 1;
    }
  }

  std::string results;
  for (int n : levels) {
    std::vector<StreamResult> runs;
    if (absl::GetFlag(FLAGS_warmup_tokens) > 0 &&
        !RunStreams(stub.get(), n, std::max(2, absl::GetFlag(FLAGS_warmup_tokens)), info, &runs)) {
      return 1;
    }
    double best_rate = -1, best_window = 0, best_overall = 0;
    int64_t best_window_tokens = 0;
    std::vector<double> gaps, steady_gaps, ttfts, server_itl;
    std::vector<int32_t> stream0_ids;
    for (int rep = 0; rep < std::max(1, absl::GetFlag(FLAGS_repeats)); ++rep) {
      if (!RunStreams(stub.get(), n, tokens, info, &runs)) return 1;
      double start = 0, end = 1e300, last = 0;
      for (const StreamResult& r : runs) {
        start = std::max(start, r.arrivals_ms.front());
        end = std::min(end, r.arrivals_ms.back());
        last = std::max(last, r.arrivals_ms.back());
      }
      int64_t in_window = 0;
      for (const StreamResult& r : runs) {
        ttfts.push_back(r.arrivals_ms.front() - r.write_ms);
        server_itl.push_back(r.end.timings().mean_inter_token_ms());
        for (size_t i = 0; i < r.arrivals_ms.size(); ++i) {
          const double t = r.arrivals_ms[i];
          const bool inside = t > start && t <= end;
          in_window += inside ? 1 : 0;
          if (i == 0) continue;
          const double prev = r.arrivals_ms[i - 1];
          gaps.push_back(t - prev);
          if (prev >= start && t <= end) steady_gaps.push_back(t - prev);
        }
      }
      // With staggered prefills a stream may finish before the last one starts:
      // then no instant has all N decoding and the rate is reported as 0.
      const double window = end - start;
      const double rate = window > 0 ? static_cast<double>(in_window) / (window / 1e3) : 0;
      if (rate > best_rate) {
        best_rate = rate;
        best_window = std::max(0.0, window);
        best_window_tokens = window > 0 ? in_window : 0;
        best_overall = static_cast<double>(n) * tokens / (last / 1e3);
        stream0_ids.assign(runs[0].ids.begin(), runs[0].ids.begin() + std::min<size_t>(8, runs[0].ids.size()));
      }
    }
    double server_mean = 0;
    for (double v : server_itl) server_mean += v / static_cast<double>(server_itl.size());
    absl::StrAppend(&results, results.empty() ? "" : ", ", "{\"streams\": ", n);
    char line[640];
    std::snprintf(line, sizeof(line),
                  ", \"decode_tok_s\": %.2f, \"window_ms\": %.2f, \"window_tokens\": %lld, \"overall_tok_s\": %.2f, "
                  "\"inter_token_ms_p50\": %.3f, \"inter_token_ms_p99\": %.3f, "
                  "\"steady_inter_token_ms_p50\": %.3f, \"steady_inter_token_ms_p99\": %.3f, "
                  "\"ttft_ms_p50\": %.3f, \"ttft_ms_p99\": %.3f, \"server_inter_token_ms_mean\": %.3f, ",
                  best_rate, best_window, static_cast<long long>(best_window_tokens), best_overall,
                  Percentile(gaps, 0.5), Percentile(gaps, 0.99), Percentile(steady_gaps, 0.5),
                  Percentile(steady_gaps, 0.99), Percentile(ttfts, 0.5), Percentile(ttfts, 0.99), server_mean);
    absl::StrAppend(&results, line, "\"stream0_first_ids\": [", absl::StrJoin(stream0_ids, ", "), "]}");
  }
  std::printf(
      "{\"family\": \"%s\", \"cpu_isa\": \"%s\", \"prompt_tokens\": %d, \"tokens\": %d, "
      "\"repeats\": %d, \"results\": [%s]}\n",
      info.family().c_str(), info.cpu_isa().c_str(),
      std::max(1, absl::GetFlag(FLAGS_prompt_tokens)), tokens, std::max(1, absl::GetFlag(FLAGS_repeats)),
      results.c_str());
  return 0;
}
